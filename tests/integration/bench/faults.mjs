// pagoda-bench against small OpenAI-style servers that misbehave on purpose (the failures a
// real server shows only by chance): keep-alive connections closed right after a response,
// SSE events written one byte per TCP write, known pauses between chunks, streams cut off
// mid-response, and HTTP/2 streams reset. The client must retry what it safely can, time
// what it sees, and report the rest as failures with a reason.
// usage: node faults.mjs PAGODA_BENCH
import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';
import http from 'node:http';
import http2 from 'node:http2';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const BENCH = process.argv[2];
if (!BENCH) {
  console.error('usage: node faults.mjs PAGODA_BENCH');
  process.exit(2);
}
const tmp = mkdtempSync(join(tmpdir(), 'pagoda-bench-faults-'));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function chunk(text) {
  return `data: ${JSON.stringify({ object: 'text_completion', choices: [{ index: 0, text, finish_reason: null }] })}\n\n`;
}
function usage(n) {
  return `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 4, completion_tokens: n, total_tokens: 4 + n } })}\n\n`;
}

/** Serves /v1/completions by calling respond(req, res, index) for each request. */
async function serve1(respond) {
  let count = 0;
  const sockets = new Set();
  const server = http.createServer(async (req, res) => {
    let body = '';
    for await (const d of req) body += d;
    JSON.parse(body);
    await respond(req, res, count++);
  });
  server.on('connection', (s) => sockets.add(s));
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    base: `http://127.0.0.1:${server.address().port}`,
    sockets,
    close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }),
  };
}

/** Runs pagoda-bench to completion; resolves with its status, stderr and JSON report. */
function bench(name, base, args) {
  const json = join(tmp, `${name}.json`);
  return new Promise((resolve) => {
    const p = spawn(BENCH, ['--base-url', base, '--model', 'm', '--warmup', '0',
      '--no-progress', '--no-metrics', '--json', json, ...args]);
    let err = '';
    p.stderr.on('data', (d) => { err += d; });
    p.stdout.resume();
    p.on('exit', (status) => {
      let report = null;
      try { report = JSON.parse(readFileSync(json, 'utf8')); } catch { /* none */ }
      resolve({ status, err, report });
    });
  });
}

const tests = [];
const test = (name, fn) => tests.push({ name, fn });

test('keep-alive connections closed after each response are retried', async () => {
  const srv = await serve1(async (req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' }); // no Connection: close
    res.on('finish', () => req.socket.destroy());
    res.end(chunk('a') + usage(1) + 'data: [DONE]\n\n');
  });
  // closed loop: the next request goes out as soon as a response ends, before the client
  // can have seen the server close that connection
  const r = await bench('reuse', srv.base, ['--num-prompts', '60', '--concurrency', '3',
    '--output-len', '1']);
  await srv.close();
  assert.equal(r.status, 0, r.err);
  assert.equal(r.report.failed, 0, r.report.requests?.errors.filter((e) => e).join('; '));
  assert.equal(r.report.completed, 60);
  // every connection carried one request; those the client reused were dead and the
  // request went out again on a new one
  assert.ok(srv.sockets.size >= 60, `${srv.sockets.size} connections for 60 requests`);
});

test('events written one byte at a time', async () => {
  const srv = await serve1(async (req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const text = ': keep-alive\r\n\r\n' + chunk('Ro') + chunk('me') + ': ping\n\n' +
      chunk('o') + usage(3) + 'data: [DONE]\n\n';
    for (const ch of text) {
      res.write(ch);
      await new Promise((r) => setImmediate(r));
    }
    res.end();
  });
  const r = await bench('bytes', srv.base, ['--num-prompts', '4', '--concurrency', '2',
    '--output-len', '3']);
  await srv.close();
  assert.equal(r.status, 0, r.err);
  const q = r.report.requests;
  assert.deepEqual(q.chunks, [3, 3, 3, 3]);
  assert.deepEqual(q.output_lens, [3, 3, 3, 3]);
  assert.deepEqual(q.prompt_tokens, [4, 4, 4, 4]);
});

