/*
 * safetensors: read-only access to the tensors of a model folder, mapped with mmap.
 *
 * st_open() takes a folder and opens model.safetensors, or every shard named by
 * model.safetensors.index.json. Headers are validated in full (JSON, dtypes, shapes against
 * byte ranges, ranges inside the file), so a tensor handed out is always safe to read.
 * Tensor data stays in the page cache; nothing is copied.
 */
#ifndef PAGODA_MODEL_SAFETENSORS_H
#define PAGODA_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/strmap.h"

enum st_dtype {
    ST_F32,
    ST_F16,
    ST_BF16,
    ST_F64,
    ST_I8,
    ST_U8,
    ST_I16,
    ST_U16,
    ST_I32,
    ST_U32,
    ST_I64,
    ST_U64,
    ST_BOOL,
    ST_F8_E4M3,
    ST_F8_E5M2,
    ST_DTYPE_COUNT
};

#define ST_MAX_DIMS 6

struct st_tensor {
    char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const void *data; /* inside the mapping, valid until st_close */
    size_t nbytes;
    const char *file; /* base name of the shard that holds it */
};

struct st_file {
    char *path;
    char *base;
    void *map;
    size_t size;
};

struct safetensors {
    struct st_file *files;
    int nfiles;
    struct st_tensor *tensors;
    int ntensors;
    struct strmap index; /* name -> tensors[] index */
};

/** Opens the checkpoint in `dir`. On failure `e` names the file (and tensor) at fault. */
int st_open(struct safetensors *st, const char *dir, struct err *e);

/** Opens one .safetensors file (appending its tensors). */
int st_open_file(struct safetensors *st, const char *path, struct err *e);

void st_close(struct safetensors *st);

/** Locks every mapped file in memory (mlock), so the page cache cannot drop weights between
 * steps. -1 + err when the system refuses (RLIMIT_MEMLOCK). */
int st_lock(struct safetensors *st, struct err *e);

/** The tensor named `name`, or NULL. */
const struct st_tensor *st_find(const struct safetensors *st, const char *name);

/** Bytes per element of a dtype; its safetensors name. */
size_t st_dtype_size(enum st_dtype t);
const char *st_dtype_name(enum st_dtype t);

/** Number of elements of a tensor. */
int64_t st_numel(const struct st_tensor *t);

/** Formats a shape as "[a, b, c]" into buf. */
const char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t n);

#endif
