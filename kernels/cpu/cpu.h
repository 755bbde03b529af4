/*
 * cpu kernels: the compute of the CPU backend, float32 activations, weights consumed in
 * their stored format. Each kernel exists as portable C and, on x86-64 with AVX2+FMA, as
 * a SIMD version picked at run time; tests run both on the same inputs and compare.
 *
 * Kernels that take a thread pool split their work over it; the others are called per
 * thread by the backend (see model/backend_cpu.c).
 */
#ifndef PAGODA_KERNELS_CPU_CPU_H
#define PAGODA_KERNELS_CPU_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/threadpool.h"
#include "model/backend.h"
#include "model/weights.h"

/* The kernel tables, each a superset of the one before:
 *   AVX2     AVX2 + FMA + F16C; outside batch-invariant mode, MLX 4- and 8-bit products of
 *            9 or more rows run the 256-bit kernels of kernels/cpu/gemm.h;
 *   AVXVNNI  the AVX2 kernels, with AVX-VNNI integer dot products where they apply (the same
 *            results as AVX2, bit for bit, the fast many-row kernels included);
 *   AVX512   AVX-512 F/BW/VL/VNNI/BF16: 512-bit decode kernels that compute each output
 *            with the AVX2 table's arithmetic (the same results, bit for bit), so the
 *            larger-m paths they share stay batch-invariant with them; outside
 *            batch-invariant mode, products of 9 or more rows run kernels/cpu/gemm.h.
 *   AMX      the AVX-512 table, with AMX-TILE/BF16/INT8: outside batch-invariant mode, bf16
 *            and MLX 2-8-bit (groups of 64 or a multiple) products of 9 or more rows run on
 *            the AMX tiles (kernels/cpu/gemm.h). */
enum cpu_isa { CPU_ISA_PORTABLE, CPU_ISA_AVX2, CPU_ISA_AVXVNNI, CPU_ISA_AVX512, CPU_ISA_AMX };
#define CPU_ISA_BEST CPU_ISA_AMX

/** Detects the best instruction set (or the one PAGODA_CPU_ISA names; see cpu_isa_choose)
 * and fills lookup tables. Call once before any kernel; a warning goes to stderr once. */
void cpu_kernels_init(void);

/** The instruction set in use; cpu_isa_set() switches it (tests compare the tables). A set
 * the CPU or the build lacks gives the best one below it. */
enum cpu_isa cpu_isa_get(void);
void cpu_isa_set(enum cpu_isa isa);
int cpu_isa_available(enum cpu_isa isa);
/** "portable", "avx2", "avxvnni", "avx512", "amx" (the PAGODA_CPU_ISA values); parse returns -1
 * for any other name. */
const char *cpu_isa_name(enum cpu_isa isa);
int cpu_isa_parse(const char *name, enum cpu_isa *isa);

/**
 * The table for a PAGODA_CPU_ISA value (NULL or empty: the best available). An unknown name
 * or one the CPU lacks gives the best available, with a warning naming it in warn[n]
 * (empty when there is nothing to say).
 */
enum cpu_isa cpu_isa_choose(const char *force, char *warn, size_t n);

/**
 * Batch-invariant mode (off by default; `--batch-invariant`): every product runs the
 * invariant kernels below. Off, products of 9 or more rows in MLX 4- and 8-bit (and in bf16,
 * with AVX-512) run the fast kernels of kernels/cpu/gemm.h where the ISA has them, which round x to
 * bf16 or int8 first (a row's result then depends on whether its batch had 9 rows or more).
 */
void cpu_batch_invariant_set(int on);
int cpu_batch_invariant_get(void);

/**
 * y[m, n] = x[m, k] . W^T for W [n, k] in any format (k a multiple of its group size).
 * In batch-invariant mode (and always for m <= 8), row i of y is bitwise the same for any m
 * and any thread count (each output has one fixed arithmetic; see kernels/cpu/impl.h).
 * Small m (decode) streams each weight row once for all m rows; larger m runs register
 * tiles over widened panels, or the fast kernels (see cpu_batch_invariant_set).
 */
void cpu_matmul(struct threadpool *tp, float *y, const float *x, const struct qweight *w, int m);

