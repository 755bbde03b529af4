/* Trace files for replay (Azure CSV, Mooncake JSON lines), the prompts built from them, and
 * the server process control of server sweeps. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/hc.h"
#include "bench/server.h"
#include "bench/trace.h"
#include "common/util.h"
#include "test_util.h"

/* Relative times are differences of decimal fractions (100 ns ticks) in binary doubles:
 * exact to well below a nanosecond, not to the last bit. */
#define NEAR_T(a, b) (fabs((a) - (b)) < 1e-9)

struct want {
    double t;
    int in, out, line, n_hash;
};

static void check_reqs(const char *what, const struct trace *t, const struct want *w, int n)
{
    CHECK(t->n == n, "%s: %d requests", what, t->n);
    for (int i = 0; i < n && i < t->n; i++) {
        const struct trace_req *r = &t->r[i];
        CHECK(NEAR_T(r->t, w[i].t), "%s[%d]: t %.9f, want %.9f", what, i, r->t, w[i].t);
        CHECK(r->input_len == w[i].in, "%s[%d]: input %d", what, i, r->input_len);
        CHECK(r->output_len == w[i].out, "%s[%d]: output %d", what, i, r->output_len);
        CHECK(r->line == w[i].line, "%s[%d]: line %d", what, i, r->line);
        CHECK(r->n_hash == w[i].n_hash, "%s[%d]: %d hash ids", what, i, r->n_hash);
    }
}

static void test_azure(void)
{
    struct trace t;
    struct err e = {{0}};
    CHECK(trace_load("tests/data/trace_azure.csv", &t, &e) == 0, "%s", e.msg);
    CHECK(t.format == TRACE_AZURE, "format");
    /* sorted by time; the two requests at 18:15:51.1345400 keep the file's order */
    const struct want w[] = {{0, 374, 44, 2, 0},
                             {1.3194100, 2048, 0, 6, 0},
                             {4.3145790, 396, 109, 3, 0},
                             {4.4539500, 879, 55, 4, 0},
                             {4.4539500, 91, 16, 5, 0}};
    check_reqs("azure 2023", &t, w, 5);
    CHECK(trace_count(&t, 1, 0, 0) == 5, "all");
    CHECK(trace_count(&t, 1, 4.4, 0) == 3, "before 4.4 s: %d", trace_count(&t, 1, 4.4, 0));
    CHECK(trace_count(&t, 2, 2.2, 0) == 3, "x2 before 2.2 s");
    CHECK(trace_count(&t, 1, 0, 2) == 2, "the first 2");
    CHECK(trace_count(&t, 1, 4.4, 1) == 1, "both cuts");
    trace_free(&t);

    /* 2024 layout: columns in another order, an extra column, CRLF, a blank line, time
     * zones, a day boundary */
    CHECK(trace_load("tests/data/trace_azure_2024.csv", &t, &e) == 0, "%s", e.msg);
    const struct want w2[] = {{0, 100, 7, 2, 0}, {0.75, 200, 8, 4, 0}, {0.75, 300, 9, 5, 0}};
    check_reqs("azure 2024", &t, w2, 3);
    trace_free(&t);
}

