#include "paged_kv/kv_host.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

enum slot_state { SLOT_FREE, SLOT_FILLING, SLOT_READY };

struct slot {
    struct kv_hash hash;
    uint64_t ticket;    /* its copy down's ticket; 0 before one is taken */
    int32_t prev, next; /* LRU links (held, unpinned slots); next: the free stack's too */
    int32_t chain;      /* the next slot in its index bucket, -1 at the end */
    int32_t pin;        /* loads reading it */
    uint64_t in_ticket; /* put: its copy up's ticket; 0 before one is taken */
    uint8_t state, in_pend, in_lru;
    uint8_t down;    /* a report to the lower tier due: never evicted before it is taken */
    uint8_t in_busy; /* put: its copy up not seen complete (the host must not write it) */
};

struct kv_host {
    char *mem;
    size_t bb;
    int n;
    struct slot *s;
    int32_t *bucket; /* [mask + 1] first slot of each chain, -1: none */
    uint32_t mask;
    int32_t lru_head, lru_tail, free_head; /* head: evicted first */
    int32_t *pend;                         /* [n] slots filling or with a report due */
    int n_pend;
    int unmarked; /* copies queued since the last ticket */
    /* per device block: its last copy down went into slot out_slot, queued while the
     * fence count was out_gen (has_out 0: none since the last fence) */
    int32_t *out_slot;
    uint32_t *out_gen;
    uint8_t *has_out;
    /* stores for the lower tier waiting for a slot, oldest first: a list over device blocks
     * (wl_prev/wl_next, -1 at the ends), each with its hash; reusing a block unlinks it */
    int32_t *wl_prev, *wl_next, wl_head, wl_tail;
    struct kv_hash *wl_hash;
    uint8_t *waiting;
    int device_blocks;
    uint32_t fence_gen;
    struct kv_host_copy c;
    struct kv_host_stats st;
};

