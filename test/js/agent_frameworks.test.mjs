// The clients agent frameworks are built on, against a running iop edge, on
// both execution paths: the Vercel AI SDK (`ai` with
// `@ai-sdk/openai-compatible`, and `ollama-ai-provider-v2`, the maintained
// Ollama provider for it) and LangChain.js (`@langchain/openai`,
// `@langchain/ollama`): generate, stream, a tool round trip, structured
// output, embeddings and reasoning. Run by TestAgentFrameworkClients
// (simulators: every check) and TestRealOllama_AgentFrameworks (a real
// Ollama with tiny random-weight models: IOP_REAL=1, the checks whose
// answer a random model can give: generate, stream, tools, reasoning),
// both in cmd/iop, which set:
//
//   IOP_BASE_URL     the edge's OpenAI base URL, "http://127.0.0.1:PORT/v1"
//   IOP_OLLAMA_HOST  the edge's Ollama base URL, "http://127.0.0.1:PORT"
//   IOP_MODELS       JSON [{"path": "normalized"|"tunnel", "model": NAME}, ...]:
//                    chat models (with tools and embeddings for the simulators)
//   IOP_TOOLS        the same for tool-calling models (default IOP_MODELS)
//   IOP_THINKING     the same for thinking models
//   IOP_REAL         "1" against a real Ollama
//   IOP_ALIAS        an alias without a tag (for checkOrPullModel), optional
//
// The bug reports are the named regression checks: through iop the
// AI SDK's reasoningText and LangChain's ChatOllama({think: true}) came
// back empty.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { generateText, streamText, generateObject, embed, embedMany, tool, stepCountIs } from 'ai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { createOllama } from 'ollama-ai-provider-v2';
import { createOpenAI } from '@ai-sdk/openai';
import { ChatOpenAI, OpenAIEmbeddings } from '@langchain/openai';
import { ChatOllama, OllamaEmbeddings } from '@langchain/ollama';
import { AIMessage, HumanMessage, ToolMessage } from '@langchain/core/messages';
import { tool as lcTool } from '@langchain/core/tools';
import { z } from 'zod';

const baseURL = process.env.IOP_BASE_URL;
const host = process.env.IOP_OLLAMA_HOST;
const models = JSON.parse(process.env.IOP_MODELS ?? '[]');
const toolModels = JSON.parse(process.env.IOP_TOOLS ?? process.env.IOP_MODELS ?? '[]');
const thinkers = JSON.parse(process.env.IOP_THINKING ?? '[]');
const real = process.env.IOP_REAL === '1';
assert.ok(baseURL && host && models.length >= 2 && thinkers.length >= 2, 'IOP_BASE_URL, IOP_OLLAMA_HOST, IOP_MODELS and IOP_THINKING');

const apiKey = 'client-key';
const openaiCompatible = createOpenAICompatible({ name: 'iop', baseURL, apiKey, includeUsage: true, supportsStructuredOutputs: true });
const ollamaProvider = createOllama({ baseURL: `${host}/api` });
// OpenAI's own provider: Responses (openaiProvider(m)) and chat
// (openaiProvider.chat(m)).
const openaiProvider = createOpenAI({ baseURL, apiKey });

// The two AI SDK providers, each with its way of setting a token limit
// and of asking a model to think (the OpenAI-compatible provider has none:
// a reasoning model reasons).
const aiProviders = [
  { name: 'ai-sdk openai-compatible', model: (m) => openaiCompatible(m), embedding: (m) => openaiCompatible.textEmbeddingModel(m),
    limit: (n, think) => ({ maxOutputTokens: n }) },
  { name: 'ai-sdk ollama', model: (m) => ollamaProvider(m), embedding: (m) => ollamaProvider.embedding(m),
    limit: (n, think) => ({ providerOptions: { ollama: { options: { num_predict: n }, ...(think ? { think: true } : {}) } } }) },
];

// The two LangChain chat models.
const lcProviders = [
  { name: 'langchain ChatOpenAI', chat: (model, opts = {}) => new ChatOpenAI({ model, apiKey, configuration: { baseURL }, maxRetries: 0, ...(opts.limit ? { maxTokens: opts.limit } : {}) }),
    embeddings: (model) => new OpenAIEmbeddings({ model, apiKey, configuration: { baseURL }, maxRetries: 0 }) },
  { name: 'langchain ChatOllama', chat: (model, opts = {}) => new ChatOllama({ model, baseUrl: host, ...(opts.limit ? { numPredict: opts.limit } : {}), ...(opts.think ? { think: true } : {}) }),
    embeddings: (model) => new OllamaEmbeddings({ model, baseUrl: host }) },
];

