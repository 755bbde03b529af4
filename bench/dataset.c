/* Benchmark prompt sources: see dataset.h. */
#include "bench/dataset.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "text/tokenizer.h"

uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double rng_uniform(struct rng *r)
{
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static double rng_normal(struct rng *r)
{
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

double rng_gamma(struct rng *r, double shape, double scale)
{
    if (shape < 1.0) { /* boost: Gamma(a) = Gamma(a + 1) * U^(1/a) */
        double u = rng_uniform(r);
        return rng_gamma(r, shape + 1.0, scale) * pow(u > 0 ? u : 1e-300, 1.0 / shape);
    }
    double d = shape - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x = rng_normal(r), v = 1.0 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        double u = rng_uniform(r);
        if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
        if (log(u > 0 ? u : 1e-300) < 0.5 * x * x + d * (1.0 - v + log(v))) return d * v * scale;
    }
}

int dataset_kind_parse(const char *s, enum dataset_kind *k, struct err *e)
{
    if (!strcmp(s, "random"))
        *k = DS_RANDOM;
    else if (!strcmp(s, "sharegpt"))
        *k = DS_SHAREGPT;
    else if (!strcmp(s, "prefix-repetition"))
        *k = DS_PREFIX;
    else if (!strcmp(s, "jsonl"))
        *k = DS_JSONL;
    else if (!strcmp(s, "multi-turn"))
        *k = DS_MULTITURN;
    else if (!strcmp(s, "trace"))
        *k = DS_TRACE;
    else
        return err_set(e,
                       "--dataset %s: expected random, sharegpt, prefix-repetition, jsonl, "
                       "multi-turn or trace",
                       s);
    return 0;
}

void dataset_free(struct dataset *ds)
{
    for (int i = 0; i < ds->n; i++) {
        free(ds->p[i].text);
        free(ds->p[i].ids);
    }
    free(ds->p);
    ds->p = NULL;
    ds->n = 0;
}

/* Common English words: with a leading space each is one token in the usual BPE vocabularies. */
static const char *const words[] = {
    "the",   "of",     "and",   "to",    "in",     "is",    "that",  "it",     "was",  "for",
    "on",    "are",    "as",    "with",  "his",    "they",  "at",    "be",     "this", "from",
    "have",  "or",     "by",    "one",   "had",    "not",   "but",   "what",   "all",  "were",
    "when",  "we",     "there", "can",   "an",     "your",  "which", "their",  "said", "if",
    "do",    "will",   "each",  "about", "how",    "up",    "out",   "them",   "then", "she",
    "many",  "some",   "so",    "these", "would",  "other", "into",  "has",    "more", "her",
    "two",   "like",   "him",   "see",   "time",   "could", "no",    "make",   "than", "first",
    "been",  "its",    "who",   "now",   "people", "my",    "made",  "over",   "did",  "down",
    "only",  "way",    "find",  "use",   "may",    "water", "long",  "little", "very", "after",
    "words", "called", "just",  "where", "most",   "know",  "good",  "man",    "king", "light"};

/* About n tokens of words (no tokenizer): " w1 w2 ...". */
static char *word_text(struct rng *r, int n)
{
    size_t cap = (size_t)n * 8 + 16, len = 0;
    char *s = xmalloc(cap);
    s[0] = 0;
    for (int i = 0; i < n; i++) {
        const char *w = words[rng_next(r) % (sizeof words / sizeof words[0])];
        len += (size_t)snprintf(s + len, cap - len, "%s%s", i ? " " : "", w);
    }
    return s;
}

static int32_t random_id(struct rng *r, const struct tok *t, int32_t vocab)
{
    for (int tries = 0; tries < 64; tries++) {
        int32_t id = (int32_t)(rng_next(r) % (uint64_t)vocab);
        if (!t || (!tok_is_special(t, id) && tok_id_to_token(t, id))) return id;
    }
    return (int32_t)(rng_next(r) % (uint64_t)vocab);
}

/*
 * Text of exactly n tokens under t when the tokenizer allows it: random ids are decoded and
 * re-encoded (merges across the joins change the count), then trimmed or extended and tried
 * again, a few rounds at most. *got = the token count of the returned text.
 */
static char *token_text(const struct tok *t, struct rng *r, int n, int *got)
{
    int32_t vocab = tok_vocab_size(t);
    int32_t *ids = xmalloc(sizeof *ids * (size_t)(n > 0 ? n : 1));
    size_t k = 0;
    for (; k < (size_t)n; k++) ids[k] = random_id(r, t, vocab);
    char *text = NULL;
    for (int round = 0; round < 8; round++) {
        free(text);
        text = tok_decode(t, ids, k, 1);
        int32_t *re = NULL;
        size_t m = 0;
        struct err e = {{0}};
        if (tok_encode(t, text, strlen(text), 0, &re, &m, &e)) {
            free(re);
            break;
        }
        free(ids);
        ids = re;
        k = m;
        *got = (int)m;
        if (m == (size_t)n) break;
        if (m > (size_t)n) {
            k = (size_t)n;
        } else {
            ids = xrealloc(ids, sizeof *ids * (size_t)n);
            for (; k < (size_t)n; k++) ids[k] = random_id(r, t, vocab);
        }
    }
    free(ids);
    return text;
}

int dataset_count_tokens(const struct tok *t, const char *text)
{
    int32_t *ids = NULL;
    size_t n = 0;
    struct err e = {{0}};
    if (tok_encode(t, text, strlen(text), 0, &ids, &n, &e)) return -1;
    free(ids);
    return (int)n;
}

/* One prompt of n tokens: ids, tokenizer text, or words. */
void dataset_prompt_make(const struct dataset_cfg *cfg, struct rng *r, int n, struct prompt *p)
{
    if (cfg->tok) {
        p->text = token_text(cfg->tok, r, n, &p->input_len);
    } else if (cfg->token_ids) {
        p->ids = xmalloc(sizeof *p->ids * (size_t)(n > 0 ? n : 1));
        for (int i = 0; i < n; i++) p->ids[i] = random_id(r, NULL, cfg->vocab_size);
        p->n_ids = n;
        p->input_len = n;
    } else {
        p->text = word_text(r, n);
        p->input_len = -1;
    }
}

static int len_in_range(struct rng *r, int len, double ratio)
{
    int lo = (int)floor(len * (1.0 - ratio)), hi = (int)ceil(len * (1.0 + ratio));
    if (lo < 1) lo = 1;
    if (hi < lo) hi = lo;
    return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1));
}

