/*
 * The engine's side of the tiers below the pool: host memory (paged_kv/kv_host.h, backends
 * with a copy engine) and disk (paged_kv/kv_tier.h). Full blocks go down as their hashes
 * are committed (write-through: an eviction from the pool then costs nothing); a waiting
 * request whose prefix continues in a tier past the pool's hits loads those blocks while
 * the others step, unless recomputing them is estimated to be faster (disk).
 *
 * With a copy engine (CUDA) every block moves through the host tier's pinned slots: down,
 * device -> slot -> disk writer; up, disk -> slot -> device. Without one (the CPU, whose
 * pool is host memory) the disk tier reads and writes pool blocks directly.
 *
 * Hybrid models resume a prefix only where a recurrent-state snapshot ends it. Snapshots
 * go down the same way as blocks, written through as they are named in the state pool:
 * with a copy engine into a second host tier (en->host_snap: slots of a snapshot's size in
 * the same pinned arena, over state slots instead of pool blocks) and on to the disk from
 * there; without one straight into the disk's queue (model_state_image_read). A load covers the
 * longest prefix whose blocks (pool, host, disk) and snapshot (state pool, host, disk) are
 * both found; a snapshot the state pool lacks is copied up (host) or read (disk) into a
 * state slot of its own and named there once the load ends.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/util.h"
#include "model/backend.h"
#include "model/kv_block.h"
#include "paged_kv/kv_events.h"
#include "sched/engine_impl.h"

/* The store queue holds two full steps of blocks, within this many bytes. */
#define TIER_QUEUE_BYTES ((size_t)128 << 20)
/* Pinned staging of a disk tier on a backend with a copy engine and no --kv-host-memory. */
#define TIER_STAGING_BYTES ((size_t)256 << 20)
/* Bytes hashed at each end of a weights file for the fingerprint. */
#define TIER_FP_SAMPLE ((size_t)1 << 20)

/* XXH3-64 of a file: all of it, or its size and `sample` bytes at each end (weights). */
static uint64_t file_digest(const char *path, size_t sample)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat s;
    uint64_t h = 0;
    if (!fstat(fd, &s)) {
        size_t n = (size_t)s.st_size, take = sample && n > 2 * sample ? sample : n;
        char *buf = xmalloc(2 * take + sizeof n + 1);
        memcpy(buf, &n, sizeof n);
        ssize_t a = pread(fd, buf + sizeof n, take, 0), b = 0;
        if (take < n) b = pread(fd, buf + sizeof n + take, take, (off_t)(n - take));
        if (a >= 0 && b >= 0) h = XXH3_64bits(buf, sizeof n + (size_t)a + (size_t)b);
        free(buf);
    }
    close(fd);
    return h;
}

/* The store's fingerprint: the pool's (architecture, shapes, weight bytes, KV format,
 * block size) plus digests of the model folder's config, tokenizer, chat template and
 * weights (size and both ends of each file: a changed weight file almost always changes
 * its header or its size; hashing gigabytes at every start would not be worth it). */
static int fingerprint(const struct engine *en, const char *base, char *out, int cap)
{
    static const char *const whole[] = {"config.json", "tokenizer.json", "tokenizer_config.json",
                                        "chat_template.jinja", "chat_template.json"};
    int n = snprintf(out, (size_t)cap, "%s", base);
    char p[4096];
    for (size_t i = 0; i < sizeof whole / sizeof *whole && n < cap; i++) {
        snprintf(p, sizeof p, "%s/%s", en->cfg.model_dir, whole[i]);
        n += snprintf(out + n, (size_t)(cap - n), "|%s=%016llx", whole[i],
                      (unsigned long long)file_digest(p, 0));
    }
    DIR *d = opendir(en->cfg.model_dir);
    if (!d) return n;
    /* readdir order varies: combine the weight files' digests order-free */
    uint64_t w = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 12 || strcmp(de->d_name + l - 12, ".safetensors")) continue;
        snprintf(p, sizeof p, "%s/%s", en->cfg.model_dir, de->d_name);
        w ^= file_digest(p, TIER_FP_SAMPLE) ^ XXH3_64bits(de->d_name, l);
    }
    closedir(d);
    if (n < cap)
        n += snprintf(out + n, (size_t)(cap - n), "|weights=%016llx", (unsigned long long)w);
    /* a split model's images are its ranks' shares one after another (model/kv_block.h) */
    if (n < cap && en->m->tp_size > 1)
        n += snprintf(out + n, (size_t)(cap - n), "|tp=%d", en->m->tp_size);
    /* the snapshot record's image (model_state_read, version 1, each rank's in turn) and its
     * size */
    if (n < cap && en->hybrid)
        n += snprintf(out + n, (size_t)(cap - n), "|state=1:%zu", model_state_image_bytes(en->m));
    return n < cap ? n : cap - 1;
}

