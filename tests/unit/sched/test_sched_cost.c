/*
 * The step-time model and the planner under --max-step-ms:
 *   - the least-squares fit recovers a known model exactly (to rounding) and drops a
 *     negative slope; too few or too alike samples fit nothing;
 *   - sched_cost_fit_tokens gives the largest chunk under the bound (exact counts);
 *   - on llama-tiny (manual steps) with a fixed model of 1 ms a step + 1 ms a row and a
 *     bound of 19.5 ms (18 rows), each step's decode rows and prefill tokens are exactly
 *     those the bound allows (a cut chunk ends at a block), a prefill chunk of one request
 *     spreads over steps, and a
 *     bound below the decode rows alone still admits a block of prefill a step;
 *   - --long-prefill-token-threshold caps a chunk; swap preemption without a host tier (none
 *     on the CPU) and an fcfs request with a priority are refused with messages naming the
 *     option.
 * usage: test_sched_cost TESTDATA_DIR
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "sched/cost.h"
#include "sched/engine_impl.h"
#include "test_util.h"

static void test_fit(void)
{
    struct sched_fit f = {0};
    double a = -1, b = -1, c = -1;
    CHECK(!sched_fit_solve(&f, 1, &a, &b, &c) && a == -1, "empty fit solved");
    /* t = 2 ms + 0.5 ms a row + 1 us a key, rows and keys varied independently */
    for (int i = 0; i < 40; i++) {
        double rows = 1 + i % 7, keys = 100.0 * (i % 5) + 37 * (i % 3);
        sched_fit_add(&f, 0.99, rows, keys, 2e-3 + 0.5e-3 * rows + 1e-6 * keys);
    }
    CHECK(sched_fit_solve(&f, 1, &a, &b, &c), "no fit");
    /* tolerance: sums of 40 products in double, relative 1e-9 */
    CHECK(fabs(a - 2e-3) < 1e-11 && fabs(b - 0.5e-3) < 1e-12 && fabs(c - 1e-6) < 1e-14,
          "fit a %.12g b %.12g c %.12g", a, b, c);
    /* without the second regressor: t on rows alone (keys fixed) */
    struct sched_fit g = {0};
    for (int i = 0; i < 10; i++) sched_fit_add(&g, 0.98, 1 + i % 5, 0, (2 + i % 5) * 1e-3);
    CHECK(sched_fit_solve(&g, 0, &a, &b, &c) && fabs(a - 1e-3) < 1e-12 && fabs(b - 1e-3) < 1e-12,
          "rows fit a %.12g b %.12g", a, b);
    /* a step that gets cheaper with more keys: that slope is dropped, rows alone */
    struct sched_fit h = {0};
    for (int i = 0; i < 20; i++) {
        double rows = 1 + i % 4, keys = 10.0 * (i % 3);
        sched_fit_add(&h, 1, rows, keys, 1e-3 * rows - 1e-5 * keys + 5e-3);
    }
    CHECK(sched_fit_solve(&h, 1, &a, &b, &c) && c == 0 && b > 0, "negative slope: b %g c %g", b, c);
    /* every sample alike: the slopes cannot be told */
    struct sched_fit k = {0};
    for (int i = 0; i < 20; i++) sched_fit_add(&k, 0.99, 16, 2000, 0.1);
    CHECK(!sched_fit_solve(&k, 1, &a, &b, &c), "alike samples solved");
}

static void test_fit_tokens(void)
{
    struct sched_cost m = {.a = 1e-3, .b = 1e-3, .c = 0, .ready = 1};
    /* 4 rows already: 1 + (4 + n) <= 19.5 ms -> n = 14 */
    CHECK(sched_cost_fit_tokens(&m, 19.5e-3, 4, 0, 0, 100) == 14, "got %d",
          sched_cost_fit_tokens(&m, 19.5e-3, 4, 0, 0, 100));
    CHECK(sched_cost_fit_tokens(&m, 19.5e-3, 4, 0, 0, 9) == 9, "whole want");
    CHECK(sched_cost_fit_tokens(&m, 0.5e-3, 0, 0, 0, 9) == 0, "nothing fits");
    /* keys: 0.1 ms a key; 20 tokens after 10 read 20 * 10 + 210 = 410 keys */
    CHECK(sched_cost_keys(10, 20) == 410, "keys %g", sched_cost_keys(10, 20));
    struct sched_cost q = {.a = 0, .b = 0, .c = 1e-4, .ready = 1};
    /* n tokens after 10 read 10n + n(n+1)/2 keys, at most 100: 7 (98; 8 would read 116) */
    CHECK(sched_cost_fit_tokens(&q, 100e-4 + 1e-9, 0, 0, 10, 50) == 7, "keys: %d",
          sched_cost_fit_tokens(&q, 100e-4 + 1e-9, 0, 0, 10, 50));
}

/* ---- the planner on llama-tiny ---- */

static char model[512];

static void on_event(void *user, const struct engine_event *ev)
{
    (void)user;
    (void)ev;
}

static struct engine *open_engine(double max_step_ms, int threshold)
{
    struct engine_config cfg = {.model_dir = model,
                                .manual = 1,
                                .threads = 1,
                                .overlap = -1,
                                .max_step_ms = max_step_ms,
                                .long_prefill_token_threshold = threshold,
                                .disable_prefix_caching = 1};
    struct err e = {0};
    struct engine *en = engine_create(&cfg, &e);
    CHECK(en != NULL, "engine_create: %s", e.msg);
    if (!en) return NULL;
    /* a fixed model: 1 ms a step and 1 ms a row, keys free */
    en->cost = (struct sched_cost){.a = 1e-3, .b = 1e-3, .c = 0, .ready = 1, .fixed = 1};
    return en;
}

