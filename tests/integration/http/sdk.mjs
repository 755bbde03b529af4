// The official OpenAI and Anthropic clients against a real server: chat, completions,
// messages (plain and streaming), stop strings, logprobs, models, token counting, errors
// and the API key.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, run, test, postJson, waitKvFree } from './lib.mjs';

const MODEL = 'llama-tiny';
const srv = await startServer(MODEL);
const openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0 });
const hello = [{ role: 'user', content: 'Hello there' }];

async function chatText(stream, extra = {}) {
  const req = { model: MODEL, messages: hello, max_tokens: 10, temperature: 0, ...extra };
  if (!stream) return (await openai.chat.completions.create(req)).choices[0];
  let text = '', finish = null, usage = null, first = true, last;
  for await (const chunk of await openai.chat.completions.create({
    ...req, stream: true, stream_options: { include_usage: true } })) {
    last = chunk;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (first) { assert.equal(c.delta.role, 'assistant'); first = false; }
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.deepEqual(last.choices, [], 'the usage chunk comes last, with no choices');
  return { message: { content: text }, finish_reason: finish, usage };
}

await run([
  test('openai: models.list', async () => {
    const list = await openai.models.list();
    assert.deepEqual(list.data.map((m) => m.id), [MODEL]);
    assert.equal(list.data[0].object, 'model');
  }),
  test('openai: chat non-streaming, and streaming gives the same greedy text', async () => {
    const a = await openai.chat.completions.create({
      model: MODEL, messages: [{ role: 'system', content: 'Be brief.' }, ...hello],
      max_tokens: 8, temperature: 0, ignore_eos: true });
    assert.match(a.id, /^chatcmpl-/);
    assert.equal(a.object, 'chat.completion');
    assert.equal(a.model, MODEL);
    assert.equal(a.choices[0].message.role, 'assistant');
    assert.equal(a.choices[0].finish_reason, 'length');
    assert.equal(a.usage.completion_tokens, 8);
    const tok = await postJson(srv.base, '/tokenize', {
      messages: [{ role: 'system', content: 'Be brief.' }, ...hello] });
    assert.equal(a.usage.prompt_tokens, tok.json.count);
    assert.equal(a.usage.total_tokens, tok.json.count + 8);
    assert.equal(typeof a.usage.prompt_tokens_details.cached_tokens, 'number');
    const plain = await chatText(false, { ignore_eos: true });
    const streamed = await chatText(true, { ignore_eos: true });
    assert.equal(streamed.message.content, plain.message.content);
    assert.equal(streamed.finish_reason, 'length');
    assert.equal(streamed.usage.completion_tokens, 10);
  }),
  test('openai: content parts and the developer role', async () => {
    const a = await openai.chat.completions.create({
      model: MODEL, max_completion_tokens: 4, temperature: 0, messages: [
        { role: 'developer', content: 'Be brief.' },
        { role: 'user', content: [{ type: 'text', text: 'Hello' }, { type: 'text', text: 'there' }] }] });
    const tok = await postJson(srv.base, '/tokenize', { messages: [
      { role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hello\nthere' }] });
    assert.equal(a.usage.prompt_tokens, tok.json.count);
    assert.ok(a.usage.completion_tokens <= 4);
  }),
  test('openai: stop string cuts the text and reports stop (plain and streaming)', async () => {
    const full = (await chatText(false, { max_tokens: 16, ignore_eos: true })).message.content;
    const m = /[A-Za-z ]{3}/.exec(full.slice(2));
    assert.ok(m, `no ASCII window in ${JSON.stringify(full)}`);
    const stop = m[0];
    const want = full.slice(0, full.indexOf(stop));
    for (const stream of [false, true]) {
      const r = await chatText(stream, { max_tokens: 16, ignore_eos: true, stop: [stop, 'zzzz'] });
      assert.equal(r.message.content, want, `stream=${stream}`);
      assert.equal(r.finish_reason, 'stop');
    }
  }),
  test('openai: logprobs with top_logprobs (greedy picks the top token)', async () => {
    const a = await openai.chat.completions.create({
      model: MODEL, messages: hello, max_tokens: 4, temperature: 0, ignore_eos: true,
      logprobs: true, top_logprobs: 3 });
    const lp = a.choices[0].logprobs.content;
    assert.equal(lp.length, 4);
    for (const e of lp) {
      assert.equal(e.top_logprobs.length, 3);
      assert.equal(e.top_logprobs[0].logprob, e.logprob);
      assert.ok(e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob);
      assert.ok(Array.isArray(e.bytes));
    }
  }),
  test('openai: completions with n, seed, echo and logprobs', async () => {
    const r = await openai.completions.create({
      model: MODEL, prompt: 'Once upon', max_tokens: 5, n: 2, seed: 7, temperature: 1 });
    assert.equal(r.object, 'text_completion');
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
    const again = await openai.completions.create({
      model: MODEL, prompt: 'Once upon', max_tokens: 5, n: 2, seed: 7, temperature: 1 });
    assert.deepEqual(again.choices.map((c) => c.text), r.choices.map((c) => c.text));
    const e = await openai.completions.create({
      model: MODEL, prompt: 'Once upon', max_tokens: 3, echo: true, logprobs: 2,
      temperature: 0, ignore_eos: true });
    const c = e.choices[0];
    assert.ok(c.text.startsWith('Once upon'));
    const tok = await postJson(srv.base, '/tokenize', { prompt: 'Once upon' });
    assert.equal(c.logprobs.tokens.length, tok.json.count + 3);
    assert.equal(c.logprobs.token_logprobs[0], null);
    assert.equal(typeof c.logprobs.token_logprobs[1], 'number');
    assert.equal(c.logprobs.text_offset[0], 0);
  }),
  test('openai: completions streaming with a list of prompts', async () => {
    const texts = ['', ''];
    const done = [null, null];
    for await (const chunk of await openai.completions.create({
      model: MODEL, prompt: ['Hello', 'World'], max_tokens: 4, temperature: 0, ignore_eos: true,
      stream: true })) {
      for (const c of chunk.choices) {
        texts[c.index] += c.text;
        if (c.finish_reason) done[c.index] = c.finish_reason;
      }
    }
    assert.deepEqual(done, ['length', 'length']);
    const one = await openai.completions.create({
      model: MODEL, prompt: 'World', max_tokens: 4, temperature: 0, ignore_eos: true });
    assert.equal(texts[1], one.choices[0].text);
  }),
  test('openai: errors surface as the SDK error classes', async () => {
    await assert.rejects(openai.chat.completions.create({
      model: MODEL, messages: hello, temperature: 5 }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError);
      assert.equal(e.status, 400);
      assert.equal(e.param, 'temperature');
      assert.equal(e.type, 'invalid_request_error');
      return true;
    });
    await assert.rejects(openai.chat.completions.create({ model: 'gpt-nope', messages: hello }),
      (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
    await assert.rejects(openai.completions.create({ model: MODEL, prompt: 'x', suffix: 'y' }),
      (e) => e instanceof OpenAI.BadRequestError && e.param === 'suffix');
    await assert.rejects(openai.completions.create({
      model: MODEL, prompt: 'x', max_tokens: 100000 }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded');
  }),
  test('anthropic: messages plain and streaming with the full event sequence', async () => {
    const req = { model: MODEL, max_tokens: 8, temperature: 0, system: 'Be brief.',
      messages: [{ role: 'user', content: [{ type: 'text', text: 'Hello there' }] }] };
    const m = await anthropic.messages.create(req);
    assert.match(m.id, /^msg_/);
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.equal(m.content[0].type, 'text');
    assert.ok(['max_tokens', 'end_turn'].includes(m.stop_reason));
    if (m.stop_reason === 'max_tokens') assert.equal(m.usage.output_tokens, 8);
    assert.equal(typeof m.usage.cache_read_input_tokens, 'number');
    const events = [];
    const stream = anthropic.messages.stream(req);
    for await (const ev of stream) events.push(ev.type);
    const fin = await stream.finalMessage();
    assert.equal(fin.content[0].text, m.content[0].text);
    assert.equal(fin.stop_reason, m.stop_reason);
    const seq = events.filter((t) => t !== 'ping' && t !== 'content_block_delta');
    assert.deepEqual(seq, ['message_start', 'content_block_start', 'content_block_stop',
      'message_delta', 'message_stop']);
    assert.ok(events.includes('content_block_delta'));
    const count = await anthropic.messages.countTokens({
      model: MODEL, system: req.system, messages: req.messages });
    assert.equal(count.input_tokens, m.usage.input_tokens + m.usage.cache_read_input_tokens);
  }),
  test('anthropic: stop_sequences report stop_sequence', async () => {
    const base = { model: MODEL, max_tokens: 16, temperature: 0,
      messages: [{ role: 'user', content: 'Tell me a story' }] };
    const full = (await anthropic.messages.create(base)).content[0].text;
    const m = /[A-Za-z ]{3}/.exec(full.slice(2));
    assert.ok(m, `no ASCII window in ${JSON.stringify(full)}`);
    const r = await anthropic.messages.create({ ...base, stop_sequences: [m[0]] });
    assert.equal(r.stop_reason, 'stop_sequence');
    assert.equal(r.stop_sequence, m[0]);
    assert.equal(r.content[0].text, full.slice(0, full.indexOf(m[0])));
  }),
  test('anthropic: errors surface as the SDK error classes', async () => {
    await assert.rejects(anthropic.messages.create({ model: MODEL, messages: hello }), (e) => {
      assert.ok(e instanceof Anthropic.BadRequestError);
      assert.equal(e.status, 400);
      assert.equal(e.error.type, 'error');
      assert.equal(e.error.error.type, 'invalid_request_error');
      assert.match(e.error.error.message, /max_tokens/);
      return true;
    });
    await assert.rejects(anthropic.messages.create({
      model: MODEL, max_tokens: 4, messages: [{ role: 'system', content: 'x' }] }),
    (e) => e.status === 400 && /messages\.0\.role/.test(e.error.error.message));
  }),
  test('every KV block is free again', async () => { await waitKvFree(srv.base); }),
]);
await srv.stop();

// The API key: Bearer (OpenAI) and x-api-key (Anthropic) pass, anything else is a 401.
const keyed = await startServer(MODEL, ['--api-key', 'sekrit']);
await run([
  test('api key: accepted and refused', async () => {
    const ok = new OpenAI({ baseURL: `${keyed.base}/v1`, apiKey: 'sekrit', maxRetries: 0 });
    assert.equal((await ok.models.list()).data[0].id, MODEL);
    const bad = new OpenAI({ baseURL: `${keyed.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
    const a = new Anthropic({ baseURL: keyed.base, apiKey: 'sekrit', maxRetries: 0 });
    const m = await a.messages.create({ model: MODEL, max_tokens: 2, messages: hello });
    assert.equal(m.type, 'message');
    const an = new Anthropic({ baseURL: keyed.base, apiKey: 'nope', maxRetries: 0 });
    await assert.rejects(an.messages.create({ model: MODEL, max_tokens: 2, messages: hello }),
      (e) => e instanceof Anthropic.AuthenticationError &&
        e.error.error.type === 'authentication_error');
    assert.equal((await fetch(`${keyed.base}/health`)).status, 200);
  }),
]);
await keyed.stop();
