// Speculative decoding behind the server: with n-gram drafts, a greedy completion of a prompt
// that repeats itself is the same as without, and /metrics counts the drafts under pagoda's
// and vLLM's names (regression: the per-model sum of the statistics once dropped them).
import assert from 'node:assert/strict';
import { startServer, run, test, postJson, waitKvFree } from './lib.mjs';

const MODEL = 'llama-tiny';
const loop = [5, 9, 13, 17, 21, 25, 29, 33];
const prompt = [...loop, ...loop, ...loop, ...loop];
const body = { model: MODEL, prompt, max_tokens: 48, temperature: 0, ignore_eos: true };

const plain = await startServer(MODEL);
const want = (await postJson(plain.base, '/v1/completions', body)).json;
await plain.stop();

const srv = await startServer(MODEL, ['--speculative-method', 'ngram',
  '--num-speculative-tokens', '3']);
await run([
  test('greedy tokens as without drafts; drafts counted in /metrics', async () => {
    const r = await postJson(srv.base, '/v1/completions', body);
    assert.equal(r.status, 200);
    assert.equal(r.json.choices[0].text, want.choices[0].text);
    assert.equal(r.json.usage.completion_tokens, 48);
    const m = await waitKvFree(srv.base);
    const drafts = m['vllm:spec_decode_num_drafts{method="ngram"}'];
    assert.ok(drafts > 0, `verifications: ${drafts}`);
    assert.equal(m['pagoda_spec_decode_drafts_total{method="ngram"}'], drafts);
    const drafted = m['vllm:spec_decode_num_draft_tokens{method="ngram"}'];
    const kept = m['vllm:spec_decode_num_accepted_tokens{method="ngram"}'];
    assert.ok(kept <= drafted && drafted <= 3 * drafts, `${kept} of ${drafted}`);
    assert.equal(m['pagoda_spec_decode_acceptance_length_count{method="ngram"}'], drafts);
    assert.equal(m['pagoda_spec_decode_acceptance_length_sum{method="ngram"}'], kept);
  }),
]);
await srv.stop();