/* The copy engine of the host tier: the backend's, over the engine's model. */
static void copy_out(void *user, int32_t block, void *dst)
{
    struct engine *en = user;
    model_kv_block_copy_out(en->m, block, dst);
}

static void copy_in(void *user, int32_t block, const void *src)
{
    struct engine *en = user;
    model_kv_block_copy_in(en->m, block, src);
}

static uint64_t copy_mark(void *user)
{
    struct engine *en = user;
    return model_copy_mark(en->m);
}

static int copy_done(void *user, uint64_t t)
{
    struct engine *en = user;
    return model_copy_done(en->m, t);
}

static void copy_fence(void *user)
{
    struct engine *en = user;
    model_copy_fence(en->m);
}

/* The copy engine of the snapshot slots: state slots instead of pool blocks. */
static void state_out(void *user, int32_t slot, void *dst)
{
    struct engine *en = user;
    model_state_copy_out(en->m, slot, dst);
}

static void state_in(void *user, int32_t slot, const void *src)
{
    struct engine *en = user;
    model_state_copy_in(en->m, slot, src);
}

/* The host tier in `bytes` of pinned memory: block slots, and for a hybrid model snapshot
 * slots after them, in the shares the device gives the block pool and the state pool (at
 * least one of each). */
static int host_open(struct engine *en, size_t bytes, struct err *e)
{
    size_t bb = model_kv_block_bytes(en->m), sb = en->hybrid ? model_state_image_bytes(en->m) : 0;
    size_t snaps = 0;
    if (sb) {
        double ds = (double)en->states.n_blocks * (double)sb;
        double share = ds / (ds + (double)en->pool.n_blocks * (double)bb);
        snaps = (size_t)((double)bytes * share / (double)sb);
        if (snaps < 1) snaps = 1;
        if (snaps > INT32_MAX / 2) snaps = INT32_MAX / 2;
        if (snaps * sb + bb > bytes)
            return err_set(e,
                           "--kv-host-memory %zu: less than one KV block (%zu bytes) and one "
                           "state snapshot (%zu bytes)",
                           bytes, bb, sb);
    }
    size_t slots = (bytes - snaps * sb) / bb;
    if (slots < 1)
        return err_set(e, "--kv-host-memory %zu: less than one KV block (%zu bytes)", bytes, bb);
    if (slots > INT32_MAX / 2) slots = INT32_MAX / 2;
    size_t off = (slots * bb + 63) & ~(size_t)63; /* the snapshot slots start aligned */
    en->host_mem = model_host_alloc(en->m, off + snaps * sb);
    if (!en->host_mem)
        return err_set(e, "--kv-host-memory: cannot pin %zu bytes of host memory",
                       off + snaps * sb);
    struct kv_host_config hc = {.mem = en->host_mem,
                                .slots = (int)slots,
                                .block_bytes = bb,
                                .device_blocks = en->pool.n_blocks,
                                .copy = {en, copy_out, copy_in, copy_mark, copy_done, copy_fence}};
    en->host = kv_host_create(&hc);
    if (snaps) {
        struct kv_host_config sc = {
            .mem = (char *)en->host_mem + off,
            .slots = (int)snaps,
            .block_bytes = sb,
            .device_blocks = en->states.n_blocks,
            .copy = {en, state_out, state_in, copy_mark, copy_done, copy_fence}};
        en->host_snap = kv_host_create(&sc);
    }
    model_kv_copy_setup(en->m);
    return 0;
}

