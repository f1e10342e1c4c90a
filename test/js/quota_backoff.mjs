// The official `openai` and `@anthropic-ai/sdk` clients back off on iop's
// quota 429 (Retry-After) and succeed. Run by TestQuotaSDKsBackOff
// (internal/e2e), which holds most of the key's tokens_per_minute with a
// slow request while this runs, and sets:
//
//   IOP_BASE_URL  the edge's address, "http://127.0.0.1:PORT"
//   IOP_KEY       a client key with a quota
//   IOP_MODEL     a model to ask
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const base = process.env.IOP_BASE_URL;
const apiKey = process.env.IOP_KEY;
const model = process.env.IOP_MODEL;

// recorder is a fetch that keeps each answer's status, Retry-After and
// rate-limit headers, and when it came.
function recorder() {
  const seen = [];
  const f = async (url, init) => {
    const res = await fetch(url, init);
    const h = {};
    for (const [k, v] of res.headers) if (k === 'retry-after' || k.includes('ratelimit')) h[k] = v;
    seen.push({ status: res.status, at: Date.now(), headers: h });
    return res;
  };
  return { seen, fetch: f };
}

// checkBackedOff: a 429 with Retry-After came first, the client waited at
// least that long before its next try, and the last try succeeded.
function checkBackedOff(seen, prefix) {
  assert.ok(seen.length >= 2, `at least one retry: ${JSON.stringify(seen)}`);
  assert.equal(seen[0].status, 429, JSON.stringify(seen));
  assert.equal(seen.at(-1).status, 200, JSON.stringify(seen));
  for (let i = 0; i + 1 < seen.length; i++) {
    if (seen[i].status !== 429) continue;
    const after = Number(seen[i].headers['retry-after']);
    assert.ok(after >= 1, `Retry-After ${seen[i].headers['retry-after']}`);
    assert.ok(seen[i + 1].at - seen[i].at >= after * 1000 - 50, `waited ${seen[i + 1].at - seen[i].at} ms, Retry-After ${after} s`);
    assert.ok(seen[i].headers[`${prefix}tokens-limit`] ?? seen[i].headers[`${prefix}limit-tokens`], JSON.stringify(seen[i].headers));
  }
}

// Both at once, while the slow request holds the quota: each is refused
// first, waits its Retry-After, and succeeds once the slow one settled.
test('openai and @anthropic-ai/sdk back off on a quota 429 and succeed', async () => {
  const o = recorder();
  const a = recorder();
  const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 40, fetch: o.fetch });
  const anthropic = new Anthropic({ baseURL: base, apiKey, maxRetries: 40, fetch: a.fetch });
  const ask = [{ role: 'user', content: 'hello' }];
  const [res, msg] = await Promise.all([
    openai.chat.completions.create({ model, max_tokens: 200, messages: ask }),
    anthropic.messages.create({ model, max_tokens: 200, messages: ask }),
  ]);
  assert.ok(res.choices[0].message.content.length > 0);
  assert.equal(msg.type, 'message');
  checkBackedOff(o.seen, 'x-ratelimit-');
  checkBackedOff(a.seen, 'anthropic-ratelimit-');
});
