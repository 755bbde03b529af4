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
};

/** Parses a Prometheus text exposition page. */
void metrics_parse(const char *text, struct prefix_counters *pc);

/** hits / queries between two readings; NaN when either reading lacks them or no query ran. */
double metrics_hit_rate(const struct prefix_counters *before, const struct prefix_counters *after);

#endif
