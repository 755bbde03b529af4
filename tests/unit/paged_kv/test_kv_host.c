/*
 * The host tier's bookkeeping over a fake copy engine: copies are queued and run only when
 * the test says so, in order, as a copy stream runs them. Checked: the bytes a load brings
 * up are those stored, slots in LRU order with exact ids, pinned and filling slots never
 * overwritten, a device block reused while its copy down is pending is fenced (and one
 * whose copy completed is not), blocks for a lower tier reported once ready, drops counted.
 */
#include <stdint.h>
#include <string.h>

#include "paged_kv/kv_host.h"
#include "test_util.h"

#define BB      8  /* bytes per block */
#define DEV     16 /* device blocks */
#define SLOTS   4
#define MAX_OPS 64

struct op {
    int in; /* 1: host to device */
    int32_t block;
    char *host;
    uint64_t mark; /* the ticket taken after it, 0: none yet */
};

struct fake {
    char dev[DEV][BB];
    struct op ops[MAX_OPS];
    int n_ops, n_run;
    uint64_t marks, done_mark;
    int fences;
};

static void f_out(void *u, int32_t b, void *dst)
{
    struct fake *f = u;
    f->ops[f->n_ops++] = (struct op){0, b, dst, 0};
}

static void f_in(void *u, int32_t b, const void *src)
{
    struct fake *f = u;
    f->ops[f->n_ops++] = (struct op){1, b, (char *)src, 0};
}

static uint64_t f_mark(void *u)
{
    struct fake *f = u;
    f->marks++;
    if (f->n_ops) f->ops[f->n_ops - 1].mark = f->marks;
    if (f->n_run == f->n_ops) f->done_mark = f->marks; /* nothing pending */
    return f->marks;
}

static int f_done(void *u, uint64_t t)
{
    struct fake *f = u;
    return t <= f->done_mark;
}

static void f_fence(void *u)
{
    ((struct fake *)u)->fences++;
}

/* Runs the queued copies up to n in all (in order), completing the tickets behind them. */
static void run_to(struct fake *f, int n)
{
    for (; f->n_run < n && f->n_run < f->n_ops; f->n_run++) {
        struct op *o = &f->ops[f->n_run];
        if (o->in)
            memcpy(f->dev[o->block], o->host, BB);
        else
            memcpy(o->host, f->dev[o->block], BB);
        if (o->mark) f->done_mark = o->mark;
    }
}

static struct kv_hash H(uint64_t x) {
    return (struct kv_hash){x * 0x9E3779B97F4A7C15ull, x};
}

struct reported {
    int n;
    int room; /* < 0: no limit; else blocks the lower tier takes until the test refills it */
    uint64_t ids[16];
    char bytes[16][BB];
};

static int on_ready(void *user, struct kv_hash h, const void *bytes)
{
    struct reported *r = user;
    if (r->room == 0) return 0;
    if (r->room > 0) r->room--;
    r->ids[r->n] = h.hi;
    memcpy(r->bytes[r->n++], bytes, BB);
    return 1;
}

static char arena[SLOTS * BB];

static struct kv_host *make(struct fake *f)
{
    memset(f, 0, sizeof *f);
    for (int b = 0; b < DEV; b++) memset(f->dev[b], 'a' + b, BB);
    struct kv_host_config cfg = {.mem = arena,
                                 .slots = SLOTS,
                                 .block_bytes = BB,
                                 .device_blocks = DEV,
                                 .copy = {f, f_out, f_in, f_mark, f_done, f_fence}};
    return kv_host_create(&cfg);
}

