// The official `@anthropic-ai/sdk` client against a running iop edge's
// Messages API (/v1/messages), unchanged, on both execution paths:
// messages.create and messages.stream, a tool round trip, thinking, errors
// and count_tokens. Run by TestAnthropicJavaScriptClient (internal/e2e),
// which starts the edge, a node and `iop sim` providers and sets:
//
//   IOP_BASE_URL  the edge's base URL, "http://127.0.0.1:PORT" (the SDK adds /v1/messages)
//   IOP_MODELS    JSON [{"path": "normalized"|"tunnel", "model": NAME}, ...]
//   IOP_THINKING  the same for thinking models (iop sim --thinking)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';

const client = new Anthropic({ baseURL: process.env.IOP_BASE_URL, apiKey: 'client-key', maxRetries: 0 });
const models = JSON.parse(process.env.IOP_MODELS ?? '[]');
const thinkers = JSON.parse(process.env.IOP_THINKING ?? '[]');
assert.ok(models.length >= 2, 'IOP_MODELS must list a model per execution path');

// The simulators call a tool when the last user message names it.
const tools = [{
  name: 'get_weather',
  description: 'The weather in a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } },
}];
const askWeather = [{ role: 'user', content: 'what is the weather in Paris? use get_weather' }];
const hello = [{ role: 'user', content: 'say hello' }];

function checkText(msg, model) {
  assert.equal(msg.type, 'message');
  assert.equal(msg.role, 'assistant');
  assert.equal(msg.model, model);
  assert.match(msg.id, /^msg_/);
  assert.ok(msg.content.length >= 1);
  const text = msg.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.ok(text.trim().length > 0, 'the answer has text');
  assert.ok(msg.usage.output_tokens > 0, 'output tokens are counted');
  assert.ok(msg.usage.input_tokens > 0, 'input tokens are counted');
  return text;
}

function checkToolUse(msg) {
  assert.equal(msg.stop_reason, 'tool_use');
  const uses = msg.content.filter((b) => b.type === 'tool_use');
  assert.equal(uses.length, 1);
  const use = uses[0];
  assert.match(use.id, /^toolu_[A-Za-z0-9_-]+$/);
  assert.equal(use.name, 'get_weather');
  assert.equal(typeof use.input, 'object');
  assert.equal(typeof use.input.city, 'string');
  return use;
}

// stopFor is a stop sequence spanning the 4th and 5th words of text (so
// it crosses a streamed delta's boundary) and the text before it.
function stopFor(text) {
  const words = text.trim().split(/\s+/);
  assert.ok(words.length >= 6, `answer too short for a stop sequence: ${text}`);
  const stop = `${words[3].slice(-2)} ${words[4].slice(0, 2)}`;
  return { stop, before: text.slice(0, text.indexOf(stop)) };
}

for (const { path, model } of models) {
  test(`${path}: stop_sequences end the answer and are reported`, async () => {
    const story = [{ role: 'user', content: `a story about ${path}` }];
    const full = await client.messages.create({ model, max_tokens: 64, messages: story });
    assert.equal(full.stop_reason, 'end_turn');
    assert.equal(full.stop_sequence, null);
    const { stop, before } = stopFor(full.content[0].text);
    const params = { model, max_tokens: 64, messages: story, stop_sequences: ['never-said', stop] };
    const msg = await client.messages.create(params);
    assert.equal(msg.stop_reason, 'stop_sequence');
    assert.equal(msg.stop_sequence, stop);
    assert.equal(msg.content.map((b) => b.text).join(''), before);
    const stream = client.messages.stream(params);
    let text = '';
    stream.on('text', (delta) => { text += delta; });
    const streamed = await stream.finalMessage();
    assert.equal(streamed.stop_reason, 'stop_sequence');
    assert.equal(streamed.stop_sequence, stop);
    assert.equal(text, before);
  });

  test(`${path}: messages.create`, async () => {
    const msg = await client.messages.create({ model, max_tokens: 64, system: 'You are terse.', messages: hello });
    checkText(msg, model);
    assert.equal(msg.stop_reason, 'end_turn');
    assert.equal(msg.content.filter((b) => b.type === 'thinking').length, 0, 'no thinking unless asked');
  });

  test(`${path}: max_tokens ends with stop_reason max_tokens`, async () => {
    const msg = await client.messages.create({ model, max_tokens: 3, messages: hello });
    assert.equal(msg.stop_reason, 'max_tokens');
    assert.equal(msg.usage.output_tokens, 3);
  });

  test(`${path}: messages.stream`, async () => {
    const stream = client.messages.stream({ model, max_tokens: 64, messages: hello });
    let streamed = '';
    const events = [];
    stream.on('text', (delta) => { streamed += delta; });
    stream.on('streamEvent', (ev) => events.push(ev.type));
    const msg = await stream.finalMessage();
    const text = checkText(msg, model);
    assert.equal(streamed, text, 'the text events add up to the final text');
    assert.equal(events[0], 'message_start');
    assert.equal(events.at(-1), 'message_stop');
    assert.ok(events.includes('content_block_start') && events.includes('content_block_stop') && events.includes('message_delta'));
    assert.equal(msg.stop_reason, 'end_turn');
  });

  test(`${path}: a tool round trip (create)`, async () => {
    const first = await client.messages.create({ model, max_tokens: 64, tools, messages: askWeather });
    const use = checkToolUse(first);
    const second = await client.messages.create({
      model, max_tokens: 64, tools,
      messages: [...askWeather, { role: 'assistant', content: first.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny, 21 C' }] }],
    });
    checkText(second, model);
    assert.equal(second.stop_reason, 'end_turn');
  });

  test(`${path}: a tool round trip (stream, inputJson events)`, async () => {
    const stream = client.messages.stream({ model, max_tokens: 64, tools, messages: askWeather });
    let json = '';
    stream.on('inputJson', (partial) => { json += partial; });
    const first = await stream.finalMessage();
    const use = checkToolUse(first);
    assert.deepEqual(JSON.parse(json), use.input, 'the input_json_delta parts add up to the input');
    const second = client.messages.stream({
      model, max_tokens: 64, tools,
      messages: [...askWeather, { role: 'assistant', content: first.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: [{ type: 'text', text: 'sunny' }] }] }],
    });
    checkText(await second.finalMessage(), model);
  });

  test(`${path}: tool_choice none answers with text`, async () => {
    const msg = await client.messages.create({ model, max_tokens: 16, tools, tool_choice: { type: 'none' }, messages: askWeather });
    assert.equal(msg.content.filter((b) => b.type === 'tool_use').length, 0);
    checkText(msg, model);
  });

  test(`${path}: count_tokens`, async () => {
    const n = await client.messages.countTokens({ model, messages: askWeather, tools });
    assert.ok(Number.isInteger(n.input_tokens) && n.input_tokens > 0);
  });
}

