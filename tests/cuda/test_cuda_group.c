/*
 * A tensor-parallel group of CUDA backends (model/tp.h) against sums made on the host: the
 * exchange of a layer's partial rows (backend_ops.all_reduce) alone, and followed by the
 * residual add and the next norm (add, then rms_norm of the sum into the exchanged buffer,
 * which the backend runs as one kernel with the one-shot exchange).
 *
 * Groups of 2 GPUs and of every GPU up to 4, each made twice: by default (sums of at most
 * AR_MAX_FLOATS floats over peer memory, larger ones through NCCL) and with the one-shot
 * exchange turned off (backend_custom_all_reduce_set(0): NCCL alone). Shapes from one row
 * of 64 to rows past the one-shot bound, in an order that changes shape and kind on every
 * call, 96 calls a group (the staging halves and the flags' counts turn over many times).
 * Bounds:
 *   - the one-shot sum adds the ranks' rows in rank order, as the host does, and the
 *     residual add follows: both equal to the bit, and equal on every rank;
 *   - NCCL's sums (any order): within 1e-6 of the sum of magnitudes, per element;
 *   - the norm's output: float32 arithmetic in another order (rsqrtf): norm-wise relative
 *     error 1e-5 against float64, and within 1e-5 between ranks.
 * The default groups expect the one-shot path: H100 and H200 hosts map each other's memory.
 * With fewer than 2 GPUs the test prints "fewer than 2 GPUs: not run" and exits 77.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/backend.h"
#include "test_mat.h"
#include "test_util.h"

#define MAX_RANKS    4
#define ONE_SHOT_MAX (256 * 1024) /* AR_MAX_FLOATS (kernels/cuda/cuda.cuh) */

struct shape {
    int rows, dim, fused;
};

static const struct shape shapes[] = {
    {1, 4096, 1},  {1, 64, 0},     {3, 1024, 1}, {7, 8192, 1},  {64, 512, 1},   {1, 8192, 0},
    {100, 256, 1}, {130, 2048, 1}, {2, 4096, 0}, {33, 4096, 1}, {200, 2048, 0}, {1, 8192, 1},
};
#define N_SHAPES (int)(sizeof shapes / sizeof shapes[0])
#define CALLS    96
#define MAX_N    (200 * 2048)

/* One rank: its backend, created and used on a thread of its own, as a split model's
 * ranks are (one thread driving several GPUs would wait on NCCL's first exchange). */
struct rank {
    int r;
    struct backend be;
    int ok;
    char why[1200];
    float *dy, *dx, *dw, *hy, *got_y, *got_x;
};

static struct {
    pthread_barrier_t bar;
    int size, grouped, quit;
    struct shape sh;
    const float *hx, *hw;
} G;

static void *rank_main(void *arg)
{
    struct rank *k = arg;
    char dev[16];
    struct err e = {0};
    snprintf(dev, sizeof dev, "cuda:%d", k->r);
    k->ok = backend_create(&k->be, dev, 0, &e) == 0;
    if (!k->ok) snprintf(k->why, sizeof k->why, "backend %s: %s", dev, e.msg);
    if (k->ok) {
        const struct backend_ops *o = k->be.ops;
        k->dy = o->alloc(k->be.ctx, sizeof(float) * MAX_N);
        k->dx = o->alloc(k->be.ctx, sizeof(float) * MAX_N);
        k->dw = o->alloc(k->be.ctx, sizeof(float) * 8192);
    }
    pthread_barrier_wait(&G.bar); /* created */
    pthread_barrier_wait(&G.bar); /* the group made */
    for (;;) {
        pthread_barrier_wait(&G.bar); /* a call's inputs ready */
        if (G.quit) break;
        if (G.grouped) {
            const struct backend_ops *o = k->be.ops;
            void *c = k->be.ctx;
            const struct shape sh = G.sh;
            const int64_t n = (int64_t)sh.rows * sh.dim;
            o->upload(c, k->dy, k->hy, sizeof(float) * (size_t)n);
            o->upload(c, k->dx, G.hx, sizeof(float) * (size_t)n);
            o->upload(c, k->dw, G.hw, sizeof(float) * (size_t)sh.dim);
            o->all_reduce(c, k->dy, n);
            if (sh.fused) {
                o->add(c, k->dx, k->dy, n);
                o->rms_norm(c, k->dy, k->dx, k->dw, sh.rows, sh.dim, 1e-5f);
            }
            o->download(c, k->got_y, k->dy, sizeof(float) * (size_t)n);
            if (sh.fused) o->download(c, k->got_x, k->dx, sizeof(float) * (size_t)n);
        }
        pthread_barrier_wait(&G.bar); /* results read back */
    }
    /* the other ranks first, as a split model leaves its group */
    for (int q = G.size - 1; q >= 0; q--) {
        if (q == k->r && k->ok) {
            k->be.ops->free(k->be.ctx, k->dy);
            k->be.ops->free(k->be.ctx, k->dx);
            k->be.ops->free(k->be.ctx, k->dw);
            backend_destroy(&k->be);
        }
        pthread_barrier_wait(&G.bar);
    }
    return NULL;
}

