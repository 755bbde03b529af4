// Several models behind one server (--model NAME=DIR repeated, --models-file, aliases): a
// second --model used to be dropped without a word. Each model is routed by the request's
// "model", loaded when a request first names it (the request waits), listed with its state
// by /v1/models and GET /v1/models/{id} (the SDKs' models.list / models.retrieve), unloaded
// after --model-idle-timeout, and kept within --models-memory-budget by unloading the least
// recently used idle model, never one with a request in progress. An unknown name is a 404
// model_not_found; a model that fails to load is a 500 saying why.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import http2 from 'node:http2';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, run, test, postJson, metrics, TESTDATA } from './lib.mjs';

const LLAMA = `${TESTDATA}/models/llama-tiny`, QWEN = `${TESTDATA}/models/qwen3-tiny`;
const KV = 8 << 20; // --kv-cache-memory of every model: what the budget counts besides files
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'pagoda-models-'));
const broken = path.join(tmp, 'broken'); // a folder with no model in it
fs.mkdirSync(broken);

const srv = await startServer('llama-tiny', ['--model', `q,qwen-alias=${QWEN}`,
  '--model', `broken=${broken}`, '--kv-cache-memory', String(KV)]);
const openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
const anthropic = new Anthropic({ baseURL: srv.base, apiKey: 'unused', maxRetries: 0 });

const complete = (base, model, extra = {}) => postJson(base, '/v1/completions',
  { model, prompt: [1, 2, 3], max_tokens: 4, temperature: 0, ignore_eos: true, ...extra });
const states = async (base) => Object.fromEntries(
  (await (await fetch(`${base}/v1/models`)).json()).data.map((m) => [m.id, m.state]));
