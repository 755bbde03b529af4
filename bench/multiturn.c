/* The multi-turn benchmark: see multiturn.h. */
#include "bench/multiturn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/run.h"
#include "common/util.h"

struct convo {
    int32_t *ids; /* the conversation so far */
    int n, cap;
};

static void append(struct convo *c, const int32_t *ids, int n)
{
    if (c->n + n > c->cap) {
        while (c->n + n > c->cap) c->cap = c->cap ? 2 * c->cap : 1024;
        c->ids = xrealloc(c->ids, sizeof *c->ids * (size_t)c->cap);
    }
    memcpy(c->ids + c->n, ids, sizeof *ids * (size_t)n);
    c->n += n;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int multiturn_run(struct hc *c, const struct opts *o, const char *model, const cJSON *extra,
                  cJSON *doc, struct err *e)
{
    if (o->chat)
        return err_set(e, "--dataset multi-turn sends token ids: use the completions endpoint");
    int N = o->num_conversations, T = o->turns;
    struct convo *cv = xcalloc((size_t)N, sizeof *cv);
    struct dataset ds = {xcalloc((size_t)N, sizeof(struct prompt)), N};
    struct req_result *all = xcalloc((size_t)N * (size_t)T, sizeof *all);
    double *ttft = xmalloc(sizeof(double) * (size_t)N);
    int32_t *fresh = xmalloc(sizeof(int32_t) * (size_t)o->turn_input_len);
    /* the answers come back as token ids: ask for them, beside what --extra-body adds */
    cJSON *body = extra ? cJSON_Duplicate(extra, 1) : cJSON_CreateObject();
    cJSON_DeleteItemFromObjectCaseSensitive(body, "return_token_ids");
    cJSON_AddBoolToObject(body, "return_token_ids", 1);
    struct rng rng = {o->seed * 0x9e3779b97f4a7c15ull + 7};
    cJSON *turns = cJSON_AddArrayToObject(doc, "turns");
    int status = 0, n_all = 0;
    double t_total = 0;
    printf("%-5s %9s %12s %12s %12s %14s %13s\n", "turn", "requests", "prompt tok", "TTFT mean",
           "TTFT median", "TTFT p99 (ms)", "cached share");
    for (int t = 0; t < T && !run_interrupted; t++) {
        for (int i = 0; i < N; i++) {
            for (int k = 0; k < o->turn_input_len; k++)
                fresh[k] = (int32_t)(rng_next(&rng) % (uint64_t)o->vocab_size);
            append(&cv[i], fresh, o->turn_input_len);
            ds.p[i] = (struct prompt){.ids = cv[i].ids,
                                      .n_ids = cv[i].n,
                                      .input_len = cv[i].n,
                                      .output_len = o->turn_output_len};
        }
        struct run_cfg rc = {.path = "/v1/completions",
                             .req = {.chat = 0,
                                     .model = model,
                                     .temperature = o->temperature,
                                     .ignore_eos = o->ignore_eos,
                                     .extra = body},
                             .concurrency = o->concurrency,
                             .num_prompts = N,
                             .timeout = o->timeout,
                             .seed = o->seed};
        struct run_out out;
        if (run_bench(c, &rc, &ds, &out, e)) {
            status = -1;
            break;
        }
        t_total += out.duration;
        long long prompt = 0, cached = 0;
        int n_ok = 0;
        for (int i = 0; i < out.n; i++) {
            struct req_result *r = &out.r[i];
            if (!r->ok) {
                if (!status) fprintf(stderr, "pagoda-bench: turn %d: %s\n", t + 1, r->error);
                status = 3;
                continue;
            }
            if (r->ttft >= 0) ttft[n_ok++] = r->ttft * 1e3;
            prompt += r->prompt_tokens > 0 ? r->prompt_tokens : 0;
            cached += r->cached_tokens > 0 ? r->cached_tokens : 0;
        }
        /* the answers join their conversations (run order is the dataset's order) */
        for (int i = 0; i < out.n && i < N; i++)
            append(&cv[i], out.r[i].out_ids, out.r[i].n_out_ids);
        qsort(ttft, (size_t)n_ok, sizeof *ttft, cmp_double);
        double mean = 0;
        for (int i = 0; i < n_ok; i++) mean += ttft[i] / n_ok;
        double med = n_ok ? ttft[n_ok / 2] : NAN,
               p99 = n_ok ? ttft[(n_ok * 99) / 100 < n_ok ? (n_ok * 99) / 100 : n_ok - 1] : NAN;
        double share = prompt ? (double)cached / (double)prompt : NAN;
        printf("%-5d %9d %12lld %12.1f %12.1f %14.1f %12.1f%%\n", t + 1, out.n, prompt, mean, med,
               p99, share * 100);
        cJSON *tj = cJSON_CreateObject();
        cJSON_AddNumberToObject(tj, "turn", t + 1);
        cJSON_AddNumberToObject(tj, "completed", n_ok);
        cJSON_AddNumberToObject(tj, "prompt_tokens", (double)prompt);
        cJSON_AddNumberToObject(tj, "cached_tokens", (double)cached);
        cJSON_AddNumberToObject(tj, "mean_ttft_ms", mean);
        cJSON_AddNumberToObject(tj, "median_ttft_ms", med);
        cJSON_AddNumberToObject(tj, "p99_ttft_ms", p99);
        cJSON_AddItemToArray(turns, tj);
        double shift = t_total - out.duration; /* this turn's start in the whole run */
        for (int i = 0; i < out.n; i++) {
            struct req_result *r = &all[n_all++];
            *r = out.r[i];
            r->start += shift;
            for (int j = 0; j < r->n_chunk_t; j++) r->chunk_t[j] += shift;
        }
        free(out.r); /* the results moved into all[] */
        out.r = NULL;
        out.n = 0;
    }
    if (n_all) {
        struct summary s = {0};
        s.prefix_cache_hit_rate = NAN;
        summary_compute(all, n_all, t_total, &o->slo, &s);
        printf("\nall turns:\n");
        summary_print(stdout, &s);
        cJSON *sj = summary_json(&s);
        cJSON_AddItemToObject(doc, "summary", sj);
    }
    for (int i = 0; i < n_all; i++) req_result_dispose(&all[i]);
    free(all);
    for (int i = 0; i < N; i++) free(cv[i].ids);
    free(cv);
    free(ds.p);
    free(ttft);
    free(fresh);
    cJSON_Delete(body);
    return status;
}