static void run_group(int size, int one_shot)
{
    struct rank ranks[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    memset(ranks, 0, sizeof ranks);
    backend_custom_all_reduce_set(one_shot);
    G.size = size;
    G.grouped = G.quit = 0;
    pthread_barrier_init(&G.bar, NULL, (unsigned)size + 1);
    float *hx = xmalloc(sizeof(float) * MAX_N), *hw = xmalloc(sizeof(float) * 8192);
    float *sum = xmalloc(sizeof(float) * MAX_N), *mag = xmalloc(sizeof(float) * MAX_N);
    G.hx = hx;
    G.hw = hw;
    for (int r = 0; r < size; r++) {
        struct rank *k = &ranks[r];
        k->r = r;
        k->hy = xmalloc(sizeof(float) * MAX_N);
        k->got_y = xmalloc(sizeof(float) * MAX_N);
        k->got_x = xmalloc(sizeof(float) * MAX_N);
        if (pthread_create(&th[r], NULL, rank_main, k)) {
            fprintf(stderr, "cannot start a thread\n");
            exit(1);
        }
    }
    pthread_barrier_wait(&G.bar); /* created */
    int ok = 1;
    for (int r = 0; r < size; r++)
        if (!ranks[r].ok) {
            CHECK(0, "%s", ranks[r].why);
            ok = 0;
        }
    if (ok) {
        void *members[MAX_RANKS];
        struct err e = {0};
        for (int r = 0; r < size; r++) members[r] = ranks[r].be.ctx;
        ok = ranks[0].be.ops->group_create(ranks[0].be.ctx, size, members, &e) == 0;
        CHECK(ok, "a group of %d: %s", size, e.msg);
    }
    G.grouped = ok;
    pthread_barrier_wait(&G.bar); /* the group made */
    double worst_norm = 0, worst_nccl = 0;
    for (int call = 0; call < CALLS && ok; call++) {
        const struct shape sh = shapes[(call * 5 + call / N_SHAPES) % N_SHAPES];
        const int64_t n = (int64_t)sh.rows * sh.dim;
        const int exact = one_shot && n <= ONE_SHOT_MAX;
        for (int64_t i = 0; i < n; i++) hx[i] = frand();
        for (int i = 0; i < sh.dim; i++) hw[i] = 0.5f + 0.5f * frand();
        for (int r = 0; r < size; r++)
            for (int64_t i = 0; i < n; i++) ranks[r].hy[i] = frand();
        for (int64_t i = 0; i < n; i++) { /* in rank order, as the one-shot kernel adds */
            float s = ranks[0].hy[i], m = fabsf(ranks[0].hy[i]);
            for (int r = 1; r < size; r++) {
                s += ranks[r].hy[i];
                m += fabsf(ranks[r].hy[i]);
            }
            sum[i] = s;
            mag[i] = m;
        }
        G.sh = sh;
        pthread_barrier_wait(&G.bar); /* inputs ready: every rank exchanges */
        pthread_barrier_wait(&G.bar); /* results read back */
        float *got_y[MAX_RANKS], *got_x[MAX_RANKS];
        for (int r = 0; r < size; r++) {
            got_y[r] = ranks[r].got_y;
            got_x[r] = ranks[r].got_x;
        }
        int bad = 0;
        for (int r = 0; r < size && !bad; r++) {
            if (!sh.fused) {
                for (int64_t i = 0; i < n && !bad; i++) {
                    const double d = fabs((double)got_y[r][i] - sum[i]);
                    if (!exact && mag[i] > 0 && d / mag[i] > worst_nccl) worst_nccl = d / mag[i];
                    if (exact ? got_y[r][i] != sum[i] : !(d <= 1e-6 * mag[i] + 1e-30)) {
                        CHECK(0,
                              "group %d%s, call %d (%d x %d, sum): rank %d element %lld: %.9g, "
                              "expected %.9g",
                              size, one_shot ? "" : " (NCCL)", call, sh.rows, sh.dim, r,
                              (long long)i, got_y[r][i], sum[i]);
                        bad = 1;
                    }
                }
                continue;
            }
            /* x + sum, then rms_norm(x) * w */
            for (int64_t i = 0; i < n && !bad; i++) {
                const float want = hx[i] + sum[i];
                const double d = fabs((double)got_x[r][i] - want);
                if (exact ? got_x[r][i] != want : !(d <= 1e-6 * (mag[i] + fabsf(hx[i])) + 1e-30)) {
                    CHECK(0,
                          "group %d%s, call %d (%d x %d, fused): rank %d x[%lld]: %.9g, "
                          "expected %.9g",
                          size, one_shot ? "" : " (NCCL)", call, sh.rows, sh.dim, r, (long long)i,
                          got_x[r][i], want);
                    bad = 1;
                }
            }
            double err2 = 0, ref2 = 0;
            for (int row = 0; row < sh.rows; row++) {
                const float *xr = got_x[r] + (size_t)row * sh.dim;
                double ss = 0;
                for (int j = 0; j < sh.dim; j++) ss += (double)xr[j] * xr[j];
                const double inv = 1.0 / sqrt(ss / sh.dim + 1e-5);
                for (int j = 0; j < sh.dim; j++) {
                    const double want = xr[j] * inv * hw[j];
                    const double d = got_y[r][(size_t)row * sh.dim + j] - want;
                    err2 += d * d;
                    ref2 += want * want;
                }
            }
            const double rel = sqrt(err2 / ref2);
            if (rel > worst_norm) worst_norm = rel;
            if (!(rel <= 1e-5)) {
                CHECK(0, "group %d%s, call %d (%d x %d, fused): rank %d norm: relative error %.3g",
                      size, one_shot ? "" : " (NCCL)", call, sh.rows, sh.dim, r, rel);
                bad = 1;
            }
        }
        /* the one-shot exchange leaves every rank with the same bits */
        for (int r = 1; r < size && exact && !bad; r++)
            if (memcmp(got_y[r], got_y[0], sizeof(float) * (size_t)n) ||
                (sh.fused && memcmp(got_x[r], got_x[0], sizeof(float) * (size_t)n))) {
                CHECK(0, "group %d, call %d (%d x %d): rank %d differs from rank 0", size, call,
                      sh.rows, sh.dim, r);
                bad = 1;
            }
    }
    if (ok)
        printf("group of %d%s: %d calls; norm relative error at most %.3g; NCCL sums within "
               "%.3g of the magnitudes\n",
               size, one_shot ? "" : " (NCCL alone)", CALLS, worst_norm, worst_nccl);
    G.quit = 1;
    pthread_barrier_wait(&G.bar); /* the ranks leave */
    for (int q = size - 1; q >= 0; q--) pthread_barrier_wait(&G.bar);
    for (int r = 0; r < size; r++) {
        pthread_join(th[r], NULL);
        free(ranks[r].hy);
        free(ranks[r].got_y);
        free(ranks[r].got_x);
    }
    pthread_barrier_destroy(&G.bar);
    free(hx);
    free(hw);
    free(sum);
    free(mag);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const int gpus = backend_gpu_count();
    if (gpus < 2) {
        printf("fewer than 2 GPUs: not run\n");
        return 77;
    }
    const int most = gpus < MAX_RANKS ? gpus : MAX_RANKS;
    for (int one_shot = 1; one_shot >= 0; one_shot--) {
        run_group(2, one_shot);
        if (most > 2) run_group(most, one_shot);
    }
    TEST_DONE();
}
