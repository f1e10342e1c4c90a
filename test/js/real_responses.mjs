// The official `openai` JavaScript client's Responses API against an iop
// edge whose node drives a real Ollama (its tiny random-weight test models)
// on both execution paths. Driven by the Go test TestRealOllama_Responses
// (internal/e2e), which sets:
//   IOP_BASE_URL  the edge's OpenAI base URL, http://127.0.0.1:PORT/v1
//   IOP_MODELS    JSON [{"path": "normalized"|"tunnel", "model": NAME}, ...]
// The model's text is random, so the checks are the API's rules: the
// response object and its event sequence, status "incomplete" at
// max_output_tokens (the model never stops by itself), usage, and
// previous_response_id continuing a conversation across the two paths.
// Prints one line per check and "N/M checks passed"; exits non-zero if any
// check failed.
import assert from 'node:assert/strict'
import OpenAI from 'openai'

const client = new OpenAI({ baseURL: process.env.IOP_BASE_URL, apiKey: 'unused', maxRetries: 0 })
const models = JSON.parse(process.env.IOP_MODELS ?? '[]')
const thinkers = JSON.parse(process.env.IOP_THINK_MODELS ?? '[]')
assert.ok(models.length >= 2, 'IOP_MODELS must list a model per execution path')

const checks = []
function check(name, fn) {
  checks.push({ name, fn })
}

for (const { path, model } of models) {
  check(`${path}: responses.create`, async () => {
    const resp = await client.responses.create({ model, input: 'hello', max_output_tokens: 3, temperature: 0 })
    assert.equal(resp.object, 'response')
    assert.equal(resp.status, 'incomplete')
    assert.equal(resp.incomplete_details.reason, 'max_output_tokens')
    assert.equal(resp.output.at(-1).type, 'message')
    assert.ok(resp.output_text.length > 0)
    assert.equal(resp.usage.output_tokens, 3)
    assert.ok(resp.usage.input_tokens > 0)
  })

  check(`${path}: responses.stream`, async () => {
    const stream = client.responses.stream({ model, input: 'hello', max_output_tokens: 3, temperature: 0 })
    const types = []
    let text = ''
    for await (const ev of stream) {
      types.push(ev.type)
      if (ev.type === 'response.output_text.delta') text += ev.delta
    }
    const final = await stream.finalResponse()
    assert.equal(types[0], 'response.created')
    assert.equal(types.at(-1), 'response.incomplete')
    assert.ok(types.includes('response.output_text.done'))
    assert.equal(final.output_text, text)
    assert.equal(final.usage.output_tokens, 3)
  })
}

for (const { path, model } of models) {
  check(`${path}: structured output with text.format json_schema`, async () => {
    const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'], additionalProperties: false }
    const resp = await client.responses.create({
      model, input: 'answer as JSON', max_output_tokens: 32, temperature: 0,
      text: { format: { type: 'json_schema', name: 'answer', schema, strict: true } },
    })
    assert.equal(resp.text.format.type, 'json_schema')
    assert.equal(typeof JSON.parse(resp.output_text).ok, 'boolean', resp.output_text)
  })
}

// Both paths: Ollama refuses a level from a model that takes booleans
// (400 think value "low" is not supported for this model); the native
// provider sends think true instead, the tunnel the request without the
// effort.
for (const { path, model } of thinkers) {
  check(`${path}: reasoning.effort gives a reasoning item and reasoning_tokens`, async () => {
    const resp = await client.responses.create({ model, input: 'think first', reasoning: { effort: 'low' }, max_output_tokens: 8 })
    const reasoning = resp.output.filter((it) => it.type === 'reasoning')
    assert.equal(reasoning.length, 1, JSON.stringify(resp.output))
    assert.ok(resp.usage.output_tokens_details.reasoning_tokens > 0, JSON.stringify(resp.usage))
    assert.ok(resp.usage.output_tokens_details.reasoning_tokens <= resp.usage.output_tokens, JSON.stringify(resp.usage))
  })
}

check('previous_response_id across the two paths', async () => {
  const first = await client.responses.create({ model: models[0].model, input: 'hello', max_output_tokens: 3 })
  const second = await client.responses.create({
    model: models[1].model, previous_response_id: first.id, input: 'and then?', max_output_tokens: 3,
  })
  assert.equal(second.previous_response_id, first.id)
  assert.ok(second.output_text.length > 0)
  assert.ok(second.usage.input_tokens > first.usage.input_tokens, `${second.usage.input_tokens} > ${first.usage.input_tokens}`)
  const got = await client.responses.retrieve(second.id)
  assert.equal(got.output_text, second.output_text)
})

let passed = 0
for (const { name, fn } of checks) {
  try {
    await fn()
    passed++
    console.log(`ok   ${name}`)
  } catch (err) {
    console.log(`FAIL ${name}: ${err.stack ?? err}`)
  }
}
console.log(`${passed}/${checks.length} checks passed`)
process.exit(passed === checks.length ? 0 : 1)
