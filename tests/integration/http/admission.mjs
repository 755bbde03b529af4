// Admission and back-pressure: with --max-num-seqs 2 and --max-waiting-requests 4, while two
// long streams hold both slots, a burst of 24 requests gets 4 waiting; the rest are answered at once
// with 429, Retry-After and the route's error shape, and counted in /metrics. With
// --max-streams-per-connection 3, an h2c connection's fourth concurrent stream gets a 429
// while other connections are served.
import assert from 'node:assert/strict';
import http2 from 'node:http2';
import { startServer, run, test, postJson, metrics, waitKvFree } from './lib.mjs';

const MODEL = 'llama-tiny';
const srv = await startServer(MODEL, ['--max-num-seqs', '2', '--max-waiting-requests', '4']);
const long = { model: MODEL, prompt: [1, 2, 3], max_tokens: 400, temperature: 0, ignore_eos: true };

// Fills both running slots with streamed long requests (about a second each on this model)
// and returns once each has sent its first event; `done` resolves when both have ended.
async function holdSlots() {
  const readers = [];
  for (let i = 0; i < 2; i++) {
    const res = await fetch(`${srv.base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...long, max_tokens: 3500, stream: true }),
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    await reader.read();
    readers.push(reader);
  }
  return { done: Promise.all(readers.map(async (r) => { while (!(await r.read()).done); })) };
}

await run([
  test('a burst over --max-waiting-requests gets 429 + Retry-After', async () => {
    const held = await holdSlots();
    const jobs = [];
    for (let i = 0; i < 24; i++) jobs.push(postJson(srv.base, '/v1/completions', long));
    const rs = await Promise.all(jobs);
    await held.done;
    const ok = rs.filter((r) => r.status === 200), busy = rs.filter((r) => r.status === 429);
    assert.equal(ok.length + busy.length, 24, rs.map((r) => r.status).join(','));
    // both slots are held while the burst arrives: exactly 4 wait, the other 20 are refused
    assert.equal(ok.length, 4, `admitted ${ok.length}`);
    for (const r of busy) {
      assert.equal(r.headers.get('retry-after'), '1');
      assert.equal(r.json.error.type, 'requests');
      assert.equal(r.json.error.code, 'rate_limit_exceeded');
      assert.match(r.json.error.message, /--max-waiting-requests 4/);
    }
    const m = await waitKvFree(srv.base);
    assert.equal(m['pagoda_http_requests_rejected_total{reason="max_waiting_requests"}'], busy.length);
    assert.equal(m['pagoda_http_requests_total{route="/v1/completions",status="429"}'], busy.length);
  }),
  test('Anthropic route: rate_limit_error shape', async () => {
    const held = await holdSlots();
    const jobs = [];
    for (let i = 0; i < 12; i++)
      jobs.push(postJson(srv.base, '/v1/messages', { model: MODEL, max_tokens: 300,
        messages: [{ role: 'user', content: 'hi' }] }, { 'anthropic-version': '2023-06-01' }));
    const busy = (await Promise.all(jobs)).filter((r) => r.status === 429);
    await held.done;
    assert.equal(busy.length, 8, `429s: ${busy.length}`);
    for (const r of busy) {
      assert.equal(r.json.type, 'error');
      assert.equal(r.json.error.type, 'rate_limit_error');
      assert.equal(r.headers.get('retry-after'), '1');
    }
    await waitKvFree(srv.base);
  }),
]);
await srv.stop();

function h2Post(session, body) {
  return new Promise((resolve, reject) => {
    const req = session.request({ ':method': 'POST', ':path': '/v1/completions',
      'content-type': 'application/json' });
    let buf = '', status = 0, retry = null;
    req.setEncoding('utf8');
    req.on('response', (h) => { status = h[':status']; retry = h['retry-after'] ?? null; });
    req.on('data', (d) => { buf += d; });
    req.on('end', () => resolve({ status, retry, json: JSON.parse(buf) }));
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

const srv2 = await startServer(MODEL, ['--max-streams-per-connection', '3']);
await run([
  test('--max-streams-per-connection 3: a connection\'s 4th to 8th streams get 429', async () => {
    const a = http2.connect(srv2.base), b = http2.connect(srv2.base);
    const jobs = [];
    for (let i = 0; i < 8; i++) jobs.push(h2Post(a, long));
    const other = await h2Post(b, { ...long, max_tokens: 4 }); // another connection is served
    assert.equal(other.status, 200);
    const rs = await Promise.all(jobs);
    assert.equal(rs.filter((r) => r.status === 200).length, 3, rs.map((r) => r.status).join());
    for (const r of rs.filter((x) => x.status !== 200)) {
      assert.equal(r.status, 429);
      assert.equal(r.retry, '1');
      assert.match(r.json.error.message, /--max-streams-per-connection 3/);
    }
    // finished streams no longer count: the connection takes 3 more
    const again = await Promise.all([0, 1, 2].map(() => h2Post(a, { ...long, max_tokens: 4 })));
    assert.deepEqual(again.map((r) => r.status), [200, 200, 200]);
    a.close();
    b.close();
    const m = await waitKvFree(srv2.base);
    assert.equal(m['pagoda_http_requests_rejected_total{reason="max_streams_per_connection"}'], 5);
  }),
]);
await srv2.stop();
