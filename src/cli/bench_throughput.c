/*
 * bench throughput: offline, in-process engine throughput. N random-token prompts (with an
 * optional shared prefix) are submitted at once; the engine batches them under its limits.
 * Reports requests/s, output and total tokens/s, the decode-phase rate once every request
 * has its first token, the steady-state output rate (from the first request's end to the
 * last request's first token), inter-token latency percentiles, the step mix and the
 * step-time model's error, and the prefix-cache hit rate.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "common/util.h"
#include "model/sampler.h"
#include "sched/engine.h"
#include "text/tokenizer.h"

struct tp_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n, remaining, first_seen, finished;
    uint64_t tokens, tokens_at_all_first, tokens_at_first_finish;
    double t_all_first, t_first_finish;
    uint8_t *started; /* per request: has its first token */
    double *last;     /* per request: when its last token came */
    double *gaps;     /* inter-token gaps in seconds: [cap_gaps] */
    size_t n_gaps, cap_gaps;
};

struct tp_req {
    struct tp_state *st;
    int idx;
};

static void tp_event(void *user, const struct engine_event *ev)
{
    struct tp_req *q = user;
    struct tp_state *st = q->st;
    pthread_mutex_lock(&st->mu);
    if (ev->kind == ENGINE_EV_TOKEN) {
        st->tokens++;
        double now = util_now();
        if (st->started[q->idx] && st->n_gaps < st->cap_gaps)
            st->gaps[st->n_gaps++] = now - st->last[q->idx];
        st->last[q->idx] = now;
        if (!st->started[q->idx]) {
            st->started[q->idx] = 1;
            pthread_cond_signal(&st->cv);
            if (++st->first_seen == st->n) {
                st->t_all_first = util_now();
                st->tokens_at_all_first = st->tokens;
            }
        }
    }
    if (ev->finish != FINISH_NONE) {
        if (st->finished++ == 0) {
            st->t_first_finish = util_now();
            st->tokens_at_first_finish = st->tokens;
        }
        st->remaining--;
        pthread_cond_signal(&st->cv);
    }
    pthread_mutex_unlock(&st->mu);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of sorted v[0..n) in milliseconds (nearest rank); 0 when empty. */
static double pct_ms(const double *v, size_t n, double q)
{
    if (!n) return 0;
    size_t k = (size_t)(q * (double)(n - 1) + 0.5);
    return 1e3 * v[k < n ? k : n - 1];
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: pagoda bench throughput --model DIR [--num-prompts N] [--input-len I]\n"
        "         [--output-len O] [--prefix-len P] [--temperature T] [--top-p P] [--seed S]\n"
        "         [--json] [engine options]\n"
        "  --num-prompts N   requests, all submitted at once (default 64)\n"
        "  --input-len I     prompt tokens (default 128)\n"
        "  --output-len O    output tokens per request, end-of-sequence ignored (default 128)\n"
        "  --prefix-len P    the first P prompt tokens are shared by every request (default 0);\n"
        "                    the first request runs its prompt before the others arrive\n"
        "  --temperature T   sampling temperature of every request (default 0: greedy)\n"
        "  --top-p P         nucleus of every request, in (0, 1] (default 1: off)\n"
        "  --prompt-file F   every prompt is this text, tokenized (its first --input-len\n"
        "                    tokens when given): e.g. a passage to reproduce, for n-gram drafts\n"
        "  --json            one JSON object instead of the table\n");
    fputs(arg_engine_usage, f);
}

