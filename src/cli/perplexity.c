/* `pagoda perplexity`: the perplexity of a text file in windows of --ctx tokens (as
 * llama.cpp's llama-perplexity: each window starts afresh and its second half is scored),
 * and with --kl-base the divergence of the next-token distributions from the same model
 * with the KV cache in another format. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "common/util.h"
#include "text/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pagoda perplexity --model DIR --file F [options]\n"
            "  --ctx N                     tokens per window (default 512); the second half of\n"
            "                              each window is scored, as llama-perplexity does\n"
            "  --chunks N                  windows at most (default: all the file holds)\n"
            "  --batch N                   tokens per forward step (default min(ctx, 512))\n"
            "  --kl-base D                 also run with the KV cache in format D (e.g. bf16) and\n"
            "                              report the mean KL divergence KL(base || this) of the\n"
            "                              next-token distributions, the top-1 agreement and the\n"
            "                              base perplexity\n"
            "  --json                      one JSON object: perplexity, tokens, ...\n"
            "  --batch-invariant           the batch-invariant products (float32 inputs)\n"
            "  --device D, --threads N     as generate\n" ARG_KV_USAGE);
}

/* Log-softmax of x [n] into out; returns the index of the largest value. */
static int log_softmax(const float *x, int n, float *out)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    double s = 0;
    for (int i = 0; i < n; i++) s += exp((double)x[i] - x[best]);
    float lse = x[best] + (float)log(s);
    for (int i = 0; i < n; i++) out[i] = x[i] - lse;
    return best;
}

