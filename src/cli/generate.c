/* generate and score: one sequence through the model, greedy or sampled. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "common/util.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

/* Prompt tokens per forward step (longer prompts are prefilled in chunks). */
#define PREFILL_CHUNK 512

static void usage_generate(FILE *f)
{
    fprintf(f, "usage: pagoda generate --model DIR (--prompt TEXT | --prompt-ids \"1 2 3\")\n"
               "         [-n N] [--temperature T] [--seed S] [--ignore-eos]\n"
               "         [--top-logprobs K] [--json] [--threads N]\n"
               "  -n N              tokens to generate (default 32)\n"
               "  --temperature T   0 is greedy (default 0.8)\n"
               "  --seed S          sampling seed (default: from the clock)\n"
               "  --ignore-eos      do not stop at the end-of-sequence token\n"
               "  --top-logprobs K  alternatives reported per step with --json (default 5)\n"
               "  --json            one JSON object: prompt_ids, ids, logprobs, top_logprobs\n"
               "  --threads N       compute threads (default: one per core)\n"
               "  --device D        cpu, cuda or cuda:N (default: cuda when a GPU is present)\n");
}

static void print_ids(const char *key, const int32_t *ids, size_t n)
{
    printf("\"%s\": [", key);
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
    printf("]");
}

int cli_generate(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *prompt_ids = NULL, *device = NULL;
    long n_gen = 32, top_k = 5, threads = 0, seed = -1;
    double temperature = 0.8;
    int json = 0, ignore_eos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_generate(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--ignore-eos")) {
            ignore_eos = 1;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--prompt") || !strcmp(a, "--prompt-ids") ||
                   !strcmp(a, "-n") || !strcmp(a, "--temperature") || !strcmp(a, "--seed") ||
                   !strcmp(a, "--top-logprobs") || !strcmp(a, "--threads") ||
                   !strcmp(a, "--device")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "--model"))
                dir = v;
            else if (!strcmp(a, "--device"))
                device = v;
            else if (!strcmp(a, "--prompt"))
                prompt = v;
            else if (!strcmp(a, "--prompt-ids"))
                prompt_ids = v;
            else if (!strcmp(a, "-n") && arg_int(a, v, 0, 1 << 24, &n_gen))
                return 2;
            else if (!strcmp(a, "--temperature") && arg_float(a, v, &temperature))
                return 2;
            else if (!strcmp(a, "--seed") && arg_int(a, v, 0, 0x7fffffffffffffffL, &seed))
                return 2;
            else if (!strcmp(a, "--top-logprobs") && arg_int(a, v, 0, 20, &top_k))
                return 2;
            else if (!strcmp(a, "--threads") && arg_int(a, v, 1, 1024, &threads))
                return 2;
        } else {
            fprintf(stderr, "pagoda generate: unknown option '%s'\n", a);
            usage_generate(stderr);
            return 2;
        }
    }
    if (!dir || (!prompt == !prompt_ids)) {
        fprintf(stderr,
                "pagoda generate: --model and one of --prompt or --prompt-ids are required\n");
        usage_generate(stderr);
        return 2;
    }
    if (temperature < 0) {
        fprintf(stderr, "pagoda generate: --temperature must be >= 0\n");
        return 2;
    }

    struct err e = {0};
    struct tok *tok = tok_load(dir, &e);
    int32_t *ids = NULL;
    size_t n_prompt = 0;
    if (prompt) {
        if (!tok) {
            fprintf(stderr, "pagoda generate: --prompt needs a tokenizer: %s\n", e.msg);
            return 1;
        }
        if (tok_encode(tok, prompt, strlen(prompt), 1, &ids, &n_prompt, &e)) {
            fprintf(stderr, "pagoda generate: %s\n", e.msg);
            tok_destroy(tok);
            return 1;
        }
    } else if (arg_ids(prompt_ids, &ids, &n_prompt)) {
        tok_destroy(tok);
        return 2;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "pagoda generate: the prompt is empty\n");
        free(ids);
        tok_destroy(tok);
        return 2;
    }

    struct runner r;
    int max_ctx = (int)(n_prompt + (size_t)n_gen + 1);
    int chunk = n_prompt < PREFILL_CHUNK ? (int)n_prompt : PREFILL_CHUNK;
    if (runner_open(&r, dir, device, (int)threads, 1, max_ctx, chunk, 1)) {
        free(ids);
        tok_destroy(tok);
        return 1;
    }
    const struct model_config *c = &r.m->cfg;
    int rc = 0;
    for (size_t i = 0; i < n_prompt; i++) {
        if (ids[i] < 0 || ids[i] >= c->vocab) {
            fprintf(stderr, "pagoda generate: prompt token id %d is outside the vocabulary (%d)\n",
                    ids[i], c->vocab);
            rc = 2;
            goto out;
        }
    }
    if (max_ctx - 1 > c->max_pos)
        fprintf(stderr, "pagoda generate: warning: %d tokens exceed the model's context of %d\n",
                max_ctx - 1, c->max_pos);

    struct rng rng;
    rng_seed(&rng, seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ (uint64_t)clock());
    int32_t *out = xmalloc(sizeof(int32_t) * (size_t)(n_gen ? n_gen : 1));
    float *lps = xmalloc(sizeof(float) * (size_t)(n_gen ? n_gen : 1));
    struct token_logprob *tops =
        xmalloc(sizeof *tops * (size_t)(n_gen ? n_gen : 1) * (size_t)(top_k ? top_k : 1));
    int n_out = 0;
    for (size_t p = 0; p < n_prompt; p += (size_t)chunk) {
        int cnt = (int)(n_prompt - p < (size_t)chunk ? n_prompt - p : (size_t)chunk);
        const int32_t *tp = ids + p;
        int all = 0;
        runner_step(&r, 1, NULL, &tp, &cnt, &all);
    }
    struct tok_stream *ts = (!json && tok) ? tok_stream_create(tok, 1) : NULL;
    while (n_out < n_gen) {
        int32_t next = sampler_pick(r.logits, c->vocab, (float)temperature, &rng);
        out[n_out] = next;
        lps[n_out] = sampler_logprob(r.logits, c->vocab, next);
        if (top_k)
            sampler_top_logprobs(r.logits, c->vocab, (int)top_k, tops + (size_t)n_out * top_k);
        n_out++;
        if (ts) {
            char *s = tok_stream_push(ts, next);
            if (s) fputs(s, stdout), fflush(stdout);
            free(s);
        }
        int is_eos = 0;
        for (int k = 0; k < c->n_eos; k++) is_eos |= next == c->eos_ids[k];
        if ((is_eos && !ignore_eos) || n_out == n_gen) break;
        const int32_t *tp = &next;
        int one = 1, all = 0;
        runner_step(&r, 1, NULL, &tp, &one, &all);
    }
    if (json) {
        printf("{");
        print_ids("prompt_ids", ids, n_prompt);
        printf(", ");
        print_ids("ids", out, (size_t)n_out);
        printf(", \"logprobs\": [");
        for (int i = 0; i < n_out; i++) printf("%s%.6f", i ? ", " : "", lps[i]);
        printf("], \"top_logprobs\": [");
        for (int i = 0; i < n_out; i++) {
            printf("%s[", i ? ", " : "");
            for (int k = 0; k < top_k; k++) {
                const struct token_logprob *t = &tops[(size_t)i * top_k + k];
                printf("%s[%d, %.6f]", k ? ", " : "", t->id, t->logprob);
            }
            printf("]");
        }
        printf("]}\n");
    } else if (ts) {
        char *s = tok_stream_finish(ts);
        if (s) fputs(s, stdout);
        free(s);
        printf("\n");
    } else {
        for (int i = 0; i < n_out; i++) printf("%s%d", i ? " " : "", out[i]);
        printf("\n");
    }
    if (ts) tok_stream_destroy(ts);
    free(out);
    free(lps);
    free(tops);
out:
    runner_close(&r);
    free(ids);
    tok_destroy(tok);
    return rc;
}

int cli_score(int argc, char **argv)
{
    const char *dir = NULL, *prompt_ids = NULL, *device = NULL;
    long threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: pagoda score --model DIR --prompt-ids \"1 2 3\" [--json] [--threads N]\n"
                   "         [--device cpu|cuda|cuda:N]\n"
                   "  prints {\"prompt_logprobs\": [null, ...]}: log p(id[i] | id[:i])\n");
            return 0;
        } else if (!strcmp(a, "--json")) {
            /* the only output format */
        } else if (!strcmp(a, "--model") || !strcmp(a, "--prompt-ids") || !strcmp(a, "--threads") ||
                   !strcmp(a, "--device")) {
            if (!(v = arg_value(argc, argv, &i))) return 2;
            if (!strcmp(a, "--model"))
                dir = v;
            else if (!strcmp(a, "--device"))
                device = v;
            else if (!strcmp(a, "--prompt-ids"))
                prompt_ids = v;
            else if (arg_int(a, v, 1, 1024, &threads))
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
    if (runner_open(&r, dir, device, (int)threads, 1, (int)n, chunk, chunk)) {
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
