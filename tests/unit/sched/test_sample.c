/*
 * Top-p selection (sample_nucleus) against its definition: a full sort of the vocabulary
 * (larger weight first, lower id first among equals) and a walk adding probabilities until
 * they reach top_p of the total. Vocabularies of real size, logits with many ties, nuclei
 * from one token to most of the vocabulary; the ids kept and the sum must be identical.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sched/engine_impl.h"
#include "test_util.h"

static const float *cmp_w;

static int by_order(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (cmp_w[x] != cmp_w[y]) return cmp_w[x] > cmp_w[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static uint64_t rs = 0x243f6a8885a308d3ull;

static double uniform(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (double)(rs >> 11) / 9007199254740992.0;
}

/* One case: vocabulary n, logits spread over `spread` with values rounded to `step` (ties),
 * temperature t, top_p p. */
static void one_case(int n, double spread, double step, double t, double p)
{
    float *w = xmalloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) {
        double v = spread * (uniform() * uniform()); /* a few large, most small */
        w[i] = (float)(step > 0 ? floor(v / step) * step : v);
    }
    float mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (w[i] > mx) mx = w[i];
    const double inv_t = 1.0 / t;
    int32_t *ids = xmalloc(sizeof(int32_t) * (size_t)n),
            *ref = xmalloc(sizeof(int32_t) * (size_t)n);
    /* candidates in a scrambled order, as after top-k or min-p */
    for (int i = 0; i < n; i++) ids[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(uniform() * (i + 1));
        int32_t x = ids[i];
        ids[i] = ids[j];
        ids[j] = x;
    }
    memcpy(ref, ids, sizeof(int32_t) * (size_t)n);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += exp((w[ids[i]] - mx) * inv_t);
    const double keep = p * sum;

    cmp_w = w;
    qsort(ref, (size_t)n, sizeof(int32_t), by_order);
    double racc = 0;
    int rm = 0;
    while (rm < n) {
        racc += exp((w[ref[rm]] - mx) * inv_t);
        rm++;
        if (racc >= keep) break;
    }

    double acc = -1;
    int m = sample_nucleus(ids, n, w, mx, inv_t, keep, &acc);
    CHECK(m == rm, "n=%d spread=%g step=%g t=%g p=%g: nucleus of %d ids, the full sort gives %d", n,
          spread, step, t, p, m, rm);
    if (m == rm) {
        CHECK(!memcmp(ids, ref, sizeof(int32_t) * (size_t)m),
              "n=%d spread=%g step=%g t=%g p=%g: the nucleus differs from the full sort's", n,
              spread, step, t, p);
        CHECK(acc == racc, "n=%d p=%g: sum %.17g, the full sort gives %.17g", n, p, acc, racc);
    }
    free(w);
    free(ids);
    free(ref);
}

int main(void)
{
    const double ps[] = {0.1, 0.5, 0.9, 0.95, 0.999};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        one_case(128256, 30.0, 0.0, 1.0, ps[i]); /* peaked: a small nucleus */
        one_case(128256, 30.0, 0.5, 0.8, ps[i]); /* many ties */
        one_case(128256, 2.0, 0.0, 1.0, ps[i]);  /* flat: most of the vocabulary */
        one_case(32000, 12.0, 0.25, 0.7, ps[i]); /* ties near the cut */
        one_case(300, 5.0, 1.0, 1.0, ps[i]);     /* small vocabulary: the full sort */
        one_case(151936, 0.0, 0.0, 1.0, ps[i]);  /* every weight equal */
    }
    TEST_DONE();
}