int tier_open(struct engine *en, const char *pool_fp, struct err *e)
{
    const struct engine_config *cfg = &en->cfg;
    if (!cfg->kv_disk_dir && !cfg->kv_host_memory) return 0;
    const char *flag = cfg->kv_host_memory ? "--kv-host-memory" : "--kv-disk-dir";
    int engine = model_kv_copy_engine(en->m);
    if (cfg->kv_host_memory && !engine)
        return err_set(e,
                       "--kv-host-memory: the %s backend keeps the KV pool in host memory "
                       "already; give the pool that memory instead (--kv-cache-memory), or "
                       "add a disk tier (--kv-disk-dir)",
                       en->be.ops->name);
    if (cfg->kv_disk_dir && !engine && strcmp(en->be.ops->name, "cpu") != 0)
        return err_set(e, "--kv-disk-dir: the %s backend has no copy engine for the disk tier",
                       en->be.ops->name);
    if (cfg->disable_prefix_caching) {
        fprintf(stderr, "pagoda: %s is unused: prefix caching is off\n", flag);
        return 0;
    }
    if (engine && host_open(en, cfg->kv_host_memory ? cfg->kv_host_memory : TIER_STAGING_BYTES, e))
        return -1;
    if (!cfg->kv_disk_dir) return 0;
    char fp[2048];
    int fpn = fingerprint(en, pool_fp, fp, sizeof fp);
    size_t bb = model_kv_block_bytes(en->m);
    int per_step = (cfg->max_num_batched_tokens + en->block_size - 1) / en->block_size;
    int q = 2 * per_step;
    if ((size_t)q * bb > TIER_QUEUE_BYTES) q = (int)(TIER_QUEUE_BYTES / bb);
    if (q < 4) q = 4;
    /* snapshots: as many as fit in half the queue's bytes, 2 to 64 (a snapshot of a large
     * hybrid model is tens of MB; a step names a few at most) */
    size_t sb = en->hybrid ? model_state_image_bytes(en->m) : 0;
    int qs = sb ? (int)(TIER_QUEUE_BYTES / 2 / sb) : 0;
    if (sb && qs < 2) qs = 2;
    if (qs > 64) qs = 64;
    struct kv_tier_config tc = {.dir = cfg->kv_disk_dir,
                                .disk_bytes =
                                    cfg->kv_disk_size ? cfg->kv_disk_size : (size_t)16 << 30,
                                .fp = fp,
                                .fp_len = (size_t)fpn,
                                .block_bytes = bb,
                                .state_bytes = sb,
                                .queue_blocks = q,
                                .queue_states = qs,
                                .max_load_blocks = en->max_blocks};
    en->tier = kv_tier_create(&tc, e);
    return en->tier ? 0 : -1;
}

/* A block ready in host memory that the disk tier wants: into the writer's queue. With the
 * queue full it stays in its slot and is offered again after the next step (the host tier
 * holds it; stores behind it wait for slots), so a prefix larger than the slots reaches the
 * disk whole, at the writer's pace. */
static int to_disk(void *user, struct kv_hash h, const void *bytes)
{
    struct engine *en = user;
    if (kv_tier_has(en->tier, h)) return 1;
    if (!kv_tier_store_room(en->tier)) return 0;
    void *buf = kv_tier_store_begin(en->tier);
    memcpy(buf, bytes, model_kv_block_bytes(en->m));
    kv_tier_store_end(en->tier, h);
    return 1;
}

/* A snapshot ready in host memory that the disk tier wants: as to_disk. */
static int state_to_disk(void *user, struct kv_hash h, const void *bytes)
{
    struct engine *en = user;
    if (kv_tier_has_state(en->tier, h)) return 1;
    if (!kv_tier_store_state_room(en->tier)) return 0;
    void *buf = kv_tier_store_state_begin(en->tier);
    memcpy(buf, bytes, model_state_image_bytes(en->m));
    kv_tier_store_state_end(en->tier, h);
    return 1;
}

static void host_poll(struct engine *en)
{
    kv_host_poll(en->host, en->tier ? to_disk : NULL, en);
    if (en->host_snap) kv_host_poll(en->host_snap, en->tier ? state_to_disk : NULL, en);
}

