#include "paged_kv/kv_disk.h"

#include <assert.h>
#include <dirent.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#include <zstd.h>

#include "common/util.h"

/* ---- the file calls ---- */

static int real_open(const char *path, int flags, mode_t mode)
{
    return open(path, flags | O_CLOEXEC, mode);
}

static ssize_t real_read_done(int fd, void *buf, size_t n, off_t off, ssize_t res)
{
    (void)fd, (void)buf, (void)n, (void)off;
    return res;
}

const struct kv_disk_io kv_disk_io_default = {real_open, pread,  pwrite, fsync,         ftruncate,
                                              close,     unlink, rename, real_read_done};
struct kv_disk_io kv_disk_io = {real_open, pread,  pwrite, fsync,         ftruncate,
                                close,     unlink, rename, real_read_done};

/* ---- records ---- */

/* A record's magic names its kind and version: a block's KV, or a hybrid model's
 * recurrent-state snapshot (version 1: model_state_read's image). */
#define REC_MAGIC       0x42564b50u /* "PKVB" */
#define REC_MAGIC_STATE 0x31534b50u /* "PKS1" */
#define REC_RAW         1u          /* stored uncompressed (zstd did not shrink it) */
#define LOG_ADD         1u
#define LOG_DROP        2u /* every entry in extent `ext` is gone */
#define LOG_ADD_STATE   3u /* as LOG_ADD, for a state snapshot's record */
#define LOG_REC         40
#define SNAP_MAGIC      0x31504e53564b4750ull /* "PGKVSNP1" */
#define SNAP_EVERY      1024                  /* log records between snapshots */

struct rec_head {
    uint32_t magic, flags;
    uint32_t stored, raw; /* bytes after the head; bytes once decompressed */
    uint64_t lo, hi;      /* the block hash */
    uint64_t check;       /* XXH3-64 of (lo, hi, stored, raw, flags, the stored bytes) */
};
_Static_assert(sizeof(struct rec_head) == KV_DISK_REC_HEAD, "record head layout");

struct log_rec {
    uint32_t kind, ext;
    uint64_t lo, hi;
    uint32_t off, len, raw;
    uint32_t check; /* low bits of XXH3-64 of the 36 bytes before it */
};
_Static_assert(sizeof(struct log_rec) == LOG_REC, "log record layout");

static uint64_t rec_check(const struct rec_head *h, const void *stored)
{
    XXH3_state_t s, *st = &s;
    XXH3_64bits_reset(st);
    uint64_t ids[2] = {h->lo, h->hi};
    uint32_t lens[3] = {h->stored, h->raw, h->flags};
    XXH3_64bits_update(st, ids, sizeof ids);
    XXH3_64bits_update(st, lens, sizeof lens);
    XXH3_64bits_update(st, stored, h->stored);
    return XXH3_64bits_digest(st);
}

static uint32_t log_check(const struct log_rec *r)
{
    return (uint32_t)XXH3_64bits(r, offsetof(struct log_rec, check));
}

/* ---- the store ---- */

struct entry {
    uint64_t lo, hi;
    uint32_t ext, off, len; /* len: record bytes, head included */
    uint8_t used, tomb;
    uint8_t kind; /* enum kv_disk_kind: a block and its snapshot share the hash */
};

struct extent {
    uint32_t id;
    int fd;
    uint64_t size;
    int live, pins;
    uint64_t last_use;
    int closed; /* no more records (full, or a write failed) */
};

struct kv_disk {
    char *dir;
    int lock_fd, log_fd;
    uint64_t log_off;
    int log_recs; /* since the last snapshot */
    size_t budget, raw_len, state_len, max_rec;
    pthread_mutex_t mu;
    struct entry *tab; /* open addressing, tombstones; grown at half full */
    uint32_t cap, n_used, n_tomb;
    struct extent *ext; /* by id, ascending */
    int n_ext, cap_ext;
    uint32_t next_ext;
    int cur; /* index in ext[] of the extent taking records, -1 none */
    uint64_t clock;
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    void *wbuf, *rbuf; /* [max_rec]: the writer's record, kv_disk_get's read */
    struct kv_disk_stats st;
};

static void path_of(const struct kv_disk *d, char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", d->dir, name);
}

