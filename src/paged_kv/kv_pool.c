#include "paged_kv/kv_pool.h"

#include <stdlib.h>
#include <string.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "common/util.h"
#include "paged_kv/kv_events.h"

/* ---- the free list ---- */

static void list_unlink(struct kv_pool *p, int32_t id)
{
    struct kv_block *b = &p->b[id];
    if (b->prev >= 0)
        p->b[b->prev].next = b->next;
    else
        p->head = b->next;
    if (b->next >= 0)
        p->b[b->next].prev = b->prev;
    else
        p->tail = b->prev;
    b->prev = b->next = -1;
    b->in_free = 0;
    p->n_free--;
    if (b->hashed) p->n_cached--;
}

static void list_push_tail(struct kv_pool *p, int32_t id)
{
    struct kv_block *b = &p->b[id];
    b->prev = p->tail;
    b->next = -1;
    if (p->tail >= 0)
        p->b[p->tail].next = id;
    else
        p->head = id;
    p->tail = id;
    b->in_free = 1;
    p->n_free++;
    if (b->hashed) p->n_cached++;
}

static void list_push_head(struct kv_pool *p, int32_t id)
{
    struct kv_block *b = &p->b[id];
    b->next = p->head;
    b->prev = -1;
    if (p->head >= 0)
        p->b[p->head].prev = id;
    else
        p->tail = id;
    p->head = id;
    b->in_free = 1;
    p->n_free++;
    if (b->hashed) p->n_cached++;
}

/* ---- the hash index (linear probing, backward-shift deletion) ---- */

static uint32_t slot_of(const struct kv_pool *p, struct kv_hash h)
{
    return (uint32_t)h.lo & p->index_mask;
}

static int same(struct kv_hash a, struct kv_hash b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

int32_t kv_lookup(const struct kv_pool *p, struct kv_hash h)
{
    for (uint32_t i = slot_of(p, h);; i = (i + 1) & p->index_mask) {
        int32_t id = p->index[i];
        if (id < 0) return -1;
        if (same(p->b[id].hash, h)) return id;
    }
}

static void index_insert(struct kv_pool *p, int32_t id)
{
    uint32_t i = slot_of(p, p->b[id].hash);
    while (p->index[i] >= 0) i = (i + 1) & p->index_mask;
    p->index[i] = id;
}

static void index_remove(struct kv_pool *p, int32_t id)
{
    uint32_t i = slot_of(p, p->b[id].hash);
    while (p->index[i] != id) i = (i + 1) & p->index_mask;
    /* Shift later members of the probe run back over the hole. */
    uint32_t hole = i;
    for (uint32_t j = (i + 1) & p->index_mask; p->index[j] >= 0; j = (j + 1) & p->index_mask) {
        uint32_t home = slot_of(p, p->b[p->index[j]].hash);
        /* Entry j may fill the hole when its home is not in (hole, j]. */
        int between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!between) {
            p->index[hole] = p->index[j];
            hole = j;
        }
    }
    p->index[hole] = -1;
}

/* ---- the pool ---- */

void kv_pool_init(struct kv_pool *p, int n_blocks, int block_size, const void *fingerprint,
                  size_t fp_len)
{
    memset(p, 0, sizeof *p);
    p->n_blocks = n_blocks;
    p->block_size = block_size;
    p->b = xcalloc((size_t)n_blocks, sizeof *p->b);
    p->head = p->tail = -1;
    for (int i = 0; i < n_blocks; i++) {
        p->b[i].prev = p->b[i].next = -1;
        list_push_tail(p, i);
    }
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n_blocks) cap <<= 1;
    p->index = xmalloc(sizeof(int32_t) * cap);
    memset(p->index, 0xff, sizeof(int32_t) * cap);
    p->index_mask = cap - 1;
    XXH128_hash_t r = XXH3_128bits(fingerprint, fp_len);
    p->root.lo = r.low64;
    p->root.hi = r.high64;
}

void kv_pool_dispose(struct kv_pool *p)
{
    free(p->b);
    free(p->index);
    memset(p, 0, sizeof *p);
}

struct kv_hash kv_block_hash(const struct kv_pool *p, const struct kv_hash *parent,
                             const int32_t *tokens, int n, const void *extra, size_t extra_len)
{
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    const struct kv_hash *par = parent ? parent : &p->root;
    uint64_t ph[2] = {par->lo, par->hi};
    XXH3_128bits_update(&st, ph, sizeof ph);
    XXH3_128bits_update(&st, tokens, sizeof(int32_t) * (size_t)n);
    if (extra_len) XXH3_128bits_update(&st, extra, extra_len);
    XXH128_hash_t r = XXH3_128bits_digest(&st);
    return (struct kv_hash){r.low64, r.high64};
}

int kv_lookup_prefix(const struct kv_pool *p, const struct kv_hash *hashes, int n, int32_t *out)
{
    int i = 0;
    for (; i < n; i++) {
        int32_t id = kv_lookup(p, hashes[i]);
        if (id < 0) break;
        out[i] = id;
    }
    return i;
}

int kv_can_allocate(const struct kv_pool *p, int n_new, const int32_t *hits, int n_hits)
{
    int avail = p->n_free;
    for (int i = 0; i < n_hits; i++)
        if (p->b[hits[i]].ref == 0) avail--;
    return n_new <= avail;
}

void kv_touch(struct kv_pool *p, const int32_t *blocks, int n)
{
    for (int i = 0; i < n; i++) {
        struct kv_block *b = &p->b[blocks[i]];
        if (b->ref == 0 && b->in_free) list_unlink(p, blocks[i]);
        b->ref++;
    }
}

int kv_allocate(struct kv_pool *p, int n, int32_t *out)
{
    if (n > p->n_free) return -1;
    for (int i = 0; i < n; i++) {
        int32_t id = p->head;
        list_unlink(p, id);
        struct kv_block *b = &p->b[id];
        if (b->hashed) {
            index_remove(p, id);
            b->hashed = 0;
            if (p->events) kv_events_removed(p->events, b->hash);
        }
        b->ref = 1;
        out[i] = id;
    }
    return 0;
}

void kv_release(struct kv_pool *p, const int32_t *blocks, int n)
{
    /* Tail first: each hashed block joins the LRU tail, so the request's last blocks end
     * up nearer the head (evicted sooner) than its first ones. */
    for (int i = n - 1; i >= 0; i--) {
        int32_t id = blocks[i];
        if (id < 0) continue;
        struct kv_block *b = &p->b[id];
        if (--b->ref > 0) continue;
        if (b->hashed)
            list_push_tail(p, id);
        else
            list_push_head(p, id);
    }
}

int kv_commit_hash(struct kv_pool *p, int32_t block, struct kv_hash h)
{
    struct kv_block *b = &p->b[block];
    if (b->hashed) return 0;
    if (kv_lookup(p, h) >= 0) return 0;
    b->hash = h;
    b->hashed = 1;
    if (b->in_free) p->n_cached++;
    index_insert(p, block);
    return 1;
}