void tier_close(struct engine *en)
{
    if (en->host) {
        /* the copies down in flight complete and reach the disk writer before it stops */
        if (en->host_snap) kv_host_mark(en->host_snap);
        uint64_t t = kv_host_mark(en->host);
        while (!kv_host_done(en->host, t)) usleep(100);
        host_poll(en);
    }
    kv_tier_destroy(en->tier);
    en->tier = NULL;
    if (en->host) {
        kv_host_destroy(en->host_snap);
        en->host_snap = NULL;
        kv_host_destroy(en->host);
        model_host_free(en->m, en->host_mem);
        en->host = NULL;
        en->host_mem = NULL;
    }
}

void tier_store(struct engine *en, int32_t block, struct kv_hash h)
{
    if (kv_lookup(&en->pool, h) != block) return;
    if (en->host) {
        kv_host_store(en->host, h, block, en->tier && !kv_tier_has(en->tier, h));
        return;
    }
    if (kv_tier_has(en->tier, h)) return;
    void *buf = kv_tier_store_begin(en->tier);
    if (!buf) return; /* the queue is full: dropped (counted) */
    model_kv_block_read(en->m, block, buf);
    kv_tier_store_end(en->tier, h);
}

void tier_store_state(struct engine *en, int32_t slot, struct kv_hash h)
{
    if (en->host_snap) {
        kv_host_store(en->host_snap, h, slot, en->tier && !kv_tier_has_state(en->tier, h));
        return;
    }
    if (!en->tier || kv_tier_has_state(en->tier, h)) return;
    void *buf = kv_tier_store_state_begin(en->tier);
    if (!buf) return; /* the queue is full: dropped (counted) */
    model_state_image_read(en->m, slot, buf);
    kv_tier_store_state_end(en->tier, h);
}

void tier_reuse(struct engine *en, const int32_t *blocks, int n)
{
    if (en->host) kv_host_reuse(en->host, blocks, n);
}

void tier_reuse_state(struct engine *en, int32_t slot)
{
    if (en->host_snap) kv_host_reuse(en->host_snap, &slot, 1);
}

/* Where a snapshot is: nowhere, the state pool, host memory, disk. */
enum { SNAP_NONE, SNAP_POOL, SNAP_HOST, SNAP_DISK };

/* Where the snapshot after block hashes[k - 1] is, looking as far down as `level` (0: the
 * state pool, 1: host memory too, 2: disk too). */
static int snap_src(struct engine *en, const struct request *r, int k, int level)
{
    struct kv_hash h = r->hashes[k - 1];
    if (kv_lookup(&en->states, h) >= 0) return SNAP_POOL;
    if (level >= 1 && en->host_snap && kv_host_has(en->host_snap, h)) return SNAP_HOST;
    if (level >= 2 && en->tier && kv_tier_has_state(en->tier, h)) return SNAP_DISK;
    return SNAP_NONE;
}

/* Hybrid models: the longest prefix of at most `end` blocks, past `base`, that ends with a
 * snapshot found down to `level`; base when none. */
static int snap_point(struct engine *en, const struct request *r, int base, int end, int level)
{
    int k = end;
    while (k > base && snap_src(en, r, k, level) == SNAP_NONE) k--;
    return k;
}

/* A hybrid lookup that reached the tiers resumes from a snapshot found at src: one the
 * state pool lacks was looked up in host memory, and one host memory lacks too on disk
 * (hits are counted as the loads end). */
static void count_snap_query(struct engine *en, int src)
{
    if (src == SNAP_POOL) return;
    if (en->host_snap) en->host_state_queries++;
    if (src != SNAP_HOST && en->tier) en->tier_state_queries++;
}