int cli_bench_throughput(int argc, char **argv)
{
    const char *dir = NULL;
    long n = 64, in_len = 128, out_len = 128, prefix = 0, seed = 1;
    double temperature = 0, top_p = 1;
    int json = 0, in_len_set = 0;
    const char *prompt_file = NULL;
    struct engine_config cfg = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int eo = arg_engine_option(argc, argv, &i, &cfg);
        if (eo < 0) return 2;
        if (eo) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--temperature") || !strcmp(a, "--top-p")) {
            double *dst = !strcmp(a, "--temperature") ? &temperature : &top_p;
            if (!(v = arg_value(argc, argv, &i)) || arg_float(a, v, dst)) return 2;
            if (temperature < 0 || !(top_p > 0 && top_p <= 1)) {
                fprintf(stderr, "pagoda bench throughput: %s %s is out of range\n", a, v);
                return 2;
            }
        } else if (!strcmp(a, "--prompt-file")) {
            if (!(prompt_file = arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--num-prompts") ||
                   !strcmp(a, "--input-len") || !strcmp(a, "--output-len") ||
                   !strcmp(a, "--prefix-len") || !strcmp(a, "--seed")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "--model"))
                dir = v;
            else if (!strcmp(a, "--num-prompts") && arg_int(a, v, 1, 1 << 20, &n))
                return 2;
            else if (!strcmp(a, "--input-len") && (in_len_set = 1) &&
                     arg_int(a, v, 1, 1 << 24, &in_len))
                return 2;
            else if (!strcmp(a, "--output-len") && arg_int(a, v, 1, 1 << 24, &out_len))
                return 2;
            else if (!strcmp(a, "--prefix-len") && arg_int(a, v, 0, 1 << 24, &prefix))
                return 2;
            else if (!strcmp(a, "--seed") && arg_int(a, v, 0, 0x7fffffffffffffffL, &seed))
                return 2;
        } else {
            fprintf(stderr, "pagoda bench throughput: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "pagoda bench throughput: --model is required\n");
        return 2;
    }
    if (prefix > in_len) {
        fprintf(stderr, "pagoda bench throughput: --prefix-len must not exceed --input-len\n");
        return 2;
    }
    int32_t *file_ids = NULL;
    size_t n_file = 0;
    struct err e = {0};
    if (prompt_file) {
        char *text = util_read_file(prompt_file, NULL, NULL);
        struct tok *tk = text ? tok_load(dir, &e) : NULL;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (!text || !tk || tok_encode(tk, text, strlen(text), 1, &ids, &n_ids, &e) || n_ids < 1) {
            fprintf(stderr, "pagoda bench throughput: --prompt-file %s: %s\n", prompt_file,
                    text ? e.msg : "cannot read it");
            free(text);
            tok_destroy(tk);
            free(ids);
            return 1;
        }
        free(text);
        tok_destroy(tk);
        file_ids = ids;
        n_file = n_ids;
        if (!in_len_set || (size_t)in_len > n_file) in_len = (long)n_file;
        if (prefix > in_len) prefix = in_len;
    }
    cfg.model_dir = dir;
    /* Weights read from disk mid-run would measure the disk: lock them, as bench decode does. */
    cfg.mlock = 1;
    struct engine *en = engine_create(&cfg, &e);
    if (!en) {
        fprintf(stderr, "pagoda bench throughput: %s\n", e.msg);
        return 1;
    }
    int vocab = engine_model_config(en)->vocab;
    struct rng rng;
    rng_seed(&rng, (uint64_t)seed);
    int32_t *prompts = xmalloc(sizeof(int32_t) * (size_t)n * (size_t)in_len);
    for (long r = 0; r < n; r++)
        for (long t = 0; t < in_len; t++)
            prompts[r * in_len + t] =
                (int32_t)(rng_next(&rng) % (uint64_t)vocab); /* shared prefix below */
    for (long r = 1; r < n; r++)
        memcpy(prompts + r * in_len, prompts, sizeof(int32_t) * (size_t)prefix);
    for (long r = 0; file_ids && r < n; r++)
        memcpy(prompts + r * in_len, file_ids, sizeof(int32_t) * (size_t)in_len);
    free(file_ids);

    struct tp_state st = {.n = (int)n, .remaining = 0};
    pthread_mutex_init(&st.mu, NULL);
    pthread_cond_init(&st.cv, NULL);
    st.started = xcalloc((size_t)n, 1);
    st.last = xcalloc((size_t)n, sizeof(double));
    st.cap_gaps = (size_t)n * (size_t)out_len;
    st.gaps = xmalloc(sizeof(double) * st.cap_gaps);
    struct tp_req *reqs = xmalloc(sizeof *reqs * (size_t)n);
    struct sampling_params sp;
    sampling_params_default(&sp);
    sp.temperature = (float)temperature;
    sp.top_p = (float)top_p;
    sp.has_seed = 1;
    sp.seed = (uint64_t)seed;
    sp.ignore_eos = 1;
    sp.max_tokens = (int)out_len;
    int rc = 0;
    double t0 = util_now();
    pthread_mutex_lock(&st.mu);
    for (long r = 0; r < n; r++) {
        reqs[r] = (struct tp_req){&st, (int)r};
        struct engine_request q = {.prompt = prompts + r * in_len,
                                   .n_prompt = (int)in_len,
                                   .sp = sp,
                                   .on_event = tp_event,
                                   .user = &reqs[r]};
        q.sp.seed = (uint64_t)seed + (uint64_t)r; /* each request its own draws */
        if (!engine_submit(en, &q, &e)) {
            fprintf(stderr, "pagoda bench throughput: %s\n", e.msg);
            rc = 1;
            break;
        }
        st.remaining++;
        /* With a shared prefix, the first request computes (and caches) it before the
         * others arrive, as in a server that already holds a system prompt. */
        if (r == 0 && prefix >= engine_block_size(en))
            while (!st.started[0] && st.remaining > 0) pthread_cond_wait(&st.cv, &st.mu);
    }
    while (st.remaining > 0) pthread_cond_wait(&st.cv, &st.mu);
    pthread_mutex_unlock(&st.mu);
    double t1 = util_now(), el = t1 - t0;
    struct engine_stats es;
    engine_stats(en, &es);
    engine_destroy(en);

    if (rc == 0) {
        double out_tok = (double)st.tokens, in_tok = (double)n * (double)in_len;
        double dec_t = t1 - st.t_all_first;
        double dec_rate = dec_t > 0 ? (double)(st.tokens - st.tokens_at_all_first) / dec_t : 0;
        /* Steady state: from the first request's end (the running set full and turning
         * over) to the last request's first token (from there on the set drains); 0 when
         * every request ran at once. */
        double ss_t = st.finished && st.t_first_finish < st.t_all_first
                          ? st.t_all_first - st.t_first_finish
                          : 0;
        double ss_rate =
            ss_t > 0 ? (double)(st.tokens_at_all_first - st.tokens_at_first_finish) / ss_t : 0;
        qsort(st.gaps, st.n_gaps, sizeof(double), cmp_double);
        double itl50 = pct_ms(st.gaps, st.n_gaps, 0.5), itl90 = pct_ms(st.gaps, st.n_gaps, 0.9),
               itl99 = pct_ms(st.gaps, st.n_gaps, 0.99);
        double steps = es.steps ? (double)es.steps : 1;
        double pred_err = es.steps_predicted && es.step_measured_sum > 0
                              ? es.step_error_sum / es.step_measured_sum
                              : 0;
        int sm = cfg.spec.method;
        /* tokens one verification gives: the accepted drafts and the target's own */
        double mean_len = es.spec_drafts[sm] ? 1.0 + (double)es.spec_accepted_tokens[sm] /
                                                         (double)es.spec_drafts[sm]
                                             : 0.0;
        double hit = es.prefix_query_tokens
                         ? (double)es.prefix_hit_tokens / (double)es.prefix_query_tokens
                         : 0;
        if (json) {
            printf("{\"num_prompts\": %ld, \"input_len\": %ld, \"output_len\": %ld, "
                   "\"prefix_len\": %ld, \"temperature\": %g, \"top_p\": %g, "
                   "\"output_tokens\": %llu, \"elapsed_s\": %.3f, \"requests_per_s\": %.3f, "
                   "\"output_tokens_per_s\": %.2f, \"total_tokens_per_s\": %.2f, "
                   "\"decode_tokens_per_s\": %.2f, \"prefix_hit_rate\": %.4f, "
                   "\"preemptions\": %llu, \"steps\": %llu, \"steps_overlapped\": %llu, "
                   "\"spec_method\": \"%s\", \"spec_draft_tokens\": %llu, "
                   "\"spec_accepted_tokens\": %llu, \"spec_mean_acceptance_length\": %.3f, "
                   "\"steady_output_tokens_per_s\": %.2f, \"itl_ms_p50\": %.3f, "
                   "\"itl_ms_p90\": %.3f, \"itl_ms_p99\": %.3f, \"decode_rows_per_step\": %.2f, "
                   "\"prefill_tokens_per_step\": %.2f, \"steps_time_capped\": %llu, "
                   "\"step_model_error\": %.4f}\n",
                   n, in_len, out_len, prefix, temperature, top_p, (unsigned long long)st.tokens,
                   el, (double)n / el, out_tok / el, (in_tok + out_tok) / el, dec_rate, hit,
                   (unsigned long long)es.preemptions, (unsigned long long)es.steps,
                   (unsigned long long)es.steps_overlapped, spec_method_name(cfg.spec.method),
                   (unsigned long long)es.spec_draft_tokens[sm],
                   (unsigned long long)es.spec_accepted_tokens[sm], mean_len, ss_rate, itl50, itl90,
                   itl99, (double)es.step_decode_rows / steps,
                   (double)es.step_prefill_tokens / steps, (unsigned long long)es.steps_time_capped,
                   pred_err);
        } else {
            printf("requests          %ld x (%ld in + %ld out, %ld shared), %s\n", n, in_len,
                   out_len, prefix, temperature > 0 ? "sampled" : "greedy");
            printf("elapsed           %.2f s over %llu steps (%llu overlapped)\n", el,
                   (unsigned long long)es.steps, (unsigned long long)es.steps_overlapped);
            printf("requests/s        %.3f\n", (double)n / el);
            printf("output tokens/s   %.2f\n", out_tok / el);
            printf("total tokens/s    %.2f\n", (in_tok + out_tok) / el);
            printf("decode tokens/s   %.2f (once every request had its first token)\n", dec_rate);
            printf("steady tokens/s   %.2f output (first finish to last first token, %.2f s)\n",
                   ss_rate, ss_t);
            printf("inter-token ms    p50 %.2f, p90 %.2f, p99 %.2f\n", itl50, itl90, itl99);
            printf("step mix          %.1f decode rows + %.1f prefill tokens a step (%llu steps "
                   "capped by --max-step-ms)\n",
                   (double)es.step_decode_rows / steps, (double)es.step_prefill_tokens / steps,
                   (unsigned long long)es.steps_time_capped);
            if (es.steps_predicted)
                printf("step model        %.2f + %.3f/row ms, %.3g ms/key; mean |error| %.1f%% of "
                       "%llu steps\n",
                       1e3 * es.cost_a, 1e3 * es.cost_b, 1e3 * es.cost_c, 100 * pred_err,
                       (unsigned long long)es.steps_predicted);
            printf("prefix hit rate   %.1f%% (%llu of %llu prompt tokens)\n", 100 * hit,
                   (unsigned long long)es.prefix_hit_tokens,
                   (unsigned long long)es.prefix_query_tokens);
            printf("preemptions       %llu\n", (unsigned long long)es.preemptions);
            if (sm) {
                printf("speculative       %s: %llu of %llu drafts accepted (%.1f%%), %.2f tokens a "
                       "verification\n",
                       spec_method_name(cfg.spec.method),
                       (unsigned long long)es.spec_accepted_tokens[sm],
                       (unsigned long long)es.spec_draft_tokens[sm],
                       es.spec_draft_tokens[sm] ? 100.0 * (double)es.spec_accepted_tokens[sm] /
                                                      (double)es.spec_draft_tokens[sm]
                                                : 0.0,
                       mean_len);
                printf("accepted drafts  ");
                for (int a = 0; a <= SPEC_MAX_TOKENS; a++)
                    if (es.spec_accept_hist[sm][a])
                        printf(" %d:%llu", a, (unsigned long long)es.spec_accept_hist[sm][a]);
                printf("  (verifications by drafts accepted)\n");
            }
        }
    }
    pthread_mutex_destroy(&st.mu);
    pthread_cond_destroy(&st.cv);
    free(st.started);
    free(st.last);
    free(st.gaps);
    free(reqs);
    free(prompts);
    return rc;
}
