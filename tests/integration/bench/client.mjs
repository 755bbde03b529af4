// pagoda-bench against a real `pagoda serve` on a free loopback port: closed and open loop,
// HTTP/1.1 and h2c, completions and chat. Every run must be complete and self-consistent:
// no failed request, token counts equal to the server's usage fields and its /metrics
// counters, ordered percentiles, and a KV pool that is all free afterwards.
// usage: node client.mjs PAGODA TESTDATA PAGODA_BENCH
import { spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServer, metrics, waitKvFree, run, test, TESTDATA } from '../http/lib.mjs';

const BENCH = process.argv[4];
if (!BENCH) {
  console.error('usage: node client.mjs PAGODA TESTDATA PAGODA_BENCH');
  process.exit(2);
}
const tmp = mkdtempSync(join(tmpdir(), 'pagoda-bench-'));
const srv = await startServer('llama-tiny', ['--http-threads', '2']);

/** Runs pagoda-bench with --json; returns its exit status, output and the parsed report. */
function bench(name, args, base = srv.base) {
  const json = join(tmp, `${name}.json`);
  const r = spawnSync(BENCH, ['--base-url', base, '--no-progress', '--json', json, ...args],
    { encoding: 'utf8', timeout: 120000 });
  const report = existsSync(json) ? JSON.parse(readFileSync(json, 'utf8')) : null;
  return { status: r.status, out: r.stdout, err: r.stderr, report };
}

function sum(a) {
  return a.reduce((x, y) => x + y, 0);
}

/** The checks every successful run passes. */
function consistent(r, n, { exactInput = true, maxTokensExact = true } = {}) {
  assert.equal(r.status, 0, `exit ${r.status}: ${r.err}`);
  const s = r.report;
  assert.equal(s.completed, n, r.err);
  assert.equal(s.failed, 0);
  const q = s.requests;
  assert.equal(q.ok.length, n);
  assert.ok(q.ok.every((x) => x), `failed: ${q.errors.filter((e) => e)}`);
  for (let i = 0; i < n; i++) {
    // the client's counts against the server's usage fields
    assert.ok(q.prompt_tokens[i] > 0, `request ${i}: no usage.prompt_tokens`);
    if (exactInput) assert.equal(q.prompt_tokens[i], q.input_lens[i], `request ${i} prompt`);
    else assert.ok(q.prompt_tokens[i] >= q.input_lens[i], `request ${i}: template adds tokens`);
    if (maxTokensExact) {
      assert.equal(q.output_lens[i], q.max_tokens[i], `request ${i} output (ignore_eos)`);
      assert.equal(q.finish_reasons[i], 'length');
    } else {
      assert.ok(q.output_lens[i] >= 1 && q.output_lens[i] <= q.max_tokens[i]);
    }
    assert.ok(q.chunks[i] >= 1 && q.chunks[i] <= q.output_lens[i], `request ${i} chunks`);
    assert.equal(q.itls[i].length, q.chunks[i] - 1);
    assert.ok(q.ttfts[i] > 0 && q.ttfts[i] <= q.e2els[i], `request ${i}: TTFT after E2E`);
    assert.ok(q.itls[i].every((x) => x >= 0));
  }
  assert.equal(s.total_input_tokens, sum(q.prompt_tokens));
  assert.equal(s.total_output_tokens, sum(q.output_lens));
  const close = (a, b) => Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b));
  assert.ok(close(s.request_throughput, n / s.duration));
  assert.ok(close(s.output_throughput, s.total_output_tokens / s.duration));
  assert.ok(close(s.total_token_throughput,
    (s.total_input_tokens + s.total_output_tokens) / s.duration));
  for (const m of ['ttft', 'tpot', 'itl', 'e2el']) {
    const v = ['min', 'median', 'p90', 'p99', 'max'].map((k) => s[`${k}_${m}_ms`]);
    for (let k = 1; k < v.length; k++) assert.ok(v[k - 1] <= v[k], `${m} percentiles: ${v}`);
    const mean = s[`mean_${m}_ms`];
    assert.ok(mean >= v[0] && mean <= v[4], `${m} mean ${mean} outside ${v[0]}..${v[4]}`);
  }
  // the report's medians are those of the per-request values
  const ttft = [...q.ttfts].sort((a, b) => a - b);
  const med = n % 2 ? ttft[(n - 1) / 2] : (ttft[n / 2 - 1] + ttft[n / 2]) / 2;
  assert.ok(Math.abs(s.median_ttft_ms - med * 1e3) < 1e-6, 'median TTFT');
  return s;
}

const common = ['--model', 'llama-tiny', '--warmup', '0', '--ignore-eos', '--temperature', '0'];