async function until(what, fn, seconds = 30) {
  for (let i = 0; i < seconds * 20; i++) {
    if (await fn()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail(`timed out waiting for ${what}`);
}
// The bytes the budget counts for a model: its folder's regular files plus its KV pool.
const bytesOf = (dir) => fs.readdirSync(dir).map((f) => fs.statSync(path.join(dir, f)))
  .filter((s) => s.isFile()).reduce((a, s) => a + s.size, KV);

await run([
  test('a second --model is served: models.list has every name, all unloaded', async () => {
    const list = await openai.models.list();
    assert.deepEqual(list.data.map((m) => [m.id, m.object, m.state]), [
      ['llama-tiny', 'model', 'unloaded'], ['q', 'model', 'unloaded'],
      ['qwen-alias', 'model', 'unloaded'], ['broken', 'model', 'unloaded']]);
    const a = await anthropic.models.list();
    assert.deepEqual(a.data.map((m) => [m.id, m.type]), [['llama-tiny', 'model'], ['q', 'model'],
      ['qwen-alias', 'model'], ['broken', 'model']]);
  }),
  test('models.retrieve: a known name, and a 404 model_not_found for an unknown one', async () => {
    const m = await openai.models.retrieve('qwen-alias');
    assert.equal(m.id, 'qwen-alias');
    assert.equal(m.object, 'model');
    assert.equal(m.owned_by, 'pagoda');
    const am = await anthropic.models.retrieve('q');
    assert.equal(am.id, 'q');
    assert.equal(am.type, 'model');
    await assert.rejects(openai.models.retrieve('no-such-model'),
      (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found' &&
        /'no-such-model' does not exist \(this server has 'llama-tiny', 'q', 'qwen-alias', 'broken'\)/
          .test(e.message));
    await assert.rejects(anthropic.models.retrieve('no-such-model'),
      (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
    // an id with a slash, percent-encoded by the SDK, is looked up decoded
    await assert.rejects(openai.models.retrieve('org/none'),
      (e) => e instanceof OpenAI.NotFoundError && /'org\/none' does not exist/.test(e.message));
  }),
  test('an unknown model on a generation route is a 404 model_not_found', async () => {
    await assert.rejects(openai.chat.completions.create({ model: 'gpt-4o', max_tokens: 2,
      messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
    await assert.rejects(anthropic.messages.create({ model: 'claude', max_tokens: 2,
      messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e instanceof Anthropic.NotFoundError && /model: /.test(e.error.error.message));
  }),
  test('a request for an unloaded model waits for its load; an alias answers as the model', async () => {
    const r = await openai.completions.create({ model: 'qwen-alias', prompt: [1, 2, 3],
      max_tokens: 4, temperature: 0 });
    assert.equal(r.model, 'q');
    assert.equal(r.usage.completion_tokens, 4);
    const c = await openai.chat.completions.create({ model: 'llama-tiny', max_tokens: 3,
      messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(c.model, 'llama-tiny');
    assert.deepEqual(await states(srv.base), { 'llama-tiny': 'loaded', q: 'loaded',
      'qwen-alias': 'loaded', broken: 'unloaded' });
    const m = await metrics(srv.base);
    assert.equal(m['pagoda_model_loads_total{model="q"}'], 1);
    assert.equal(m['pagoda_model_loaded{model="llama-tiny"}'], 1);
    // the same prompt to each model: each is routed to its own engine
    const [a, b] = await Promise.all([complete(srv.base, 'q'), complete(srv.base, 'llama-tiny')]);
    assert.equal(a.json.model, 'q');
    assert.equal(b.json.model, 'llama-tiny');
  }),
  test('a model that fails to load is a 500 saying why, listed as failed, retried', async () => {
    const r = await complete(srv.base, 'broken');
    assert.equal(r.status, 500, r.text);
    assert.match(r.json.error.message, /the model 'broken' could not be loaded: /);
    assert.equal((await states(srv.base)).broken, 'failed');
    const again = await complete(srv.base, 'broken');
    assert.equal(again.status, 500);
    const m = await metrics(srv.base);
    assert.equal(m['pagoda_model_load_failures_total{model="broken"}'], 2);
    assert.equal(m['pagoda_model_requests_waiting_for_load{model="broken"}'], 0);
  }),
  test('--model-idle-timeout unloads an idle model; the next request loads it again', async () => {
    const s = await startServer('llama-tiny', ['--model', `q=${QWEN}`,
      '--model-idle-timeout', '0.2', '--kv-cache-memory', String(KV)]);
    try {
      assert.equal((await complete(s.base, 'q')).status, 200);
      await until('q unloaded', async () => (await states(s.base)).q === 'unloaded');
      assert.equal((await complete(s.base, 'q')).status, 200);
      const m = await metrics(s.base);
      assert.equal(m['pagoda_model_loads_total{model="q"}'], 2);
      assert.ok(m['pagoda_model_unloads_total{model="q",reason="idle"}'] >= 1);
    } finally { await s.stop(); }
  }),
  test('the memory budget unloads the least recently used idle model, never a busy one', async () => {
    const a = bytesOf(LLAMA), b = bytesOf(QWEN);
    const budget = Math.max(a, b) + Math.min(a, b) - 1; // one at a time
    const s = await startServer('llama-tiny', ['--model', `q=${QWEN}`,
      '--models-memory-budget', String(budget), '--kv-cache-memory', String(KV)]);
    try {
      assert.equal((await complete(s.base, 'llama-tiny')).status, 200);
      // hold llama-tiny with a long stream, then ask for q: it must wait
      const res = await fetch(`${s.base}/v1/completions`, { method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'llama-tiny', prompt: [1, 2, 3], max_tokens: 3500,
          temperature: 0, ignore_eos: true, stream: true }) });
      assert.equal(res.status, 200);
      const reader = res.body.getReader();
      await reader.read();
      const waiting = complete(s.base, 'q');
      await until('q waiting', async () =>
        (await metrics(s.base))['pagoda_model_requests_waiting_for_load{model="q"}'] === 1);
      assert.deepEqual(await states(s.base), { 'llama-tiny': 'loaded', q: 'unloaded' });
      await reader.cancel(); // the stream ends: llama-tiny is idle and makes room for q
      const r = await waiting;
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.model, 'q');
      assert.deepEqual(await states(s.base), { 'llama-tiny': 'unloaded', q: 'loaded' });
      const m = await metrics(s.base);
      assert.equal(m['pagoda_model_unloads_total{model="llama-tiny",reason="memory_budget"}'], 1);
      // and back: q is the least recently used idle model now
      assert.equal((await complete(s.base, 'llama-tiny')).status, 200);
      assert.deepEqual(await states(s.base), { 'llama-tiny': 'loaded', q: 'unloaded' });
    } finally { await s.stop(); }
  }),
  test('a request that goes away while its model waits to load no longer asks for it', async () => {
    const a = bytesOf(LLAMA), b = bytesOf(QWEN);
    const s = await startServer('llama-tiny', ['--model', `q=${QWEN}`,
      '--models-memory-budget', String(Math.max(a, b) + Math.min(a, b) - 1),
      '--kv-cache-memory', String(KV)]);
    const session = http2.connect(s.base);
    try {
      const res = await fetch(`${s.base}/v1/completions`, { method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'llama-tiny', prompt: [1, 2, 3], max_tokens: 3500,
          temperature: 0, ignore_eos: true, stream: true }) });
      const reader = res.body.getReader();
      await reader.read(); // llama-tiny held: q cannot be loaded
      const st = session.request({ ':method': 'POST', ':path': '/v1/completions',
        'content-type': 'application/json' });
      st.on('error', () => {});
      st.end(JSON.stringify({ model: 'q', prompt: [1, 2, 3], max_tokens: 4 }));
      const key = 'pagoda_model_requests_waiting_for_load{model="q"}';
      await until('q waiting', async () => (await metrics(s.base))[key] === 1);
      st.close(http2.constants.NGHTTP2_CANCEL);
      await until('the wait dropped', async () => (await metrics(s.base))[key] === 0);
      await reader.cancel();
      // llama-tiny idle, nobody wants q: it stays unloaded, llama-tiny stays loaded
      await until('llama-tiny idle', async () =>
        (await metrics(s.base))['pagoda_model_requests_in_progress{model="llama-tiny"}'] === 0);
      assert.equal((await complete(s.base, 'llama-tiny')).status, 200);
      assert.deepEqual(await states(s.base), { 'llama-tiny': 'loaded', q: 'unloaded' });
      assert.equal((await metrics(s.base))['pagoda_model_loads_total{model="q"}'], 0);
    } finally { session.close(); await s.stop(); }
  }),
  test('a model over the whole budget is a 500 that names the budget', async () => {
    const s = await startServer('llama-tiny', ['--model', `q=${QWEN}`,
      '--models-memory-budget', String(KV), '--kv-cache-memory', String(KV)]);
    try {
      const r = await complete(s.base, 'q');
      assert.equal(r.status, 500);
      assert.match(r.json.error.message, /more than --models-memory-budget 8388608/);
    } finally { await s.stop(); }
  }),
  test('--models-file and --served-model-name with several names', async () => {
    const file = path.join(tmp, 'models.txt');
    fs.writeFileSync(file, `# served models\n\nq,qq = ${QWEN}\n`.replace(' = ', '='));
    const s = await startServer('llama-tiny', ['--models-file', file]);
    try {
      assert.deepEqual(Object.keys(await states(s.base)), ['llama-tiny', 'q', 'qq']);
      assert.equal((await complete(s.base, 'qq')).json.model, 'q');
    } finally { await s.stop(); }
    const one = await startServer('llama-tiny', ['--served-model-name', 'first', 'second']);
    try {
      assert.deepEqual(await states(one.base), { first: 'loaded', second: 'loaded' });
      const r = await complete(one.base, 'second');
      assert.equal(r.json.model, 'first');
      assert.equal((await complete(one.base, 'llama-tiny')).status, 404);
    } finally { await one.stop(); }
  }),
]);
await srv.stop();
fs.rmSync(tmp, { recursive: true, force: true });
