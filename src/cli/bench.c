/*
 * bench: make-model writes a random-weight checkpoint of any realistic shape; decode
 * measures prefill and decode throughput of a model on this machine, next to the
 * machine's measured memory read bandwidth (decode is bound by it).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "model/st_writer.h"

/* ---- make-model ---- */

enum fill_kind {
    FILL_BF16_UNIFORM,
    FILL_BF16_CONST,
    FILL_RANDOM_BITS,
    FILL_U8_CONST,
    FILL_FP8_RANDOM /* random e4m3 codes, never the NaN codes 0x7f / 0xff */
};

struct fill {
    enum fill_kind kind;
    uint64_t seed;
    float a; /* uniform half-width or constant */
    uint8_t byte;
};

static inline uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static void fill_cb(void *ctx, uint8_t *buf, size_t off, size_t n)
{
    struct fill *f = ctx;
    switch (f->kind) {
    case FILL_BF16_UNIFORM:
        for (size_t i = 0; i < n / 2; i++) {
            uint64_t r = mix(f->seed + (off / 2 + i));
            float u = (float)(r >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
            ((uint16_t *)buf)[i] = f32_to_bf16(u * f->a);
        }
        break;
    case FILL_BF16_CONST:
        for (size_t i = 0; i < n / 2; i++) ((uint16_t *)buf)[i] = f32_to_bf16(f->a);
        break;
    case FILL_RANDOM_BITS:
        for (size_t i = 0; i < n / 8; i++) {
            uint64_t r = mix(f->seed + (off / 8 + i));
            memcpy(buf + i * 8, &r, 8);
        }
        break;
    case FILL_U8_CONST:
        memset(buf, f->byte, n);
        break;
    case FILL_FP8_RANDOM:
        for (size_t i = 0; i < n; i++) {
            uint8_t b = (uint8_t)(mix(f->seed + off + i) >> 24);
            buf[i] = (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
        }
        break;
    }
}

struct mm_spec {
    const char *format; /* bf16 | mlx4 | mlx8 | mxfp4 | mxfp8 */
    int bits, group;
};

/* Declares a linear layer `prefix` of [n, k] in the chosen format. Fill descriptors live
 * in `pool` (one per tensor) until the file is written. */
static void add_linear(struct st_writer *w, struct fill **pool, int *np, const char *prefix,
                       int64_t n, int64_t k, const struct mm_spec *f, uint64_t seed)
{
    char name[256];
    float a = sqrtf(3.0f / (float)k); /* unit output variance for unit inputs */
    struct fill *fw = &(*pool)[(*np)++];
    snprintf(name, sizeof name, "%s.weight", prefix);
    if (!strcmp(f->format, "bf16")) {
        *fw = (struct fill){FILL_BF16_UNIFORM, seed, a, 0};
        int64_t shape[2] = {n, k};
        st_writer_add(w, name, ST_BF16, 2, shape, fill_cb, fw);
        return;
    }
    *fw =
        (struct fill){!strcmp(f->format, "mxfp8") ? FILL_FP8_RANDOM : FILL_RANDOM_BITS, seed, 0, 0};
    int64_t wshape[2] = {n, k * f->bits / 32}, sshape[2] = {n, k / f->group};
    st_writer_add(w, name, ST_U32, 2, wshape, fill_cb, fw);
    struct fill *fs = &(*pool)[(*np)++];
    snprintf(name, sizeof name, "%s.scales", prefix);
    if (!strcmp(f->format, "mxfp4")) {
        /* e2m1 magnitudes reach 6: a scale of 2^round(log2(a / 3)) keeps |w| near a. */
        *fs = (struct fill){FILL_U8_CONST, 0, 0, (uint8_t)(127 + (int)lrintf(log2f(a / 3.0f)))};
        st_writer_add(w, name, ST_U8, 2, sshape, fill_cb, fs);
        return;
    }
    if (!strcmp(f->format, "mxfp8")) {
        /* random e4m3 codes have magnitudes of about 128 (RMS): scale them down to a */
        *fs = (struct fill){FILL_U8_CONST, 0, 0, (uint8_t)(127 + (int)lrintf(log2f(a / 128.0f)))};
        st_writer_add(w, name, ST_U8, 2, sshape, fill_cb, fs);
        return;
    }
    float levels = (float)((1 << f->bits) - 1);
    *fs = (struct fill){FILL_BF16_CONST, 0, 2.0f * a / levels, 0};
    st_writer_add(w, name, ST_BF16, 2, sshape, fill_cb, fs);
    struct fill *fb = &(*pool)[(*np)++];
    *fb = (struct fill){FILL_BF16_CONST, 0, -a, 0};
    snprintf(name, sizeof name, "%s.biases", prefix);
    st_writer_add(w, name, ST_BF16, 2, sshape, fill_cb, fb);
}

static int make_model(int argc, char **argv)
{
    const char *arch = "llama", *format = "bf16", *out = NULL;
    long H = 2048, L = 16, A = 32, K = 8, F = 8192, V = 32000, ctx = 4096, seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (a[0] != '-') {
            out = a;
            continue;
        }
        if (!(v = arg_value(argc, argv, &i))) return 2;
        long *dst = !strcmp(a, "--hidden")     ? &H
                    : !strcmp(a, "--layers")   ? &L
                    : !strcmp(a, "--heads")    ? &A
                    : !strcmp(a, "--kv-heads") ? &K
                    : !strcmp(a, "--ffn")      ? &F
                    : !strcmp(a, "--vocab")    ? &V
                    : !strcmp(a, "--context")  ? &ctx
                    : !strcmp(a, "--seed")     ? &seed
                                               : NULL;
        if (dst) {
            if (arg_int(a, v, 1, 1L << 30, dst)) return 2;
        } else if (!strcmp(a, "--arch")) {
            arch = v;
        } else if (!strcmp(a, "--format")) {
            format = v;
        } else {
            fprintf(stderr, "pagoda bench make-model: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr,
                "usage: pagoda bench make-model --arch llama|qwen3 --hidden H --layers L "
                "--heads A --kv-heads K --ffn F --vocab V --format bf16|mlx4|mlx8|mxfp4|mxfp8 "
                "OUT\n");
        return 2;
    }
    int qwen3 = !strcmp(arch, "qwen3");
    if (!qwen3 && strcmp(arch, "llama")) {
        fprintf(stderr, "pagoda bench make-model: --arch must be llama or qwen3\n");
        return 2;
    }
    struct mm_spec f;
    if (!strcmp(format, "bf16"))
        f = (struct mm_spec){"bf16", 16, 0};
    else if (!strcmp(format, "mlx4"))
        f = (struct mm_spec){"mlx4", 4, 64};
    else if (!strcmp(format, "mlx8"))
        f = (struct mm_spec){"mlx8", 8, 64};
    else if (!strcmp(format, "mxfp4"))
        f = (struct mm_spec){"mxfp4", 4, 32};
    else if (!strcmp(format, "mxfp8"))
        f = (struct mm_spec){"mxfp8", 8, 32};
    else {
        fprintf(stderr,
                "pagoda bench make-model: --format must be bf16, mlx4, mlx8, mxfp4 or mxfp8\n");
        return 2;
    }
    if (H % A || A % K || (f.group && (H % f.group || F % f.group))) {
        fprintf(stderr, "pagoda bench make-model: shapes do not divide (hidden %% heads, heads %% "
                        "kv-heads, hidden and ffn by the group size)\n");
        return 2;
    }
    long D = H / A;
    if (mkdir(out, 0755) != 0) {
        struct stat sb;
        if (stat(out, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
            fprintf(stderr, "pagoda bench make-model: cannot create %s\n", out);
            return 1;
        }
    }
    struct st_writer *w = st_writer_create();
    struct fill *pool = xcalloc((size_t)(L * 40 + 16), sizeof *pool);
    int np = 0;
    struct fill *one = &pool[np++];
    *one = (struct fill){FILL_BF16_CONST, 0, 1.0f, 0};
    char p[256];
    add_linear(w, &pool, &np, "model.embed_tokens", V, H, &f, (uint64_t)seed << 40);
    add_linear(w, &pool, &np, "lm_head", V, H, &f, ((uint64_t)seed << 40) + (1ull << 38));
    int64_t hshape[1] = {H}, dshape[1] = {D};
    st_writer_add(w, "model.norm.weight", ST_BF16, 1, hshape, fill_cb, one);
    for (long l = 0; l < L; l++) {
        uint64_t s = ((uint64_t)seed << 40) + ((uint64_t)(l + 1) << 32);
        const char *names[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                               "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                               "mlp.down_proj"};
        int64_t ns[] = {A * D, K * D, K * D, H, F, F, H}, ks[] = {H, H, H, A * D, H, H, F};
        for (int i = 0; i < 7; i++) {
            snprintf(p, sizeof p, "model.layers.%ld.%s", l, names[i]);
            add_linear(w, &pool, &np, p, ns[i], ks[i], &f, s + ((uint64_t)i << 28));
        }
        snprintf(p, sizeof p, "model.layers.%ld.input_layernorm.weight", l);
        st_writer_add(w, p, ST_BF16, 1, hshape, fill_cb, one);
        snprintf(p, sizeof p, "model.layers.%ld.post_attention_layernorm.weight", l);
        st_writer_add(w, p, ST_BF16, 1, hshape, fill_cb, one);
        if (qwen3) {
            snprintf(p, sizeof p, "model.layers.%ld.self_attn.q_norm.weight", l);
            st_writer_add(w, p, ST_BF16, 1, dshape, fill_cb, one);
            snprintf(p, sizeof p, "model.layers.%ld.self_attn.k_norm.weight", l);
            st_writer_add(w, p, ST_BF16, 1, dshape, fill_cb, one);
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    struct err e = {0};
    double t0 = util_now();
    int rc = st_writer_write(w, path, f.bits == 16 ? "pt" : "mlx", &e);
    st_writer_destroy(w);
    free(pool);
    if (rc) {
        fprintf(stderr, "pagoda: %s\n", e.msg);
        return 1;
    }
    cJSON *c = cJSON_CreateObject();
    cJSON *ar = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(ar, cJSON_CreateString(qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM"));
    cJSON_AddStringToObject(c, "model_type", qwen3 ? "qwen3" : "llama");
    cJSON_AddNumberToObject(c, "hidden_size", (double)H);
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)L);
    cJSON_AddNumberToObject(c, "num_attention_heads", (double)A);
    cJSON_AddNumberToObject(c, "num_key_value_heads", (double)K);
    cJSON_AddNumberToObject(c, "head_dim", (double)D);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)F);
    cJSON_AddNumberToObject(c, "vocab_size", (double)V);
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)ctx);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-5);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddFalseToObject(c, "tie_word_embeddings");
    cJSON_AddNumberToObject(c, "bos_token_id", 1);
    cJSON_AddNumberToObject(c, "eos_token_id", 2);
    cJSON_AddStringToObject(c, "torch_dtype", "bfloat16");
    cJSON *rp = cJSON_AddObjectToObject(c, "rope_parameters");
    cJSON_AddNumberToObject(rp, "rope_theta", qwen3 ? 1000000.0 : 500000.0);
    if (qwen3) {
        cJSON_AddStringToObject(rp, "rope_type", "default");
    } else {
        cJSON_AddStringToObject(rp, "rope_type", "llama3");
        cJSON_AddNumberToObject(rp, "factor", 8.0);
        cJSON_AddNumberToObject(rp, "low_freq_factor", 1.0);
        cJSON_AddNumberToObject(rp, "high_freq_factor", 4.0);
        cJSON_AddNumberToObject(rp, "original_max_position_embeddings", 8192);
    }
    if (f.bits != 16) {
        for (int i = 0; i < 2; i++) {
            cJSON *q = cJSON_AddObjectToObject(c, i ? "quantization_config" : "quantization");
            cJSON_AddNumberToObject(q, "group_size", f.group);
            cJSON_AddNumberToObject(q, "bits", f.bits);
            if (!strcmp(f.format, "mxfp4") || !strcmp(f.format, "mxfp8"))
                cJSON_AddStringToObject(q, "mode", f.format);
        }
    }
    char *text = cJSON_Print(c);
    cJSON_Delete(c);
    snprintf(path, sizeof path, "%s/config.json", out);
    FILE *fp = fopen(path, "w");
    if (!fp) {
        free(text);
        fprintf(stderr, "pagoda: %s: cannot write\n", path);
        return 1;
    }
    fputs(text, fp);
    fclose(fp);
    free(text);
    printf("wrote %s (%s, %s) in %.1f s\n", out, qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM",
           f.format, util_now() - t0);
    return 0;
}

/* ---- decode ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best-of-3 read bandwidth of a 1 GiB buffer on `threads` threads, in bytes/s. */
static double measure_read_bw(int threads)
{
    size_t n = (size_t)1 << 30;
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, 64, n) != 0) return 0;
    for (size_t i = 0; i < n; i += 4096) buf[i] = (uint8_t)i;
    struct threadpool *tp = tp_create(threads);
    double best = 0;
    uint64_t sink = 0;
    for (int r = 0; r < 4; r++) {
        double t0 = util_now();
        sink ^= cpu_read_all(tp, buf, n);
        double bw = (double)n / (util_now() - t0);
        if (r > 0 && bw > best) best = bw; /* the first pass warms the pages */
    }
    tp_destroy(tp);
    free(buf);
    if (sink == 42) fprintf(stderr, " "); /* keeps the reads observable */
    return best;
}