static void ext_path(const struct kv_disk *d, char *out, size_t n, uint32_t id)
{
    snprintf(out, n, "%s/ext-%08u", d->dir, id);
}

/* -- the index table -- */

static struct entry *tab_find(struct kv_disk *d, uint64_t lo, uint64_t hi, int kind)
{
    for (uint32_t i = (uint32_t)lo & (d->cap - 1);; i = (i + 1) & (d->cap - 1)) {
        struct entry *e = &d->tab[i];
        if (!e->used && !e->tomb) return NULL;
        if (e->used && e->lo == lo && e->hi == hi && e->kind == kind) return e;
    }
}

static void tab_grow(struct kv_disk *d);

static struct entry *tab_insert(struct kv_disk *d, uint64_t lo, uint64_t hi, int kind)
{
    struct entry *e = tab_find(d, lo, hi, kind);
    if (e) return e;
    if (2 * (d->n_used + d->n_tomb + 1) > d->cap) tab_grow(d);
    uint32_t i = (uint32_t)lo & (d->cap - 1);
    while (d->tab[i].used) i = (i + 1) & (d->cap - 1);
    e = &d->tab[i];
    if (e->tomb) d->n_tomb--;
    memset(e, 0, sizeof *e);
    e->used = 1;
    e->lo = lo;
    e->hi = hi;
    e->kind = (uint8_t)kind;
    d->n_used++;
    return e;
}

static void tab_grow(struct kv_disk *d)
{
    struct entry *old = d->tab;
    uint32_t oc = d->cap;
    while (2 * (d->n_used + 1) > d->cap / 2) d->cap *= 2;
    d->tab = xcalloc(d->cap, sizeof *d->tab);
    d->n_used = d->n_tomb = 0;
    for (uint32_t i = 0; i < oc; i++)
        if (old[i].used) *tab_insert(d, old[i].lo, old[i].hi, old[i].kind) = old[i];
    free(old);
}

