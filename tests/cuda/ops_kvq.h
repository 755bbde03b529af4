/*
 * The KV cache formats (--kv-cache-dtype, paged_kv/kv_quant.h) on CUDA against the CPU, in
 * the section kv-formats: per pair of K and V formats and head size, a step that prefills
 * three sequences' earlier context and a mixed step (a prompt chunk, a decode token, a
 * continuation) store their rows in head blocks and attend over them, with a window and
 * soft-capping in some cases. Both backends write the same codes but for the last float bit
 * of a scale, a norm or a rotated coordinate, which can move a rounding: the caches decoded
 * by the CPU's reference reader (kv_load_row) agree within 1e-3 norm-wise, and attention
 * outputs within 2e-3 (a moved code changes one value by a quantization step, in one key
 * of the hundreds a query weighs); at head size 512, with four times the codes of 128 near a
 * boundary, within 2e-3 and 4e-3 (measured up to 1.33e-3 and 2.72e-3 where the CPU's float
 * sums ran on other vector tables). Where the tensor-core kernel runs (fp8 or tq4 for K and V,
 * head sizes 64 and 128, up to 8 query heads a KV head), queries and probabilities are bf16
 * operands: within 1e-2, the bound of the bf16 tensor-core kernels.
 */
#include "paged_kv/kv_quant.h"

