/* generate: prompts through the engine (one, or a file of many run concurrently);
 * score: prompt log-probabilities. */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "common/util.h"
#include "model/tp.h"
#include "model/config.h"
#include "model/sampler.h"
#include "text/tokenizer.h"
#include "sched/engine.h"

static void usage_generate(FILE *f)
{
    fprintf(f, "usage: pagoda generate --model DIR (--prompt TEXT | --prompt-ids \"1 2 3\" |\n"
               "                        --prompts-file F) [options]\n"
               "  -n N               tokens to generate at most (default 32)\n"
               "  --temperature T    0 is greedy (default 0.8)\n"
               "  --seed S           sampling seed (default: from the clock)\n"
               "  --ignore-eos       do not stop at the end-of-sequence token\n"
               "  --top-logprobs K   alternatives reported per step with --json (default 5)\n"
               "  --prompts-file F   one JSON object per line: {\"prompt\": TEXT} or\n"
               "                     {\"prompt_ids\": [...]}, optional max_tokens, temperature,\n"
               "                     seed; all run concurrently, results in input order\n"
               "  --json             one JSON object per prompt: prompt_ids, ids, logprobs,\n"
               "                     top_logprobs, finish_reason\n");
    fputs(arg_engine_usage, f);
}

/* One prompt's request and what came back. */
struct gen_job {
    int32_t *ids;
    size_t n_prompt;
    struct sampling_params sp;
    int32_t *out;
    float *lps;
    struct token_logprob *tops;
    int n_out, top_k;
    enum finish_reason finish;
    int done;
    struct tok_stream *ts; /* streaming text (single prompt, no --json) */
};

struct gen_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int remaining;
};

struct gen_ctx {
    struct gen_run *run;
    struct gen_job *job;
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct gen_ctx *c = user;
    struct gen_job *j = c->job;
    if (ev->kind == ENGINE_EV_TOKEN) {
        j->out[j->n_out] = ev->token;
        j->lps[j->n_out] = ev->logprob;
        for (int k = 0; k < j->top_k; k++)
            j->tops[(size_t)j->n_out * j->top_k + k] =
                k < ev->n_top ? ev->top[k] : (struct token_logprob){-1, 0};
        j->n_out++;
        if (j->ts) {
            char *s = tok_stream_push(j->ts, ev->token);
            if (s) fputs(s, stdout), fflush(stdout);
            free(s);
        }
    }
    if (ev->finish != FINISH_NONE) {
        j->finish = ev->finish;
        pthread_mutex_lock(&c->run->mu);
        j->done = 1;
        c->run->remaining--;
        pthread_cond_signal(&c->run->cv);
        pthread_mutex_unlock(&c->run->mu);
    }
}

static void print_ids(const char *key, const int32_t *ids, size_t n)
{
    printf("\"%s\": [", key);
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
    printf("]");
}

static void print_json(const struct gen_job *j)
{
    printf("{");
    print_ids("prompt_ids", j->ids, j->n_prompt);
    printf(", ");
    print_ids("ids", j->out, (size_t)j->n_out);
    printf(", \"logprobs\": [");
    for (int i = 0; i < j->n_out; i++) printf("%s%.6f", i ? ", " : "", j->lps[i]);
    printf("], \"top_logprobs\": [");
    for (int i = 0; i < j->n_out; i++) {
        printf("%s[", i ? ", " : "");
        for (int k = 0; k < j->top_k; k++) {
            const struct token_logprob *t = &j->tops[(size_t)i * j->top_k + k];
            if (t->id < 0) break;
            printf("%s[%d, %.6f]", k ? ", " : "", t->id, t->logprob);
        }
        printf("]");
    }
    printf("], \"finish_reason\": \"%s\"}\n", finish_reason_name(j->finish));
}

