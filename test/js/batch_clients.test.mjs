// The official `openai` and `@anthropic-ai/sdk` clients running batches
// against a running iop edge, unchanged: upload, create, poll, download
// results, cancel. Run by TestBatchJavaScriptClients (internal/e2e), which
// starts the edge, a node and `iop sim` providers and sets:
//
//   IOP_BASE_URL  the edge's base URL, "http://127.0.0.1:PORT"
//   IOP_MODELS    JSON [{"path": "normalized"|"tunnel", "model": NAME}, ...]
//   IOP_SLOW      a model served slowly, one request at a time (to cancel)
//   IOP_SLOW_MAX_TOKENS  max_tokens of the lines to cancel (default 8 for
//                 openai's, 20 for anthropic's): a fast real model needs
//                 long answers for a cancel to land before the batch ends
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI, { toFile } from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const base = process.env.IOP_BASE_URL;
const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'client-key', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: base, apiKey: 'client-key', maxRetries: 0 });
const models = JSON.parse(process.env.IOP_MODELS ?? '[]').map((m) => m.model);
const slow = process.env.IOP_SLOW;
const slowMaxTokens = Number(process.env.IOP_SLOW_MAX_TOKENS ?? 0);
assert.ok(models.length >= 2 && slow, 'IOP_MODELS and IOP_SLOW must be set');

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function poll(get, done) {
  for (let i = 0; i < 600; i++) {
    const b = await get();
    if (done(b)) return b;
    await sleep(200);
  }
  throw new Error('batch did not end in time');
}

function chatLines(prefix, model, n, maxTokens = 8) {
  return Array.from({ length: n }, (_, i) => JSON.stringify({
    custom_id: `${prefix}-${i}`, method: 'POST', url: '/v1/chat/completions',
    body: { model, max_tokens: maxTokens, messages: [{ role: 'user', content: `line ${i}` }] },
  })).join('\n') + '\n';
}

test('openai: files.create, batches.create, retrieve polling, files.content', async () => {
  const input = models.map((m, i) => chatLines(`m${i}`, m, 3)).join('');
  const file = await openai.files.create({ file: await toFile(Buffer.from(input), 'input.jsonl'), purpose: 'batch' });
  assert.equal(file.object, 'file');
  assert.equal(file.purpose, 'batch');
  assert.equal(file.bytes, Buffer.byteLength(input));
  const created = await openai.batches.create({
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h', metadata: { job: 'sdk' },
  });
  assert.equal(created.object, 'batch');
  assert.equal(created.metadata.job, 'sdk');
  const batch = await poll(() => openai.batches.retrieve(created.id), (b) => !['validating', 'in_progress', 'finalizing'].includes(b.status));
  assert.equal(batch.status, 'completed');
  assert.deepEqual(batch.request_counts, { total: 3 * models.length, completed: 3 * models.length, failed: 0 });
  const text = await (await openai.files.content(batch.output_file_id)).text();
  const lines = text.trim().split('\n').map((l) => JSON.parse(l));
  assert.equal(lines.length, 3 * models.length);
  assert.equal(new Set(lines.map((l) => l.custom_id)).size, lines.length, 'each custom_id once');
  for (const l of lines) {
    assert.equal(l.response.status_code, 200);
    assert.equal(l.response.body.object, 'chat.completion');
    assert.ok(l.response.body.choices[0].message.content.length > 0);
  }
  const page = await openai.batches.list({ limit: 10 });
  assert.ok(page.data.some((b) => b.id === batch.id));
  const again = await openai.files.retrieve(file.id);
  assert.equal(again.id, file.id);
  const deleted = await openai.files.delete(file.id);
  assert.equal(deleted.deleted, true);
});

test('openai: batches.cancel', async () => {
  const file = await openai.files.create({ file: await toFile(Buffer.from(chatLines('s', slow, 20, slowMaxTokens || 8)), 'slow.jsonl'), purpose: 'batch' });
  const created = await openai.batches.create({ input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
  await poll(() => openai.batches.retrieve(created.id), (b) => b.status === 'in_progress');
  const cancelling = await openai.batches.cancel(created.id);
  assert.ok(['cancelling', 'cancelled'].includes(cancelling.status));
  const batch = await poll(() => openai.batches.retrieve(created.id), (b) => b.status === 'cancelled');
  assert.ok(batch.request_counts.completed < 20);
  assert.ok(batch.cancelled_at > 0);
});

test('anthropic: messages.batches create, retrieve, results', async () => {
  const requests = models.map((model, i) => ({
    custom_id: `r${i}`, params: { model, max_tokens: 8, messages: [{ role: 'user', content: 'say hello' }] },
  }));
  requests.push({ custom_id: 'bad', params: { model: 'no-such-model', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] } });
  const created = await anthropic.messages.batches.create({ requests });
  assert.equal(created.type, 'message_batch');
  assert.equal(created.processing_status, 'in_progress');
  const batch = await poll(() => anthropic.messages.batches.retrieve(created.id), (b) => b.processing_status === 'ended');
  assert.equal(batch.request_counts.succeeded, models.length);
  assert.equal(batch.request_counts.errored, 1);
  const seen = new Map();
  for await (const r of await anthropic.messages.batches.results(created.id)) {
    assert.ok(!seen.has(r.custom_id), 'each custom_id once');
    seen.set(r.custom_id, r.result);
  }
  assert.equal(seen.size, requests.length);
  for (let i = 0; i < models.length; i++) {
    const result = seen.get(`r${i}`);
    assert.equal(result.type, 'succeeded');
    assert.equal(result.message.type, 'message');
  }
  assert.equal(seen.get('bad').type, 'errored');
  assert.equal(seen.get('bad').error.type, 'error');
  const page = await anthropic.messages.batches.list({ limit: 5 });
  assert.ok(page.data.some((b) => b.id === created.id));
  const deleted = await anthropic.messages.batches.delete(created.id);
  assert.deepEqual(deleted, { id: created.id, type: 'message_batch_deleted' });
  await assert.rejects(anthropic.messages.batches.retrieve(created.id), (err) => err.status === 404);
});

test('anthropic: messages.batches.cancel', async () => {
  const requests = Array.from({ length: 20 }, (_, i) => ({
    custom_id: `c${i}`, params: { model: slow, max_tokens: slowMaxTokens || 20, messages: [{ role: 'user', content: 'hi' }] },
  }));
  const created = await anthropic.messages.batches.create({ requests });
  // A batch in progress is not deleted: it is canceled first.
  await assert.rejects(anthropic.messages.batches.delete(created.id),
    (err) => err.status === 400 && err.error?.error?.type === 'invalid_request_error');
  const canceling = await anthropic.messages.batches.cancel(created.id);
  assert.ok(['canceling', 'ended'].includes(canceling.processing_status));
  const batch = await poll(() => anthropic.messages.batches.retrieve(created.id), (b) => b.processing_status === 'ended');
  assert.ok(batch.request_counts.canceled > 0, 'unrun requests are canceled');
  let canceled = 0;
  for await (const r of await anthropic.messages.batches.results(created.id)) {
    if (r.result.type === 'canceled') canceled++;
  }
  assert.equal(canceled, batch.request_counts.canceled);
  // An ended batch is canceled no more (400, Anthropic's shape).
  await assert.rejects(anthropic.messages.batches.cancel(created.id),
    (err) => err.status === 400 && err.error?.error?.type === 'invalid_request_error');
});
