/*
 * tokenize / detokenize subcommands and `pagoda bench tokenize`.
 *
 *   pagoda tokenize --model DIR (--text T | --text-file F) [--no-special] [--json]
 *   pagoda detokenize --model DIR --ids "1 2 3" [--skip-special]
 *   pagoda bench tokenize --model DIR --text-file F [--min-seconds S]
 *
 * Exit status: 0 ok, 1 bad input (missing file, bad UTF-8, unknown ids), 2 usage errors.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/util.h"
#include "text/tokenizer.h"

static int usage_tokenize(FILE *f)
{
    fprintf(f, "usage: pagoda tokenize --model DIR (--text T | --text-file F) [--no-special] "
               "[--json]\n"
               "  --model DIR      folder holding tokenizer.json (+ tokenizer_config.json)\n"
               "  --text T         the text to encode\n"
               "  --text-file F    read the text from file F\n"
               "  --no-special     do not add the post-processor's tokens (BOS...)\n"
               "  --json           print {\"ids\": [...]} instead of space-separated ids\n");
    return 2;
}

static int usage_detokenize(FILE *f)
{
    fprintf(f, "usage: pagoda detokenize --model DIR --ids \"1 2 3\" [--skip-special]\n"
               "  prints the decoded text exactly (no newline is added)\n");
    return 2;
}

static int usage_bench(FILE *f)
{
    fprintf(f, "usage: pagoda bench tokenize --model DIR --text-file F [--min-seconds S]\n"
               "  encodes F repeatedly on one thread for at least S seconds (default 2)\n"
               "  and reports the best run in MB/s (10^6 bytes) and tokens/s\n");
    return 2;
}

/* Returns the value after argv[*i] or NULL (a usage error) when it is missing. */
static const char *value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        fprintf(stderr, "pagoda: option %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static struct tok *load(const char *cmd, const char *dir)
{
    struct err e = {0};
    struct tok *t = tok_load(dir, &e);
    if (!t) fprintf(stderr, "pagoda %s: %s\n", cmd, e.msg);
    return t;
}

int cli_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL;
    int special = 1, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) {
            if (!(model = value(argc, argv, &i))) return usage_tokenize(stderr);
        } else if (!strcmp(a, "--text")) {
            if (!(text = value(argc, argv, &i))) return usage_tokenize(stderr);
        } else if (!strcmp(a, "--text-file")) {
            if (!(file = value(argc, argv, &i))) return usage_tokenize(stderr);
        } else if (!strcmp(a, "--no-special")) {
            special = 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_tokenize(stdout);
            return 0;
        } else {
            fprintf(stderr, "pagoda tokenize: unknown option '%s'\n", a);
            return usage_tokenize(stderr);
        }
    }
    if (!model || (!text) == (!file)) return usage_tokenize(stderr);
    char *buf = NULL;
    size_t len;
    if (file) {
        struct err e = {0};
        buf = util_read_file(file, &len, &e);
        if (!buf) {
            fprintf(stderr, "pagoda tokenize: %s\n", e.msg);
            return 1;
        }
        text = buf;
    } else {
        len = strlen(text);
    }
    struct tok *t = load("tokenize", model);
    if (!t) {
        free(buf);
        return 1;
    }
    int32_t *ids;
    size_t n;
    struct err e = {0};
    int rc = tok_encode(t, text, len, special, &ids, &n, &e);
    free(buf);
    tok_destroy(t);
    if (rc != 0) {
        fprintf(stderr, "pagoda tokenize: %s\n", e.msg);
        return 1;
    }
    if (json) fputs("{\"ids\": [", stdout);
    for (size_t i = 0; i < n; i++) printf(json && i ? ", %d" : i ? " %d" : "%d", ids[i]);
    fputs(json ? "]}\n" : "\n", stdout);
    free(ids);
    return 0;
}

