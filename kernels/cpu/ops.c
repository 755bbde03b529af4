/* Element-wise and row-wise kernels of the CPU backend (portable C; they are a small
 * share of step time next to the matrix products). */
#include <math.h>

#include "kernels/cpu/cpu.h"

void cpu_rms_norm(float *out, const float *x, const float *w, int rows, int dim, float eps)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *o = out + (size_t)r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++) ss += (double)xr[i] * xr[i];
        float inv = 1.0f / sqrtf((float)(ss / dim) + eps);
        for (int i = 0; i < dim; i++) o[i] = xr[i] * inv * w[i];
    }
}

void cpu_rope(float *x, int rows, int heads, int d, const float *cos_t, const float *sin_t)
{
    cpu_rope_partial(x, rows, heads, d, d, cos_t, sin_t);
}

void cpu_silu_mul(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void cpu_gelu_tanh_mul(float *out, const float *gate, const float *up, int64_t n)
{
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g))) * up[i];
    }
}

void cpu_relu2_mul(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float r = gate[i] > 0 ? gate[i] : 0.0f;
        out[i] = r * r * up[i];
    }
}

void cpu_softcap(float *x, int64_t n, float cap)
{
    float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] * inv);
}
