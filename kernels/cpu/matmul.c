#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/scratch.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/impl.h"
#include "kernels/cpu/quant.h"

const struct cpu_impl *cpu_impl = &cpu_impl_portable;
static enum cpu_isa current_isa = CPU_ISA_PORTABLE;

static const char *const isa_names[] = {"portable", "avx2", "avxvnni", "avx512", "amx"};

#if defined(PAGODA_X86)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

/* arch_prctl's request for leave to use an extended state component, and AMX's tile data */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA  18

/* Bit `bit` of register `reg` (0 eax, 1 ebx, 2 ecx, 3 edx) of cpuid leaf `leaf`, `sub`. */
static int cpuid_bit(unsigned leaf, unsigned sub, int reg, int bit)
{
    unsigned r[4];
    if (__get_cpuid_max(0, NULL) < leaf) return 0;
    __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
    return (int)((r[reg] >> bit) & 1u);
}
#endif

int cpu_isa_available(enum cpu_isa isa)
{
    if (isa == CPU_ISA_PORTABLE) return 1;
#if defined(PAGODA_X86)
    /* __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0). */
    __builtin_cpu_init();
    /* F16C and AVX-VNNI are read from cpuid: not every compiler's builtin knows their names. */
    int avx2 =
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpuid_bit(1, 0, 2, 29);
    if (isa == CPU_ISA_AVX2) return avx2;
#if defined(PAGODA_AVXVNNI)
    if (isa == CPU_ISA_AVXVNNI) return avx2 && cpuid_bit(7, 1, 0, 4);
#endif
#if defined(PAGODA_AVX512)
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                 __builtin_cpu_supports("avx512bf16");
    if (isa == CPU_ISA_AVX512) return avx512;
#if defined(PAGODA_AMX)
    /* AMX-TILE, AMX-BF16 and AMX-INT8, and the kernel's leave to use the tiles' state (asked
     * once, for the whole process) */
    if (isa == CPU_ISA_AMX) {
        static int granted = -1;
        if (granted < 0)
            granted = avx512 && cpuid_bit(7, 0, 3, 24) && cpuid_bit(7, 0, 3, 22) &&
                      cpuid_bit(7, 0, 3, 25) &&
                      syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        return granted;
    }
#endif
#endif
#endif
    return 0;
}

const char *cpu_isa_name(enum cpu_isa isa)
{
    return (unsigned)isa < sizeof isa_names / sizeof isa_names[0] ? isa_names[isa] : "portable";
}

int cpu_isa_parse(const char *name, enum cpu_isa *isa)
{
    for (size_t i = 0; i < sizeof isa_names / sizeof isa_names[0]; i++)
        if (!strcmp(name, isa_names[i])) {
            *isa = (enum cpu_isa)i;
            return 0;
        }
    return -1;
}

static enum cpu_isa best_below(enum cpu_isa isa)
{
    while (isa > CPU_ISA_PORTABLE && !cpu_isa_available(isa)) isa--;
    return isa;
}

void cpu_isa_set(enum cpu_isa isa)
{
    isa = best_below(isa);
    current_isa = isa;
#if defined(PAGODA_X86)
    cpu_impl = isa == CPU_ISA_PORTABLE ? &cpu_impl_portable : &cpu_impl_avx2;
#if defined(PAGODA_AVX512)
    if (isa >= CPU_ISA_AVX512) cpu_impl = &cpu_impl_avx512;
#endif
    /* The AVX-VNNI tiles need AVX-VNNI itself (an AVX-512 CPU may have only AVX512-VNNI). */
    affine4_vnni =
        isa == CPU_ISA_AVXVNNI || (isa >= CPU_ISA_AVX512 && cpu_isa_available(CPU_ISA_AVXVNNI));
#else
    cpu_impl = &cpu_impl_portable;
#endif
}

enum cpu_isa cpu_isa_get(void)
{
    return current_isa;
}

enum cpu_isa cpu_isa_choose(const char *force, char *warn, size_t n)
{
    enum cpu_isa best = best_below(CPU_ISA_BEST), want;
    if (warn && n) warn[0] = 0;
    if (!force || !*force) return best;
    if (cpu_isa_parse(force, &want)) {
        if (warn)
            snprintf(
                warn, n,
                "PAGODA_CPU_ISA=%s is not one of portable, avx2, avxvnni, avx512, amx; using %s",
                force, cpu_isa_name(best));
        return best;
    }
    if (want > best) {
        if (warn)
            snprintf(warn, n, "PAGODA_CPU_ISA=%s: this CPU or build lacks it; using %s", force,
                     cpu_isa_name(best));
        return best;
    }
    return want;
}

