/* The KV pool's bookkeeping: ids handed out, hashing, the index, LRU eviction order,
 * reference counts, plan-then-commit, and no leak after random mixes of operations. */
#include <stdint.h>
#include <string.h>

#include "common/util.h"
#include "model/sampler.h"
#include "paged_kv/kv_pool.h"
#include "test_util.h"

static struct kv_hash chain(const struct kv_pool *p, const int32_t *toks, int n_blocks,
                            struct kv_hash *out)
{
    struct kv_hash h = {0};
    for (int i = 0; i < n_blocks; i++) {
        h = kv_block_hash(p, i ? &out[i - 1] : NULL, toks + i * p->block_size, p->block_size, NULL,
                          0);
        out[i] = h;
    }
    return h;
}

static void test_alloc_order(void)
{
    struct kv_pool p;
    kv_pool_init(&p, 8, 4, "m", 1);
    CHECK(kv_num_free(&p) == 8, "free %d", kv_num_free(&p));
    int32_t a[3], b[2];
    CHECK(kv_allocate(&p, 3, a) == 0, "alloc");
    CHECK(a[0] == 0 && a[1] == 1 && a[2] == 2, "ids %d %d %d", a[0], a[1], a[2]);
    CHECK(kv_allocate(&p, 2, b) == 0 && b[0] == 3 && b[1] == 4, "ids %d %d", b[0], b[1]);
    CHECK(kv_num_free(&p) == 3, "free %d", kv_num_free(&p));
    int32_t big[4];
    CHECK(kv_allocate(&p, 4, big) == -1, "over-allocation refused");
    CHECK(kv_num_free(&p) == 3, "a refused allocation changes nothing");
    CHECK(kv_can_allocate(&p, 3, NULL, 0) && !kv_can_allocate(&p, 4, NULL, 0), "can_allocate");
    /* Unhashed blocks go to the head: reused first. */
    kv_release(&p, b, 2);
    int32_t c[1];
    kv_allocate(&p, 1, c);
    CHECK(c[0] == 3 || c[0] == 4, "an unhashed freed block is reused first, got %d", c[0]);
    kv_release(&p, c, 1);
    kv_release(&p, a, 3);
    CHECK(kv_num_free(&p) == 8 && p.n_cached == 0, "all free again");
    kv_pool_dispose(&p);
}