/* Every row of both caches decoded, the GPU's against the CPU's. */
static double kvq_cache_err(const uint8_t *hc, const uint8_t *gc, int dt, int role, int n_blocks,
                            int n_kv, int bs, int d, const int *used_rows)
{
    size_t hbb = kv_head_block_bytes(dt, role, bs, d);
    float *a = xmalloc(sizeof(float) * (size_t)d), *r = xmalloc(sizeof(float) * (size_t)d);
    double num = 0, den = 0;
    for (int blk = 0; blk < n_blocks; blk++)
        for (int off = 0; off < bs; off++) {
            if (!used_rows[blk * bs + off]) continue;
            for (int h = 0; h < n_kv; h++) {
                size_t o = ((size_t)blk * n_kv + h) * hbb;
                kv_load_row(dt, role, gc + o, off, bs, d, a);
                kv_load_row(dt, role, hc + o, off, bs, d, r);
                for (int c = 0; c < d; c++) {
                    num += ((double)a[c] - r[c]) * ((double)a[c] - r[c]);
                    den += (double)r[c] * r[c];
                }
            }
        }
    free(a);
    free(r);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void test_kvq_case(int kd, int vd, int n_heads, int n_kv, int hd, int window, float softcap)
{
    const int bs = 16, max_blocks = 16, n_blocks = 3 * max_blocks, dec_pos = 200;
    int32_t bt[3 * 16];
    for (int i = 0; i < 3 * max_blocks; i++) bt[i] = n_blocks - 1 - i;
    const int pre[3] = {0, dec_pos, 50}, cnt[3] = {37, 1, 20};
    size_t kb = (size_t)n_blocks * n_kv * kv_head_block_bytes(kd, KV_ROLE_K, bs, hd);
    size_t vb = (size_t)n_blocks * n_kv * kv_head_block_bytes(vd, KV_ROLE_V, bs, hd);
    struct kv_layer kv_cpu = {xcalloc(kb, 1), xcalloc(vb, 1)};
    struct kv_layer kv_gpu = {gpu.ops->alloc(gpu.ctx, kb), gpu.ops->alloc(gpu.ctx, vb)};
    struct kv_geom g = {n_blocks, bs, n_kv, hd, kd, vd, 0, 0};
    struct attn_params p = {n_heads, n_kv, hd, 1.0f / sqrtf((float)hd), softcap, window};
    int *used = xcalloc((size_t)n_blocks * bs, sizeof(int));
    for (int step = 0; step < 2; step++) {
        int32_t tokens[512], pos[512], slot[512], qs[4], sl[3], lr[1] = {0}, bts[3 * 16];
        int nt = 0, ns = 0;
        for (int s = 0; s < 3; s++) {
            int lo = step == 0 ? 0 : pre[s], c = step == 0 ? pre[s] : cnt[s];
            if (c == 0) continue;
            qs[ns] = nt;
            for (int j = 0; j < c; j++, nt++) {
                int ps = lo + j;
                tokens[nt] = 0;
                pos[nt] = ps;
                slot[nt] = bt[s * max_blocks + ps / bs] * bs + ps % bs;
                used[slot[nt]] = 1;
            }
            sl[ns] = lo + c;
            memcpy(bts + ns * max_blocks, bt + s * max_blocks, sizeof(int32_t) * max_blocks);
            ns++;
        }
        qs[ns] = nt;
        struct fwd_batch b = {.n_tokens = nt,
                              .tokens = tokens,
                              .pos = pos,
                              .slot = slot,
                              .n_seqs = ns,
                              .q_start = qs,
                              .seq_len = sl,
                              .block_table = bts,
                              .max_blocks = max_blocks,
                              .n_logits = 0,
                              .logit_rows = lr};
        size_t nq = (size_t)nt * n_heads * hd, nk = (size_t)nt * n_kv * hd;
        float *q = rvec(nq), *k = rvec(nk), *v = rvec(nk);
        for (size_t i = 0; i < nk; i++) k[i] *= 2.0f;
        for (size_t i = 0; i < nq; i++) q[i] *= 2.0f;
        float *ref = xmalloc(sizeof(float) * nq);
        cpu.ops->batch_begin(cpu.ctx, &b);
        cpu.ops->kv_store(cpu.ctx, &kv_cpu, &g, k, v, &b);
        cpu.ops->attention(cpu.ctx, ref, q, &kv_cpu, &g, &b, &p);
        float *dq = dev(q, nq), *dk = dev(k, nk), *dv = dev(v, nk), *dout = poisoned(nq);
        gpu.ops->batch_begin(gpu.ctx, &b);
        gpu.ops->kv_store(gpu.ctx, &kv_gpu, &g, dk, dv, &b);
        gpu.ops->attention(gpu.ctx, dout, dq, &kv_gpu, &g, &b, &p);
        float *got = back(dout, nq);
        double err = rel_err(got, ref, nq);
        const bool tc = kd == vd && (kd == KV_DTYPE_FP8 || kd == KV_DTYPE_TQ4) &&
                        (hd == 64 || hd == 128) && n_heads / n_kv <= 8;
        const double bound = tc ? 1e-2 : hd > 256 ? 4e-3 : 2e-3;
        CHECK(err <= bound,
              "kv %s/%s heads %d/%d d=%d window %d softcap %g step %d: attention relative "
              "error %.3g > %g",
              kv_dtype_name(kd), kv_dtype_name(vd), n_heads, n_kv, hd, window, softcap, step, err,
              bound);
        uint8_t *gk = xmalloc(kb), *gv = xmalloc(vb);
        gpu.ops->download(gpu.ctx, gk, kv_gpu.k, kb);
        gpu.ops->download(gpu.ctx, gv, kv_gpu.v, vb);
        double ek = kvq_cache_err((const uint8_t *)kv_cpu.k, gk, kd, KV_ROLE_K, n_blocks, n_kv, bs,
                                  hd, used);
        double ev = kvq_cache_err((const uint8_t *)kv_cpu.v, gv, vd, KV_ROLE_V, n_blocks, n_kv, bs,
                                  hd, used);
        const double cbound = hd > 256 ? 2e-3 : 1e-3;
        CHECK(ek <= cbound && ev <= cbound,
              "kv %s/%s d=%d step %d: caches differ by %.3g (K), %.3g (V) > %g", kv_dtype_name(kd),
              kv_dtype_name(vd), hd, step, ek, ev, cbound);
        free(gk);
        free(gv);
        free(q);
        free(k);
        free(v);
        free(ref);
        free(got);
        gpu.ops->free(gpu.ctx, dq);
        gpu.ops->free(gpu.ctx, dk);
        gpu.ops->free(gpu.ctx, dv);
        gpu.ops->free(gpu.ctx, dout);
    }
    gpu.ops->free(gpu.ctx, kv_gpu.k);
    gpu.ops->free(gpu.ctx, kv_gpu.v);
    free(kv_cpu.k);
    free(kv_cpu.v);
    free(used);
}

static void kv_formats_section(void)
{
    static const int pairs[][2] = {{KV_DTYPE_BF16, KV_DTYPE_BF16}, {KV_DTYPE_FP8, KV_DTYPE_FP8},
                                   {KV_DTYPE_INT8, KV_DTYPE_INT8}, {KV_DTYPE_INT4, KV_DTYPE_INT4},
                                   {KV_DTYPE_TQ4, KV_DTYPE_TQ4},   {KV_DTYPE_TQ3, KV_DTYPE_TQ3},
                                   {KV_DTYPE_TQ2, KV_DTYPE_TQ2},   {KV_DTYPE_INT8, KV_DTYPE_TQ3},
                                   {KV_DTYPE_TQ4, KV_DTYPE_FP8}};
    static const int dims[] = {32, 64, 96, 128, 256, 512};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        for (size_t j = 0; j < sizeof dims / sizeof dims[0]; j++)
            test_kvq_case(pairs[i][0], pairs[i][1], 8, 2, dims[j], 0, 0.0f);
    test_kvq_case(KV_DTYPE_FP8, KV_DTYPE_FP8, 4, 4, 64, 48, 0.0f);
    test_kvq_case(KV_DTYPE_TQ3, KV_DTYPE_INT4, 8, 1, 128, 0, 30.0f);
    /* the tensor-core kernel: a window with soft-capping, 8 query heads a KV head; 16 (the
     * reference kernel); many KV heads, so that each token's keys are one range */
    test_kvq_case(KV_DTYPE_TQ4, KV_DTYPE_TQ4, 16, 2, 128, 40, 30.0f);
    test_kvq_case(KV_DTYPE_FP8, KV_DTYPE_FP8, 16, 2, 64, 40, 30.0f);
    test_kvq_case(KV_DTYPE_FP8, KV_DTYPE_FP8, 32, 2, 128, 0, 0.0f);
    test_kvq_case(KV_DTYPE_FP8, KV_DTYPE_FP8, 64, 32, 128, 0, 0.0f);
    test_kvq_case(KV_DTYPE_TQ4, KV_DTYPE_TQ4, 64, 32, 64, 0, 0.0f);
}