const words = (s) => s.trim().split(/\s+/).filter(Boolean).length;
const askWeather = 'what is the weather in Paris? use get_weather';
const weatherSchema = z.object({ city: z.string(), days: z.number().int() });

// A random-weight model's text is anything, and it never stops by itself:
// with a token limit its answer is cut there. The simulators answer a
// word per token.
function checkLimited(text, finish, limit) {
  assert.equal(typeof text, 'string');
  assert.equal(finish, 'length');
  if (!real) assert.equal(words(text), limit);
}

// Structured output and reasoning effort through OpenAI's own AI SDK
// provider: generateObject sends Responses text.format json_schema (and
// chat response_format json_schema); reasoningEffort sends Responses
// reasoning.effort.
if (!real) {
  for (const { path, model } of models) {
    for (const [api, m] of [['responses', () => openaiProvider(model)], ['chat', () => openaiProvider.chat(model)]]) {
      test(`ai-sdk openai ${api} ${path}: generateObject (structured output)`, async () => {
        const r = await generateObject({ model: m(), schema: weatherSchema, prompt: 'the weather in Paris, as JSON' });
        assert.equal(typeof r.object.city, 'string');
        assert.equal(r.object.days, 42);
      });
    }
  }
}
for (const { path, model } of thinkers) {
  test(`ai-sdk openai responses ${path}: reasoning with effort`, async () => {
    const r = await generateText({ model: openaiProvider(model), prompt: 'think first', maxOutputTokens: 3,
      providerOptions: { openai: { reasoningEffort: 'low', reasoningSummary: 'auto' } } });
    assert.ok(r.reasoningText && r.reasoningText.length > 0, `reasoning: ${JSON.stringify(r.reasoning)}`);
    assert.ok(r.usage.reasoningTokens > 0, `usage ${JSON.stringify(r.usage)}`);
  });
}