void cpu_kernels_init(void)
{
    static int warned;
    quant_init();
    char warn[160];
    enum cpu_isa isa = cpu_isa_choose(getenv("PAGODA_CPU_ISA"), warn, sizeof warn);
    if (warn[0] && !warned) {
        fprintf(stderr, "pagoda: warning: %s\n", warn);
        warned = 1;
    }
    cpu_isa_set(isa);
}

/* ---- portable kernels ---- */

/* Columns decoded per chunk: a multiple of every group size. Output (i, r) is
 * sum over chunks c (in order) of [sum over j in c (in order) of w_j * x_ij], the same
 * sequence for the streaming path (small m) and the blocked one (large m). */
#define CHUNK 256
/* The blocked path: MR x rows by NR weight rows per tile, over CHUNK-deep decoded panels. */
#define PMR 4
#define PNR 16
/* At or below this many x rows, each weight row is decoded once and dotted with every row. */
#define STREAM_MAX_M 8

static void matmul_stream_portable(const struct qweight *w, int64_t r0, int64_t r1, const float *x,
                                   int m, float *y, int64_t ldy)
{
    float buf[CHUNK];
    for (int64_t r = r0; r < r1; r++) {
        for (int i = 0; i < m; i++) y[i * ldy + r] = 0;
        for (int64_t k0 = 0; k0 < w->k; k0 += CHUNK) {
            int len = (int)(w->k - k0 < CHUNK ? w->k - k0 : CHUNK);
            quant_dequant_row(w, r, k0, len, buf);
            for (int i = 0; i < m; i++) {
                const float *xi = x + (size_t)i * w->k + k0;
                float s = 0;
                for (int j = 0; j < len; j++) s += buf[j] * xi[j];
                y[i * ldy + r] += s;
            }
        }
    }
}

/* Rows [r0, r1) of W, decoded one CHUNK panel of PNR rows at a time and reused by every x
 * row; each output keeps its own running chunk sum, so the result equals the stream path. */
static void matmul_blocked_portable(const struct qweight *w, int64_t r0, int64_t r1, const float *x,
                                    int m, float *y, int64_t ldy)
{
    float *pb = scratch_get(SCRATCH_GEMM_B, (size_t)PNR * CHUNK);
    for (int i = 0; i < m; i++) memset(y + i * ldy + r0, 0, sizeof(float) * (size_t)(r1 - r0));
    for (int64_t rb = r0; rb < r1; rb += PNR) {
        int nr = (int)(r1 - rb < PNR ? r1 - rb : PNR);
        for (int64_t k0 = 0; k0 < w->k; k0 += CHUNK) {
            int len = (int)(w->k - k0 < CHUNK ? w->k - k0 : CHUNK);
            for (int r = 0; r < nr; r++) quant_dequant_row(w, rb + r, k0, len, pb + r * CHUNK);
            for (int i0 = 0; i0 < m; i0 += PMR) {
                int mr = m - i0 < PMR ? m - i0 : PMR;
                float acc[PMR][PNR] = {{0}};
                for (int j = 0; j < len; j++)
                    for (int i = 0; i < mr; i++) {
                        float xv = x[(size_t)(i0 + i) * w->k + k0 + j];
                        for (int r = 0; r < nr; r++) acc[i][r] += pb[r * CHUNK + j] * xv;
                    }
                for (int i = 0; i < mr; i++)
                    for (int r = 0; r < nr; r++) y[(i0 + i) * ldy + rb + r] += acc[i][r];
            }
        }
    }
}

static void matmul_portable(const struct qweight *w, int64_t r0, int64_t r1, const float *x,
                            const uint8_t *xp, size_t stride, int m, float *y, int64_t ldy)
{
    (void)xp;
    (void)stride;
    if (m <= STREAM_MAX_M)
        matmul_stream_portable(w, r0, r1, x, m, y, ldy);
    else
        matmul_blocked_portable(w, r0, r1, x, m, y, ldy);
}

