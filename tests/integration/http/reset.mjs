// HTTP/2 rapid reset (CVE-2023-44487): a client that opens streams and resets them at once.
// Requests reset in the packet that brought them never reach the engine (no prefill), and
// a connection that resets more than the bound (a burst of 1000, then 33 a second) gets
// GOAWAY with ENHANCE_YOUR_CALM, while other connections are served.
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, run, test, postJson, waitKvFree } from './lib.mjs';

const MODEL = 'llama-tiny';
const PROMPT = Array.from({ length: 32 }, (_, i) => 10 + i);
const srv = await startServer(MODEL);

// The attack's shape on the wire, written by hand so that each stream's HEADERS, DATA and
// RST_STREAM leave in one packet (a client library sends its reset later, when the engine
// may already have the request).
function frame(type, flags, stream, payload) {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream, 5);
  return Buffer.concat([h, payload]);
}
function literal(name, value) { /* HPACK literal without indexing, new name, no Huffman */
  const n = Buffer.from(name), v = Buffer.from(value);
  assert.ok(n.length < 127 && v.length < 127);
  return Buffer.concat([Buffer.from([0x00, n.length]), n, Buffer.from([v.length]), v]);
}
const BODY = Buffer.from(JSON.stringify({ model: MODEL, prompt: PROMPT, max_tokens: 50,
  stream: true }));
const HEADERS = Buffer.concat([literal(':method', 'POST'), literal(':scheme', 'http'),
  literal(':path', '/v1/completions'), literal(':authority', '127.0.0.1'),
  literal('content-type', 'application/json')]);

/** Opens streams and resets each in the same write until GOAWAY or max streams. */
function rapidReset(port, max) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1');
    let id = 1, sent = 0, buf = Buffer.alloc(0), goaway = null;
    const cancel = Buffer.alloc(4);
    cancel.writeUInt32BE(8); /* CANCEL */
    function burst() {
      if (goaway !== null || sent >= max || sock.destroyed) return;
      const out = [];
      for (let k = 0; k < 20 && sent < max; k++, sent++, id += 2) {
        out.push(frame(1, 0x4, id, HEADERS), frame(0, 0x1, id, BODY), frame(3, 0, id, cancel));
      }
      sock.write(Buffer.concat(out), () => setTimeout(burst, 1));
    }
    sock.on('connect', () => {
      sock.write(Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'),
        frame(4, 0, 0, Buffer.alloc(0))]));
      burst();
    });
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 9) {
        const len = buf.readUIntBE(0, 3);
        if (buf.length < 9 + len) break;
        const type = buf[3], payload = buf.subarray(9, 9 + len);
        if (type === 4 && !(buf[4] & 1)) sock.write(frame(4, 1, 0, Buffer.alloc(0)));
        if (type === 7) goaway = payload.readUInt32BE(4);
        buf = buf.subarray(9 + len);
      }
    });
    sock.on('error', () => {});
    sock.on('close', () => resolve({ sent, goaway }));
    setTimeout(() => sock.destroy(), 20000);
  });
}

await run([
  test('open-then-reset streams: no prefill, GOAWAY ENHANCE_YOUR_CALM past the bound', async () => {
    const before = await waitKvFree(srv.base);
    const { sent, goaway } = await rapidReset(srv.port, 3000);
    assert.equal(goaway, 11 /* ENHANCE_YOUR_CALM */, `after ${sent} streams`);
    const m = await waitKvFree(srv.base);
    // the streams the server took before its GOAWAY: more than the burst of 1000 (about
    // 1020 here; the GOAWAY leaves after the read being handled, so a slow server that
    // read many streams at once takes them all, each dropped before the engine)
    const key = 'pagoda_http_requests_total{route="/v1/completions",status="200"}';
    const took = m[key] - (before[key] ?? 0);
    assert.ok(took > 1000, `GOAWAY after ${took} streams (${sent} sent)`);
    assert.equal(m.pagoda_http_rapid_reset_goaways_total, 1);
    const prefilled = m.pagoda_prompt_tokens_total - before.pagoda_prompt_tokens_total;
    // the engine saw at most a few of them (those whose reset came in a later packet)
    assert.ok(prefilled <= 0.05 * sent * PROMPT.length, `prefilled ${prefilled} tokens`);
    // another connection is served
    const r = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: [1], max_tokens: 2 });
    assert.equal(r.status, 200);
  }),
]);
await srv.stop();
