/*
 * kv_block: one KV block's bytes out of and into the backend's pool, for the tiers behind
 * it (paged_kv/kv_tier.h). A block's image is, for each layer that owns KV storage in
 * order, its K rows then its V rows: [block_size][n_kv_heads][head_dim] values of the
 * backend's KV type each, model_kv_bytes_per_token() * block_size bytes in all. The
 * image is the backend's own format: it is only read back by the same backend and model
 * (the disk tier's fingerprint names both).
 *
 * A model split over a tensor-parallel group (model/tp.h) is called through its lead: a
 * block's image is then each rank's share of it (its key-value heads) in rank order, and a
 * snapshot's likewise; every call below covers every rank, from the lead's thread.
 */
#ifndef PAGODA_MODEL_KV_BLOCK_H
#define PAGODA_MODEL_KV_BLOCK_H

#include <stddef.h>

#include "model/model.h"

/** Bytes of one block's image. */
size_t model_kv_block_bytes(const struct model *m);

/** Bytes of one recurrent-state snapshot's image (model_state_bytes of each rank). */
size_t model_state_image_bytes(const struct model *m);

/** model_state_read and model_state_write over every rank: slot `slot` to or from an image
 * of model_state_image_bytes. */
void model_state_image_read(struct model *m, int slot, void *dst);
void model_state_image_write(struct model *m, int slot, const void *src);

/** Copies pool block `block` to host memory dst [model_kv_block_bytes] (waits for the work
 * queued before it). */
void model_kv_block_read(struct model *m, int block, void *dst);

/** Copies src [model_kv_block_bytes] (host memory) into pool block `block`, in order with
 * the steps after it. */
void model_kv_block_write(struct model *m, int block, const void *src);

/** Whether the backend has a copy engine (backend_ops.copy_block and the rest): blocks then
 * move to and from pinned host memory off the step's path. */
int model_kv_copy_engine(const struct model *m);

/** Pinned host memory for the copy engine (backend_ops.host_alloc; a split model's other
 * ranks map it too), NULL when it cannot be had; and its release. */
void *model_host_alloc(struct model *m, size_t bytes);
void model_host_free(struct model *m, void *p);

/** The copy engine's tickets (backend_ops.copy_mark, copy_done), fence and seconds, over
 * every rank: a ticket is done once each rank's copies queued before it are; the seconds
 * are the slowest rank's. */
uint64_t model_copy_mark(struct model *m);
int model_copy_done(struct model *m, uint64_t t);
void model_copy_fence(struct model *m);
void model_copy_seconds(struct model *m, double *out_s, double *in_s);

/** Tells the copy engine where a block's pieces lie, and a hybrid model's state slots'
 * (once, after host_alloc, before the first copy). */
void model_kv_copy_setup(struct model *m);

/** Queues a copy of pool block `block` to pinned host memory dst [model_kv_block_bytes],
 * after the steps queued so far (a copy engine's; copies queued together are one gather). */
void model_kv_block_copy_out(struct model *m, int block, void *dst);

/** Queues a copy of pinned host memory src [model_kv_block_bytes] into pool block `block`,
 * after the steps queued so far; a step reads it once a later model_kv_copy_mark ticket is
 * done. */
void model_kv_block_copy_in(struct model *m, int block, const void *src);

/** Queues a copy of recurrent-state slot `slot` to pinned host memory dst
 * [model_state_bytes], in model_state_read's image, after the steps queued so far (a copy
 * engine's, ordered with the block copies). */
void model_state_copy_out(struct model *m, int slot, void *dst);

/** Queues a copy of pinned host memory src [model_state_bytes] into state slot `slot`, as
 * model_kv_block_copy_in. */
void model_state_copy_in(struct model *m, int slot, const void *src);

#endif
