// KV-cache events over ZeroMQ in vLLM's wire format, against a real `pagoda serve` and a
// C subscriber (kv_sub): the BlockStored events of a served request carry its prompt's
// full blocks (token ids, block size, parent chaining), a repeated prompt stores nothing,
// evictions send BlockRemoved for hashes stored before, sequence numbers count from 0,
// the replay socket answers with the same batches, shutdown sends AllBlocksCleared; the
// legacy array encoding; bad --kv-events-config values; the vllm:* metrics.
// Usage: node kv_events.mjs PAGODA TESTDATA KV_SUB
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import path from 'node:path';
import assert from 'node:assert/strict';
import { PAGODA, TESTDATA, startServer, run, test, postJson, metrics } from '../http/lib.mjs';

const KV_SUB = process.argv[4];
const DEMO = path.resolve('models/demo');
const BS = 16;

async function freePort() {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

// Runs kv_sub; resolves "ready" once subscribed; lines() has the JSON lines so far.
function subscribe(args) {
  const proc = spawn(KV_SUB, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  const done = new Promise((resolve) => proc.on('exit', (code) => resolve(code)));
  const ready = new Promise((resolve, reject) => {
    proc.stdout.on('data', (d) => { out += d; if (out.startsWith('ready\n')) resolve(); });
    proc.on('exit', (code) => reject(new Error(`kv_sub exited ${code}: ${out}`)));
  });
  const lines = () => out.split('\n').slice(1).filter((l) => l).map((l) => JSON.parse(l));
  return { proc, ready, done, lines };
}

function config(p1, p2, extra = {}) {
  return JSON.stringify({ enable_kv_cache_events: true, publisher: 'zmq',
    endpoint: `tcp://*:${p1}`, replay_endpoint: `tcp://*:${p2}`, topic: 'kv-events', ...extra });
}

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));
// deterministic prompt ids (the demo's vocabulary is 4096; ids >= 5 are plain tokens)
function ids(seed, n) {
  const out = [];
  let x = seed;
  for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) % 2147483648; out.push(5 + (x % 4000)); }
  return out;
}
async function complete(base, prompt) {
  const r = await postJson(base, '/v1/completions',
    { model: 'demo', prompt, max_tokens: 1, temperature: 0, ignore_eos: true });
  assert.equal(r.status, 200, r.text);
  return r.json;
}
const eventsOf = (lines) => lines.flatMap((l) => l.batch[1]);

