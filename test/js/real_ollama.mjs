// The official `ollama` JavaScript client against `iop dev` serving a real
// Ollama (its tiny random-weight test models). Driven by the Go test
// TestRealOllama_Dev (cmd/iop), which sets:
//   IOP_OLLAMA_HOST  the edge's base URL, http://127.0.0.1:PORT
//   IOP_CHAT_MODELS  JSON array of chat model names
//   IOP_EMBED_MODEL  the embedding model's name
//   IOP_ABORT_MODEL  a chat model for the abort check alone (Ollama may keep
//                    its slot after a client goes away: ollama/ollama#17131)
//   IOP_THINK_MODEL  a model whose template gives it the thinking capability
//   IOP_ALL_MODELS   JSON array of every name /api/tags must list
// The model's text is random, so the checks are the API's rules: NDJSON
// parts, done_reason "length" and eval_count at num_predict (the model
// never stops by itself), and the same text for the same greedy request
// streamed or not. Prints one line per check and "N/M checks passed";
// exits non-zero if any check failed. Checks of what iop does not offer
// yet for a discovered Ollama (embeddings: issue 14; thinking: the next
// issue) are skipped, and say so, while iop refuses or drops them.
import assert from 'node:assert/strict'
import { Ollama } from 'ollama'

const host = process.env.IOP_OLLAMA_HOST
const chatModels = JSON.parse(process.env.IOP_CHAT_MODELS ?? '[]')
const allModels = JSON.parse(process.env.IOP_ALL_MODELS ?? '[]')
const embedModel = process.env.IOP_EMBED_MODEL
const abortModel = process.env.IOP_ABORT_MODEL
const thinkModel = process.env.IOP_THINK_MODEL
assert.ok(host && chatModels.length > 0 && embedModel && abortModel && thinkModel, 'IOP_OLLAMA_HOST, IOP_CHAT_MODELS, IOP_EMBED_MODEL, IOP_ABORT_MODEL, IOP_THINK_MODEL')
const ollama = new Ollama({ host })

class Skip extends Error {}
const checks = []
function check(name, fn) {
  checks.push({ name, fn })
}

function checkFinal(r, model, evalCount) {
  assert.equal(r.done, true)
  assert.equal(r.model, model)
  assert.equal(r.done_reason, 'length')
  assert.equal(r.eval_count, evalCount)
  assert.ok(r.prompt_eval_count > 0, 'prompt_eval_count')
  assert.ok(!Number.isNaN(Date.parse(r.created_at)), 'created_at')
}

const messages = [
  { role: 'system', content: 'be brief' },
  { role: 'user', content: 'why is the sky blue' },
]
const greedy = { num_predict: 4, temperature: 0, seed: 1 }

for (const model of chatModels) {
  let streamed = ''
  check(`${model} chat stream`, async () => {
    const stream = await ollama.chat({ model, messages, options: greedy, stream: true })
    let final
    let parts = 0
    for await (const part of stream) {
      if (part.done) final = part
      else {
        assert.equal(part.message.role, 'assistant')
        streamed += part.message.content
        parts++
      }
    }
    assert.ok(parts >= 2, `streamed in ${parts} parts`)
    assert.ok(streamed.length > 0)
    checkFinal(final, model, 4)
  })
  check(`${model} chat`, async () => {
    const r = await ollama.chat({ model, messages, options: greedy })
    checkFinal(r, model, 4)
    assert.equal(r.message.content, streamed, 'the same greedy request gives the same text streamed or not')
  })
  check(`${model} generate stream and not`, async () => {
    let text = ''
    let final
    for await (const part of await ollama.generate({ model, prompt: 'once upon a time', options: greedy, stream: true })) {
      if (part.done) final = part
      else text += part.response
    }
    checkFinal(final, model, 4)
    const r = await ollama.generate({ model, prompt: 'once upon a time', options: greedy })
    checkFinal(r, model, 4)
    assert.equal(r.response, text)
  })
}

check(`${thinkModel} chat with think`, async () => {
  const r = await ollama.chat({ model: thinkModel, messages, think: true, options: { num_predict: 4 } })
  assert.equal(r.done, true)
  assert.equal(r.eval_count, 4)
  // Ollama answers this model's think request in message.thinking (its
  // template ends the prompt with <think>; the model never closes it).
  if (!r.message.thinking) {
    throw new Skip(`no message.thinking (content ${JSON.stringify(r.message.content)}): iop drops thinking, the next issue`)
  }
})

check(`${embedModel} embed`, async () => {
  let r
  try {
    r = await ollama.embed({ model: embedModel, input: ['first text', 'second text'] })
  } catch (err) {
    if (err.status_code === 400 && /capabilit/.test(err.error)) {
      throw new Skip(`refused by the edge (${err.error}): capabilities of a discovered Ollama, issue 14`)
    }
    throw err
  }
  assert.equal(r.embeddings.length, 2)
  for (const v of r.embeddings) {
    assert.equal(v.length, 32)
    assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-4, 'unit vector')
  }
  assert.notDeepEqual(r.embeddings[0], r.embeddings[1])
})

check('list', async () => {
  const names = (await ollama.list()).models.map((m) => m.name)
  for (const want of allModels) assert.ok(names.includes(want), `${want} not in ${names}`)
})
check('show', async () => {
  const r = await ollama.show({ model: chatModels[chatModels.length - 1] })
  assert.ok(r.capabilities.includes('completion'), `capabilities ${r.capabilities}`)
})
check('ps and version', async () => {
  assert.ok(Array.isArray((await ollama.ps()).models))
  assert.match((await ollama.version()).version, /^\d+\.\d+\.\d+/)
})
check('unknown model', async () => {
  await assert.rejects(ollama.chat({ model: 'no-such-model', messages }), (err) => {
    assert.equal(err.status_code, 404)
    return true
  })
})
check('a client that aborts mid-stream', async () => {
  const client = new Ollama({ host })
  const stream = await client.chat({ model: abortModel, messages, stream: true, options: { num_predict: 1000000 } })
  let parts = 0
  for await (const part of stream) {
    if (part.message.content) parts++
    if (parts === 3) {
      stream.abort()
      break
    }
  }
  assert.equal(parts, 3)
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
