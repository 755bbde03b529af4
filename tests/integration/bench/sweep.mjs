// pagoda-bench's tuning tools against the real `pagoda serve`: trace replay (Mooncake JSON
// lines with shared hash-id blocks, Azure CSV) and server sweeps, where pagoda-bench starts
// the server itself for each set of args, waits for it, runs and stops it.
// usage: node sweep.mjs PAGODA TESTDATA PAGODA_BENCH
import { spawnSync } from 'node:child_process';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { run, test, PAGODA, TESTDATA } from '../http/lib.mjs';

const BENCH = process.argv[4];
if (!BENCH) {
  console.error('usage: node sweep.mjs PAGODA TESTDATA PAGODA_BENCH');
  process.exit(2);
}
const tmp = mkdtempSync(join(tmpdir(), 'pagoda-bench-sweep-'));

/** A loopback port nothing listens on right now. */
async function freePort() {
  const s = createServer();
  await new Promise((res) => s.listen(0, '127.0.0.1', res));
  const { port } = s.address();
  await new Promise((res) => s.close(res));
  return port;
}

/** Whether something accepts connections on the port. */
function listening(port) {
  return new Promise((res) => {
    const c = connect(port, '127.0.0.1');
    c.on('connect', () => { c.destroy(); res(true); });
    c.on('error', () => res(false));
  });
}

function bench(name, args) {
  const json = join(tmp, `${name}.json`);
  const r = spawnSync(BENCH, ['--no-progress', '--json', json, ...args],
    { encoding: 'utf8', timeout: 180000 });
  const report = existsSync(json) ? JSON.parse(readFileSync(json, 'utf8')) : null;
  return { status: r.status, out: r.stdout, err: r.stderr, report };
}

const sum = (a) => a.reduce((x, y) => x + y, 0);
const model = `${TESTDATA}/models/llama-tiny`;

// 8 requests over 0.7 s; blocks of 16 tokens, requests 1, 4 and 6 reuse blocks of earlier ones
const mooncake = [
  { timestamp: 0, input_length: 40, output_length: 8, hash_ids: [0, 1, 2] },
  { timestamp: 100, input_length: 36, output_length: 6, hash_ids: [0, 1, 3] },
  { timestamp: 150, input_length: 20, output_length: 5, hash_ids: [4, 5] },
  { timestamp: 300, input_length: 12, output_length: 4 },
  { timestamp: 300, input_length: 48, output_length: 10, hash_ids: [0, 1, 2, 6] },
  { timestamp: 450, input_length: 30, output_length: 3, hash_ids: [7, 8] },
  { timestamp: 600, input_length: 33, output_length: 7, hash_ids: [4, 5, 9] },
  { timestamp: 700, input_length: 16, output_length: 2, hash_ids: [10] },
];
const mooncakeFile = join(tmp, 'trace.jsonl');
writeFileSync(mooncakeFile, mooncake.map((r) => JSON.stringify(r)).join('\n') + '\n');

const azureFile = join(tmp, 'trace.csv');
writeFileSync(azureFile, 'TIMESTAMP,ContextTokens,GeneratedTokens\n' +
  '2023-11-16 18:15:46.6805900,24,6\n' +
  '2023-11-16 18:15:46.9805900,17,4\n' +
  '2023-11-16 18:15:47.1805900,30,9\n' +
  '2023-11-16 18:15:47.1805900,9,3\n');
const azureArrivals = [0, 0.3, 0.5, 0.5];

