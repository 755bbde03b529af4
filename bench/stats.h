/*
 * stats: per-request measurements and the benchmark summary computed from them, with the
 * definitions of vLLM's serving benchmark so that figures compare across tools:
 *   TTFT  request sent -> first non-empty content chunk
 *   ITL   gaps between successive content chunks (pooled over all requests)
 *   TPOT  (E2E - TTFT) / (output tokens - 1), per request with more than one output token
 *   E2E   request sent -> last byte of the response
 * Percentiles interpolate linearly between order statistics (numpy's default).
 * Token counts come from the server's usage fields when it sends them.
 */
#ifndef PAGODA_BENCH_STATS_H
#define PAGODA_BENCH_STATS_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>

struct req_result {
    int ok;
    int status;            /* HTTP status, 0 when none arrived */
    char *error;           /* heap, NULL when ok */
    int input_len;         /* prompt tokens as the client knows them, -1 unknown */
    int max_tokens;        /* asked for */
    int prompt_tokens;     /* usage.prompt_tokens, -1 when absent */
    int completion_tokens; /* usage.completion_tokens, -1 when absent */
    int cached_tokens;     /* usage.prompt_tokens_details.cached_tokens, -1 when absent */
    int chunks;            /* content chunks received */
    int done_seen;         /* the stream ended with data: [DONE] */
    char finish_reason[16];
    double start;    /* s since the run started */
    double ttft;     /* s; -1 when no content arrived */
    double e2e;      /* s */
    double *chunk_t; /* arrival of each content chunk, s since the run started */
    int n_chunk_t, cap_chunk_t;
    int32_t *out_ids; /* output token ids the stream carried (return_token_ids), heap */
    int n_out_ids, cap_out_ids;
};

/** Output tokens of a request: usage when sent, else content chunks. */
int req_output_tokens(const struct req_result *r);
/** Prompt tokens of a request: usage when sent, else the client's count (0 if unknown). */
int req_input_tokens(const struct req_result *r);
void req_result_dispose(struct req_result *r);

struct dist {
    int n;
    double mean, std, median, p90, p99, min, max; /* ms */
};

struct slo {
    double ttft_ms, tpot_ms, e2e_ms; /* 0 = no objective */
};

/** Parses "ttft:MS,tpot:MS,e2e:MS" (any subset). 0, or -1 with a message in err[256]. */
int slo_parse(const char *s, struct slo *slo, char *err);

#define STATS_MAX_BINS 240

struct summary {
    int completed, failed;
    double duration; /* s, first send to last completion */
    long long input_tokens, output_tokens;
    double request_throughput, output_throughput, total_token_throughput; /* per s */
    double peak_output_throughput; /* the most output tokens in one whole second */
    struct dist ttft, tpot, itl, e2el;
    int slo_set, good;
    double goodput;               /* requests/s meeting every objective */
    double prefix_cache_hit_rate; /* from the server's /metrics; NaN when not available */
    /* speculative decoding, from the server's /metrics (NaN when none ran): accepted /
     * drafted tokens, and tokens a verification gives */
    double spec_acceptance_rate, spec_acceptance_length;
    long long cached_tokens; /* sum of usage cached_tokens */
    int cached_reported;     /* requests whose usage reported cached_tokens */
    double bin_s;            /* timeline bin width */
    int n_bins;
    double out_tps[STATS_MAX_BINS]; /* output tokens/s per bin */
    double load;                    /* the concurrency or request rate of this run (for sweeps) */
};

/** Linear-interpolated quantile q in [0, 1] of sorted[n]; NaN when n == 0. */
double stats_quantile(const double *sorted, int n, double q);

void summary_compute(const struct req_result *r, int n, double duration, const struct slo *slo,
                     struct summary *s);
void summary_print(FILE *f, const struct summary *s);
/** The summary as a JSON object (field names as in the printed report, snake case). */
cJSON *summary_json(const struct summary *s);
/** Per-request arrays (input_lens, output_lens, ttfts, itls, e2els, errors...) into obj. */
void requests_json(cJSON *obj, const struct req_result *r, int n);

/** Sorted latencies in ms of one metric over the finished requests (for CDF plots). */
enum metric { METRIC_TTFT, METRIC_TPOT, METRIC_ITL, METRIC_E2E };
double *stats_values(const struct req_result *r, int n, enum metric m, int *count);

#endif
