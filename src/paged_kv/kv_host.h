/*
 * kv_host: the host-memory tier (L2) behind a device KV pool: a fixed arena of pinned
 * host memory cut into slots of one block each, named by block hash, kept in LRU order.
 * The copies themselves belong to a copy engine (struct kv_host_copy: on CUDA a copy
 * stream beside the step's stream); this module decides what goes where and when a
 * slot or a device block may be reused, and never waits for a copy.
 *
 *     struct kv_host *h = kv_host_create(&cfg);  // cfg.mem: the arena, cfg.copy: the engine
 *     kv_host_store(h, hash, block, 0);          // a committed block: copied down behind the step
 *     kv_host_reuse(h, blocks, n);               // device blocks just allocated (fences if needed)
 *     int n = kv_host_probe(h, hashes, m);       // a prefix that missed the pool
 *     uint64_t t = kv_host_load(h, hashes, blocks, n);   // copies up, slots pinned
 *     ... each step: kv_host_poll(h, fn, user); when kv_host_done(h, t): kv_host_unpin ...
 *
 * Ordering contract of the copy engine: copies run in the order they are queued, each
 * after the step work queued before it; a ticket from mark() completes once every copy
 * queued before it has. So a load queued after a store of the same slot reads the
 * stored bytes, and a store into a slot queued after a load from it runs after the load.
 *
 * Slots: FREE, FILLING (a copy down queued, in the index: loads may follow it), READY
 * (its bytes are in host memory). A slot with loads in progress is pinned (pin > 0), and
 * one whose block the lower tier has not taken yet is held for it: neither is evicted, so
 * a prefix larger than the slots still reaches the lower tier whole, at its pace. Costs: every call
 * is O(blocks named) plus O(copies pending) for poll. Threads: one (the engine's).
 */
#ifndef PAGODA_PAGED_KV_KV_HOST_H
#define PAGODA_PAGED_KV_KV_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "paged_kv/kv_pool.h"

/* The copy engine between device blocks and host memory. */
struct kv_host_copy {
    void *user;
    /** Queues a copy of device block `block` into host memory dst [block_bytes]. */
    void (*out)(void *user, int32_t block, void *dst);
    /** Queues a copy of host memory src [block_bytes] into device block `block`. */
    void (*in)(void *user, int32_t block, const void *src);
    /** A ticket (> 0, increasing) that completes once every copy queued so far has. */
    uint64_t (*mark)(void *user);
    /** Whether ticket t has completed; never waits. */
    int (*done)(void *user, uint64_t t);
    /** Makes the step work queued from now on wait (on the device, not the host) for every
     * copy queued so far. */
    void (*fence)(void *user);
};

struct kv_host_config {
    void *mem;          /* the arena: slots * block_bytes bytes (pinned), owned by the caller */
    int slots;          /* blocks it holds */
    size_t block_bytes; /* bytes of one block */
    int device_blocks;  /* blocks of the device pool */
    struct kv_host_copy copy;
};

struct kv_host_stats {
    uint64_t blocks;         /* slots holding a block (filling or ready) */
    uint64_t slots;          /* capacity in blocks */
    uint64_t stored_blocks;  /* copies down queued */
    uint64_t store_dropped;  /* stores dropped: every slot pinned (or, for the lower tier,
                              * the device block rewritten while it waited for a slot) */
    uint64_t store_deferred; /* stores for the lower tier that waited for a slot */
    uint64_t evicted_blocks; /* blocks dropped to make room (LRU) */
    uint64_t load_blocks;    /* blocks copied up for loads */
    uint64_t fences;         /* device blocks reused while their copy down was pending */
};

/** Called for each block whose copy down has completed and that was stored with down=1:
 * bytes [block_bytes] in host memory, valid during the call. Returns 1 when taken, 0 when
 * the lower tier has no room now: the slot keeps the block (never evicted) and it is
 * offered again by the next poll, in order. */
typedef int (*kv_host_ready_fn)(void *user, struct kv_hash h, const void *bytes);

struct kv_host;

/** Sets up the bookkeeping over cfg->mem (not copied, not freed). */
struct kv_host *kv_host_create(const struct kv_host_config *cfg);
void kv_host_destroy(struct kv_host *h);

/** Copies device block `block`, named h, down (unless held already: then it only becomes the
 * most recently used). down: report it through kv_host_poll's fn once in host memory (a
 * lower tier wants it); such a slot is not evicted before its report is taken, and when no
 * slot is free the store waits (kv_host_poll queues it once one frees, oldest first;
 * kv_host_reuse of the block drops it, counted). 1 queued, waiting or held; 0 dropped
 * (down == 0 and every slot pinned or reported below). */
int kv_host_store(struct kv_host *h, struct kv_hash hash, int32_t block, int down);

/** Puts a block that came from below (raw [block_bytes], host memory) under hash and queues
 * its copy up into device block `block` (complete once a later kv_host_mark() ticket is).
 * 0, or -1 when no slot is free of copies and pins (the caller copies it up another way). */
int kv_host_put(struct kv_host *h, struct kv_hash hash, const void *raw, int32_t block);

/** Whether h is held (filling or ready). */
int kv_host_has(const struct kv_host *h, struct kv_hash hash);
/** How many of hashes[0..n) are held consecutively from the first. */
int kv_host_probe(const struct kv_host *h, const struct kv_hash *hashes, int n);

/** Queues copies of hashes[i] (held: kv_host_probe) into device blocks[i], i < n, and pins
 * their slots (kv_host_unpin once the ticket returned has completed). */
uint64_t kv_host_load(struct kv_host *h, const struct kv_hash *hashes, const int32_t *blocks,
                      int n);
/** A ticket covering every copy queued so far. */
uint64_t kv_host_mark(struct kv_host *h);
/** Whether ticket t has completed. */
int kv_host_done(struct kv_host *h, uint64_t t);
/** Drops the pins of kv_host_load on hashes[0..n). */
void kv_host_unpin(struct kv_host *h, const struct kv_hash *hashes, int n);

/** Device blocks[0..n) were just allocated and the next steps write them: when one still has
 * a copy down pending, the step's later work is fenced behind the copies (counted). */
void kv_host_reuse(struct kv_host *h, const int32_t *blocks, int n);

/** Moves completed copies down to ready, reports those stored with down=1 through fn (NULL:
 * taken), queues the copies of waiting stores into slots freed, and takes a ticket for the
 * copies queued since the last one. */
void kv_host_poll(struct kv_host *h, kv_host_ready_fn fn, void *user);

/** The bytes of h when ready, else NULL (valid until the next call that stores or puts). */
const void *kv_host_bytes(const struct kv_host *h, struct kv_hash hash);

void kv_host_stats(const struct kv_host *h, struct kv_host_stats *out);

#endif