/* Reads the prompts file into jobs (defaults from the command line). */
static int read_prompts_file(const char *path, const struct tok *tok, const struct gen_job *dflt,
                             struct gen_job **jobs_out, int *n_out)
{
    size_t len;
    struct err re = {0};
    char *text = util_read_file(path, &len, &re);
    if (!text) {
        fprintf(stderr, "pagoda generate: %s\n", re.msg);
        return -1;
    }
    struct gen_job *jobs = NULL;
    int n = 0, cap = 0, line_no = 0, rc = 0;
    struct err e = {0};
    for (char *line = text, *nl; line && *line; line = nl) {
        nl = strchr(line, '\n');
        if (nl) *nl++ = 0;
        line_no++;
        if (strspn(line, " \t\r") == strlen(line)) continue;
        cJSON *o = cJSON_Parse(line);
        const char *bad = NULL;
        struct gen_job j = *dflt;
        j.ids = NULL;
        cJSON *p = o ? cJSON_GetObjectItemCaseSensitive(o, "prompt") : NULL;
        cJSON *pi = o ? cJSON_GetObjectItemCaseSensitive(o, "prompt_ids") : NULL;
        if (!cJSON_IsObject(o)) {
            bad = "not a JSON object";
        } else if (!p == !pi) {
            bad = "needs exactly one of \"prompt\" or \"prompt_ids\"";
        } else if (p) {
            if (!cJSON_IsString(p))
                bad = "\"prompt\" must be a string";
            else if (!tok)
                bad = "\"prompt\" needs the model's tokenizer";
            else if (tok_encode(tok, p->valuestring, strlen(p->valuestring), 1, &j.ids, &j.n_prompt,
                                &e))
                bad = e.msg;
        } else {
            int cnt = cJSON_IsArray(pi) ? cJSON_GetArraySize(pi) : -1;
            if (cnt < 0) bad = "\"prompt_ids\" must be an array of token ids";
            j.ids = xmalloc(sizeof(int32_t) * (size_t)(cnt > 0 ? cnt : 1));
            j.n_prompt = 0;
            for (cJSON *x = cnt > 0 ? pi->child : NULL; x && !bad; x = x->next) {
                if (!cJSON_IsNumber(x) || x->valuedouble != (double)(int32_t)x->valuedouble ||
                    x->valuedouble < 0)
                    bad = "\"prompt_ids\" must hold non-negative integers";
                else
                    j.ids[j.n_prompt++] = (int32_t)x->valuedouble;
            }
        }
        cJSON *mt = o ? cJSON_GetObjectItemCaseSensitive(o, "max_tokens") : NULL;
        cJSON *t = o ? cJSON_GetObjectItemCaseSensitive(o, "temperature") : NULL;
        cJSON *sd = o ? cJSON_GetObjectItemCaseSensitive(o, "seed") : NULL;
        if (!bad && mt) {
            if (!cJSON_IsNumber(mt) || mt->valuedouble < 1 || mt->valuedouble > (1 << 24))
                bad = "\"max_tokens\" must be a positive integer";
            else
                j.sp.max_tokens = (int)mt->valuedouble;
        }
        if (!bad && t) {
            if (!cJSON_IsNumber(t) || t->valuedouble < 0)
                bad = "\"temperature\" must be a number >= 0";
            else
                j.sp.temperature = (float)t->valuedouble;
        }
        if (!bad && sd) {
            if (!cJSON_IsNumber(sd) || sd->valuedouble < 0)
                bad = "\"seed\" must be a non-negative integer";
            else
                j.sp.has_seed = 1, j.sp.seed = (uint64_t)sd->valuedouble;
        }
        cJSON_Delete(o);
        if (bad) {
            fprintf(stderr, "pagoda generate: %s line %d: %s\n", path, line_no, bad);
            free(j.ids);
            rc = -1;
            break;
        }
        if (n == cap) jobs = xrealloc(jobs, sizeof *jobs * (size_t)(cap = cap ? 2 * cap : 16));
        jobs[n++] = j;
    }
    free(text);
    if (rc == 0 && n == 0) {
        fprintf(stderr, "pagoda generate: %s holds no prompt\n", path);
        rc = -1;
    }
    if (rc) {
        for (int i = 0; i < n; i++) free(jobs[i].ids);
        free(jobs);
        return -1;
    }
    *jobs_out = jobs;
    *n_out = n;
    return 0;
}