static struct extent *ext_get(struct kv_disk *d, uint32_t id)
{
    int lo = 0, hi = d->n_ext - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (d->ext[mid].id == id) return &d->ext[mid];
        if (d->ext[mid].id < id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

/* The live records of a kind: blocks or state snapshots. */
static void count(struct kv_disk *d, int kind, int delta)
{
    if (kind == KV_DISK_STATE)
        d->st.states += (uint64_t)(int64_t)delta;
    else
        d->st.blocks += (uint64_t)(int64_t)delta;
}

static size_t raw_of(const struct kv_disk *d, int kind)
{
    return kind == KV_DISK_STATE ? d->state_len : d->raw_len;
}

static void entry_drop(struct kv_disk *d, struct entry *e)
{
    struct extent *x = ext_get(d, e->ext);
    if (x) x->live--;
    e->used = 0;
    e->tomb = 1;
    d->n_used--;
    d->n_tomb++;
    count(d, e->kind, -1);
}

/* -- the log -- */

static int log_append(struct kv_disk *d, uint32_t kind, uint32_t ext, const struct entry *e)
{
    struct log_rec r = {kind,
                        ext,
                        e ? e->lo : 0,
                        e ? e->hi : 0,
                        e ? e->off : 0,
                        e ? e->len : 0,
                        (uint32_t)raw_of(d, e ? e->kind : KV_DISK_BLOCK),
                        0};
    r.check = log_check(&r);
    if (d->log_fd < 0 ||
        kv_disk_io.pwrite(d->log_fd, &r, sizeof r, (off_t)d->log_off) != (ssize_t)sizeof r)
        return -1;
    d->log_off += sizeof r;
    d->log_recs++;
    return 0;
}

/* Applies one log or snapshot record to the table (replays are idempotent). */
static void apply(struct kv_disk *d, const struct log_rec *r)
{
    if (r->kind == LOG_ADD || r->kind == LOG_ADD_STATE) {
        int kind = r->kind == LOG_ADD_STATE ? KV_DISK_STATE : KV_DISK_BLOCK;
        if (r->raw != raw_of(d, kind)) return; /* written for another size: a miss */
        struct entry *e = tab_find(d, r->lo, r->hi, kind);
        if (!e) {
            e = tab_insert(d, r->lo, r->hi, kind);
            count(d, kind, 1);
        } else {
            struct extent *x = ext_get(d, e->ext);
            if (x) x->live--;
        }
        e->ext = r->ext;
        e->off = r->off;
        e->len = r->len;
        struct extent *x = ext_get(d, r->ext);
        if (x) x->live++;
    } else if (r->kind == LOG_DROP) {
        for (uint32_t i = 0; i < d->cap; i++)
            if (d->tab[i].used && d->tab[i].ext == r->ext) entry_drop(d, &d->tab[i]);
    }
}

/* -- extents -- */

static void ext_remove(struct kv_disk *d, struct extent *x)
{
    char p[4096];
    ext_path(d, p, sizeof p, x->id);
    if (x->fd >= 0) kv_disk_io.close(x->fd);
    kv_disk_io.unlink(p);
    d->st.bytes -= x->size;
    int i = (int)(x - d->ext);
    if (d->cur == i) d->cur = -1;
    if (d->cur > i) d->cur--;
    memmove(x, x + 1, sizeof *x * (size_t)(d->n_ext - i - 1));
    d->n_ext--;
}

static struct extent *ext_add(struct kv_disk *d, uint32_t id, int fd, uint64_t size)
{
    if (d->n_ext == d->cap_ext) {
        d->cap_ext = d->cap_ext ? 2 * d->cap_ext : 64;
        d->ext = xrealloc(d->ext, sizeof *d->ext * (size_t)d->cap_ext);
    }
    struct extent *x = &d->ext[d->n_ext++];
    *x = (struct extent){id, fd, size, 0, 0, ++d->clock, 0};
    d->st.bytes += size;
    return x;
}

/* Drops the least recently used extent that nobody reads and that takes no records:
 * 0, or -1 when none can go. Cost: one pass over the extents and one over the table. */
static int evict_one(struct kv_disk *d)
{
    int best = -1;
    for (int i = 0; i < d->n_ext; i++)
        if (!d->ext[i].pins && i != d->cur &&
            (best < 0 || d->ext[i].last_use < d->ext[best].last_use))
            best = i;
    if (best < 0) return -1;
    uint32_t id = d->ext[best].id;
    uint64_t before = d->st.blocks + d->st.states;
    struct log_rec r = {.kind = LOG_DROP, .ext = id};
    apply(d, &r);
    d->st.evicted_blocks += before - (d->st.blocks + d->st.states);
    log_append(d, LOG_DROP, id, NULL); /* a lost record leaves entries to a missing file:
                                          they read as misses after a restart */
    ext_remove(d, &d->ext[best]);
    return 0;
}

/* ---- open ---- */

static int write_all(int fd, const void *p, size_t n, off_t off)
{
    return kv_disk_io.pwrite(fd, p, n, off) == (ssize_t)n ? 0 : -1;
}

static int read_file(const char *path, char **out, size_t *n)
{
    int fd = kv_disk_io.open(path, O_RDONLY, 0);
    if (fd < 0) return -1;
    struct stat s;
    if (fstat(fd, &s)) {
        kv_disk_io.close(fd);
        return -1;
    }
    *out = xmalloc((size_t)s.st_size + 1);
    ssize_t r = kv_disk_io.pread(fd, *out, (size_t)s.st_size, 0);
    kv_disk_io.close(fd);
    if (r < 0) {
        free(*out);
        *out = NULL; /* the caller frees what it holds */
        return -1;
    }
    *n = (size_t)r;
    return 0;
}

/* Deletes every store file (extents, index); the lock and header stay. */
static void wipe(struct kv_disk *d)
{
    DIR *dh = opendir(d->dir);
    if (!dh) return;
    struct dirent *de;
    char p[4096];
    while ((de = readdir(dh))) {
        if (strncmp(de->d_name, "ext-", 4) && strncmp(de->d_name, "index.", 6)) continue;
        path_of(d, p, sizeof p, de->d_name);
        kv_disk_io.unlink(p);
    }
    closedir(dh);
}

static int check_header(struct kv_disk *d, const char *fp, size_t fp_len, struct err *e)
{
    char p[4096], *old = NULL;
    size_t n = 0;
    path_of(d, p, sizeof p, "header");
    static const char magic[] = "pagoda kv disk 1\n";
    size_t ml = sizeof magic - 1;
    if (!read_file(p, &old, &n) && n == ml + fp_len && !memcmp(old, magic, ml) &&
        !memcmp(old + ml, fp, fp_len)) {
        free(old);
        return 0;
    }
    if (old)
        fprintf(stderr,
                "pagoda: %s: the KV blocks there were written for another model or format; "
                "starting empty\n",
                d->dir);
    free(old);
    wipe(d);
    char tmp[4096];
    path_of(d, tmp, sizeof tmp, "header.tmp");
    int fd = kv_disk_io.open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write_all(fd, magic, ml, 0) || write_all(fd, fp, fp_len, (off_t)ml) ||
        kv_disk_io.fsync(fd)) {
        if (fd >= 0) kv_disk_io.close(fd);
        return err_set(e, "%s: cannot write the header: %s", d->dir, strerror(errno));
    }
    kv_disk_io.close(fd);
    if (kv_disk_io.rename(tmp, p))
        return err_set(e, "%s: cannot write the header: %s", d->dir, strerror(errno));
    return 0;
}

/* The snapshot: {magic, count, next_ext} then count ADD records, then XXH3-64 of all. */
static void load_snapshot(struct kv_disk *d)
{
    char p[4096], *buf = NULL;
    size_t n = 0;
    path_of(d, p, sizeof p, "index.snap");
    if (read_file(p, &buf, &n)) return;
    uint64_t head[3];
    if (n >= sizeof head + 8) {
        memcpy(head, buf, sizeof head);
        uint64_t want;
        memcpy(&want, buf + n - 8, 8);
        if (head[0] == SNAP_MAGIC && n == sizeof head + head[1] * LOG_REC + 8 &&
            XXH3_64bits(buf, n - 8) == want) {
            if ((uint32_t)head[2] > d->next_ext) d->next_ext = (uint32_t)head[2];
            for (uint64_t i = 0; i < head[1]; i++) {
                struct log_rec r;
                memcpy(&r, buf + sizeof head + i * LOG_REC, LOG_REC);
                apply(d, &r);
            }
        } else {
            fprintf(stderr, "pagoda: %s: the index snapshot is damaged; it is ignored\n", d->dir);
        }
    }
    free(buf);
}

static int replay_log(struct kv_disk *d, struct err *e)
{
    char p[4096];
    path_of(d, p, sizeof p, "index.log");
    d->log_fd = kv_disk_io.open(p, O_RDWR | O_CREAT, 0644);
    if (d->log_fd < 0) return err_set(e, "%s: cannot open the index log: %s", p, strerror(errno));
    struct log_rec r;
    uint64_t off = 0;
    while (kv_disk_io.pread(d->log_fd, &r, sizeof r, (off_t)off) == (ssize_t)sizeof r &&
           r.check == log_check(&r) &&
           (r.kind == LOG_ADD || r.kind == LOG_DROP || r.kind == LOG_ADD_STATE)) {
        if (r.ext >= d->next_ext) d->next_ext = r.ext + 1;
        apply(d, &r);
        off += sizeof r;
        d->log_recs++;
    }
    d->log_off = off;
    kv_disk_io.ftruncate(d->log_fd, (off_t)off); /* a torn tail is cut off */
    return 0;
}

/* Opens every extent file; deletes those no entry names, and entries whose file is gone
 * or shorter than their record. */
static void scan_extents(struct kv_disk *d)
{
    DIR *dh = opendir(d->dir);
    if (!dh) return;
    struct dirent *de;
    uint32_t *ids = NULL;
    int n = 0, cap = 0;
    while ((de = readdir(dh))) {
        unsigned id;
        char tail;
        if (sscanf(de->d_name, "ext-%8u%c", &id, &tail) != 1) continue;
        if (n == cap) ids = xrealloc(ids, sizeof *ids * (size_t)(cap = cap ? 2 * cap : 64));
        ids[n++] = id;
    }
    closedir(dh);
    /* ascending ids: ext[] stays sorted */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
            uint32_t t = ids[j];
            ids[j] = ids[j - 1];
            ids[j - 1] = t;
        }
    char p[4096];
    for (int i = 0; i < n; i++) {
        if (ids[i] >= d->next_ext) d->next_ext = ids[i] + 1;
        ext_path(d, p, sizeof p, ids[i]);
        int fd = kv_disk_io.open(p, O_RDONLY, 0);
        struct stat s;
        if (fd < 0 || fstat(fd, &s)) {
            if (fd >= 0) kv_disk_io.close(fd);
            continue;
        }
        struct extent *x = ext_add(d, ids[i], fd, (uint64_t)s.st_size);
        x->closed = 1; /* records go to new extents */
    }
    free(ids);
    for (uint32_t i = 0; i < d->cap; i++) {
        struct entry *en = &d->tab[i];
        if (!en->used) continue;
        struct extent *x = ext_get(d, en->ext);
        if (x && (uint64_t)en->off + en->len <= x->size) {
            x->live++;
        } else { /* its file is gone or short: not held (no extent counted it yet) */
            en->used = 0;
            en->tomb = 1;
            d->n_used--;
            d->n_tomb++;
            count(d, en->kind, -1);
        }
    }
    for (int i = 0; i < d->n_ext;)
        if (d->ext[i].live <= 0)
            ext_remove(d, &d->ext[i]);
        else
            i++;
}

