// The disk KV tier (--kv-disk-dir) across a kill -9: a 2,000-token prompt, the server
// killed without warning, a new server on the same directory: the same prompt is served
// from disk (at least 95% of its tokens cached) with the same greedy output. Then a
// second server on a held directory is refused, and a store written for another model
// is not read.
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
