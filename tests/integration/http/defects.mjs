// Small defects, each a regression test named after what broke: a stop-string finish was
// counted as an abort in /metrics; `priority` was accepted and ignored; text_offset went
// wrong after a character split into byte tokens; max_tokens 0 could not score a prompt;
// no CORS (browsers could not call the server, preflights got 405).
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
  test('text_offset counts a character split over byte tokens once ("né café")', async () => {
    // llama-tiny spells é as the byte tokens <0xC3> <0xA9>
    const r = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: 'né café',
      echo: true, logprobs: 0, max_tokens: 0 });
    assert.equal(r.status, 200, r.text);
    const lp = r.json.choices[0].logprobs;
    assert.equal(lp.tokens.length, 7, JSON.stringify(lp.tokens));
    assert.deepEqual(lp.text_offset, [0, 1, 1, 2, 5, 6, 6]);
    // streamed, the offsets continue from chunk to chunk
    const g = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: 'né café',
      logprobs: 0, max_tokens: 12, temperature: 0, ignore_eos: true });
    const want = g.json.choices[0].logprobs.text_offset;
    const sse = await (await fetch(`${srv.base}/v1/completions`, { method: 'POST',
      headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: MODEL,
        prompt: 'né café', logprobs: 0, max_tokens: 12, temperature: 0, ignore_eos: true,
        stream: true }) })).text();
    const got = [];
    for (const ev of sse.split('\n\n')) {
      if (!ev.startsWith('data: {')) continue;
      const c = JSON.parse(ev.slice(6)).choices[0];
      if (c.logprobs) got.push(...c.logprobs.text_offset);
    }
    assert.deepEqual(got, want);
    for (let i = 1; i < want.length; i++) assert.ok(want[i] >= want[i - 1], `${want}`);
  }),
  test('max_tokens 0 with echo scores the prompt; without echo it is a 400', async () => {
    const r = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: [5, 6, 7, 8],
      echo: true, logprobs: 1, max_tokens: 0 });
    assert.equal(r.status, 200, r.text);
    const c = r.json.choices[0];
    assert.equal(c.finish_reason, 'length');
    assert.equal(r.json.usage.completion_tokens, 0);
    assert.equal(r.json.usage.prompt_tokens, 4);
    assert.equal(c.logprobs.token_logprobs.length, 4);
    assert.equal(c.logprobs.token_logprobs[0], null);
    assert.ok(c.logprobs.token_logprobs.slice(1).every((x) => x < 0));
    const bad = await postJson(srv.base, '/v1/completions', { model: MODEL, prompt: [5],
      max_tokens: 0 });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'max_tokens');
  }),
  test('priority orders the waiting queue (lower first, as vLLM)', async () => {
    const done = [];
    // A streams a long output: once its first event is in, it holds the single slot
    // (about a second on this model), and the others queue behind it.
    const res = await fetch(`${srv.base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(cmpl({ max_tokens: 3500, ignore_eos: true, stream: true })),
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    await reader.read();
    const a = (async () => { while (!(await reader.read()).done); })();
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

await run([
  test('CORS: * by default, a preflight answered; --allowed-origins lists origins', async () => {
    let r = await fetch(`${srv.base}/v1/models`, { headers: { origin: 'http://a.example' } });
    assert.equal(r.headers.get('access-control-allow-origin'), '*');
    r = await fetch(`${srv.base}/v1/chat/completions`, { method: 'OPTIONS', headers: {
      origin: 'http://a.example', 'access-control-request-method': 'POST',
      'access-control-request-headers': 'content-type, authorization' } });
    assert.equal(r.status, 204);
    assert.equal(r.headers.get('access-control-allow-origin'), '*');
    assert.match(r.headers.get('access-control-allow-methods'), /POST/);
    assert.equal(r.headers.get('access-control-allow-headers'), 'content-type, authorization');
    const k = await startServer(MODEL, ['--allowed-origins', '["http://a.example","http://b.example"]',
      '--api-key', 'k']);
    try {
      r = await fetch(`${k.base}/v1/models`, { headers: { origin: 'http://b.example',
        authorization: 'Bearer k' } });
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('access-control-allow-origin'), 'http://b.example');
      assert.equal(r.headers.get('vary'), 'Origin');
      // the preflight needs no key; an origin not listed gets no CORS headers
      r = await fetch(`${k.base}/v1/models`, { method: 'OPTIONS', headers: {
        origin: 'http://a.example', 'access-control-request-method': 'GET' } });
      assert.equal(r.status, 204);
      r = await fetch(`${k.base}/v1/models`, { headers: { origin: 'http://c.example',
        authorization: 'Bearer k' } });
      assert.equal(r.status, 200);
      assert.equal(r.headers.get('access-control-allow-origin'), null);
      r = await fetch(`${k.base}/v1/models`, { method: 'OPTIONS', headers: {
        origin: 'http://c.example', 'access-control-request-method': 'GET' } });
      assert.equal(r.status, 405);
    } finally {
      await k.stop();
    }
    const none = await startServer(MODEL, ['--allowed-origins', '']);
    try {
      r = await fetch(`${none.base}/health`, { headers: { origin: 'http://a.example' } });
      assert.equal(r.headers.get('access-control-allow-origin'), null);
    } finally {
      await none.stop();
    }
  }),
]);
await srv.stop();