for (const p of aiProviders) {
  for (const { path, model } of models) {
    test(`${p.name} ${path}: generateText`, async () => {
      const r = await generateText({ model: p.model(model), prompt: 'say something', ...p.limit(5) });
      checkLimited(r.text, r.finishReason, 5);
      if (!real) assert.equal(r.usage.outputTokens, 5);
    });

    test(`${p.name} ${path}: streamText`, async () => {
      let failure;
      const r = streamText({ model: p.model(model), prompt: 'say something', ...p.limit(4), onError: ({ error }) => { failure = error; } });
      let deltas = 0;
      for await (const part of r.textStream) if (part) deltas++;
      assert.equal(failure, undefined);
      checkLimited(await r.text, await r.finishReason, 4);
      if (!real) assert.ok(deltas >= 2, 'the text arrives in parts');
    });
  }

  for (const { path, model } of toolModels) {
    test(`${p.name} ${path}: tools`, async () => {
      const calls = [];
      const get_weather = tool({ description: 'the weather', inputSchema: weatherSchema,
        execute: async (input) => { calls.push(input); return { forecast: 'sunny', ...input }; } });
      if (real) {
        // The request reaches the model with its tool; then a conversation
        // holding a call and its result (the round trip's second step).
        const r = await generateText({ model: p.model(model), prompt: askWeather, tools: { get_weather }, ...p.limit(3) });
        assert.equal(typeof r.text, 'string');
        const r2 = await generateText({ model: p.model(model), tools: { get_weather }, ...p.limit(3), messages: [
          { role: 'user', content: askWeather },
          { role: 'assistant', content: [{ type: 'tool-call', toolCallId: 'call_1', toolName: 'get_weather', input: { city: 'Paris', days: 2 } }] },
          { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'call_1', toolName: 'get_weather', output: { type: 'json', value: { forecast: 'sunny' } } }] },
        ] });
        assert.equal(r2.finishReason, 'length');
        return;
      }
      // The round trip: the model calls the tool, the SDK runs it and
      // sends the result back, the model answers in text.
      const r = await generateText({ model: p.model(model), prompt: askWeather, tools: { get_weather }, stopWhen: stepCountIs(3), ...p.limit(4) });
      assert.equal(r.steps.length, 2);
      assert.equal(r.steps[0].finishReason, 'tool-calls');
      assert.equal(r.steps[0].toolCalls[0].toolName, 'get_weather');
      assert.equal(calls.length, 1);
      assert.equal(calls[0].days, 42);
      assert.equal(typeof calls[0].city, 'string');
      assert.equal(r.steps[1].finishReason, 'length');
      assert.equal(words(r.text), 4);
    });
  }

  if (!real) {
    for (const { path, model } of models) {
      test(`${p.name} ${path}: generateObject (structured output)`, async () => {
        const r = await generateObject({ model: p.model(model), schema: weatherSchema, prompt: 'the weather in Paris, as JSON' });
        assert.equal(typeof r.object.city, 'string');
        assert.equal(r.object.days, 42);
      });

      test(`${p.name} ${path}: embed and embedMany`, async () => {
        const many = await embedMany({ model: p.embedding(model), values: ['first text', 'second text'] });
        assert.equal(many.embeddings.length, 2);
        assert.ok(many.embeddings.every((v) => v.length === 8 && v.every(Number.isFinite)));
        const one = await embed({ model: p.embedding(model), value: 'first text' });
        assert.deepEqual(one.embedding, many.embeddings[0]);
      });
    }
  }

  for (const { path, model } of thinkers) {
    // Issue 15's report: through iop, reasoningText came back empty.
    test(`${p.name} ${path}: regression: reasoningText is not empty`, async () => {
      const r = await generateText({ model: p.model(model), prompt: 'think first', ...p.limit(3, true) });
      assert.ok(r.reasoningText && r.reasoningText.trim().length > 0, `reasoningText ${JSON.stringify(r.reasoningText)}`);
      if (!real) assert.equal(words(r.text), 3);
    });

    test(`${p.name} ${path}: streamText reasoning comes first, as it is made`, async () => {
      let failure;
      const r = streamText({ model: p.model(model), prompt: 'think first', ...p.limit(3, true), onError: ({ error }) => { failure = error; } });
      let reasoningParts = 0;
      let text = '';
      for await (const part of r.fullStream) {
        if (part.type === 'reasoning-delta' && part.text) {
          assert.equal(text, '', 'reasoning before the text');
          reasoningParts++;
        }
        if (part.type === 'text-delta') text += part.text;
      }
      assert.equal(failure, undefined);
      assert.ok(reasoningParts >= 2, `${reasoningParts} reasoning parts, want them as they come`);
      assert.ok((await r.reasoningText).trim().length > 0);
    });
  }
}