static void test_hash_and_hits(void)
{
    struct kv_pool p, q;
    kv_pool_init(&p, 16, 4, "model-a", 7);
    kv_pool_init(&q, 16, 4, "model-b", 7);
    int32_t toks[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    struct kv_hash h[3], h2[3], hq[3];
    chain(&p, toks, 3, h);
    chain(&p, toks, 3, h2);
    chain(&q, toks, 3, hq);
    CHECK(!memcmp(h, h2, sizeof h), "hashing is deterministic");
    CHECK(memcmp(&h[0], &hq[0], sizeof h[0]), "a different fingerprint gives different hashes");
    /* The same tokens under a different parent hash differently. */
    struct kv_hash alone = kv_block_hash(&p, NULL, toks + 4, 4, NULL, 0);
    CHECK(memcmp(&alone, &h[1], sizeof alone), "the parent is part of the name");
    struct kv_hash ex = kv_block_hash(&p, NULL, toks, 4, "x", 1);
    CHECK(memcmp(&ex, &h[0], sizeof ex), "extra keys are part of the name");

    int32_t blk[3];
    kv_allocate(&p, 3, blk);
    for (int i = 0; i < 3; i++) kv_commit_hash(&p, blk[i], h[i]);
    int32_t hits[3];
    CHECK(kv_lookup_prefix(&p, h, 3, hits) == 3, "three hits");
    CHECK(hits[0] == blk[0] && hits[1] == blk[1] && hits[2] == blk[2], "hit blocks");
    /* A duplicate block with the same content is not indexed. */
    int32_t dup;
    kv_allocate(&p, 1, &dup);
    kv_commit_hash(&p, dup, h[0]);
    CHECK(kv_lookup(&p, h[0]) == blk[0], "the first holder keeps the name");
    kv_release(&p, &dup, 1);

    /* Sharing: a second user touches the hits; ref counts add up. */
    kv_touch(&p, hits, 3);
    CHECK(p.b[blk[0]].ref == 2 && p.b[blk[2]].ref == 2, "ref %d", p.b[blk[0]].ref);
    kv_release(&p, blk, 3);
    CHECK(p.b[blk[0]].ref == 1 && kv_num_free(&p) == 13, "still held by the second user");
    kv_release(&p, hits, 3);
    CHECK(kv_num_free(&p) == 16 && p.n_cached == 3, "free %d cached %d", kv_num_free(&p),
          p.n_cached);
    /* Cached free blocks still hit; touching takes them off the free list. */
    CHECK(kv_lookup_prefix(&p, h, 3, hits) == 3, "hits after free");
    CHECK(kv_can_allocate(&p, 13, hits, 3) && !kv_can_allocate(&p, 14, hits, 3),
          "hits in the free list count against the room");
    kv_touch(&p, hits, 2);
    CHECK(kv_num_free(&p) == 14 && p.n_cached == 1, "free %d cached %d", kv_num_free(&p),
          p.n_cached);
    kv_release(&p, hits, 2);
    kv_pool_dispose(&p);
    kv_pool_dispose(&q);
}

/* Eviction: least recently freed hashed blocks first; within one request, tail first. */
static void test_eviction_order(void)
{
    struct kv_pool p;
    kv_pool_init(&p, 6, 2, "m", 1);
    int32_t ta[6] = {1, 1, 2, 2, 3, 3}, tb[6] = {9, 9, 8, 8, 7, 7};
    struct kv_hash ha[3], hb[3];
    chain(&p, ta, 3, ha);
    chain(&p, tb, 3, hb);
    int32_t a[3], b[3];
    kv_allocate(&p, 3, a);
    kv_allocate(&p, 3, b);
    for (int i = 0; i < 3; i++) {
        kv_commit_hash(&p, a[i], ha[i]);
        kv_commit_hash(&p, b[i], hb[i]);
    }
    kv_release(&p, a, 3); /* A freed first: least recently used */
    kv_release(&p, b, 3);
    CHECK(p.n_cached == 6, "cached %d", p.n_cached);
    /* Expected eviction order: A's tail, middle, head, then B's tail, middle, head. */
    int32_t want[6] = {a[2], a[1], a[0], b[2], b[1], b[0]};
    for (int i = 0; i < 6; i++) {
        int32_t got;
        kv_allocate(&p, 1, &got);
        CHECK(got == want[i], "eviction %d: got block %d, want %d", i, got, want[i]);
        /* its name is gone from the index */
        struct kv_hash *hh = i < 3 ? &ha[2 - i] : &hb[5 - i];
        CHECK(kv_lookup(&p, *hh) == -1, "evicted hash %d still indexed", i);
    }
    /* The other names stay findable until evicted (checked above one by one). */
    CHECK(kv_num_free(&p) == 0 && p.n_cached == 0, "pool exhausted");
    kv_release(&p, want, 6);
    CHECK(kv_num_free(&p) == 6, "all back");
    kv_pool_dispose(&p);
}

/* Touching a cached block refreshes it: it leaves the free list and, when freed again,
 * becomes the most recently used. */
static void test_touch_refreshes(void)
{
    struct kv_pool p;
    kv_pool_init(&p, 3, 1, "m", 1);
    int32_t t[3] = {5, 6, 7};
    struct kv_hash h[3];
    int32_t blk[3];
    kv_allocate(&p, 3, blk);
    for (int i = 0; i < 3; i++) {
        h[i] = kv_block_hash(&p, NULL, &t[i], 1, NULL, 0);
        kv_commit_hash(&p, blk[i], h[i]);
        kv_release(&p, &blk[i], 1);
    }
    kv_touch(&p, &blk[0], 1);
    kv_release(&p, &blk[0], 1);
    int32_t got[3];
    kv_allocate(&p, 3, got);
    CHECK(got[0] == blk[1] && got[1] == blk[2] && got[2] == blk[0], "order %d %d %d", got[0],
          got[1], got[2]);
    kv_release(&p, got, 3);
    kv_pool_dispose(&p);
}

/* Random mixes of allocate / share / commit / release from many owners: the pool's counts
 * always agree with a recount, and everything returns at the end. */
static void test_random_no_leak(void)
{
    struct kv_pool p;
    kv_pool_init(&p, 64, 4, "m", 1);
    struct rng r;
    rng_seed(&r, 7);
    enum { OWNERS = 12, MAXB = 16 };
    int32_t own[OWNERS][MAXB];
    int n_own[OWNERS] = {0};
    for (int it = 0; it < 20000; it++) {
        int o = (int)(rng_next(&r) % OWNERS);
        int op = (int)(rng_next(&r) % 4);
        if (op == 0 && n_own[o] < MAXB) {
            int want = 1 + (int)(rng_next(&r) % (uint64_t)(MAXB - n_own[o]));
            if (kv_can_allocate(&p, want, NULL, 0)) {
                CHECK(kv_allocate(&p, want, own[o] + n_own[o]) == 0, "allocate");
                n_own[o] += want;
            } else {
                CHECK(kv_allocate(&p, want, own[o] + n_own[o]) == -1, "can_allocate agrees");
            }
        } else if (op == 1 && n_own[o]) {
            int32_t tok = (int32_t)(rng_next(&r) % 5);
            int32_t toks[4] = {tok, tok, tok, tok};
            struct kv_hash h = kv_block_hash(&p, NULL, toks, 4, NULL, 0);
            kv_commit_hash(&p, own[o][rng_next(&r) % (uint64_t)n_own[o]], h);
        } else if (op == 2) {
            /* share another owner's blocks (prefix hit) */
            int src = (int)(rng_next(&r) % OWNERS);
            int n = n_own[src] < MAXB - n_own[o] ? n_own[src] : MAXB - n_own[o];
            if (src != o && n > 0) {
                kv_touch(&p, own[src], n);
                memcpy(own[o] + n_own[o], own[src], sizeof(int32_t) * (size_t)n);
                n_own[o] += n;
            }
        } else {
            kv_release(&p, own[o], n_own[o]); /* finish, abort or preempt */
            n_own[o] = 0;
        }
        int free_cnt = 0, cached = 0, refs = 0, held = 0;
        for (int i = 0; i < p.n_blocks; i++) {
            free_cnt += p.b[i].ref == 0;
            cached += p.b[i].ref == 0 && p.b[i].hashed;
            refs += p.b[i].ref;
        }
        for (int k = 0; k < OWNERS; k++) held += n_own[k];
        if (free_cnt != kv_num_free(&p) || cached != p.n_cached || refs != held) {
            CHECK(0, "iteration %d: free %d/%d cached %d/%d refs %d/%d", it, free_cnt,
                  kv_num_free(&p), cached, p.n_cached, refs, held);
            break;
        }
    }
    for (int k = 0; k < OWNERS; k++) kv_release(&p, own[k], n_own[k]);
    CHECK(kv_num_free(&p) == 64, "no leak: %d free", kv_num_free(&p));
    /* every indexed block is findable under its own hash */
    int indexed = 0;
    for (int i = 0; i < p.n_blocks; i++)
        if (p.b[i].hashed) {
            indexed++;
            CHECK(kv_lookup(&p, p.b[i].hash) == i, "block %d findable", i);
        }
    CHECK(indexed == p.n_cached, "indexed %d cached %d", indexed, p.n_cached);
    kv_pool_dispose(&p);
}

int main(void)
{
    test_alloc_order();
    test_hash_and_hits();
    test_eviction_order();
    test_touch_refreshes();
    test_random_no_leak();
    TEST_DONE();
}