await run([
  test('closed loop, HTTP/1.1, token-id prompts: counts equal usage and /metrics', async () => {
    const before = await metrics(srv.base);
    const r = bench('h1-closed', [...common, '--num-prompts', '40', '--concurrency', '8',
      '--input-len', '32', '--output-len', '16', '--range-ratio', '0.5']);
    const s = consistent(r, 40);
    const after = await metrics(srv.base);
    assert.equal(after.pagoda_generation_tokens_total - before.pagoda_generation_tokens_total,
      s.total_output_tokens, 'the server generated what the client counted');
    assert.ok(new Set(s.requests.input_lens).size > 1, 'the range ratio varies the lengths');
    assert.match(r.out, /Successful requests: +40/);
    assert.match(r.out, /Failed requests: +0/);
  }),

  test('closed loop, h2c, one connection for 16 concurrent streams', async () => {
    const r = bench('h2-closed', [...common, '--http2', '--num-prompts', '48',
      '--concurrency', '16', '--input-len', '24', '--output-len', '12']);
    const s = consistent(r, 48);
    assert.equal(s.config.protocol, 'h2c');
  }),

  test('open loop, HTTP/1.1, Poisson arrivals, chat with the tokenizer', async () => {
    const r = bench('h1-open', [...common, '--endpoint', 'chat', '--tokenizer',
      `${TESTDATA}/models/llama-tiny`, '--request-rate', '40', '--num-prompts', '30',
      '--input-len', '20', '--output-len', '8', '--seed', '7']);
    const s = consistent(r, 30, { exactInput: false });
    const st = s.requests.start_times;
    for (let i = 1; i < st.length; i++) assert.ok(st[i] >= st[i - 1], 'sent in order');
    // 29 exponential gaps of mean 25 ms: the span is far from 0 and from all at once
    assert.ok(st[st.length - 1] > 0.2, `arrivals span ${st[st.length - 1]} s`);
  }),

  test('open loop, h2c, constant arrivals capped at 4 in flight', async () => {
    const r = bench('h2-open', [...common, '--http2', '--request-rate', '200', '--arrival',
      'constant', '--concurrency', '4', '--num-prompts', '24', '--input-len', '16',
      '--output-len', '10']);
    const s = consistent(r, 24);
    const st = s.requests.start_times;
    const end = st.map((t, i) => t + s.requests.e2els[i]);
    for (const t of st) {
      // at the moment a request was sent, fewer than 4 others were in flight
      const busy = st.filter((u, j) => u < t && end[j] > t).length;
      assert.ok(busy < 4, `${busy} in flight when one more was sent`);
    }
  }),

  test('prefix repetition: the server reports prefix-cache hits', async () => {
    const r = bench('prefix', [...common, '--dataset', 'prefix-repetition', '--prefix-len',
      '64', '--suffix-len', '8', '--num-prefixes', '2', '--num-prompts', '16',
      '--concurrency', '2', '--output-len', '4']);
    const s = consistent(r, 16);
    assert.ok(s.prefix_cache_hit_rate > 0 && s.prefix_cache_hit_rate <= 1,
      `hit rate ${s.prefix_cache_hit_rate}`);
    assert.ok(s.cached_prompt_tokens > 0, 'usage reports cached tokens');
    assert.match(r.out, /Prefix cache hit rate \(server, %\): +\d/);
  }),

  test('sweep with goodput, JSON and SVG plot', async () => {
    const svg = join(tmp, 'sweep.svg');
    const r = bench('sweep', [...common, '--sweep', '1,4', '--num-prompts', '8',
      '--input-len', '16', '--output-len', '8', '--slo', 'ttft:60000,tpot:60000',
      '--plot', svg]);
    assert.equal(r.status, 0, r.err);
    const runs = r.report.runs;
    assert.equal(runs.length, 2);
    assert.deepEqual(runs.map((x) => x.load), [1, 4]);
    for (const x of runs) {
      assert.equal(x.failed, 0);
      assert.equal(x.total_output_tokens, 64);
      assert.equal(x.good_requests, 8, 'generous objectives: every request is good');
      assert.ok(Math.abs(x.goodput - x.request_throughput) < 1e-9);
    }
    assert.match(r.out, /concurrency +req\/s.* goodput\n/);
    // the table's goodput column is the report's goodput, as printed (2 decimals)
    const rows = r.out.split('\n').filter((l) => /^ +[14] /.test(l));
    assert.equal(rows.length, 2, r.out);
    rows.forEach((l, i) => assert.equal(l.trim().split(/ +/).at(-1), runs[i].goodput.toFixed(2)));
    const text = readFileSync(svg, 'utf8');
    assert.ok(text.startsWith('<svg') && text.trimEnd().endsWith('</svg>'));
    assert.equal((text.match(/<circle/g) || []).length, 8, 'two runs x median/P99 x 2 panels');
  }),

  test('a single run writes its latency plot', async () => {
    const svg = join(tmp, 'run.svg');
    // 32 tokens a request: with 6, a fast step could send each request's tokens in one
    // event, leaving the inter-token panel without samples (and without its curve)
    const r = bench('plot', [...common, '--num-prompts', '6', '--concurrency', '3',
      '--input-len', '8', '--output-len', '32', '--plot', svg]);
    consistent(r, 6);
    const text = readFileSync(svg, 'utf8');
    assert.equal((text.match(/<polyline/g) || []).length, 5, 'four CDFs and the timeline');
  }),

  test('failures are reported, not hidden', async () => {
    let r = bench('bad-model', ['--model', 'no-such-model', '--num-prompts', '2']);
    assert.notEqual(r.status, 0);
    assert.match(r.err, /HTTP 404/);
    r = bench('too-long', ['--model', 'llama-tiny', '--warmup', '0', '--num-prompts', '3',
      '--input-len', '8', '--output-len', '100000']);
    assert.equal(r.status, 3, 'failed requests give exit status 3');
    assert.equal(r.report.failed, 3);
    assert.match(r.report.requests.errors[0], /HTTP 400/);
    const dead = spawnSync(BENCH, ['--base-url', 'http://127.0.0.1:1', '--model', 'x'],
      { encoding: 'utf8' });
    assert.equal(dead.status, 1);
    assert.match(dead.stderr, /Connection refused/);
  }),

  test('https: HTTP/1.1 and h2 by ALPN, the certificate verified', async () => {
    const cert = join(tmp, 'cert.pem'), key = join(tmp, 'key.pem');
    const gen = spawnSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout',
      key, '-out', cert, '-days', '2', '-subj', '/CN=localhost', '-addext',
      'subjectAltName=IP:127.0.0.1,DNS:localhost'], { encoding: 'utf8' });
    assert.equal(gen.status, 0, gen.stderr);
    const tls = await startServer('llama-tiny', ['--tls-cert', cert, '--tls-key', key]);
    try {
      const args = [...common, '--cacert', cert, '--num-prompts', '12', '--concurrency', '4',
        '--input-len', '16', '--output-len', '8'];
      let s = consistent(bench('tls-h1', args, tls.base), 12);
      assert.equal(s.config.protocol, 'http/1.1');
      s = consistent(bench('tls-h2', [...args, '--http2'], tls.base), 12);
      assert.equal(s.config.protocol, 'h2');
      const untrusted = bench('tls-untrusted', ['--model', 'llama-tiny', '--num-prompts', '1'],
        tls.base);
      assert.equal(untrusted.status, 1);
      assert.match(untrusted.err, /certificate verification failed: self.signed certificate/);
      const plain = bench('tls-plain', ['--model', 'llama-tiny', '--num-prompts', '1'],
        tls.base.replace('https:', 'http:'));
      assert.notEqual(plain.status, 0, 'plain HTTP to a TLS port fails');
    } finally {
      await tls.stop();
    }
  }),

  test('multi-turn: each turn sends the conversation so far, later turns hit the cache', async () => {
    const r = bench('multi-turn', ['--model', 'llama-tiny', '--dataset', 'multi-turn',
      '--num-conversations', '3', '--turns', '3', '--turn-input-len', '40',
      '--turn-output-len', '8', '--ignore-eos', '--vocab-size', '2000', '--seed', '11']);
    assert.equal(r.status, 0, `exit ${r.status}: ${r.err}`);
    const t = r.report.turns;
    assert.equal(t.length, 3);
    // turn k's prompt: k * 40 new tokens plus (k - 1) * 8 answers, for each conversation
    assert.deepEqual(t.map((x) => x.prompt_tokens), [3 * 40, 3 * 88, 3 * 136]);
    assert.ok(t.every((x) => x.completed === 3));
    // a later turn finds its conversation's earlier turns: at least their full blocks
    for (let k = 1; k < 3; k++) {
      assert.ok(t[k].cached_tokens >= 3 * Math.floor((40 * k + 8 * (k - 1)) / 16) * 16,
        `turn ${k + 1}: ${t[k].cached_tokens} cached`);
    }
    assert.match(r.out, /^turn +requests +prompt tok/m);
    assert.equal(r.report.summary.completed, 9);
  }),

  test('the KV pool is all free afterwards', async () => {
    await waitKvFree(srv.base);
  }),
]);

await srv.stop();
rmSync(tmp, { recursive: true, force: true });
