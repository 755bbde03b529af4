/*
 * The disk tier through the engine (llama-tiny, manual steps): a prompt computed by one
 * engine is loaded by the next on the same directory, while another request steps (the
 * loading one waits aside); its cached tokens and its greedy output match; a request
 * aborted while loading gives its blocks back; hybrid models keep the tier off; the CPU
 * backend refuses a host-memory tier (its pool is host memory).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sched/engine.h"
#include "test_util.h"

#define N_PROMPT 600
#define N_OUT    8

struct out {
    int32_t ids[N_OUT];
    int n, n_cached;
    enum finish_reason finish;
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct out *o = user;
    if (ev->kind == ENGINE_EV_TOKEN && o->n < N_OUT) o->ids[o->n++] = ev->token;
    o->n_cached = ev->n_cached;
    if (ev->finish != FINISH_NONE) o->finish = ev->finish;
}

static char model[512], disk[128];

static struct engine *open_engine(const char *dir_model)
{
    struct engine_config cfg = {.model_dir = dir_model,
                                .device = "cpu",
                                .manual = 1,
                                .threads = 1,
                                .max_num_batched_tokens = 256,
                                .kv_disk_dir = disk,
                                .kv_disk_size = (size_t)64 << 20};
    struct err e = {0};
    struct engine *en = engine_create(&cfg, &e);
    CHECK(en, "engine_create: %s", e.msg);
    return en;
}

static uint64_t submit(struct engine *en, const int32_t *p, int n, struct out *o)
{
    struct engine_request q = {.prompt = p, .n_prompt = n, .on_event = on_event, .user = o};
    sampling_params_default(&q.sp);
    q.sp.temperature = 0;
    q.sp.max_tokens = N_OUT;
    q.sp.ignore_eos = 1;
    struct err e = {0};
    uint64_t id = engine_submit(en, &q, &e);
    CHECK(id, "submit: %s", e.msg);
    return id;
}

static void run_all(struct engine *en)
{
    for (int i = 0; i < 100000 && engine_step(en); i++) {
    }
}

/* The writer stores behind the steps: wait until the disk holds n blocks. */
static void wait_stored(struct engine *en, uint64_t n)
{
    struct engine_stats st;
    for (int i = 0; i < 5000; i++) {
        engine_step(en); /* publishes the gauges */
        engine_stats(en, &st);
        if (st.tier.disk.blocks >= n) return;
        usleep(1000);
    }
    CHECK(0, "stored %llu of %llu blocks", (unsigned long long)st.tier.disk.blocks,
          (unsigned long long)n);
}

int main(int argc, char **argv)
{
    const char *testdata = argc > 1 ? argv[1] : "../shared/testdata";
    snprintf(model, sizeof model, "%s/models/llama-tiny", testdata);
    snprintf(disk, sizeof disk, "/tmp/pagoda-test-tier-%ld", (long)getpid());
    int32_t p[N_PROMPT], q[100];
    for (int i = 0; i < N_PROMPT; i++) p[i] = 3 + (i * 7919 + 13) % 1000;
    for (int i = 0; i < 100; i++) q[i] = 5 + (i * 31) % 1000;

    struct engine *en = open_engine(model);
    if (!en) TEST_DONE();
    struct out cold = {0};
    submit(en, p, N_PROMPT, &cold);
    run_all(en);
    CHECK(cold.n == N_OUT && cold.n_cached == 0, "cold: %d tokens, %d cached", cold.n,
          cold.n_cached);
    /* the prompt's 37 full blocks and the output's (608 tokens: 38) */
    wait_stored(en, N_PROMPT / 16);
    engine_destroy(en);

    en = open_engine(model);
    struct out warm = {0}, other = {0};
    submit(en, p, N_PROMPT, &warm);
    submit(en, q, 100, &other);
    engine_step(en);
    struct engine_stats st;
    engine_stats(en, &st);
    /* the first step runs the other request's 100 prompt tokens only: the first waits for
     * its blocks */
    CHECK(st.prompt_tokens == 100, "first step prefilled %llu tokens",
          (unsigned long long)st.prompt_tokens);
    run_all(en);
    CHECK(warm.n_cached == N_PROMPT / 16 * 16, "warm: %d cached", warm.n_cached);
    CHECK(warm.n == N_OUT && !memcmp(warm.ids, cold.ids, sizeof cold.ids),
          "the same greedy tokens from loaded KV");
    CHECK(other.n == N_OUT, "the other request ran");
    engine_stats(en, &st);
    CHECK(st.tier_hit_tokens == (uint64_t)warm.n_cached, "hit tokens %llu",
          (unsigned long long)st.tier_hit_tokens);
    CHECK(st.kv_blocks_used == 0, "no block held: %d", st.kv_blocks_used);
    engine_destroy(en);

    /* aborted while loading: its blocks go back, nothing is written into them later */
    en = open_engine(model);
    struct out gone = {0};
    uint64_t id = submit(en, p, N_PROMPT, &gone);
    engine_step(en); /* starts the load */
    engine_abort(en, id);
    run_all(en);
    CHECK(gone.finish == FINISH_ABORT, "aborted: %d", gone.finish);
    engine_stats(en, &st);
    CHECK(st.kv_blocks_used == 0, "no block held after the abort: %d", st.kv_blocks_used);
    struct out again = {0};
    submit(en, p, N_PROMPT, &again);
    run_all(en);
    CHECK(again.n == N_OUT && !memcmp(again.ids, cold.ids, sizeof cold.ids), "after the abort");
    engine_destroy(en);

    /* a hybrid model: the tier stays off */
    char hybrid[512];
    snprintf(hybrid, sizeof hybrid, "%s/models/qwen3_5-tiny", testdata);
    en = open_engine(hybrid);
    if (en) {
        engine_step(en);
        engine_stats(en, &st);
        CHECK(!st.tier_on, "no tier for a hybrid model");
        engine_destroy(en);
    }
    /* --kv-host-memory on the CPU backend: refused, saying why */
    struct engine_config hc = {.model_dir = model,
                               .device = "cpu",
                               .manual = 1,
                               .threads = 1,
                               .kv_host_memory = (size_t)64 << 20};
    struct err e = {0};
    en = engine_create(&hc, &e);
    CHECK(!en &&
              strstr(e.msg, "--kv-host-memory: the cpu backend keeps the KV pool in host memory"),
          "refused: %s", e.msg);
    engine_destroy(en);

    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    CHECK(system(cmd) == 0, "rm");
    TEST_DONE();
}
