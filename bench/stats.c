/* Benchmark statistics: see stats.h. */
#include "bench/stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

int req_output_tokens(const struct req_result *r)
{
    return r->completion_tokens >= 0 ? r->completion_tokens : r->chunks;
}

int req_input_tokens(const struct req_result *r)
{
    return r->prompt_tokens >= 0 ? r->prompt_tokens : r->input_len > 0 ? r->input_len : 0;
}

void req_result_dispose(struct req_result *r)
{
    free(r->error);
    free(r->chunk_t);
    free(r->out_ids);
    memset(r, 0, sizeof *r);
}

int slo_parse(const char *s, struct slo *slo, char *err)
{
    memset(slo, 0, sizeof *slo);
    const char *p = s;
    while (*p) {
        const char *colon = strchr(p, ':');
        if (!colon) {
            snprintf(err, 256, "--slo %s: expected NAME:MS pairs (ttft, tpot, e2e)", s);
            return -1;
        }
        char *end;
        double v = strtod(colon + 1, &end);
        if (end == colon + 1 || !(v > 0) || (*end && *end != ',')) {
            snprintf(err, 256, "--slo %s: the value after '%.*s:' must be a positive number of ms",
                     s, (int)(colon - p), p);
            return -1;
        }
        size_t nl = (size_t)(colon - p);
        if (nl == 4 && !memcmp(p, "ttft", 4))
            slo->ttft_ms = v;
        else if (nl == 4 && !memcmp(p, "tpot", 4))
            slo->tpot_ms = v;
        else if ((nl == 3 && !memcmp(p, "e2e", 3)) || (nl == 4 && !memcmp(p, "e2el", 4)))
            slo->e2e_ms = v;
        else {
            snprintf(err, 256, "--slo: unknown objective '%.*s' (ttft, tpot or e2e)", (int)nl, p);
            return -1;
        }
        p = *end ? end + 1 : end;
    }
    if (!slo->ttft_ms && !slo->tpot_ms && !slo->e2e_ms) {
        snprintf(err, 256, "--slo %s: no objective given", s);
        return -1;
    }
    return 0;
}

double stats_quantile(const double *sorted, int n, double q)
{
    if (n <= 0) return NAN;
    double pos = q * (n - 1);
    int lo = (int)floor(pos);
    if (lo >= n - 1) return sorted[n - 1];
    double f = pos - lo;
    return sorted[lo] + (sorted[lo + 1] - sorted[lo]) * f;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double tpot_of(const struct req_result *r)
{
    int out = req_output_tokens(r);
    if (out < 2 || r->ttft < 0) return -1;
    return (r->e2e - r->ttft) / (out - 1);
}

double *stats_values(const struct req_result *r, int n, enum metric m, int *count)
{
    size_t cap = 16;
    for (int i = 0; i < n; i++) cap += m == METRIC_ITL ? (size_t)r[i].n_chunk_t : 1;
    double *v = xmalloc(sizeof *v * cap);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const struct req_result *q = &r[i];
        if (!q->ok) continue;
        switch (m) {
        case METRIC_TTFT:
            if (q->ttft >= 0) v[k++] = q->ttft * 1e3;
            break;
        case METRIC_TPOT: {
            double t = tpot_of(q);
            if (t >= 0) v[k++] = t * 1e3;
            break;
        }
        case METRIC_ITL:
            for (int j = 1; j < q->n_chunk_t; j++)
                v[k++] = (q->chunk_t[j] - q->chunk_t[j - 1]) * 1e3;
            break;
        case METRIC_E2E:
            v[k++] = q->e2e * 1e3;
            break;
        }
    }
    qsort(v, (size_t)k, sizeof *v, cmp_double);
    *count = k;
    return v;
}

static void dist_of(const struct req_result *r, int n, enum metric m, struct dist *d)
{
    int k;
    double *v = stats_values(r, n, m, &k);
    memset(d, 0, sizeof *d);
    d->n = k;
    if (k) {
        double sum = 0, sq = 0;
        for (int i = 0; i < k; i++) sum += v[i];
        d->mean = sum / k;
        for (int i = 0; i < k; i++) sq += (v[i] - d->mean) * (v[i] - d->mean);
        d->std = sqrt(sq / k);
        d->median = stats_quantile(v, k, 0.5);
        d->p90 = stats_quantile(v, k, 0.9);
        d->p99 = stats_quantile(v, k, 0.99);
        d->min = v[0];
        d->max = v[k - 1];
    } else {
        d->mean = d->std = d->median = d->p90 = d->p99 = d->min = d->max = NAN;
    }
    free(v);
}