static size_t prep_bytes_none(const struct qweight *w)
{
    (void)w;
    return 0;
}

static float dot_portable(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static void axpy_portable(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static uint64_t read_sum_portable(const void *p, size_t n)
{
    const uint64_t *q = p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        a ^= q[i];
        b ^= q[i + 1];
        c ^= q[i + 2];
        d ^= q[i + 3];
    }
    return a ^ b ^ c ^ d;
}

const struct cpu_impl cpu_impl_portable = {
    .prep_bytes = prep_bytes_none,
    .prep = NULL,
    .matmul = matmul_portable,
    .dot = dot_portable,
    .axpy = axpy_portable,
    .read_sum = read_sum_portable,
    .delta_step = delta_step_portable,
    .conv_token = conv_token_portable,
    .gemm = gemm_portable,
    .ternary = ternary_matmul_portable,
    .kvq_dot = kvq_dot_portable,
    .kvq_axpy = kvq_axpy_portable,
    .softmax = softmax_portable,
};

/* ---- the threaded driver ---- */

struct mm_job {
    float *y;
    const float *x;
    const struct qweight *w;
    int m;
    uint8_t *xp; /* prepared x, `stride` bytes per row, or NULL */
    size_t stride;
};

static void mm_prep_task(void *p, int ith, int nth)
{
    struct mm_job *j = p;
    long lo, hi;
    tp_range(j->m, ith, nth, 1, &lo, &hi);
    if (lo < hi)
        cpu_impl->prep(j->w, j->x + (size_t)lo * j->w->k, (int)(hi - lo), j->xp + lo * j->stride,
                       j->stride);
}

/* Weight rows are split between threads in multiples of 16; each thread computes its rows
 * for every x row, so no output depends on the split. */
static void mm_task(void *p, int ith, int nth)
{
    struct mm_job *j = p;
    long lo, hi;
    tp_range((long)j->w->n, ith, nth, 16, &lo, &hi);
    if (lo < hi) cpu_impl->matmul(j->w, lo, hi, j->x, j->xp, j->stride, j->m, j->y, j->w->n);
}

void cpu_matmul(struct threadpool *tp, float *y, const float *x, const struct qweight *w, int m)
{
    if (w->fmt == WFMT_TERNARY) {
        cpu_ternary_matmul(tp, y, x, w, m);
        return;
    }
    if (gemm_run(tp, y, x, w, m)) return;
    struct mm_job j = {y, x, w, m, NULL, 0};
    size_t bytes = cpu_impl->prep_bytes(w);
    if (bytes) {
        j.stride = (bytes + 63) / 64 * 64;
        j.xp = (uint8_t *)scratch_get(SCRATCH_MM_X, (size_t)m * j.stride / sizeof(float));
        /* Small inputs are laid out by the calling thread alone: cheaper than a second
         * hand-off to the pool. */
        if (m >= 4 && tp_size(tp) > 1)
            tp_run(tp, mm_prep_task, &j);
        else
            cpu_impl->prep(w, x, m, j.xp, j.stride);
    }
    tp_run(tp, mm_task, &j);
}

void cpu_embed_row(const struct qweight *w, int64_t id, float scale, float *out)
{
    quant_dequant_row(w, id, 0, w->k, out);
    if (scale != 1.0f)
        for (int64_t i = 0; i < w->k; i++) out[i] *= scale;
}

float cpu_dot(const float *a, const float *b, int n)
{
    return cpu_impl->dot(a, b, n);
}

void cpu_axpy(float *y, float a, const float *x, int n)
{
    cpu_impl->axpy(y, a, x, n);
}

struct read_job {
    const uint8_t *p;
    size_t n;
    uint64_t out[64];
};

static void read_task(void *arg, int ith, int nth)
{
    struct read_job *j = arg;
    long lo, hi;
    tp_range((long)(j->n / 64), ith, nth, 1, &lo, &hi);
    j->out[ith % 64] = cpu_impl->read_sum(j->p + (size_t)lo * 64, (size_t)(hi - lo) * 64);
}

uint64_t cpu_read_all(struct threadpool *tp, const void *p, size_t n)
{
    struct read_job j = {p, n, {0}};
    tp_run(tp, read_task, &j);
    uint64_t x = 0;
    for (int i = 0; i < 64; i++) x ^= j.out[i];
    return x;
}
