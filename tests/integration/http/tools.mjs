// Tool calling and reasoning against a real server with random-weight models, through the
// official SDKs. Random weights never call a tool on their own, so calls are forced with
// tool_choice (required / named, enforced by the grammar of the parser's wire format) and
// checked against the tools' schemas; round trips send the call and its result back.
// Reasoning uses a template that opens <think> in the prompt, and a thinking budget that
// forces the end tag.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, run, test, postJson, TESTDATA } from './lib.mjs';

const MODEL = 'qwen3-tiny';
const TEMPLATES = `${TESTDATA}/templates/jinja`;

const weather = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 12 },
    days: { type: 'integer', minimum: 1, maximum: 7 },
  },
  required: ['city', 'days'],
  additionalProperties: false,
};
const clock = {
  type: 'object',
  properties: { zone: { enum: ['UTC', 'CET', 'PST'] } },
  required: ['zone'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather forecast', parameters: weather } },
  { type: 'function', function: { name: 'get_time', description: 'The time in a zone', parameters: clock } },
];
const ask = [{ role: 'user', content: 'What is the weather in Paris for 3 days?' }];

function checkArgs(name, args) {
  const v = JSON.parse(args);
  if (name === 'get_weather') {
    assert.deepEqual(Object.keys(v), ['city', 'days']);
    assert.ok(typeof v.city === 'string' && [...v.city].length <= 12, args);
    assert.ok(Number.isInteger(v.days) && v.days >= 1 && v.days <= 7, args);
  } else {
    assert.equal(name, 'get_time');
    assert.ok(['UTC', 'CET', 'PST'].includes(v.zone), args);
  }
  return v;
}

/** A streamed chat: content, reasoning, calls joined from their deltas, finish. */
async function streamChat(openai, req) {
  const out = { content: '', reasoning: '', calls: [], finish: null };
  for await (const chunk of await openai.chat.completions.create({ ...req, stream: true })) {
    for (const c of chunk.choices) {
      out.content += c.delta.content ?? '';
      out.reasoning += c.delta.reasoning_content ?? '';
      for (const tc of c.delta.tool_calls ?? []) {
        if (!out.calls[tc.index]) {
          // the first piece of a call names it
          assert.match(tc.id, /^call_/);
          assert.equal(tc.type, 'function');
          assert.equal(typeof tc.function.name, 'string');
          out.calls[tc.index] = { id: tc.id, name: tc.function.name, arguments: '' };
        } else {
          assert.equal(tc.id, undefined);
        }
        out.calls[tc.index].arguments += tc.function.arguments ?? '';
      }
      if (c.finish_reason) out.finish = c.finish_reason;
    }
  }
  return out;
}

// ---- hermes (detected from the Qwen3 template) ----------------------------------------
let srv = await startServer(MODEL);
let openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
const anthropic = () => new Anthropic({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0 });

await run([
  test('openai: a named tool_choice gives one valid call; streamed the same; round trip', async () => {
    const req = {
      model: MODEL, messages: ask, tools, max_tokens: 200, temperature: 0,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    };
    const r = await openai.chat.completions.create(req);
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.content, null);
    assert.equal(m.tool_calls.length, 1);
    assert.match(m.tool_calls[0].id, /^call_/);
    assert.equal(m.tool_calls[0].function.name, 'get_weather');
    checkArgs('get_weather', m.tool_calls[0].function.arguments);
    const s = await streamChat(openai, req);
    assert.equal(s.finish, 'tool_calls');
    assert.equal(s.content, '', 'no markup in the content');
    assert.equal(s.calls.length, 1);
    assert.equal(s.calls[0].name, 'get_weather');
    assert.equal(s.calls[0].arguments, m.tool_calls[0].function.arguments);
    // the call and its result go back; tool_choice none answers in text
    const back = await openai.chat.completions.create({
      model: MODEL, tools, tool_choice: 'none', max_tokens: 8, temperature: 0,
      messages: [...ask, m, { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '21 C, sunny' }],
    });
    assert.equal(typeof back.choices[0].message.content, 'string');
    assert.equal(back.choices[0].message.tool_calls, undefined);
    assert.ok(['stop', 'length'].includes(back.choices[0].finish_reason));
    const streamed = await streamChat(openai, {
      model: MODEL, tools, tool_choice: 'none', max_tokens: 8, temperature: 0,
      messages: [...ask, m, { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '21 C, sunny' }],
    });
    assert.equal(streamed.content, back.choices[0].message.content);
    // the tool result reached the prompt: it has more tokens than the bare question
    const a = await postJson(srv.base, '/tokenize', { model: MODEL, messages: ask });
    const b = await postJson(srv.base, '/tokenize', {
      model: MODEL, messages: [...ask, m, { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '21 C, sunny' }] });
    assert.ok(b.json.count > a.json.count + 10, `${a.json.count} -> ${b.json.count}`);
  }),
  test('openai: required picks among the tools, sampled, parallel calls off', async () => {
    for (let seed = 0; seed < 4; seed++) {
      const r = await openai.chat.completions.create({
        model: MODEL, messages: ask, tools, tool_choice: 'required', parallel_tool_calls: false,
        max_tokens: 300, temperature: 1, seed,
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
      assert.equal(c.message.tool_calls.length, 1);
      checkArgs(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments);
    }
  }),
  test('openai: required with parallel calls: every call valid, the stream equal', async () => {
    const req = { model: MODEL, messages: ask, tools, tool_choice: 'required', max_tokens: 120, temperature: 0 };
    const r = await openai.chat.completions.create(req);
    const calls = r.choices[0].message.tool_calls;
    assert.ok(calls.length >= 1);
    const s = await streamChat(openai, req);
    assert.equal(s.calls.length, calls.length);
    for (let i = 0; i < calls.length; i++) {
      assert.equal(s.calls[i].name, calls[i].function.name);
      assert.equal(s.calls[i].arguments, calls[i].function.arguments);
      // a call cut short by max_tokens keeps its prefix; complete ones validate
      if (i < calls.length - 1 || r.choices[0].finish_reason === 'tool_calls')
        checkArgs(calls[i].function.name, calls[i].function.arguments);
    }
  }),
  test('openai: chat.completions.parse() fills parsed_arguments of strict tools', async () => {
    const r = await openai.chat.completions.parse({
      model: MODEL, messages: ask, max_tokens: 200, temperature: 0,
      tools: [{ type: 'function', function: { name: 'get_weather', parameters: weather, strict: true } }],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    });
    const call = r.choices[0].message.tool_calls[0];
    assert.deepEqual(call.function.parsed_arguments, checkArgs('get_weather', call.function.arguments));
  }),
  test('openai: runTools calls the function with the parsed arguments and sends its result', async () => {
    const seen = [];
    const runner = openai.chat.completions.runTools({
      model: MODEL, messages: ask, max_tokens: 200, temperature: 0,
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
      tools: [{
        type: 'function',
        function: {
          name: 'get_weather', parameters: weather, parse: JSON.parse,
          function: (args) => { seen.push(args); return { temperature: 21 }; },
        },
      }],
    });
    await runner.done();
    assert.equal(seen.length, 1);
    checkArgs('get_weather', JSON.stringify(seen[0]));
    const tool = runner.messages.find((m) => m.role === 'tool');
    assert.equal(tool.content, '{"temperature":21}');
  }),
  test('openai: tool_choice none with tools, and auto, answer in text', async () => {
    for (const tool_choice of ['none', 'auto', undefined]) {
      const r = await openai.chat.completions.create({
        model: MODEL, messages: ask, tools, tool_choice, max_tokens: 12, temperature: 0 });
      assert.equal(r.choices[0].message.tool_calls, undefined);
      assert.ok(!r.choices[0].message.content.includes('<tool_call>'));
    }
  }),
  test('anthropic: tool_use by a named choice, streamed the same; tool_result round trip', async () => {
    const client = anthropic();
    const req = {
      model: MODEL, max_tokens: 200, temperature: 0, messages: ask,
      tools: [{ name: 'get_weather', description: 'Weather forecast', input_schema: weather },
        { name: 'get_time', input_schema: clock }],
      tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true },
    };
    const r = await client.messages.create(req);
    assert.equal(r.stop_reason, 'tool_use');
    const use = r.content.find((b) => b.type === 'tool_use');
    assert.match(use.id, /^toolu_/);
    assert.equal(use.name, 'get_weather');
    checkArgs('get_weather', JSON.stringify(use.input));
    const stream = client.messages.stream(req);
    const kinds = [];
    let partial = '';
    stream.on('streamEvent', (ev) => {
      kinds.push(ev.type === 'content_block_start' ? `start:${ev.content_block.type}` : ev.type);
      if (ev.type === 'content_block_delta' && ev.delta.type === 'input_json_delta') partial += ev.delta.partial_json;
    });
    const fin = await stream.finalMessage();
    assert.ok(kinds.includes('start:tool_use'), kinds.join());
    assert.equal(fin.stop_reason, 'tool_use');
    const suse = fin.content.find((b) => b.type === 'tool_use');
    assert.deepEqual(suse.input, use.input);
    assert.deepEqual(JSON.parse(partial), use.input);
    const back = await client.messages.create({
      ...req, tool_choice: { type: 'none' }, max_tokens: 8,
      messages: [...ask, { role: 'assistant', content: r.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '21 C' }] }],
    });
    assert.equal(back.content[0].type, 'text');
    assert.ok(['end_turn', 'max_tokens'].includes(back.stop_reason));
  }),
  test('anthropic: any, and count_tokens counts the tools', async () => {
    const client = anthropic();
    const tl = [{ name: 'get_time', input_schema: clock }];
    const r = await client.messages.create({
      model: MODEL, max_tokens: 100, temperature: 0, messages: ask, tools: tl, tool_choice: { type: 'any' } });
    const use = r.content.find((b) => b.type === 'tool_use');
    checkArgs(use.name, JSON.stringify(use.input));
    const a = await client.messages.countTokens({ model: MODEL, messages: ask });
    const b = await client.messages.countTokens({ model: MODEL, messages: ask, tools: tl });
    assert.ok(b.input_tokens > a.input_tokens + 20, `${a.input_tokens} -> ${b.input_tokens}`);
  }),
  test('anthropic: thinking disabled is accepted', async () => {
    const r = await anthropic().messages.create({
      model: MODEL, max_tokens: 4, messages: ask, thinking: { type: 'disabled' } });
    assert.equal(r.content[0].type, 'text');
  }),
  test('errors: bad tools and choices are 400s naming the field', async () => {
    const bad = [
      [{ tools: [{ type: 'function', function: { name: 'has space' } }] }, 'tools[0]'],
      [{ tools: [{ type: 'function', function: { name: 'f', parameters: 3 } }] }, 'tools[0]'],
      [{ tool_choice: 'required' }, 'tool_choice'],
      [{ tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
      [{ tools, tool_choice: 'sometimes' }, 'tool_choice'],
      [{ tools, tool_choice: 'required', response_format: { type: 'json_object' } }, 'tool_choice'],
      [{ messages: [...ask, { role: 'tool', content: 'x' }] }, 'messages[1].tool_call_id'],
      [{ messages: [{ role: 'user', content: 'x', tool_calls: [] }] }, 'messages[0].tool_calls'],
      [{ tools, tool_choice: 'required', parallel_tool_calls: 'no' }, 'parallel_tool_calls'],
    ];
    for (const [extra, param] of bad) {
      const r = await postJson(srv.base, '/v1/chat/completions', { model: MODEL, messages: ask, max_tokens: 2, ...extra });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.error.param, param, r.text);
    }
  }),
]);
await srv.stop();