void summary_compute(const struct req_result *r, int n, double duration, const struct slo *slo,
                     struct summary *s)
{
    double load = s->load, hit = s->prefix_cache_hit_rate, sr = s->spec_acceptance_rate,
           sl = s->spec_acceptance_length;
    memset(s, 0, sizeof *s);
    s->load = load;
    s->prefix_cache_hit_rate = hit;
    s->spec_acceptance_rate = sr;
    s->spec_acceptance_length = sl;
    s->duration = duration;
    for (int i = 0; i < n; i++) {
        if (!r[i].ok) {
            s->failed++;
            continue;
        }
        s->completed++;
        s->input_tokens += req_input_tokens(&r[i]);
        s->output_tokens += req_output_tokens(&r[i]);
        if (r[i].cached_tokens >= 0) {
            s->cached_tokens += r[i].cached_tokens;
            s->cached_reported++;
        }
    }
    if (duration > 0) {
        s->request_throughput = s->completed / duration;
        s->output_throughput = (double)s->output_tokens / duration;
        s->total_token_throughput = (double)(s->input_tokens + s->output_tokens) / duration;
    }
    dist_of(r, n, METRIC_TTFT, &s->ttft);
    dist_of(r, n, METRIC_TPOT, &s->tpot);
    dist_of(r, n, METRIC_ITL, &s->itl);
    dist_of(r, n, METRIC_E2E, &s->e2el);

    if (slo && (slo->ttft_ms > 0 || slo->tpot_ms > 0 || slo->e2e_ms > 0)) {
        s->slo_set = 1;
        for (int i = 0; i < n; i++) {
            const struct req_result *q = &r[i];
            if (!q->ok) continue;
            double tpot = tpot_of(q);
            int good = 1;
            if (slo->ttft_ms > 0) good &= q->ttft >= 0 && q->ttft * 1e3 <= slo->ttft_ms;
            if (slo->tpot_ms > 0) good &= tpot < 0 || tpot * 1e3 <= slo->tpot_ms;
            if (slo->e2e_ms > 0) good &= q->e2e * 1e3 <= slo->e2e_ms;
            s->good += good;
        }
        s->goodput = duration > 0 ? s->good / duration : 0;
    }

    /* Output tokens over time: each request's tokens spread evenly over its chunks. Bins of
     * 1 s (vLLM's peak window), doubled for long runs; short runs get ~20 bins of a 1/2/5 step. */
    s->bin_s = 1.0;
    if (duration < 10) {
        static const double steps[] = {0.5, 0.2, 0.1, 0.05, 0.02, 0.01};
        for (int i = 0; i < 6; i++) {
            s->bin_s = steps[i];
            if (duration / steps[i] >= 20) break;
        }
    }
    while (duration / s->bin_s > STATS_MAX_BINS) s->bin_s *= 2;
    s->n_bins = (int)ceil(duration / s->bin_s);
    if (s->n_bins < 1) s->n_bins = 1;
    if (s->n_bins > STATS_MAX_BINS) s->n_bins = STATS_MAX_BINS;
    for (int i = 0; i < n; i++) {
        const struct req_result *q = &r[i];
        if (!q->ok || !q->n_chunk_t) continue;
        double w = (double)req_output_tokens(q) / q->n_chunk_t;
        for (int j = 0; j < q->n_chunk_t; j++) {
            int b = (int)(q->chunk_t[j] / s->bin_s);
            if (b < 0) b = 0;
            if (b >= s->n_bins) b = s->n_bins - 1;
            s->out_tps[b] += w;
        }
    }
    for (int b = 0; b < s->n_bins; b++) {
        /* the last bin may be partial: divide by the time it covers */
        double width = s->bin_s;
        if (b == s->n_bins - 1 && duration > b * s->bin_s) width = duration - b * s->bin_s;
        s->out_tps[b] /= width;
    }
    /* Peak: the most output tokens in a whole second (vLLM's definition); runs shorter than a
     * second have only their average. */
    int secs = (int)floor(duration);
    if (secs < 1) s->peak_output_throughput = s->output_throughput;
    double *per_s = xcalloc((size_t)(secs > 0 ? secs : 1), sizeof *per_s);
    for (int i = 0; i < n && secs > 0; i++) {
        const struct req_result *q = &r[i];
        if (!q->ok || !q->n_chunk_t) continue;
        double w = (double)req_output_tokens(q) / q->n_chunk_t;
        for (int j = 0; j < q->n_chunk_t; j++) {
            int b = (int)floor(q->chunk_t[j]);
            if (b >= 0 && b < secs) per_s[b] += w;
        }
    }
    for (int b = 0; b < secs; b++)
        if (per_s[b] > s->peak_output_throughput) s->peak_output_throughput = per_s[b];
    free(per_s);
}