int cli_generate(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *prompt_ids = NULL, *file = NULL;
    long n_gen = 32, top_k = 5, seed = -1;
    double temperature = 0.8;
    int json = 0, ignore_eos = 0;
    struct engine_config cfg = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int eo = arg_engine_option(argc, argv, &i, &cfg);
        if (eo < 0) return 2;
        if (eo) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_generate(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = 1;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--prompt") || !strcmp(a, "--prompt-ids") ||
                   !strcmp(a, "-n") || !strcmp(a, "--temperature") || !strcmp(a, "--seed") ||
                   !strcmp(a, "--top-logprobs") || !strcmp(a, "--prompts-file")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "--model"))
                dir = v;
            else if (!strcmp(a, "--prompt"))
                prompt = v;
            else if (!strcmp(a, "--prompt-ids"))
                prompt_ids = v;
            else if (!strcmp(a, "--prompts-file"))
                file = v;
            else if (!strcmp(a, "-n") && arg_int(a, v, 0, 1 << 24, &n_gen))
                return 2;
            else if (!strcmp(a, "--temperature") && arg_float(a, v, &temperature))
                return 2;
            else if (!strcmp(a, "--seed") && arg_int(a, v, 0, 0x7fffffffffffffffL, &seed))
                return 2;
            else if (!strcmp(a, "--top-logprobs") && arg_int(a, v, 0, 20, &top_k))
                return 2;
        } else {
            fprintf(stderr, "pagoda generate: unknown option '%s'\n", a);
            usage_generate(stderr);
            return 2;
        }
    }
    if (!dir || (!!prompt + !!prompt_ids + !!file) != 1) {
        fprintf(stderr, "pagoda generate: --model and one of --prompt, --prompt-ids or "
                        "--prompts-file are required\n");
        usage_generate(stderr);
        return 2;
    }
    if (temperature < 0) {
        fprintf(stderr, "pagoda generate: --temperature must be >= 0\n");
        return 2;
    }
    if (n_gen == 0) n_gen = 1;

    struct err e = {0};
    struct tok *tok = tok_load(dir, &e);
    struct gen_job dflt = {0};
    sampling_params_default(&dflt.sp);
    dflt.sp.max_tokens = (int)n_gen;
    dflt.sp.temperature = (float)temperature;
    dflt.sp.ignore_eos = ignore_eos;
    dflt.sp.logprobs = 1;
    dflt.sp.top_logprobs = (int)top_k;
    dflt.top_k = (int)top_k;
    uint64_t base_seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ (uint64_t)clock();
    dflt.sp.has_seed = 1;
    dflt.sp.seed = base_seed;

    struct gen_job *jobs = NULL;
    int n_jobs = 0, rc = 0;
    if (file) {
        if (read_prompts_file(file, tok, &dflt, &jobs, &n_jobs)) {
            tok_destroy(tok);
            return 2;
        }
    } else {
        jobs = xcalloc(1, sizeof *jobs);
        jobs[0] = dflt;
        n_jobs = 1;
        if (prompt) {
            if (!tok) {
                fprintf(stderr, "pagoda generate: --prompt needs a tokenizer: %s\n", e.msg);
                free(jobs);
                return 1;
            }
            if (tok_encode(tok, prompt, strlen(prompt), 1, &jobs[0].ids, &jobs[0].n_prompt, &e)) {
                fprintf(stderr, "pagoda generate: %s\n", e.msg);
                free(jobs);
                tok_destroy(tok);
                return 1;
            }
        } else if (arg_ids(prompt_ids, &jobs[0].ids, &jobs[0].n_prompt)) {
            free(jobs);
            tok_destroy(tok);
            return 2;
        }
    }

    /* Longest prompt + output decides the context when --max-model-len is not given. */
    size_t need = 0;
    for (int i = 0; i < n_jobs; i++)
        if (jobs[i].n_prompt + (size_t)jobs[i].sp.max_tokens > need)
            need = jobs[i].n_prompt + (size_t)jobs[i].sp.max_tokens;
    if (!cfg.max_model_len) {
        struct model_config mc;
        if (!config_load(&mc, dir, &e)) {
            if ((long)need > mc.max_pos) {
                fprintf(stderr,
                        "pagoda generate: warning: %zu tokens exceed the model's context of %d\n",
                        need, mc.max_pos);
                cfg.max_model_len = (int)need;
            }
            config_dispose(&mc);
        }
    }
    /* A pool just big enough for these prompts unless its size was given. */
    if (!cfg.num_blocks && !cfg.kv_cache_memory) {
        int bs = cfg.block_size ? cfg.block_size : 16;
        long blocks = 0;
        for (int i = 0; i < n_jobs; i++)
            blocks += (long)(jobs[i].n_prompt + (size_t)jobs[i].sp.max_tokens + (size_t)bs) / bs;
        cfg.num_blocks = blocks > (1 << 20) ? 1 << 20 : (int)blocks;
    }
    cfg.model_dir = dir;
    struct engine *en = engine_create(&cfg, &e);
    if (!en) {
        fprintf(stderr, "pagoda generate: %s\n", e.msg);
        rc = 1;
        goto out;
    }

    struct gen_run run = {.remaining = 0};
    pthread_mutex_init(&run.mu, NULL);
    pthread_cond_init(&run.cv, NULL);
    struct gen_ctx *ctx = xcalloc((size_t)n_jobs, sizeof *ctx);
    for (int i = 0; i < n_jobs; i++) {
        struct gen_job *j = &jobs[i];
        j->out = xmalloc(sizeof(int32_t) * (size_t)j->sp.max_tokens);
        j->lps = xmalloc(sizeof(float) * (size_t)j->sp.max_tokens);
        j->tops = xmalloc(sizeof(struct token_logprob) * (size_t)j->sp.max_tokens *
                          (size_t)(j->top_k ? j->top_k : 1));
        if (n_jobs == 1 && !json && tok) j->ts = tok_stream_create(tok, 1);
        ctx[i] = (struct gen_ctx){&run, j};
    }
    pthread_mutex_lock(&run.mu);
    for (int i = 0; i < n_jobs; i++) {
        struct gen_job *j = &jobs[i];
        struct engine_request q = {.prompt = j->ids,
                                   .n_prompt = (int)j->n_prompt,
                                   .sp = j->sp,
                                   .on_event = on_event,
                                   .user = &ctx[i]};
        if (!engine_submit(en, &q, &e)) {
            fprintf(stderr, "pagoda generate: prompt %d: %s\n", i + 1, e.msg);
            rc = 2;
            break;
        }
        run.remaining++;
    }
    while (run.remaining > 0) pthread_cond_wait(&run.cv, &run.mu);
    pthread_mutex_unlock(&run.mu);

    for (int i = 0; i < n_jobs && rc == 0; i++) {
        struct gen_job *j = &jobs[i];
        if (json) {
            print_json(j);
        } else if (j->ts) {
            char *s = tok_stream_finish(j->ts);
            if (s) fputs(s, stdout);
            free(s);
            printf("\n");
        } else if (tok) {
            char *s = tok_decode(tok, j->out, (size_t)j->n_out, 1);
            for (const char *c = s ? s : ""; *c; c++) putchar(*c == '\n' ? ' ' : *c);
            putchar('\n');
            free(s);
        } else {
            for (int k = 0; k < j->n_out; k++) printf("%s%d", k ? " " : "", j->out[k]);
            printf("\n");
        }
    }
    engine_destroy(en);
    pthread_mutex_destroy(&run.mu);
    pthread_cond_destroy(&run.cv);
    free(ctx);
