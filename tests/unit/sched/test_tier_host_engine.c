/*
 * The host-memory tier through the engine without a GPU: the CPU backend with a fake copy
 * engine (copies queued and run late: once `lag` more tickets were taken after one covering
 * them, or at a fence, so that a copy reads or writes its unit after any step the engine
 * let run before it; lags 0, 1 and 3, the host + disk cases at 0 and 1, where every
 * snapshot reaches the disk). Hybrid models (qwen3_5-tiny, qwen3_5_moe-tiny) with a
 * 20-block pool and 2 state slots:
 *   host: a prompt, then two others that push its blocks and its recurrent-state snapshot
 *     out of the device pools; sent again, its 12 blocks and the snapshot after them come
 *     back from host memory (192 cached tokens) with the greedy tokens of a run without
 *     tiers; snapshot lookups and hits counted exactly; a prompt sharing blocks but no
 *     snapshot is a counted miss, recomputed;
 *   host + disk: a host tier of one snapshot slot (and 20 block slots), so that the
 *     snapshot and the blocks are evicted from host memory after the disk took them: the
 *     prompt comes back from disk (the host lookup a counted miss) with the same tokens;
 *     with its snapshot record damaged, a counted miss on both tiers and a recompute.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/backend.h"
#include "paged_kv/kv_disk.h"
#include "sched/engine.h"
#include "sched/engine_impl.h"
#include "test_util.h"
#include "tier_util.h"

#define N_OUT    TIER_OUT
#define H_PROMPT 200 /* 12 full blocks: the snapshot after block 12 (192 tokens) */
#define MAX_SEG  64

/* ---- the fake copy engine ---- */

struct cop {
    int kind, to_host;
    int32_t unit;
    char *host;
};

static struct {
    int n_seg[BACKEND_COPY_KINDS];
    char *base[BACKEND_COPY_KINDS][MAX_SEG];
    size_t bytes[BACKEND_COPY_KINDS][MAX_SEG];
    struct cop *q;
    int n_q, cap_q, n_run;
    int *tk;   /* ticket t completes once n_run reaches tk[t] */
    int *asks; /* [t]: times ticket t was asked about */
    int lag;   /* asks a ticket answers "not done" before its copies run */
    uint64_t n_tk, cap_tk;
    uint64_t copies[BACKEND_COPY_KINDS][2]; /* run, by kind and direction (1: to host) */
    int fences;
} fk;

static void run_to(int n)
{
    for (; fk.n_run < n; fk.n_run++) {
        struct cop *c = &fk.q[fk.n_run];
        char *h = c->host;
        for (int s = 0; s < fk.n_seg[c->kind]; s++) {
            char *d = fk.base[c->kind][s] + fk.bytes[c->kind][s] * (size_t)c->unit;
            size_t n = fk.bytes[c->kind][s];
            if (c->to_host)
                memcpy(h, d, n);
            else
                memcpy(d, h, n);
            h += n;
        }
        fk.copies[c->kind][c->to_host]++;
    }
}

static void *f_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    return calloc(1, bytes);
}

static void f_host_free(void *ctx, void *p)
{
    (void)ctx;
    fk.n_q = fk.n_run = 0; /* copies never asked about die with the arena */
    free(p);
}

static void f_setup(void *ctx, int kind, int n_seg, void *const *base, const size_t *bytes)
{
    (void)ctx;
    CHECK(kind >= 0 && kind < BACKEND_COPY_KINDS && n_seg <= MAX_SEG, "setup %d %d", kind, n_seg);
    fk.n_seg[kind] = n_seg;
    for (int s = 0; s < n_seg; s++) {
        fk.base[kind][s] = base[s];
        fk.bytes[kind][s] = bytes[s];
    }
}

static void f_block(void *ctx, int kind, int32_t unit, void *host, int to_host)
{
    (void)ctx;
    if (fk.n_q == fk.cap_q) {
        fk.cap_q = fk.cap_q ? 2 * fk.cap_q : 256;
        fk.q = realloc(fk.q, sizeof *fk.q * (size_t)fk.cap_q);
    }
    fk.q[fk.n_q++] = (struct cop){kind, to_host, unit, host};
}