/* Parses "1 2 3" (spaces, tabs, newlines or commas between ids). -1 with a message on error. */
static int parse_ids(const char *s, int32_t vocab, int32_t **out, size_t *n)
{
    size_t cap = 16;
    *out = xmalloc(cap * sizeof(int32_t));
    *n = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',') p++;
        if (!*p) return 0;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || (*end && !strchr(" \t\n\r,", *end))) {
            fprintf(stderr, "pagoda detokenize: --ids: '%.20s' is not a token id\n", p);
            return -1;
        }
        if (v < 0 || v >= vocab) {
            fprintf(stderr, "pagoda detokenize: token id %ld is out of range (vocabulary: %d)\n", v,
                    vocab);
            return -1;
        }
        if (*n == cap) *out = xrealloc(*out, (cap *= 2) * sizeof(int32_t));
        (*out)[(*n)++] = (int32_t)v;
        p = end;
    }
}

int cli_detokenize(int argc, char **argv)
{
    const char *model = NULL, *idstr = NULL;
    int skip = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) {
            if (!(model = value(argc, argv, &i))) return usage_detokenize(stderr);
        } else if (!strcmp(a, "--ids")) {
            if (!(idstr = value(argc, argv, &i))) return usage_detokenize(stderr);
        } else if (!strcmp(a, "--skip-special")) {
            skip = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_detokenize(stdout);
            return 0;
        } else {
            fprintf(stderr, "pagoda detokenize: unknown option '%s'\n", a);
            return usage_detokenize(stderr);
        }
    }
    if (!model || !idstr) return usage_detokenize(stderr);
    struct tok *t = load("detokenize", model);
    if (!t) return 1;
    int32_t *ids;
    size_t n;
    if (parse_ids(idstr, tok_vocab_size(t), &ids, &n) != 0) {
        free(ids);
        tok_destroy(t);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        if (!tok_id_to_token(t, ids[i])) {
            fprintf(stderr, "pagoda detokenize: token id %d is not in the vocabulary\n", ids[i]);
            free(ids);
            tok_destroy(t);
            return 1;
        }
    size_t len;
    char *s = tok_decode_len(t, ids, n, skip, &len);
    fwrite(s, 1, len, stdout);
    free(s);
    free(ids);
    tok_destroy(t);
    return 0;
}

int cli_bench_tokenize(int argc, char **argv)
{
    const char *model = NULL, *file = NULL;
    double min_s = 2.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--model")) {
            if (!(model = value(argc, argv, &i))) return usage_bench(stderr);
        } else if (!strcmp(a, "--text-file")) {
            if (!(file = value(argc, argv, &i))) return usage_bench(stderr);
        } else if (!strcmp(a, "--min-seconds")) {
            if (!(v = value(argc, argv, &i))) return usage_bench(stderr);
            min_s = atof(v);
            if (!(min_s >= 0 && min_s <= 3600)) return usage_bench(stderr);
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_bench(stdout);
            return 0;
        } else {
            fprintf(stderr, "pagoda bench tokenize: unknown option '%s'\n", a);
            return usage_bench(stderr);
        }
    }
    if (!model || !file) return usage_bench(stderr);
    struct err e = {0};
    size_t len;
    char *text = util_read_file(file, &len, &e);
    if (!text) {
        fprintf(stderr, "pagoda bench tokenize: %s\n", e.msg);
        return 1;
    }
    double t0 = util_now();
    struct tok *t = load("bench tokenize", model);
    if (!t) {
        free(text);
        return 1;
    }
    double load_s = util_now() - t0, best = 1e30, total = 0;
    size_t ntok = 0;
    int runs = 0;
    while (runs < 3 || total < min_s) {
        int32_t *ids;
        double s = util_now();
        if (tok_encode(t, text, len, 0, &ids, &ntok, &e) != 0) {
            fprintf(stderr, "pagoda bench tokenize: %s\n", e.msg);
            free(text);
            tok_destroy(t);
            return 1;
        }
        double d = util_now() - s;
        free(ids);
        total += d;
        if (d < best) best = d;
        runs++;
    }
    printf("bench tokenize: %s, %zu bytes -> %zu tokens\n", file, len, ntok);
    printf("  load %.0f ms; encode best of %d runs: %.1f ms = %.2f MB/s, %.0f tokens/s "
           "(1 thread)\n",
           load_s * 1e3, runs, best * 1e3, (double)len / 1e6 / best, (double)ntok / best);
    free(text);
    tok_destroy(t);
    return 0;
}