static void test_mooncake(void)
{
    struct trace t;
    struct err e = {{0}};
    CHECK(trace_load("tests/data/trace_mooncake.jsonl", &t, &e) == 0, "%s", e.msg);
    CHECK(t.format == TRACE_MOONCAKE, "format");
    const struct want w[] = {{0, 1200, 50, 1, 3},
                             {0, 1100, 20, 2, 3},
                             {3.052, 600, 7, 3, 2},
                             {4.1005, 1600, 1, 5, 2},
                             {5.0, 10, 0, 6, 0}};
    check_reqs("mooncake", &t, w, 5);
    if (t.n == 5) {
        CHECK(t.r[1].hash_ids[0] == 0 && t.r[1].hash_ids[1] == 1 && t.r[1].hash_ids[2] == 3,
              "hash ids of line 2");
        CHECK(t.r[4].hash_ids == NULL, "no hash ids");
    }

    /* prompts: token ids below 1000, blocks of 512 */
    struct dataset_cfg cfg = {.token_ids = 1, .vocab_size = 1000, .seed = 3};
    struct dataset ds;
    CHECK(trace_build(&t, 5, 2, 2.0, 512, &cfg, &ds, &e) == 0, "%s", e.msg);
    CHECK(ds.n == 7, "5 requests and 2 warm-up prompts: %d", ds.n);
    const int in[] = {1200, 1100, 600, 1600, 10, 1200, 1200};
    const int out[] = {50, 20, 7, 1, 1, 50, 50}; /* output 0 asks for 1 */
    const double arr[] = {0, 0, 1.526, 2.05025, 2.5, 0, 0};
    for (int i = 0; i < ds.n && i < 7; i++) {
        CHECK(ds.p[i].n_ids == in[i] && ds.p[i].input_len == in[i], "prompt %d: %d ids", i,
              ds.p[i].n_ids);
        CHECK(ds.p[i].output_len == out[i], "prompt %d: max_tokens %d", i, ds.p[i].output_len);
        CHECK(NEAR_T(ds.p[i].arrival, arr[i]), "prompt %d: arrival %.9f", i, ds.p[i].arrival);
    }
    if (ds.n == 7) {
        const int32_t *a = ds.p[0].ids, *b = ds.p[1].ids, *c = ds.p[2].ids, *d = ds.p[3].ids;
        /* blocks 0 and 1 are shared by requests 0, 1 and 3; block 0 by request 2 */
        CHECK(!memcmp(a, b, 1024 * sizeof *a), "requests 0 and 1 share 1,024 tokens");
        CHECK(!memcmp(a, d, 1024 * sizeof *a), "requests 0 and 3 share 1,024 tokens");
        CHECK(!memcmp(a, c, 512 * sizeof *a), "requests 0 and 2 share 512 tokens");
        /* and nothing more: block 2 against block 3, block 1 against block 4 */
        CHECK(memcmp(a + 1024, b + 1024, 76 * sizeof *a), "blocks 2 and 3 differ");
        CHECK(memcmp(a + 512, c + 512, 88 * sizeof *a), "blocks 1 and 4 differ");
        /* request 3's tokens after its two blocks are its own */
        CHECK(memcmp(d + 1024, a + 1024, 176 * sizeof *a), "unshared tail");
        /* warm-up prompts share nothing with the trace or each other */
        CHECK(memcmp(ds.p[5].ids, a, 16 * sizeof *a) && memcmp(ds.p[5].ids, ds.p[6].ids, 64),
              "warm-up prompts are fresh");
        int below = 1;
        for (int i = 0; i < ds.p[3].n_ids; i++) below &= d[i] >= 0 && d[i] < 1000;
        CHECK(below, "ids below the vocabulary size");
    }
    /* a block's tokens depend on its hash id and the seed only: the same on a rebuild */
    struct dataset ds2;
    CHECK(trace_build(&t, 3, 0, 1.0, 512, &cfg, &ds2, &e) == 0, "%s", e.msg);
    CHECK(ds2.n == 3 && !memcmp(ds2.p[2].ids, ds.p[2].ids, 600 * sizeof(int32_t)), "deterministic");
    CHECK(NEAR_T(ds2.p[2].arrival, 3.052), "speed-up 1");
    dataset_free(&ds2);
    dataset_free(&ds);

    /* --output-len overrides the trace; a smaller block size shares less */
    cfg.output_len = 9;
    CHECK(trace_build(&t, 2, 0, 1.0, 100, &cfg, &ds, &e) == 0, "%s", e.msg);
    CHECK(ds.p[0].output_len == 9 && ds.p[1].output_len == 9, "--output-len");
    CHECK(!memcmp(ds.p[0].ids, ds.p[1].ids, 200 * sizeof(int32_t)) &&
              memcmp(ds.p[0].ids + 200, ds.p[1].ids + 200, 100 * sizeof(int32_t)),
          "blocks of 100: 200 tokens shared");
    dataset_free(&ds);
    CHECK(trace_build(&t, 6, 0, 1.0, 512, &cfg, &ds, &e) == -1 &&
              !strcmp(e.msg, "trace: 6 requests asked, the trace has 5"),
          "%s", e.msg);
    trace_free(&t);
}

/* One malformed trace: the message names the file, the line and the problem. */
static void bad(const char *text, const char *want)
{
    struct trace t;
    struct err e = {{0}};
    int rc = trace_parse("t", text, &t, &e);
    CHECK(rc == -1 && !strcmp(e.msg, want), "%s\n  got:  %s\n  want: %s", text, e.msg, want);
    CHECK(t.n == 0 && t.r == NULL, "nothing left after an error");
}