static uint64_t f_mark(void *ctx)
{
    (void)ctx;
    if (fk.n_tk + 1 >= fk.cap_tk) {
        fk.cap_tk = fk.cap_tk ? 2 * fk.cap_tk : 256;
        fk.tk = realloc(fk.tk, sizeof *fk.tk * fk.cap_tk);
        fk.asks = realloc(fk.asks, sizeof *fk.asks * fk.cap_tk);
    }
    fk.tk[++fk.n_tk] = fk.n_q;
    fk.asks[fk.n_tk] = 0;
    return fk.n_tk;
}

/* Ticket t's copies run once `lag` tickets were taken after it (or a fence ran them; or,
 * for a caller that only waits, after 100 asks). */
static int f_done(void *ctx, uint64_t t)
{
    (void)ctx;
    if (fk.n_run < fk.tk[t] && fk.n_tk - t < (uint64_t)fk.lag && ++fk.asks[t] <= 1000) return 0;
    run_to(fk.tk[t]);
    return 1;
}

static void f_fence(void *ctx)
{
    (void)ctx;
    run_to(fk.n_q); /* the next step's work waits for every copy queued */
    fk.fences++;
}

static void f_seconds(void *ctx, double *out_s, double *in_s)
{
    (void)ctx;
    *out_s = *in_s = 0;
}

static struct backend_ops ops;

static struct backend fake_backend(void)
{
    struct backend cpu;
    struct err e = {0};
    CHECK(backend_cpu_create(&cpu, 1, &e) == 0, "cpu backend: %s", e.msg);
    ops = *cpu.ops;
    ops.host_alloc = f_host_alloc;
    ops.host_free = f_host_free;
    ops.copy_setup = f_setup;
    ops.copy_block = f_block;
    ops.copy_mark = f_mark;
    ops.copy_done = f_done;
    ops.copy_fence = f_fence;
    ops.copy_seconds = f_seconds;
    return (struct backend){&ops, cpu.ctx};
}

/* ---- the engine ---- */

static char disk[128];

static struct engine *open_engine(const char *dir, size_t host, const char *disk_dir,
                                  struct backend *be)
{
    struct engine_config cfg = {.model_dir = dir,
                                .device = "cpu",
                                .backend = be,
                                .num_blocks = be ? 20 : 0,
                                .max_model_len = 300,
                                .max_num_seqs = 1, /* 2 state slots */
                                .manual = 1,
                                .threads = 1,
                                .max_num_batched_tokens = 256,
                                .kv_host_memory = host,
                                .kv_disk_dir = disk_dir,
                                .kv_disk_size = (size_t)64 << 20};
    struct err e = {0};
    struct engine *en = engine_create(&cfg, &e);
    CHECK(en, "engine_create: %s", e.msg);
    return en;
}

static void run(struct engine *en, const int32_t *p, int n, struct out *o)
{
    submit(en, p, n, o);
    for (int i = 0; i < 100000 && engine_step(en); i++) {
    }
    CHECK(o->n == N_OUT, "%d tokens", o->n);
}

static void prompt(int32_t *p, int n, int seed)
{
    for (int i = 0; i < n; i++) p[i] = 3 + (i * 7919 + 13 + seed * 131) % 200;
}

/* The bytes of the snapshot after p's 12th block in the state pool (malloc'ed), or NULL
 * when the pool has none. */
static char *snap_bytes(struct engine *en, const int32_t *p)
{
    struct kv_hash h = {0}, prev;
    for (int i = 0; i < H_PROMPT / 16; i++) {
        prev = h;
        h = kv_block_hash(&en->pool, i ? &prev : NULL, p + 16 * i, 16, NULL, 0);
    }
    int32_t s = kv_lookup(&en->states, h);
    if (s < 0) return NULL;
    char *b = malloc(model_state_bytes(en->m));
    model_state_read(en->m, s, b);
    return b;
}

static char *snap0; /* the snapshot as the first run computed it */

/* The prompt, then two others through the 20-block pool and the 2 state slots: none of
 * the first prompt's 12 blocks nor its snapshot is left on the device. */
static void fill(struct engine *en, const int32_t *p, const struct out *cold)
{
    struct out first = {0}, o1 = {0}, o2 = {0};
    int32_t q[H_PROMPT];
    run(en, p, H_PROMPT, &first);
    CHECK(first.n_cached == 0 && !memcmp(first.ids, cold->ids, sizeof cold->ids),
          "a host tier changes nothing of a cold run (%d cached)", first.n_cached);
    free(snap0);
    snap0 = snap_bytes(en, p);
    CHECK(snap0, "the first run's snapshot");
    prompt(q, H_PROMPT, 1);
    run(en, q, H_PROMPT, &o1);
    prompt(q, H_PROMPT, 2);
    run(en, q, H_PROMPT, &o2);
    char *gone = snap_bytes(en, p);
    CHECK(!gone, "the snapshot left the state pool");
    free(gone);
}