struct kv_disk *kv_disk_open(const char *dir, size_t budget, const char *fp, size_t fp_len,
                             size_t raw_len, size_t state_len, struct err *e)
{
    if (budget < 2 * KV_DISK_EXTENT) {
        err_set(e, "--kv-disk-size: %zu bytes is below the least (%zu: two extents)", budget,
                2 * KV_DISK_EXTENT);
        return NULL;
    }
    if (mkdir(dir, 0755) && errno != EEXIST) {
        err_set(e, "--kv-disk-dir %s: %s", dir, strerror(errno));
        return NULL;
    }
    struct kv_disk *d = xcalloc(1, sizeof *d);
    d->dir = xmalloc(strlen(dir) + 1);
    strcpy(d->dir, dir);
    d->log_fd = -1;
    d->cur = -1;
    d->budget = budget;
    d->raw_len = raw_len;
    d->state_len = state_len;
    d->max_rec = KV_DISK_REC_HEAD + ZSTD_compressBound(raw_len > state_len ? raw_len : state_len);
    pthread_mutex_init(&d->mu, NULL);
    d->cap = 1024;
    d->tab = xcalloc(d->cap, sizeof *d->tab);
    char p[4096];
    path_of(d, p, sizeof p, "LOCK");
    d->lock_fd = kv_disk_io.open(p, O_RDWR | O_CREAT, 0644);
    if (d->lock_fd < 0) {
        err_set(e, "--kv-disk-dir %s: cannot create %s: %s", dir, p, strerror(errno));
        goto fail;
    }
    if (flock(d->lock_fd, LOCK_EX | LOCK_NB)) {
        char pid[32] = "?";
        ssize_t r = kv_disk_io.pread(d->lock_fd, pid, sizeof pid - 1, 0);
        pid[r > 0 ? r : 1] = 0;
        pid[strcspn(pid, "\n")] = 0;
        err_set(e,
                "--kv-disk-dir %s: in use by another pagoda server (pid %s); give each its own "
                "directory",
                dir, pid);
        goto fail;
    }
    char pid[32];
    int pl = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    kv_disk_io.ftruncate(d->lock_fd, 0);
    kv_disk_io.pwrite(d->lock_fd, pid, (size_t)pl, 0);
    if (check_header(d, fp, fp_len, e)) goto fail;
    load_snapshot(d);
    if (replay_log(d, e)) goto fail;
    scan_extents(d);
    while (d->st.bytes > d->budget && !evict_one(d)) {
    }
    d->cctx = ZSTD_createCCtx();
    d->dctx = ZSTD_createDCtx();
    d->wbuf = xmalloc(d->max_rec);
    d->rbuf = xmalloc(d->max_rec);
    return d;
fail:
    kv_disk_close(d);
    return NULL;
}

