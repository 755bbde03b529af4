/*
 * kv_pool: the block-paged KV pool's bookkeeping (the storage itself belongs to the
 * backend). Blocks of block_size tokens, each holding every layer's K and V, with a
 * reference count. A full block is named by a 128-bit hash of (its parent block's hash,
 * its token ids, extra keys); the first block's parent is a fingerprint of the model and
 * KV format. A hash index maps those names to blocks, so a request whose prompt starts
 * with cached blocks shares them instead of recomputing.
 *
 * Free blocks (reference count 0) sit in an intrusive LRU list: allocation takes the head
 * (least recently used) and drops its hash; blocks without a hash go to the head, hashed
 * ones to the tail, a request's tail blocks ahead of its head blocks so that the prefix
 * survives longest. Allocation is plan-then-commit: kv_can_allocate changes nothing.
 */
#ifndef PAGODA_PAGED_KV_KV_POOL_H
#define PAGODA_PAGED_KV_KV_POOL_H

#include <stddef.h>
#include <stdint.h>

struct kv_hash {
    uint64_t lo, hi;
};

struct kv_events;

struct kv_block {
    struct kv_hash hash;
    int32_t ref;
    int32_t prev, next; /* free-list links, -1 at the ends */
    uint8_t hashed;     /* registered in the index under hash */
    uint8_t in_free;
};

struct kv_pool {
    int n_blocks, block_size;
    struct kv_block *b;
    int32_t head, tail;   /* free list: head is evicted first */
    int n_free, n_cached; /* free blocks; of those, the ones with a hash */
    int32_t *index;       /* open addressing: block id or -1 */
    uint32_t index_mask;
    struct kv_hash root; /* parent of every first block */
    /* when set, each eviction from the index is reported (kv_events.h); NULL by default */
    struct kv_events *events;
};

/** Sets up n_blocks free blocks; the fingerprint (model, KV format) seeds the hash chain. */
void kv_pool_init(struct kv_pool *p, int n_blocks, int block_size, const void *fingerprint,
                  size_t fp_len);
void kv_pool_dispose(struct kv_pool *p);

/** XXH3-128 of (parent or the root when NULL, tokens, extra). */
struct kv_hash kv_block_hash(const struct kv_pool *p, const struct kv_hash *parent,
                             const int32_t *tokens, int n, const void *extra, size_t extra_len);

/** The block cached under h, or -1. Changes nothing. */
int32_t kv_lookup(const struct kv_pool *p, struct kv_hash h);

/** How many of hashes[0..n) hit consecutively from the first; their blocks into out. */
int kv_lookup_prefix(const struct kv_pool *p, const struct kv_hash *hashes, int n, int32_t *out);

/** Whether n_new fresh blocks fit once the hit blocks (some maybe free) are taken. */
int kv_can_allocate(const struct kv_pool *p, int n_new, const int32_t *hits, int n_hits);

/** Takes a reference on each block (a free one leaves the free list, keeping its hash). */
void kv_touch(struct kv_pool *p, const int32_t *blocks, int n);

/** Takes n fresh blocks off the LRU head (evicting their hashes, each reported to events
 * when set); -1 when fewer are free. */
int kv_allocate(struct kv_pool *p, int n, int32_t *out);

/** Drops a reference on blocks[0..n) (a request's table, head first; entries < 0 are
 * skipped). Freed blocks join the free list, tail blocks ahead of head blocks. */
void kv_release(struct kv_pool *p, const int32_t *blocks, int n);

/** Registers a full block's hash and returns 1; a no-op returning 0 if the block already has
 * a hash or another block holds this one. */
int kv_commit_hash(struct kv_pool *p, int32_t block, struct kv_hash h);

static inline int kv_num_free(const struct kv_pool *p)
{
    return p->n_free;
}

#endif
