#include "cli/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cjson/cJSON.h>

#include "common/util.h"
#include "model/tp.h"

const char *arg_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "pagoda: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int arg_int(const char *opt, const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "pagoda: %s: '%s' is not an integer in [%ld, %ld]\n", opt, v, lo, hi);
        return -1;
    }
    *out = x;
    return 0;
}

int arg_float(const char *opt, const char *v, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || x != x) {
        fprintf(stderr, "pagoda: %s: '%s' is not a number\n", opt, v);
        return -1;
    }
    *out = x;
    return 0;
}

int arg_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 16, cnt = 0;
    int32_t *a = xmalloc(cap * sizeof *a);
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n' || *p == '[' || *p == ']') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "pagoda: token ids: '%.20s' is not a token id\n", p);
            free(a);
            return -1;
        }
        if (cnt == cap) a = xrealloc(a, (cap *= 2) * sizeof *a);
        a[cnt++] = (int32_t)v;
        p = end;
    }
    *ids = a;
    *n = cnt;
    return 0;
}

const char arg_engine_usage[] =
    "  --device D                  cpu, cuda or cuda:N (default: cuda when a GPU is present)\n"
    "  --threads N                 CPU compute threads (default: one per core)\n"
    "  --tensor-parallel-size N, -tp N  split the model over N GPUs (cuda:K..K+N-1 for\n"
    "                              --device cuda:K; Llama, Mistral, Qwen2, Qwen3)\n"
    "  --disable-custom-all-reduce every exchange of a split model through NCCL (default:\n"
    "                              the small ones over peer memory, in one kernel with the\n"
    "                              residual add and the next norm)\n"
    "  --num-blocks N              KV blocks in the pool (default: from --kv-cache-memory)\n"
    "  --kv-cache-memory BYTES     KV pool size, e.g. 2GiB (default 1GiB on the CPU)\n"
    "  --kv-host-memory BYTES      CUDA: pinned host memory that keeps KV blocks evicted from\n"
    "                              the GPU pool, e.g. 64GiB (the CPU's pool is host memory)\n"
    "  --kv-disk-dir DIR           keep KV blocks on disk under DIR too: they outlive the\n"
    "                              pool and restarts; one server per DIR\n"
    "  --kv-disk-size BYTES        byte budget of --kv-disk-dir (default 16GiB)\n" ARG_KV_USAGE
    "  --gpu-memory-utilization F  GPU share for weights, activations and KV (default 0.9)\n"
    "  --block-size N              tokens per KV block (default 16)\n"
    "  --max-num-batched-tokens N  token budget of one step (default 2048)\n" ARG_SCHED_USAGE
    "  --max-num-seqs N            running requests at most (default 256)\n"
    "  --max-model-len N           context length (default: the model's)\n"
    "  --no-enable-prefix-caching  no prefix sharing between requests\n"
    "  --disable-overlap-schedule  read each step's tokens before the next step starts\n"
    "  --mlock                     lock the weights in memory (never paged out)\n"
    "  --batch-invariant           a request's results do not depend on its batch (the\n"
    "                              invariant kernels; slower prefill and batched decode)\n"
    "  --hybrid-state-interval N   hybrid models: also keep a recurrent-state snapshot every N\n"
    "                              blocks of a sequence, for prefix hits (default 0: at the end\n"
    "                              of each prompt's last full block and of a finished one's)\n"
    "  --speculative-method M      ngram (prompt lookup), draft (--speculative-model), mtp\n"
    "                              (the checkpoint's multi-token-prediction module) or eagle3\n"
    "                              (an EAGLE-3 head: --speculative-model)\n"
    "  --num-speculative-tokens K  drafts per request and step at most (default 4)\n"
    "  --ngram-min N, --ngram-max N  prompt lookup n-gram sizes (default 1 and 4)\n"
    "  --speculative-model DIR     the draft model (same tokenizer), for method draft; the\n"
    "                              EAGLE-3 head's folder, for method eagle3\n"
    "  --speculative-disable-by-batch-size N  drafts shrink to none as running requests\n"
    "                              reach N (default 64)\n"
    "  --speculative-config JSON   the above as vLLM's JSON: method, num_speculative_tokens,\n"
    "                              prompt_lookup_min, prompt_lookup_max, model,\n"
    "                              disable_by_batch_size\n";

