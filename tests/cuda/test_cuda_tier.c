/*
 * The KV tiers on the CUDA backend (llama-tiny, manual steps, batch-invariant products so
 * that a prefix loaded from a tier and one computed give the same greedy tokens):
 *   host: a pool of 48 blocks, --kv-host-memory 64 MiB; a 600-token prompt, then three
 *     others that push its blocks out of the pool; sent again, its 37 full blocks come
 *     back from the host tier while another request steps (the first step prefills only
 *     the other's 100 tokens), with the cold run's greedy tokens;
 *   host, aborted while loading: its blocks go back and the prompt still runs right;
 *   the copy kernels: blocks gathered into host memory are kv_block.h's image exactly, and
 *     scattered back read the same; their device seconds are counted;
 *   disk: --kv-disk-dir without host memory (blocks staged through pinned slots), the
 *     engine destroyed and made again on the same directory (a restart): the prompt's
 *     blocks come back from disk with the cold run's greedy tokens;
 *   disk, hybrid (qwen3_5-tiny): the same restart; the prompt's blocks and the recurrent-state
 *     snapshot after them come back from disk (192 cached tokens) with the cold run's tokens;
 *   host, hybrid (qwen3_5-tiny, qwen3_5_moe-tiny): a 20-block pool, 2 state slots and a host
 *     tier; a prompt, then two others that push its blocks and its snapshot off the device;
 *     sent again, both come back from host memory (192 cached tokens, one snapshot hit, the
 *     snapshot's bytes those the first run computed) with the cold run's tokens;
 *   split over two GPUs (where there are two): the host and disk cases again, each block's
 *     image both ranks' shares, against the split model's cold run.
 * Without a GPU: "no GPU: not run", exit 77 (skipped).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/backend.h"
#include "model/kv_block.h"
#include "sched/engine.h"
#include "sched/engine_impl.h"
#include "test_util.h"
#include "tier_util.h"

#define N_PROMPT 600
#define N_OUT    TIER_OUT
#define N_FULL   (N_PROMPT / 16 * 16) /* tokens of the prompt's full blocks */

static char model[512], disk[128];
static const char *model_dir = model; /* the model open_engine opens */
static int tp_size;                   /* and split this many ways when set */

static struct engine *open_engine(size_t host_bytes, const char *dir)
{
    struct engine_config cfg = {.model_dir = model_dir,
                                .device = "cuda",
                                .manual = 1,
                                .num_blocks = 48,
                                .max_model_len = 700,
                                .max_num_batched_tokens = 256,
                                .kv_host_memory = host_bytes,
                                .kv_disk_dir = dir,
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

static void prompt(int32_t *p, int n, int seed)
{
    for (int i = 0; i < n; i++) p[i] = 3 + (i * 7919 + 13 + seed * 104729) % 1000;
}

/* Runs three other 600-token prompts through, one after another: each takes 38 of the 48
 * blocks, the least recently used first, so the first prompt's blocks leave the pool. */
static void push_out(struct engine *en)
{
    int32_t f[N_PROMPT];
    for (int k = 1; k <= 3; k++) {
        struct out o = {0};
        prompt(f, N_PROMPT, k);
        submit(en, f, N_PROMPT, &o);
        run_all(en);
        CHECK(o.n == N_OUT, "fill %d", k);
    }
}

/* The copy kernels keep kv_block.h's image (the disk tier's record): two pool blocks
 * gathered in one batch equal model_kv_block_read's bytes exactly, and one scattered into
 * a third block reads back the same. Overwrites pool blocks: last use of the engine. */
static void test_image(struct engine *en)
{
    struct model *m = en->m;
    size_t bb = model_kv_block_bytes(m);
    char *h = model_host_alloc(m, 2 * bb), *ref = malloc(bb), *back = malloc(bb);
    CHECK(h && ref && back, "alloc");
    model_kv_block_copy_out(m, 3, h);
    model_kv_block_copy_out(m, 5, h + bb);
    uint64_t t = model_copy_mark(m);
    while (!model_copy_done(m, t)) usleep(10);
    model_kv_block_read(m, 3, ref);
    int nz = 0;
    for (size_t i = 0; i < bb; i++) nz += ref[i] != 0;
    CHECK(nz > 0 && !memcmp(h, ref, bb), "block 3 gathered: the image (%d bytes not zero)", nz);
    model_kv_block_read(m, 5, ref);
    CHECK(!memcmp(h + bb, ref, bb), "block 5 gathered in the same batch");
    model_kv_block_copy_in(m, 7, h);
    t = model_copy_mark(m);
    while (!model_copy_done(m, t)) usleep(10);
    model_kv_block_read(m, 7, back);
    CHECK(!memcmp(back, h, bb), "block 3's image scattered into block 7");
    double out_s = 0, in_s = 0;
    model_copy_seconds(m, &out_s, &in_s);
    CHECK(out_s > 0 && in_s > 0 && out_s < 10 && in_s < 10, "copy seconds %g down, %g up", out_s,
          in_s);
    model_host_free(m, h);
    free(ref);
    free(back);
}

static void test_host(const int32_t *p, const struct out *cold)
{
    struct engine *en = open_engine((size_t)64 << 20, NULL);
    if (!en) return;
    struct out first = {0};
    submit(en, p, N_PROMPT, &first);
    run_all(en);
    CHECK(first.n == N_OUT && !memcmp(first.ids, cold->ids, sizeof cold->ids),
          "a host tier changes nothing of a cold run");
    push_out(en);
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.host_on && st.host.stored_blocks >= 4 * (N_PROMPT / 16), "stored %llu blocks down",
          (unsigned long long)st.host.stored_blocks);

