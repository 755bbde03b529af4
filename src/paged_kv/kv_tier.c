#include "paged_kv/kv_tier.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

enum load_state { LOAD_FREE, LOAD_RUNNING, LOAD_CANCELLED };
/* A load's state snapshot: none asked, waiting for the state buffer, read in flight,
 * written, failed. */
enum snap_state { SNAP_NONE, SNAP_WAIT, SNAP_READING, SNAP_OK, SNAP_FAILED };

/* The read of a state snapshot takes the one state buffer: its io_uring user data. */
#define STATE_READ KV_TIER_READS

/* Bytes the read-rate probe at open reads at most (records of blocks held). */
#define PROBE_BYTES ((size_t)16 << 20)

struct load {
    enum load_state state;
    int n, next;            /* blocks; the next to submit */
    int inflight;           /* reads of it in flight */
    int first_bad;          /* the first block that failed, n when none */
    double t0;              /* when it started */
    struct kv_hash *hashes; /* [max_load_blocks] */
    int32_t *blocks;        /* [max_load_blocks] */
    enum snap_state snap;   /* the state snapshot after block snap_h, into slot snap_slot */
    struct kv_hash snap_h;
    int32_t snap_slot;
};

struct read_buf {
    int load, idx; /* -1: free */
    struct kv_disk_ref ref;
    void *buf; /* [max record] */
};

struct kv_tier {
    struct kv_disk *disk;
    size_t block_bytes, state_bytes, budget;
    int max_load;

    /* the store queue: slots [head, tail) modulo n_q hold blocks for the writer; the
     * engine fills slot `tail` between store_begin and store_end */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_q, head, tail, quit;
    char *q;            /* [n_q][block_bytes] */
    struct kv_hash *qh; /* [n_q] */
    /* state snapshots wait in a queue of their own, as blocks do: [shead, stail) of n_sq */
    int n_sq, shead, stail;
    char *sq;            /* [n_sq][state_bytes] */
    struct kv_hash *sqh; /* [n_sq] */
    pthread_t writer;
    int has_writer;
    uint64_t dropped;
    double store_seconds;
    uint64_t store_raw; /* raw bytes the writer stored (blocks and snapshots) */

    /* loads (engine thread only) */
    struct io_uring ring;
    int has_ring;
    struct load loads[KV_TIER_LOADS];
    struct read_buf rd[KV_TIER_READS];
    int inflight;
    void *raw; /* [block_bytes] a decoded block */
    /* the state buffer: one snapshot read at a time (a snapshot may be tens of MB) */
    struct read_buf srd;
    void *sraw; /* [state_bytes] */
    uint64_t load_blocks, load_bytes, load_failed, load_states, state_failed;
    double load_seconds;
    uint64_t probe_bytes; /* the read-rate probe at open */
    double probe_seconds;
};