static int build_random(const struct dataset_cfg *cfg, struct rng *r, struct dataset *ds)
{
    ds->p = xcalloc((size_t)cfg->num, sizeof *ds->p);
    for (int i = 0; i < cfg->num; i++) {
        int in = len_in_range(r, cfg->input_len, cfg->range_ratio);
        dataset_prompt_make(cfg, r, in, &ds->p[i]);
        ds->p[i].output_len = len_in_range(r, cfg->output_len, cfg->range_ratio);
        ds->n++;
    }
    return 0;
}

/* Joins two prompt texts; words need a space between them, tokenizer text is joined as is. */
static char *concat(const char *a, const char *b, int space)
{
    size_t la = strlen(a), lb = strlen(b), k = la;
    char *s = xmalloc(la + lb + 2);
    memcpy(s, a, la);
    if (space && la && lb) s[k++] = ' ';
    memcpy(s + k, b, lb + 1);
    return s;
}

static int build_prefix(const struct dataset_cfg *cfg, struct rng *r, struct dataset *ds,
                        struct err *e)
{
    if (cfg->num_prefixes < 1) return err_set(e, "--num-prefixes must be at least 1");
    struct prompt *pre = xcalloc((size_t)cfg->num_prefixes, sizeof *pre);
    for (int i = 0; i < cfg->num_prefixes; i++)
        dataset_prompt_make(cfg, r, cfg->prefix_len, &pre[i]);
    ds->p = xcalloc((size_t)cfg->num, sizeof *ds->p);
    for (int i = 0; i < cfg->num; i++) {
        struct prompt suf = {0}, *p = &ds->p[i];
        const struct prompt *pf = &pre[i % cfg->num_prefixes];
        dataset_prompt_make(cfg, r, cfg->suffix_len, &suf);
        if (pf->ids) {
            p->n_ids = pf->n_ids + suf.n_ids;
            p->ids = xmalloc(sizeof *p->ids * (size_t)(p->n_ids ? p->n_ids : 1));
            memcpy(p->ids, pf->ids, sizeof *p->ids * (size_t)pf->n_ids);
            memcpy(p->ids + pf->n_ids, suf.ids, sizeof *p->ids * (size_t)suf.n_ids);
            p->input_len = p->n_ids;
        } else {
            p->text = concat(pf->text, suf.text, !cfg->tok);
            p->input_len = cfg->tok ? dataset_count_tokens(cfg->tok, p->text) : -1;
        }
        p->output_len = cfg->output_len;
        free(suf.text);
        free(suf.ids);
        ds->n++;
    }
    /* shuffle so that requests sharing a prefix do not arrive back to back */
    for (int i = ds->n - 1; i > 0; i--) {
        int j = (int)(rng_next(r) % (uint64_t)(i + 1));
        struct prompt t = ds->p[i];
        ds->p[i] = ds->p[j];
        ds->p[j] = t;
    }
    for (int i = 0; i < cfg->num_prefixes; i++) {
        free(pre[i].text);
        free(pre[i].ids);
    }
    free(pre);
    return 0;
}

