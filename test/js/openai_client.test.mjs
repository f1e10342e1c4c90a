// The official `openai` JavaScript client against a running iop edge, on
// both execution paths: chat (with and without tools, streamed and not),
// legacy completions and embeddings. Run by TestOpenAIJavaScriptClient
// (cmd/iop), which starts the edge, a node and `iop sim` providers and sets:
//
//   IOP_BASE_URL  the edge's OpenAI base URL, "http://127.0.0.1:PORT/v1"
//   IOP_MODELS    JSON [{"path": "normalized"|"tunnel", "model": NAME}, ...]
//   IOP_THINKING  the same for thinking models (iop sim --thinking)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.IOP_BASE_URL, apiKey: 'client-key', maxRetries: 0 });
const models = JSON.parse(process.env.IOP_MODELS ?? '[]');
const thinkers = JSON.parse(process.env.IOP_THINKING ?? '[]');
assert.ok(models.length >= 2, 'IOP_MODELS must list a model per execution path');

// The simulators call a tool when the last user message names it.
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } },
  },
}];
const askWeather = [{ role: 'user', content: 'what is the weather in Paris? use get_weather' }];

function checkArguments(text) {
  const args = JSON.parse(text);
  assert.equal(typeof args.city, 'string');
  assert.equal(args.days, 42);
}

for (const { path, model } of models) {
  test(`${path}: chat stop ends the answer before the stop sequence`, async () => {
    const messages = [{ role: 'user', content: `a story about ${path}` }];
    const full = await client.chat.completions.create({ model, messages });
    const text = full.choices[0].message.content;
    const words = text.trim().split(/\s+/);
    assert.ok(words.length >= 6, text);
    const stop = `${words[3].slice(-2)} ${words[4].slice(0, 2)}`;
    const before = text.slice(0, text.indexOf(stop));
    const resp = await client.chat.completions.create({ model, messages, stop: ['never-said', stop] });
    assert.equal(resp.choices[0].finish_reason, 'stop');
    assert.equal(resp.choices[0].message.content, before);
    const stream = await client.chat.completions.create({ model, messages, stop, stream: true });
    let streamed = '';
    let finish = null;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        streamed += c.delta.content ?? '';
        finish = c.finish_reason ?? finish;
      }
    }
    assert.equal(finish, 'stop');
    assert.equal(streamed, before);
  });

  test(`${path}: chat`, async () => {
    const resp = await client.chat.completions.create({
      model, max_tokens: 5, messages: [{ role: 'user', content: 'say something deterministic' }],
    });
    assert.equal(resp.object, 'chat.completion');
    assert.equal(resp.choices[0].finish_reason, 'length');
    assert.equal(resp.choices[0].message.content.trim().split(/\s+/).length, 5);
    assert.equal(resp.usage.completion_tokens, 5);
    assert.equal(resp.usage.prompt_tokens, 3);
  });

  test(`${path}: chat streaming with usage`, async () => {
    const stream = await client.chat.completions.create({
      model, max_tokens: 4, stream: true, stream_options: { include_usage: true },
      messages: [{ role: 'user', content: 'say something deterministic' }],
    });
    let text = '';
    let finish = null;
    let usage = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      for (const choice of chunk.choices) {
        text += choice.delta.content ?? '';
        finish = choice.finish_reason ?? finish;
      }
      usage = chunk.usage ?? usage;
    }
    assert.equal(text.trim().split(/\s+/).length, 4);
    assert.equal(finish, 'length');
    assert.equal(usage.completion_tokens, 4);
  });

  test(`${path}: chat with tools`, async () => {
    const resp = await client.chat.completions.create({ model, tools, messages: askWeather });
    const choice = resp.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.tool_calls.length, 1);
    const call = choice.message.tool_calls[0];
    assert.match(call.id, /^call_/);
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    checkArguments(call.function.arguments);
  });

  test(`${path}: chat with tools streaming`, async () => {
    const stream = await client.chat.completions.create({ model, tools, stream: true, messages: askWeather });
    const calls = [];
    let parts = 0;
    let finish = null;
    for await (const chunk of stream) {
      for (const choice of chunk.choices) {
        finish = choice.finish_reason ?? finish;
        for (const part of choice.delta.tool_calls ?? []) {
          parts++;
          assert.equal(typeof part.index, 'number');
          if (part.id) {
            assert.match(part.id, /^call_/);
            assert.equal(calls[part.index], undefined, 'an id comes with a call\'s first part only');
            calls[part.index] = { id: part.id, name: part.function.name, arguments: '' };
          }
          calls[part.index].arguments += part.function?.arguments ?? '';
        }
      }
    }
    assert.equal(finish, 'tool_calls');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].name, 'get_weather');
    checkArguments(calls[0].arguments);
    if (path === 'tunnel') {
      assert.ok(parts >= 3, `the arguments come in pieces over chunks (got ${parts} parts)`);
    }
  });

  test(`${path}: chat stream helper accumulates tool calls`, async () => {
    const runner = client.chat.completions.stream({ model, tools, messages: askWeather });
    const final = await runner.finalChatCompletion();
    const call = final.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    checkArguments(call.function.arguments);
  });

  test(`${path}: completions`, async () => {
    const resp = await client.completions.create({ model, prompt: 'once upon a time', max_tokens: 5 });
    assert.equal(resp.object, 'text_completion');
    assert.equal(resp.choices[0].finish_reason, 'length');
    assert.equal(resp.choices[0].text.trim().split(/\s+/).length, 5);
    assert.deepEqual([resp.usage.prompt_tokens, resp.usage.completion_tokens], [4, 5]);
  });

  test(`${path}: completions streaming`, async () => {
    const stream = await client.completions.create({
      model, prompt: 'once upon a time', max_tokens: 5, stream: true, stream_options: { include_usage: true },
    });
    let text = '';
    let finish = null;
    let usage = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'text_completion');
      for (const choice of chunk.choices) {
        text += choice.text;
        finish = choice.finish_reason ?? finish;
      }
      usage = chunk.usage ?? usage;
    }
    assert.equal(text.trim().split(/\s+/).length, 5);
    assert.equal(finish, 'length');
    assert.equal(usage.completion_tokens, 5);
  });

  test(`${path}: embeddings batch`, async () => {
    const input = ['the first text', 'a second one', 'third'];
    // Without encoding_format the client asks for base64 and decodes it;
    // with "float" it gets arrays. Both must give the same vectors.
    const b64 = await client.embeddings.create({ model, input });
    const float = await client.embeddings.create({ model, input, encoding_format: 'float' });
    for (const resp of [b64, float]) {
      assert.equal(resp.object, 'list');
      assert.equal(resp.data.length, 3);
      resp.data.forEach((d, i) => {
        assert.equal(d.index, i);
        assert.equal(d.embedding.length, 8);
        const norm = d.embedding.reduce((s, x) => s + x * x, 0);
        assert.ok(Math.abs(norm - 1) < 1e-5, `unit vector, norm ${norm}`);
      });
      assert.equal(resp.usage.prompt_tokens, 7);
    }
    float.data.forEach((d, i) => {
      assert.deepEqual(d.embedding.map(Math.fround), Array.from(b64.data[i].embedding, Math.fround));
    });
  });
}