test('an unknown model is a NotFoundError', async () => {
  await assert.rejects(client.messages.create({ model: 'no-such-model', max_tokens: 8, messages: hello }),
    (err) => err instanceof Anthropic.NotFoundError && err.status === 404 && err.error?.error?.type === 'not_found_error');
});

test('a missing max_tokens is a BadRequestError', async () => {
  await assert.rejects(client.messages.create({ model: models[0].model, messages: hello }),
    (err) => err instanceof Anthropic.BadRequestError && err.error?.error?.type === 'invalid_request_error' &&
      /max_tokens/.test(err.message));
});

test('a server tool is refused by name', async () => {
  await assert.rejects(client.messages.create({
    model: models[0].model, max_tokens: 8, messages: hello,
    tools: [{ type: 'web_search_20250305', name: 'web_search' }],
  }), (err) => err instanceof Anthropic.BadRequestError && /web_search/.test(err.message));
});

for (const { path, model } of thinkers) {
  test(`${path}: thinking (create)`, async () => {
    const msg = await client.messages.create({
      model, max_tokens: 2048, thinking: { type: 'enabled', budget_tokens: 1024 }, messages: hello,
    });
    assert.equal(msg.content[0].type, 'thinking', 'the thinking comes first');
    assert.ok(msg.content[0].thinking.trim().length > 0);
    assert.equal(typeof msg.content[0].signature, 'string');
    assert.ok(msg.content[0].signature.length > 0);
    checkText(msg, model);
  });

  test(`${path}: thinking (stream events)`, async () => {
    const stream = client.messages.stream({
      model, max_tokens: 2048, thinking: { type: 'enabled', budget_tokens: 1024 }, messages: hello,
    });
    let thinking = '';
    let signature = '';
    stream.on('thinking', (delta) => { thinking += delta; });
    stream.on('signature', (sig) => { signature = sig; });
    const msg = await stream.finalMessage();
    assert.equal(msg.content[0].type, 'thinking');
    assert.equal(thinking, msg.content[0].thinking);
    assert.equal(signature, msg.content[0].signature);
    checkText(msg, model);
    // The answer, thinking block included, goes back as the next turn.
    const next = await client.messages.create({
      model, max_tokens: 2048, thinking: { type: 'enabled', budget_tokens: 1024 },
      messages: [...hello, { role: 'assistant', content: msg.content }, { role: 'user', content: 'again' }],
    });
    checkText(next, model);
  });

  test(`${path}: thinking disabled shows none`, async () => {
    const msg = await client.messages.create({ model, max_tokens: 16, thinking: { type: 'disabled' }, messages: hello });
    assert.equal(msg.content.filter((b) => b.type === 'thinking').length, 0);
    checkText(msg, model);
  });
}

test('models.list and models.retrieve in Anthropic\'s shape, with request ids', async () => {
  const page = await client.models.list({ limit: 1 });
  assert.equal(page.data.length, 1);
  assert.equal(page.data[0].type, 'model');
  assert.ok(!Number.isNaN(Date.parse(page.data[0].created_at)));
  const all = [];
  for await (const m of client.models.list({ limit: 1 })) all.push(m.id);
  for (const { model } of models) assert.ok(all.includes(model), `${model} in ${all}`);
  const one = await client.models.retrieve(models[0].model);
  assert.equal(one.id, models[0].model);
  assert.equal(one.display_name, models[0].model);
  const { response } = await client.models.list().withResponse();
  assert.match(response.headers.get('request-id'), /^req_[0-9a-f]{32}$/);
});

for (const { path, model } of models) {
  test(`${path}: count_tokens and a request id`, async () => {
    const count = await client.messages.countTokens({ model, messages: hello });
    assert.ok(count.input_tokens > 0);
    const msg = await client.messages.create({ model, max_tokens: 8, messages: hello });
    assert.match(msg._request_id, /^req_[0-9a-f]{32}$/);
    await assert.rejects(client.messages.countTokens({ model: 'no-such-model', messages: hello }),
      (err) => err.status === 404 && /^req_[0-9a-f]{32}$/.test(err.requestID));
  });
}