static uint64_t submit(struct engine *en, int n_prompt, int priority)
{
    int32_t prompt[256];
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)(1 + (i * 7) % 50);
    struct engine_request q = {.prompt = prompt, .n_prompt = n_prompt, .priority = priority};
    sampling_params_default(&q.sp);
    q.sp.temperature = 0;
    q.sp.max_tokens = 8;
    q.sp.ignore_eos = 1;
    q.on_event = on_event;
    struct err e = {0};
    uint64_t id = engine_submit(en, &q, &e);
    CHECK(id > 0, "submit: %s", e.msg);
    return id;
}

/* One step; its decode rows and prefill tokens. */
static void step(struct engine *en, int *decode, int *prefill)
{
    struct engine_stats a, b;
    engine_stats(en, &a);
    engine_step(en);
    engine_stats(en, &b);
    *decode = (int)(b.step_decode_rows - a.step_decode_rows);
    *prefill = (int)(b.step_prefill_tokens - a.step_prefill_tokens);
}

static void expect_steps(struct engine *en, const char *what, const int (*want)[2], int n)
{
    for (int s = 0; s < n; s++) {
        int d, p;
        step(en, &d, &p);
        CHECK(d == want[s][0] && p == want[s][1],
              "%s step %d: %d decode + %d prefill, want %d + %d", what, s + 1, d, p, want[s][0],
              want[s][1]);
    }
}

static void test_planner(void)
{
    /* 18 rows a step: A (50 tokens) and B (30) arrive together */
    struct engine *en = open_engine(19.5, 0);
    if (!en) return;
    submit(en, 50, 0);
    submit(en, 30, 0);
    static const int want[][2] = {
        {0, 16}, /* A's first 18 fit, cut to a block; B would pass the bound */
        {0, 16}, /* A's next 16 */
        {0, 18}, /* A's last 18 (its first token): whole, nothing left for B */
        {1, 16}, /* A decodes; B's first 17 cut to a block */
        {1, 14}, /* B's last 14 */
        {2, 0},  /* both decode */
    };
    expect_steps(en, "bound 19.5 ms", want, 6);
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.steps_time_capped == 4, "capped steps %llu", (unsigned long long)st.steps_time_capped);
    engine_destroy(en);

    /* A bound below one step: decode rows run, and a block (16 tokens) of prefill a step */
    en = open_engine(0.5, 0);
    if (!en) return;
    submit(en, 20, 0);
    static const int floor_steps[][2] = {{0, 16}, {0, 4}, {1, 0}};
    expect_steps(en, "bound 0.5 ms, first", floor_steps, 2);
    submit(en, 40, 0);
    static const int with_decode[][2] = {{1, 16}, {1, 16}, {1, 8}, {2, 0}};
    expect_steps(en, "bound 0.5 ms, second", with_decode, 4);
    engine_destroy(en);

    /* No bound, the threshold alone: chunks of 12 */
    en = open_engine(0, 12);
    if (!en) return;
    submit(en, 30, 0);
    submit(en, 5, 0);
    static const int thr[][2] = {{0, 17}, {1, 12}, {1, 6}, {2, 0}};
    expect_steps(en, "threshold 12", thr, 4);
    engine_destroy(en);
}

static void test_refusals(void)
{
    struct engine_config cfg = {.model_dir = model, .manual = 1, .threads = 1};
    struct err e = {0};
    cfg.preemption_mode = PREEMPTION_SWAP;
    struct engine *en = engine_create(&cfg, &e);
    CHECK(!en && strstr(e.msg, "--preemption-mode swap: needs a host KV tier"), "swap: %s", e.msg);
    cfg.kv_host_memory = 1 << 20; /* the CPU backend has no host tier to give */
    en = engine_create(&cfg, &e);
    CHECK(!en && strstr(e.msg, "--kv-host-memory"), "swap, host memory on the CPU: %s", e.msg);
    cfg.kv_host_memory = 0;
    cfg.preemption_mode = PREEMPTION_RECOMPUTE;
    cfg.max_step_ms = -1;
    en = engine_create(&cfg, &e);
    CHECK(!en && strstr(e.msg, "--max-step-ms"), "negative bound: %s", e.msg);
    cfg.max_step_ms = NAN;
    en = engine_create(&cfg, &e);
    CHECK(!en && strstr(e.msg, "--max-step-ms"), "NaN bound: %s", e.msg);
    cfg.max_step_ms = 0;
    cfg.long_prefill_token_threshold = -2;
    en = engine_create(&cfg, &e);
    CHECK(!en && strstr(e.msg, "--long-prefill-token-threshold"), "threshold: %s", e.msg);
    cfg.long_prefill_token_threshold = 0;
    cfg.scheduling_policy = SCHED_POLICY_FCFS;
    en = engine_create(&cfg, &e);
    CHECK(en != NULL, "fcfs: %s", e.msg);
    if (!en) return;
    int32_t p[4] = {1, 2, 3, 4};
    struct engine_request q = {.prompt = p, .n_prompt = 4, .priority = 3, .on_event = on_event};
    sampling_params_default(&q.sp);
    e.msg[0] = 0;
    CHECK(engine_submit(en, &q, &e) == 0 && strstr(e.msg, "priority"), "fcfs priority: %s", e.msg);
    q.priority = 0;
    CHECK(engine_submit(en, &q, &e) > 0, "fcfs: %s", e.msg);
    engine_destroy(en);
}

int main(int argc, char **argv)
{
    test_fit();
    test_fit_tokens();
    if (argc > 1) {
        snprintf(model, sizeof model, "%s/models/llama-tiny", argv[1]);
        test_planner();
        test_refusals();
    }
    TEST_DONE();
}
