// The official `openai` JavaScript client's Responses API (responses.create,
// responses.stream, retrieve, inputItems, delete) against a running iop
// edge, on both execution paths. Run by TestResponsesJavaScriptClients
// (internal/e2e), which starts the edge, a node and `iop sim` providers
// and sets:
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
  name: 'get_weather',
  description: 'the weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } } },
  strict: false,
}];

function checkArguments(text) {
  const args = JSON.parse(text);
  assert.equal(typeof args.city, 'string');
  assert.equal(args.days, 42);
}

function words(text) {
  return text.trim().split(/\s+/).length;
}

for (const { path, model } of models) {
  test(`${path}: responses.create`, async () => {
    const resp = await client.responses.create({
      model, input: 'say something deterministic', max_output_tokens: 5, instructions: 'be brief',
      metadata: { suite: 'js' },
    });
    assert.match(resp.id, /^resp_/);
    assert.equal(resp.object, 'response');
    assert.equal(resp.model, model);
    assert.equal(resp.status, 'incomplete');
    assert.equal(resp.incomplete_details.reason, 'max_output_tokens');
    assert.equal(resp.output[0].type, 'message');
    assert.equal(resp.output[0].role, 'assistant');
    assert.equal(words(resp.output_text), 5);
    assert.equal(resp.usage.output_tokens, 5);
    assert.ok(resp.usage.input_tokens > 0);
    assert.equal(resp.usage.total_tokens, resp.usage.input_tokens + resp.usage.output_tokens);
    assert.deepEqual(resp.metadata, { suite: 'js' });
    assert.equal(resp.instructions, 'be brief');

    const got = await client.responses.retrieve(resp.id);
    assert.equal(got.id, resp.id);
    assert.equal(got.output_text, resp.output_text);
    const items = await client.responses.inputItems.list(resp.id);
    assert.equal(items.data.length, 1);
    assert.equal(items.data[0].type, 'message');
    assert.equal(items.data[0].content[0].text, 'say something deterministic');
  });

  test(`${path}: responses.stream events`, async () => {
    const stream = client.responses.stream({ model, input: 'say something deterministic', max_output_tokens: 4 });
    const types = [];
    const seqs = [];
    let text = '';
    for await (const ev of stream) {
      types.push(ev.type);
      seqs.push(ev.sequence_number);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
    }
    const final = await stream.finalResponse();
    assert.deepEqual(seqs, seqs.map((_, i) => i), 'sequence numbers count from 0');
    assert.equal(types[0], 'response.created');
    assert.equal(types[1], 'response.in_progress');
    for (const t of ['response.output_item.added', 'response.content_part.added', 'response.output_text.delta',
      'response.output_text.done', 'response.content_part.done', 'response.output_item.done']) {
      assert.ok(types.includes(t), `${t} in ${types}`);
    }
    assert.equal(types.at(-1), 'response.incomplete');
    assert.equal(final.output_text, text);
    assert.equal(words(text), 4);
    assert.equal(final.usage.output_tokens, 4);
  });

  test(`${path}: function tool round trip`, async () => {
    const first = await client.responses.create({
      model, tools, input: [{ role: 'user', content: 'what is the weather in Paris? use get_weather' }],
    });
    const call = first.output.find((it) => it.type === 'function_call');
    assert.ok(call, JSON.stringify(first.output));
    assert.equal(call.name, 'get_weather');
    assert.ok(call.call_id);
    checkArguments(call.arguments);
    assert.equal(first.status, 'completed');

    // The client's own history, with the tool's answer.
    const second = await client.responses.create({
      model, tools,
      input: [
        { role: 'user', content: 'what is the weather in Paris? use get_weather' },
        { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
        { type: 'function_call_output', call_id: call.call_id, output: '{"temp": 21}' },
      ],
    });
    assert.equal(second.status, 'completed');
    assert.ok(second.output_text.length > 0);

    // The same through previous_response_id: iop keeps the conversation.
    const chained = await client.responses.create({
      model, tools, previous_response_id: first.id,
      input: [{ type: 'function_call_output', call_id: call.call_id, output: '{"temp": 21}' }],
    });
    assert.equal(chained.previous_response_id, first.id);
    assert.equal(chained.status, 'completed');
    assert.ok(chained.output_text.length > 0);
  });

  test(`${path}: streamed function call arguments`, async () => {
    const stream = client.responses.stream({
      model, tools, input: 'what is the weather in Paris? use get_weather',
    });
    let args = '';
    let done = null;
    for await (const ev of stream) {
      if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
      if (ev.type === 'response.function_call_arguments.done') done = ev.arguments;
    }
    const final = await stream.finalResponse();
    const call = final.output.find((it) => it.type === 'function_call');
    assert.equal(call.arguments, args);
    assert.equal(done, args);
    checkArguments(args);
  });

  test(`${path}: previous_response_id continues the conversation`, async () => {
    const first = await client.responses.create({ model, input: 'remember the word kiwi', max_output_tokens: 3 });
    const second = await client.responses.create({
      model, previous_response_id: first.id, input: 'what was the word?', max_output_tokens: 3,
    });
    assert.equal(second.previous_response_id, first.id);
    assert.equal(words(second.output_text), 3);
    // The conversation grew: more input tokens than the second input alone.
    assert.ok(second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens,
      `${second.usage.input_tokens} vs ${first.usage.input_tokens}+${first.usage.output_tokens}`);
    const items = await client.responses.inputItems.list(second.id, { order: 'asc' });
    assert.equal(items.data.length, 1, 'input_items lists the response\'s own input');
  });

  test(`${path}: structured output with text.format json_schema`, async () => {
    const resp = await client.responses.create({
      model, input: 'give me a city',
      text: { format: { type: 'json_schema', name: 'city', schema: { type: 'object', properties: { name: { type: 'string' } } } } },
    });
    assert.equal(resp.status, 'completed');
    assert.equal(resp.text.format.type, 'json_schema');
    assert.equal(resp.text.format.name, 'city');
  });

  test(`${path}: delete, then 404`, async () => {
    const resp = await client.responses.create({ model, input: 'hello', max_output_tokens: 2 });
    const del = await client.responses.delete(resp.id);
    assert.deepEqual(del, { id: resp.id, object: 'response', deleted: true });
    await assert.rejects(client.responses.retrieve(resp.id), (err) => err.status === 404);
  });

  test(`${path}: store false keeps nothing`, async () => {
    const resp = await client.responses.create({ model, input: 'hello', max_output_tokens: 2, store: false });
    assert.equal(resp.store, false);
    await assert.rejects(client.responses.retrieve(resp.id), (err) => err.status === 404);
    await assert.rejects(client.responses.create({ model, input: 'again', previous_response_id: resp.id }),
      (err) => err.status === 400 && err.param === 'previous_response_id');
  });

  test(`${path}: background response, retrieve until done`, async () => {
    const resp = await client.responses.create({ model, input: 'say something deterministic', max_output_tokens: 3, background: true });
    assert.ok(['queued', 'in_progress'].includes(resp.status), resp.status);
    assert.equal(resp.background, true);
    let got = resp;
    for (let i = 0; i < 200 && ['queued', 'in_progress'].includes(got.status); i++) {
      await new Promise((r) => setTimeout(r, 50));
      got = await client.responses.retrieve(resp.id);
    }
    assert.equal(got.status, 'incomplete');
    assert.equal(words(got.output_text), 3);
  });

  test(`${path}: built-in tools are refused by name`, async () => {
    await assert.rejects(
      client.responses.create({ model, input: 'search', tools: [{ type: 'web_search' }] }),
      (err) => err.status === 400 && /web_search/.test(err.message) && err.param === 'tools[0].type');
  });
}

for (const { path, model } of thinkers) {
  test(`${path}: reasoning summary of a thinking model`, async () => {
    const stream = client.responses.stream({ model, input: 'think about it', reasoning: { effort: 'low', summary: 'auto' }, max_output_tokens: 3 });
    let summary = '';
    for await (const ev of stream) {
      if (ev.type === 'response.reasoning_summary_text.delta') summary += ev.delta;
    }
    const final = await stream.finalResponse();
    const reasoning = final.output.find((it) => it.type === 'reasoning');
    assert.ok(reasoning, JSON.stringify(final.output));
    assert.ok(summary.length > 0);
    assert.equal(reasoning.summary[0].text, summary);
    assert.equal(words(final.output_text), 3);
  });
}
