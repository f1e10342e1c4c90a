// Forced tool choice and structured output through Anthropic's clients,
// unchanged, on a model an Ollama provider serves (the normalized path):
// the official `@anthropic-ai/sdk` and the Vercel AI SDK's Anthropic
// provider (`@ai-sdk/anthropic`, generateObject in its jsonTool mode, a
// forced call of a "json" tool). Driven by the Go tests
// TestRegression_ForcedToolChoiceOnOllama (the simulator) and
// TestRealOllama_ForcedToolChoice (internal/e2e), which set:
//   IOP_BASE_URL    the edge's base URL, http://127.0.0.1:PORT
//   IOP_TOOL_MODEL  a model with tools that an Ollama provider serves
// The tools' parameters are enums, so a model of random weights writes a
// whole call within a few tokens. Prints one line per check and
// "N/M checks passed"; exits non-zero if any check failed.
import assert from 'node:assert/strict'
import Anthropic from '@anthropic-ai/sdk'
import { createAnthropic } from '@ai-sdk/anthropic'
import { generateObject } from 'ai'
import { z } from 'zod'

const base = process.env.IOP_BASE_URL
const model = process.env.IOP_TOOL_MODEL
assert.ok(base && model, 'IOP_BASE_URL, IOP_TOOL_MODEL')
const client = new Anthropic({ baseURL: base, apiKey: 'unused', maxRetries: 0 })

const tools = [
  { name: 'get_weather', description: 'the weather in a city', input_schema: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] } }, required: ['city'] } },
  { name: 'get_time', description: 'the time in a zone', input_schema: { type: 'object', properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['zone'] } },
]
const messages = [{ role: 'user', content: 'what time is it?' }]

function checkCall(msg, name) {
  assert.equal(msg.stop_reason, 'tool_use')
  const calls = msg.content.filter((b) => b.type === 'tool_use')
  assert.equal(calls.length, 1)
  const call = calls[0]
  assert.match(call.id, /^toolu_/)
  if (name) assert.equal(call.name, name)
  if (call.name === 'get_time') assert.ok(['UTC', 'CET'].includes(call.input.zone), JSON.stringify(call.input))
  else assert.ok(['Paris', 'Oslo'].includes(call.input.city), JSON.stringify(call.input))
}

const checks = []
function check(name, fn) {
  checks.push({ name, fn })
}

check('messages.create, tool_choice tool', async () => {
  checkCall(await client.messages.create({ model, max_tokens: 200, tools, tool_choice: { type: 'tool', name: 'get_time' }, messages }), 'get_time')
})

check('messages.stream, tool_choice any', async () => {
  checkCall(await client.messages.stream({ model, max_tokens: 200, tools, tool_choice: { type: 'any' }, messages }).finalMessage())
})

check('messages.create, tool_choice none', async () => {
  const msg = await client.messages.create({ model, max_tokens: 3, tools, tool_choice: { type: 'none' }, messages })
  assert.ok(msg.content.every((b) => b.type !== 'tool_use'))
})

check('@ai-sdk/anthropic generateObject (jsonTool)', async () => {
  const anthropic = createAnthropic({ baseURL: base + '/v1', apiKey: 'unused' })
  const { object } = await generateObject({
    model: anthropic(model),
    schema: z.object({ zone: z.enum(['UTC', 'CET']) }),
    prompt: 'which zone?',
    maxOutputTokens: 200,
    maxRetries: 0,
    providerOptions: { anthropic: { structuredOutputMode: 'jsonTool' } },
  })
  assert.ok(['UTC', 'CET'].includes(object.zone), JSON.stringify(object))
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