test('the measured latencies follow the server\'s pauses', async () => {
  const srv = await serve1(async (req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    await sleep(80);
    for (let i = 0; i < 5; i++) {
      if (i) await sleep(30);
      res.write(chunk(`t${i}`));
    }
    res.end(usage(5) + 'data: [DONE]\n\n');
  });
  const r = await bench('timing', srv.base, ['--num-prompts', '4', '--concurrency', '4',
    '--output-len', '5']);
  await srv.close();
  assert.equal(r.status, 0, r.err);
  const s = r.report;
  // The server's timers fire late, never early (1 ms of clock granularity allowed), so TTFT
  // and E2E have hard lower bounds. A single gap can look shorter than 30 ms when the chunk
  // before it was delivered late, hence 20 ms for the smallest ITL; TPOT averages 4 gaps.
  // The upper bounds leave room for a busy machine.
  assert.ok(s.min_ttft_ms >= 79 && s.max_ttft_ms < 500, `TTFT ${s.min_ttft_ms}..${s.max_ttft_ms}`);
  assert.ok(s.min_itl_ms >= 20 && s.median_itl_ms >= 29 && s.median_itl_ms < 200,
    `ITL ${s.min_itl_ms}, ${s.median_itl_ms}`);
  assert.ok(s.min_tpot_ms >= 25 && s.max_tpot_ms < 200, `TPOT ${s.min_tpot_ms}..${s.max_tpot_ms}`);
  assert.ok(s.min_e2el_ms >= 79 + 4 * 29, `E2E ${s.min_e2el_ms}`);
});

test('streams cut off mid-response and error answers are failures with a reason', async () => {
  const srv = await serve1(async (req, res, i) => {
    if (i % 3 === 1) {
      res.writeHead(429, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: 'too many requests', type: 'rate_limit' } }));
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(chunk('x'));
    if (i % 3 === 2) {
      await sleep(5);
      req.socket.destroy(); // mid-stream
      return;
    }
    res.end(usage(1) + 'data: [DONE]\n\n');
  });
  const r = await bench('cut', srv.base, ['--num-prompts', '9', '--concurrency', '1',
    '--output-len', '1']);
  await srv.close();
  assert.equal(r.status, 3, 'exit status 3 when requests failed');
  assert.equal(r.report.completed, 3);
  assert.equal(r.report.failed, 6);
  const errs = r.report.requests.errors;
  assert.equal(errs.filter((e) => e === 'HTTP 429: too many requests').length, 3, errs.join('; '));
  assert.equal(errs.filter((e) => /closed before the response ended/.test(e)).length, 3,
    errs.join('; '));
});

test('HTTP/2: many streams on one connection; a reset stream and a cut-short one fail', async () => {
  let sessions = 0, streams = 0;
  const server = http2.createServer();
  server.on('session', () => sessions++);
  server.on('stream', async (stream, headers) => {
    const i = streams++;
    let body = '';
    for await (const d of stream) body += d;
    assert.equal(headers[':path'], '/v1/completions');
    JSON.parse(body);
    stream.respond({ ':status': 200, 'content-type': 'text/event-stream' });
    stream.write(chunk('h'));
    await sleep(20);
    if (i === 5) {
      stream.on('error', () => {}); // the reset below is the point of the test
      stream.destroy(new Error('reset by the test server')); // RST_STREAM, INTERNAL_ERROR
      return;
    }
    if (i === 7) {
      stream.end(chunk('2')); // a clean end of stream, but no usage and no [DONE]
      return;
    }
    stream.end(chunk('2') + usage(2) + 'data: [DONE]\n\n');
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const base = `http://127.0.0.1:${server.address().port}`;
  const r = await bench('h2', base, ['--http2', '--num-prompts', '30', '--concurrency', '10',
    '--output-len', '2']);
  await new Promise((r2) => server.close(r2));
  assert.equal(r.status, 3, `${r.err} ${JSON.stringify(r.report?.requests)}`);
  assert.equal(sessions, 1, 'one connection');
  assert.equal(r.report.completed, 28);
  assert.equal(r.report.failed, 2);
  const errs = r.report.requests.errors.filter((e) => e).sort();
  assert.match(errs[0], /HTTP\/2 stream closed: INTERNAL_ERROR/);
  assert.equal(errs[1], 'the stream ended without data: [DONE]');
  assert.equal(r.report.total_output_tokens, 56);
});

let failed = 0;
for (const t of tests) {
  const t0 = Date.now();
  try {
    await t.fn();
    console.log(`ok   ${t.name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${t.name}: ${e.stack || e}`);
  }
}
rmSync(tmp, { recursive: true, force: true });
console.log(failed ? `${failed} of ${tests.length} failed` : `all ${tests.length} passed`);
process.exitCode = failed ? 1 : 0;