await run([
  test('events of served requests, eviction, replay, shutdown', async () => {
    const p1 = await freePort(), p2 = await freePort();
    const t0 = Date.now() / 1000;
    const srv = await startServer(DEMO, ['--num-blocks', '8', '--kv-events-config', config(p1, p2)]);
    const sub = subscribe([`tcp://127.0.0.1:${p1}`, 'kv-events', '60']);
    try {
      await sub.ready;
      await sleep(500); // the subscription reaches the publisher
      const A = ids(1, 50);
      await complete(srv.base, A);
      for (let i = 0; i < 50 && eventsOf(sub.lines()).length < 1; i++) await sleep(100);
      await sleep(300);
      let ev = eventsOf(sub.lines());
      // 50 prompt tokens computed: 3 full blocks, one event (stored in one step)
      const stored = ev.filter((e) => e.type === 'BlockStored');
      assert.equal(stored.length, 1, JSON.stringify(ev));
      const s = stored[0];
      assert.equal(s.block_hashes.length, 3);
      assert.equal(s.parent_block_hash, null);
      assert.deepEqual(s.token_ids, A.slice(0, 3 * BS));
      assert.equal(s.block_size, BS);
      assert.equal(s.medium, 'CPU');
      assert.equal(s.lora_id, null);
      assert.equal(s.lora_name, null);
      assert.deepEqual(Object.keys(s), ['type', 'block_hashes', 'parent_block_hash', 'token_ids',
        'block_size', 'lora_id', 'medium', 'lora_name']);
      assert.equal(new Set(s.block_hashes.map(String)).size, 3, 'distinct hashes');

      // the same prompt again: its blocks are hits, nothing new is stored
      let m = await metrics(srv.base);
      const hits0 = m['vllm:prefix_cache_hits_total{model_name="demo",engine="0"}'];
      await complete(srv.base, A);
      await sleep(300);
      assert.equal(eventsOf(sub.lines()).length, ev.length, 'no event for a cached prompt');
      m = await metrics(srv.base);
      assert.equal(m['vllm:prefix_cache_hits_total{model_name="demo",engine="0"}'] - hits0, 3 * BS);

      // A then a continuation of it: the new blocks chain after A's last block
      const A2 = A.slice(0, 3 * BS).concat(ids(2, 20)); // 68 tokens: 4 full blocks
      await complete(srv.base, A2);
      await sleep(300);
      ev = eventsOf(sub.lines());
      const cont = ev[ev.length - 1];
      assert.equal(cont.type, 'BlockStored');
      assert.deepEqual(cont.block_hashes.length, 1);
      assert.equal(String(cont.parent_block_hash), String(s.block_hashes[2]));
      assert.deepEqual(cont.token_ids, A2.slice(3 * BS, 4 * BS));

      // other prompts fill the 8-block pool: cached blocks are evicted, each one stored before
      for (let k = 3; k < 8; k++) await complete(srv.base, ids(k, 50));
      await sleep(500);
      const lines = sub.lines();
      ev = eventsOf(lines);
      const live = new Set();
      let removed = 0;
      for (const e of ev) {
        if (e.type === 'BlockStored') {
          e.block_hashes.forEach((h) => live.add(String(h)));
        } else if (e.type === 'BlockRemoved') {
          assert.equal(e.block_hashes.length, 1);
          assert.equal(e.medium, 'CPU');
          const h = String(e.block_hashes[0]);
          assert.ok(live.has(h), `removed ${h} that was not stored`);
          live.delete(h);
          removed++;
        }
      }
      assert.ok(removed >= 5, `${removed} blocks removed`);
      m = await metrics(srv.base);
      assert.ok(live.size <= m['pagoda_kv_blocks{state="cached"}'] + m['pagoda_kv_blocks{state="used"}'],
        `${live.size} blocks live by the events`);
      assert.equal(live.size, m['pagoda_kv_blocks{state="cached"}'],
        'every cached block and only those (the pool is idle)');

      // the wire: topic, sequence numbers from 0, [ts, events, rank]
      lines.forEach((l, i) => {
        assert.equal(l.topic, 'kv-events');
        assert.equal(l.seq, i);
        assert.equal(l.batch.length, 3);
        assert.ok(l.batch[0] >= t0 - 1 && l.batch[0] <= Date.now() / 1000 + 1, `ts ${l.batch[0]}`);
        assert.equal(l.batch[2], 0);
      });

      // replay from 0: the same batches, then the end marker
      const rep = subscribe([`tcp://127.0.0.1:${p1}`, 'kv-events', '0', `tcp://127.0.0.1:${p2}`]);
      assert.equal(await rep.done, 0);
      const rl = rep.lines();
      assert.deepEqual(rl[rl.length - 1], { replay_end: true, bytes: 0 });
      assert.deepEqual(rl.slice(0, -1).map((l) => l.replay_seq), lines.map((l) => l.seq));
      assert.deepEqual(rl.slice(0, -1).map((l) => l.batch), lines.map((l) => l.batch));

      // the vLLM metric names, with the model label
      for (const name of ['vllm:num_requests_running', 'vllm:num_requests_waiting',
        'vllm:kv_cache_usage_perc', 'vllm:num_preemptions_total', 'vllm:prompt_tokens_total',
        'vllm:generation_tokens_total'])
        assert.ok(`${name}{model_name="demo",engine="0"}` in m, name);
      const L = 'model_name="demo",engine="0"';
      assert.equal(m[`vllm:request_success_total{${L},finished_reason="length"}`], 8);
      assert.equal(m[`vllm:e2e_request_latency_seconds_count{${L}}`], 8);
      assert.equal(m[`vllm:time_to_first_token_seconds_count{${L}}`], 8);
      assert.equal(m[`vllm:request_queue_time_seconds_count{${L}}`], 8);
      assert.equal(m[`vllm:generation_tokens_total{${L}}`], 8);
      assert.equal(m[`vllm:kv_cache_usage_perc{${L}}`], 0);

    } catch (e) {
      srv.proc.kill('SIGKILL');
      sub.proc.kill('SIGKILL');
      throw e;
    }
    // shutdown: every block is gone
    await srv.stop();
    assert.equal(await sub.done, 0);
    const last = sub.lines().pop();
    assert.deepEqual(last.batch[1], [{ type: 'AllBlocksCleared' }]);
  }),

  test('event_format array: the positional encoding of earlier vLLM releases', async () => {
    const p1 = await freePort(), p2 = await freePort();
    const srv = await startServer(DEMO, ['--kv-events-config',
      config(p1, p2, { event_format: 'array', topic: '' })]);
    const sub = subscribe([`tcp://127.0.0.1:${p1}`, '', '60']);
    await sub.ready;
    await sleep(500);
    const A = ids(9, 20);
    await complete(srv.base, A);
    await sleep(500);
    await srv.stop();
    assert.equal(await sub.done, 0);
    const l = sub.lines();
    assert.equal(l[0].topic, '');
    const e = l[0].batch[1][0];
    assert.equal(e.length, 8);
    assert.deepEqual([e[0], e[1].length, e[2], e[3], e[4], e[5], e[6], e[7]],
      ['BlockStored', 1, null, A.slice(0, BS), BS, null, 'CPU', null]);
    assert.deepEqual(l[l.length - 1].batch[1], [['AllBlocksCleared']]);
  }),

  test('bad --kv-events-config values are refused with the key named', async () => {
    const cases = [
      ['{"enable_kv_cache_events":true,"bogus":1}', 'unknown key "bogus"'],
      ['{"enable_kv_cache_events":1}', '"enable_kv_cache_events" must be true or false'],
      ['{"enable_kv_cache_events":true,"publisher":"kafka"}', '"publisher" must be'],
      ['{"enable_kv_cache_events":true,"hwm":-1}', '"hwm" must be an integer'],
      ['[1]', 'not a JSON object'],
      ['{"enable_kv_cache_events":true,"endpoint":"tcp://nohost"}', 'cannot connect to'],
    ];
    // one event stream per server: several models are refused
    cases.push(['{"enable_kv_cache_events":true}', 'serves one model only (2 given)',
      ['--model', `${TESTDATA}/models/llama-tiny`]]);
    for (const [cfg, msg, more = []] of cases) {
      const p = spawn(PAGODA, ['serve', '--model', DEMO, ...more, '--port', '0',
        '--kv-events-config', cfg],
        { stdio: ['ignore', 'ignore', 'pipe'] });
      let err = '';
      p.stderr.on('data', (d) => { err += d; });
      const code = await new Promise((res) => p.on('exit', res));
      assert.ok(code === 1 || code === 2, `${cfg}: exit ${code}`);
      assert.ok(err.includes(msg), `${cfg}: ${err}`);
    }
  }),
]);
