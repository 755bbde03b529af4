// Many clients: the server raises its open-files soft limit to the hard one and says so;
// N concurrent SSE streams (2,000 here; MANY_STREAMS=N for more) are all accepted and held
// at once (queued behind --max-num-seqs 1 and a long first request), then all complete with
// exactly max_tokens tokens, and the server stays up. It prints the server's resident memory
// per waiting stream.
import assert from 'node:assert/strict';
import http from 'node:http';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { startServer, run, test, metrics } from './lib.mjs';

// The demo model (its 2,000-token request holds the slot long enough on a slow machine);
// MANY_MODEL=DIR serves another model folder.
const DIR = process.env.MANY_MODEL || new URL('../../../models/demo', import.meta.url).pathname;
const MODEL = basename(DIR);
const N = Number(process.env.MANY_STREAMS || 2000);
const MAX_TOKENS = 3;
const hard = execFileSync('/bin/sh', ['-c', 'ulimit -Hn']).toString().trim();
const soft = hard === 'unlimited' || Number(hard) > 1024 ? 1024 : 0;
const srv = await startServer(DIR, ['--max-num-seqs', '1'], { softNofile: soft });
const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });

// One streamed completion; resolves with its status, text chunks, usage and finish reason.
function stream(body, onResponse) {
  return new Promise((resolve, reject) => {
    const req = http.request(`${srv.base}/v1/completions`, {
      method: 'POST', agent, headers: { 'content-type': 'application/json' },
    }, (res) => {
      if (onResponse) onResponse(req);
      let buf = '', chunks = 0, usage = null, finish = null, done = false;
      res.setEncoding('utf8');
      res.on('data', (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (!ev.startsWith('data: ')) continue;
          const data = ev.slice(6);
          if (data === '[DONE]') { done = true; continue; }
          const j = JSON.parse(data);
          if (j.usage) usage = j.usage;
          if (j.choices?.length) {
            chunks++;
            if (j.choices[0].finish_reason) finish = j.choices[0].finish_reason;
          }
        }
      });
      res.on('end', () => resolve({ status: res.statusCode, chunks, usage, finish, done }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(JSON.stringify({ model: MODEL, prompt: [1, 2, 3], stream: true, ...body,
      stream_options: { include_usage: true } }));
  });
}

await run([
  test('the open-files soft limit is raised to the hard one, and said so', async () => {
    if (!soft) return; // the hard limit is 1024 or less: nothing to raise
    assert.match(srv.log(), new RegExp(`open files limit raised from 1024 to ${hard}\\n`));
  }),
  test(`${N} concurrent streams: all accepted at once, all complete with ${MAX_TOKENS} tokens`,
    async () => {
      // The long request holds the only running slot until every stream waits.
      let holder = null;
      const long = stream({ max_tokens: 2000, ignore_eos: true, temperature: 0 },
        (req) => { holder = req; }).catch(() => null);
      while (!holder || (await metrics(srv.base))['pagoda_requests_running'] !== 1)
        await new Promise((res) => setTimeout(res, 10));
      const rss = () => Number(/VmRSS:\s*(\d+)/.exec(
        readFileSync(`/proc/${srv.proc.pid}/status`, 'utf8'))[1]);
      const rss0 = rss();
      const t0 = Date.now();
      const jobs = [];
      for (let i = 0; i < N; i++)
        jobs.push(stream({ max_tokens: MAX_TOKENS, ignore_eos: true, temperature: 0 }));
      let m;
      for (;;) {
        m = await metrics(srv.base);
        if (m['pagoda_requests_waiting'] === N) break;
        assert.ok(Date.now() - t0 < 30000, `waiting ${m["pagoda_requests_waiting"]} of ${N}, running ${m["pagoda_requests_running"]}, streams ${m["pagoda_http_active_streams"]}`);
        await new Promise((res) => setTimeout(res, 100));
      }
      assert.equal(m['pagoda_http_active_streams'], N + 1);
      await new Promise((res) => setTimeout(res, 500));
      const rssN = rss();
      console.log(`server RSS ${rss0} kB with 1 stream, ${rssN} kB with ${N} more waiting: ` +
        `${Math.round((rssN - rss0) * 1024 / N)} bytes per waiting stream`);
      holder.destroy(); // the waiting ones now run
      await long;
      const rs = await Promise.all(jobs);
      const bad = rs.filter((r) => r.status !== 200 || r.chunks < 1 || !r.done ||
        r.finish !== 'length' || r.usage?.completion_tokens !== MAX_TOKENS);
      assert.equal(bad.length, 0, JSON.stringify(bad.slice(0, 3)));
      const h = await fetch(`${srv.base}/health`);
      assert.equal(h.status, 200);
    }),
]);
await srv.stop();
