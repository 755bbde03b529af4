// Structured output against a real server with a random-weight model: OpenAI
// response_format (json_schema through the SDK's .parse() helper, json_object, streaming)
// and vLLM's guided_json / guided_regex / guided_choice / guided_grammar on chat and
// completions. Every answer must end by the grammar (finish_reason stop) and validate;
// invalid schemas, regexes and grammars are 400s in the OpenAI error shape, and so is one
// that compiles for longer than --grammar-compile-timeout.
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer, run, test, postJson } from './lib.mjs';

const MODEL = 'llama-tiny';
const srv = await startServer(MODEL);
const openai = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0 });
const hello = [{ role: 'user', content: 'Describe a person as JSON.' }];

const person = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 10 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    role: { enum: ['admin', 'user'] },
    tags: { type: 'array', items: { type: 'string', format: 'date' }, maxItems: 2 },
  },
  required: ['name', 'age', 'role', 'tags'],
  additionalProperties: false,
};

function checkPerson(p) {
  assert.deepEqual(Object.keys(p), ['name', 'age', 'role', 'tags']);
  assert.equal(typeof p.name, 'string');
  assert.ok([...p.name].length <= 10, p.name);
  assert.ok(Number.isInteger(p.age) && p.age >= 0 && p.age <= 120, String(p.age));
  assert.ok(['admin', 'user'].includes(p.role));
  assert.ok(Array.isArray(p.tags) && p.tags.length <= 2);
  for (const d of p.tags) assert.match(d, /^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$/);
}