void kv_disk_close(struct kv_disk *d)
{
    if (!d) return;
    if (d->cctx) kv_disk_snapshot(d); /* opened fully */
    for (int i = 0; i < d->n_ext; i++)
        if (d->ext[i].fd >= 0) kv_disk_io.close(d->ext[i].fd);
    if (d->log_fd >= 0) kv_disk_io.close(d->log_fd);
    if (d->lock_fd >= 0) kv_disk_io.close(d->lock_fd); /* releases the flock */
    ZSTD_freeCCtx(d->cctx);
    ZSTD_freeDCtx(d->dctx);
    pthread_mutex_destroy(&d->mu);
    free(d->wbuf);
    free(d->rbuf);
    free(d->ext);
    free(d->tab);
    free(d->dir);
    free(d);
}

/* ---- writing ---- */

/* The extent taking a record of n bytes (a new one when the current would pass the
 * extent size), making room in the budget first. NULL: a fault or no room. */
static struct extent *ext_for(struct kv_disk *d, size_t n)
{
    if (d->cur >= 0 && (d->ext[d->cur].closed || d->ext[d->cur].size + n > KV_DISK_EXTENT))
        d->ext[d->cur].closed = 1, d->cur = -1;
    while (d->st.bytes + n > d->budget)
        if (evict_one(d)) {
            d->st.full++;
            return NULL;
        }
    if (d->cur >= 0) return &d->ext[d->cur];
    char p[4096];
    uint32_t id = d->next_ext++;
    ext_path(d, p, sizeof p, id);
    int fd = kv_disk_io.open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        d->st.faults_write++;
        return NULL;
    }
    ext_add(d, id, fd, 0);
    d->cur = d->n_ext - 1;
    return &d->ext[d->cur];
}

