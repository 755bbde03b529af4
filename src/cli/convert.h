/*
 * convert: `pagoda convert`, a checkpoint rewritten in another weight format. Three parts:
 * convert.c (options, shards, progress, the other files of the folder), convert_plan.c (which
 * output tensors come from which source tensors, and the fill callback that makes their bytes
 * one row at a time from the memory-mapped source) and convert_config.c (config.json).
 *
 * Plan, then write: every output tensor, with its name, shape and byte count, is known and
 * checked before the first byte goes out; memory holds the plan and one row of scratch.
 */
#ifndef PAGODA_CLI_CONVERT_H
#define PAGODA_CLI_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "kernels/cpu/quantize.h"
#include "model/safetensors.h"

struct cJSON;

struct cv_options {
    const char *src, *dst;
    const char *format;     /* as given: bf16, f16, mlx4, mxfp4, ... */
    int quantized;          /* an MLX quantized layout (else bf16 / f16 in Hugging Face's layout) */
    enum st_dtype fdt;      /* bf16 / f16 targets: the dtype of every float tensor */
    struct quant_target q;  /* quantized targets: what a linear layer gets */
    struct quant_target q8; /* what a --keep-8bit module gets */
    const char **keep8;     /* --keep-8bit patterns */
    int n_keep8;
    size_t max_shard; /* bytes of tensor data a shard holds at most (a bigger tensor: alone) */
};

/* How an output tensor's bytes are made. */
enum cv_kind {
    CV_RAW,    /* the source tensor's bytes, possibly under another shape */
    CV_CAST,   /* the source tensor's float values in dtype `dt` */
    CV_CODES,  /* a quantized matrix: the packed codes, */
    CV_SCALES, /* its scales, */
    CV_BIASES, /* its biases (affine) */
    CV_FLOAT,  /* a matrix's rows decoded (any stored format) to float dtype `dt` */
};

/* A logical matrix read row by row: the rows of parts[0], then of parts[1], ... (experts
 * stacked into [E, n, k]); each part n rows of k values in any stored format. */
struct cv_matrix {
    struct qweight *parts;
    int n_parts;
    int64_t n, k;
    struct quant_target q; /* CV_CODES / SCALES / BIASES: the output's format */
};

struct cv_run;

struct cv_tensor {
    char *name;
    enum st_dtype dt;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t bytes;
    enum cv_kind kind;
    const struct st_tensor *src; /* CV_RAW, CV_CAST */
    struct cv_matrix *m;         /* the row kinds */
    int shard;
    struct cv_run *run; /* scratch and progress, set before writing */
};

/* A module quantized other than the default (--keep-8bit), for config.json. */
struct cv_override {
    char *module;
    struct quant_target q;
};

struct cv_plan {
    struct cv_tensor *t;
    int n;
    struct cv_matrix **mats;
    int n_mats;
    struct cv_override *ov;
    int n_ov;
    int64_t max_k; /* the widest matrix row (scratch size) */
    int tied;      /* tie_word_embeddings */
};

/** Plans the output tensors of `st` (the source folder, its config.json parsed in cfg) for
 * the options; -1 with a message naming the tensor when the source cannot be converted. */
int cv_plan_build(struct cv_plan *p, const struct cv_options *o, const struct safetensors *st,
                  const struct cJSON *cfg, struct err *e);
void cv_plan_dispose(struct cv_plan *p);

/* Scratch, threads and progress shared by the fill callbacks of one run. */
struct cv_run {
    struct threadpool *tp; /* the whole rows of a chunk are made in parallel */
    float *x;              /* [threads][max_k + 1] a row as floats, per thread */
    uint8_t *row;          /* [4 * max_k + 64] a row cut by a chunk's edge */
    int n_tensors, done;
    size_t total_bytes, done_bytes;
    int tty; /* progress rewrites one line */
    double t0, last;
};

/** st_writer fill callback: bytes [off, off + n) of the cv_tensor ctx. */
void cv_fill(void *ctx, uint8_t *buf, size_t off, size_t n);

/** Writes DST's config.json: the source text (src, len bytes) with its quantization entries
 * replaced by the target's, and for bf16 / f16 its dtype entries set to the target's; the
 * rest byte for byte, so numbers keep their spelling. */
int cv_config_write(const struct cv_options *o, const struct cv_plan *p, const char *src,
                    size_t len, const char *path, struct err *e);

/** Whether a --keep-8bit pattern selects the module path: a glob (* ? [) over the whole path,
 * else a run of whole dot-separated components ("mlp.gate" selects
 * "model.layers.0.mlp.gate", not "model.layers.0.mlp.gate_proj"). */
int cv_module_matches(const char *module, const char *pattern);

#endif
