/* Prefix-cache counters from a Prometheus text page: see metrics.h. */
#include "bench/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

void metrics_parse(const char *text, struct prefix_counters *pc)
{
    memset(pc, 0, sizeof *pc);
    int have_q = 0, have_h = 0;
    for (const char *line = text; line && *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        if (len && line[0] != '#') {
            size_t name_len = strcspn(line, "{ \t");
            if (name_len > len) name_len = len;
            /* the value follows the labels (if any) and a space */
            const char *v = line + name_len;
            if (*v == '{') {
                const char *close = memchr(v, '}', len - name_len);
                v = close ? close + 1 : line + len;
            }
            char *end;
            double x = strtod(v, &end);
            if (end != v && isfinite(x)) {
                if (ends_with(line, name_len, "prefix_cache_queries_total") ||
                    ends_with(line, name_len, "prefix_cache_queries")) {
                    pc->queries += x;
                    have_q = 1;
                } else if (ends_with(line, name_len, "prefix_cache_hits_total") ||
                           ends_with(line, name_len, "prefix_cache_hits")) {
                    pc->hits += x;
                    have_h = 1;
                } else if (ends_with(line, name_len, "spec_decode_num_drafts") ||
                           ends_with(line, name_len, "spec_decode_num_drafts_total")) {
                    pc->spec_drafts += x;
                    pc->spec_found = 1;
                } else if (ends_with(line, name_len, "spec_decode_num_draft_tokens") ||
                           ends_with(line, name_len, "spec_decode_num_draft_tokens_total")) {
                    pc->spec_draft_tokens += x;
                } else if (ends_with(line, name_len, "spec_decode_num_accepted_tokens") ||
                           ends_with(line, name_len, "spec_decode_num_accepted_tokens_total")) {
                    pc->spec_accepted += x;
                }
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    pc->found = have_q && have_h;
}

void metrics_spec(const struct prefix_counters *before, const struct prefix_counters *after,
                  double *rate, double *len)
{
    double v = after->spec_drafts - before->spec_drafts;
    double d = after->spec_draft_tokens - before->spec_draft_tokens;
    double a = after->spec_accepted - before->spec_accepted;
    *rate = *len = NAN;
    if (!after->spec_found || v <= 0 || d <= 0) return;
    *rate = a / d;
    *len = 1 + a / v;
}

double metrics_hit_rate(const struct prefix_counters *before, const struct prefix_counters *after)
{
    if (!before->found || !after->found) return NAN;
    double q = after->queries - before->queries, h = after->hits - before->hits;
    if (q <= 0) return NAN;
    return h / q;
}
