// Clients that do not read: HTTP/2 streams held at a zero flow-control window. The server
// buffers at most --max-stream-buffer bytes per stream (then aborts the request, counted as
// buffer_full), closes the connection of a stream whose write waited
// --stream-idle-timeout seconds (idle_timeout), frees the requests' KV blocks, and keeps
// serving everyone else.
import assert from 'node:assert/strict';
import http2 from 'node:http2';
import { startServer, run, test, postJson, metrics, waitKvFree } from './lib.mjs';

const MODEL = 'llama-tiny';
const STALLED = 8;
const srv = await startServer(MODEL, ['--max-stream-buffer', '1024', '--stream-idle-timeout', '3']);

function abortsOf(m, reason) {
  return m[`pagoda_http_stream_aborts_total{reason="${reason}"}`];
}

await run([
  test(`${STALLED} zero-window h2 streams: bounded, aborted, timed out`, async () => {
    const before = await waitKvFree(srv.base);
    assert.equal(abortsOf(before, 'buffer_full'), 0);
    const session = http2.connect(srv.base, { settings: { initialWindowSize: 0 } });
    const closed = new Promise((resolve) => session.on('close', resolve));
    session.on('error', () => {});
    const t0 = Date.now();
    for (let i = 0; i < STALLED; i++) {
      const req = session.request({ ':method': 'POST', ':path': '/v1/completions',
        'content-type': 'application/json' });
      req.on('error', () => {});
      req.end(JSON.stringify({ model: MODEL, prompt: [1, 2, 3 + i], max_tokens: 3000,
        temperature: 0, ignore_eos: true, stream: true }));
    }
    // every request is aborted long before its 3000 tokens (1024 bytes are a few events)
    let m;
    for (let k = 0; k < 100; k++) {
      m = await metrics(srv.base);
      if (abortsOf(m, 'buffer_full') === STALLED) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(abortsOf(m, 'buffer_full'), STALLED);
    const gen = m.pagoda_generation_tokens_total - before.pagoda_generation_tokens_total;
    assert.ok(gen < STALLED * 300, `generated ${gen} tokens for streams nobody reads`);
    // the others are still served meanwhile
    const r = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: [9],
      max_tokens: 4 });
    assert.equal(r.status, 200);
    await closed;
    const waited = (Date.now() - t0) / 1000;
    assert.ok(waited >= 2.9 && waited < 12, `connection closed after ${waited} s`);
    m = await waitKvFree(srv.base);
    // the first stream to time out closes the connection, and with it those of the others
    // that had not timed out in the same 100 ms check
    const idle = abortsOf(m, 'idle_timeout');
    assert.ok(idle >= 1 && idle <= STALLED, `idle_timeout ${idle}`);
    assert.equal(m.pagoda_http_active_streams, 0);
    assert.equal(m['pagoda_requests_finished_total{reason="abort"}'] -
      before['pagoda_requests_finished_total{reason="abort"}'], STALLED);
  }),
]);
await srv.stop();