static void test_store_load(void)
{
    struct fake f;
    struct kv_host *h = make(&f);
    struct reported rep = {.room = -1};
    CHECK(kv_host_store(h, H(1), 3, 0) == 1 && kv_host_store(h, H(2), 5, 1) == 1, "stored");
    CHECK(kv_host_store(h, H(1), 3, 0) == 1 && f.n_ops == 2, "held already: no second copy");
    CHECK(kv_host_has(h, H(1)) && !kv_host_bytes(h, H(1)), "filling: held, bytes not yet");
    struct kv_hash pre[3] = {H(1), H(2), H(9)};
    CHECK(kv_host_probe(h, pre, 3) == 2, "probe %d", kv_host_probe(h, pre, 3));
    kv_host_poll(h, on_ready, &rep);
    CHECK(rep.n == 0, "nothing reported before the copies ran");
    run_to(&f, 2);
    kv_host_poll(h, on_ready, &rep);
    CHECK(rep.n == 1 && rep.ids[0] == 2 && !memcmp(rep.bytes[0], "ffffffff", BB),
          "the block for the lower tier, once: %d", rep.n);
    kv_host_poll(h, on_ready, &rep);
    CHECK(rep.n == 1, "reported once");
    CHECK(kv_host_bytes(h, H(1)) && !memcmp(kv_host_bytes(h, H(1)), "dddddddd", BB), "bytes");

    /* the device blocks are reused and overwritten; a load brings the stored bytes back */
    memset(f.dev[3], 'z', BB);
    memset(f.dev[5], 'z', BB);
    int32_t dst[2] = {10, 11};
    uint64_t t = kv_host_load(h, pre, dst, 2);
    CHECK(!kv_host_done(h, t), "pending");
    run_to(&f, f.n_ops);
    CHECK(kv_host_done(h, t), "done");
    CHECK(!memcmp(f.dev[10], "dddddddd", BB) && !memcmp(f.dev[11], "ffffffff", BB), "loaded");
    kv_host_unpin(h, pre, 2);
    struct kv_host_stats st;
    kv_host_stats(h, &st);
    CHECK(st.blocks == 2 && st.stored_blocks == 2 && st.load_blocks == 2, "stats %llu %llu %llu",
          (unsigned long long)st.blocks, (unsigned long long)st.stored_blocks,
          (unsigned long long)st.load_blocks);
    kv_host_destroy(h);
}

/* A load queued behind a store of the same slot reads the stored bytes (one stream). */
static void test_load_while_filling(void)
{
    struct fake f;
    struct kv_host *h = make(&f);
    kv_host_store(h, H(7), 2, 0);
    int32_t dst = 9;
    uint64_t t = kv_host_load(h, (struct kv_hash[]){H(7)}, &dst, 1);
    run_to(&f, f.n_ops);
    CHECK(kv_host_done(h, t) && !memcmp(f.dev[9], "cccccccc", BB), "in order");
    kv_host_destroy(h);
}

static void test_lru_and_pins(void)
{
    struct fake f;
    struct kv_host *h = make(&f);
    for (int i = 0; i < SLOTS; i++) kv_host_store(h, H((uint64_t)i + 1), i, 0);
    run_to(&f, f.n_ops);
    kv_host_poll(h, NULL, NULL);
    kv_host_store(h, H(1), 0, 0); /* H(1) most recent: H(2) goes first */
    int32_t d = 12;
    uint64_t t = kv_host_load(h, (struct kv_hash[]){H(3)}, &d, 1); /* H(3) pinned */
    kv_host_store(h, H(10), 6, 0);
    CHECK(!kv_host_has(h, H(2)) && kv_host_has(h, H(3)), "H(2) evicted first");
    kv_host_store(h, H(11), 7, 0);
    CHECK(!kv_host_has(h, H(4)) && kv_host_has(h, H(3)), "H(4) next; pinned H(3) kept");
    /* the ring now: H(1) ready, H(10) and H(11) filling, H(3) pinned. A put needs a ready
     * slot no copy reads: H(1) */
    CHECK(kv_host_put(h, H(20), "qqqqqqqq", 13) == 0 && !kv_host_has(h, H(1)), "put over H(1)");
    CHECK(kv_host_put(h, H(21), "rrrrrrrr", 14) == -1, "no quiet slot: refused");
    run_to(&f, f.n_ops);
    kv_host_poll(h, NULL, NULL); /* H(10), H(11) ready; H(20)'s copy up not marked before */
    kv_host_poll(h, NULL, NULL);
    CHECK(kv_host_put(h, H(21), "rrrrrrrr", 14) == 0 && !kv_host_has(h, H(10)), "then H(10)");
    run_to(&f, f.n_ops);
    kv_host_mark(h);
    CHECK(kv_host_done(h, t) && !memcmp(f.dev[13], "qqqqqqqq", BB) &&
              !memcmp(f.dev[14], "rrrrrrrr", BB),
          "puts reach the device");
    kv_host_unpin(h, (struct kv_hash[]){H(3)}, 1);
    /* everything pinned: a store is dropped and counted */
    kv_host_load(h, (struct kv_hash[]){H(3), H(11), H(20), H(21)}, (int32_t[]){1, 2, 3, 4}, 4);
    CHECK(kv_host_store(h, H(30), 8, 0) == 0, "dropped");
    struct kv_host_stats st;
    kv_host_stats(h, &st);
    CHECK(st.store_dropped == 1 && st.evicted_blocks == 4 && st.blocks == SLOTS,
          "dropped %llu evicted %llu", (unsigned long long)st.store_dropped,
          (unsigned long long)st.evicted_blocks);
    kv_host_destroy(h);
}