// ---- the other wire formats: the grammar writes each, the parser reads it back ----------
for (const [parser, extra] of [
  ['qwen3_xml', ['--tool-call-parser', 'qwen3_xml']],
  ['mistral', ['--tool-call-parser', 'mistral']],
  ['gemma4', ['--tool-call-parser', 'gemma4']],
  ['harmony', ['--tool-call-parser', 'harmony']],
  ['llama3_json', ['--chat-template', `${TEMPLATES}/meta-llama-Llama-3.1-8B-Instruct.jinja`]],
]) {
  srv = await startServer(MODEL, extra);
  openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
  await run([
    test(`${parser}: required calls parse back, streamed the same`, async () => {
      for (let seed = 0; seed < 3; seed++) {
        const req = { model: MODEL, messages: ask, tools, tool_choice: 'required', parallel_tool_calls: false,
          max_tokens: 300, temperature: 1, seed };
        const r = await openai.chat.completions.create(req);
        const c = r.choices[0];
        assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
        assert.equal(c.message.tool_calls.length, 1);
        checkArgs(c.message.tool_calls[0].function.name, c.message.tool_calls[0].function.arguments);
        const s = await streamChat(openai, req);
        assert.equal(s.content, '');
        assert.equal(s.calls[0].arguments, c.message.tool_calls[0].function.arguments);
      }
    }),
  ]);
  await srv.stop();
}