int arg_bytes(const char *opt, const char *v, size_t *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || x != x || x < 0) goto bad;
    double mul = 1;
    if (!strcasecmp(end, "") || !strcasecmp(end, "b"))
        mul = 1;
    else if (!strcasecmp(end, "k") || !strcasecmp(end, "kib"))
        mul = 1024.0;
    else if (!strcasecmp(end, "m") || !strcasecmp(end, "mib"))
        mul = 1024.0 * 1024;
    else if (!strcasecmp(end, "g") || !strcasecmp(end, "gib"))
        mul = 1024.0 * 1024 * 1024;
    else if (!strcasecmp(end, "kb"))
        mul = 1e3;
    else if (!strcasecmp(end, "mb"))
        mul = 1e6;
    else if (!strcasecmp(end, "gb"))
        mul = 1e9;
    else
        goto bad;
    x *= mul;
    if (x < 1 || x > 1e15) goto bad;
    *out = (size_t)x;
    return 0;
bad:
    fprintf(stderr, "pagoda: %s: '%s' is not a byte size (e.g. 512MiB, 2GiB)\n", opt, v);
    return -1;
}

static int spec_method_arg(const char *opt, const char *v, struct spec_config *sc)
{
    if (!strcmp(v, "ngram") || !strcmp(v, "prompt_lookup"))
        sc->method = SPEC_NGRAM;
    else if (!strcmp(v, "draft") || !strcmp(v, "draft_model"))
        sc->method = SPEC_DRAFT;
    else if (!strcmp(v, "mtp") || !strcmp(v, "qwen3_next_mtp") || !strcmp(v, "qwen3_5_mtp"))
        sc->method = SPEC_MTP;
    else if (!strcmp(v, "eagle3"))
        sc->method = SPEC_EAGLE3;
    else {
        fprintf(stderr, "pagoda: %s: '%s' is not a method (ngram, draft, mtp, eagle3)\n", opt, v);
        return -1;
    }
    if (!sc->num_tokens) sc->num_tokens = 4;
    return 0;
}

/* vLLM's --speculative-config: {"method": "ngram", "num_speculative_tokens": 4,
 * "prompt_lookup_min": 2, "prompt_lookup_max": 5, "model": DIR, "disable_by_batch_size": N}.
 * Strings stay in the parsed document, which lives as long as the process. */
static int spec_config_arg(const char *opt, const char *v, struct spec_config *sc)
{
    cJSON *j = cJSON_Parse(v);
    if (!cJSON_IsObject(j)) {
        fprintf(stderr, "pagoda: %s: not a JSON object\n", opt);
        cJSON_Delete(j);
        return -1;
    }
    const cJSON *m = cJSON_GetObjectItem(j, "method"), *model = cJSON_GetObjectItem(j, "model");
    if (cJSON_IsString(model)) sc->model_dir = model->valuestring;
    if (cJSON_IsString(m)) {
        if (spec_method_arg(opt, m->valuestring, sc)) return -1;
    } else if (sc->model_dir) {
        sc->method = SPEC_DRAFT; /* as vLLM: a model and no method is a draft model */
        if (!sc->num_tokens) sc->num_tokens = 4;
    }
    static const char *const keys[] = {"num_speculative_tokens", "prompt_lookup_min",
                                       "prompt_lookup_max", "disable_by_batch_size"};
    int *dst[] = {&sc->num_tokens, &sc->ngram_min, &sc->ngram_max, &sc->disable_by_batch_size};
    for (int k = 0; k < 4; k++) {
        const cJSON *x = cJSON_GetObjectItem(j, keys[k]);
        if (!x) continue;
        if (!cJSON_IsNumber(x) || x->valuedouble < 1 || x->valuedouble > 1 << 20) {
            fprintf(stderr, "pagoda: %s: %s must be a positive integer\n", opt, keys[k]);
            return -1;
        }
        *dst[k] = x->valueint;
    }
    return 0;
}