/* The snapshot loaded into the state pool is the first run's, byte for byte (the tiny
 * models' greedy tokens barely depend on the recurrent state). */
static void check_snap(struct engine *en, const int32_t *p)
{
    char *b = snap_bytes(en, p);
    CHECK(b && snap0 && !memcmp(b, snap0, model_state_bytes(en->m)),
          "the snapshot loaded is the one stored");
    free(b);
}

static void test_host(const char *dir, const int32_t *p, const struct out *cold)
{
    fk.fences = 0;
    struct backend be = fake_backend();
    memset(fk.copies, 0, sizeof fk.copies);
    struct engine *en = open_engine(dir, (size_t)4 << 20, NULL, &be);
    if (!en) return;
    fill(en, p, cold);
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.host_on && st.host_snap.slots > 0 && st.host_snap.blocks == 3 &&
              st.host_snap.stored_blocks == 3,
          "three snapshots held: %llu of %llu slots, %llu stored",
          (unsigned long long)st.host_snap.blocks, (unsigned long long)st.host_snap.slots,
          (unsigned long long)st.host_snap.stored_blocks);
    CHECK(st.host_state_queries == 3 && st.host_state_hits == 0, "cold lookups: %llu, %llu hits",
          (unsigned long long)st.host_state_queries, (unsigned long long)st.host_state_hits);

    struct out warm = {0};
    run(en, p, H_PROMPT, &warm);
    engine_stats(en, &st);
    CHECK(warm.n_cached == 192, "warm: %d cached", warm.n_cached);
    CHECK(!memcmp(warm.ids, cold->ids, sizeof cold->ids),
          "the same greedy tokens from blocks and a snapshot copied up from host memory");
    check_snap(en, p);
    CHECK(st.host_hit_tokens == 192 && st.host_state_queries == 4 && st.host_state_hits == 1 &&
              st.host_snap.load_blocks == 1 && st.host.load_blocks == 12,
          "host hits: %llu tokens, snapshots %llu of %llu lookups, %llu copied up",
          (unsigned long long)st.host_hit_tokens, (unsigned long long)st.host_state_hits,
          (unsigned long long)st.host_state_queries, (unsigned long long)st.host_snap.load_blocks);
    CHECK(fk.copies[BACKEND_COPY_STATE][1] == 3 && fk.copies[BACKEND_COPY_STATE][0] == 1,
          "state copies: %llu down, %llu up", (unsigned long long)fk.copies[BACKEND_COPY_STATE][1],
          (unsigned long long)fk.copies[BACKEND_COPY_STATE][0]);
    CHECK(st.host_snap.store_dropped == 0 && st.host_snap.evicted_blocks == 0,
          "no snapshot dropped");
    CHECK(st.kv_blocks_used == 0 && st.state_slots_used == 0, "nothing held: %d blocks, %d slots",
          st.kv_blocks_used, st.state_slots_used);

    /* q shares p's first 100 tokens (6 blocks, in host memory) but no snapshot ends them:
     * a lookup that misses, nothing loaded, computed from the start */
    int32_t q[120];
    for (int i = 0; i < 120; i++) q[i] = i < 100 ? p[i] : 5 + (i * 31) % 200;
    struct out qo = {0};
    run(en, q, 120, &qo);
    engine_stats(en, &st);
    CHECK(qo.n_cached == 0 && st.host_state_queries == 5 && st.host_state_hits == 1 &&
              st.host_hit_tokens == 192,
          "no snapshot: %d cached, %llu lookups", qo.n_cached,
          (unsigned long long)st.host_state_queries);
    /* copies held back three tickets: device blocks and state slots were allocated again
     * while their copies down were pending, and fenced */
    CHECK(fk.lag < 3 || (st.host.fences > 0 && st.host_snap.fences > 0),
          "fences: %llu blocks, %llu snapshots", (unsigned long long)st.host.fences,
          (unsigned long long)st.host_snap.fences);
    engine_destroy(en);
}