static void *writer_main(void *arg)
{
    struct kv_tier *t = arg;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (t->head == t->tail && t->shead == t->stail && !t->quit)
            pthread_cond_wait(&t->cv, &t->mu);
        if (t->head == t->tail && t->shead == t->stail) break; /* quit, queues drained */
        /* a snapshot first: it is taken after its block was queued */
        int state = t->shead != t->stail;
        int s = state ? t->shead % t->n_sq : t->head % t->n_q;
        struct kv_hash h = state ? t->sqh[s] : t->qh[s];
        pthread_mutex_unlock(&t->mu);
        double t0 = util_now();
        if (state)
            kv_disk_put_state(t->disk, h, t->sq + (size_t)s * t->state_bytes);
        else
            kv_disk_put(t->disk, h, t->q + (size_t)s * t->block_bytes);
        double dt = util_now() - t0;
        pthread_mutex_lock(&t->mu);
        t->store_seconds += dt;
        t->store_raw += state ? t->state_bytes : t->block_bytes;
        if (state)
            t->shead++;
        else
            t->head++;
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* Times synchronous reads (pread, check, decompress) of up to PROBE_BYTES of held blocks,
 * so that the first load-or-recompute decision has a read rate: one read at a time where
 * loads keep 16 in flight, so it errs low (the first loads on a fast disk may be bypassed
 * until a load is measured; on a slow one they are not tried). Nothing held: no probe. */
static void probe_rate(struct kv_tier *t)
{
    struct kv_hash h[64];
    int n = kv_disk_sample(t->disk, h, 64);
    double t0 = util_now();
    for (int i = 0; i < n && t->probe_bytes < PROBE_BYTES; i++)
        if (kv_disk_get(t->disk, h[i], t->raw) == 0) t->probe_bytes += t->block_bytes;
    if (t->probe_bytes) t->probe_seconds = util_now() - t0;
}

struct kv_tier *kv_tier_create(const struct kv_tier_config *cfg, struct err *e)
{
    struct kv_disk *d = kv_disk_open(cfg->dir, cfg->disk_bytes, cfg->fp, cfg->fp_len,
                                     cfg->block_bytes, cfg->state_bytes, e);
    if (!d) return NULL;
    struct kv_tier *t = xcalloc(1, sizeof *t);
    t->disk = d;
    t->block_bytes = cfg->block_bytes;
    t->state_bytes = cfg->state_bytes;
    t->budget = cfg->disk_bytes;
    t->max_load = cfg->max_load_blocks;
    t->n_q = cfg->queue_blocks > 1 ? cfg->queue_blocks : 1;
    t->q = xmalloc((size_t)t->n_q * t->block_bytes);
    t->qh = xcalloc((size_t)t->n_q, sizeof *t->qh);
    if (t->state_bytes) {
        t->n_sq = cfg->queue_states > 1 ? cfg->queue_states : 1;
        t->sq = xmalloc((size_t)t->n_sq * t->state_bytes);
        t->sqh = xcalloc((size_t)t->n_sq, sizeof *t->sqh);
        t->srd.buf = xmalloc(kv_disk_max_record(d));
        t->sraw = xmalloc(t->state_bytes);
    }
    t->srd.load = -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    for (int i = 0; i < KV_TIER_LOADS; i++) {
        t->loads[i].hashes = xmalloc(sizeof(struct kv_hash) * (size_t)t->max_load);
        t->loads[i].blocks = xmalloc(sizeof(int32_t) * (size_t)t->max_load);
    }
    for (int i = 0; i < KV_TIER_READS; i++) {
        t->rd[i].load = -1;
        t->rd[i].buf = xmalloc(kv_disk_max_block_record(d));
    }
    t->raw = xmalloc(t->block_bytes);
    probe_rate(t);
    int rc = io_uring_queue_init(KV_TIER_READS, &t->ring, 0);
    if (rc < 0) {
        err_set(e, "--kv-disk-dir: io_uring is not available: %s", strerror(-rc));
        kv_tier_destroy(t);
        return NULL;
    }
    t->has_ring = 1;
    if (pthread_create(&t->writer, NULL, writer_main, t)) {
        err_set(e, "--kv-disk-dir: cannot start the writer thread");
        kv_tier_destroy(t);
        return NULL;
    }
    t->has_writer = 1;
    return t;
}

/* Takes one completion: checks and writes its block or snapshot (fn NULL: discards). */
static void complete(struct kv_tier *t, struct io_uring_cqe *cqe, kv_tier_write_fn fn, void *user)
{
    uint64_t b = io_uring_cqe_get_data64(cqe);
    struct read_buf *r = b == STATE_READ ? &t->srd : &t->rd[b];
    ssize_t res = kv_disk_io.read_done(r->ref.fd, r->buf, r->ref.len, r->ref.off, cqe->res);
    io_uring_cqe_seen(&t->ring, cqe);
    struct load *l = &t->loads[r->load];
    if (b == STATE_READ) {
        if (l->state == LOAD_RUNNING) {
            if (kv_disk_decode(t->disk, l->snap_h, &r->ref, r->buf, res, t->sraw) == 0) {
                if (fn) fn(user, KV_DISK_STATE, l->snap_slot, l->snap_h, t->sraw);
                l->snap = SNAP_OK;
            } else {
                l->snap = SNAP_FAILED;
            }
        }
    } else if (l->state == LOAD_RUNNING && r->idx < l->first_bad) {
        struct kv_hash h = l->hashes[r->idx];
        if (kv_disk_decode(t->disk, h, &r->ref, r->buf, res, t->raw) == 0) {
            if (fn) fn(user, KV_DISK_BLOCK, l->blocks[r->idx], h, t->raw);
        } else {
            l->first_bad = r->idx;
        }
    }
    kv_disk_unpin(t->disk, &r->ref);
    l->inflight--;
    t->inflight--;
    if (l->state == LOAD_CANCELLED && !l->inflight) l->state = LOAD_FREE;
    r->load = -1;
}

/* Submits reads of running loads while buffers are free. */
static void submit(struct kv_tier *t)
{
    int queued = 0;
    for (int li = 0; li < KV_TIER_LOADS; li++) {
        struct load *l = &t->loads[li];
        if (l->state == LOAD_RUNNING && l->snap == SNAP_WAIT && t->srd.load < 0) {
            struct read_buf *r = &t->srd;
            struct io_uring_sqe *sqe = NULL;
            if (kv_disk_pin_state(t->disk, l->snap_h, &r->ref)) {
                l->snap = SNAP_FAILED; /* evicted since the probe */
            } else if (!(sqe = io_uring_get_sqe(&t->ring))) {
                kv_disk_unpin(t->disk, &r->ref);
            } else {
                io_uring_prep_read(sqe, r->ref.fd, r->buf, (unsigned)r->ref.len,
                                   (uint64_t)r->ref.off);
                io_uring_sqe_set_data64(sqe, STATE_READ);
                r->load = li;
                l->snap = SNAP_READING;
                l->inflight++;
                t->inflight++;
                queued++;
            }
        }
        while (l->state == LOAD_RUNNING && l->next < l->first_bad && t->inflight < KV_TIER_READS) {
            int b = 0;
            while (t->rd[b].load >= 0) b++;
            struct read_buf *r = &t->rd[b];
            if (kv_disk_pin(t->disk, l->hashes[l->next], &r->ref)) {
                l->first_bad = l->next; /* evicted since the probe */
                break;
            }
            struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
            if (!sqe) {
                kv_disk_unpin(t->disk, &r->ref);
                break;
            }
            io_uring_prep_read(sqe, r->ref.fd, r->buf, (unsigned)r->ref.len, (uint64_t)r->ref.off);
            io_uring_sqe_set_data64(sqe, (uint64_t)b);
            r->load = li;
            r->idx = l->next++;
            l->inflight++;
            t->inflight++;
            queued++;
        }
    }
    if (queued) io_uring_submit(&t->ring);
}

void kv_tier_poll(struct kv_tier *t, double wait_s, kv_tier_write_fn fn, void *user)
{
    for (;;) {
        submit(t);
        struct io_uring_cqe *cqe;
        int got = 0;
        while (t->inflight && io_uring_peek_cqe(&t->ring, &cqe) == 0) {
            complete(t, cqe, fn, user);
            got = 1;
        }
        if (got) continue; /* buffers came free: submit more */
        if (wait_s <= 0 || !t->inflight) return;
        struct __kernel_timespec ts = {(long long)wait_s,
                                       (long long)((wait_s - (long long)wait_s) * 1e9)};
        int rc = io_uring_wait_cqe_timeout(&t->ring, &cqe, &ts);
        if (rc == 0) {
            complete(t, cqe, fn, user);
            wait_s = 0; /* take what else landed, no more waiting */
        } else if (rc != -EINTR) {
            return;
        }
    }
}

int kv_tier_load_start(struct kv_tier *t, const struct kv_hash *hashes, const int32_t *blocks,
                       int n, const struct kv_hash *snap, int32_t snap_slot)
{
    if (n < 0 || n > t->max_load || (n == 0 && !snap) || (snap && !t->state_bytes)) return -1;
    for (int i = 0; i < KV_TIER_LOADS; i++) {
        struct load *l = &t->loads[i];
        if (l->state != LOAD_FREE) continue;
        memcpy(l->hashes, hashes, sizeof *hashes * (size_t)n);
        memcpy(l->blocks, blocks, sizeof *blocks * (size_t)n);
        l->n = l->first_bad = n;
        l->next = l->inflight = 0;
        l->t0 = util_now();
        l->state = LOAD_RUNNING;
        l->snap = snap ? SNAP_WAIT : SNAP_NONE;
        if (snap) l->snap_h = *snap;
        l->snap_slot = snap_slot;
        return i;
    }
    return -1;
}

int kv_tier_load_done(struct kv_tier *t, int id, int *n_ok, int *snap_ok)
{
    struct load *l = &t->loads[id];
    if (l->state != LOAD_RUNNING || l->inflight || l->next < l->first_bad || l->snap == SNAP_WAIT ||
        l->snap == SNAP_READING)
        return 0;
    *n_ok = l->first_bad;
    *snap_ok = l->snap == SNAP_OK;
    t->load_blocks += (uint64_t)l->first_bad;
    t->load_bytes += (uint64_t)l->first_bad * t->block_bytes;
    if (l->snap == SNAP_OK) {
        t->load_states++;
        t->load_bytes += t->state_bytes;
    }
    t->load_seconds += util_now() - l->t0;
    if (l->first_bad < l->n || l->snap == SNAP_FAILED) t->load_failed++;
    if (l->snap == SNAP_FAILED) t->state_failed++;
    l->state = LOAD_FREE;
    return 1;
}

void kv_tier_load_cancel(struct kv_tier *t, int id)
{
    struct load *l = &t->loads[id];
    l->state = l->inflight ? LOAD_CANCELLED : LOAD_FREE;
}

int kv_tier_loading(const struct kv_tier *t)
{
    for (int i = 0; i < KV_TIER_LOADS; i++)
        if (t->loads[i].state == LOAD_RUNNING) return 1;
    return 0;
}

double kv_tier_rate(uint64_t load_bytes, double load_s, uint64_t probe_bytes, double probe_s,
                    uint64_t store_bytes, double store_s)
{
    if (load_bytes && load_s > 0) return (double)load_bytes / load_s;
    if (probe_bytes && probe_s > 0) return (double)probe_bytes / probe_s;
    if (store_bytes && store_s > 0) return (double)store_bytes / store_s;
    return 0;
}

double kv_tier_load_rate(struct kv_tier *t)
{
    pthread_mutex_lock(&t->mu); /* the writer's counts */
    uint64_t sb = t->store_raw;
    double ss = t->store_seconds;
    pthread_mutex_unlock(&t->mu);
    return kv_tier_rate(t->load_bytes, t->load_seconds, t->probe_bytes, t->probe_seconds, sb, ss);
}

int kv_tier_worth_loading(double bytes, int tokens, double load_rate, double prefill_tps)
{
    if (load_rate <= 0 || prefill_tps <= 0) return 1;
    return bytes / load_rate < tokens / prefill_tps;
}

void *kv_tier_store_begin(struct kv_tier *t)
{
    pthread_mutex_lock(&t->mu);
    void *p = NULL;
    if (t->tail - t->head < t->n_q)
        p = t->q + (size_t)(t->tail % t->n_q) * t->block_bytes;
    else
        t->dropped++;
    pthread_mutex_unlock(&t->mu);
    return p;
}

int kv_tier_store_room(struct kv_tier *t)
{
    pthread_mutex_lock(&t->mu);
    int r = t->tail - t->head < t->n_q;
    pthread_mutex_unlock(&t->mu);
    return r;
}

void *kv_tier_store_state_begin(struct kv_tier *t)
{
    pthread_mutex_lock(&t->mu);
    void *p = NULL;
    if (t->n_sq && t->stail - t->shead < t->n_sq)
        p = t->sq + (size_t)(t->stail % t->n_sq) * t->state_bytes;
    else
        t->dropped++;
    pthread_mutex_unlock(&t->mu);
    return p;
}

int kv_tier_store_state_room(struct kv_tier *t)
{
    pthread_mutex_lock(&t->mu);
    int r = t->n_sq && t->stail - t->shead < t->n_sq;
    pthread_mutex_unlock(&t->mu);
    return r;
}

void kv_tier_store_state_end(struct kv_tier *t, struct kv_hash h)
{
    pthread_mutex_lock(&t->mu);
    t->sqh[t->stail % t->n_sq] = h;
    t->stail++;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

int kv_tier_has_state(struct kv_tier *t, struct kv_hash h)
{
    return t->state_bytes && kv_disk_has_state(t->disk, h);
}

void kv_tier_store_end(struct kv_tier *t, struct kv_hash h)
{
    pthread_mutex_lock(&t->mu);
    t->qh[t->tail % t->n_q] = h;
    t->tail++;
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

int kv_tier_has(struct kv_tier *t, struct kv_hash h)
{
    return kv_disk_has(t->disk, h);
}

int kv_tier_probe(struct kv_tier *t, const struct kv_hash *hashes, int n)
{
    int i = 0;
    while (i < n && kv_disk_has(t->disk, hashes[i])) i++;
    return i;
}

void kv_tier_store_stats(struct kv_tier *t, struct kv_tier_stats *out)
{
    kv_disk_stats(t->disk, &out->disk);
    out->disk_budget = t->budget;
    pthread_mutex_lock(&t->mu);
    out->store_dropped = t->dropped;
    out->store_seconds = t->store_seconds;
    pthread_mutex_unlock(&t->mu);
}

void kv_tier_stats(struct kv_tier *t, struct kv_tier_stats *out)
{
    memset(out, 0, sizeof *out);
    kv_tier_store_stats(t, out);
    out->load_blocks = t->load_blocks;
    out->load_bytes = t->load_bytes;
    out->load_seconds = t->load_seconds;
    out->load_failed = t->load_failed;
    out->load_states = t->load_states;
    out->state_failed = t->state_failed;
    out->probe_bytes = t->probe_bytes;
    out->probe_seconds = t->probe_seconds;
}

void kv_tier_destroy(struct kv_tier *t)
{
    if (!t) return;
    if (t->has_writer) {
        pthread_mutex_lock(&t->mu);
        t->quit = 1;
        pthread_cond_signal(&t->cv);
        pthread_mutex_unlock(&t->mu);
        pthread_join(t->writer, NULL);
    }
    if (t->has_ring) {
        for (int i = 0; i < KV_TIER_LOADS; i++)
            if (t->loads[i].state == LOAD_RUNNING) kv_tier_load_cancel(t, i);
        while (t->inflight) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&t->ring, &cqe)) break;
            complete(t, cqe, NULL, NULL);
        }
        io_uring_queue_exit(&t->ring);
    }
    kv_disk_close(t->disk);
    for (int i = 0; i < KV_TIER_LOADS; i++) {
        free(t->loads[i].hashes);
        free(t->loads[i].blocks);
    }
    for (int i = 0; i < KV_TIER_READS; i++) free(t->rd[i].buf);
    free(t->raw);
    free(t->srd.buf);
    free(t->sraw);
    free(t->sq);
    free(t->sqh);
    free(t->q);
    free(t->qh);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}