out:
    for (int i = 0; i < n_jobs; i++) {
        free(jobs[i].ids);
        free(jobs[i].out);
        free(jobs[i].lps);
        free(jobs[i].tops);
        if (jobs[i].ts) tok_stream_destroy(jobs[i].ts);
    }
    free(jobs);
    tok_destroy(tok);
    return rc;
}

int cli_score(int argc, char **argv)
{
    const char *dir = NULL, *prompt_ids = NULL, *device = NULL;
    long threads = 0, tp = 1;
    struct kv_spec kv = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int kr = arg_kv_option(argc, argv, &i, &kv);
        if (kr < 0) return 2;
        if (kr > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: pagoda score --model DIR --prompt-ids \"1 2 3\" [--json] [--threads N]\n"
                   "         [--device cpu|cuda|cuda:N] [--kv-cache-dtype D ...] "
                   "[--batch-invariant]\n"
                   "         [--tensor-parallel-size N] [--disable-custom-all-reduce]\n"
                   "  prints {\"prompt_logprobs\": [null, ...]}: log p(id[i] | id[:i])\n");
            return 0;
        } else if (!strcmp(a, "--json")) {
            /* the only output format */
        } else if (!strcmp(a, "--batch-invariant")) {
            backend_batch_invariant_set(1);
        } else if (!strcmp(a, "--disable-custom-all-reduce")) {
            backend_custom_all_reduce_set(0);
        } else if (!strcmp(a, "--model") || !strcmp(a, "--prompt-ids") || !strcmp(a, "--threads") ||
                   !strcmp(a, "--device") || !strcmp(a, "--tensor-parallel-size") ||
                   !strcmp(a, "-tp")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "--model"))
                dir = v;
            else if (!strcmp(a, "--device"))
                device = v;
            else if (!strcmp(a, "--prompt-ids"))
                prompt_ids = v;
            else if (!strcmp(a, "--threads") ? arg_int(a, v, 1, 1024, &threads)
                                             : arg_int(a, v, 1, TP_MAX, &tp))
                return 2;
        } else {
            fprintf(stderr, "pagoda score: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!dir || !prompt_ids) {
        fprintf(stderr, "pagoda score: --model and --prompt-ids are required\n");
        return 2;
    }
    int32_t *ids;
    size_t n;
    if (arg_ids(prompt_ids, &ids, &n)) return 2;
    if (n == 0) {
        fprintf(stderr, "pagoda score: the prompt is empty\n");
        free(ids);
        return 2;
    }
    int chunk = n < 256 ? (int)n : 256;
    struct runner r;
    if (runner_open_tp(&r, dir, device, (int)threads, (int)tp, 1, (int)n, chunk, chunk, &kv)) {
        free(ids);
        return 1;
    }
    int rc = 0, vocab = r.m->cfg.vocab;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) {
            fprintf(stderr, "pagoda score: token id %d is outside the vocabulary (%d)\n", ids[i],
                    vocab);
            rc = 2;
        }
    if (rc == 0) {
        printf("{\"prompt_logprobs\": [null");
        for (size_t p = 0; p < n; p += (size_t)chunk) {
            int cnt = (int)(n - p < (size_t)chunk ? n - p : (size_t)chunk);
            const int32_t *tp = ids + p;
            int all = 1;
            runner_step(&r, 1, NULL, &tp, &cnt, &all);
            for (int j = 0; j < cnt && p + (size_t)j + 1 < n; j++)
                printf(", %.6f", sampler_logprob(r.logits + (size_t)j * vocab, vocab,
                                                 ids[p + (size_t)j + 1]));
        }
        printf("]}\n");
    }
    runner_close(&r);
    free(ids);
    return rc;
}