static const char *turn_text(const cJSON *turn)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(turn, "value");
    if (!cJSON_IsString(v)) v = cJSON_GetObjectItemCaseSensitive(turn, "content");
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int build_sharegpt(const struct dataset_cfg *cfg, struct rng *r, struct dataset *ds,
                          struct err *e)
{
    char *text = util_read_file(cfg->path, NULL, e);
    if (!text) return -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return err_set(e, "%s: not a JSON array of ShareGPT conversations", cfg->path);
    }
    int total = cJSON_GetArraySize(root);
    const cJSON **items = xmalloc(sizeof *items * (size_t)(total ? total : 1));
    int n = 0;
    for (const cJSON *it = root->child; it; it = it->next) items[n++] = it;
    for (int i = n - 1; i > 0; i--) { /* seeded shuffle, then take the first usable ones */
        int j = (int)(rng_next(r) % (uint64_t)(i + 1));
        const cJSON *t = items[i];
        items[i] = items[j];
        items[j] = t;
    }
    ds->p = xcalloc((size_t)cfg->num, sizeof *ds->p);
    for (int i = 0; i < n && ds->n < cfg->num; i++) {
        const cJSON *conv = cJSON_GetObjectItemCaseSensitive(items[i], "conversations");
        if (!conv) conv = cJSON_GetObjectItemCaseSensitive(items[i], "conversation");
        if (cJSON_GetArraySize(conv) < 2) continue;
        const char *q = turn_text(cJSON_GetArrayItem(conv, 0));
        const char *a = turn_text(cJSON_GetArrayItem(conv, 1));
        if (!q || !a || !q[0]) continue;
        int in = -1, out;
        if (cfg->tok) {
            in = dataset_count_tokens(cfg->tok, q);
            out = cfg->output_len > 0 ? cfg->output_len : dataset_count_tokens(cfg->tok, a);
            /* the filter of vLLM's benchmark: skip tiny and over-long pairs */
            if (in < 4 || out < 4 || in > 1024 || in + out > 2048) continue;
        } else {
            size_t al = strlen(a) / 4; /* about 4 bytes per token of English text */
            out = cfg->output_len > 0 ? cfg->output_len : (int)(al < 4 ? 4 : al > 2048 ? 2048 : al);
        }
        struct prompt *p = &ds->p[ds->n++];
        p->text = xstrdup(q);
        p->input_len = in;
        p->output_len = out;
    }
    free(items);
    cJSON_Delete(root);
    if (!ds->n)
        return err_set(e, "%s: no usable conversation (a human turn and a reply)", cfg->path);
    return 0;
}