// A reasoning model's reasoning arrives as delta.reasoning_content (the
// client keeps fields it does not know), before the text, and whole in the
// message when not streamed; reasoning_effort sets how much.
for (const { path, model } of thinkers) {
  const messages = [{ role: 'user', content: 'why is the sky blue?' }];
  test(`${path}: chat streaming with reasoning`, async () => {
    const stream = await client.chat.completions.create({ model, max_tokens: 3, stream: true, reasoning_effort: 'low', messages });
    let reasoning = '';
    let text = '';
    let chunks = 0;
    for await (const chunk of stream) {
      for (const choice of chunk.choices) {
        if (choice.delta.reasoning_content) {
          assert.equal(text, '', 'the reasoning comes before the text');
          reasoning += choice.delta.reasoning_content;
          chunks++;
        }
        text += choice.delta.content ?? '';
      }
    }
    // An Ollama model takes think levels only when it is gpt-oss, else
    // true/false: the low effort becomes think true there (the whole
    // reasoning, 8 tokens); an OpenAI-compatible server honours the level.
    const want = path === 'normalized' ? 8 : 4;
    assert.equal(reasoning.trim().split(/\s+/).length, want);
    assert.equal(chunks, want, 'one reasoning delta per token, as they come');
    assert.equal(text.trim().split(/\s+/).length, 3);
  });
  test(`${path}: chat with reasoning`, async () => {
    const resp = await client.chat.completions.create({ model, max_tokens: 3, messages });
    assert.equal(resp.choices[0].message.reasoning_content.trim().split(/\s+/).length, 8);
    assert.equal(resp.choices[0].message.content.trim().split(/\s+/).length, 3);
    assert.equal(resp.usage.completion_tokens, 11);
  });
  test(`${path}: reasoning_effort none`, async () => {
    const resp = await client.chat.completions.create({ model, max_tokens: 3, reasoning_effort: 'none', messages });
    assert.equal(resp.choices[0].message.reasoning_content, undefined);
  });
}

test('embeddings are the same on both paths', async () => {
  const got = [];
  for (const { model } of models) {
    got.push((await client.embeddings.create({ model, input: 'same input', encoding_format: 'float' })).data[0].embedding);
  }
  assert.deepEqual(got[0], got[1]);
});

test('an unknown model is a 404', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] }),
    (err) => err instanceof OpenAI.NotFoundError,
  );
});
