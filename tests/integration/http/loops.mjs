// More event loops than this machine has cores (8), each serving SSE streams at once, over
// HTTP/1.1 connections of their own and over h2c: every stream ends with the greedy text
// of a plain request and [DONE], the server stays up, and /metrics shows that several loops
// accepted connections. A server whose loops shared h2o's thread-local buffer allocator
// (loops set up on the main thread) crashed here within a few hundred streams.
import assert from 'node:assert/strict';
import http from 'node:http';
import http2 from 'node:http2';
import { startServer, run, test, postJson, metrics, waitKvFree } from './lib.mjs';

const MODEL = 'llama-tiny';
const LOOPS = 8;
const ROUNDS = 3;
const STREAMS = 256; /* a round: one connection each */
const H2_CONNS = 16;
const MAX_TOKENS = 40;
const PROMPT = [5, 6, 7, 8];

function parseSse(text) {
  let out = '', done = false, finish = null;
  for (const ev of text.split('\n\n')) {
    if (!ev) continue;
    assert.ok(ev.startsWith('data: '), ev);
    const data = ev.slice(6);
    if (data === '[DONE]') { done = true; continue; }
    const j = JSON.parse(data);
    out += j.choices[0].text;
    if (j.choices[0].finish_reason) finish = j.choices[0].finish_reason;
  }
  return { text: out, done, finish };
}

const body = JSON.stringify({ model: MODEL, prompt: PROMPT, max_tokens: MAX_TOKENS,
  temperature: 0, ignore_eos: true, stream: true });

function h1Stream(base) {
  const url = new URL(`${base}/v1/completions`);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: url.hostname, port: url.port, path: url.pathname,
      method: 'POST', agent: false, headers: { 'content-type': 'application/json',
        connection: 'close' } }, (res) => {
      let buf = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { buf += d; });
      res.on('end', () => resolve({ status: res.statusCode, ...parseSse(buf) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

function h2Stream(session) {
  return new Promise((resolve, reject) => {
    const req = session.request({ ':method': 'POST', ':path': '/v1/completions',
      'content-type': 'application/json' });
    let buf = '', status = 0;
    req.setEncoding('utf8');
    req.on('response', (h) => { status = h[':status']; });
    req.on('data', (d) => { buf += d; });
    req.on('end', () => resolve({ status, ...parseSse(buf) }));
    req.on('error', reject);
    req.end(body);
  });
}

const srv = await startServer(MODEL, ['--http-threads', String(LOOPS), '--max-num-seqs', '256']);
const want = (await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: PROMPT,
  max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true })).json.choices[0].text;

function check(results, what) {
  results.forEach((r, i) => {
    assert.equal(r.status, 200, `${what} ${i}`);
    assert.ok(r.done, `${what} ${i}: no [DONE]`);
    assert.equal(r.finish, 'length', `${what} ${i}`);
    assert.equal(r.text, want, `${what} ${i}: text differs`);
  });
}

await run([
  test(`${ROUNDS} x ${STREAMS} HTTP/1.1 streams over ${LOOPS} loops`, async () => {
    for (let k = 0; k < ROUNDS; k++) {
      const jobs = [];
      for (let i = 0; i < STREAMS; i++) jobs.push(h1Stream(srv.base));
      check(await Promise.all(jobs), `round ${k} stream`);
    }
    const m = await waitKvFree(srv.base);
    const per = [];
    for (let i = 0; i < LOOPS; i++) per.push(m[`pagoda_http_connections_total{loop="${i}"}`]);
    // several loops took connections (the kernel wakes every loop for each one and which
    // accepts is a race: on a loaded machine one loop may win none, so only "more than one"
    // is certain enough to assert)
    assert.ok(per.filter((n) => n >= 1).length >= 2, `connections per loop: ${per}`);
    assert.ok(per.reduce((a, b) => a + b, 0) >= ROUNDS * STREAMS, `connections: ${per}`);
  }),
  test(`${H2_CONNS} h2c connections x 16 streams over ${LOOPS} loops`, async () => {
    const sessions = [];
    for (let i = 0; i < H2_CONNS; i++) sessions.push(http2.connect(srv.base));
    const jobs = [];
    for (let i = 0; i < H2_CONNS * 16; i++) jobs.push(h2Stream(sessions[i % H2_CONNS]));
    check(await Promise.all(jobs), 'h2 stream');
    for (const s of sessions) s.close();
    const m = await waitKvFree(srv.base);
    assert.equal(m['pagoda_http_active_streams'], 0);
  }),
]);
await srv.stop();