    int32_t q[100];
    for (int i = 0; i < 100; i++) q[i] = 5 + (i * 31) % 1000;
    struct out warm = {0}, other = {0};
    submit(en, p, N_PROMPT, &warm);
    submit(en, q, 100, &other);
    uint64_t before = st.prompt_tokens;
    engine_step(en);
    engine_stats(en, &st);
    CHECK(st.prompt_tokens - before == 100, "the first step prefilled %llu tokens (the other's)",
          (unsigned long long)(st.prompt_tokens - before));
    run_all(en);
    engine_stats(en, &st);
    CHECK(warm.n_cached == N_FULL, "warm: %d cached", warm.n_cached);
    CHECK(st.host_hit_tokens == N_FULL, "host hit tokens %llu",
          (unsigned long long)st.host_hit_tokens);
    CHECK(warm.n == N_OUT && !memcmp(warm.ids, cold->ids, sizeof cold->ids),
          "the same greedy tokens from KV copied up from host memory");
    CHECK(other.n == N_OUT, "the other request ran");
    CHECK(st.kv_blocks_used == 0, "no block held: %d", st.kv_blocks_used);
    /* device time of the copies (bytes over it: the bus bandwidth), not of queueing them */
    CHECK(st.host_load_seconds > 0 && st.host_load_seconds < 1 && st.host_store_seconds > 0,
          "copy seconds: %g up, %g down", st.host_load_seconds, st.host_store_seconds);

