/* Trace files for replay: see trace.h. */
#include "bench/trace.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/util.h"

#define TRACE_MAX_TOKENS 100000000 /* a length above this is a corrupt field, not a request */

/* An arrival while parsing: whole seconds and the fraction apart, so that relative times of
 * wall-clock timestamps (1.7e9 s) keep their 100 ns ticks. */
struct stamp {
    int64_t sec;
    double frac;
};

const char *trace_format_name(enum trace_format f)
{
    return f == TRACE_AZURE ? "azure" : "mooncake";
}

void trace_free(struct trace *t)
{
    for (int i = 0; i < t->n; i++) free(t->r[i].hash_ids);
    free(t->r);
    t->r = NULL;
    t->n = 0;
}

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (eras of 400 years). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++, (*p)++) {
        if (!isdigit((unsigned char)**p)) return -1;
        v = v * 10 + (**p - '0');
    }
    *out = v;
    return 0;
}

/* "YYYY-MM-DD HH:MM:SS[.fraction][Z|+HH:MM|-HH:MM]" (or a T between), or plain seconds. */
static int parse_stamp(const char *s, struct stamp *st)
{
    const char *p = s;
    int y, mo, d, h, mi, se;
    if (digits(&p, 4, &y) == 0 && *p == '-') {
        p++;
        if (digits(&p, 2, &mo) || *p++ != '-' || digits(&p, 2, &d) || (*p != ' ' && *p != 'T'))
            return -1;
        p++;
        if (digits(&p, 2, &h) || *p++ != ':' || digits(&p, 2, &mi) || *p++ != ':' ||
            digits(&p, 2, &se))
            return -1;
        if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || se > 60) return -1;
        double frac = 0, scale = 0.1;
        if (*p == '.') {
            p++;
            if (!isdigit((unsigned char)*p)) return -1;
            for (; isdigit((unsigned char)*p); p++, scale /= 10) frac += (*p - '0') * scale;
        }
        int64_t off = 0;
        if (*p == 'Z') {
            p++;
        } else if (*p == '+' || *p == '-') {
            int sign = *p++ == '-' ? -1 : 1, oh, om;
            if (digits(&p, 2, &oh)) return -1;
            if (*p == ':') p++;
            if (digits(&p, 2, &om)) return -1;
            off = sign * (oh * 3600 + om * 60);
        }
        if (*p) return -1;
        st->sec = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se - off;
        st->frac = frac;
        return 0;
    }
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(x) || x < 0) return -1;
    st->sec = (int64_t)floor(x);
    st->frac = x - floor(x);
    return 0;
}

static int parse_len(const char *s, int lo, int32_t *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > TRACE_MAX_TOKENS) return -1;
    *out = (int32_t)v;
    return 0;
}

/* Splits a CSV line in place into at most max fields (trimmed, outer quotes removed). */
static int split_csv(char *line, char **f, int max)
{
    int n = 0;
    for (char *p = line;;) {
        char *c = strchr(p, ',');
        if (c) *c = 0;
        while (isspace((unsigned char)*p)) p++;
        size_t len = strlen(p);
        while (len && isspace((unsigned char)p[len - 1])) p[--len] = 0;
        if (len >= 2 && p[0] == '"' && p[len - 1] == '"') {
            p[len - 1] = 0;
            p++;
        }
        if (n < max) f[n] = p;
        n++;
        if (!c) break;
        p = c + 1;
    }
    return n;
}

struct parser {
    const char *name;
    struct trace *t;
    struct stamp *st;
    int cap;
    struct err *e;
};

static struct trace_req *push(struct parser *P, int line)
{
    if (P->t->n == P->cap) {
        P->cap = P->cap ? P->cap * 2 : 256;
        P->t->r = xrealloc(P->t->r, sizeof *P->t->r * (size_t)P->cap);
        P->st = xrealloc(P->st, sizeof *P->st * (size_t)P->cap);
    }
    struct trace_req *r = &P->t->r[P->t->n++];
    memset(r, 0, sizeof *r);
    r->line = line;
    return r;
}

#define CSV_MAX_FIELDS 64

/* Finds the three columns; *ncol = the header's fields, which every row must have. */
static int csv_header(struct parser *P, char *line, int col[3], int *ncol)
{
    static const char *const want[3] = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"};
    char *f[CSV_MAX_FIELDS];
    int n = split_csv(line, f, CSV_MAX_FIELDS);
    *ncol = n;
    if (n > CSV_MAX_FIELDS) n = CSV_MAX_FIELDS;
    for (int k = 0; k < 3; k++) {
        col[k] = -1;
        for (int i = 0; i < n; i++)
            if (!strcasecmp(f[i], want[k])) col[k] = i;
        if (col[k] < 0)
            return err_set(P->e,
                           "%s:1: not a trace: the CSV header has no %s column (expected "
                           "TIMESTAMP,ContextTokens,GeneratedTokens, or Mooncake JSON lines)",
                           P->name, want[k]);
    }
    return 0;
}