/**
 * BitLinear's input quantization of one row x[k], exactly as the reference computes it:
 * s = 127 / max(max|x|, 1e-5) in float32, q = round(x * s) (half to even) clamped to
 * [-128, 127]. Writes q[0, kp) (zero past k), *sum = the sum of q; returns s.
 */
float cpu_ternary_quantize(const float *x, int64_t k, int64_t kp, int8_t *q, int32_t *sum);

/**
 * y[m, n] = x[m, k] . W^T for ternary W (WFMT_TERNARY; cpu_matmul calls it): each x row is
 * quantized by cpu_ternary_quantize, its integer dot with each weight row is exact, and
 * y = (float)dot / (s * t_div) * t_mul. Every instruction set gives bitwise the same y.
 */
void cpu_ternary_matmul(struct threadpool *tp, float *y, const float *x, const struct qweight *w,
                        int m);

/** Row `id` of an embedding table in any format into out[k] (times scale). */
void cpu_embed_row(const struct qweight *w, int64_t id, float scale, float *out);

/** out[i] = x[i] / rms(x) * w[i] over each of `rows` rows of dim; out may alias x. */
void cpu_rms_norm(float *out, const float *x, const float *w, int rows, int dim, float eps);

/**
 * Rotates pairs (j, j + d/2) of each head by the angle table: x [rows, heads, d],
 * cos/sin [rows, d/2] (rotate-half layout, as Hugging Face models use).
 */
void cpu_rope(float *x, int rows, int heads, int d, const float *cos_t, const float *sin_t);

/** out = act(gate) * up over n values; act is SiLU or tanh-approximated GELU. */
void cpu_silu_mul(float *out, const float *gate, const float *up, int64_t n);
void cpu_gelu_tanh_mul(float *out, const float *gate, const float *up, int64_t n);

/** out = relu(gate)^2 * up over n values (BitNet's relu2). */
void cpu_relu2_mul(float *out, const float *gate, const float *up, int64_t n);

/** x = cap * tanh(x / cap) over n values. */
void cpu_softcap(float *x, int64_t n, float cap);

/** Writes the step's K and V rows [n_tokens, n_kv_heads * head_dim] into a layer whose
 * formats are not auto (kv_geom.k_dtype / v_dtype), token by token in batch order. */
void cpu_kv_store_q(const struct kv_layer *kv, const struct kv_geom *g, const float *k,
                    const float *v, const struct fwd_batch *b);

/** backend_ops.attention (kernels/cpu/attn_q.c): over a quantized layer reading the codes in
 * place, over an auto (float32) layer its rows; tok_seq [n_tokens] the sequence of each
 * token. */
void cpu_attention_q(struct threadpool *tp, float *out, const float *q, const struct kv_layer *kv,
                     const struct kv_geom *g, const struct fwd_batch *b,
                     const struct attn_params *p, const int32_t *tok_seq);

/** Dot product of n floats (SIMD when available). */
float cpu_dot(const float *a, const float *b, int n);

/** y += a * x over n floats. */
void cpu_axpy(float *y, float a, const float *x, int n);

/** cpu_rope over the first rot values of each head of d (pairs (j, j + rot/2)). */
void cpu_rope_partial(float *x, int rows, int heads, int d, int rot, const float *cos_t,
                      const float *sin_t);

/** out = RMSNorm(x) * w * silu(z) over rows of dim; out may alias x. */
void cpu_rms_norm_gated(float *out, const float *x, const float *z, const float *w, int rows,
                        int dim, float eps);

/** Gated DeltaNet over a step (see backend_ops.delta_net), parallel over sequences x
 * channels (the convolution), then sequences x value heads (the delta rule). */
void cpu_delta_net(struct threadpool *tp, float *out, float *qkv, const float *beta_in,
                   const float *a, const struct state_layer *st, const struct delta_params *p,
                   const struct fwd_batch *b);

/** Routed experts (see backend_ops.moe); each product through cpu_matmul. */
void cpu_moe(struct threadpool *tp, float *out, const float *x, const float *router,
             const struct moe_params *p, int rows, int hidden);

/** Reads n bytes (a multiple of 64) on every thread of the pool: the memory read-bandwidth
 * probe of `pagoda bench`. Returns a checksum so the reads cannot be elided. */
uint64_t cpu_read_all(struct threadpool *tp, const void *p, size_t n);

#endif