    /* aborted while its blocks are copied up: they go back; the prompt then runs right */
    push_out(en);
    struct out gone = {0}, again = {0};
    uint64_t id = submit(en, p, N_PROMPT, &gone);
    engine_step(en); /* starts the load */
    engine_abort(en, id);
    run_all(en);
    CHECK(gone.finish == FINISH_ABORT, "aborted: %d", gone.finish);
    engine_stats(en, &st);
    CHECK(st.kv_blocks_used == 0, "no block held after the abort: %d", st.kv_blocks_used);
    submit(en, p, N_PROMPT, &again);
    run_all(en);
    CHECK(again.n == N_OUT && !memcmp(again.ids, cold->ids, sizeof cold->ids), "after the abort");
    test_image(en);
    engine_destroy(en);
}

/* The writer stores behind the steps: wait until the disk holds n blocks. */
static void wait_stored(struct engine *en, uint64_t n)
{
    struct engine_stats st;
    for (int i = 0; i < 5000; i++) {
        engine_step(en); /* publishes the gauges, moves copies down on */
        engine_stats(en, &st);
        if (st.tier.disk.blocks >= n) return;
        usleep(1000);
    }
    CHECK(0, "stored %llu of %llu blocks", (unsigned long long)st.tier.disk.blocks,
          (unsigned long long)n);
}

static void test_disk(const int32_t *p, const struct out *cold)
{
    struct engine *en = open_engine(0, disk);
    if (!en) return;
    struct out first = {0};
    submit(en, p, N_PROMPT, &first);
    run_all(en);
    CHECK(first.n == N_OUT && !memcmp(first.ids, cold->ids, sizeof cold->ids), "cold with disk");
    wait_stored(en, N_PROMPT / 16);
    engine_destroy(en);

    en = open_engine(0, disk); /* a restart on the same directory */
    if (!en) return;
    struct out warm = {0};
    submit(en, p, N_PROMPT, &warm);
    run_all(en);
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(warm.n_cached == N_FULL, "after the restart: %d cached", warm.n_cached);
    CHECK(st.tier_hit_tokens == N_FULL, "disk hit tokens %llu",
          (unsigned long long)st.tier_hit_tokens);
    CHECK(warm.n == N_OUT && !memcmp(warm.ids, cold->ids, sizeof cold->ids),
          "the same greedy tokens from KV read from disk");
    engine_destroy(en);
}

/* llama-tiny split over two GPUs: the host and disk tiers above with each block's image
 * both ranks' shares (the copy kernels of both GPUs, one mapped arena), against the split
 * model's own cold run. */
static void test_split(const int32_t *p)
{
    if (backend_gpu_count() < 2) {
        printf("split over two GPUs: one GPU, not run\n");
        return;
    }
    tp_size = 2;
    struct engine *en = open_engine(0, NULL);
    if (en) {
        struct out cold = {0};
        submit(en, p, N_PROMPT, &cold);
        run_all(en);
        CHECK(cold.n == N_OUT && cold.n_cached == 0, "split cold: %d tokens, %d cached", cold.n,
              cold.n_cached);
        engine_destroy(en);
        test_host(p, &cold);
        test_disk(p, &cold);
    }
    tp_size = 0;
}

/* A hybrid model: the prompt's blocks and its state snapshot from disk after a restart. */
static void test_hybrid_disk(const char *testdata)
{
    char hybrid[512];
    snprintf(hybrid, sizeof hybrid, "%s/models/qwen3_5-tiny", testdata);
    model_dir = hybrid;
    int32_t p[200];
    for (int i = 0; i < 200; i++) p[i] = 3 + (i * 7919 + 13) % 200;
    struct engine *en = open_engine(0, NULL);
    if (!en) return;
    struct out cold = {0};
    submit(en, p, 200, &cold);
    run_all(en);
    engine_destroy(en);

    en = open_engine(0, disk);
    struct out first = {0};
    submit(en, p, 200, &first);
    run_all(en);
    CHECK(first.n == N_OUT && !memcmp(first.ids, cold.ids, sizeof cold.ids), "hybrid: cold");
    struct engine_stats st;
    for (int i = 0; i < 5000; i++) {
        engine_step(en);
        engine_stats(en, &st);
        if (st.tier.disk.blocks >= 200 / 16 && st.tier.disk.states >= 1) break;
        usleep(1000);
    }
    CHECK(st.tier.disk.states >= 1, "hybrid: the snapshot reached the disk");
    engine_destroy(en);

    en = open_engine(0, disk);
    struct out warm = {0};
    submit(en, p, 200, &warm);
    run_all(en);
    engine_stats(en, &st);
    CHECK(warm.n_cached == 192 && st.tier.load_states == 1, "hybrid: %d cached, %llu snapshots",
          warm.n_cached, (unsigned long long)st.tier.load_states);
    CHECK(warm.n == N_OUT && !memcmp(warm.ids, cold.ids, sizeof cold.ids),
          "hybrid: the same greedy tokens from the blocks and the snapshot read from disk");
    CHECK(st.kv_blocks_used == 0 && st.state_slots_used == 0, "hybrid: nothing held");
    engine_destroy(en);
    model_dir = model;
}

/* The bytes of the snapshot after the 12 blocks of p[0..192) in the state pool (malloc'ed),
 * or NULL when the pool has none. */
static char *snap_bytes(struct engine *en, const int32_t *p)
{
    struct kv_hash h = {0}, prev;
    for (int i = 0; i < 12; i++) {
        prev = h;
        h = kv_block_hash(&en->pool, i ? &prev : NULL, p + 16 * i, 16, NULL, 0);
    }
    int32_t s = kv_lookup(&en->states, h);
    if (s < 0) return NULL;
    char *b = malloc(model_state_bytes(en->m));
    model_state_read(en->m, s, b);
    return b;
}

static struct engine *open_small(const char *dir, size_t host_bytes)
{
    struct engine_config cfg = {.model_dir = dir,
                                .device = "cuda",
                                .manual = 1,
                                .num_blocks = host_bytes ? 20 : 0,
                                .max_model_len = 300,
                                .max_num_seqs = 1, /* 2 state slots */
                                .max_num_batched_tokens = 256,
                                .kv_host_memory = host_bytes};
    struct err e = {0};
    struct engine *en = engine_create(&cfg, &e);
    CHECK(en, "engine_create: %s", e.msg);
    return en;
}

/* A hybrid model: the prompt's blocks and its snapshot copied back up from host memory. */
static void test_hybrid_host(const char *testdata, const char *name)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", testdata, name);
    int32_t p[200], q[200];
    for (int i = 0; i < 200; i++) p[i] = 3 + (i * 7919 + 13) % 200;
    struct engine *en = open_small(dir, 0);
    if (!en) return;
    struct out cold = {0};
    submit(en, p, 200, &cold);
    run_all(en);
    engine_destroy(en);