static int csv_row(struct parser *P, char *line, int lineno, const int col[3], int ncol)
{
    char *f[CSV_MAX_FIELDS];
    int n = split_csv(line, f, CSV_MAX_FIELDS);
    if (n != ncol)
        return err_set(P->e, "%s:%d: %d fields, the header has %d", P->name, lineno, n, ncol);
    struct trace_req *r = push(P, lineno);
    if (parse_stamp(f[col[0]], &P->st[P->t->n - 1]))
        return err_set(P->e,
                       "%s:%d: TIMESTAMP \"%s\": expected YYYY-MM-DD HH:MM:SS[.fraction] or "
                       "seconds",
                       P->name, lineno, f[col[0]]);
    if (parse_len(f[col[1]], 1, &r->input_len))
        return err_set(P->e, "%s:%d: ContextTokens \"%s\": expected an integer in [1, %d]", P->name,
                       lineno, f[col[1]], TRACE_MAX_TOKENS);
    if (parse_len(f[col[2]], 0, &r->output_len))
        return err_set(P->e, "%s:%d: GeneratedTokens \"%s\": expected an integer in [0, %d]",
                       P->name, lineno, f[col[2]], TRACE_MAX_TOKENS);
    return 0;
}

static int json_int(const cJSON *v, double lo, double hi, double *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo ||
        v->valuedouble > hi)
        return -1;
    *out = v->valuedouble;
    return 0;
}

static int mooncake_row(struct parser *P, const char *line, int lineno)
{
    cJSON *j = cJSON_Parse(line);
    int rc = -1;
    if (!cJSON_IsObject(j)) {
        err_set(P->e, "%s:%d: not a JSON object (Mooncake traces have one a line)", P->name,
                lineno);
        goto out;
    }
    struct trace_req *r = push(P, lineno);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(j, "timestamp");
    if (!cJSON_IsNumber(ts) || !isfinite(ts->valuedouble) || ts->valuedouble < 0) {
        err_set(P->e, "%s:%d: \"timestamp\" must be a number of milliseconds >= 0", P->name,
                lineno);
        goto out;
    }
    double ms = ts->valuedouble, in, out;
    struct stamp *st = &P->st[P->t->n - 1];
    st->sec = (int64_t)floor(ms / 1000);
    st->frac = (ms - (double)st->sec * 1000) / 1000;
    if (json_int(cJSON_GetObjectItemCaseSensitive(j, "input_length"), 1, TRACE_MAX_TOKENS, &in)) {
        err_set(P->e, "%s:%d: \"input_length\" must be an integer in [1, %d]", P->name, lineno,
                TRACE_MAX_TOKENS);
        goto out;
    }
    if (json_int(cJSON_GetObjectItemCaseSensitive(j, "output_length"), 0, TRACE_MAX_TOKENS, &out)) {
        err_set(P->e, "%s:%d: \"output_length\" must be an integer in [0, %d]", P->name, lineno,
                TRACE_MAX_TOKENS);
        goto out;
    }
    r->input_len = (int32_t)in;
    r->output_len = (int32_t)out;
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "hash_ids");
    if (h && !cJSON_IsNull(h)) {
        if (!cJSON_IsArray(h)) {
            err_set(P->e, "%s:%d: \"hash_ids\" must be an array of integers", P->name, lineno);
            goto out;
        }
        int n = cJSON_GetArraySize(h), k = 0;
        r->hash_ids = xmalloc(sizeof *r->hash_ids * (size_t)(n ? n : 1));
        for (const cJSON *it = h->child; it; it = it->next, k++) {
            double v;
            if (json_int(it, 0, 9007199254740992.0, &v)) {
                err_set(P->e, "%s:%d: hash_ids[%d] is not an integer >= 0", P->name, lineno, k);
                goto out;
            }
            r->hash_ids[k] = (int64_t)v;
        }
        r->n_hash = n;
    }
    rc = 0;
out:
    cJSON_Delete(j);
    return rc;
}

static int by_time(const void *a, const void *b)
{
    const struct trace_req *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return (x->line > y->line) - (x->line < y->line);
}