int arg_engine_option(int argc, char **argv, int *i, struct engine_config *cfg)
{
    const char *a = argv[*i];
    static const char *const ints[] = {"--threads",      "--num-blocks",
                                       "--block-size",   "--max-num-batched-tokens",
                                       "--max-num-seqs", "--max-model-len"};
    if (!strcmp(a, "--mlock")) {
        cfg->mlock = 1;
        return 1;
    }
    if (!strcmp(a, "--disable-custom-all-reduce")) {
        cfg->disable_custom_all_reduce = 1;
        return 1;
    }
    if (!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) {
        const char *v = arg_value(argc, argv, i);
        long x;
        if (!v || arg_int(a, v, 1, TP_MAX, &x)) return -1;
        cfg->tensor_parallel_size = (int)x;
        return 1;
    }
    if (!strcmp(a, "--batch-invariant")) {
        cfg->batch_invariant = 1;
        return 1;
    }
    if (!strcmp(a, "--no-enable-prefix-caching")) {
        cfg->disable_prefix_caching = 1;
        return 1;
    }
    if (!strcmp(a, "--disable-overlap-schedule")) {
        cfg->overlap = -1;
        return 1;
    }
    if (!strcmp(a, "--hybrid-state-interval")) {
        const char *v = arg_value(argc, argv, i);
        long x;
        if (!v || arg_int(a, v, 0, 1 << 20, &x)) return -1;
        cfg->hybrid_state_interval = (int)x;
        return 1;
    }
    if (!strcmp(a, "--speculative-method") || !strcmp(a, "--speculative-config") ||
        !strcmp(a, "--speculative-model")) {
        const char *v = arg_value(argc, argv, i);
        if (!v) return -1;
        if (!strcmp(a, "--speculative-model")) {
            cfg->spec.model_dir = v;
            return 1;
        }
        return (a[14] == 'm' ? spec_method_arg(a, v, &cfg->spec)
                             : spec_config_arg(a, v, &cfg->spec))
                   ? -1
                   : 1;
    }
    static const char *const spec_ints[] = {"--num-speculative-tokens", "--ngram-min",
                                            "--ngram-max", "--speculative-disable-by-batch-size"};
    for (size_t k = 0; k < 4; k++) {
        if (strcmp(a, spec_ints[k])) continue;
        const char *v = arg_value(argc, argv, i);
        long x;
        if (!v || arg_int(a, v, 1, k == 0 ? SPEC_MAX_TOKENS : 1 << 20, &x)) return -1;
        int *dst[] = {&cfg->spec.num_tokens, &cfg->spec.ngram_min, &cfg->spec.ngram_max,
                      &cfg->spec.disable_by_batch_size};
        *dst[k] = (int)x;
        return 1;
    }
    if (!strcmp(a, "--device")) {
        const char *v = arg_value(argc, argv, i);
        if (!v) return -1;
        cfg->device = v;
        return 1;
    }
    if (!strcmp(a, "--gpu-memory-utilization")) {
        const char *v = arg_value(argc, argv, i);
        double x;
        if (!v || arg_float(a, v, &x)) return -1;
        if (x <= 0 || x > 1) {
            fprintf(stderr, "pagoda: %s: '%s' is not in (0, 1]\n", a, v);
            return -1;
        }
        cfg->gpu_memory_utilization = x;
        return 1;
    }
    if (!strcmp(a, "--kv-disk-dir")) {
        const char *v = arg_value(argc, argv, i);
        if (!v) return -1;
        cfg->kv_disk_dir = v;
        return 1;
    }
    if (!strcmp(a, "--kv-host-memory")) {
        const char *v = arg_value(argc, argv, i);
        return !v || arg_bytes(a, v, &cfg->kv_host_memory) ? -1 : 1;
    }
    if (!strcmp(a, "--kv-disk-size")) {
        const char *v = arg_value(argc, argv, i);
        return !v || arg_bytes(a, v, &cfg->kv_disk_size) ? -1 : 1;
    }
    int kv = arg_kv_option(argc, argv, i, &cfg->kv);
    if (kv) return kv;
    int sc = arg_sched_option(argc, argv, i, cfg);
    if (sc) return sc;
    if (!strcmp(a, "--kv-cache-memory")) {
        const char *v = arg_value(argc, argv, i);
        return !v || arg_bytes(a, v, &cfg->kv_cache_memory) ? -1 : 1;
    }
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++) {
        if (strcmp(a, ints[k])) continue;
        const char *v = arg_value(argc, argv, i);
        long x;
        if (!v || arg_int(a, v, 1, k == 2 ? 1024 : INT32_MAX, &x)) return -1;
        int *dst[] = {&cfg->threads,      &cfg->num_blocks,
                      &cfg->block_size,   &cfg->max_num_batched_tokens,
                      &cfg->max_num_seqs, &cfg->max_model_len};
        *dst[k] = (int)x;
        return 1;
    }
    return 0;
}

/* The delta rule's chunk in the runner's steps (hybrid models). */
#define RUNNER_DELTA_CHUNK 16

int runner_open(struct runner *r, const char *dir, const char *device, int threads, int n_seqs,
                int max_ctx, int max_tokens, int max_logits)
{
    return runner_open_kv(r, dir, device, threads, n_seqs, max_ctx, max_tokens, max_logits, NULL);
}

int runner_open_kv(struct runner *r, const char *dir, const char *device, int threads, int n_seqs,
                   int max_ctx, int max_tokens, int max_logits, const struct kv_spec *kv)
{
    return runner_open_tp(r, dir, device, threads, 1, n_seqs, max_ctx, max_tokens, max_logits, kv);
}

