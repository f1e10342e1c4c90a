// The official `@anthropic-ai/sdk` client, unchanged, against an iop edge
// whose node drives a real Ollama (its tiny random-weight test models) on
// both execution paths. Driven by the Go test TestRealOllama_Messages
// (internal/e2e), which sets:
//   IOP_BASE_URL      the edge's base URL, http://127.0.0.1:PORT
//   IOP_CHAT_MODELS   JSON array of plain chat models, one per path
//   IOP_TOOL_MODELS   JSON array of models with tools, one per path
//   IOP_THINK_MODELS  JSON array of thinking models, one per path
// The models' text is random and never ends by itself, so the checks are
// the API's rules: shapes, stop_reason max_tokens at the limit, usage, the
// streamed events adding up to the final message.
// Prints one line per check and "N/M checks passed"; exits non-zero if any
// check failed.
import assert from 'node:assert/strict'
import Anthropic from '@anthropic-ai/sdk'

const client = new Anthropic({ baseURL: process.env.IOP_BASE_URL, apiKey: 'unused', maxRetries: 0 })
const chatModels = JSON.parse(process.env.IOP_CHAT_MODELS ?? '[]')
const toolModels = JSON.parse(process.env.IOP_TOOL_MODELS ?? '[]')
const thinkModels = JSON.parse(process.env.IOP_THINK_MODELS ?? '[]')
assert.ok(chatModels.length > 0 && toolModels.length > 0 && thinkModels.length > 0, 'IOP_CHAT_MODELS, IOP_TOOL_MODELS, IOP_THINK_MODELS')

const checks = []
function check(name, fn) {
  checks.push({ name, fn })
}

const messages = [{ role: 'user', content: 'why is the sky blue' }]

function checkMessage(msg, model, maxTokens) {
  assert.equal(msg.type, 'message')
  assert.equal(msg.role, 'assistant')
  assert.equal(msg.model, model)
  assert.match(msg.id, /^msg_/)
  assert.equal(msg.stop_reason, 'max_tokens', 'the model never stops by itself')
  assert.equal(msg.usage.output_tokens, maxTokens)
  assert.ok(msg.usage.input_tokens > 0)
}

for (const model of chatModels) {
  check(`${model}: messages.create`, async () => {
    const msg = await client.messages.create({ model, max_tokens: 4, system: 'be brief', messages, temperature: 0 })
    checkMessage(msg, model, 4)
    assert.deepEqual(msg.content.map((b) => b.type), ['text'])
    assert.ok(msg.content[0].text.length > 0)
  })

  check(`${model}: messages.stream`, async () => {
    const stream = client.messages.stream({ model, max_tokens: 4, messages, temperature: 0 })
    let text = ''
    stream.on('text', (delta) => { text += delta })
    const msg = await stream.finalMessage()
    checkMessage(msg, model, 4)
    assert.equal(text, msg.content[0].text)
  })

  check(`${model}: the same greedy answer streamed or not`, async () => {
    const params = { model, max_tokens: 5, messages, temperature: 0, top_k: 1 }
    const whole = await client.messages.create(params)
    const streamed = await client.messages.stream(params).finalMessage()
    assert.equal(streamed.content[0].text, whole.content[0].text)
  })
}

// A stop sequence from the middle of the greedy answer ends it there; the
// native provider (normalized path, the first chat model) says which one
// (the node matches them), Ollama's /v1 (tunnel path) cuts the text but
// does not say why.
chatModels.forEach((model, i) => {
  check(`${model}: stop_sequences`, async () => {
    const params = { model, max_tokens: 24, messages, temperature: 0 }
    const full = (await client.messages.create(params)).content[0].text
    const at = Math.floor(full.length / 2)
    const stop = full.slice(at, at + 3)
    const before = full.slice(0, full.indexOf(stop))
    const native = i === 0
    for (const msg of [
      await client.messages.create({ ...params, stop_sequences: ['never-said', stop] }),
      await client.messages.stream({ ...params, stop_sequences: ['never-said', stop] }).finalMessage(),
    ]) {
      assert.equal(msg.content.map((b) => b.text).join(''), before)
      assert.equal(msg.stop_reason, native ? 'stop_sequence' : 'end_turn')
      assert.equal(msg.stop_sequence, native ? stop : null)
    }
  })
})

for (const model of toolModels) {
  check(`${model}: a tool round trip reaches Ollama`, async () => {
    const tools = [{ name: 'get_weather', description: 'weather', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }]
    const msg = await client.messages.create({
      model, max_tokens: 4, tools,
      messages: [...messages,
        { role: 'assistant', content: [{ type: 'text', text: 'let me look' }, { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: 'sunny' }] }],
    })
    assert.ok(['max_tokens', 'tool_use'].includes(msg.stop_reason), msg.stop_reason)
    assert.ok(msg.content.length > 0)
  })
}

for (const model of thinkModels) {
  check(`${model}: thinking, streamed`, async () => {
    const stream = client.messages.stream({ model, max_tokens: 1025, thinking: { type: 'enabled', budget_tokens: 1024 }, messages })
    let thinking = ''
    stream.on('thinking', (delta) => { thinking += delta })
    const msg = await stream.finalMessage()
    assert.equal(msg.content[0].type, 'thinking', 'the model thinks (and never stops thinking)')
    assert.ok(msg.content[0].thinking.length > 0)
    assert.equal(thinking, msg.content[0].thinking)
    assert.ok(msg.content[0].signature.length > 0)
    assert.equal(msg.stop_reason, 'max_tokens')
  })

  check(`${model}: thinking, not streamed`, async () => {
    const msg = await client.messages.create({ model, max_tokens: 1025, thinking: { type: 'enabled', budget_tokens: 1024 }, messages })
    assert.equal(msg.content[0].type, 'thinking')
    assert.ok(msg.content[0].thinking.length > 0)
  })
}

check('an unknown model is a NotFoundError', async () => {
  await assert.rejects(client.messages.create({ model: 'no-such-model', max_tokens: 4, messages }),
    (err) => err instanceof Anthropic.NotFoundError && err.error?.error?.type === 'not_found_error')
})

let failed = 0
for (const { name, fn } of checks) {
  const start = performance.now()
  try {
    await fn()
    console.log(`ok   ${name} (${Math.round(performance.now() - start)} ms)`)
  } catch (err) {
    failed++
    console.log(`FAIL ${name}: ${err?.stack ?? err}`)
  }
}
console.log(`${checks.length - failed}/${checks.length} checks passed`)
process.exit(failed === 0 ? 0 : 1)
