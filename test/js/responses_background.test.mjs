// The official `openai` client against iop's Responses API: a background
// response streamed as it runs and resumed from a sequence number
// (responses.retrieve(id, {stream: true, starting_after})), reasoning
// tokens in the usage, and the request id of every answer (_request_id,
// errors included). Run by TestResponsesJavaScriptClients with the
// environment described in responses_openai.test.mjs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.IOP_BASE_URL, apiKey: 'client-key', maxRetries: 0 });
const models = JSON.parse(process.env.IOP_MODELS ?? '[]');
const thinkers = JSON.parse(process.env.IOP_THINKING ?? '[]');
const requestID = /^req_[0-9a-f]{32}$/;

for (const { path, model } of models) {
  test(`${path}: background + stream, then resumed after a sequence number`, async () => {
    const stream = await client.responses.create({ model, input: 'say something deterministic', max_output_tokens: 5, background: true, stream: true });
    const events = [];
    for await (const ev of stream) events.push(ev);
    assert.equal(events[0].type, 'response.created');
    assert.equal(events[0].response.status, 'queued');
    assert.equal(events[0].response.background, true);
    const last = events.at(-1);
    assert.ok(['response.completed', 'response.incomplete'].includes(last.type), last.type);
    events.forEach((ev, i) => assert.equal(ev.sequence_number, i));
    const id = events[0].response.id;
    const after = 2;
    const resumed = [];
    for await (const ev of await client.responses.retrieve(id, { stream: true, starting_after: after })) resumed.push(ev);
    assert.deepEqual(resumed.map((e) => e.sequence_number), events.slice(after + 1).map((e) => e.sequence_number));
    assert.deepEqual(resumed.map((e) => e.type), events.slice(after + 1).map((e) => e.type));
    const stored = await client.responses.retrieve(id);
    assert.equal(stored.status, last.response.status);
    assert.equal(stored.output_text, last.response.output.filter((o) => o.type === 'message').map((o) => o.content[0].text).join(''));
  });

  test(`${path}: a background stream's response can be cancelled`, async () => {
    const resp = await client.responses.create({ model, input: 'a long story', max_output_tokens: 2000, background: true });
    const cancelled = await client.responses.cancel(resp.id);
    assert.ok(['cancelled', 'completed', 'incomplete'].includes(cancelled.status), cancelled.status);
  });

  test(`${path}: every answer carries its request id`, async () => {
    const chat = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 });
    assert.match(chat._request_id, requestID);
    const resp = await client.responses.create({ model, input: 'hi', max_output_tokens: 4 });
    assert.match(resp._request_id, requestID);
    assert.notEqual(resp._request_id, chat._request_id);
    await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }] }),
      (err) => err.status === 404 && requestID.test(err.requestID));
  });
}

for (const { path, model } of thinkers) {
  test(`${path}: reasoning tokens are counted`, async () => {
    const resp = await client.responses.create({ model, input: 'think about it', reasoning: { effort: 'medium', summary: 'auto' } });
    assert.ok(resp.output.some((o) => o.type === 'reasoning'), 'a reasoning item');
    assert.ok(resp.usage.output_tokens_details.reasoning_tokens > 0, JSON.stringify(resp.usage));
    assert.ok(resp.usage.output_tokens_details.reasoning_tokens <= resp.usage.output_tokens, JSON.stringify(resp.usage));
  });
}