    en = open_small(dir, (size_t)16 << 20);
    if (!en) return;
    struct out first = {0}, o1 = {0}, o2 = {0}, warm = {0};
    submit(en, p, 200, &first);
    run_all(en);
    CHECK(first.n == N_OUT && !memcmp(first.ids, cold.ids, sizeof cold.ids), "%s: cold", name);
    char *snap0 = snap_bytes(en, p);
    CHECK(snap0, "%s: the first run's snapshot", name);
    for (int i = 0; i < 200; i++) q[i] = 3 + (i * 7919 + 13 + 131) % 200;
    submit(en, q, 200, &o1);
    run_all(en);
    for (int i = 0; i < 200; i++) q[i] = 3 + (i * 7919 + 13 + 262) % 200;
    submit(en, q, 200, &o2);
    run_all(en);
    char *gone = snap_bytes(en, p);
    CHECK(!gone, "%s: the snapshot left the state pool", name);
    free(gone);
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.host_snap.slots > 0 && st.host_snap.blocks == 3, "%s: %llu snapshots in host memory",
          name, (unsigned long long)st.host_snap.blocks);

    submit(en, p, 200, &warm);
    run_all(en);
    engine_stats(en, &st);
    CHECK(warm.n_cached == 192, "%s: warm %d cached", name, warm.n_cached);
    CHECK(warm.n == N_OUT && !memcmp(warm.ids, cold.ids, sizeof cold.ids),
          "%s: the same greedy tokens from blocks and a snapshot copied up from host memory", name);
    CHECK(st.host_hit_tokens == 192 && st.host_state_queries == 4 && st.host_state_hits == 1 &&
              st.host_snap.load_blocks == 1,
          "%s: host hit tokens %llu, snapshot hits %llu of %llu lookups", name,
          (unsigned long long)st.host_hit_tokens, (unsigned long long)st.host_state_hits,
          (unsigned long long)st.host_state_queries);
    char *back = snap_bytes(en, p);
    CHECK(back && snap0 && !memcmp(back, snap0, model_state_bytes(en->m)),
          "%s: the snapshot copied up is the one copied down, byte for byte", name);
    CHECK(st.kv_blocks_used == 0 && st.state_slots_used == 0, "%s: nothing held", name);
    free(back);
    free(snap0);
    engine_destroy(en);
}

int main(int argc, char **argv)
{
    const char *testdata = argc > 1 ? argv[1] : "../shared/testdata";
    if (!backend_cuda_available()) {
        printf("no GPU: not run\n");
        return 77;
    }
    /* a row's products do not depend on the rest of the step */
    setenv("PAGODA_CUDA_BATCH_INVARIANT", "1", 1);
    snprintf(model, sizeof model, "%s/models/llama-tiny", testdata);
    snprintf(disk, sizeof disk, "/tmp/pagoda-test-cuda-tier-%ld", (long)getpid());
    int32_t p[N_PROMPT];
    prompt(p, N_PROMPT, 0);

    struct engine *en = open_engine(0, NULL);
    if (!en) TEST_DONE();
    struct out cold = {0};
    submit(en, p, N_PROMPT, &cold);
    run_all(en);
    CHECK(cold.n == N_OUT && cold.n_cached == 0, "cold: %d tokens, %d cached", cold.n,
          cold.n_cached);
    engine_destroy(en);

    char cmd[256];
    test_host(p, &cold);
    test_disk(p, &cold);
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    CHECK(system(cmd) == 0, "rm");
    test_split(p);
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    CHECK(system(cmd) == 0, "rm");
    test_hybrid_disk(testdata);
    test_hybrid_host(testdata, "qwen3_5-tiny");
    test_hybrid_host(testdata, "qwen3_5_moe-tiny");

    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    CHECK(system(cmd) == 0, "rm");
    TEST_DONE();
}