int tier_try_load(struct engine *en, struct request *r, int n_hit)
{
    if ((!en->tier && !en->host) || r->tier_tried) return 0;
    r->tier_tried = 1;
    int bs = en->block_size, avail = r->n_hashes;
    if (avail * bs >= r->n_tokens) avail--; /* compute at least one token */
    /* a hybrid model resumes from the pool alone at its last hit block with a snapshot */
    int base = en->hybrid ? snap_point(en, r, 0, n_hit, 0) : n_hit;
    if (avail <= base) return 0;
    int nh = 0, nd = 0;
    if (en->host) {
        if (avail > n_hit) nh = kv_host_probe(en->host, r->hashes + n_hit, avail - n_hit);
        en->host_query_tokens += (uint64_t)(r->n_tokens - base * bs);
    }
    if (en->tier) {
        if (avail > n_hit + nh)
            nd = kv_tier_probe(en->tier, r->hashes + n_hit + nh, avail - n_hit - nh);
        en->tier_query_tokens += (uint64_t)(r->n_tokens - (base + nh) * bs);
    }
    /* Hybrid models: only the blocks up to the last snapshot found are worth loading, and
     * that snapshot comes from host memory or disk unless the state pool has it (it may end
     * a prefix the pool's blocks hold already). */
    int k = n_hit + nh + nd, src = SNAP_NONE;
    if (en->hybrid) {
        k = snap_point(en, r, base, k, 2);
        if (k > base) src = snap_src(en, r, k, 2);
        if (k < n_hit) nh = nd = 0;
        if (n_hit + nh > k) nh = k > n_hit ? k - n_hit : 0;
        if (n_hit + nh + nd > k) nd = k > n_hit + nh ? k - n_hit - nh : 0;
    }
    /* Never slower than recompute: a disk load estimated (kv_tier_load_rate) to take at
     * least as long as computing the tokens it saves is bypassed. A copy up from host
     * memory (tens of GB/s) always beats recomputing. */
    if (nd || src == SNAP_DISK) {
        double bytes = (double)nd * (double)model_kv_block_bytes(en->m) +
                       (src == SNAP_DISK ? (double)model_state_image_bytes(en->m) : 0);
        int tokens = en->hybrid ? (k - base) * bs : nd * bs;
        if (!kv_tier_worth_loading(bytes, tokens, kv_tier_load_rate(en->tier), en->prefill_tps)) {
            en->tier_bypasses++;
            nd = 0;
            if (en->hybrid) { /* what host memory and the state pool give alone */
                k = snap_point(en, r, base, n_hit + nh, 1);
                src = k > base ? snap_src(en, r, k, 1) : SNAP_NONE;
                nh = k > n_hit ? k - n_hit : 0;
            }
        }
    }
    if (en->hybrid) {
        count_snap_query(en, src);
        if (k <= base) return 0;
    }
    int snap_disk = src == SNAP_DISK, snap_host = src == SNAP_HOST;
    if ((snap_disk || snap_host) && !kv_can_allocate(&en->states, 1, NULL, 0)) return 0;
    if (nh + nd == 0 && !snap_disk && !snap_host) return 0;
    if (!kv_can_allocate(&en->pool, nh + nd, en->hit_blocks, n_hit)) return 0;
    kv_touch(&en->pool, en->hit_blocks, n_hit);
    memcpy(r->blocks, en->hit_blocks, sizeof(int32_t) * (size_t)n_hit);
    kv_allocate(&en->pool, nh + nd, r->blocks + n_hit);
    tier_reuse(en, r->blocks + n_hit, nh + nd);
    r->n_blocks = n_hit + nh + nd;
    r->load_from = n_hit + nh;
    r->load_id = -1;
    r->load_k = en->hybrid ? k : 0;
    r->load_snap = -1;
    r->load_snap_ok = 0;
    r->load_snap_host = 0;
    if (snap_disk || snap_host) {
        kv_allocate(&en->states, 1, &r->load_snap);
        tier_reuse_state(en, r->load_snap);
    } else if (en->hybrid) { /* the pool's snapshot is held until the load ends */
        r->load_snap = kv_lookup(&en->states, r->hashes[k - 1]);
        kv_touch(&en->states, &r->load_snap, 1);
        r->load_snap_ok = 1;
    }
    if (nd || snap_disk) {
        r->load_id =
            kv_tier_load_start(en->tier, r->hashes + r->load_from, r->blocks + r->load_from, nd,
                               snap_disk ? &r->hashes[k - 1] : NULL, r->load_snap);
        if (r->load_id < 0) { /* every load slot busy: compute those instead */
            kv_release(&en->pool, r->blocks + r->load_from, nd);
            r->n_blocks -= nd;
            if (r->load_snap >= 0) kv_release(&en->states, &r->load_snap, 1);
            r->load_snap = -1;
            snap_host = 0; /* it ended blocks that are not coming */
            /* a hybrid model's host blocks are of use only up to a snapshot in the pool
             * (given back just now: it stays named while free) */
            if (en->hybrid && r->n_blocks > n_hit && !snap_src(en, r, r->n_blocks, 0)) {
                kv_release(&en->pool, r->blocks + n_hit, r->n_blocks - n_hit);
                r->n_blocks = n_hit;
            }
        }
    }
    if (r->n_blocks == n_hit && r->load_snap < 0) {
        kv_release(&en->pool, r->blocks, r->n_blocks);
        r->n_blocks = 0;
        return 0;
    }
    r->load_end = r->n_blocks;
    r->host_from = n_hit;
    r->host_n = r->n_blocks - n_hit < nh ? r->n_blocks - n_hit : nh;
    r->host_ticket =
        r->host_n ? kv_host_load(en->host, r->hashes + n_hit, r->blocks + n_hit, r->host_n) : 0;
    if (snap_host) { /* copied up after the blocks: its ticket covers theirs */
        r->host_ticket = kv_host_load(en->host_snap, &r->hashes[k - 1], &r->load_snap, 1);
        r->load_snap_host = 1;
    }
    r->loading = 1;
    en->n_loading++;
    return 1;
}

