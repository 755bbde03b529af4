// A table of bad requests, each answered with its status and an exactly shaped error body
// naming the field; the server then still serves a good request and no KV block leaks.
import assert from 'node:assert/strict';
import { startServer, run, test, postJson, waitKvFree } from './lib.mjs';

const M = 'llama-tiny';
const msgs = [{ role: 'user', content: 'hi' }];
const chat = (extra) => ({ model: M, messages: msgs, max_tokens: 2, ...extra });
const cmpl = (extra) => ({ model: M, prompt: 'hi', max_tokens: 2, ...extra });
const anth = (extra) => ({ model: M, messages: msgs, max_tokens: 2, ...extra });

// [path, body (object or raw string), status, param (OpenAI) or message pattern (Anthropic)]
const CASES = [
  ['/v1/chat/completions', '{"model": "llama-tiny", "messages": [', 400, null],
  ['/v1/chat/completions', '[1, 2]', 400, null],
  ['/v1/chat/completions', Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d]), 400, null],
  ['/v1/chat/completions', chat({ messages: undefined }), 400, 'messages'],
  ['/v1/chat/completions', chat({ messages: [] }), 400, 'messages'],
  ['/v1/chat/completions', chat({ messages: 'hi' }), 400, 'messages'],
  ['/v1/chat/completions', chat({ messages: [{ role: 'wizard', content: 'x' }] }), 400, 'messages[0].role'],
  ['/v1/chat/completions', chat({ messages: [{ role: 'user', content: 5 }] }), 400, 'messages[0].content'],
  ['/v1/chat/completions', chat({ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: {} }] }] }), 400, 'messages[0].content[0]'],
  ['/v1/chat/completions', chat({ temperature: 'hot' }), 400, 'temperature'],
  ['/v1/chat/completions', chat({ temperature: -1 }), 400, 'temperature'],
  ['/v1/chat/completions', chat({ top_p: 0 }), 400, 'top_p'],
  ['/v1/chat/completions', chat({ top_k: 1.5 }), 400, 'top_k'],
  ['/v1/chat/completions', chat({ min_p: 2 }), 400, 'min_p'],
  ['/v1/chat/completions', chat({ presence_penalty: 3 }), 400, 'presence_penalty'],
  ['/v1/chat/completions', chat({ frequency_penalty: -3 }), 400, 'frequency_penalty'],
  ['/v1/chat/completions', chat({ repetition_penalty: 0 }), 400, 'repetition_penalty'],
  ['/v1/chat/completions', chat({ max_tokens: 0 }), 400, 'max_tokens'],
  ['/v1/chat/completions', chat({ max_tokens: 5000 }), 400, 'max_tokens'],
  ['/v1/chat/completions', chat({ n: 0 }), 400, 'n'],
  ['/v1/chat/completions', chat({ n: 1000 }), 400, 'n'],
  ['/v1/chat/completions', chat({ stop: [1] }), 400, 'stop'],
  ['/v1/chat/completions', chat({ stop: '' }), 400, 'stop'],
  ['/v1/chat/completions', chat({ stream: 'yes' }), 400, 'stream'],
  ['/v1/chat/completions', chat({ stream_options: { include_usage: true } }), 400, 'stream_options'],
  ['/v1/chat/completions', chat({ logprobs: true, top_logprobs: 21 }), 400, 'top_logprobs'],
  ['/v1/chat/completions', chat({ logit_bias: { abc: 1 } }), 400, 'logit_bias'],
  ['/v1/chat/completions', chat({ logit_bias: { 5: 500 } }), 400, 'logit_bias'],
  ['/v1/chat/completions', chat({ seed: 'x' }), 400, 'seed'],
  ['/v1/chat/completions', chat({ tools: [{ type: 'function', function: { name: 'f' } }] }), 400, 'tools'],
  ['/v1/chat/completions', chat({ model: 'nope' }), 404, 'model'],
  ['/v1/messages', anth({ model: undefined }), 400, /model/],
  ['/v1/completions', cmpl({ prompt: [1, 2, 99999] }), 400, 'prompt'],
  ['/v1/completions', cmpl({ prompt: [-1] }), 400, 'prompt'],
  ['/v1/completions', cmpl({ prompt: [[1, 2], [3, 1e9]] }), 400, 'prompt[1]'],
  ['/v1/completions', cmpl({ prompt: [] }), 400, 'prompt'],
  ['/v1/completions', cmpl({ prompt: [{}] }), 400, 'prompt'],
  ['/v1/completions', cmpl({ prompt: new Array(5000).fill(1) }), 400, 'prompt'],
  ['/v1/completions', cmpl({ suffix: 'x' }), 400, 'suffix'],
  ['/v1/completions', cmpl({ echo: 1 }), 400, 'echo'],
  ['/v1/completions', cmpl({ logprobs: 50 }), 400, 'logprobs'],
  ['/v1/completions', cmpl({ best_of: 3 }), 400, 'best_of'],
  ['/tokenize', { prompt: 5 }, 400, 'prompt'],
  ['/detokenize', { tokens: [1, 1e9] }, 400, 'tokens'],
  ['/v1/messages', anth({ max_tokens: undefined }), 400, /max_tokens/],
  ['/v1/messages', anth({ messages: [{ role: 'system', content: 'x' }] }), 400, /messages\.0\.role/],
  ['/v1/messages', anth({ messages: [{ role: 'user', content: [{ type: 'image' }] }] }), 400, /messages\.0\.content\[0\]/],
  ['/v1/messages', anth({ temperature: 1.5 }), 400, /temperature/],
  ['/v1/messages', anth({ stop_sequences: 'x' }), 400, /stop_sequences/],
  ['/v1/messages', anth({ tools: [{ name: 'f' }] }), 400, /tools/],
  ['/v1/messages', '{"model":', 400, /JSON/],
  ['/v1/messages/count_tokens', { model: M }, 400, /messages/],
  ['/v1/nothing', {}, 404, null],
];