static int hash_eq(struct kv_hash a, struct kv_hash b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

static int32_t find(const struct kv_host *h, struct kv_hash x)
{
    for (int32_t i = h->bucket[x.lo & h->mask]; i >= 0; i = h->s[i].chain)
        if (hash_eq(h->s[i].hash, x)) return i;
    return -1;
}

static void index_add(struct kv_host *h, int32_t i)
{
    int32_t *b = &h->bucket[h->s[i].hash.lo & h->mask];
    h->s[i].chain = *b;
    *b = i;
}

static void index_del(struct kv_host *h, int32_t i)
{
    int32_t *p = &h->bucket[h->s[i].hash.lo & h->mask];
    while (*p != i) p = &h->s[*p].chain;
    *p = h->s[i].chain;
}

static void lru_del(struct kv_host *h, int32_t i)
{
    struct slot *s = &h->s[i];
    if (!s->in_lru) return;
    if (s->prev >= 0)
        h->s[s->prev].next = s->next;
    else
        h->lru_head = s->next;
    if (s->next >= 0)
        h->s[s->next].prev = s->prev;
    else
        h->lru_tail = s->prev;
    s->in_lru = 0;
}

static void lru_add_tail(struct kv_host *h, int32_t i)
{
    struct slot *s = &h->s[i];
    assert(!s->in_lru && !s->pin);
    s->prev = h->lru_tail;
    s->next = -1;
    if (h->lru_tail >= 0)
        h->s[h->lru_tail].next = i;
    else
        h->lru_head = i;
    h->lru_tail = i;
    s->in_lru = 1;
}

/* A slot may be evicted once no load reads it and its report below has been taken. */
static void lru_settle(struct kv_host *h, int32_t i)
{
    struct slot *s = &h->s[i];
    if (!s->in_lru && !s->pin && !s->down && s->state != SLOT_FREE) lru_add_tail(h, i);
}

static void pend_add(struct kv_host *h, int32_t i)
{
    if (h->s[i].in_pend) return;
    h->s[i].in_pend = 1;
    h->pend[h->n_pend++] = i;
}

struct kv_host *kv_host_create(const struct kv_host_config *cfg)
{
    assert(cfg->slots > 0 && cfg->block_bytes > 0 && cfg->device_blocks > 0);
    struct kv_host *h = xcalloc(1, sizeof *h);
    h->mem = cfg->mem;
    h->bb = cfg->block_bytes;
    h->n = cfg->slots;
    h->c = cfg->copy;
    h->s = xcalloc((size_t)h->n, sizeof *h->s);
    uint32_t nb = 1;
    while (nb < 2u * (uint32_t)h->n) nb <<= 1;
    h->mask = nb - 1;
    h->bucket = xmalloc(sizeof(int32_t) * nb);
    memset(h->bucket, 0xff, sizeof(int32_t) * nb);
    h->pend = xmalloc(sizeof(int32_t) * (size_t)h->n);
    h->lru_head = h->lru_tail = -1;
    /* the free stack hands out slot 0 first */
    h->free_head = 0;
    for (int i = 0; i < h->n; i++) h->s[i].next = i + 1 < h->n ? i + 1 : -1;
    h->device_blocks = cfg->device_blocks;
    h->out_slot = xmalloc(sizeof(int32_t) * (size_t)cfg->device_blocks);
    h->out_gen = xcalloc((size_t)cfg->device_blocks, sizeof(uint32_t));
    h->has_out = xcalloc((size_t)cfg->device_blocks, 1);
    h->wl_prev = xmalloc(sizeof(int32_t) * (size_t)cfg->device_blocks);
    h->wl_next = xmalloc(sizeof(int32_t) * (size_t)cfg->device_blocks);
    h->wl_hash = xmalloc(sizeof(struct kv_hash) * (size_t)cfg->device_blocks);
    h->waiting = xcalloc((size_t)cfg->device_blocks, 1);
    h->wl_head = h->wl_tail = -1;
    h->st.slots = (uint64_t)h->n;
    return h;
}

void kv_host_destroy(struct kv_host *h)
{
    if (!h) return;
    free(h->s);
    free(h->bucket);
    free(h->pend);
    free(h->out_slot);
    free(h->out_gen);
    free(h->has_out);
    free(h->wl_prev);
    free(h->wl_next);
    free(h->wl_hash);
    free(h->waiting);
    free(h);
}

static void *slot_mem(const struct kv_host *h, int32_t i)
{
    return h->mem + (size_t)i * h->bb;
}

/* A slot for a new block: a free one, else the least recently used unpinned one (quiet:
 * only a ready one that no copy reads, whose bytes the host may overwrite at once). -1:
 * none. */
static int32_t take_slot(struct kv_host *h, int quiet)
{
    int32_t i = h->free_head;
    if (i >= 0) {
        h->free_head = h->s[i].next;
        h->st.blocks++;
        return i;
    }
    i = h->lru_head;
    if (i < 0 || (quiet && (h->s[i].state != SLOT_READY || h->s[i].in_busy))) return -1;
    lru_del(h, i);
    index_del(h, i);
    h->st.evicted_blocks++;
    return i;
}

static void wait_add(struct kv_host *h, struct kv_hash hash, int32_t b)
{
    h->wl_hash[b] = hash;
    if (h->waiting[b]) return;
    h->waiting[b] = 1;
    h->wl_prev[b] = h->wl_tail;
    h->wl_next[b] = -1;
    if (h->wl_tail >= 0)
        h->wl_next[h->wl_tail] = b;
    else
        h->wl_head = b;
    h->wl_tail = b;
    h->st.store_deferred++;
}

static void wait_del(struct kv_host *h, int32_t b)
{
    if (h->wl_prev[b] >= 0)
        h->wl_next[h->wl_prev[b]] = h->wl_next[b];
    else
        h->wl_head = h->wl_next[b];
    if (h->wl_next[b] >= 0)
        h->wl_prev[h->wl_next[b]] = h->wl_prev[b];
    else
        h->wl_tail = h->wl_prev[b];
    h->waiting[b] = 0;
}

/* hash is held in slot i: most recently used, and reported below if down. */
static void store_held(struct kv_host *h, int32_t i, int down)
{
    struct slot *s = &h->s[i];
    if (s->in_lru) {
        lru_del(h, i);
        if (!down || s->down) lru_add_tail(h, i);
    }
    if (down && !s->down) {
        s->down = 1;
        pend_add(h, i); /* a ready slot is reported by the next poll */
    }
}

/* Slot i (just taken) receives device block `block` under hash. */
static void store_into(struct kv_host *h, int32_t i, struct kv_hash hash, int32_t block, int down)
{
    struct slot *s = &h->s[i];
    s->hash = hash;
    s->state = SLOT_FILLING;
    s->ticket = 0;
    s->down = (uint8_t)(down != 0);
    s->pin = 0;
    index_add(h, i);
    if (!s->down) lru_add_tail(h, i);
    pend_add(h, i);
    h->c.out(h->c.user, block, slot_mem(h, i));
    h->unmarked = 1;
    h->out_slot[block] = i;
    h->out_gen[block] = h->fence_gen;
    h->has_out[block] = 1;
    h->st.stored_blocks++;
}

int kv_host_store(struct kv_host *h, struct kv_hash hash, int32_t block, int down)
{
    assert(block >= 0 && block < h->device_blocks);
    int32_t i = find(h, hash);
    if (i >= 0) {
        store_held(h, i, down);
        return 1;
    }
    /* blocks already waiting go first: a slot freed is theirs */
    i = down && h->wl_head >= 0 ? -1 : take_slot(h, 0);
    if (i < 0) {
        if (down) { /* the lower tier wants it: it waits for a slot (kv_host_poll) */
            wait_add(h, hash, block);
            return 1;
        }
        h->st.store_dropped++;
        return 0;
    }
    store_into(h, i, hash, block, down);
    return 1;
}

/* Queues slot i's copy up into device block `block`; the slot stays busy until it is done. */
static void put_copy(struct kv_host *h, int32_t i, int32_t block)
{
    h->c.in(h->c.user, block, slot_mem(h, i));
    h->s[i].in_busy = 1;
    h->s[i].in_ticket = 0;
    pend_add(h, i);
    h->unmarked = 1;
    h->st.load_blocks++;
}

int kv_host_put(struct kv_host *h, struct kv_hash hash, const void *raw, int32_t block)
{
    int32_t i = find(h, hash);
    if (i < 0) {
        i = take_slot(h, 1);
        if (i < 0) return -1;
        struct slot *s = &h->s[i];
        s->hash = hash;
        s->state = SLOT_READY;
        s->ticket = 0;
        s->down = 0;
        s->pin = 0;
        index_add(h, i);
        lru_add_tail(h, i);
        memcpy(slot_mem(h, i), raw, h->bb);
    } /* else held already (stored since the probe): copied up from there */
    put_copy(h, i, block);
    return 0;
}

int kv_host_has(const struct kv_host *h, struct kv_hash hash)
{
    return find(h, hash) >= 0;
}

int kv_host_probe(const struct kv_host *h, const struct kv_hash *hashes, int n)
{
    int i = 0;
    while (i < n && find(h, hashes[i]) >= 0) i++;
    return i;
}

uint64_t kv_host_mark(struct kv_host *h)
{
    uint64_t t = h->c.mark(h->c.user);
    for (int k = 0; k < h->n_pend; k++) {
        struct slot *s = &h->s[h->pend[k]];
        if (s->state == SLOT_FILLING && !s->ticket) s->ticket = t;
        if (s->in_busy && !s->in_ticket) s->in_ticket = t;
    }
    h->unmarked = 0;
    return t;
}

uint64_t kv_host_load(struct kv_host *h, const struct kv_hash *hashes, const int32_t *blocks, int n)
{
    for (int k = 0; k < n; k++) {
        int32_t i = find(h, hashes[k]);
        assert(i >= 0);
        lru_del(h, i);
        h->s[i].pin++;
        h->c.in(h->c.user, blocks[k], slot_mem(h, i));
    }
    h->st.load_blocks += (uint64_t)n;
    h->unmarked = 1;
    return kv_host_mark(h);
}

int kv_host_done(struct kv_host *h, uint64_t t)
{
    return h->c.done(h->c.user, t);
}

void kv_host_unpin(struct kv_host *h, const struct kv_hash *hashes, int n)
{
    for (int k = 0; k < n; k++) {
        int32_t i = find(h, hashes[k]);
        assert(i >= 0 && h->s[i].pin > 0);
        h->s[i].pin--;
        lru_settle(h, i);
    }
}

void kv_host_reuse(struct kv_host *h, const int32_t *blocks, int n)
{
    int fence = 0;
    for (int k = 0; k < n; k++) {
        int32_t b = blocks[k];
        if (b < 0) continue;
        if (h->waiting[b]) { /* rewritten before a slot freed for it: lost */
            wait_del(h, b);
            h->st.store_dropped++;
        }
        if (!h->has_out[b]) continue;
        h->has_out[b] = 0;
        /* the slot ready: its copies down have completed, this one among them (a slot
         * taken again since holds a later copy, which completes after it) */
        if (h->out_gen[b] == h->fence_gen && h->s[h->out_slot[b]].state != SLOT_READY) fence = 1;
    }
    if (!fence) return;
    h->c.fence(h->c.user);
    h->fence_gen++;
    h->st.fences++;
}

void kv_host_poll(struct kv_host *h, kv_host_ready_fn fn, void *user)
{
    if (h->unmarked) kv_host_mark(h);
    int keep = 0, full = 0;
    for (int k = 0; k < h->n_pend; k++) {
        int32_t i = h->pend[k];
        struct slot *s = &h->s[i];
        if (s->in_busy && s->in_ticket && h->c.done(h->c.user, s->in_ticket)) s->in_busy = 0;
        if (s->state == SLOT_FILLING && s->ticket && h->c.done(h->c.user, s->ticket))
            s->state = SLOT_READY;
        if (s->down && s->state == SLOT_READY) {
            /* refused (the lower tier's queue is full): kept, offered again next poll */
            if (full || (fn && !fn(user, s->hash, slot_mem(h, i))))
                full = 1;
            else
                s->down = 0;
            lru_settle(h, i);
        }
        if (s->in_busy || s->state == SLOT_FILLING || s->down) {
            h->pend[keep++] = i;
            continue;
        }
        s->in_pend = 0;
    }
    h->n_pend = keep;
    /* stores waiting for a slot take those freed, oldest first; their device blocks still
     * hold the bytes (kv_host_reuse unlinks a block before it is written again) */
    while (h->wl_head >= 0) {
        int32_t b = h->wl_head, i = find(h, h->wl_hash[b]);
        if (i >= 0) { /* stored again since, from another block */
            wait_del(h, b);
            store_held(h, i, 1);
            continue;
        }
        if ((i = take_slot(h, 0)) < 0) break;
        wait_del(h, b);
        store_into(h, i, h->wl_hash[b], b, 1);
    }
    if (h->unmarked) kv_host_mark(h);
}

const void *kv_host_bytes(const struct kv_host *h, struct kv_hash hash)
{
    int32_t i = find(h, hash);
    return i >= 0 && h->s[i].state == SLOT_READY ? slot_mem(h, i) : NULL;
}

void kv_host_stats(const struct kv_host *h, struct kv_host_stats *out)
{
    *out = h->st;
}