static void test_malformed(void)
{
    struct trace t;
    struct err e = {{0}};
    CHECK(trace_load("tests/data/trace_bad_azure.csv", &t, &e) == -1 &&
              !strcmp(e.msg, "tests/data/trace_bad_azure.csv:3: 2 fields, the header has 3"),
          "%s", e.msg);
    CHECK(trace_load("tests/data/trace_bad_mooncake.jsonl", &t, &e) == -1 &&
              !strcmp(e.msg, "tests/data/trace_bad_mooncake.jsonl:2: hash_ids[1] is not an "
                             "integer >= 0"),
          "%s", e.msg);
    CHECK(trace_load("tests/data/no_such_trace.csv", &t, &e) == -1 &&
              strstr(e.msg, "tests/data/no_such_trace.csv"),
          "%s", e.msg);

    const char *hdr = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
    char buf[256];
    bad("", "t: no requests in the trace");
    bad(hdr, "t: no requests in the trace");
    bad("TIMESTAMP,Context,GeneratedTokens\n1,2,3\n",
        "t:1: not a trace: the CSV header has no ContextTokens column (expected "
        "TIMESTAMP,ContextTokens,GeneratedTokens, or Mooncake JSON lines)");
    snprintf(buf, sizeof buf, "%s2023-13-01 00:00:00,1,1\n", hdr);
    bad(buf, "t:2: TIMESTAMP \"2023-13-01 00:00:00\": expected YYYY-MM-DD HH:MM:SS[.fraction] "
             "or seconds");
    snprintf(buf, sizeof buf, "%s2023-11-16 18:15:46.,1,1\n", hdr);
    bad(buf, "t:2: TIMESTAMP \"2023-11-16 18:15:46.\": expected YYYY-MM-DD HH:MM:SS[.fraction] "
             "or seconds");
    snprintf(buf, sizeof buf, "%s\n1.5,0,1\n", hdr);
    bad(buf, "t:3: ContextTokens \"0\": expected an integer in [1, 100000000]");
    snprintf(buf, sizeof buf, "%s1.5,12abc,1\n", hdr);
    bad(buf, "t:2: ContextTokens \"12abc\": expected an integer in [1, 100000000]");
    snprintf(buf, sizeof buf, "%s1.5,12,-1\n", hdr);
    bad(buf, "t:2: GeneratedTokens \"-1\": expected an integer in [0, 100000000]");
    bad("{\"timestamp\": 1, \"input_length\": 0, \"output_length\": 1}\n",
        "t:1: \"input_length\" must be an integer in [1, 100000000]");
    bad("{\"timestamp\": 1, \"input_length\": 1.5, \"output_length\": 1}\n",
        "t:1: \"input_length\" must be an integer in [1, 100000000]");
    bad("{\"timestamp\": 1, \"input_length\": 5}\n",
        "t:1: \"output_length\" must be an integer in [0, 100000000]");
    bad("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1}\n{\"input_length\": 5}\n",
        "t:2: \"timestamp\" must be a number of milliseconds >= 0");
    bad("{\"timestamp\": -1, \"input_length\": 5, \"output_length\": 1}\n",
        "t:1: \"timestamp\" must be a number of milliseconds >= 0");
    bad("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1}\n[1]\n",
        "t:2: not a JSON object (Mooncake traces have one a line)");
    bad("{\"timestamp\": 1, \"input_length\": 5,\n",
        "t:1: not a JSON object (Mooncake traces have one a line)");
    bad("{\"timestamp\": 1, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": 3}\n",
        "t:1: \"hash_ids\" must be an array of integers");
}

/* The server control of sweeps, on shell commands standing in for servers. */
static void test_server(void)
{
    struct err e = {{0}};
    struct hc_url url;
    CHECK(hc_url_parse("http://127.0.0.1:1", &url, &e) == 0, "%s", e.msg);
    struct hc *c = hc_create(&url, HC_HTTP1, 1, NULL, NULL, &e);
    CHECK(c != NULL, "%s", e.msg);

    /* exits before answering: the status is in the message */
    struct server *s = server_start("exit", "3", NULL, &e);
    CHECK(s != NULL, "%s", e.msg);
    CHECK(server_wait_ready(s, c, 10, NULL, &e) == -1 &&
              !strcmp(e.msg, "the server exited before it was ready (exit status 3)"),
          "%s", e.msg);
    CHECK(server_stop(s, 1) == 3, "exit status 3");

    /* never answers: the timeout */
    s = server_start("sleep 30", NULL, NULL, &e);
    double t0 = util_now();
    CHECK(server_wait_ready(s, c, 0.3, NULL, &e) == -1 &&
              !strcmp(e.msg, "the server did not answer /health or /v1/models within 0.3 s"),
          "%s", e.msg);
    int st = server_stop(s, 5);
    CHECK(st == 128 + SIGTERM, "SIGTERM ends it: %d", st);
    CHECK(util_now() - t0 < 5, "without waiting out the grace period");

    /* ignores SIGTERM: SIGKILL after the grace period, and its child goes with it */
    s = server_start("trap '' TERM; sleep 30 & wait; sleep 30", NULL, NULL, &e);
    nanosleep(&(struct timespec){0, 200000000}, NULL); /* let sh set its trap */
    t0 = util_now();
    st = server_stop(s, 0.5);
    double took = util_now() - t0;
    CHECK(st == -1, "killed: %d", st);
    CHECK(took >= 0.5 && took < 5, "after the grace period: %.2f s", took);
    hc_destroy(c);
}

int main(void)
{
    test_azure();
    test_mooncake();
    test_malformed();
    test_server();
    TEST_DONE();
}