static void line(FILE *f, const char *name, double v, int prec)
{
    if (isnan(v))
        fprintf(f, "%-42s %10s\n", name, "n/a");
    else
        fprintf(f, "%-42s %10.*f\n", name, prec, v);
}

static void section(FILE *f, const char *title)
{
    int w = 53 - (int)strlen(title) - 2, l = w / 2;
    fprintf(f, "%.*s %s %.*s\n", l, "-------------------------------", title, w - l,
            "-------------------------------");
}

static void dist_print(FILE *f, const char *name, const char *title, const struct dist *d)
{
    char k[64];
    section(f, title);
    snprintf(k, sizeof k, "Mean %s (ms):", name);
    line(f, k, d->mean, 2);
    snprintf(k, sizeof k, "Median %s (ms):", name);
    line(f, k, d->median, 2);
    snprintf(k, sizeof k, "P90 %s (ms):", name);
    line(f, k, d->p90, 2);
    snprintf(k, sizeof k, "P99 %s (ms):", name);
    line(f, k, d->p99, 2);
}

void summary_print(FILE *f, const struct summary *s)
{
    fprintf(f, "=============== Serving Benchmark Result ============\n");
    fprintf(f, "%-42s %10d\n", "Successful requests:", s->completed);
    fprintf(f, "%-42s %10d\n", "Failed requests:", s->failed);
    line(f, "Benchmark duration (s):", s->duration, 2);
    fprintf(f, "%-42s %10lld\n", "Total input tokens:", s->input_tokens);
    fprintf(f, "%-42s %10lld\n", "Total generated tokens:", s->output_tokens);
    line(f, "Request throughput (req/s):", s->request_throughput, 2);
    line(f, "Output token throughput (tok/s):", s->output_throughput, 2);
    line(f, "Peak output token throughput (tok/s):", s->peak_output_throughput, 2);
    line(f, "Total token throughput (tok/s):", s->total_token_throughput, 2);
    if (s->slo_set) line(f, "Goodput (req/s):", s->goodput, 2);
    line(f, "Prefix cache hit rate (server, %):", s->prefix_cache_hit_rate * 100, 2);
    if (s->spec_acceptance_rate == s->spec_acceptance_rate) {
        line(f, "Draft acceptance rate (server, %):", s->spec_acceptance_rate * 100, 2);
        line(f, "Tokens per verification (server):", s->spec_acceptance_length, 2);
    }
    if (s->cached_reported)
        fprintf(f, "%-42s %10lld\n", "Cached prompt tokens (usage):", s->cached_tokens);
    dist_print(f, "TTFT", "Time to First Token", &s->ttft);
    dist_print(f, "TPOT", "Time per Output Token (excl. 1st token)", &s->tpot);
    dist_print(f, "ITL", "Inter-token Latency", &s->itl);
    dist_print(f, "E2EL", "End-to-end Latency", &s->e2el);
    fprintf(f, "=====================================================\n");
}

static void num(cJSON *o, const char *name, double v)
{
    if (isnan(v) || isinf(v))
        cJSON_AddNullToObject(o, name);
    else
        cJSON_AddNumberToObject(o, name, v);
}

static void dist_json(cJSON *o, const char *name, const struct dist *d)
{
    char k[64];
    static const char *const pre[] = {"mean", "median", "p90", "p99", "std", "min", "max"};
    const double v[] = {d->mean, d->median, d->p90, d->p99, d->std, d->min, d->max};
    for (int i = 0; i < 7; i++) {
        snprintf(k, sizeof k, "%s_%s_ms", pre[i], name);
        num(o, k, v[i]);
    }
}