const srv = await startServer(M, ['--max-body-size', '65536']);
await run([
  test(`${CASES.length} bad requests`, async () => {
    for (const [path, body, status, param] of CASES) {
      const raw = Buffer.isBuffer(body) || typeof body === 'string' ? body : JSON.stringify(body);
      const r = await fetch(srv.base + path, { method: 'POST', body: raw,
        headers: { 'content-type': 'application/json' } });
      const text = await r.text();
      const where = `${path} ${String(raw).slice(0, 80)} -> ${r.status} ${text}`;
      assert.equal(r.status, status, where);
      const j = JSON.parse(text);
      if (path.startsWith('/v1/messages')) {
        assert.deepEqual(Object.keys(j), ['type', 'error'], where);
        assert.equal(j.type, 'error');
        assert.deepEqual(Object.keys(j.error), ['type', 'message'], where);
        assert.equal(j.error.type, status === 404 ? 'not_found_error' : 'invalid_request_error');
        if (param) assert.match(j.error.message, param, where);
      } else {
        assert.deepEqual(Object.keys(j), ['error'], where);
        assert.deepEqual(Object.keys(j.error), ['message', 'type', 'param', 'code'], where);
        assert.equal(j.error.type, 'invalid_request_error', where);
        assert.equal(j.error.param, param, where);
        assert.equal(typeof j.error.message, 'string');
        if (param && !j.error.code) assert.ok(j.error.message.includes(param.replace(/\[.*/, '')), where);
      }
    }
  }),
  test('wrong method, oversized body', async () => {
    const r = await fetch(`${srv.base}/v1/chat/completions`);
    assert.equal(r.status, 405);
    assert.equal((await r.json()).error.type, 'invalid_request_error');
    const big = await fetch(`${srv.base}/v1/completions`, { method: 'POST',
      body: JSON.stringify(cmpl({ prompt: 'x'.repeat(70000) })) });
    assert.equal(big.status, 413);
  }),
  test('a good request still succeeds and nothing leaked', async () => {
    const r = await postJson(srv.base, '/v1/chat/completions', chat({ max_tokens: 3 }));
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].message.role, 'assistant');
    const m = await waitKvFree(srv.base);
    assert.equal(m['pagoda_http_requests_total{route="/v1/chat/completions",status="400"}'] > 20, true);
  }),
]);
await srv.stop();