int trace_parse(const char *name, const char *text, struct trace *t, struct err *e)
{
    memset(t, 0, sizeof *t);
    char *buf = xstrdup(text);
    struct parser P = {.name = name, .t = t, .e = e};
    int lineno = 0, started = 0, col[3] = {0}, ncol = 0, rc = 0;
    for (char *line = buf; line && !rc;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        lineno++;
        size_t len = strlen(line);
        if (len && line[len - 1] == '\r') line[--len] = 0;
        const char *p = line;
        while (isspace((unsigned char)*p)) p++;
        if (*p) {
            if (!started) {
                started = 1;
                t->format = *p == '{' ? TRACE_MOONCAKE : TRACE_AZURE;
                if (t->format == TRACE_AZURE) {
                    rc = csv_header(&P, line, col, &ncol);
                    line = nl ? nl + 1 : NULL;
                    continue;
                }
            }
            rc = t->format == TRACE_AZURE ? csv_row(&P, line, lineno, col, ncol)
                                          : mooncake_row(&P, p, lineno);
        }
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    if (!rc && !t->n) rc = err_set(e, "%s: no requests in the trace", name);
    if (!rc) {
        /* times relative to the earliest request, whole seconds and fractions apart */
        int first = 0;
        for (int i = 1; i < t->n; i++)
            if (P.st[i].sec < P.st[first].sec ||
                (P.st[i].sec == P.st[first].sec && P.st[i].frac < P.st[first].frac))
                first = i;
        for (int i = 0; i < t->n; i++)
            t->r[i].t = (double)(P.st[i].sec - P.st[first].sec) + (P.st[i].frac - P.st[first].frac);
        qsort(t->r, (size_t)t->n, sizeof *t->r, by_time);
    }
    free(P.st);
    if (rc) trace_free(t);
    return rc;
}

int trace_load(const char *path, struct trace *t, struct err *e)
{
    memset(t, 0, sizeof *t);
    char *text = util_read_file(path, NULL, e);
    if (!text) return -1;
    int rc = trace_parse(path, text, t, e);
    free(text);
    return rc;
}

int trace_count(const struct trace *t, double speedup, double duration, int max)
{
    int n = t->n;
    if (duration > 0) {
        n = 0;
        while (n < t->n && t->r[n].t / speedup < duration) n++;
    }
    return max > 0 && max < n ? max : n;
}

/* A generator for the block of one hash id: the same tokens wherever the id appears. */
static struct rng block_rng(uint64_t seed, int64_t id)
{
    struct rng r = {seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)id * 0xD1B54A32D192ED03ull)};
    rng_next(&r);
    return r;
}

/* Appends piece to p: ids one after the other, texts joined (words need a space). */
static void append(struct prompt *p, struct prompt *piece, int space)
{
    if (piece->ids) {
        p->ids = xrealloc(p->ids, sizeof *p->ids * (size_t)(p->n_ids + piece->n_ids + 1));
        memcpy(p->ids + p->n_ids, piece->ids, sizeof *p->ids * (size_t)piece->n_ids);
        p->n_ids += piece->n_ids;
    } else {
        size_t la = p->text ? strlen(p->text) : 0, lb = strlen(piece->text);
        p->text = xrealloc(p->text, la + lb + 2);
        if (space && la && lb) p->text[la++] = ' ';
        memcpy(p->text + la, piece->text, lb + 1);
    }
    free(piece->ids);
    free(piece->text);
}

static void build_one(const struct trace_req *rq, int index, int blocks, int block_size,
                      const struct dataset_cfg *cfg, struct prompt *p)
{
    int in = rq->input_len, done = 0;
    int nb = blocks ? rq->n_hash : 0;
    for (int b = 0; b < nb && done < in; b++) {
        int len = in - done < block_size ? in - done : block_size;
        struct rng r = block_rng(cfg->seed, rq->hash_ids[b]);
        struct prompt piece = {0};
        dataset_prompt_make(cfg, &r, len, &piece);
        append(p, &piece, !cfg->tok);
        done += len;
    }
    if (done < in) { /* tokens no block covers: this request's own */
        struct rng r = {(cfg->seed + 1) * 0x2545F4914F6CDD1Dull ^ (uint64_t)index};
        rng_next(&r);
        struct prompt piece = {0};
        dataset_prompt_make(cfg, &r, in - done, &piece);
        append(p, &piece, !cfg->tok);
    }
    if (p->ids)
        p->input_len = p->n_ids;
    else
        p->input_len = cfg->tok ? dataset_count_tokens(cfg->tok, p->text) : -1;
}

int trace_build(const struct trace *t, int n, int extra, double speedup, int block_size,
                const struct dataset_cfg *cfg, struct dataset *ds, struct err *e)
{
    memset(ds, 0, sizeof *ds);
    if (n < 1 || n > t->n) return err_set(e, "trace: %d requests asked, the trace has %d", n, t->n);
    if (block_size < 1) return err_set(e, "--trace-block-size must be at least 1");
    if (!(speedup > 0)) return err_set(e, "--trace-speedup must be positive");
    ds->p = xcalloc((size_t)(n + extra), sizeof *ds->p);
    for (int i = 0; i < n + extra; i++) {
        const struct trace_req *rq = &t->r[i < n ? i : 0];
        struct prompt *p = &ds->p[i];
        build_one(rq, i, i < n, block_size, cfg, p);
        int out = rq->output_len > 0 ? rq->output_len : 1; /* max_tokens 0 asks for nothing */
        p->output_len = cfg->output_len > 0 ? cfg->output_len : out;
        p->arrival = i < n ? rq->t / speedup : 0;
        ds->n++;
    }
    return 0;
}