cJSON *summary_json(const struct summary *s)
{
    cJSON *o = cJSON_CreateObject();
    num(o, "load", s->load);
    cJSON_AddNumberToObject(o, "completed", s->completed);
    cJSON_AddNumberToObject(o, "failed", s->failed);
    num(o, "duration", s->duration);
    cJSON_AddNumberToObject(o, "total_input_tokens", (double)s->input_tokens);
    cJSON_AddNumberToObject(o, "total_output_tokens", (double)s->output_tokens);
    num(o, "request_throughput", s->request_throughput);
    num(o, "output_throughput", s->output_throughput);
    num(o, "peak_output_throughput", s->peak_output_throughput);
    num(o, "total_token_throughput", s->total_token_throughput);
    if (s->slo_set) {
        num(o, "goodput", s->goodput);
        cJSON_AddNumberToObject(o, "good_requests", s->good);
    } else {
        cJSON_AddNullToObject(o, "goodput");
    }
    num(o, "prefix_cache_hit_rate", s->prefix_cache_hit_rate);
    num(o, "spec_acceptance_rate", s->spec_acceptance_rate);
    num(o, "spec_acceptance_length", s->spec_acceptance_length);
    if (s->cached_reported)
        cJSON_AddNumberToObject(o, "cached_prompt_tokens", (double)s->cached_tokens);
    else
        cJSON_AddNullToObject(o, "cached_prompt_tokens");
    dist_json(o, "ttft", &s->ttft);
    dist_json(o, "tpot", &s->tpot);
    dist_json(o, "itl", &s->itl);
    dist_json(o, "e2el", &s->e2el);
    cJSON *tl = cJSON_AddObjectToObject(o, "output_throughput_timeline");
    cJSON_AddNumberToObject(tl, "bin_s", s->bin_s);
    cJSON *arr = cJSON_AddArrayToObject(tl, "tokens_per_s");
    for (int b = 0; b < s->n_bins; b++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(s->out_tps[b]));
    return o;
}

void requests_json(cJSON *obj, const struct req_result *r, int n)
{
    cJSON *in = cJSON_AddArrayToObject(obj, "input_lens");
    cJSON *pt = cJSON_AddArrayToObject(obj, "prompt_tokens");
    cJSON *out = cJSON_AddArrayToObject(obj, "output_lens");
    cJSON *mx = cJSON_AddArrayToObject(obj, "max_tokens");
    cJSON *ch = cJSON_AddArrayToObject(obj, "chunks");
    cJSON *cached = cJSON_AddArrayToObject(obj, "cached_tokens");
    cJSON *st = cJSON_AddArrayToObject(obj, "start_times");
    cJSON *tt = cJSON_AddArrayToObject(obj, "ttfts");
    cJSON *e2 = cJSON_AddArrayToObject(obj, "e2els");
    cJSON *itl = cJSON_AddArrayToObject(obj, "itls");
    cJSON *fin = cJSON_AddArrayToObject(obj, "finish_reasons");
    cJSON *ok = cJSON_AddArrayToObject(obj, "ok");
    cJSON *errs = cJSON_AddArrayToObject(obj, "errors");
    for (int i = 0; i < n; i++) {
        const struct req_result *q = &r[i];
        cJSON_AddItemToArray(in, cJSON_CreateNumber(q->input_len));
        cJSON_AddItemToArray(pt, cJSON_CreateNumber(q->prompt_tokens));
        cJSON_AddItemToArray(out, cJSON_CreateNumber(q->ok ? req_output_tokens(q) : 0));
        cJSON_AddItemToArray(mx, cJSON_CreateNumber(q->max_tokens));
        cJSON_AddItemToArray(ch, cJSON_CreateNumber(q->chunks));
        cJSON_AddItemToArray(cached, cJSON_CreateNumber(q->cached_tokens));
        cJSON_AddItemToArray(st, cJSON_CreateNumber(q->start));
        cJSON_AddItemToArray(tt, q->ttft >= 0 ? cJSON_CreateNumber(q->ttft) : cJSON_CreateNull());
        cJSON_AddItemToArray(e2, cJSON_CreateNumber(q->e2e));
        cJSON *a = cJSON_CreateArray();
        for (int j = 1; j < q->n_chunk_t; j++)
            cJSON_AddItemToArray(a, cJSON_CreateNumber(q->chunk_t[j] - q->chunk_t[j - 1]));
        cJSON_AddItemToArray(itl, a);
        cJSON_AddItemToArray(fin, cJSON_CreateString(q->finish_reason));
        cJSON_AddItemToArray(ok, cJSON_CreateBool(q->ok));
        cJSON_AddItemToArray(errs, cJSON_CreateString(q->error ? q->error : ""));
    }
}
