// Errors h2o answers before any handler runs used to be plain text ("request entity is too
// large", "broken chunked-encoding"), and an HTTP/2 body over --max-body-size got a
// REFUSED_STREAM that curl answered by uploading the body again, five times. Now: a JSON 413
// on every protocol for a body up to twice the limit, and h2o's own HTTP/1.1 answers
// (a body past that, broken chunked encoding, a bad Content-Length, an unknown
// Transfer-Encoding or Expect) in the OpenAI shape, or the Anthropic one on its routes,
// counted in /metrics. What h2o answers with no hook is checked to be as docs/SERVER.md says.
import assert from 'node:assert/strict';
import net from 'node:net';
import http2 from 'node:http2';
import { startServer, run, test, postJson, metrics } from './lib.mjs';

const MAX = 4096;
const srv = await startServer('llama-tiny', ['--max-body-size', String(MAX)]);
const port = srv.port;

// Sends raw bytes on a fresh connection and returns everything read until the server closes
// it: { status, headers (lower-case names), body }.
function raw(bytes) {
  return new Promise((resolve, reject) => {
    const sock = net.connect(port, '127.0.0.1', () => sock.write(bytes));
    let data = '';
    sock.setEncoding('latin1');
    sock.on('data', (d) => { data += d; });
    sock.on('error', reject);
    sock.on('close', () => {
      const [head, ...rest] = data.split('\r\n\r\n');
      const lines = head.split('\r\n');
      const headers = {};
      for (const l of lines.slice(1)) {
        const i = l.indexOf(':');
        headers[l.slice(0, i).toLowerCase()] = l.slice(i + 1).trim();
      }
      resolve({ status: Number(lines[0].split(' ')[1]), headers, body: rest.join('\r\n\r\n') });
    });
  });
}

function expectJson(r, status, shape, message) {
  assert.equal(r.status, status, JSON.stringify(r));
  assert.equal(r.headers['content-type'], 'application/json');
  assert.equal(Number(r.headers['content-length']), Buffer.byteLength(r.body, 'latin1'));
  const j = JSON.parse(r.body);
  if (shape === 'anthropic') {
    assert.equal(j.type, 'error');
    assert.match(j.error.message, message);
    return j;
  }
  assert.match(j.error.message, message);
  assert.equal(j.error.type, status >= 500 ? 'server_error' : 'invalid_request_error');
  return j;
}

const big = (n) => JSON.stringify({ model: 'llama-tiny', prompt: 'a'.repeat(n) });

await run([
  test('a body over --max-body-size is a JSON 413 over HTTP/1.1', async () => {
    const r = await postJson(srv.base, '/v1/completions', big(MAX + 100));
    assert.equal(r.status, 413);
    assert.match(r.json.error.message,
      /the request body \(\d+ bytes\) is larger than --max-body-size \(4096 bytes\)/);
    const a = await postJson(srv.base, '/v1/messages', big(MAX + 100));
    assert.equal(a.status, 413);
    assert.equal(a.json.error.type, 'request_too_large');
  }),
  test('a body over --max-body-size over HTTP/2 is a JSON 413, not a REFUSED_STREAM', async () => {
    const session = http2.connect(srv.base);
    try {
      const { status, body } = await new Promise((resolve, reject) => {
        const s = session.request({ ':method': 'POST', ':path': '/v1/completions',
          'content-type': 'application/json' });
        let status = 0, body = '';
        s.on('response', (h) => { status = h[':status']; });
        s.setEncoding('utf8');
        s.on('data', (d) => { body += d; });
        s.on('end', () => resolve({ status, body }));
        s.on('error', reject);
        s.end(big(MAX + 100));
      });
      assert.equal(status, 413);
      assert.match(JSON.parse(body).error.message, /larger than --max-body-size \(4096 bytes\)/);
    } finally { session.close(); }
  }),
  test("h2o's own 413 (Content-Length past twice the limit) is JSON, sent before the body", async () => {
    const r = await raw('POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n' +
      `Content-Length: ${4 * MAX}\r\n\r\n`);
    expectJson(r, 413, 'anthropic', /^the request body is larger than --max-body-size \(4096 bytes\)$/);
    assert.equal(JSON.parse(r.body).error.type, 'request_too_large');
    const o = await raw(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${4 * MAX}\r\n\r\n`);
    expectJson(o, 413, 'openai', /larger than --max-body-size/);
  }),
  test('broken chunked encoding is a JSON 400', async () => {
    const body = 'ZZ\r\nabc\r\n0\r\n\r\n';
    expectJson(await raw('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n' +
      `Transfer-Encoding: chunked\r\n\r\n${body}`), 400, 'openai', /chunked transfer encoding is malformed/);
    expectJson(await raw('POST /v1/messages HTTP/1.1\r\nHost: x\r\n' +
      `Transfer-Encoding: chunked\r\n\r\n${body}`), 400, 'anthropic', /chunked transfer encoding/);
  }),
  test('a bad Content-Length, Transfer-Encoding or Expect is a JSON error', async () => {
    expectJson(await raw('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n'),
      400, 'openai', /the Content-Length header is not a valid length/);
    expectJson(await raw('POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n'),
      400, 'openai', /Transfer-Encoding is not supported \(only chunked is\)/);
    expectJson(await raw('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n' +
      'Expect: something\r\n\r\n{}'), 417, 'openai', /only 100-continue/);
  }),
  test('the transport errors are counted by route and status', async () => {
    const m = await metrics(srv.base);
    assert.equal(m['pagoda_http_requests_total{route="/v1/messages",status="413"}'], 2);
    assert.equal(m['pagoda_http_requests_total{route="/v1/completions",status="413"}'], 3);
    assert.equal(m['pagoda_http_requests_total{route="/v1/chat/completions",status="400"}'], 1);
  }),
  test('no hook in h2o 2.2: over 100 request headers is its fixed plain-text 400', async () => {
    let head = 'GET /v1/models HTTP/1.1\r\nHost: x\r\n';
    for (let i = 0; i < 101; i++) head += `X-H${i}: v\r\n`;
    const r = await raw(`${head}\r\n`);
    assert.equal(r.status, 400);
    assert.equal(r.body, 'Bad Request');
    // and the server is fine afterwards
    assert.equal((await fetch(`${srv.base}/v1/models`)).status, 200);
  }),
]);
await srv.stop();
