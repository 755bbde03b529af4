/*
 * kv_quant: the KV cache's storage formats (--kv-cache-dtype). A layer stores K and V
 * each in one format; every format but `auto` lays a layer out as head blocks,
 * [n_blocks][n_kv_heads] of kv_head_block_bytes each: one block's block_size tokens of
 * one KV head, a small header of scales, then the codes token-major ([block_size][row]).
 * The attention kernels read these bytes directly; nothing is ever dequantized into a copy.
 *
 *   auto  the backend's own layout ([n_blocks][block_size][n_kv_heads][head_dim] float32 on
 *         the CPU, bf16 on CUDA), untouched by this module
 *   f32, bf16   plain values (f32 is what `auto` resolves to on the CPU beside a quantized side)
 *   fp8   e4m3 codes with one bf16 scale per token (amax / 448), or a checkpoint's fixed one
 *   int8, int4  symmetric codes (+-127, +-7) with bf16 scales, as KIVI: keys per channel
 *         within a block, values per token
 *   tq4, tq3, tq2  each head vector x rotated by a fixed seeded random Hadamard transform,
 *         its coordinates (scaled to unit variance) coded with the Lloyd-Max codebook of the
 *         standard normal at b bits, plus one bf16 gain per token: ||x|| / ||codes||.
 *         Attention runs in the rotated basis (the query rotated with kv_tq_rotate, the
 *         value sum rotated back once per head with kv_tq_unrotate).
 *
 * Writing is a token at a time (a block fills over many steps). Every format but int keys
 * scales each token alone, so a token's codes never change once written. Int keys (one
 * scale per channel over the block, as KIVI) take their scales from the block's first token
 * and grow them by powers of two when a later token does not fit, the codes already written
 * being rescaled in place (one more rounding each time). See kv_store_row.
 */
#ifndef PAGODA_PAGED_KV_KV_QUANT_H
#define PAGODA_PAGED_KV_KV_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

enum kv_dtype {
    KV_DTYPE_AUTO = 0,
    KV_DTYPE_F32,
    KV_DTYPE_BF16,
    KV_DTYPE_FP8,
    KV_DTYPE_INT8,
    KV_DTYPE_INT4,
    KV_DTYPE_TQ4,
    KV_DTYPE_TQ3,
    KV_DTYPE_TQ2,
    KV_DTYPE_COUNT
};

enum kv_role { KV_ROLE_K = 0, KV_ROLE_V = 1 };

/* The longest head vector the rotated formats take (their work vectors sit on the stack). */
#define KV_TQ_MAX_DIM 1024
/* Layers --kv-cache-skip-layers may name. */
#define KV_SKIP_MAX 32

/* What the user asked for: a format for K and one for V, and layers kept in `auto`. */
struct kv_spec {
    uint8_t k, v; /* enum kv_dtype */
    int n_skip;
    int32_t skip[KV_SKIP_MAX]; /* layer indices; negative ones count from the end (-1: last) */
};

/** "bf16", "fp8", ... ; "?" for a value out of range. */
const char *kv_dtype_name(int dtype);

/** The format a name gives (also "auto", "fp8_e4m3", "bfloat16", "float32"), or -1. */
int kv_dtype_parse(const char *s);

/** Parses a --kv-cache-skip-layers list ("0,1,-2,-1"); 0, or -1 with a message. */
int kv_spec_parse_skip(struct kv_spec *s, const char *list, struct err *e);

/** Whether layer l of n_layers is kept in `auto` by the spec. */
int kv_spec_skips(const struct kv_spec *s, int l, int n_layers);

/** 0 when the format stores head vectors of head_dim values in blocks of block_size;
 * -1 with a message naming what it needs otherwise. */
int kv_dtype_check(int dtype, int head_dim, int block_size, struct err *e);

/** Bytes of one head block (a multiple of 16). Not for KV_DTYPE_AUTO. */
size_t kv_head_block_bytes(int dtype, int role, int block_size, int head_dim);

/** Bits of one code (values for f32, bf16) and of the codebook of a rotated format. */
int kv_dtype_bits(int dtype);
static inline int kv_dtype_rotated(int dtype)
{
    return dtype == KV_DTYPE_TQ4 || dtype == KV_DTYPE_TQ3 || dtype == KV_DTYPE_TQ2;
}

/**
 * Writes x [head_dim] as token `off` of a head block. For int keys, off 0 starts the
 * block afresh (the channel scales from this token alone) and a later token may grow them,
 * rescaling the codes of tokens [0, off) in place. fixed_scale > 0 (fp8 only: a
 * checkpoint's k_scale / v_scale) replaces the per-token scale (rounded to bf16), values
 * past +-448 times it saturating.
 *
 * Error bounds per value, s the stored scale after the write:
 *   bf16 |e| <= |x| 2^-8; fp8 |e| <= |x| / 16 + s_t 2^-10 (s_t <= 1.008 amax_t / 448);
 *   int keys |e| <= s_c (s_c < 2.02 amax_c / qmax, amax_c over the block's channel c);
 *   int values |e| <= s_t / 2 (s_t <= 1.008 amax_t / qmax); tq: in mean square, the codebook's
 *   distortion (tq4 0.0095, tq3 0.0345, tq2 0.1175 of ||x||^2).
 */
void kv_store_row(int dtype, int role, uint8_t *hb, int off, int block_size, int head_dim,
                  const float *x, float fixed_scale);

/** Decodes token `off` of a head block into out [head_dim], in the original basis (the
 * reference for tests; attention reads the codes in place). */
void kv_load_row(int dtype, int role, const uint8_t *hb, int off, int block_size, int head_dim,
                 float *out);

/* Head block layout accessors (the kernels read through these). */
static inline size_t kv_row_bytes(int dtype, int head_dim)
{
    return (size_t)head_dim * (size_t)kv_dtype_bits(dtype) / 8;
}
/** Bytes before the codes: int keys head_dim bf16 scales; fp8, int values and tq block_size
 * bf16 (one scale or gain per token); none for f32 and bf16. */
size_t kv_header_bytes(int dtype, int role, int block_size, int head_dim);

/** e4m3 (the finite OCP FP8 format, max 448) value of a code; the NaN codes read as 0. */
extern const float kv_e4m3_value[256];
/** Round to nearest even, saturating at +-448. */
uint8_t kv_f32_to_e4m3(float x);

/** The codebook of a rotated format: 2^bits centroids in increasing order (unit normal). */
const float *kv_tq_codebook(int bits);

/** x [d] <- R x, the orthonormal rotation of the rotated formats: per power-of-two piece of
 * d (largest first), random signs from a fixed seed, then the normalized Walsh-Hadamard
 * transform. O(d log d). */
void kv_tq_rotate(float *x, int d);
/** x [d] <- R^T x. */
void kv_tq_unrotate(float *x, int d);

#endif
