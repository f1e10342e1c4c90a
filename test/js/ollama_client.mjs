// Runs the official `ollama` JavaScript client against an iop edge.
// Driven by the Go test TestOllamaJavaScriptClient (cmd/iop), which starts
// the edge, a node and simulated providers, and sets:
//   IOP_OLLAMA_HOST  the edge's base URL, e.g. http://127.0.0.1:8080
//   IOP_MODELS       a JSON array of model names, one per provider protocol;
//                    their providers have capabilities tools and embeddings
//   IOP_VISION       a JSON array of those whose providers take images
//   IOP_THINKING     a JSON array of thinking models (iop sim --thinking),
//                    one per provider protocol
// Exits non-zero, naming the failed check, if any check fails.
import assert from 'node:assert/strict'
import { Ollama } from 'ollama'

const host = process.env.IOP_OLLAMA_HOST
const models = JSON.parse(process.env.IOP_MODELS ?? '[]')
const vision = JSON.parse(process.env.IOP_VISION ?? '[]')
const thinkers = JSON.parse(process.env.IOP_THINKING ?? '[]')
assert.ok(host, 'IOP_OLLAMA_HOST is not set')
assert.ok(models.length > 0, 'IOP_MODELS is empty')

const ollama = new Ollama({ host })
const png =
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=='

function checkFinal(r, model, evalCount) {
  assert.equal(r.done, true)
  assert.equal(r.model, model)
  assert.equal(r.done_reason, 'length')
  assert.equal(r.eval_count, evalCount)
  assert.ok(r.prompt_eval_count > 0, 'prompt_eval_count')
  for (const d of ['total_duration', 'load_duration', 'prompt_eval_duration', 'eval_duration']) {
    assert.ok(r[d] > 0, d)
  }
  assert.ok(!Number.isNaN(Date.parse(r.created_at)), 'created_at')
}

const embedded = {} // model → the vectors of its batch embed check
const checks = []
function check(name, fn) {
  checks.push({ name, fn })
}

for (const model of models) {
  const messages = [
    { role: 'system', content: 'be brief' },
    { role: 'user', content: 'say something' },
  ]
  const options = { num_predict: 4 }
  let streamedChat = ''
  check(`${model} chat stream`, async () => {
    const stream = await ollama.chat({ model, messages, options, stream: true, keep_alive: '5m' })
    let final
    let parts = 0
    for await (const part of stream) {
      if (part.done) final = part
      else {
        assert.equal(part.message.role, 'assistant')
        streamedChat += part.message.content
        parts++
      }
    }
    assert.equal(parts, 4)
    checkFinal(final, model, 4)
  })
  check(`${model} chat`, async () => {
    const r = await ollama.chat({ model, messages, options })
    checkFinal(r, model, 4)
    assert.equal(r.message.role, 'assistant')
    assert.equal(r.message.content, streamedChat)
  })
  let streamedGenerate = ''
  check(`${model} generate stream`, async () => {
    const stream = await ollama.generate({ model, prompt: 'say something', system: 'be brief', options, stream: true })
    let final
    for await (const part of stream) {
      if (part.done) final = part
      else streamedGenerate += part.response
    }
    assert.equal(streamedGenerate.trim().split(/\s+/).length, 4)
    checkFinal(final, model, 4)
  })
  check(`${model} generate`, async () => {
    const r = await ollama.generate({ model, prompt: 'say something', system: 'be brief', options })
    checkFinal(r, model, 4)
    assert.equal(r.response, streamedGenerate)
  })
  check(`${model} generate raw`, async () => {
    const r = await ollama.generate({ model, prompt: '[INST] hi [/INST]', raw: true, options: { num_predict: 2 } })
    assert.equal(r.done, true)
    assert.equal(r.eval_count, 2)
  })
  const tools = [
    {
      type: 'function',
      function: {
        name: 'get_weather',
        description: 'the weather in a city',
        parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
      },
    },
  ]
  const askTool = [{ role: 'user', content: 'use get_weather for Paris' }]
  function checkCall(calls) {
    assert.equal(calls?.length, 1, `tool calls ${JSON.stringify(calls)}`)
    const fn = calls[0].function
    assert.equal(fn.name, 'get_weather')
    assert.equal(typeof fn.arguments, 'object', 'arguments are an object, not JSON text')
    assert.equal(typeof fn.arguments.city, 'string')
    assert.equal(fn.arguments.days, 42)
  }
  check(`${model} chat with tools`, async () => {
    const r = await ollama.chat({ model, messages: askTool, tools })
    assert.equal(r.done, true)
    checkCall(r.message.tool_calls)
    // The tool's result goes back; the model answers in text.
    const next = await ollama.chat({
      model,
      tools,
      options: { num_predict: 3 },
      messages: [...askTool, r.message, { role: 'tool', content: 'sunny', tool_name: 'get_weather' }],
    })
    assert.equal(next.done, true)
    assert.equal(next.message.tool_calls, undefined)
    assert.equal(next.eval_count, 3)
    assert.ok(next.message.content.length > 0)
  })
  check(`${model} chat stream with tools`, async () => {
    const stream = await ollama.chat({ model, messages: askTool, tools, stream: true })
    const calls = []
    let final
    for await (const part of stream) {
      calls.push(...(part.message.tool_calls ?? []))
      if (part.done) final = part
    }
    checkCall(calls)
    assert.equal(final.done_reason, 'stop')
  })
  check(`${model} embed batch`, async () => {
    const r = await ollama.embed({ model, input: ['first text', 'second text'], truncate: true, keep_alive: '5m' })
    assert.equal(r.model, model)
    assert.equal(r.embeddings.length, 2)
    for (const v of r.embeddings) {
      assert.equal(v.length, 8)
      assert.ok(Math.abs(Math.hypot(...v) - 1) < 1e-5, 'unit vector')
    }
    assert.notDeepEqual(r.embeddings[0], r.embeddings[1])
    assert.equal(r.prompt_eval_count, 4)
    assert.ok(r.total_duration > 0 && r.load_duration > 0, 'durations')
    embedded[model] = r.embeddings
    const one = await ollama.embed({ model, input: 'first text', dimensions: 4 })
    assert.equal(one.embeddings.length, 1)
    assert.equal(one.embeddings[0].length, 4)
  })
  check(`${model} embeddings (the older API)`, async () => {
    const r = await ollama.embeddings({ model, prompt: 'first text' })
    assert.deepEqual(Object.keys(r), ['embedding'])
    // The older API answers the model's raw vector, as Ollama does; /api/embed
    // answers it normalized: the same direction, the length of /api/embed's 1.
    const norm = Math.hypot(...r.embedding)
    assert.equal(r.embedding.length, embedded[model][0].length)
    r.embedding.forEach((x, i) => assert.ok(Math.abs(x / norm - embedded[model][0][i]) < 1e-6, `component ${i}: ${x / norm} != ${embedded[model][0][i]}`))
  })
  check(`${model} chat with an image`, async () => {
    const request = {
      model,
      messages: [{ role: 'user', content: 'what is this?', images: [png] }],
      options: { num_predict: 1 },
    }
    if (vision.includes(model)) {
      const r = await ollama.chat(request)
      assert.equal(r.done, true)
      return
    }
    await assert.rejects(ollama.chat(request), (err) => {
      assert.equal(err.status_code, 400)
      assert.match(err.error, /vision/)
      return true
    })
  })
}

