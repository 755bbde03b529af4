// POST /v1/embeddings through the official OpenAI client against the reference vectors of
// testdata/embeddings/qwen3-embed-tiny (sentence-transformers, float32; every component within
// 1e-4, the reference's tolerance): a string, a list, token ids and id lists, base64 (the
// client's default, and asked for explicitly), dimensions (the reference truncated and
// renormalized here), the query prompt; usage counts; refusals with their status and error
// body; embeddings sent while a completion decodes give the same vectors bit for bit, the
// completion the same tokens; and no KV block is held afterwards.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { startServer, run, test, postJson, waitKvFree, TESTDATA } from './lib.mjs';

const MODEL = 'qwen3-embed-tiny';
const REF = JSON.parse(readFileSync(`${TESTDATA}/embeddings/${MODEL}/embeddings.json`, 'utf8'));
const TOL = 1e-4;
const srv = await startServer(`embeddings/${MODEL}`);
const openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
const texts = REF.cases.map((c) => c.text);
const ids = REF.cases.map((c) => c.ids);
const nTokens = (lists) => lists.reduce((a, l) => a + l.length, 0);

function close(got, want, what) {
  assert.equal(got.length, want.length, `${what}: ${got.length} values, want ${want.length}`);
  for (let d = 0; d < want.length; d++) {
    assert.ok(Math.abs(got[d] - want[d]) <= TOL,
      `${what}: component ${d} is ${got[d]}, reference ${want[d]}`);
  }
}

// The reference's first k values rescaled to unit length, as `dimensions` asks.
function truncated(v, k) {
  const head = v.slice(0, k);
  const norm = Math.sqrt(head.reduce((a, x) => a + x * x, 0));
  return head.map((x) => x / norm);
}

function fromBase64(s) {
  const b = Buffer.from(s, 'base64');
  assert.equal(b.length % 4, 0);
  return Array.from({ length: b.length / 4 }, (_, i) => b.readFloatLE(4 * i));
}

function checkShape(r, n, tokens) {
  assert.equal(r.object, 'list');
  assert.equal(r.model, MODEL);
  assert.equal(r.data.length, n);
  r.data.forEach((d, i) => { assert.equal(d.object, 'embedding'); assert.equal(d.index, i); });
  assert.deepEqual(r.usage, { prompt_tokens: tokens, total_tokens: tokens });
}