static void wait_disk(struct engine *en, uint64_t states)
{
    struct engine_stats st;
    for (int i = 0; i < 5000; i++) {
        engine_step(en);
        engine_stats(en, &st);
        if (st.tier.disk.states >= states) return;
        usleep(1000);
    }
    CHECK(0, "%llu of %llu snapshots on disk", (unsigned long long)st.tier.disk.states,
          (unsigned long long)states);
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

static void test_host_disk(const char *dir, const int32_t *p, const struct out *cold, int damage)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    CHECK(system(cmd) == 0, "rm");
    struct backend be = fake_backend();
    /* one snapshot slot beside 20 block slots (the share the device gives states) */
    struct engine *en = open_engine(dir, 200 << 10, disk, &be);
    if (!en) return;
    fill(en, p, cold);
    wait_disk(en, 3);
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.host_snap.slots == 1 && st.host.slots == 20, "host slots: %llu snapshot, %llu blocks",
          (unsigned long long)st.host_snap.slots, (unsigned long long)st.host.slots);
    CHECK(st.host_snap.evicted_blocks == 2 && st.tier.disk.states == 3 &&
              st.tier.disk.stored_states == 3,
          "snapshots evicted from host memory %llu, on disk %llu",
          (unsigned long long)st.host_snap.evicted_blocks, (unsigned long long)st.tier.disk.states);
    if (damage) kv_disk_io.read_done = damage_snapshots;
    struct out warm = {0};
    run(en, p, H_PROMPT, &warm);
    kv_disk_io = kv_disk_io_default;
    engine_stats(en, &st);
    CHECK(!memcmp(warm.ids, cold->ids, sizeof cold->ids), "the same greedy tokens (damage %d)",
          damage);
    CHECK(st.host_state_queries == 4 && st.host_state_hits == 0 && st.tier_state_queries == 4 &&
              st.host_hit_tokens == 0,
          "lookups: host %llu (%llu hits), disk %llu; host hit tokens %llu",
          (unsigned long long)st.host_state_queries, (unsigned long long)st.host_state_hits,
          (unsigned long long)st.tier_state_queries, (unsigned long long)st.host_hit_tokens);
    if (!damage) check_snap(en, p);
    if (!damage)
        CHECK(warm.n_cached == 192 && st.tier_state_hits == 1 && st.tier_hit_tokens == 192 &&
                  st.tier.load_states == 1,
              "from disk: %d cached, %llu snapshot hits, %llu tokens", warm.n_cached,
              (unsigned long long)st.tier_state_hits, (unsigned long long)st.tier_hit_tokens);
    else
        CHECK(warm.n_cached == 0 && st.tier_state_hits == 0 && st.tier_hit_tokens == 0 &&
                  st.tier.state_failed == 1 && st.tier.disk.faults_corrupt == 1,
              "damaged: %d cached, %llu failed", warm.n_cached,
              (unsigned long long)st.tier.state_failed);
    CHECK(st.kv_blocks_used == 0 && st.state_slots_used == 0, "nothing held: %d blocks, %d slots",
          st.kv_blocks_used, st.state_slots_used);
    engine_destroy(en);
}

int main(int argc, char **argv)
{
    const char *testdata = argc > 1 ? argv[1] : "../shared/testdata";
    snprintf(disk, sizeof disk, "/tmp/pagoda-test-tier-host-%ld", (long)getpid());
    static const char *const models[] = {"qwen3_5-tiny", "qwen3_5_moe-tiny"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/models/%s", testdata, models[i]);
        int32_t p[H_PROMPT];
        prompt(p, H_PROMPT, 0);
        /* the reference: no tiers, a pool of the default size */
        struct engine *en = open_engine(dir, 0, NULL, NULL);
        if (!en) TEST_DONE();
        struct out cold = {0};
        run(en, p, H_PROMPT, &cold);
        engine_destroy(en);
        for (fk.lag = 0; fk.lag <= 3; fk.lag += fk.lag ? 2 : 1) {
            test_host(dir, p, &cold);
            if (fk.lag > 1) continue;
            test_host_disk(dir, p, &cold, 0);
            test_host_disk(dir, p, &cold, 1);
        }
    }
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s", disk);
    CHECK(system(cmd) == 0, "rm");
    free(snap0);
    free(fk.q);
    free(fk.tk);
    free(fk.asks);
    TEST_DONE();
}
