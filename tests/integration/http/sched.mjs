// The scheduling options through the server: with --max-step-ms and fcfs, concurrent
// completions are served and /metrics shows the step mix and the step-time model (its
// predictions summed beside the measured steps); a request with a priority is refused under
// fcfs (400, as vLLM); swap preemption and bad values stop the server at start with a
// message naming the option.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { PAGODA, TESTDATA, startServer, run, test, postJson, metrics, waitKvFree } from './lib.mjs';

const MODEL = 'llama-tiny';
const srv = await startServer(MODEL, ['--max-step-ms', '1000', '--scheduling-policy', 'fcfs',
  '--long-prefill-token-threshold', '48']);
const cmpl = (n, extra = {}) => ({ model: MODEL, prompt: Array.from({ length: n }, (_, i) => 1 + (i * 5) % 60),
  max_tokens: 16, ignore_eos: true, temperature: 0, ...extra });

await run([
  test('concurrent requests: the step mix and the model in /metrics', async () => {
    const rs = await Promise.all([100, 30, 70, 12, 90, 50].map((n) =>
      postJson(srv.base, '/v1/completions', cmpl(n))));
    for (const r of rs) assert.equal(r.status, 200, JSON.stringify(r.json));
    const m = await waitKvFree(srv.base);
    // every token computed was a prefill token (the prompts past their cache hits) or a
    // decode row (each output token but the last)
    assert.equal(m.pagoda_engine_step_prefill_tokens_total, m.pagoda_prompt_tokens_total);
    assert.equal(m.pagoda_engine_step_decode_rows_total, 6 * 15);
    assert.ok(m.pagoda_engine_steps_predicted_total > 0, 'no step was predicted');
    assert.ok(m.pagoda_engine_step_measured_seconds_total > 0);
    assert.ok(m.pagoda_engine_step_predicted_seconds_total > 0);
    assert.ok('pagoda_engine_step_cost_seconds{term="row"}' in m);
    assert.ok('pagoda_engine_steps_time_capped_total' in m);
  }),
  test('fcfs refuses a priority', async () => {
    const r = await postJson(srv.base, '/v1/completions', cmpl(8, { priority: 2 }));
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /priority/);
  }),
  test('bad scheduling values stop the server with the option named', async () => {
    for (const [args, want] of [[['--preemption-mode', 'swap'], /--preemption-mode swap/],
      [['--max-step-ms', '-4'], /--max-step-ms/], [['--scheduling-policy', 'sjf'], /--scheduling-policy/]]) {
      const p = spawnSync(PAGODA, ['serve', '--model', `${TESTDATA}/models/${MODEL}`, '--port', '0', ...args],
        { encoding: 'utf8', timeout: 30000 });
      assert.notEqual(p.status, 0, args.join(' '));
      assert.match(p.stderr, want);
    }
  }),
]);
await srv.stop();
