/*
 * kv_disk: the persistent store of KV blocks under one directory (the disk tier). Blocks
 * are named by their block hash (kv_pool.h) and packed into extent files of up to
 * KV_DISK_EXTENT bytes; each record is zstd-compressed and carries an XXH3 checksum over
 * its block hash, its length and its stored bytes, so that a torn, truncated or altered
 * record reads as a miss, never as wrong KV.
 *
 * Hybrid models store a second kind of record beside blocks: the recurrent state of their
 * linear-attention layers after a block (a snapshot, state_len bytes), named by that
 * block's hash. A block and its snapshot are separate records under the same name, kept,
 * checked and dropped by the same rules; a prefix resumes only where both are held.
 *
 * Files in the directory:
 *   LOCK          flock'ed for the store's life: a second server on the directory is refused
 *   header        the fingerprint (model weights, KV format, block size, tokenizer, chat
 *                 template); a store written under another fingerprint is emptied on open
 *   ext-NNNNNNNN  extent files: records appended, never rewritten
 *   index.log     append-only: a record per block added and per extent dropped
 *   index.snap    a snapshot of the index; the log holds what came after it
 * The index survives kill -9: on open the snapshot is read and the log replayed up to its
 * first torn or bad record (the rest is cut off). Extents no index entry names are deleted.
 *
 * The byte budget counts extent files; when a new record would pass it, whole extents
 * are dropped in least recently used order (an extent is used when a block in it is
 * written or read).
 *
 * Threads: kv_disk_put from one thread (the tier's writer), the rest from any; an
 * internal mutex guards the index.
 *
 * Faults: every file call goes through kv_disk_io, a function table tests replace to
 * inject ENOSPC, EIO, short or altered reads (as SQLite's test VFS). A failed write drops
 * the block and closes its extent to new records; a failed or bad read drops the entry.
 * Each is counted in kv_disk_stats.
 */
#ifndef PAGODA_PAGED_KV_KV_DISK_H
#define PAGODA_PAGED_KV_KV_DISK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"
#include "paged_kv/kv_pool.h"

/* An extent is closed to new records once it would pass this many bytes. */
#define KV_DISK_EXTENT ((size_t)4 << 20)
/* Bytes of a record's head before its stored bytes. */
#define KV_DISK_REC_HEAD 40

/** What a record holds. */
enum kv_disk_kind { KV_DISK_BLOCK, KV_DISK_STATE };

/** The file calls of the store (the real ones by default; tests swap members). */
struct kv_disk_io {
    int (*open)(const char *path, int flags, mode_t mode);
    ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
    ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t off);
    int (*fsync)(int fd);
    int (*ftruncate)(int fd, off_t len);
    int (*close)(int fd);
    int (*unlink)(const char *path);
    int (*rename)(const char *from, const char *to);
    /* Every read the tier completes asynchronously passes here: returns res (bytes read or
     * -errno) or what a test injects instead; it may alter buf. */
    ssize_t (*read_done)(int fd, void *buf, size_t n, off_t off, ssize_t res);
};

/** The table in use; tests replace members and restore kv_disk_io_default. */
extern struct kv_disk_io kv_disk_io;
extern const struct kv_disk_io kv_disk_io_default;

struct kv_disk_stats {
    uint64_t blocks, bytes;        /* live block records; extent file bytes */
    uint64_t states;               /* live state-snapshot records */
    uint64_t stored, stored_bytes; /* blocks written (raw bytes) */
    uint64_t stored_states;        /* state snapshots written */
    uint64_t faults_write;         /* ENOSPC, EIO, a missing directory on write */
    uint64_t faults_read;          /* EIO or a short read */
    uint64_t faults_corrupt;       /* a record whose checksum, hash or length is wrong */
    uint64_t evicted_blocks;       /* records (blocks and snapshots) dropped for the budget */
    uint64_t full;                 /* records refused: nothing left to evict */
};

/** Where a block's record lies, pinned (its extent is not dropped) until kv_disk_unpin. */
struct kv_disk_ref {
    int fd;
    uint32_t ext;
    off_t off;
    size_t len; /* record bytes, head included */
    int kind;   /* enum kv_disk_kind */
};

struct kv_disk;

/**
 * Opens (or creates) the store in dir under a byte budget (at least 2 * KV_DISK_EXTENT)
 * for blocks of raw_len bytes and state snapshots of state_len bytes (0: none). fp names
 * the model and formats; a store with another is emptied. NULL + err when the directory
 * cannot be used or another process holds it.
 */
struct kv_disk *kv_disk_open(const char *dir, size_t budget, const char *fp, size_t fp_len,
                             size_t raw_len, size_t state_len, struct err *e);
/** Writes the snapshot, releases the lock, frees. */
void kv_disk_close(struct kv_disk *d);

/** Stores a block (raw_len bytes). 0 stored, 1 already held, -1 not stored (a fault or the
 * budget: counted). */
int kv_disk_put(struct kv_disk *d, struct kv_hash h, const void *raw);

/** Stores the state snapshot taken after block h (state_len bytes): as kv_disk_put. */
int kv_disk_put_state(struct kv_disk *d, struct kv_hash h, const void *raw);

/** Whether the block is held. */
int kv_disk_has(struct kv_disk *d, struct kv_hash h);
/** Whether the state snapshot after block h is held. */
int kv_disk_has_state(struct kv_disk *d, struct kv_hash h);

/** Pins the block's record: 0, or -1 when not held. Marks its extent used. */
int kv_disk_pin(struct kv_disk *d, struct kv_hash h, struct kv_disk_ref *out);
/** Pins the record of the state snapshot after block h (as kv_disk_pin). */
int kv_disk_pin_state(struct kv_disk *d, struct kv_hash h, struct kv_disk_ref *out);
void kv_disk_unpin(struct kv_disk *d, const struct kv_disk_ref *ref);

/**
 * Checks a record read from ref (rec [ref->len] bytes; n_read the read's result, bytes or
 * -errno) and decompresses it into raw [raw_len, or state_len for a snapshot's record:
 * ref->kind; a record of the other kind under the name is corrupt]. 0, or -1 after dropping the
 * entry and counting the fault. A scratch buffer of the store is used: one caller at a time.
 */
int kv_disk_decode(struct kv_disk *d, struct kv_hash h, const struct kv_disk_ref *ref,
                   const void *rec, ssize_t n_read, void *raw);

/** Reads a block synchronously (pin, pread, decode): 0, or -1 (a miss, or a fault counted). */
int kv_disk_get(struct kv_disk *d, struct kv_hash h, void *raw);

/** Reads a state snapshot synchronously (as kv_disk_get). */
int kv_disk_get_state(struct kv_disk *d, struct kv_hash h, void *raw);

/** Up to max names of held blocks (table order): a sample to time reads with. */
int kv_disk_sample(struct kv_disk *d, struct kv_hash *out, int max);

/** The largest record: a buffer this size holds any read. */
size_t kv_disk_max_record(const struct kv_disk *d);
/** The largest block record (a snapshot's may be larger). */
size_t kv_disk_max_block_record(const struct kv_disk *d);

/** Writes the snapshot of the index and empties the log. 0, or -1 (counted as a write fault). */
int kv_disk_snapshot(struct kv_disk *d);

void kv_disk_stats(struct kv_disk *d, struct kv_disk_stats *out);

#endif
