// The official `openai` JavaScript client against `iop dev` serving a real
// Ollama (its tiny random-weight test models). Driven by the Go test
// TestRealOllama_Dev (cmd/iop), which sets:
//   IOP_BASE_URL     the edge's OpenAI base URL, http://127.0.0.1:PORT/v1
//   IOP_CHAT_MODELS  JSON array of chat model names (e.g. "tiny:latest")
//   IOP_EMBED_MODEL  the embedding model's name
//   IOP_ABORT_MODEL  a chat model for the abort check alone (Ollama may keep
//                    its slot after a client goes away: ollama/ollama#17131)
//   IOP_ALL_MODELS   JSON array of every name /v1/models must list
//   IOP_DEFAULT_TOKENS  the answer length of a request with no max_tokens
// The model's text is random, so the checks are the API's rules: shapes,
// finish_reason "length" at the limit (the model never stops by itself),
// usage, and the same text for the same greedy request streamed or not.
// Prints one line per check and "N/M checks passed"; exits non-zero if any
// check failed. A check of a feature iop does not offer yet for a
// discovered Ollama (embeddings: the node advertises no capability but
// stream; issue 14) is skipped when the edge refuses it with 400
// unsupported_capability, and says so.
import assert from 'node:assert/strict'
import OpenAI from 'openai'

const client = new OpenAI({ baseURL: process.env.IOP_BASE_URL, apiKey: 'unused', maxRetries: 0 })
const chatModels = JSON.parse(process.env.IOP_CHAT_MODELS ?? '[]')
const allModels = JSON.parse(process.env.IOP_ALL_MODELS ?? '[]')
const embedModel = process.env.IOP_EMBED_MODEL
const abortModel = process.env.IOP_ABORT_MODEL
const defaultTokens = Number(process.env.IOP_DEFAULT_TOKENS)
assert.ok(chatModels.length > 0 && embedModel && abortModel && defaultTokens > 0, 'IOP_CHAT_MODELS, IOP_EMBED_MODEL, IOP_ABORT_MODEL, IOP_DEFAULT_TOKENS')

class Skip extends Error {}
const checks = []
function check(name, fn) {
  checks.push({ name, fn })
}

// notYet turns the edge's refusal of a capability it does not advertise
// yet into a skip; any other error stays an error.
async function notYet(promise, what) {
  try {
    return await promise
  } catch (err) {
    if (err instanceof OpenAI.BadRequestError && err.code === 'unsupported_capability') {
      throw new Skip(`${what} refused by the edge (${err.message}): capabilities of a discovered Ollama, issue 14`)
    }
    throw err
  }
}

const messages = [
  { role: 'system', content: 'be brief' },
  { role: 'user', content: 'why is the sky blue' },
]

check('models list', async () => {
  const ids = []
  for await (const m of client.models.list()) {
    assert.equal(m.object, 'model')
    ids.push(m.id)
  }
  for (const want of allModels) assert.ok(ids.includes(want), `${want} not in ${ids}`)
})

