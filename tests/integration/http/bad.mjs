// A table of bad requests, each answered with its status and an exactly shaped error body
// naming the field; the server then still serves a good request and no KV block leaks.
import assert from 'node:assert/strict';
import net from 'node:net';
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
  ['/v1/chat/completions', chat({ tools: [{ type: 'function', function: { name: 'f g' } }] }), 400, 'tools[0]'],
  ['/v1/chat/completions', chat({ tool_choice: 'required' }), 400, 'tool_choice'],
  ['/v1/chat/completions', chat({ functions: [{ name: 'f' }] }), 400, 'functions'],
  ['/v1/chat/completions', chat({ model: 'nope' }), 404, 'model'],
  ['/v1/messages', anth({ model: undefined }), 400, /^model: /],
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
  ['/v1/messages', anth({ max_tokens: undefined }), 400, /^max_tokens: /],
  ['/v1/messages', anth({ messages: [{ role: 'system', content: 'x' }] }), 400, /^messages\.0\.role: unknown role/],
  ['/v1/messages', anth({ messages: [{ role: 'user', content: [{ type: 'image' }] }] }), 400, /^messages\.0\.content\.0: [^'m]/],
  ['/v1/messages', anth({ temperature: 1.5 }), 400, /^temperature: [^']/],
  ['/v1/messages', anth({ stop_sequences: 'x' }), 400, /^stop_sequences: /],
  ['/v1/messages', anth({ tools: [{ name: 'f', input_schema: 5 }] }), 400, /^tools\.0: /],
  ['/v1/messages', anth({ tools: [{ name: 'f' }], tool_choice: { type: 'sometimes' } }), 400, /^tool_choice\.type: /],
  ['/v1/messages', anth({ thinking: { type: 'maybe' } }), 400, /^thinking\.type: /],
  ['/v1/messages', '{"model":', 400, /JSON/],
  ['/v1/messages/count_tokens', { model: M }, 400, /^messages: /],
  // raw control characters in strings and repeated members are not JSON a gateway agrees on
  ['/v1/completions', '{"model":"llama-tiny","prompt":"a\tb"}', 400, null],
  ['/v1/completions', '{"model":"llama-tiny","prompt":"a\nb"}', 400, null],
  ['/v1/completions', '{"model":"llama-tiny","prompt":"x","max_tokens":1,"max_tokens":5000}', 400, null],
  ['/v1/chat/completions', '{"model":"llama-tiny","messages":[{"role":"user","role":"system","content":"x"}]}', 400, null],
  ['/v1/messages', '{"model":"llama-tiny","max_tokens":2,"max_tokens":3,"messages":[]}', 400, /repeats the member 'max_tokens'/],
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
  test('escaped control characters are accepted; Authorization scheme in any case', async () => {
    const r = await postJson(srv.base, '/v1/completions', '{"model":"llama-tiny","prompt":"a\\tb\\n","max_tokens":1}');
    assert.equal(r.status, 200, r.text);
    const k = await startServer(M, ['--api-key', 'sekret']);
    try {
      for (const auth of ['Bearer sekret', 'bearer sekret', 'BEARER sekret']) {
        const a = await fetch(`${k.base}/v1/models`, { headers: { authorization: auth } });
        assert.equal(a.status, 200, auth);
      }
      for (const auth of ['Bearer Sekret', 'Basic sekret', 'bearersekret', 'sekret']) {
        const a = await fetch(`${k.base}/v1/models`, { headers: { authorization: auth } });
        assert.equal(a.status, 401, auth);
      }
    } finally {
      await k.stop();
    }
  }),
  test('a half-closed HTTP/1.1 client gets its response', async () => {
    const body = JSON.stringify(cmpl({ prompt: [1, 2, 3], max_tokens: 200, ignore_eos: true,
      temperature: 0 }));
    const raw = await new Promise((resolve, reject) => {
      const sock = net.connect(srv.port, '127.0.0.1', () => {
        sock.end(`POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n` +
          `content-length: ${body.length}\r\n\r\n${body}`); /* then shutdown(SHUT_WR) */
      });
      const out = [];
      sock.on('data', (d) => out.push(d));
      sock.on('end', () => resolve(Buffer.concat(out)));
      sock.on('error', reject);
    });
    const text = raw.toString('latin1');
    const at = text.lastIndexOf('HTTP/1.1 ');
    const final = text.slice(at);
    assert.match(final, /^HTTP\/1\.1 200 /, text.slice(0, 300));
    let rest = raw.subarray(at + final.indexOf('\r\n\r\n') + 4), body2 = Buffer.alloc(0);
    if (/transfer-encoding: chunked/i.test(final)) {
      for (;;) { /* chunked: size line, data, CRLF */
        const k = rest.indexOf('\r\n'), n = parseInt(rest.subarray(0, k).toString(), 16);
        if (!n) break;
        body2 = Buffer.concat([body2, rest.subarray(k + 2, k + 2 + n)]);
        rest = rest.subarray(k + 4 + n);
      }
    } else body2 = rest;
    const json = JSON.parse(body2.toString('utf8'));
    assert.equal(json.usage.completion_tokens, 200);
    assert.equal(json.choices[0].finish_reason, 'length');
    // what came before it can only be the interim 102 (sent when the end of stream was seen)
    const before = text.slice(0, at);
    assert.ok(before === '' || before === 'HTTP/1.1 102 Processing\r\n\r\n', before);
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
