// 200 concurrent SSE clients over HTTP/1.1, a third of which hang up after their first
// event: every other stream must end with the same greedy text as a plain request, the
// abandoned requests must be aborted in the engine, and the KV pool must return to free.
import assert from 'node:assert/strict';
import http from 'node:http';
import { startServer, run, test, postJson, waitKvFree } from './lib.mjs';

const MODEL = 'llama-tiny';
const CLIENTS = 200;
const MAX_TOKENS = 48;
const PROMPTS = [[1, 2, 3, 4, 5], [100, 200, 300], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7],
  [42]];

function stream(base, prompt, hangUp) {
  const url = new URL(`${base}/v1/completions`);
  const body = JSON.stringify({ model: MODEL, prompt, max_tokens: MAX_TOKENS, temperature: 0,
    ignore_eos: true, stream: true });
  return new Promise((resolve, reject) => {
    const req = http.request({ host: url.hostname, port: url.port, path: url.pathname,
      method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
      assert.equal(res.statusCode, 200);
      assert.match(res.headers['content-type'], /^text\/event-stream/);
      let buf = '', text = '', finish = null, done = false, events = 0;
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buf += d;
        let k;
        while ((k = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, k);
          buf = buf.slice(k + 2);
          assert.ok(ev.startsWith('data: '), ev);
          const data = ev.slice(6);
          assert.ok(!done, 'data after [DONE]');
          if (data === '[DONE]') { done = true; continue; }
          const j = JSON.parse(data);
          events++;
          text += j.choices[0].text;
          if (j.choices[0].finish_reason) finish = j.choices[0].finish_reason;
          if (hangUp && events === 1) {
            req.destroy();
            resolve({ hungUp: true });
            return;
          }
        }
      });
      res.on('end', () => resolve({ text, finish, done }));
      res.on('error', (e) => (hangUp ? resolve({ hungUp: true }) : reject(e)));
    });
    req.on('error', (e) => (hangUp ? resolve({ hungUp: true }) : reject(e)));
    req.end(body);
  });
}

const srv = await startServer(MODEL, ['--max-num-seqs', '256']);
await run([
  test(`${CLIENTS} concurrent SSE clients, a third hang up`, async () => {
    const want = [];
    for (const p of PROMPTS) {
      const r = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: p,
        max_tokens: MAX_TOKENS, temperature: 0, ignore_eos: true });
      want.push(r.json.choices[0].text);
    }
    const before = await waitKvFree(srv.base);
    const jobs = [];
    for (let i = 0; i < CLIENTS; i++) jobs.push(stream(srv.base, PROMPTS[i % PROMPTS.length], i % 3 === 0));
    const results = await Promise.all(jobs);
    let completed = 0, hung = 0;
    results.forEach((r, i) => {
      if (i % 3 === 0) { assert.ok(r.hungUp); hung++; return; }
      assert.ok(r.done, `client ${i}: no [DONE]`);
      assert.equal(r.finish, 'length', `client ${i}`);
      assert.equal(r.text, want[i % PROMPTS.length], `client ${i}: text differs`);
      completed++;
    });
    assert.equal(completed + hung, CLIENTS);
    const after = await waitKvFree(srv.base);
    const aborted = after['pagoda_requests_finished_total{reason="abort"}'] -
      before['pagoda_requests_finished_total{reason="abort"}'];
    const lengths = after['pagoda_requests_finished_total{reason="length"}'] -
      before['pagoda_requests_finished_total{reason="length"}'];
    assert.equal(aborted + lengths, CLIENTS);
    assert.ok(lengths >= completed);
    // A hang-up is seen at the stream's next write. Under load one write can carry many
    // tokens, so a stream may end before its client's hang-up is seen; most cannot.
    assert.ok(aborted >= hung * 0.75 && aborted <= hung, `aborted ${aborted} of ${hung}`);
    assert.equal(after['pagoda_http_active_streams'], 0);
    assert.equal(after['pagoda_kv_blocks{state="free"}'], after['pagoda_kv_blocks{state="total"}']);
  }),
]);
await srv.stop();