static int put_rec(struct kv_disk *d, int kind, struct kv_hash h, const void *raw)
{
    size_t raw_len = raw_of(d, kind);
    assert(raw_len > 0);
    pthread_mutex_lock(&d->mu);
    int held = tab_find(d, h.lo, h.hi, kind) != NULL;
    pthread_mutex_unlock(&d->mu);
    if (held) return 1;
    /* The directory removed under us: the open files would still take records, but
     * nothing would find them after a restart. One fstat a block tells. */
    struct stat ls;
    if (d->log_fd < 0 || fstat(d->log_fd, &ls) || ls.st_nlink == 0) {
        pthread_mutex_lock(&d->mu);
        d->st.faults_write++;
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    /* compress outside the lock: only the writer uses cctx and wbuf */
    struct rec_head *rh = d->wbuf;
    char *stored = (char *)d->wbuf + KV_DISK_REC_HEAD;
    size_t c = ZSTD_compressCCtx(d->cctx, stored, d->max_rec - KV_DISK_REC_HEAD, raw, raw_len, 1);
    uint32_t flags = 0;
    if (ZSTD_isError(c) || c >= raw_len) {
        memcpy(stored, raw, raw_len);
        c = raw_len;
        flags = REC_RAW;
    }
    *rh = (struct rec_head){kind == KV_DISK_STATE ? REC_MAGIC_STATE : REC_MAGIC,
                            flags,
                            (uint32_t)c,
                            (uint32_t)raw_len,
                            h.lo,
                            h.hi,
                            0};
    rh->check = rec_check(rh, stored);
    size_t n = KV_DISK_REC_HEAD + c;

    /* Space is taken under the lock, the bytes written outside it (a slow or stuck disk
     * must not hold up lookups on the engine thread); the extent stays pinned meanwhile.
     * Only this thread appends, so the log needs no lock either. */
    pthread_mutex_lock(&d->mu);
    struct extent *x = ext_for(d, n);
    if (!x) {
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    uint32_t id = x->id;
    int fd = x->fd;
    struct entry tmp = {h.lo, h.hi, id, (uint32_t)x->size, (uint32_t)n, 0, 0, (uint8_t)kind};
    x->size += n;
    d->st.bytes += n;
    x->last_use = ++d->clock;
    x->pins++;
    pthread_mutex_unlock(&d->mu);

    int bad = write_all(fd, d->wbuf, n, (off_t)tmp.off) ||
              log_append(d, kind == KV_DISK_STATE ? LOG_ADD_STATE : LOG_ADD, id, &tmp);

    pthread_mutex_lock(&d->mu);
    x = ext_get(d, id);
    x->pins--;
    if (bad) {
        d->st.faults_write++;
        x->closed = 1; /* its tail is unknown now */
        if (d->cur == (int)(x - d->ext)) d->cur = -1;
    } else {
        struct entry *en = tab_insert(d, h.lo, h.hi, kind);
        *en = tmp;
        en->used = 1;
        x->live++;
        count(d, kind, 1);
        if (kind == KV_DISK_STATE) {
            d->st.stored_states++;
        } else {
            d->st.stored++;
            d->st.stored_bytes += raw_len;
        }
    }
    pthread_mutex_unlock(&d->mu);
    if (!bad && d->log_recs >= SNAP_EVERY) kv_disk_snapshot(d);
    return bad ? -1 : 0;
}

int kv_disk_put(struct kv_disk *d, struct kv_hash h, const void *raw)
{
    return put_rec(d, KV_DISK_BLOCK, h, raw);
}

int kv_disk_put_state(struct kv_disk *d, struct kv_hash h, const void *raw)
{
    return put_rec(d, KV_DISK_STATE, h, raw);
}

int kv_disk_snapshot(struct kv_disk *d)
{
    pthread_mutex_lock(&d->mu);
    uint64_t count = d->st.blocks + d->st.states;
    size_t n = 24 + count * LOG_REC + 8;
    char *buf = xmalloc(n);
    uint64_t head[3] = {SNAP_MAGIC, count, d->next_ext};
    memcpy(buf, head, sizeof head);
    uint64_t k = 0;
    for (uint32_t i = 0; i < d->cap && k < count; i++) {
        struct entry *e = &d->tab[i];
        if (!e->used) continue;
        struct log_rec r = {e->kind == KV_DISK_STATE ? LOG_ADD_STATE : LOG_ADD,
                            e->ext,
                            e->lo,
                            e->hi,
                            e->off,
                            e->len,
                            (uint32_t)raw_of(d, e->kind),
                            0};
        r.check = log_check(&r);
        memcpy(buf + 24 + k++ * LOG_REC, &r, LOG_REC);
    }
    uint64_t sum = XXH3_64bits(buf, n - 8);
    memcpy(buf + n - 8, &sum, 8);
    char tmp[4096], p[4096];
    path_of(d, tmp, sizeof tmp, "index.snap.tmp");
    path_of(d, p, sizeof p, "index.snap");
    int rc = -1;
    int fd = kv_disk_io.open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0 && !write_all(fd, buf, n, 0) && !kv_disk_io.fsync(fd)) {
        kv_disk_io.close(fd);
        fd = -1;
        /* the log is emptied only once the snapshot holds what it said; a crash in between
         * replays records already in it, which changes nothing */
        if (!kv_disk_io.rename(tmp, p) && !kv_disk_io.ftruncate(d->log_fd, 0)) {
            d->log_off = 0;
            d->log_recs = 0;
            rc = 0;
        }
    }
    if (fd >= 0) kv_disk_io.close(fd);
    if (rc) {
        d->st.faults_write++;
        d->log_recs = 0; /* try again after another SNAP_EVERY records */
    }
    pthread_mutex_unlock(&d->mu);
    free(buf);
    return rc;
}

/* ---- reading ---- */

static int has_rec(struct kv_disk *d, int kind, struct kv_hash h)
{
    pthread_mutex_lock(&d->mu);
    int r = tab_find(d, h.lo, h.hi, kind) != NULL;
    pthread_mutex_unlock(&d->mu);
    return r;
}

int kv_disk_has(struct kv_disk *d, struct kv_hash h)
{
    return has_rec(d, KV_DISK_BLOCK, h);
}

int kv_disk_has_state(struct kv_disk *d, struct kv_hash h)
{
    return has_rec(d, KV_DISK_STATE, h);
}

static int pin_rec(struct kv_disk *d, int kind, struct kv_hash h, struct kv_disk_ref *out)
{
    pthread_mutex_lock(&d->mu);
    struct entry *e = tab_find(d, h.lo, h.hi, kind);
    struct extent *x = e ? ext_get(d, e->ext) : NULL;
    if (x) {
        x->pins++;
        x->last_use = ++d->clock;
        *out = (struct kv_disk_ref){x->fd, x->id, (off_t)e->off, e->len, kind};
    }
    pthread_mutex_unlock(&d->mu);
    return x ? 0 : -1;
}

int kv_disk_pin(struct kv_disk *d, struct kv_hash h, struct kv_disk_ref *out)
{
    return pin_rec(d, KV_DISK_BLOCK, h, out);
}

int kv_disk_pin_state(struct kv_disk *d, struct kv_hash h, struct kv_disk_ref *out)
{
    return pin_rec(d, KV_DISK_STATE, h, out);
}

void kv_disk_unpin(struct kv_disk *d, const struct kv_disk_ref *ref)
{
    pthread_mutex_lock(&d->mu);
    struct extent *x = ext_get(d, ref->ext);
    if (x) x->pins--;
    pthread_mutex_unlock(&d->mu);
}

static void forget(struct kv_disk *d, struct kv_hash h, int kind, uint64_t *counter)
{
    pthread_mutex_lock(&d->mu);
    struct entry *e = tab_find(d, h.lo, h.hi, kind);
    if (e) entry_drop(d, e);
    (*counter)++;
    pthread_mutex_unlock(&d->mu);
}

int kv_disk_decode(struct kv_disk *d, struct kv_hash h, const struct kv_disk_ref *ref,
                   const void *rec, ssize_t n_read, void *raw)
{
    int kind = ref->kind;
    size_t raw_len = raw_of(d, kind);
    if (n_read != (ssize_t)ref->len) {
        forget(d, h, kind, &d->st.faults_read);
        return -1;
    }
    struct rec_head rh;
    memcpy(&rh, rec, sizeof rh);
    const char *stored = (const char *)rec + KV_DISK_REC_HEAD;
    if (rh.magic != (kind == KV_DISK_STATE ? REC_MAGIC_STATE : REC_MAGIC) || rh.lo != h.lo ||
        rh.hi != h.hi || rh.raw != raw_len || KV_DISK_REC_HEAD + (size_t)rh.stored != ref->len ||
        rh.check != rec_check(&rh, stored)) {
        forget(d, h, kind, &d->st.faults_corrupt);
        return -1;
    }
    if (rh.flags & REC_RAW) {
        if (rh.stored != rh.raw) goto bad;
        memcpy(raw, stored, rh.raw);
        return 0;
    }
    size_t got = ZSTD_decompressDCtx(d->dctx, raw, raw_len, stored, rh.stored);
    if (ZSTD_isError(got) || got != raw_len) goto bad;
    return 0;
bad:
    forget(d, h, kind, &d->st.faults_corrupt);
    return -1;
}

static int get_rec(struct kv_disk *d, int kind, struct kv_hash h, void *raw)
{
    struct kv_disk_ref ref;
    if (pin_rec(d, kind, h, &ref)) return -1;
    ssize_t n = kv_disk_io.pread(ref.fd, d->rbuf, ref.len, ref.off);
    if (n < 0) n = -errno;
    int rc = kv_disk_decode(d, h, &ref, d->rbuf, n, raw);
    kv_disk_unpin(d, &ref);
    return rc;
}

int kv_disk_get(struct kv_disk *d, struct kv_hash h, void *raw)
{
    return get_rec(d, KV_DISK_BLOCK, h, raw);
}

int kv_disk_get_state(struct kv_disk *d, struct kv_hash h, void *raw)
{
    return get_rec(d, KV_DISK_STATE, h, raw);
}

int kv_disk_sample(struct kv_disk *d, struct kv_hash *out, int max)
{
    int n = 0;
    pthread_mutex_lock(&d->mu);
    for (uint32_t i = 0; i < d->cap && n < max; i++)
        if (d->tab[i].used && d->tab[i].kind == KV_DISK_BLOCK)
            out[n++] = (struct kv_hash){d->tab[i].lo, d->tab[i].hi};
    pthread_mutex_unlock(&d->mu);
    return n;
}

size_t kv_disk_max_record(const struct kv_disk *d)
{
    return d->max_rec;
}

size_t kv_disk_max_block_record(const struct kv_disk *d)
{
    return KV_DISK_REC_HEAD + ZSTD_compressBound(d->raw_len);
}

void kv_disk_stats(struct kv_disk *d, struct kv_disk_stats *out)
{
    pthread_mutex_lock(&d->mu);
    *out = d->st;
    pthread_mutex_unlock(&d->mu);
}