for (const model of chatModels) {
  let greedy = null
  check(`${model} chat`, async () => {
    const r = await client.chat.completions.create({ model, max_tokens: 5, messages, temperature: 0, seed: 1 })
    assert.equal(r.object, 'chat.completion')
    assert.equal(r.choices.length, 1)
    const c = r.choices[0]
    assert.equal(c.finish_reason, 'length')
    assert.equal(c.message.role, 'assistant')
    assert.equal(typeof c.message.content, 'string')
    assert.ok(c.message.content.length > 0, 'content')
    assert.equal(r.usage.completion_tokens, 5)
    assert.ok(r.usage.prompt_tokens > 0, 'prompt_tokens')
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 5)
    greedy = c.message.content
  })
  check(`${model} chat stream with usage`, async () => {
    const stream = await client.chat.completions.create({
      model, max_tokens: 5, messages, temperature: 0, seed: 1, stream: true, stream_options: { include_usage: true },
    })
    let text = ''
    let finish = null
    let usage = null
    let chunks = 0
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk')
      for (const choice of chunk.choices) {
        text += choice.delta.content ?? ''
        finish = choice.finish_reason ?? finish
        chunks++
      }
      usage = chunk.usage ?? usage
    }
    assert.ok(chunks >= 2, `streamed in ${chunks} chunks`)
    assert.equal(finish, 'length')
    assert.equal(usage?.completion_tokens, 5)
    assert.equal(text, greedy, 'the same greedy request gives the same text streamed or not')
  })
  check(`${model} chat stop`, async () => {
    const at = Math.floor(greedy.length / 2)
    const stop = greedy.slice(at, at + 2)
    const r = await client.chat.completions.create({ model, max_tokens: 5, messages, temperature: 0, seed: 1, stop })
    assert.equal(r.choices[0].finish_reason, 'stop')
    assert.equal(r.choices[0].message.content, greedy.slice(0, greedy.indexOf(stop)))
  })
  check(`${model} chat with no max_tokens`, async () => {
    const r = await client.chat.completions.create({ model, messages })
    assert.equal(r.choices[0].finish_reason, 'length')
    assert.equal(r.usage.completion_tokens, defaultTokens)
  })
  check(`${model} completions`, async () => {
    const r = await client.completions.create({ model, prompt: 'once upon a time', max_tokens: 3, temperature: 0 })
    assert.equal(r.object, 'text_completion')
    assert.equal(r.choices[0].finish_reason, 'length')
    assert.ok(r.choices[0].text.length > 0)
    assert.equal(r.usage.completion_tokens, 3)
  })
  check(`${model} completions stream`, async () => {
    const stream = await client.completions.create({
      model, prompt: 'once upon a time', max_tokens: 3, stream: true, stream_options: { include_usage: true },
    })
    let finish = null
    let usage = null
    for await (const chunk of stream) {
      for (const choice of chunk.choices) finish = choice.finish_reason ?? finish
      usage = chunk.usage ?? usage
    }
    assert.equal(finish, 'length')
    assert.equal(usage?.completion_tokens, 3)
  })
}

check(`${embedModel} embeddings`, async () => {
  const input = ['the first text', 'a second one']
  const b64 = await notYet(client.embeddings.create({ model: embedModel, input }), 'embeddings')
  const float = await client.embeddings.create({ model: embedModel, input, encoding_format: 'float' })
  for (const r of [b64, float]) {
    assert.equal(r.data.length, 2)
    for (const d of r.data) {
      assert.equal(d.embedding.length, 32)
      const norm = d.embedding.reduce((s, x) => s + x * x, 0)
      assert.ok(Math.abs(norm - 1) < 1e-4, `unit vector, norm ${norm}`)
    }
  }
  float.data.forEach((d, i) => assert.deepEqual(d.embedding.map(Math.fround), Array.from(b64.data[i].embedding, Math.fround)))
})

check('an unknown model is a 404', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'no-such-model', messages }),
    (err) => err instanceof OpenAI.NotFoundError,
  )
})

check('a client that goes away mid-stream', async () => {
  const stream = await client.chat.completions.create({ model: abortModel, max_tokens: 1000000, messages, stream: true })
  let got = 0
  for await (const chunk of stream) {
    if (chunk.choices[0]?.delta?.content) got++
    if (got === 3) {
      stream.controller.abort()
      break
    }
  }
  assert.equal(got, 3)
})

let failed = 0
let skipped = 0
for (const { name, fn } of checks) {
  const start = performance.now()
  try {
    await fn()
    console.log(`ok   ${name} (${Math.round(performance.now() - start)} ms)`)
  } catch (err) {
    if (err instanceof Skip) {
      skipped++
      console.log(`skip ${name}: ${err.message}`)
      continue
    }
    failed++
    console.log(`FAIL ${name}: ${err?.stack ?? err}`)
  }
}
console.log(`${checks.length - failed - skipped}/${checks.length} checks passed, ${skipped} skipped`)
process.exit(failed === 0 ? 0 : 1)