// ---- reasoning: the template opens <think>, the parser splits, the budget closes it -----
srv = await startServer(MODEL, ['--chat-template', `${TEMPLATES}/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja`,
  '--reasoning-parser', 'deepseek_r1', '--tool-call-parser', 'hermes']);
openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
await run([
  test('openai: reasoning_content, streamed as delta.reasoning_content', async () => {
    const req = { model: MODEL, messages: ask, max_tokens: 16, temperature: 0, ignore_eos: true };
    const r = await openai.chat.completions.create(req);
    const m = r.choices[0].message;
    assert.ok(m.reasoning_content.length > 0);
    assert.ok(!m.reasoning_content.includes('</think>'));
    const s = await streamChat(openai, req);
    assert.equal(s.reasoning, m.reasoning_content);
    assert.equal(s.content, m.content);
  }),
  test('anthropic: a thinking budget forces </think>: a thinking block, then text', async () => {
    const client = anthropic();
    const req = { model: MODEL, max_tokens: 24, temperature: 0, messages: ask,
      thinking: { type: 'enabled', budget_tokens: 6 } };
    const r = await client.messages.create(req);
    assert.deepEqual(r.content.map((b) => b.type), ['thinking', 'text'], JSON.stringify(r.content));
    assert.ok(r.content[0].thinking.length > 0);
    const fin = await client.messages.stream(req).finalMessage();
    assert.deepEqual(fin.content.map((b) => b.type), ['thinking', 'text']);
    assert.equal(fin.content[0].thinking, r.content[0].thinking);
    assert.equal(fin.content[1].text, r.content[1].text);
  }),
  test('anthropic: think, the budget ends it, then the required call (its grammar waits for </think>)', async () => {
    const client = anthropic();
    const req = { model: MODEL, max_tokens: 200, temperature: 0, messages: ask,
      tools: [{ name: 'get_weather', input_schema: weather }],
      tool_choice: { type: 'any', disable_parallel_tool_use: true },
      thinking: { type: 'enabled', budget_tokens: 6 } };
    const r = await client.messages.create(req);
    assert.deepEqual(r.content.map((b) => b.type), ['thinking', 'tool_use'], JSON.stringify(r.content));
    assert.equal(r.stop_reason, 'tool_use');
    checkArgs('get_weather', JSON.stringify(r.content[1].input));
    const fin = await client.messages.stream(req).finalMessage();
    assert.deepEqual(fin.content, r.content.map((b) => (b.type === 'tool_use' ? { ...b, id: fin.content[1].id } : b)));
  }),
]);
await srv.stop();
