/*
 * kv_tier: the disk tier behind the KV pool, off the step's path. Stores go through a
 * bounded queue to a writer thread (kv_disk_put: compress, append, log); a full queue
 * drops the block and counts it, so the step never waits for the disk. Loads read a
 * prefix's records with io_uring into a fixed set of buffers and hand each checked,
 * decompressed block to a callback that copies it into the pool; the engine polls them
 * between steps, so that other requests keep stepping while one waits for its blocks.
 *
 *     struct kv_tier *t = kv_tier_create(&cfg, &e);
 *     void *buf = kv_tier_store_begin(t);           // NULL: queue full (dropped, counted)
 *     ... copy a block's bytes into buf ...;  kv_tier_store_end(t, hash);
 *     int id = kv_tier_load_start(t, hashes, blocks, n, NULL, -1);
 *     kv_tier_poll(t, 0, write_block, user);       // each step; writes blocks as they land
 *     if (kv_tier_load_done(t, id, &n_ok, &snap_ok)) { ... blocks[0..n_ok) hold their KV ... }
 *
 * Hybrid models store and load recurrent-state snapshots the same way (state_bytes > 0):
 * kv_tier_store_state_begin/_end queue one, a load may name one to read beside its blocks.
 *
 * Threads: every call but the writer's work runs on one thread (the engine's).
 */
#ifndef PAGODA_PAGED_KV_KV_TIER_H
#define PAGODA_PAGED_KV_KV_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "paged_kv/kv_disk.h"
#include "paged_kv/kv_pool.h"

/* Loads in progress at most; reads in flight at most. */
#define KV_TIER_LOADS 4
#define KV_TIER_READS 16

struct kv_tier_config {
    const char *dir;
    size_t disk_bytes;
    const char *fp; /* the store's fingerprint (kv_disk_open) */
    size_t fp_len;
    size_t block_bytes;  /* raw bytes of one block */
    size_t state_bytes;  /* raw bytes of one state snapshot (hybrid models), 0: none */
    int queue_blocks;    /* blocks the store queue holds */
    int queue_states;    /* snapshots the state queue holds (state_bytes > 0) */
    int max_load_blocks; /* blocks one load names at most */
};

struct kv_tier_stats {
    struct kv_disk_stats disk;
    size_t disk_budget;
    uint64_t store_dropped;           /* the queue was full */
    double store_seconds;             /* the writer's busy time */
    uint64_t load_blocks, load_bytes; /* blocks loaded and checked (raw bytes) */
    double load_seconds;              /* from the start of each load to its end */
    uint64_t load_failed;             /* loads cut short by a fault or a missing record */
    uint64_t load_states;             /* state snapshots loaded and checked */
    uint64_t state_failed;            /* of the loads above, those whose snapshot failed */
    uint64_t probe_bytes;             /* the read-rate probe at open (raw bytes read) */
    double probe_seconds;
};

/** Called for each record a load brings in: kind KV_DISK_BLOCK: copy raw [block_bytes],
 * block h, into pool block `dst`; KV_DISK_STATE: raw [state_bytes], the snapshot after block
 * h, into state slot `dst`. */
typedef void (*kv_tier_write_fn)(void *user, int kind, int32_t dst, struct kv_hash h,
                                 const void *raw);

struct kv_tier;

/** Opens the store and starts the writer. NULL + err (kv_disk_open's messages). */
struct kv_tier *kv_tier_create(const struct kv_tier_config *cfg, struct err *e);
/** Writes what the queue holds, stops the writer, waits for reads in flight, closes. */
void kv_tier_destroy(struct kv_tier *t);

/** A queue slot of block_bytes to fill, or NULL when the queue is full (counted). */
void *kv_tier_store_begin(struct kv_tier *t);
/** Whether the queue has a free slot now (a caller that can wait asks first: no drop is
 * counted). */
int kv_tier_store_room(struct kv_tier *t);
/** Hands the slot from kv_tier_store_begin to the writer under hash h. */
void kv_tier_store_end(struct kv_tier *t, struct kv_hash h);
/** A queue slot of state_bytes for a state snapshot, or NULL when full (counted as dropped). */
void *kv_tier_store_state_begin(struct kv_tier *t);
/** Whether the state queue has a free slot now (as kv_tier_store_room). */
int kv_tier_store_state_room(struct kv_tier *t);
/** Hands it to the writer: the snapshot after block h. */
void kv_tier_store_state_end(struct kv_tier *t, struct kv_hash h);

/** Whether block h is on disk (queued ones are not). */
int kv_tier_has(struct kv_tier *t, struct kv_hash h);
/** Whether the state snapshot after block h is on disk. */
int kv_tier_has_state(struct kv_tier *t, struct kv_hash h);
/** How many of hashes[0..n) are on disk consecutively from the first. */
int kv_tier_probe(struct kv_tier *t, const struct kv_hash *hashes, int n);

/** Starts loading hashes[i] into pool blocks[i], i < n (<= max_load_blocks; 0 with a
 * snapshot), and with snap (else NULL) the state snapshot after block *snap into state slot
 * snap_slot (snapshots are read one at a time, beside the blocks); the arrays are copied. A
 * load id, or -1 when KV_TIER_LOADS are in progress. */
int kv_tier_load_start(struct kv_tier *t, const struct kv_hash *hashes, const int32_t *blocks,
                       int n, const struct kv_hash *snap, int32_t snap_slot);
/** Submits reads and takes their completions, writing each good block through fn; with
 * wait_s > 0 and reads in flight, waits up to that long for one. */
void kv_tier_poll(struct kv_tier *t, double wait_s, kv_tier_write_fn fn, void *user);
/** 1 when load id has ended: *n_ok of its blocks, from the first, hold their KV (the
 * others failed or follow one that did), *snap_ok whether its snapshot was written (0 when
 * none was asked). The id is free again. 0 while in progress. */
int kv_tier_load_done(struct kv_tier *t, int id, int *n_ok, int *snap_ok);
/** Abandons a load: nothing more is written into its blocks (the caller may reuse them
 * at once); its reads in flight are discarded when they land. */
void kv_tier_load_cancel(struct kv_tier *t, int id);
/** Whether any load is in progress. */
int kv_tier_loading(const struct kv_tier *t);

/** The read rate the load-or-recompute decision uses, raw bytes per second: that of the
 * loads so far (load_bytes over load_s, start to end of each); before the first load ends,
 * that of the probe at open (probe_bytes read one record at a time, checked and
 * decompressed, over probe_s: lower than loads with 16 reads in flight, so a conservative
 * first estimate); with nothing held at open, the writer's rate so far (store_bytes
 * compressed and written in store_s: compressing and writing are slower than reading and
 * decompressing, so again an estimate that errs low); 0 when none of them is measured. */
double kv_tier_rate(uint64_t load_bytes, double load_s, uint64_t probe_bytes, double probe_s,
                    uint64_t store_bytes, double store_s);
/** kv_tier_rate of this tier. */
double kv_tier_load_rate(struct kv_tier *t);

/** Whether loading `bytes` at load_rate (bytes/s) beats computing `tokens` at prefill_tps
 * (tokens/s): never slower than recompute. Either rate 0 (not measured yet): 1, the tier is
 * tried. */
int kv_tier_worth_loading(double bytes, int tokens, double load_rate, double prefill_tps);

void kv_tier_stats(struct kv_tier *t, struct kv_tier_stats *out);
/** Refreshes the store's side of out (disk, store_*) only: callable from any thread. */
void kv_tier_store_stats(struct kv_tier *t, struct kv_tier_stats *out);

#endif