// A thinking model's reasoning comes in message.thinking (chat) and
// thinking (generate), streamed before the text, as Ollama sends it.
for (const model of thinkers) {
  const messages = [{ role: 'user', content: 'why is the sky blue?' }]
  const options = { num_predict: 3 }
  check(`${model} chat think: true, streamed`, async () => {
    const stream = await ollama.chat({ model, messages, options, think: true, stream: true })
    let thinking = ''
    let content = ''
    for await (const part of stream) {
      if (part.message.thinking) {
        assert.equal(content, '', 'thinking comes before the text')
        thinking += part.message.thinking
      }
      content += part.message.content
    }
    assert.equal(thinking.trim().split(/\s+/).length, 8)
    assert.equal(content.trim().split(/\s+/).length, 3)
  })
  check(`${model} chat think: "high"`, async () => {
    if (model === 'qwen3') {
      // Served by an Ollama provider: Ollama takes think levels only for
      // gpt-oss models, and its refusal reaches the client as it is.
      await assert.rejects(ollama.chat({ model, messages, options, think: 'high' }), (err) => {
        assert.equal(err.status_code, 400)
        assert.equal(err.error, 'think value "high" is not supported for this model')
        return true
      })
      return
    }
    const r = await ollama.chat({ model, messages, options, think: 'high' })
    assert.equal(r.message.thinking.trim().split(/\s+/).length, 16)
    assert.equal(r.message.content.trim().split(/\s+/).length, 3)
  })
  check(`${model} chat think: false`, async () => {
    const r = await ollama.chat({ model, messages, options, think: false })
    assert.equal(r.message.thinking, undefined)
    assert.equal(r.message.content.trim().split(/\s+/).length, 3)
  })
  check(`${model} generate think: true`, async () => {
    const r = await ollama.generate({ model, prompt: 'why?', options, think: true })
    assert.equal(r.thinking.trim().split(/\s+/).length, 8)
    assert.equal(r.response.trim().split(/\s+/).length, 3)
  })
}

check('embeddings alike from both provider protocols', async () => {
  // The simulated providers are seeded alike: one text, one vector.
  const vectors = models.map((m) => embedded[m])
  for (const v of vectors) {
    assert.ok(Array.isArray(v) && v.length === 2, 'every model embedded its batch')
    assert.deepEqual(v, vectors[0])
  }
})
check('list', async () => {
  const r = await ollama.list()
  const names = r.models.map((m) => m.name)
  for (const model of models) {
    assert.ok(
      names.includes(model) || names.includes(`${model}:latest`),
      `${model} not in ${names}`,
    )
  }
})
check('show', async () => {
  const r = await ollama.show({ model: models[0] })
  assert.ok(r.capabilities.includes('completion'))
})
check('ps and version', async () => {
  const ps = await ollama.ps()
  assert.ok(Array.isArray(ps.models))
  const v = await ollama.version()
  assert.match(v.version, /^\d+\.\d+\.\d+$/)
})
check('unknown model', async () => {
  await assert.rejects(
    ollama.chat({ model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }] }),
    (err) => {
      assert.equal(err.name, 'ResponseError')
      assert.equal(err.status_code, 404)
      assert.equal(err.error, "model 'no-such-model' not found")
      return true
    },
  )
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
