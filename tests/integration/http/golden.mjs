// Greedy tokens over HTTP equal the reference goldens: /v1/completions with token-id
// prompts, temperature 0, ignore_eos, logprobs 5 and return_tokens_as_token_ids, compared
// under the testdata README rule (equal ids; a divergence only where the golden margin is
// below 0.05 and our token is in the golden top 2; top-5 logprobs within 1e-3 while the
// paths agree; float32 CPU path).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { startServer, run, test, postJson, TESTDATA } from './lib.mjs';

const MODELS = ['llama-tiny', 'qwen3-tiny', 'gemma3-tiny', 'qwen3moe-tiny', 'qwen3_5_moe-tiny'];
const tests = [];
for (const model of MODELS) {
  tests.push(test(`golden greedy tokens over HTTP: ${model}`, async () => {
    const golden = JSON.parse(readFileSync(`${TESTDATA}/models/${model}/golden.json`, 'utf8'));
    const srv = await startServer(model);
    try {
      // All prompts at once: the engine batches them, which the goldens must not notice.
      const results = await Promise.all(golden.cases.map((c) => postJson(srv.base,
        '/v1/completions', { model, prompt: c.prompt_ids, max_tokens: c.greedy_ids.length,
          temperature: 0, ignore_eos: true, logprobs: 5, return_tokens_as_token_ids: true })));
      golden.cases.forEach((c, ci) => {
        const r = results[ci];
        assert.equal(r.status, 200, r.text);
        const lp = r.json.choices[0].logprobs;
        const ids = lp.tokens.map((t) => Number(/^token_id:(\d+)$/.exec(t)[1]));
        assert.equal(ids.length, c.greedy_ids.length);
        for (let i = 0; i < ids.length; i++) {
          const step = c.steps[i];
          if (ids[i] !== c.greedy_ids[i]) {
            const top2 = step.top.slice(0, 2).map((t) => t[0]);
            assert.ok(step.margin < 0.05 && top2.includes(ids[i]),
              `case ${ci} step ${i}: got ${ids[i]}, golden ${c.greedy_ids[i]} (margin ${step.margin})`);
            break;
          }
          const ours = lp.top_logprobs[i];
          for (const [id, want] of step.top) {
            const got = ours[`token_id:${id}`];
            assert.ok(got !== undefined && Math.abs(got - want) <= 1e-3,
              `case ${ci} step ${i}: logprob of ${id} ${got} vs golden ${want}`);
          }
        }
      });
    } finally {
      await srv.stop();
    }
  }));
}
// A hybrid model resumes a repeated prompt from the recurrent-state snapshot taken at the end
// of its last full block: 32 of its 40 tokens cached, the same greedy tokens, and the
// snapshot visible in /metrics.
tests.push(test('hybrid prefix cache over HTTP: qwen3_5-tiny', async () => {
  const srv = await startServer('qwen3_5-tiny');
  try {
    const prompt = Array.from({ length: 40 }, (_, i) => (i * 37 + 11) % 2000);
    const body = { model: 'qwen3_5-tiny', prompt, max_tokens: 6, temperature: 0, ignore_eos: true };
    const a = await postJson(srv.base, '/v1/completions', body);
    const b = await postJson(srv.base, '/v1/completions', body);
    assert.equal(a.status, 200, a.text);
    assert.equal(b.status, 200, b.text);
    assert.equal(a.json.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(b.json.usage.prompt_tokens_details.cached_tokens, 32);
    assert.equal(b.json.choices[0].text, a.json.choices[0].text);
    /* the engine releases the request's state slot after its last event went out: the
     * statistics catch up within a step or two */
    let metrics = '';
    const slots = (state) => Number(new RegExp(`^pagoda_state_slots\\{state="${state}"\\} (\\d+)$`, 'm')
      .exec(metrics)[1]);
    for (let i = 0; i < 100; i++) {
      metrics = await (await fetch(`${srv.base}/metrics`)).text();
      if (slots('used') === 0) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    assert.ok(slots('total') > 0 && slots('cached') >= 1 && slots('used') === 0, metrics);
  } finally {
    await srv.stop();
  }
}));
await run(tests);
