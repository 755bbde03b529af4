/*
 * metrics: reads the prefix-cache counters of a server's Prometheus /metrics page.
 * Recognized: any counter named *prefix_cache_queries[_total] and *prefix_cache_hits[_total]
 * (pagoda_..., vllm:...), summed over their label sets. The hit rate of a run is the ratio
 * of the two counters' increases over it.
 */
#ifndef PAGODA_BENCH_METRICS_H
#define PAGODA_BENCH_METRICS_H

struct prefix_counters {
    int found; /* both counters were on the page */
    double queries, hits;
    /* speculative decoding (vLLM's names, which pagoda also exports):
     * *spec_decode_num_drafts, *_num_draft_tokens, *_num_accepted_tokens [_total] */
    int spec_found;
    double spec_drafts, spec_draft_tokens, spec_accepted;
};

/** Parses a Prometheus text exposition page. */
void metrics_parse(const char *text, struct prefix_counters *pc);

/** hits / queries between two readings; NaN when either reading lacks them or no query ran. */
double metrics_hit_rate(const struct prefix_counters *before, const struct prefix_counters *after);

/** Over a run: accepted / drafted tokens into *rate and the tokens a verification gives
 * (1 + accepted / verifications) into *len; NaN when no verification ran. */
void metrics_spec(const struct prefix_counters *before, const struct prefix_counters *after,
                  double *rate, double *len);

#endif
