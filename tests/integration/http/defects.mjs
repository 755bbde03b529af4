// Small defects, each a regression test named after what broke: a stop-string finish was
// counted as an abort in /metrics; `priority` was accepted and ignored.
import assert from 'node:assert/strict';
import { startServer, run, test, postJson, waitKvFree } from './lib.mjs';

const MODEL = 'llama-tiny';
const srv = await startServer(MODEL, ['--max-num-seqs', '1']);
const cmpl = (extra) => ({ model: MODEL, prompt: [1, 2, 3], temperature: 0, ...extra });

await run([
  test('a stop-string finish is counted as stop, not abort', async () => {
    const free = await postJson(srv.base, '/v1/completions', cmpl({ max_tokens: 30, ignore_eos: true }));
    const text = free.json.choices[0].text;
    const stop = text.slice(8, 12);
    assert.ok(stop.trim().length > 0 && text.indexOf(stop) === 8, `stop string ${JSON.stringify(stop)}`);
    const before = await waitKvFree(srv.base);
    const r = await postJson(srv.base, '/v1/completions', cmpl({ max_tokens: 30, ignore_eos: true, stop }));
    assert.equal(r.json.choices[0].finish_reason, 'stop');
    assert.equal(r.json.choices[0].text, text.slice(0, 8));
    const m = await waitKvFree(srv.base);
    const d = (k) => m[`pagoda_requests_finished_total{reason="${k}"}`] -
      before[`pagoda_requests_finished_total{reason="${k}"}`];
    assert.equal(d('stop'), 1);
    assert.equal(d('abort'), 0);
  }),
  test('priority orders the waiting queue (lower first, as vLLM)', async () => {
    const done = [];
    const a = postJson(srv.base, '/v1/completions', cmpl({ max_tokens: 300, ignore_eos: true }));
    await new Promise((r) => setTimeout(r, 300)); // A runs; the single slot is taken
    const order = [['late', 10], ['early', -10], ['default', undefined]];
    const jobs = [];
    for (const [name, priority] of order) {
      jobs.push(postJson(srv.base, '/v1/completions', cmpl({ max_tokens: 5, priority }))
        .then((r) => { assert.equal(r.status, 200, r.text); done.push(name); }));
      await new Promise((r) => setTimeout(r, 50)); // arrival order: late, early, default
    }
    await Promise.all([a, ...jobs]);
    assert.deepEqual(done, ['early', 'default', 'late']);
    const bad = await postJson(srv.base, '/v1/completions', cmpl({ max_tokens: 1, priority: 'high' }));
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'priority');
  }),
]);
await srv.stop();