static void test_reuse_fence(void)
{
    struct fake f;
    struct kv_host *h = make(&f);
    kv_host_store(h, H(1), 4, 0);
    kv_host_store(h, H(2), 5, 0);
    kv_host_reuse(h, (int32_t[]){0, 1}, 2);
    CHECK(f.fences == 0, "blocks without copies down: no fence");
    kv_host_reuse(h, (int32_t[]){4}, 1);
    CHECK(f.fences == 1, "block 4's copy pending: fenced");
    kv_host_reuse(h, (int32_t[]){5}, 1);
    CHECK(f.fences == 1, "the fence covered block 5's copy too");
    kv_host_store(h, H(3), 6, 0);
    run_to(&f, f.n_ops);
    kv_host_poll(h, NULL, NULL);
    kv_host_reuse(h, (int32_t[]){6}, 1);
    CHECK(f.fences == 1, "a completed copy needs no fence: %d", f.fences);
    struct kv_host_stats st;
    kv_host_stats(h, &st);
    CHECK(st.fences == 1, "fences counted %llu", (unsigned long long)st.fences);
    kv_host_destroy(h);
}

/* A prefix of more blocks than slots, all wanted below, with a lower tier that takes two
 * per step: every block reaches it, once, in order, with its bytes (the disk tier on CUDA
 * behind a small staging area once received none of a long prefix: its slots were evicted
 * before their reports, and the blocks refused by a full queue were dropped). */
static void test_lower_tier_gets_every_block(void)
{
    struct fake f;
    struct kv_host *h = make(&f);
    struct reported rep = {.room = 0};
    for (int b = 0; b < 12; b++)
        CHECK(kv_host_store(h, H((uint64_t)b + 1), b, 1) == 1, "store %d accepted", b);
    CHECK(f.n_ops == SLOTS, "copies for the slots only: %d", f.n_ops);
    for (int step = 0; step < 20 && rep.n < 12; step++) {
        run_to(&f, f.n_ops);
        rep.room = 2;
        kv_host_poll(h, on_ready, &rep);
        CHECK(rep.n <= 2 * (step + 1), "at most two taken per step: %d", rep.n);
    }
    CHECK(rep.n == 12, "every block reported: %d", rep.n);
    for (int b = 0; b < rep.n; b++)
        CHECK(rep.ids[b] == (uint64_t)b + 1 && rep.bytes[b][0] == 'a' + b, "block %d: id %llu", b,
              (unsigned long long)rep.ids[b]);
    struct kv_host_stats st;
    kv_host_stats(h, &st);
    CHECK(st.store_dropped == 0 && st.store_deferred == 12 - SLOTS && st.stored_blocks == 12,
          "dropped %llu deferred %llu stored %llu", (unsigned long long)st.store_dropped,
          (unsigned long long)st.store_deferred, (unsigned long long)st.stored_blocks);
    /* a waiting block rewritten before a slot frees is dropped, counted; the rest go on */
    rep = (struct reported){.room = 0};
    for (int b = 0; b < 8; b++) kv_host_store(h, H((uint64_t)b + 100), b, 1);
    kv_host_reuse(h, (int32_t[]){6}, 1);
    for (int step = 0; step < 20 && rep.n < 7; step++) {
        run_to(&f, f.n_ops);
        rep.room = 1;
        kv_host_poll(h, on_ready, &rep);
    }
    kv_host_stats(h, &st);
    CHECK(rep.n == 7 && rep.ids[6] == 107 && st.store_dropped == 1, "7 reported (%d), 1 dropped",
          rep.n);
    CHECK(f.n_ops <= MAX_OPS, "ops %d", f.n_ops);
    kv_host_destroy(h);
}

int main(void)
{
    test_lower_tier_gets_every_block();
    test_store_load();
    test_load_while_filling();
    test_lru_and_pins();
    test_reuse_fence();
    TEST_DONE();
}