static int bench_decode(int argc, char **argv)
{
    const char *dir = NULL, *device = NULL;
    long B = 1, P = 128, G = 32, threads = 0, K = 1;
    int json = 0, no_bw = 0, overlap = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--disable-overlap-schedule")) {
            overlap = 0;
            continue;
        }
        if (!strcmp(a, "--no-bandwidth")) {
            no_bw = 1;
            continue;
        }
        if (!(v = arg_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "--model"))
            dir = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--batch")) {
            if (arg_int(a, v, 1, 4096, &B)) return 2;
        } else if (!strcmp(a, "--prompt-len")) {
            if (arg_int(a, v, 1, 1 << 20, &P)) return 2;
        } else if (!strcmp(a, "--gen-len")) {
            if (arg_int(a, v, 1, 1 << 20, &G)) return 2;
        } else if (!strcmp(a, "--threads")) {
            if (arg_int(a, v, 1, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--prefill-seqs")) {
            if (arg_int(a, v, 1, 4096, &K)) return 2;
        } else {
            fprintf(stderr, "pagoda bench decode: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: pagoda bench decode --model DIR [--batch B] [--prompt-len P] "
                        "[--gen-len G] [--prefill-seqs K] [--threads N] [--device D] [--json] "
                        "[--no-bandwidth] [--disable-overlap-schedule]\n");
        return 2;
    }
    if (K > B) K = B;
    int nth = threads ? (int)threads : util_num_cores();
    /* Prefill K sequences per step (K * P tokens; one by default, so the step shape matches
     * a prompt), as a server batches prompts under its step budget. */
    struct runner r;
    int max_tokens = (int)(P * K > B ? P * K : B);
    if (runner_open(&r, dir, device, nth, (int)B, (int)(P + G + 1), max_tokens, (int)B)) return 1;
    const struct model_config *c = &r.m->cfg;
    int on_cpu = !strcmp(r.be.ops->name, "cpu");
    if (overlap < 0) overlap = r.be.ops->async_picks; /* as the engine's default */
    struct backend_info bi;
    r.be.ops->info(r.be.ctx, &bi);
    /* Greedy picks happen where the logits are (no logits copied to the host). */
    r.keep_logits = 1;
    /* Pin and pre-read the weights so the figures measure compute and memory, not the page
     * cache refilling from disk (a GPU backend holds its own copy already). */
    struct err le = {0};
    if (on_cpu && st_lock(&r.m->st, &le)) fprintf(stderr, "pagoda bench: warning: %s\n", le.msg);
    if (on_cpu) {
        struct threadpool *tp = tp_create(nth);
        uint64_t sink = 0;
        for (int f = 0; f < r.m->st.nfiles; f++)
            sink ^= cpu_read_all(tp, r.m->st.files[f].map, r.m->st.files[f].size / 64 * 64);
        tp_destroy(tp);
        if (sink == 42) fprintf(stderr, " ");
    }
    int32_t *prompt = xmalloc(sizeof(int32_t) * (size_t)(P * K));
    int *sids = xmalloc(sizeof(int) * (size_t)K);
    int32_t *next = xmalloc(sizeof(int32_t) * (size_t)B);
    const int32_t **toks = xmalloc(sizeof(int32_t *) * (size_t)B);
    int *counts = xmalloc(sizeof(int) * (size_t)B), *all = xcalloc((size_t)B, sizeof(int));
    uint64_t x = 12345;
    /* One untimed prefill and decode step (kernel loading, plans, graphs), then the
     * sequence starts over. */
    {
        for (long i = 0; i < P * K; i++)
            prompt[i] = (int32_t)(mix(x + (uint64_t)i) % (uint64_t)c->vocab);
        for (long s = 0; s < K; s++) {
            sids[s] = (int)s;
            toks[s] = prompt + s * P;
            counts[s] = (int)P;
        }
        runner_step(&r, (int)K, sids, toks, counts, all);
        for (long s = 0; s < B; s++) {
            next[s] = 0;
            toks[s] = &next[s];
            counts[s] = 1;
        }
        memset(r.len, 0, sizeof(int32_t) * (size_t)B);
        for (long s = 0; s < B; s++) r.len[s] = (int32_t)P;
        runner_step(&r, (int)B, NULL, toks, counts, all);
        memset(r.len, 0, sizeof(int32_t) * (size_t)B);
    }
    double t0 = util_now();
    for (long s0 = 0; s0 < B; s0 += K) {
        int n = (int)(B - s0 < K ? B - s0 : K);
        for (int j = 0; j < n; j++) {
            for (long i = 0; i < P; i++)
                prompt[j * P + i] = (int32_t)(mix(x++) % (uint64_t)c->vocab);
            sids[j] = (int)(s0 + j);
            toks[j] = prompt + j * P;
            counts[j] = (int)P;
        }
        int nl = runner_step(&r, n, sids, toks, counts, all);
        /* The step's first tokens, as a server picks them; this also waits for the step to
         * finish on a backend that runs asynchronously. */
        model_argmax(r.m, nl, next);
    }
    double t_prefill = util_now() - t0;
    for (long s = 0; s < B; s++) {
        next[s] = (int32_t)(mix(x++) % (uint64_t)c->vocab);
        toks[s] = &next[s];
        counts[s] = 1;
    }
    double *step_t = xmalloc(sizeof(double) * (size_t)G);
    int32_t *pick_rows = xmalloc(sizeof(int32_t) * (size_t)B);
    for (long s = 0; s < B; s++) pick_rows[s] = (int32_t)s; /* sequence s: logit row s */
    t0 = util_now();
    if (overlap) {
        /* As the engine runs greedy steps: each step goes out before the previous step's
         * picks are read, its tokens those picks on the device. A step's time runs from
         * the previous step's tokens reaching the host to its own. */
        int nl = runner_step(&r, (int)B, NULL, toks, counts, all);
        model_argmax(r.m, nl, NULL);
        double ts = t0;
        r.pick_rows = pick_rows;
        for (long g = 0; g < G; g++) {
            if (g + 1 < G) {
                nl = runner_step(&r, (int)B, NULL, toks, counts, all);
                model_argmax(r.m, nl, NULL);
            }
            model_picks(r.m, nl, next);
            double now = util_now();
            step_t[g] = now - ts;
            ts = now;
        }
        r.pick_rows = NULL;
    } else {
        for (long g = 0; g < G; g++) {
            double ts = util_now();
            int nl = runner_step(&r, (int)B, NULL, toks, counts, all);
            model_argmax(r.m, nl, next);
            step_t[g] = util_now() - ts;
        }
    }
    double t_decode = util_now() - t0;
    free(pick_rows);
    qsort(step_t, (size_t)G, sizeof(double), cmp_double);
    double med = step_t[G / 2];
    size_t wbytes = model_weight_bytes(r.m);
    /* Bytes a decode step streams: every matrix but the embedding table (only rows of it
     * are read) unless it doubles as the output head. */
    size_t step_bytes = wbytes;
    if (r.m->lm_head.w != r.m->embed.w) step_bytes -= qweight_bytes(&r.m->embed);
    double prefill_tps = (double)(B * P) / t_prefill;
    double decode_tps = (double)B / med;
    double eff_bw = (double)step_bytes / med;
    double bw = no_bw || !on_cpu ? 0 : measure_read_bw(nth);
    double gflop_tok =
        2.0 * (double)(model_param_count(r.m) - (int64_t)r.m->embed.n * r.m->embed.k);
    if (json) {
        printf("{\"model\": \"%s\", \"device\": \"%s\", \"threads\": %d, \"isa\": \"%s\", "
               "\"batch\": %ld, \"prefill_seqs\": %ld, "
               "\"prompt_len\": %ld, \"gen_len\": %ld, \"prefill_tokens_per_s\": %.2f, "
               "\"decode_tokens_per_s\": %.2f, \"decode_step_ms_median\": %.3f, "
               "\"decode_tokens_per_s_mean\": %.2f, \"weight_bytes_per_step\": %zu, "
               "\"effective_read_gb_s\": %.2f, \"measured_read_gb_s\": %.2f, "
               "\"prefill_gflop_s\": %.1f, \"overlap_schedule\": %s}\n",
               dir, bi.device, nth, cpu_isa_name(cpu_isa_get()), B, K, P, G, prefill_tps,
               decode_tps, med * 1e3, (double)(B * G) / t_decode, step_bytes, eff_bw / 1e9,
               bw / 1e9, prefill_tps * gflop_tok / 1e9, overlap ? "true" : "false");
    } else {
        printf("model      %s (%s, %.2f GB of weights streamed per decode step)\n", dir,
               c->arch_name, (double)step_bytes / 1e9);
        if (on_cpu)
            printf("setup      %d threads (%s), batch %ld, prompt %ld, generate %ld\n", nth,
                   cpu_isa_name(cpu_isa_get()), B, P, G);
        else
            printf("setup      %s, batch %ld, prompt %ld, generate %ld\n", bi.device, B, P, G);
        printf("prefill    %.2f tokens/s (%.1f GFLOP/s; %ld prompt%s a step)\n", prefill_tps,
               prefill_tps * gflop_tok / 1e9, K, K == 1 ? "" : "s");
        printf("decode     %.2f tokens/s (median step %.2f ms; mean %.2f tokens/s%s)\n", decode_tps,
               med * 1e3, (double)(B * G) / t_decode, overlap ? "" : "; steps not overlapped");
        if (bw > 0)
            printf("bandwidth  %.2f GB/s effective of %.2f GB/s measured read bandwidth (%.1f%%)\n",
                   eff_bw / 1e9, bw / 1e9, 100.0 * eff_bw / bw);
    }
    free(step_t);
    free(prompt);
    free(sids);
    free(next);
    free(toks);
    free(counts);
    free(all);
    runner_close(&r);
    return 0;
}

int cli_bench(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "make-model")) return make_model(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "decode")) return bench_decode(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "tokenize")) return cli_bench_tokenize(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "throughput"))
        return cli_bench_throughput(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "matmul")) return cli_bench_matmul(argc - 1, argv + 1);
    fprintf(stderr, "usage: pagoda bench make-model ... | decode ... | throughput ... | matmul ... "
                    "| tokenize ...\n");
    return 2;
}