for (const p of lcProviders) {
  for (const { path, model } of models) {
    test(`${p.name} ${path}: invoke`, async () => {
      const msg = await p.chat(model, { limit: 5 }).invoke('say something');
      assert.equal(typeof msg.content, 'string');
      if (!real) assert.equal(words(msg.content), 5);
    });

    test(`${p.name} ${path}: stream`, async () => {
      let text = '';
      let parts = 0;
      for await (const chunk of await p.chat(model, { limit: 4 }).stream('say something')) {
        if (chunk.content) parts++;
        text += chunk.content;
      }
      if (!real) {
        assert.equal(words(text), 4);
        assert.ok(parts >= 2, 'the text arrives in parts');
      }
    });
  }

  for (const { path, model } of toolModels) {
    test(`${p.name} ${path}: tools`, async () => {
      const get_weather = lcTool(async ({ city, days }) => JSON.stringify({ forecast: 'sunny', city, days }),
        { name: 'get_weather', description: 'the weather', schema: weatherSchema });
      const llm = p.chat(model, { limit: 4 }).bindTools([get_weather]);
      const human = new HumanMessage(askWeather);
      if (real) {
        const ai = await llm.invoke([human]);
        assert.equal(typeof ai.content, 'string');
        const answer = await llm.invoke([human,
          new AIMessage({ content: '', tool_calls: [{ id: 'call_1', name: 'get_weather', args: { city: 'Paris', days: 2 } }] }),
          new ToolMessage({ tool_call_id: 'call_1', content: '{"forecast":"sunny"}' })]);
        assert.equal(typeof answer.content, 'string');
        return;
      }
      const ai = await llm.invoke([human]);
      assert.equal(ai.tool_calls.length, 1);
      const call = ai.tool_calls[0];
      assert.equal(call.name, 'get_weather');
      assert.equal(call.args.days, 42);
      const result = await get_weather.invoke(call);
      assert.ok(result instanceof ToolMessage);
      const answer = await llm.invoke([human, ai, result]);
      assert.equal(answer.tool_calls?.length ?? 0, 0);
      assert.equal(words(answer.content), 4);
    });
  }

  if (!real) {
    for (const { path, model } of models) {
      test(`${p.name} ${path}: withStructuredOutput`, async () => {
        const out = await p.chat(model).withStructuredOutput(weatherSchema, { method: 'jsonSchema', name: 'weather' }).invoke('the weather in Paris, as JSON');
        assert.equal(typeof out.city, 'string');
        assert.equal(out.days, 42);
      });

      test(`${p.name} ${path}: embeddings`, async () => {
        const e = p.embeddings(model);
        const docs = await e.embedDocuments(['first text', 'second text']);
        assert.equal(docs.length, 2);
        assert.ok(docs.every((v) => v.length === 8 && v.every(Number.isFinite)));
        assert.deepEqual(await e.embedQuery('first text'), docs[0]);
      });
    }
  }

  for (const { path, model } of thinkers) {
    // Issue 15's report: through iop, ChatOllama({think: true}) came back
    // without its reasoning. Both chat models put it in additional_kwargs
    // (reasoning_content); ChatOllama's messages also show it as a
    // standard "reasoning" block in contentBlocks (LangChain's OpenAI
    // translator reads no reasoning_content, so ChatOpenAI's do not).
    test(`${p.name} ${path}: regression: reasoning in additional_kwargs${p.name.endsWith('ChatOllama') ? ' and contentBlocks' : ''}`, async () => {
      const msg = await p.chat(model, { limit: 3, think: true }).invoke('think first');
      const reasoning = msg.additional_kwargs.reasoning_content;
      assert.ok(typeof reasoning === 'string' && reasoning.trim().length > 0, `reasoning_content ${JSON.stringify(reasoning)}`);
      if (p.name.endsWith('ChatOllama')) {
        const block = msg.contentBlocks.find((b) => b.type === 'reasoning');
        assert.ok(block && block.reasoning === reasoning, `contentBlocks ${JSON.stringify(msg.contentBlocks)}`);
      }
      if (!real) assert.equal(words(msg.content), 3);
    });

    test(`${p.name} ${path}: streamed reasoning`, async () => {
      let reasoning = '';
      let parts = 0;
      for await (const chunk of await p.chat(model, { limit: 3, think: true }).stream('think first')) {
        const r = chunk.additional_kwargs?.reasoning_content;
        if (r) {
          reasoning += r;
          parts++;
        }
      }
      assert.ok(reasoning.trim().length > 0 && parts >= 2, `${parts} reasoning parts: ${JSON.stringify(reasoning)}`);
    });
  }
}

// ChatOllama({checkOrPullModel: true}) looks the model up in /api/tags
// (its name, or its name with ":latest") and pulls it when missing: a
// model iop serves is found under any of its names, and one it does not
// serve fails with Ollama's pull error.
if (!real) {
  for (const { path, model } of models) {
    const base = model.replace(/:latest$/, '');
    const names = base.includes(':') ? [model] : [base, `${base}:latest`];
    for (const name of names) {
      test(`langchain ChatOllama ${path}: checkOrPullModel finds ${name}`, async () => {
        const msg = await new ChatOllama({ model: name, baseUrl: host, numPredict: 2, checkOrPullModel: true }).invoke('hi');
        assert.equal(words(msg.content), 2);
      });
    }
  }
  // An alias has no tag: /api/tags lists it as "<alias>:latest", as
  // Ollama lists every model, and /api/pull of it answers Ollama's success
  // stream, so a client asking for the tagged name finds it or pulls it
  // (before, it pulled, and got a 404).
  const alias = process.env.IOP_ALIAS;
  if (alias) {
    test(`langchain ChatOllama: regression: checkOrPullModel of the alias ${alias}:latest`, async () => {
      const msg = await new ChatOllama({ model: `${alias}:latest`, baseUrl: host, numPredict: 2, checkOrPullModel: true }).invoke('hi');
      assert.equal(words(msg.content), 2);
    });
  }
  test('langchain ChatOllama: checkOrPullModel of a model iop does not serve', async () => {
    await assert.rejects(new ChatOllama({ model: 'not-served:7b', baseUrl: host, checkOrPullModel: true }).invoke('hi'),
      /pull model manifest: file does not exist/);
  });
}