/* A block read from disk: into its pool block, through a host slot when there is a copy
 * engine (or directly, ordered with the steps, when no slot is free). A snapshot: into its
 * state slot the same way, through a snapshot slot. */
static void write_block(void *user, int kind, int32_t dst, struct kv_hash h, const void *raw)
{
    struct engine *en = user;
    if (kind == KV_DISK_STATE) {
        if (en->host_snap && kv_host_put(en->host_snap, h, raw, dst) == 0) return;
        model_state_image_write(en->m, dst, raw);
        return;
    }
    if (en->host && kv_host_put(en->host, h, raw, dst) == 0) return;
    model_kv_block_write(en->m, dst, raw);
}

/* r's loaded blocks [a, a + n) join the pool's index. */
static void commit_loaded(struct engine *en, struct request *r, int a, int n)
{
    for (int j = a; j < a + n; j++) {
        /* a block back in the pool is a block stored, for KV-event subscribers too */
        if (kv_commit_hash(&en->pool, r->blocks[j], r->hashes[j]) && en->cfg.kv_events)
            kv_events_stored(en->cfg.kv_events, &r->hashes[j], 1, j ? &r->hashes[j - 1] : NULL,
                             r->tokens + (size_t)j * (size_t)en->block_size);
    }
}

void tier_poll(struct engine *en, double wait_s)
{
    if (en->host) host_poll(en);
    if (en->tier) kv_tier_poll(en->tier, en->n_loading ? wait_s : 0, write_block, en);
    if (en->host && en->n_loading && wait_s > 0)
        usleep(100); /* nothing to step but copies up: they take microseconds each */
    if (!en->n_loading) return;
    for (struct request *r = en->waiting.head; r; r = r->next) {
        if (!r->loading) continue;
        if (r->load_id >= 0) {
            int n_ok, snap_ok;
            if (!kv_tier_load_done(en->tier, r->load_id, &n_ok, &snap_ok)) continue;
            r->load_id = -1;
            r->load_end = r->load_from + n_ok;
            if (r->load_snap >= 0 && !r->load_snap_ok) r->load_snap_ok = snap_ok;
            if (snap_ok) en->tier_state_hits++;
            /* a hybrid model's blocks count as a hit only up to the snapshot that ends them */
            if (!en->hybrid || (r->load_end >= r->load_k &&
                                (snap_ok || r->load_snap_host ||
                                 kv_lookup(&en->states, r->hashes[r->load_k - 1]) >= 0)))
                en->tier_hit_tokens += (uint64_t)n_ok * (uint64_t)en->block_size;
            /* blocks and snapshots put through host slots are in place once this ticket is
             * (tickets cover every copy queued before them, of either kind) */
            if (en->host) r->host_ticket = kv_host_mark(en->host);
        }
        if (r->host_ticket && !kv_host_done(en->host, r->host_ticket)) continue;
        if (r->load_snap_host) { /* the snapshot copied up from host memory is in its slot */
            kv_host_unpin(en->host_snap, &r->hashes[r->load_k - 1], 1);
            r->load_snap_host = 0;
            r->load_snap_ok = 1;
            en->host_state_hits++;
        }
        /* the blocks past the first failure are computed (no copy writes them any more) */
        kv_release(&en->pool, r->blocks + r->load_end, r->n_blocks - r->load_end);
        r->n_blocks = r->load_end;
        /* Loaded blocks join the pool's index; released, they stay cached (LRU tail), so
         * that the request's next plan finds its whole prefix there. */
        commit_loaded(en, r, r->host_from, r->n_blocks - r->host_from);
        /* the snapshot read joins the state pool under its block's name (a free named slot,
         * as any snapshot); a failed one goes back unnamed and the prefix is recomputed
         * from the last snapshot the pool has; one the pool had is let go */
        if (r->load_snap >= 0) {
            if (r->load_snap_ok && kv_lookup(&en->states, r->hashes[r->load_k - 1]) < 0)
                kv_commit_hash(&en->states, r->load_snap, r->hashes[r->load_k - 1]);
            kv_release(&en->states, &r->load_snap, 1);
            r->load_snap = -1;
        }
        if (r->host_n) {
            kv_host_unpin(en->host, r->hashes + r->host_from, r->host_n);
            en->host_hit_tokens += (uint64_t)r->host_n * (uint64_t)en->block_size;
        }
        kv_release(&en->pool, r->blocks, r->n_blocks);
        r->n_blocks = 0;
        r->loading = 0;
        r->host_n = 0;
        r->host_ticket = 0;
        en->n_loading--;
    }
}

