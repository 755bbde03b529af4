/*
 * bench grammar: the cost of constrained decoding per sequence-step. For each schema of a
 * built-in set (or one given), compiles it, computes its positions' token sets
 * (gram_prepare, as the server does at submit), tokenizes a valid instance with the model's
 * tokenizer and replays it token by token: the mask before each token, then the token.
 * The first replay meets every state for the first time (masks built from the token sets);
 * later replays are answered by the grammar's mask cache, as requests under a schema the
 * server has seen are. A last replay drops the masks cached by state again ("known").
 * Reports compile and token-set times and the median / p99 / max mask time of each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "common/util.h"
#include "text/grammar.h"
#include "text/grammar_impl.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *t, int n)
{
    if (n == 0) return;
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    int p99 = (int)(0.99 * (n - 1) + 0.5);
    printf("  %-6s steps %5d  median %8.1f us  p99 %9.1f us  max %9.1f us\n", what, n,
           1e6 * t[n / 2], 1e6 * t[p99], 1e6 * t[n - 1]);
}

static const char *const builtin[][3] = {
    {"person",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
     "\"integer\","
     "\"minimum\":0,\"maximum\":150},\"email\":{\"type\":\"string\",\"format\":\"email\"}},"
     "\"required\":[\"name\",\"age\",\"email\"],\"additionalProperties\":false}",
     "{\"name\": \"Ada Lovelace, Countess of Lovelace\", \"age\": 36, \"email\": "
     "\"ada@example.org\"}"},
    {"list",
     "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\",\"items\":{\"type\":"
     "\"object\","
     "\"properties\":{\"id\":{\"type\":\"integer\"},\"label\":{\"type\":\"string\"},\"done\":{"
     "\"type\":"
     "\"boolean\"}},\"required\":[\"id\",\"label\",\"done\"],\"additionalProperties\":false}}},"
     "\"required\":[\"items\"],\"additionalProperties\":false}",
     "{\"items\": [{\"id\": 1, \"label\": \"buy milk and bread at the corner shop\", \"done\": "
     "false}, "
     "{\"id\": 2, \"label\": \"write the report\", \"done\": true}, {\"id\": 3, \"label\": \"call "
     "the plumber about the kitchen sink\", \"done\": false}]}"},
    {"json_object", NULL,
     "{\"summary\": \"The meeting covered the budget, hiring plans and the product roadmap for "
     "next "
     "quarter.\", \"attendees\": [\"Ann\", \"Bo\", \"Chen\"], \"score\": 8.5, \"final\": true}"},
};

int cli_bench_grammar(int argc, char **argv)
{
    const char *dir = NULL, *schema_file = NULL, *inst_file = NULL;
    int runs = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            dir = argv[++i];
        else if (!strcmp(argv[i], "--schema") && i + 1 < argc)
            schema_file = argv[++i];
        else if (!strcmp(argv[i], "--instance") && i + 1 < argc)
            inst_file = argv[++i];
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else {
            fprintf(
                stderr,
                "usage: pagoda bench grammar --model DIR [--schema FILE --instance FILE] [--runs "
                "N]\n"
                "  DIR holds tokenizer.json; runs: replays of each instance (default 5, >= 2)\n");
            return 2;
        }
    }
    if (!dir || runs < 2 || (!schema_file != !inst_file)) {
        fprintf(
            stderr,
            "pagoda bench grammar: --model is required; --schema needs --instance; --runs >= 2\n");
        return 2;
    }
    struct err e = {0};
    struct tok *t = tok_load(dir, &e);
    if (!t) {
        fprintf(stderr, "pagoda: %s\n", e.msg);
        return 1;
    }
    int32_t V = tok_vocab_size(t), eos = tok_eos_id(t);
    double t0 = now();
    struct gram_vocab *v = gram_vocab_create(t, V, &eos, 1, NULL, &e);
    printf("vocabulary: %d tokens, trie built in %.1f ms\n", V, 1e3 * (now() - t0));
    uint32_t *mask = xmalloc(sizeof *mask * (size_t)((V + 31) / 32));
    char *sbuf = NULL, *ibuf = NULL;
    int n_sets = schema_file ? 1 : (int)(sizeof builtin / sizeof builtin[0]);
    int rc = 0;
    for (int k = 0; k < n_sets && !rc; k++) {
        const char *name = schema_file ? schema_file : builtin[k][0];
        const char *schema =
            schema_file ? (sbuf = util_read_file(schema_file, NULL, &e)) : builtin[k][1];
        const char *inst = inst_file ? (ibuf = util_read_file(inst_file, NULL, &e)) : builtin[k][2];
        if (schema_file && (!schema || !inst)) {
            fprintf(stderr, "pagoda: %s\n", e.msg);
            rc = 1;
            break;
        }
        t0 = now();
        struct gram *g =
            schema ? gram_from_json_schema(schema, strlen(schema), &e) : gram_json_object();
        double tc = now() - t0;
        if (!g) {
            fprintf(stderr, "pagoda: %s: %s\n", name, e.msg);
            rc = 1;
            break;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        tok_encode(t, inst, strlen(inst), 0, &ids, &n, &e);
        t0 = now();
        int n_pos = gram_prepare(g, v);
        double tp = now() - t0;
        printf("%s: %d rules, compiled in %.2f ms, token sets (%d entries) in %.2f ms; instance "
               "of %zu tokens\n",
               name, gram_n_rules(g), 1e3 * tc, n_pos, 1e3 * tp, n);
        double *cold = xmalloc(sizeof(double) * (n + 1)),
               *warm = xmalloc(sizeof(double) * (n + 1) * (size_t)runs),
               *fresh = xmalloc(sizeof(double) * (n + 1));
        int nc = 0, nw = 0, nf = 0;
        for (int r = 0; r <= runs && !rc; r++) {
            if (r == runs) gram_forget_states(g); /* last: states anew, positions known */
            struct gram_matcher *m = gram_matcher_create(g);
            for (size_t i = 0; i <= n; i++) {
                double a = now();
                gram_matcher_fill_mask(m, v, mask);
                double d = now() - a;
                if (r == 0)
                    cold[nc++] = d;
                else if (r < runs)
                    warm[nw++] = d;
                else
                    fresh[nf++] = d;
                int32_t id = i < n ? ids[i] : eos;
                if (!(mask[id >> 5] >> (id & 31) & 1)) {
                    fprintf(stderr, "pagoda: %s: token %zu (%d) is masked out\n", name, i, id);
                    rc = 1;
                    break;
                }
                if (i < n) gram_matcher_accept_token(m, v, id);
            }
            gram_matcher_destroy(m);
        }
        report("first", cold, nc);
        report("again", warm, nw);
        report("known", fresh, nf);
        free(cold), free(warm), free(fresh), free(ids);
        gram_unref(g);
    }
    free(sbuf), free(ibuf), free(mask);
    gram_vocab_destroy(v);
    tok_destroy(t);
    return rc;
}