int cli_perplexity(int argc, char **argv)
{
    const char *dir = NULL, *file = NULL, *device = NULL;
    long ctx = 512, chunks = 0, batch = 0, threads = 0;
    int json = 0, base_dtype = -1;
    struct kv_spec kv = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = arg_kv_option(argc, argv, &i, &kv);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--batch-invariant")) {
            backend_batch_invariant_set(1);
        } else if (!strcmp(a, "--model") || !strcmp(a, "--file") || !strcmp(a, "--device") ||
                   !strcmp(a, "--ctx") || !strcmp(a, "--chunks") || !strcmp(a, "--batch") ||
                   !strcmp(a, "--threads") || !strcmp(a, "--kl-base")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "--model"))
                dir = v;
            else if (!strcmp(a, "--file"))
                file = v;
            else if (!strcmp(a, "--device"))
                device = v;
            else if (!strcmp(a, "--kl-base")) {
                base_dtype = kv_dtype_parse(v);
                if (base_dtype < 0 || base_dtype == KV_DTYPE_F32) {
                    fprintf(stderr, "pagoda perplexity: --kl-base: '%s' is not a KV cache format\n",
                            v);
                    return 2;
                }
            } else if (arg_int(a, v, !strcmp(a, "--ctx") ? 4 : 1, 1 << 22,
                               !strcmp(a, "--ctx")      ? &ctx
                               : !strcmp(a, "--chunks") ? &chunks
                               : !strcmp(a, "--batch")  ? &batch
                                                        : &threads))
                return 2;
        } else {
            fprintf(stderr, "pagoda perplexity: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!dir || !file) {
        fprintf(stderr, "pagoda perplexity: --model and --file are required\n");
        return 2;
    }
    if (batch <= 0) batch = ctx < 512 ? ctx : 512;
    if (batch > ctx) batch = ctx;
    struct err e = {0};
    size_t len;
    char *text = util_read_file(file, &len, &e);
    if (!text) {
        fprintf(stderr, "pagoda perplexity: %s\n", e.msg);
        return 1;
    }
    struct tok *tok = tok_load(dir, &e);
    if (!tok) {
        fprintf(stderr, "pagoda perplexity: %s\n", e.msg);
        free(text);
        return 1;
    }
    int32_t *ids = NULL, *bos = NULL;
    size_t n = 0, nb = 0;
    int rc =
        tok_encode(tok, text, len, 0, &ids, &n, &e) || tok_encode(tok, "", 0, 1, &bos, &nb, &e);
    tok_destroy(tok);
    free(text);
    if (rc) {
        fprintf(stderr, "pagoda perplexity: %s\n", e.msg);
        free(ids);
        free(bos);
        return 1;
    }
    long n_chunks = (long)n / ctx;
    if (chunks > 0 && chunks < n_chunks) n_chunks = chunks;
    if (n_chunks < 1) {
        fprintf(stderr, "pagoda perplexity: %s holds %zu tokens, fewer than one window of %ld\n",
                file, n, ctx);
        free(ids);
        free(bos);
        return 2;
    }
    /* the window's first token becomes BOS where the tokenizer adds one (llama-perplexity) */
    int32_t bos_id = nb == 1 ? bos[0] : -1;
    free(bos);

    struct runner r[2];
    int nr = base_dtype >= 0 ? 2 : 1;
    struct kv_spec base = kv;
    base.k = base.v = (uint8_t)base_dtype;
    for (int k = 0; k < nr; k++)
        if (runner_open_kv(&r[k], dir, device, (int)threads, 1, (int)ctx, (int)batch, (int)batch,
                           k ? &base : &kv)) {
            if (k) runner_close(&r[0]);
            free(ids);
            return 1;
        }
    int vocab = r[0].m->cfg.vocab;
    float *lp[2] = {xmalloc(sizeof(float) * (size_t)vocab), xmalloc(sizeof(float) * (size_t)vocab)};
    int32_t *win = xmalloc(sizeof(int32_t) * (size_t)ctx);
    long first = ctx / 2, scored = 0, agree = 0;
    double nll = 0, nll_base = 0, kl = 0;
    for (long c = 0; c < n_chunks; c++) {
        memcpy(win, ids + c * ctx, sizeof(int32_t) * (size_t)ctx);
        if (bos_id >= 0) win[0] = bos_id;
        for (int k = 0; k < nr; k++) r[k].len[0] = 0;
        for (long p = 0; p < ctx; p += batch) {
            int cnt = (int)(ctx - p < batch ? ctx - p : batch), all = 1;
            const int32_t *tp = win + p;
            for (int k = 0; k < nr; k++) runner_step(&r[k], 1, NULL, &tp, &cnt, &all);
            for (int j = 0; j < cnt; j++) {
                long pos = p + j;
                if (pos < first || pos + 1 >= ctx) continue;
                int32_t next = win[pos + 1];
                int top = log_softmax(r[0].logits + (size_t)j * vocab, vocab, lp[0]);
                nll -= lp[0][next];
                scored++;
                if (nr == 1) continue;
                int top_b = log_softmax(r[1].logits + (size_t)j * vocab, vocab, lp[1]);
                nll_base -= lp[1][next];
                agree += top == top_b;
                double d = 0;
                for (int i = 0; i < vocab; i++) d += exp(lp[1][i]) * (lp[1][i] - lp[0][i]);
                kl += d;
            }
        }
        if (!json)
            fprintf(stderr, "[%ld/%ld] perplexity %.4f\n", c + 1, n_chunks, exp(nll / scored));
    }
    double ppl = exp(nll / scored);
    if (json) {
        printf("{\"perplexity\": %.6f, \"tokens\": %ld, \"ctx\": %ld, \"chunks\": %ld, "
               "\"kv_cache_dtype_k\": \"%s\", \"kv_cache_dtype_v\": \"%s\"",
               ppl, scored, ctx, n_chunks, kv_dtype_name(kv.k), kv_dtype_name(kv.v));
        if (nr == 2)
            printf(", \"kl_base\": \"%s\", \"base_perplexity\": %.6f, \"kl_divergence\": %.8f, "
                   "\"top1_agreement\": %.6f",
                   kv_dtype_name(base_dtype), exp(nll_base / scored), kl / scored,
                   (double)agree / scored);
        printf("}\n");
    } else {
        printf("perplexity %.4f over %ld tokens (%ld windows of %ld, KV %s/%s)\n", ppl, scored,
               n_chunks, ctx, kv_dtype_name(kv.k), kv_dtype_name(kv.v));
        if (nr == 2)
            printf("against KV %s: perplexity %.4f (%+.3f%%), mean KL %.6f, top-1 agreement "
                   "%.2f%%\n",
                   kv_dtype_name(base_dtype), exp(nll_base / scored),
                   100.0 * (ppl / exp(nll_base / scored) - 1), kl / scored,
                   100.0 * (double)agree / scored);
    }
    for (int k = 0; k < nr; k++) runner_close(&r[k]);
    free(lp[0]);
    free(lp[1]);
    free(win);
    free(ids);
    return 0;
}