int runner_open_tp(struct runner *r, const char *dir, const char *device, int threads, int tp,
                   int n_seqs, int max_ctx, int max_tokens, int max_logits,
                   const struct kv_spec *kv)
{
    memset(r, 0, sizeof *r);
    struct err e = {0};
    if (backend_create(&r->be, device, threads, &e)) {
        fprintf(stderr, "pagoda: %s\n", e.msg);
        return -1;
    }
    r->m = model_load_tp(dir, &r->be, device, tp, threads, &e);
    if (!r->m) {
        fprintf(stderr, "pagoda: %s\n", e.msg);
        backend_destroy(&r->be);
        return -1;
    }
    if (kv && model_set_kv_format(r->m, kv, &e)) {
        fprintf(stderr, "pagoda: %s\n", e.msg);
        runner_close(r);
        return -1;
    }
    r->block_size = 16;
    r->blocks_per_seq = (max_ctx + r->block_size - 1) / r->block_size;
    r->n_seqs = n_seqs;
    r->max_tokens = max_tokens;
    if (model_state_alloc(r->m, max_tokens, max_logits, r->blocks_per_seq * n_seqs, r->block_size,
                          n_seqs, &e)) {
        fprintf(stderr, "pagoda: %s\n", e.msg);
        runner_close(r);
        return -1;
    }
    size_t T = (size_t)max_tokens;
    r->tokens = xmalloc(T * 4);
    r->pos = xmalloc(T * 4);
    r->slot = xmalloc(T * 4);
    r->logit_rows = xmalloc(T * 4);
    r->q_start = xmalloc((size_t)(n_seqs + 1) * 4);
    r->seq_len = xmalloc((size_t)n_seqs * 4);
    r->len = xcalloc((size_t)n_seqs, 4);
    r->block_table = xmalloc((size_t)n_seqs * (size_t)r->blocks_per_seq * 4);
    r->bt_step = xmalloc((size_t)n_seqs * (size_t)r->blocks_per_seq * 4);
    r->state_slot = xmalloc((size_t)n_seqs * 4);
    r->chunked = xmalloc((size_t)n_seqs * 4);
    for (int s = 0; s < n_seqs; s++)
        for (int b = 0; b < r->blocks_per_seq; b++)
            r->block_table[s * r->blocks_per_seq + b] = s * r->blocks_per_seq + b;
    r->logits = xmalloc((size_t)max_logits * (size_t)r->m->cfg.vocab * sizeof(float));
    return 0;
}

void runner_close(struct runner *r)
{
    model_destroy(r->m);
    backend_destroy(&r->be);
    free(r->tokens);
    free(r->pos);
    free(r->slot);
    free(r->logit_rows);
    free(r->q_start);
    free(r->seq_len);
    free(r->len);
    free(r->block_table);
    free(r->bt_step);
    free(r->state_slot);
    free(r->chunked);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

int runner_step(struct runner *r, int n, const int *seq_ids, const int32_t *const *toks,
                const int *counts, const int *want_all)
{
    int t = 0, nl = 0;
    for (int i = 0; i < n; i++) {
        int s = seq_ids ? seq_ids[i] : i;
        r->q_start[i] = t;
        for (int j = 0; j < counts[i]; j++, t++) {
            int p = r->len[s] + j;
            r->tokens[t] = toks[i][j];
            r->pos[t] = p;
            r->slot[t] = r->block_table[s * r->blocks_per_seq + p / r->block_size] * r->block_size +
                         p % r->block_size;
            if (want_all[i] || j == counts[i] - 1) r->logit_rows[nl++] = t;
        }
        r->len[s] += counts[i];
        /* the delta rule in chunks wherever a whole one lies in the step (one token: none) */
        r->chunked[i] = r->len[s] / RUNNER_DELTA_CHUNK * RUNNER_DELTA_CHUNK;
        r->state_slot[i] = s; /* sequence s keeps slot s */
        r->seq_len[i] = r->len[s];
        memcpy(r->bt_step + (size_t)i * r->blocks_per_seq,
               r->block_table + (size_t)s * r->blocks_per_seq,
               sizeof(int32_t) * (size_t)r->blocks_per_seq);
    }
    r->q_start[n] = t;
    struct fwd_batch b = {
        .n_tokens = t,
        .tokens = r->tokens,
        .pos = r->pos,
        .slot = r->slot,
        .n_seqs = n,
        .q_start = r->q_start,
        .seq_len = r->seq_len,
        .block_table = r->bt_step,
        .max_blocks = r->blocks_per_seq,
        .n_logits = nl,
        .logit_rows = r->logit_rows,
        .pick_rows = r->pick_rows,
        .state_slot = r->state_slot,
        .delta_chunked = r->chunked,
        .delta_chunk = RUNNER_DELTA_CHUNK,
    };
    model_forward(r->m, &b, r->keep_logits ? NULL : r->logits);
    return nl;
}
