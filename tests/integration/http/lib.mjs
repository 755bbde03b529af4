// Shared helpers of the HTTP integration tests: start a real `pagoda serve` on a free
// loopback port, wait until /health says ready, stop it with SIGTERM and check it exits 0.
import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';

export const PAGODA = process.argv[2];
export const TESTDATA = process.argv[3];
if (!PAGODA || !TESTDATA) {
  console.error('usage: node <test>.mjs PAGODA_BINARY TESTDATA_DIR');
  process.exit(2);
}

// model: a folder of testdata/models, a path under testdata ("embeddings/NAME"), or an
// absolute path. opts.softNofile: start it with that soft open-files limit.
export async function startServer(model, extra = [], opts = {}) {
  const dir = model.startsWith('/') ? model
    : model.includes('/') ? `${TESTDATA}/${model}` : `${TESTDATA}/models/${model}`;
  // The HTTP tests compare outputs with goldens and across concurrent requests exactly: the
  // server runs the batch-invariant kernels (the default fast many-row kernels have their
  // own tests and stated tolerance: tests/unit/kernels/test_gemm.c, golden/test_models).
  const args = ['serve', '--model', dir, '--port', '0',
    '--threads', '2', '--batch-invariant', ...extra];
  const proc = opts.softNofile
    ? spawn('/bin/sh', ['-c', `ulimit -Sn ${opts.softNofile} && exec "$0" "$@"`, PAGODA, ...args],
      { stdio: ['ignore', 'inherit', 'pipe'] })
    : spawn(PAGODA, args, { stdio: ['ignore', 'inherit', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no listening line:\n${log}`)), 30000);
    proc.stderr.on('data', (d) => {
      log += d;
      process.stderr.write(d);
      const m = /listening on https?:\/\/[^:]+:(\d+)/.exec(log);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => reject(new Error(`server exited (${code}) before listening:\n${log}`)));
  });
  const scheme = extra.includes('--tls-cert') ? 'https' : 'http';
  const base = `${scheme}://127.0.0.1:${port}`;
  if (scheme === 'http') {
    for (let i = 0; ; i++) {
      const r = await fetch(`${base}/health`).catch(() => null);
      if (r && r.status === 200) break;
      if (i > 300) throw new Error('server not ready after 30 s');
      await new Promise((res) => setTimeout(res, 100));
    }
  } else {
    await new Promise((res) => setTimeout(res, 500));
  }
  const exited = new Promise((resolve) => proc.on('exit', (code, sig) => resolve({ code, sig })));
  return {
    base, port, proc,
    log: () => log,
    async stop() {
      proc.kill('SIGTERM');
      const { code, sig } = await exited;
      assert.equal(code, 0, `server exit status ${code} (signal ${sig})`);
    },
  };
}

/** The numbers of a Prometheus exposition: "name{labels}" -> value. */
export async function metrics(base) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

/** Polls until the engine has no live request and no KV block is in use. */
export async function waitKvFree(base, seconds = 20) {
  let m;
  for (let i = 0; i < seconds * 10; i++) {
    m = await metrics(base);
    if (m['pagoda_requests_running'] === 0 && m['pagoda_requests_waiting'] === 0 &&
        m['pagoda_kv_blocks{state="used"}'] === 0) return m;
    await new Promise((res) => setTimeout(res, 100));
  }
  assert.fail(`KV pool not free: ${JSON.stringify(m)}`);
}

export async function postJson(base, path, body, headers = {}) {
  const r = await fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, json, text, headers: r.headers };
}

export function test(name, fn) {
  return { name, fn };
}

export async function run(tests) {
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
  if (failed) {
    console.log(`${failed} of ${tests.length} failed`);
    process.exitCode = 1;
  } else {
    console.log(`all ${tests.length} passed`);
  }
}
