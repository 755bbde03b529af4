// The disk KV tier (--kv-disk-dir) across a kill -9: a 2,000-token prompt, the server
// killed without warning, a new server on the same directory: the same prompt is served
// from disk (at least 95% of its tokens cached) with the same greedy output. Then a
// second server on a held directory is refused, and a store written for another model
// is not read. A hybrid model (qwen3_5-tiny) does the same across a kill -9: its
// recurrent-state snapshot is stored beside the blocks and loaded with them.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { startServer, run, test, postJson, metrics, waitKvFree, PAGODA, TESTDATA } from './lib.mjs';

const MODEL = 'llama-tiny';
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'pagoda-kvdisk-'));
const DISK = ['--kv-disk-dir', dir, '--kv-disk-size', '64MiB'];
// 2,000 token ids of the tiny model's vocabulary (a fixed pseudo-random sequence)
const PROMPT = Array.from({ length: 2000 }, (_, i) => 3 + ((i * 7919 + 13) % 250));

async function complete(base) {
  const r = await postJson(base, '/v1/completions',
    { model: MODEL, prompt: PROMPT, max_tokens: 12, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

/** Waits until the writer has put every block of the prompt on disk. */
async function waitStored(base, blocks) {
  for (let i = 0; i < 200; i++) {
    const m = await metrics(base);
    if (m['pagoda_kv_tier_blocks{tier="disk"}'] >= blocks) return m;
    await new Promise((res) => setTimeout(res, 50));
  }
  assert.fail('the blocks never reached the disk');
}

let cold;
await run([
  test('kill -9, restart on the same directory: >= 95% cached, same greedy output', async () => {
    const a = await startServer(MODEL, DISK);
    cold = await complete(a.base);
    assert.equal(cold.usage.prompt_tokens_details?.cached_tokens ?? 0, 0);
    await waitStored(a.base, Math.floor(2000 / 16));
    a.proc.kill('SIGKILL');
    await new Promise((res) => a.proc.on('exit', res));

    const b = await startServer(MODEL, DISK);
    const warm = await complete(b.base);
    const cached = warm.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached >= 0.95 * PROMPT.length, `cached ${cached} of ${PROMPT.length}`);
    assert.equal(warm.choices[0].text, cold.choices[0].text);
    const m = await waitKvFree(b.base);
    assert.equal(m['pagoda_kv_tier_hit_tokens_total{tier="disk"}'], cached);
    assert.equal(m['pagoda_kv_tier_faults_total{tier="disk",kind="corrupt"}'], 0);

    // the directory removed while serving: new blocks fail to store (counted), requests
    // are served all the same
    fs.rmSync(dir, { recursive: true, force: true });
    const other = await postJson(b.base, '/v1/completions',
      { model: MODEL, prompt: PROMPT.slice(0, 300).reverse(), max_tokens: 4, temperature: 0 });
    assert.equal(other.status, 200, other.text);
    for (let i = 0; i < 100; i++) {
      const mm = await metrics(b.base);
      if (mm['pagoda_kv_tier_faults_total{tier="disk",kind="write"}'] > 0) break;
      assert.ok(i < 99, 'no write fault counted');
      await new Promise((res) => setTimeout(res, 50));
    }
    await b.stop();
  }),
  test('hybrid model: kill -9, restart: blocks and state snapshot from disk, same output', async () => {
    const HYB = 'qwen3_5-tiny';
    const hdir = fs.mkdtempSync(path.join(os.tmpdir(), 'pagoda-kvdisk-hyb-'));
    const HDISK = ['--kv-disk-dir', hdir, '--kv-disk-size', '64MiB'];
    const prompt = PROMPT.slice(0, 500);
    const ask = async (base) => {
      const r = await postJson(base, '/v1/completions',
        { model: HYB, prompt, max_tokens: 12, temperature: 0 });
      assert.equal(r.status, 200, r.text);
      return r.json;
    };
    const a = await startServer(HYB, HDISK);
    assert.doesNotMatch(a.log(), /off for hybrid models/);
    const hcold = await ask(a.base);
    for (let i = 0; ; i++) {
      const m = await metrics(a.base);
      if (m['pagoda_kv_tier_blocks{tier="disk"}'] >= Math.floor(500 / 16) &&
          m['pagoda_kv_tier_state_snapshots{tier="disk"}'] >= 1) break;
      assert.ok(i < 200, 'the blocks and the snapshot never reached the disk');
      await new Promise((res) => setTimeout(res, 50));
    }
    a.proc.kill('SIGKILL');
    await new Promise((res) => a.proc.on('exit', res));

    const b = await startServer(HYB, HDISK);
    const hwarm = await ask(b.base);
    assert.equal(hwarm.usage.prompt_tokens_details.cached_tokens, Math.floor(500 / 16) * 16);
    assert.equal(hwarm.choices[0].text, hcold.choices[0].text);
    const m = await waitKvFree(b.base);
    assert.equal(m['pagoda_kv_tier_state_loads_total{tier="disk",result="ok"}'], 1);
    assert.equal(m['pagoda_kv_tier_state_queries_total{tier="disk"}'], 1);
    assert.equal(m['pagoda_kv_tier_state_hits_total{tier="disk"}'], 1);
    assert.equal(m['pagoda_kv_tier_hit_tokens_total{tier="disk"}'], Math.floor(500 / 16) * 16);
    await b.stop();
    fs.rmSync(hdir, { recursive: true, force: true });
  }),
  test('a second server on a held directory is refused', async () => {
    const b = await startServer(MODEL, DISK);
    const r = spawnSync(PAGODA, ['serve', '--model', `${TESTDATA}/models/${MODEL}`, '--port', '0',
      '--threads', '1', ...DISK], { encoding: 'utf8', timeout: 30000 });
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /in use by another pagoda server \(pid \d+\)/);
    await b.stop();
  }),
  test('a store written for another model is emptied, not read', async () => {
    const c = await startServer('qwen3-tiny', DISK);
    assert.match(c.log(), /written for another model or format; starting empty/);
    const m = await metrics(c.base);
    assert.equal(m['pagoda_kv_tier_blocks{tier="disk"}'], 0);
    await c.stop();
  }),
]);
fs.rmSync(dir, { recursive: true, force: true });
