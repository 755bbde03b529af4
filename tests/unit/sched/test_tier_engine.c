/*
 * The disk tier through the engine (llama-tiny, manual steps): a prompt computed by one
 * engine is loaded by the next on the same directory, while another request steps (the
 * loading one waits aside); its cached tokens and its greedy output match; a request
 * aborted while loading gives its blocks back; a hybrid model (qwen3_5-tiny) stores its
 * recurrent-state snapshot beside the blocks and resumes from both after a restart with the
 * same greedy tokens, and a damaged or missing snapshot is a miss that is recomputed; a
 * model split two ways stores each rank's share of a block and loads them back (the same
 * greedy tokens), and a directory it wrote is not read by the model whole; the CPU backend
 * refuses a host-memory tier (its pool is host memory).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "paged_kv/kv_disk.h"
#include "sched/engine.h"
#include "test_util.h"
#include "tier_util.h"

#define N_PROMPT 600
#define N_OUT    TIER_OUT

static char model[512], disk[128];

static int small_pool; /* blocks of the pool when set (a 300-token context) */
static int tp_size;    /* --tensor-parallel-size when set */

static struct engine *open_engine(const char *dir_model)
{
    struct engine_config cfg = {.model_dir = dir_model,
                                .num_blocks = small_pool,
                                .max_model_len = small_pool ? 300 : 0,
                                .device = "cpu",
                                .manual = 1,
                                .threads = 1,
                                .max_num_batched_tokens = 256,
                                .kv_disk_dir = disk,
                                .kv_disk_size = (size_t)64 << 20,
                                .tensor_parallel_size = tp_size};
    struct err e = {0};
    struct engine *en = engine_create(&cfg, &e);
    CHECK(en, "engine_create: %s", e.msg);
    return en;
}

static void run_all(struct engine *en)
{
    for (int i = 0; i < 100000 && engine_step(en); i++) {
    }
}

/* The writer stores behind the steps: wait until the disk holds n blocks and n_states
 * state snapshots. */
static void wait_stored_states(struct engine *en, uint64_t n, uint64_t n_states)
{
    struct engine_stats st;
    for (int i = 0; i < 5000; i++) {
        engine_step(en); /* publishes the gauges */
        engine_stats(en, &st);
        if (st.tier.disk.blocks >= n && st.tier.disk.states >= n_states) return;
        usleep(1000);
    }
    CHECK(0, "stored %llu of %llu blocks, %llu of %llu snapshots",
          (unsigned long long)st.tier.disk.blocks, (unsigned long long)n,
          (unsigned long long)st.tier.disk.states, (unsigned long long)n_states);
}

static void wait_stored(struct engine *en, uint64_t n)
{
    wait_stored_states(en, n, 0);
}

/* Alters every state-snapshot record read ("PKS1"), as a damaged disk would. */
static ssize_t damage_snapshots(int fd, void *buf, size_t n, off_t off, ssize_t res)
{
    (void)fd, (void)off;
    uint32_t magic;
    memcpy(&magic, buf, sizeof magic);
    if (magic == 0x31534b50u && res > 0) ((unsigned char *)buf)[n - 1] ^= 1;
    return res;
}

#define H_PROMPT 200 /* 12 full blocks: the snapshot after block 12 (192 tokens) */

/* llama-tiny split over two CPU ranks through the disk tier across an engine restart: the
 * blocks' images hold both ranks' shares; the same model whole refuses them (another
 * fingerprint). */
static void test_split(const int32_t *p)
{
    char saved[128];
    snprintf(saved, sizeof saved, "%s", disk);
    snprintf(disk, sizeof disk, "%.100s-tp", saved);
    tp_size = 2;
    struct engine *en = open_engine(model);
    if (!en) return;
    struct out cold = {0};
    submit(en, p, N_PROMPT, &cold);
    run_all(en);
    CHECK(cold.n == N_OUT && cold.n_cached == 0, "split cold: %d tokens, %d cached", cold.n,
          cold.n_cached);
    wait_stored(en, N_PROMPT / 16);
    engine_destroy(en);

    en = open_engine(model);
    struct out warm = {0};
    submit(en, p, N_PROMPT, &warm);
    run_all(en);
    CHECK(warm.n_cached == N_PROMPT / 16 * 16, "split warm: %d cached", warm.n_cached);
    CHECK(warm.n == N_OUT && !memcmp(warm.ids, cold.ids, sizeof cold.ids),
          "split: the same greedy tokens from loaded KV");
    engine_destroy(en);

    tp_size = 0;
    en = open_engine(model);
    struct out whole = {0};
    submit(en, p, N_PROMPT, &whole);
    run_all(en);
    CHECK(whole.n == N_OUT && whole.n_cached == 0, "whole after split: %d cached", whole.n_cached);
    engine_destroy(en);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    CHECK(system(cmd) == 0, "rm");
    snprintf(disk, sizeof disk, "%s", saved);
}