static int build_jsonl(const struct dataset_cfg *cfg, struct dataset *ds, struct err *e)
{
    char *text = util_read_file(cfg->path, NULL, e);
    if (!text) return -1;
    ds->p = xcalloc((size_t)cfg->num, sizeof *ds->p);
    int lineno = 0;
    for (char *line = text; line && *line && ds->n < cfg->num;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = 0;
        if (len) {
            char *prompt = NULL;
            int out = cfg->output_len;
            cJSON *j = (line[0] == '{' || line[0] == '"') ? cJSON_Parse(line) : NULL;
            if (cJSON_IsString(j)) {
                prompt = xstrdup(j->valuestring);
            } else if (cJSON_IsObject(j)) {
                const cJSON *pr = cJSON_GetObjectItemCaseSensitive(j, "prompt");
                if (!cJSON_IsString(pr)) pr = cJSON_GetObjectItemCaseSensitive(j, "text");
                if (!cJSON_IsString(pr)) {
                    cJSON_Delete(j);
                    free(text);
                    return err_set(e, "%s:%d: an object line needs a string \"prompt\"", cfg->path,
                                   lineno);
                }
                prompt = xstrdup(pr->valuestring);
                const cJSON *o = cJSON_GetObjectItemCaseSensitive(j, "output_len");
                if (!cJSON_IsNumber(o)) o = cJSON_GetObjectItemCaseSensitive(j, "max_tokens");
                if (cJSON_IsNumber(o) && cfg->output_len <= 0) out = o->valueint;
            } else {
                prompt = xstrdup(line); /* a plain text line */
            }
            cJSON_Delete(j);
            if (out <= 0) out = 128;
            struct prompt *p = &ds->p[ds->n++];
            p->text = prompt;
            p->input_len = cfg->tok ? dataset_count_tokens(cfg->tok, prompt) : -1;
            p->output_len = out;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    if (!ds->n) return err_set(e, "%s: no prompt lines", cfg->path);
    return 0;
}

int dataset_build(const struct dataset_cfg *cfg, struct dataset *ds, struct err *e)
{
    if (cfg->kind == DS_MULTITURN) return err_set(e, "multi-turn prompts are built turn by turn");
    if (cfg->kind == DS_TRACE) return err_set(e, "trace prompts are built by trace_build");
    memset(ds, 0, sizeof *ds);
    struct rng r = {cfg->seed * 0x2545F4914F6CDD1Dull + 1};
    if (cfg->num < 1) return err_set(e, "the dataset needs at least one prompt");
    int rc;
    switch (cfg->kind) {
    case DS_RANDOM:
        if (cfg->input_len < 1 || cfg->output_len < 1)
            return err_set(e, "--input-len and --output-len must be at least 1");
        if (cfg->range_ratio < 0 || cfg->range_ratio >= 1)
            return err_set(e, "--range-ratio must be in [0, 1)");
        rc = build_random(cfg, &r, ds);
        break;
    case DS_PREFIX:
        if (cfg->prefix_len < 0 || cfg->suffix_len < 1 || cfg->output_len < 1)
            return err_set(e, "prefix-repetition needs --prefix-len >= 0, --suffix-len >= 1 "
                              "and --output-len >= 1");
        rc = build_prefix(cfg, &r, ds, e);
        break;
    case DS_SHAREGPT:
    case DS_JSONL:
        if (!cfg->path)
            return err_set(e, "--dataset %s needs --dataset-path FILE",
                           cfg->kind == DS_SHAREGPT ? "sharegpt" : "jsonl");
        rc = cfg->kind == DS_SHAREGPT ? build_sharegpt(cfg, &r, ds, e) : build_jsonl(cfg, ds, e);
        break;
    default:
        return err_set(e, "unknown dataset kind");
    }
    if (rc) dataset_free(ds);
    return rc;
}