await run([
  test('server sweep over a Mooncake trace: a fresh server per point, same requests', async () => {
    const port = await freePort();
    const svg = join(tmp, 'sweep.svg');
    const r = bench('sweep', ['--base-url', `http://127.0.0.1:${port}`,
      '--server-cmd', `${PAGODA} serve --model ${model} --port ${port} --threads 2`,
      '--sweep-server-args', '--max-num-seqs 1; --max-num-seqs 4',
      '--dataset', 'trace', '--trace-file', mooncakeFile, '--trace-block-size', '16',
      '--plot', svg]);
    assert.equal(r.status, 0, `exit ${r.status}: ${r.err}`);
    const d = r.report;
    assert.equal(d.config.dataset, 'trace');
    assert.equal(d.config.trace_format, 'mooncake');
    assert.equal(d.config.num_prompts, 8);
    assert.equal(d.config.ignore_eos, true, 'a trace asks for its output lengths exactly');
    assert.deepEqual(d.config.sweep_server_args, ['--max-num-seqs 1', '--max-num-seqs 4']);
    assert.equal(d.runs.length, 2);
    assert.deepEqual(d.runs.map((x) => x.server_args), ['--max-num-seqs 1', '--max-num-seqs 4']);
    for (const x of d.runs) {
      assert.equal(x.completed, 8, JSON.stringify(x));
      assert.equal(x.failed, 0);
      assert.equal(x.total_input_tokens, sum(mooncake.map((q) => q.input_length)));
      assert.equal(x.total_output_tokens, sum(mooncake.map((q) => q.output_length)));
      // shared blocks reach the prefix cache of each fresh server
      assert.ok(x.cached_prompt_tokens > 0, `cached tokens ${x.cached_prompt_tokens}`);
      assert.ok(x.duration >= 0.7, `the trace spans 0.7 s: ${x.duration}`);
    }
    assert.match(r.out, /--max-num-seqs 1\n/);
    assert.match(r.out, /--max-num-seqs 4\n/);
    const plot = readFileSync(svg, 'utf8');
    assert.match(plot, /Throughput vs P99 inter-token latency/);
    assert.match(plot, /1: --max-num-seqs 1 \(/);
    assert.match(plot, /2: --max-num-seqs 4 \(/);
    assert.equal(await listening(port), false, 'the last server was stopped');
  }),

  test('Azure trace, one server: requests go out at their arrival times', async () => {
    const port = await freePort();
    const r = bench('azure', ['--base-url', `http://127.0.0.1:${port}`,
      '--server-cmd', `${PAGODA} serve --model ${model} --port ${port} --threads 2`,
      '--trace-file', azureFile, '--warmup', '0']);
    assert.equal(r.status, 0, `exit ${r.status}: ${r.err}`);
    const d = r.report;
    assert.equal(d.config.trace_format, 'azure');
    assert.equal(d.completed, 4);
    const q = d.requests;
    assert.deepEqual(q.input_lens, [24, 17, 30, 9]);
    assert.deepEqual(q.output_lens, [6, 4, 9, 3]);
    assert.deepEqual(q.prompt_tokens, [24, 17, 30, 9]);
    for (let i = 0; i < 4; i++) {
      // never early; late by at most the loop's wake-up on a busy machine
      assert.ok(q.start_times[i] >= azureArrivals[i] - 1e-3, `request ${i} early`);
      assert.ok(q.start_times[i] < azureArrivals[i] + 0.25, `request ${i}: ${q.start_times[i]}`);
    }
    assert.equal(await listening(port), false, 'the server was stopped');
  }),

  test('a point whose server does not start is reported and the sweep goes on', async () => {
    const port = await freePort();
    const r = bench('failing', ['--base-url', `http://127.0.0.1:${port}`,
      '--server-cmd', `${PAGODA} serve --model ${model} --port ${port} --threads 2`,
      '--sweep-server-args', '--no-such-flag;--max-num-seqs 2',
      '--trace-file', mooncakeFile, '--trace-block-size', '16', '--num-prompts', '3']);
    assert.equal(r.status, 4, `exit ${r.status}: ${r.err}`);
    const d = r.report;
    assert.equal(d.runs.length, 2);
    assert.match(d.runs[0].error, /^the server exited before it was ready \(exit status \d+\)$/);
    assert.equal(d.runs[1].completed, 3, '--num-prompts cuts the trace');
    assert.equal(d.runs[1].failed, 0);
  }),

  test('refused combinations and bad trace files say why', async () => {
    let r = bench('refuse1', ['--server-cmd', 'true', '--sweep-server-args', 'a;b',
      '--sweep', '1,2']);
    assert.equal(r.status, 2);
    assert.match(r.err, /--sweep-server-args: cannot be combined with --sweep/);
    r = bench('refuse2', ['--sweep-server-args', 'a;b']);
    assert.equal(r.status, 2);
    assert.match(r.err, /--sweep-server-args: needs --server-cmd/);
    r = bench('refuse3', ['--dataset', 'trace']);
    assert.equal(r.status, 2);
    assert.match(r.err, /--dataset trace: needs --trace-file FILE/);
    const bad = join(tmp, 'bad.jsonl');
    writeFileSync(bad, '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n');
    r = bench('bad', ['--base-url', 'http://127.0.0.1:1', '--model', 'm', '--trace-file', bad]);
    assert.equal(r.status, 1);
    assert.match(r.err, /bad\.jsonl:2: "input_length" must be an integer in \[1, 100000000\]/);
  }),
]);