/* A hybrid model through the disk tier across engine restarts. */
static void test_hybrid(const char *testdata)
{
    char hybrid[512];
    snprintf(hybrid, sizeof hybrid, "%s/models/qwen3_5-tiny", testdata);
    int32_t p[H_PROMPT], q[120];
    for (int i = 0; i < H_PROMPT; i++) p[i] = 3 + (i * 7919 + 13) % 200;
    /* q shares p's first 100 tokens (6 full blocks, on disk) but no snapshot ends them */
    for (int i = 0; i < 120; i++) q[i] = i < 100 ? p[i] : 5 + (i * 31) % 200;

    struct engine *en = open_engine(hybrid);
    struct out cold = {0};
    submit(en, p, H_PROMPT, &cold);
    run_all(en);
    CHECK(cold.n == N_OUT && cold.n_cached == 0, "hybrid cold: %d tokens, %d cached", cold.n,
          cold.n_cached);
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.tier_on, "the disk tier is on for a hybrid model");
    wait_stored_states(en, H_PROMPT / 16, 1);
    engine_destroy(en);

    /* restart: blocks and snapshot from disk, the same greedy tokens */
    en = open_engine(hybrid);
    struct out warm = {0};
    submit(en, p, H_PROMPT, &warm);
    run_all(en);
    engine_stats(en, &st);
    CHECK(warm.n_cached == H_PROMPT / 16 * 16, "hybrid warm: %d cached", warm.n_cached);
    CHECK(warm.n == N_OUT && !memcmp(warm.ids, cold.ids, sizeof cold.ids),
          "the same greedy tokens from the loaded KV and state");
    CHECK(st.tier_hit_tokens == (uint64_t)warm.n_cached && st.tier.load_states == 1,
          "hit tokens %llu, snapshots loaded %llu", (unsigned long long)st.tier_hit_tokens,
          (unsigned long long)st.tier.load_states);
    CHECK(st.kv_blocks_used == 0 && st.state_slots_used == 0, "nothing held: %d blocks, %d slots",
          st.kv_blocks_used, st.state_slots_used);
    /* a missing snapshot: q (never run) shares 6 blocks with p, on disk, but no snapshot
     * ends them: a miss, nothing loaded */
    struct out qwarm = {0};
    submit(en, q, 120, &qwarm);
    run_all(en);
    engine_stats(en, &st);
    CHECK(qwarm.n_cached == 0 && qwarm.n == N_OUT, "q: %d cached", qwarm.n_cached);
    CHECK(st.tier.load_states == 1 && st.tier_hit_tokens == (uint64_t)warm.n_cached &&
              st.tier_query_tokens > (uint64_t)H_PROMPT,
          "no load for q: %llu snapshots, %llu hit tokens", (unsigned long long)st.tier.load_states,
          (unsigned long long)st.tier_hit_tokens);
    engine_destroy(en);

    /* a pool of 20 blocks: p's blocks and snapshot come from disk; another prompt pushes
     * p's last blocks out of the pool (its snapshot stays in the state pool); p again loads
     * only those blocks from disk and resumes from the snapshot the state pool holds */
    small_pool = 20;
    en = open_engine(hybrid);
    int32_t o[H_PROMPT];
    for (int i = 0; i < H_PROMPT; i++) o[i] = 7 + (i * 131 + 5) % 200;
    struct out w1 = {0}, w2 = {0}, other = {0};
    submit(en, p, H_PROMPT, &w1);
    run_all(en);
    submit(en, o, H_PROMPT, &other);
    run_all(en);
    engine_stats(en, &st);
    uint64_t hit1 = st.tier_hit_tokens;
    submit(en, p, H_PROMPT, &w2);
    run_all(en);
    engine_stats(en, &st);
    CHECK(w1.n_cached == 192 && w2.n_cached == 192, "small pool: %d then %d cached", w1.n_cached,
          w2.n_cached);
    CHECK(!memcmp(w1.ids, cold.ids, sizeof cold.ids) && !memcmp(w2.ids, cold.ids, sizeof cold.ids),
          "small pool: the same greedy tokens");
    CHECK(st.tier.load_states == 1 && st.tier_hit_tokens > hit1,
          "the second load read blocks only: %llu snapshots, hit tokens %llu then %llu",
          (unsigned long long)st.tier.load_states, (unsigned long long)hit1,
          (unsigned long long)st.tier_hit_tokens);
    CHECK(st.kv_blocks_used == 0 && st.state_slots_used == 0, "nothing held: %d blocks, %d slots",
          st.kv_blocks_used, st.state_slots_used);
    engine_destroy(en);
    small_pool = 0;

    /* a damaged snapshot: its blocks load, the snapshot fails its checksum, the prompt is
     * recomputed (no cached tokens) with the same tokens, the fault counted */
    en = open_engine(hybrid);
    kv_disk_io.read_done = damage_snapshots;
    struct out bad = {0};
    submit(en, p, H_PROMPT, &bad);
    run_all(en);
    kv_disk_io = kv_disk_io_default;
    engine_stats(en, &st);
    CHECK(bad.n_cached == 0 && bad.n == N_OUT && !memcmp(bad.ids, cold.ids, sizeof cold.ids),
          "damaged snapshot: %d cached, same tokens", bad.n_cached);
    CHECK(st.tier.state_failed == 1 && st.tier.disk.faults_corrupt == 1 &&
              st.tier.load_states == 0 && st.tier_hit_tokens == 0,
          "state failed %llu, corrupt %llu, hit %llu", (unsigned long long)st.tier.state_failed,
          (unsigned long long)st.tier.disk.faults_corrupt, (unsigned long long)st.tier_hit_tokens);
    CHECK(st.kv_blocks_used == 0 && st.state_slots_used == 0, "nothing held: %d blocks, %d slots",
          st.kv_blocks_used, st.state_slots_used);
    engine_destroy(en);
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

    test_hybrid(testdata);
    test_split(p);
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