await run([
  test('openai: chat.completions.parse() with a strict json_schema, greedy and sampled', async () => {
    for (const temperature of [0, 1, 1.5]) {
      for (let seed = 0; seed < (temperature ? 4 : 1); seed++) {
        const r = await openai.chat.completions.parse({
          model: MODEL, messages: hello, max_tokens: 400, temperature, seed,
          response_format: { type: 'json_schema', json_schema: { name: 'person', schema: person, strict: true } },
        });
        const c = r.choices[0];
        assert.equal(c.finish_reason, 'stop', c.message.content);
        checkPerson(c.message.parsed);
      }
    }
  }),
  test('openai: json_object, streamed: the chunks join to a JSON object', async () => {
    for (let seed = 0; seed < 3; seed++) {
      let text = '', finish = null;
      for await (const chunk of await openai.chat.completions.create({
        model: MODEL, messages: hello, max_tokens: 400, temperature: 1, seed, stream: true,
        response_format: { type: 'json_object' } })) {
        for (const c of chunk.choices) {
          text += c.delta.content ?? '';
          if (c.finish_reason) finish = c.finish_reason;
        }
      }
      if (finish === 'stop') {
        const v = JSON.parse(text);
        assert.ok(v && typeof v === 'object' && !Array.isArray(v), text);
      } else {
        /* an unbounded grammar may run out of tokens: what came is still a prefix */
        assert.equal(finish, 'length');
        assert.equal(text.trimStart()[0], '{');
      }
    }
  }),
  test('vllm: guided_json, guided_regex, guided_choice, guided_grammar on completions', async () => {
    const cases = [
      [{ guided_json: person }, (t) => checkPerson(JSON.parse(t))],
      [{ guided_json: JSON.stringify({ type: 'array', items: { type: 'boolean' }, minItems: 1, maxItems: 3 }) },
        (t) => { const v = JSON.parse(t); assert.ok(v.length >= 1 && v.length <= 3 && v.every((b) => typeof b === 'boolean')); }],
      [{ guided_regex: '[A-Z][a-z]{2,5} (19|20)\\d{2}' }, (t) => assert.match(t, /^[A-Z][a-z]{2,5} (19|20)\d{2}$/)],
      [{ guided_choice: ['positive', 'negative', 'neutral'] },
        (t) => assert.ok(['positive', 'negative', 'neutral'].includes(t), t)],
      [{ guided_grammar: 'root ::= "(" num ("+" num)* ")"\nnum ::= [1-9][0-9]?\n' },
        null],
    ];
    for (const [field, check] of cases) {
      for (let seed = 0; seed < 3; seed++) {
        const r = await postJson(srv.base, '/v1/completions', {
          model: MODEL, prompt: 'Answer:', max_tokens: 400, temperature: 1, seed, ...field });
        assert.equal(r.status, 200, r.text);
        const c = r.json.choices[0];
        if (check) {
          assert.equal(c.finish_reason, 'stop', c.text);
          check(c.text);
        } else {
          assert.match(c.text, /^\([1-9][0-9]?(\+[1-9][0-9]?)*\)?$/);
          if (c.finish_reason === 'stop') assert.ok(c.text.endsWith(')'));
        }
      }
    }
  }),
  test('vllm: guided_choice on chat, n = 4: each choice one of the list', async () => {
    const r = await postJson(srv.base, '/v1/chat/completions', {
      model: MODEL, messages: hello, max_tokens: 20, temperature: 1, n: 4, guided_choice: ['yes', 'no'] });
    assert.equal(r.status, 200, r.text);
    for (const c of r.json.choices) {
      assert.ok(['yes', 'no'].includes(c.message.content), c.message.content);
      assert.equal(c.finish_reason, 'stop');
    }
  }),
  test('errors: invalid schema, regex, grammar, choices and conflicting fields are 400s', async () => {
    const bad = [
      [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'integer', minimum: 3, maximum: 1 } } } },
        'response_format.json_schema.schema', /is empty/],
      [{ response_format: { type: 'json_schema', json_schema: { name: 'x' } } },
        'response_format.json_schema.schema', /required/],
      [{ response_format: { type: 'yaml' } }, 'response_format', /'json_schema'/],
      [{ guided_json: { not: { type: 'string' } } }, 'guided_json', /'not' is not supported/],
      [{ guided_json: '{"type":' }, 'guided_json', /not valid JSON/],
      [{ guided_regex: '(ab' }, 'guided_regex', /missing '\)'/],
      [{ guided_grammar: 'root ::= x\n' }, 'guided_grammar', /'x' is used but not defined/],
      [{ guided_choice: [] }, 'guided_choice', /array of 1 to 1024 strings/],
      [{ guided_regex: 'a', guided_choice: ['a'] }, 'guided_choice', /at most one of/],
    ];
    for (const [field, param, msg] of bad) {
      const r = await postJson(srv.base, '/v1/chat/completions', { model: MODEL, messages: hello, ...field });
      assert.equal(r.status, 400, r.text);
      assert.equal(r.json.error.type, 'invalid_request_error');
      assert.equal(r.json.error.param, param, r.text);
      assert.match(r.json.error.message, msg);
    }
    const s = await openai.chat.completions.create({
      model: MODEL, messages: hello, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'foo' } } },
    }).catch((e) => e);
    assert.equal(s.status, 400);
    assert.match(s.message, /unknown type 'foo'/);
  }),
]);
await srv.stop();

// --grammar-compile-timeout: a grammar that takes longer to compile is a 400 naming the field.
const quick = await startServer(MODEL, ['--grammar-compile-timeout', '1']);
await run([
  test('--grammar-compile-timeout 1: a slow regex is a 400, a small one is served', async () => {
    const r = await postJson(quick.base, '/v1/chat/completions', {
      model: MODEL, messages: hello, max_tokens: 5, guided_regex: 'a{1,9999}'.repeat(45) });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(r.json.error.param, 'guided_regex');
    assert.match(r.json.error.message, /compiling took longer than 1 ms \(--grammar-compile-timeout\)/);
    const ok = await postJson(quick.base, '/v1/chat/completions', {
      model: MODEL, messages: hello, max_tokens: 5, guided_regex: 'ab' });
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.json.choices[0].message.content, 'ab');
  }),
]);
await quick.stop();