async function errorOf(body, base = srv.base) {
  const r = await postJson(base, '/v1/embeddings', body);
  assert.ok(r.json && r.json.error, `not an error body: ${r.text}`);
  assert.deepEqual(Object.keys(r.json.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal(r.json.error.type, 'invalid_request_error');
  return { status: r.status, ...r.json.error };
}

await run([
  test('a string, floats', async () => {
    const r = await openai.embeddings.create({ model: MODEL, input: texts[0], encoding_format: 'float' });
    checkShape(r, 1, ids[0].length);
    close(r.data[0].embedding, REF.cases[0].embedding, 'string');
  }),
  test('a list of strings (the client asks base64 and decodes it)', async () => {
    const r = await openai.embeddings.create({ model: MODEL, input: texts });
    checkShape(r, texts.length, nTokens(ids));
    r.data.forEach((d, i) => close(Array.from(d.embedding), REF.cases[i].embedding, `list[${i}]`));
  }),
  test('token ids and lists of token ids', async () => {
    const one = await openai.embeddings.create({ model: MODEL, input: ids[1], encoding_format: 'float' });
    checkShape(one, 1, ids[1].length);
    close(one.data[0].embedding, REF.cases[1].embedding, 'ids');
    const all = await openai.embeddings.create({ model: MODEL, input: ids, encoding_format: 'float' });
    checkShape(all, ids.length, nTokens(ids));
    all.data.forEach((d, i) => close(d.embedding, REF.cases[i].embedding, `id lists[${i}]`));
  }),
  test('base64: little-endian float32, equal to the float encoding', async () => {
    const b = await openai.embeddings.create({ model: MODEL, input: texts, encoding_format: 'base64' });
    const f = await openai.embeddings.create({ model: MODEL, input: texts, encoding_format: 'float' });
    b.data.forEach((d, i) => {
      assert.equal(typeof d.embedding, 'string');
      const v = fromBase64(d.embedding);
      close(v, REF.cases[i].embedding, `base64[${i}]`);
      assert.deepEqual(v, f.data[i].embedding.map(Math.fround),
        'base64 and float carry the same float32 values');
    });
  }),
  test('dimensions: truncated and renormalized', async () => {
    for (const k of [1, 32, 127]) {
      const r = await openai.embeddings.create({ model: MODEL, input: texts, dimensions: k,
        encoding_format: 'float' });
      r.data.forEach((d, i) => close(d.embedding, truncated(REF.cases[i].embedding, k), `dims ${k}[${i}]`));
      const b = await openai.embeddings.create({ model: MODEL, input: ids, dimensions: k,
        encoding_format: 'base64' });
      b.data.forEach((d, i) => close(fromBase64(d.embedding), truncated(REF.cases[i].embedding, k),
        `base64 dims ${k}[${i}]`));
    }
  }),
  test('prompt_name prepends the query prompt', async () => {
    const q = REF.query_prompt_cases;
    const r = await openai.embeddings.create({ model: MODEL, input: q.map((c) => c.text),
      prompt_name: 'query', encoding_format: 'float' });
    q.forEach((c, i) => close(r.data[i].embedding, c.embedding, `query[${i}]`));
    const tok = await postJson(srv.base, '/tokenize', { prompt: `Instruct: find the passage\nQuery:${q[0].text}` });
    const one = await openai.embeddings.create({ model: MODEL, input: q[0].text, prompt_name: 'query' });
    assert.equal(one.usage.prompt_tokens, tok.json.count, 'the prompt counts as input tokens');
  }),
  test('refusals: status and error body', async () => {
    const cases = [
      [{ model: MODEL }, 400, 'input'],
      [{ input: '' }, 400, 'input'],
      [{ input: [] }, 400, 'input'],
      [{ input: ['a', ''] }, 400, 'input[1]'],
      [{ input: 42 }, 400, 'input'],
      [{ input: [1, 'a'] }, 400, 'input'],
      [{ input: [[1, 2], 'a'] }, 400, 'input'],
      [{ input: [1, 99999] }, 400, 'input'],
      [{ input: 'a', encoding_format: 'int8' }, 400, 'encoding_format'],
      [{ input: 'a', dimensions: 0 }, 400, 'dimensions'],
      [{ input: 'a', dimensions: 129 }, 400, 'dimensions'],
      [{ input: 'a', dimensions: 1.5 }, 400, 'dimensions'],
      [{ input: 'a', prompt_name: 'passage' }, 400, 'prompt_name'],
      [{ input: [1, 2], prompt_name: 'query' }, 400, 'prompt_name'],
      [{ input: 'a', model: 'other' }, 404, 'model'],
    ];
    for (const [body, status, param] of cases) {
      const e = await errorOf(body);
      assert.equal(e.status, status, JSON.stringify(body));
      assert.equal(e.param, param, JSON.stringify(body));
    }
    const long = await errorOf({ input: Array(4097).fill(7) });
    assert.equal(long.status, 400);
    assert.equal(long.code, 'context_length_exceeded');
    const malformed = await postJson(srv.base, '/v1/embeddings', '{"input": [');
    assert.equal(malformed.status, 400);
    // the client reports the same as an error object
    await assert.rejects(openai.embeddings.create({ model: MODEL, input: 'a', dimensions: 500 }),
      (err) => err.status === 400 && err.param === 'dimensions');
  }),
  test('embeddings beside a decoding completion: the same vectors and tokens', async () => {
    const body = { model: MODEL, prompt: [5, 6, 7], max_tokens: 400, temperature: 0, ignore_eos: true };
    const soloText = (await postJson(srv.base, '/v1/completions', body)).json.choices[0].text;
    const solo = await openai.embeddings.create({ model: MODEL, input: ids, encoding_format: 'float' });
    // A streamed completion: once its first tokens are out, the embeddings go in beside it.
    const resp = await fetch(`${srv.base}/v1/completions`, { method: 'POST',
      headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }) });
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let sse = dec.decode((await reader.read()).value, { stream: true });
    let embDone = false;
    const emb = Promise.all([
      openai.embeddings.create({ model: MODEL, input: ids, encoding_format: 'float' }),
      ...ids.map((l) => openai.embeddings.create({ model: MODEL, input: l, encoding_format: 'float' }))])
      .then((r) => { embDone = true; return r; });
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      sse += dec.decode(value, { stream: true });
    }
    assert.ok(embDone, 'the embeddings were answered while the completion was decoding');
    const [lists, ...singles] = await emb;
    const text = sse.split('\n').filter((l) => l.startsWith('data: {'))
      .map((l) => JSON.parse(l.slice(6)).choices[0]?.text ?? '').join('');
    assert.equal(text, soloText, 'the completion is unchanged');
    ids.forEach((_, i) => {
      assert.deepEqual(lists.data[i].embedding, solo.data[i].embedding, `list[${i}] bit for bit`);
      assert.deepEqual(singles[i].data[0].embedding, solo.data[i].embedding, `single ${i} bit for bit`);
    });
    const m = await waitKvFree(srv.base);
    assert.ok(m['pagoda_http_requests_total{route="/v1/embeddings",status="200"}'] >= 10);
  }),
  test('a model that cannot embed: 400 naming the model', async () => {
    const gen = await startServer('llama-tiny');
    try {
      const e = await errorOf({ input: 'hello' }, gen.base);
      assert.equal(e.status, 400);
      assert.equal(e.param, 'model');
      assert.match(e.message, /cannot embed: .*modules\.json/);
    } finally {
      await gen.stop();
    }
  }),
]);
await srv.stop();