void tier_cancel(struct engine *en, struct request *r)
{
    if (!r->loading) return;
    if (r->load_id >= 0) kv_tier_load_cancel(en->tier, r->load_id);
    if (r->load_snap >= 0) kv_release(&en->states, &r->load_snap, 1);
    r->load_snap = -1;
    if (en->host) {
        if (r->host_n) kv_host_unpin(en->host, r->hashes + r->host_from, r->host_n);
        if (r->load_snap_host) kv_host_unpin(en->host_snap, &r->hashes[r->load_k - 1], 1);
        r->load_snap_host = 0;
        /* copies up into the blocks the caller releases may still be queued: the steps
         * that write those blocks next run after them */
        model_copy_fence(en->m);
    }
    r->load_id = -1;
    r->loading = 0;
    r->host_n = 0;
    r->host_ticket = 0;
    en->n_loading--;
}

void tier_publish(struct engine *en, struct engine_stats *st)
{
    if (en->host) {
        st->host_on = 1;
        kv_host_stats(en->host, &st->host);
        uint64_t bb = model_kv_block_bytes(en->m);
        st->host_used_bytes = st->host.blocks * bb;
        st->host_budget_bytes = st->host.slots * bb;
        st->host_load_bytes = st->host.load_blocks * bb;
        st->host_store_bytes = st->host.stored_blocks * bb;
        st->host_query_tokens = en->host_query_tokens;
        st->host_hit_tokens = en->host_hit_tokens;
        model_copy_seconds(en->m, &st->host_store_seconds, &st->host_load_seconds);
        if (en->host_snap) { /* the snapshot slots share the arena and the copies */
            kv_host_stats(en->host_snap, &st->host_snap);
            uint64_t sb = model_state_image_bytes(en->m);
            st->host_used_bytes += st->host_snap.blocks * sb;
            st->host_budget_bytes += st->host_snap.slots * sb;
            st->host_load_bytes += st->host_snap.load_blocks * sb;
            st->host_store_bytes += st->host_snap.stored_blocks * sb;
            st->host_state_queries = en->host_state_queries;
            st->host_state_hits = en->host_state_hits;
        }
    }
    if (!en->tier) return;
    st->tier_on = 1;
    kv_tier_stats(en->tier, &st->tier);
    st->tier_query_tokens = en->tier_query_tokens;
    st->tier_hit_tokens = en->tier_hit_tokens;
    st->tier_bypasses = en->tier_bypasses;
    st->tier_state_queries = en->tier_state_queries;
    st->tier_state_hits = en->tier_state_hits;
}
