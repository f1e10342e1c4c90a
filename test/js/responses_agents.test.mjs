// The agent frameworks whose default mode speaks OpenAI's Responses API,
// against a running iop edge on both execution paths: the OpenAI Agents
// SDK (@openai/agents, OpenAIResponsesModel, its default) with a function
// tool, and the AI SDK's default OpenAI provider (@ai-sdk/openai,
// openai(id), which calls /v1/responses) with generateText, streamText and
// a tool round trip. Run by TestResponsesJavaScriptClients
// (internal/e2e), which sets IOP_BASE_URL and IOP_MODELS (see
// responses_openai.test.mjs).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Agent, run, tool as agentTool, setDefaultOpenAIClient, setTracingDisabled, setOpenAIAPI } from '@openai/agents';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText, tool, stepCountIs } from 'ai';
import { z } from 'zod';

const baseURL = process.env.IOP_BASE_URL;
const models = JSON.parse(process.env.IOP_MODELS ?? '[]');
assert.ok(baseURL && models.length >= 2, 'IOP_BASE_URL and IOP_MODELS');
const apiKey = 'client-key';

// The Agents SDK's default: the Responses API through the given client.
setTracingDisabled(true);
setOpenAIAPI('responses');
setDefaultOpenAIClient(new OpenAI({ baseURL, apiKey, maxRetries: 0 }));

const openai = createOpenAI({ baseURL, apiKey });

for (const { path, model } of models) {
  test(`${path}: @openai/agents run with a function tool`, async () => {
    let called = 0;
    const getWeather = agentTool({
      name: 'get_weather',
      description: 'the weather of a city',
      parameters: z.object({ city: z.string(), days: z.number().int() }),
      execute: async ({ city, days }) => {
        called++;
        assert.equal(typeof city, 'string');
        assert.equal(days, 42);
        return `sunny in ${city}`;
      },
    });
    const agent = new Agent({ name: 'weather', instructions: 'answer briefly', model, tools: [getWeather] });
    const result = await run(agent, 'what is the weather in Paris? use get_weather', { maxTurns: 4 });
    assert.equal(called, 1);
    assert.equal(typeof result.finalOutput, 'string');
    assert.ok(result.finalOutput.length > 0);
  });

  test(`${path}: @ai-sdk/openai generateText`, async () => {
    const { text, usage, finishReason } = await generateText({
      model: openai(model), prompt: 'say something deterministic', maxOutputTokens: 5,
    });
    assert.equal(text.trim().split(/\s+/).length, 5);
    assert.equal(usage.outputTokens, 5);
    assert.equal(finishReason, 'length');
  });

  test(`${path}: @ai-sdk/openai streamText`, async () => {
    const result = streamText({ model: openai(model), prompt: 'say something deterministic', maxOutputTokens: 4 });
    let text = '';
    for await (const part of result.textStream) text += part;
    assert.equal(text.trim().split(/\s+/).length, 4);
    assert.equal((await result.usage).outputTokens, 4);
  });

  test(`${path}: @ai-sdk/openai tool round trip`, async () => {
    let called = 0;
    const { text, steps } = await generateText({
      model: openai(model),
      prompt: 'what is the weather in Paris? use get_weather',
      tools: {
        get_weather: tool({
          description: 'the weather of a city',
          inputSchema: z.object({ city: z.string(), days: z.number() }),
          execute: async ({ city }) => { called++; return { city, temp: 21 }; },
        }),
      },
      stopWhen: stepCountIs(3),
    });
    assert.equal(called, 1);
    assert.ok(steps.length >= 2);
    assert.ok(text.length > 0);
  });
}
