#include "http/metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* Status codes counted one by one; anything else lands in the last slot ("other"). */
static const int statuses[] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
#define N_STATUS ((int)(sizeof statuses / sizeof statuses[0]) + 1)

#define TTFT_BUCKETS 12
static const double ttft_bounds[TTFT_BUCKETS] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06,
                                                 0.08,  0.1,   0.25, 0.5,  1.0,  2.5};
#define ITL_BUCKETS 12
static const double itl_bounds[ITL_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.015, 0.02,
                                               0.025, 0.05,   0.075, 0.1,  0.2,   0.5};

/* vLLM's buckets (vllm/v1/metrics/loggers.py), so that its dashboards' quantiles match. */
#define V_TTFT_BUCKETS 22
static const double v_ttft_bounds[V_TTFT_BUCKETS] = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
#define V_ITL_BUCKETS 19
static const double v_itl_bounds[V_ITL_BUCKETS] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                                   0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                                   7.5,  10.0,  20.0, 40.0,  80.0};

struct hist {
    pthread_mutex_t mu;
    const double *bounds;
    int n;
    uint64_t counts[24]; /* per bucket, the last catches the rest */
    double sum;
    uint64_t total;
};

struct http_metrics {
    atomic_ulong requests[HTTP_ROUTE_N][N_STATUS];
    atomic_long streams;
    atomic_ulong stream_aborts[HTTP_STREAM_ABORT_N];
    atomic_ulong goaways;
    atomic_ulong rejected[2]; /* max_waiting_requests, max_streams_per_connection */
    struct hist ttft, itl;
    struct hist v_ttft, v_itl, v_e2e; /* the same times in vLLM's buckets */
    char labels[512];                 /* model_name="...",engine="0" */
};

static const char *const route_names[HTTP_ROUTE_N] = {
    "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens",
    "/v1/models",           "/health",         "/metrics",     "/tokenize",
    "/detokenize",          "/v1/embeddings",  "other"};

const char *http_route_name(enum http_route r)
{
    return r >= 0 && r < HTTP_ROUTE_N ? route_names[r] : "other";
}

static void hist_init(struct hist *h, const double *bounds, int n)
{
    pthread_mutex_init(&h->mu, NULL);
    h->bounds = bounds;
    h->n = n;
}

/* The label pair model_name="name",engine="0", the value escaped as the text format says
 * (backslash, double quote, newline); a name too long for the buffer is cut. */
static void make_labels(char *out, size_t cap, const char *name)
{
    size_t k = (size_t)snprintf(out, cap, "model_name=\"");
    for (const char *p = name ? name : ""; *p && k + 24 < cap; p++) {
        if (*p == '\\' || *p == '"') out[k++] = '\\';
        if (*p == '\n') {
            out[k++] = '\\';
            out[k++] = 'n';
        } else {
            out[k++] = *p;
        }
    }
    snprintf(out + k, cap - k, "\",engine=\"0\"");
}

struct http_metrics *http_metrics_create(const char *model_name)
{
    struct http_metrics *m = xcalloc(1, sizeof *m);
    make_labels(m->labels, sizeof m->labels, model_name);
    hist_init(&m->v_ttft, v_ttft_bounds, V_TTFT_BUCKETS);
    hist_init(&m->v_itl, v_itl_bounds, V_ITL_BUCKETS);
    hist_init(&m->v_e2e, engine_queue_bucket_bounds, ENGINE_QUEUE_BUCKETS);
    for (int r = 0; r < HTTP_ROUTE_N; r++)
        for (int s = 0; s < N_STATUS; s++) atomic_init(&m->requests[r][s], 0);
    atomic_init(&m->streams, 0);
    for (int i = 0; i < HTTP_STREAM_ABORT_N; i++) atomic_init(&m->stream_aborts[i], 0);
    pthread_mutex_init(&m->ttft.mu, NULL);
    pthread_mutex_init(&m->itl.mu, NULL);
    m->ttft.bounds = ttft_bounds, m->ttft.n = TTFT_BUCKETS;
    m->itl.bounds = itl_bounds, m->itl.n = ITL_BUCKETS;
    return m;
}

void http_metrics_destroy(struct http_metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->ttft.mu);
    pthread_mutex_destroy(&m->itl.mu);
    pthread_mutex_destroy(&m->v_ttft.mu);
    pthread_mutex_destroy(&m->v_itl.mu);
    pthread_mutex_destroy(&m->v_e2e.mu);
    free(m);
}

void http_metrics_request(struct http_metrics *m, enum http_route r, int status)
{
    int s = 0;
    while (s < N_STATUS - 1 && statuses[s] != status) s++;
    if (r < 0 || r >= HTTP_ROUTE_N) r = HTTP_ROUTE_OTHER;
    atomic_fetch_add(&m->requests[r][s], 1);
}

void http_metrics_stream_abort(struct http_metrics *m, enum http_stream_abort why)
{
    atomic_fetch_add(&m->stream_aborts[why], 1);
}

void http_metrics_goaway(struct http_metrics *m)
{
    atomic_fetch_add(&m->goaways, 1);
}

void http_metrics_rejected(struct http_metrics *m, int per_conn)
{
    atomic_fetch_add(&m->rejected[per_conn ? 1 : 0], 1);
}

void http_metrics_streams(struct http_metrics *m, int delta)
{
    atomic_fetch_add(&m->streams, delta);
}

static void hist_observe(struct hist *h, double v)
{
    int b = 0;
    while (b < h->n && v > h->bounds[b]) b++;
    pthread_mutex_lock(&h->mu);
    h->counts[b]++;
    h->sum += v;
    h->total++;
    pthread_mutex_unlock(&h->mu);
}

void http_metrics_ttft(struct http_metrics *m, double seconds)
{
    hist_observe(&m->ttft, seconds);
    hist_observe(&m->v_ttft, seconds);
}

void http_metrics_itl(struct http_metrics *m, double seconds)
{
    hist_observe(&m->itl, seconds);
    hist_observe(&m->v_itl, seconds);
}

void http_metrics_e2e(struct http_metrics *m, double seconds)
{
    hist_observe(&m->v_e2e, seconds);
}

static void head(struct http_buf *o, const char *name, const char *type, const char *help)
{
    http_buf_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Cumulative buckets, +Inf, _sum and _count of counts[n + 1]. */
static void hist_lines(struct http_buf *o, const char *name, const double *bounds, int n,
                       const uint64_t *counts, double sum)
{
    uint64_t cum = 0;
    for (int b = 0; b < n; b++) {
        cum += counts[b];
        http_buf_printf(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[b], (unsigned long long)cum);
    }
    cum += counts[n];
    http_buf_printf(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
                    (unsigned long long)cum, name, sum, name, (unsigned long long)cum);
}

static void hist_render(struct http_buf *o, struct hist *h, const char *name, const char *help)
{
    uint64_t counts[24];
    pthread_mutex_lock(&h->mu);
    memcpy(counts, h->counts, sizeof counts);
    double sum = h->sum;
    pthread_mutex_unlock(&h->mu);
    head(o, name, "histogram", help);
    hist_lines(o, name, h->bounds, h->n, counts, sum);
}

/* Speculative decoding by method, for the methods that verified anything: pagoda's names
 * and vLLM's (vllm:spec_decode_*) side by side. */
/* Step composition and the step-time model (sched/cost.h): what the scheduler planned and
 * how well it predicted the steps' time. */
static void step_render(const struct engine_stats *st, struct http_buf *o)
{
    static const char *const counters[][2] = {
        {"pagoda_engine_step_decode_rows_total",
         "Query rows of decoding requests in engine steps (drafts included)."},
        {"pagoda_engine_step_prefill_tokens_total",
         "Prompt (or recomputed) tokens in engine steps."},
        {"pagoda_engine_steps_time_capped_total",
         "Engine steps whose prefill tokens the --max-step-ms bound cut."},
        {"pagoda_engine_steps_predicted_total",
         "Engine steps timed against a prediction of the step-time model."},
    };
    const uint64_t cv[] = {st->step_decode_rows, st->step_prefill_tokens, st->steps_time_capped,
                           st->steps_predicted};
    for (int i = 0; i < 4; i++) {
        head(o, counters[i][0], "counter", counters[i][1]);
        http_buf_printf(o, "%s %llu\n", counters[i][0], (unsigned long long)cv[i]);
    }
    static const char *const secs[][2] = {
        {"pagoda_engine_step_predicted_seconds_total",
         "Predicted seconds of the steps timed against a prediction."},
        {"pagoda_engine_step_measured_seconds_total",
         "Measured seconds of the steps timed against a prediction."},
        {"pagoda_engine_step_prediction_error_seconds_total",
         "Absolute prediction error of the step-time model, summed over those steps."},
    };
    const double sv[] = {st->step_predicted_sum, st->step_measured_sum, st->step_error_sum};
    for (int i = 0; i < 3; i++) {
        head(o, secs[i][0], "counter", secs[i][1]);
        http_buf_printf(o, "%s %.9g\n", secs[i][0], sv[i]);
    }
    head(o, "pagoda_engine_step_cost_seconds", "gauge",
         "The fitted step-time model t = step + row * rows + key * keys read (0 until fitted; "
         "with several models, the first fitted one's).");
    http_buf_printf(o,
                    "pagoda_engine_step_cost_seconds{term=\"step\"} %.9g\n"
                    "pagoda_engine_step_cost_seconds{term=\"row\"} %.9g\n"
                    "pagoda_engine_step_cost_seconds{term=\"key\"} %.9g\n",
                    st->cost_ready ? st->cost_a : 0, st->cost_ready ? st->cost_b : 0,
                    st->cost_ready ? st->cost_c : 0);
}

static void spec_render(const struct engine_stats *st, struct http_buf *o)
{
    int any = 0;
    for (int m = 1; m < SPEC_METHODS; m++) any |= st->spec_drafts[m] > 0;
    if (!any) return;
    static const char *const names[][2] = {
        {"pagoda_spec_decode_drafts_total", "vllm:spec_decode_num_drafts"},
        {"pagoda_spec_decode_draft_tokens_total", "vllm:spec_decode_num_draft_tokens"},
        {"pagoda_spec_decode_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens"}};
    static const char *const help[] = {"Verifications: a request's drafts checked in one step.",
                                       "Draft tokens verified.", "Draft tokens accepted."};
    for (int k = 0; k < 3; k++)
        for (int v = 0; v < 2; v++) {
            head(o, names[k][v], "counter", help[k]);
            for (int m = 1; m < SPEC_METHODS; m++) {
                if (!st->spec_drafts[m]) continue;
                const uint64_t *c = k == 0   ? st->spec_drafts
                                    : k == 1 ? st->spec_draft_tokens
                                             : st->spec_accepted_tokens;
                http_buf_printf(o, "%s{method=\"%s\"} %llu\n", names[k][v],
                                spec_method_name((enum spec_method)m), (unsigned long long)c[m]);
            }
        }
    head(o, "vllm:spec_decode_num_accepted_tokens_per_pos", "counter",
         "Draft tokens accepted by position in the draft.");
    for (int m = 1; m < SPEC_METHODS; m++)
        for (int i = 0; st->spec_drafts[m] && i < SPEC_MAX_TOKENS; i++)
            if (st->spec_accepted_pos[m][i] || i == 0)
                http_buf_printf(o,
                                "vllm:spec_decode_num_accepted_tokens_per_pos{method=\"%s\","
                                "position=\"%d\"} %llu\n",
                                spec_method_name((enum spec_method)m), i,
                                (unsigned long long)st->spec_accepted_pos[m][i]);
    head(o, "pagoda_spec_decode_acceptance_length", "histogram",
         "Draft tokens accepted per verification.");
    for (int m = 1; m < SPEC_METHODS; m++) {
        if (!st->spec_drafts[m]) continue;
        const char *mn = spec_method_name((enum spec_method)m);
        uint64_t cum = 0;
        for (int a = 0; a <= SPEC_MAX_TOKENS; a++) {
            cum += st->spec_accept_hist[m][a];
            http_buf_printf(o,
                            "pagoda_spec_decode_acceptance_length_bucket{method=\"%s\",le=\"%d\"} "
                            "%llu\n",
                            mn, a, (unsigned long long)cum);
        }
        http_buf_printf(o,
                        "pagoda_spec_decode_acceptance_length_bucket{method=\"%s\",le=\"+Inf\"} "
                        "%llu\npagoda_spec_decode_acceptance_length_sum{method=\"%s\"} %llu\n"
                        "pagoda_spec_decode_acceptance_length_count{method=\"%s\"} %llu\n",
                        mn, (unsigned long long)cum, mn,
                        (unsigned long long)st->spec_accepted_tokens[m], mn,
                        (unsigned long long)cum);
    }
}

/* One line per tier that is on: host then disk (values as unsigned, or seconds). */
static void tier_line(struct http_buf *o, const struct engine_stats *st, const char *name,
                      const char *extra, unsigned long long host, unsigned long long disk)
{
    if (st->host_on) http_buf_printf(o, "%s{tier=\"host\"%s} %llu\n", name, extra, host);
    if (st->tier_on) http_buf_printf(o, "%s{tier=\"disk\"%s} %llu\n", name, extra, disk);
}

static void tier_seconds(struct http_buf *o, const struct engine_stats *st, const char *name,
                         double host, double disk)
{
    if (st->host_on) http_buf_printf(o, "%s{tier=\"host\"} %.6f\n", name, host);
    if (st->tier_on) http_buf_printf(o, "%s{tier=\"disk\"} %.6f\n", name, disk);
}

/* The figures of the tiers below the pool (--kv-host-memory, --kv-disk-dir). */
static void tier_render(const struct engine_stats *st, struct http_buf *o)
{
    const struct kv_tier_stats *t = &st->tier;
    const struct kv_host_stats *h = &st->host;
    head(o, "pagoda_kv_tier_blocks", "gauge", "KV blocks held by a tier below the pool.");
    tier_line(o, st, "pagoda_kv_tier_blocks", "", h->blocks, t->disk.blocks);
    head(o, "pagoda_kv_tier_bytes", "gauge", "Bytes a tier below the pool uses, and its budget.");
    tier_line(o, st, "pagoda_kv_tier_bytes", ",kind=\"used\"", st->host_used_bytes, t->disk.bytes);
    tier_line(o, st, "pagoda_kv_tier_bytes", ",kind=\"budget\"", st->host_budget_bytes,
              t->disk_budget);
    head(o, "pagoda_kv_tier_query_tokens_total", "counter",
         "Prompt tokens past the pool's prefix hits looked up in a tier.");
    tier_line(o, st, "pagoda_kv_tier_query_tokens_total", "", st->host_query_tokens,
              st->tier_query_tokens);
    head(o, "pagoda_kv_tier_hit_tokens_total", "counter", "Prompt tokens loaded from a tier.");
    tier_line(o, st, "pagoda_kv_tier_hit_tokens_total", "", st->host_hit_tokens,
              st->tier_hit_tokens);
    if (st->tier_on) {
        head(o, "pagoda_kv_tier_bypasses_total", "counter",
             "Tier hits recomputed instead: loading was estimated slower.");
        http_buf_printf(o, "pagoda_kv_tier_bypasses_total{tier=\"disk\"} %llu\n",
                        (unsigned long long)st->tier_bypasses);
    }
    head(o, "pagoda_kv_tier_load_bytes_total", "counter", "KV bytes loaded from a tier.");
    tier_line(o, st, "pagoda_kv_tier_load_bytes_total", "", st->host_load_bytes, t->load_bytes);
    head(o, "pagoda_kv_tier_load_seconds_total", "counter", "Time loads from a tier took.");
    tier_seconds(o, st, "pagoda_kv_tier_load_seconds_total", st->host_load_seconds,
                 t->load_seconds);
    head(o, "pagoda_kv_tier_store_bytes_total", "counter", "KV bytes stored in a tier.");
    tier_line(o, st, "pagoda_kv_tier_store_bytes_total", "", st->host_store_bytes,
              t->disk.stored_bytes);
    head(o, "pagoda_kv_tier_store_seconds_total", "counter",
         "Time stores into a tier took (host: the copies' device time; disk: the writer's).");
    tier_seconds(o, st, "pagoda_kv_tier_store_seconds_total", st->host_store_seconds,
                 t->store_seconds);
    head(o, "pagoda_kv_tier_store_dropped_total", "counter",
         "Blocks and snapshots not stored: the store queue was full, or the budget had nothing "
         "to evict.");
    tier_line(o, st, "pagoda_kv_tier_store_dropped_total", "",
              h->store_dropped + st->host_snap.store_dropped, t->store_dropped + t->disk.full);
    head(o, "pagoda_kv_tier_evicted_blocks_total", "counter",
         "Blocks and snapshots dropped for the byte budget.");
    tier_line(o, st, "pagoda_kv_tier_evicted_blocks_total", "",
              h->evicted_blocks + st->host_snap.evicted_blocks, t->disk.evicted_blocks);
    /* hybrid models (0 for the others) */
    head(o, "pagoda_kv_tier_state_snapshots", "gauge",
         "Recurrent-state snapshots of a hybrid model held by a tier.");
    tier_line(o, st, "pagoda_kv_tier_state_snapshots", "", st->host_snap.blocks, t->disk.states);
    head(o, "pagoda_kv_tier_state_queries_total", "counter",
         "Snapshot lookups of a hybrid model that reached a tier: the tiers above lacked the "
         "snapshot its prefix resumes from.");
    tier_line(o, st, "pagoda_kv_tier_state_queries_total", "", st->host_state_queries,
              st->tier_state_queries);
    head(o, "pagoda_kv_tier_state_hits_total", "counter",
         "Of those, snapshots loaded from the tier.");
    tier_line(o, st, "pagoda_kv_tier_state_hits_total", "", st->host_state_hits,
              st->tier_state_hits);
    if (!st->tier_on) return;
    head(o, "pagoda_kv_tier_faults_total", "counter",
         "I/O faults of a tier by kind; each is a miss and a recompute.");
    http_buf_printf(o,
                    "pagoda_kv_tier_faults_total{tier=\"disk\",kind=\"write\"} %llu\n"
                    "pagoda_kv_tier_faults_total{tier=\"disk\",kind=\"read\"} %llu\n"
                    "pagoda_kv_tier_faults_total{tier=\"disk\",kind=\"corrupt\"} %llu\n",
                    (unsigned long long)t->disk.faults_write,
                    (unsigned long long)t->disk.faults_read,
                    (unsigned long long)t->disk.faults_corrupt);
    head(o, "pagoda_kv_tier_load_failures_total", "counter",
         "Loads cut short by a fault or a record gone since the lookup.");
    http_buf_printf(o, "pagoda_kv_tier_load_failures_total{tier=\"disk\"} %llu\n",
                    (unsigned long long)t->load_failed);
    head(o, "pagoda_kv_tier_state_loads_total", "counter",
         "Snapshots loaded from disk, and those that failed (a miss and a recompute).");
    http_buf_printf(o,
                    "pagoda_kv_tier_state_loads_total{tier=\"disk\",result=\"ok\"} %llu\n"
                    "pagoda_kv_tier_state_loads_total{tier=\"disk\",result=\"failed\"} %llu\n",
                    (unsigned long long)t->load_states, (unsigned long long)t->state_failed);
}

static void engine_render(const struct engine_stats *st, struct http_buf *o)
{
    head(o, "pagoda_requests_running", "gauge", "Requests in the running batch.");
    http_buf_printf(o, "pagoda_requests_running %d\n", st->running);
    head(o, "pagoda_requests_waiting", "gauge", "Requests waiting to be scheduled.");
    http_buf_printf(o, "pagoda_requests_waiting %d\n", st->waiting);
    head(o, "pagoda_kv_blocks", "gauge", "KV cache blocks by state.");
    http_buf_printf(o,
                    "pagoda_kv_blocks{state=\"total\"} %d\npagoda_kv_blocks{state=\"used\"} %d\n"
                    "pagoda_kv_blocks{state=\"free\"} %d\npagoda_kv_blocks{state=\"cached\"} %d\n",
                    st->kv_blocks_total, st->kv_blocks_used, st->kv_blocks_free,
                    st->kv_blocks_cached);
    head(o, "pagoda_kv_usage_ratio", "gauge", "Fraction of KV cache blocks in use.");
    http_buf_printf(o, "pagoda_kv_usage_ratio %.6f\n",
                    st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0);
    head(o, "pagoda_state_slots", "gauge",
         "Recurrent-state slots of hybrid models by state (0 for other models).");
    http_buf_printf(
        o,
        "pagoda_state_slots{state=\"total\"} %d\npagoda_state_slots{state=\"used\"} %d\n"
        "pagoda_state_slots{state=\"free\"} %d\npagoda_state_slots{state=\"cached\"} %d\n",
        st->state_slots_total, st->state_slots_used, st->state_slots_free, st->state_slots_cached);
    head(o, "pagoda_state_slot_bytes", "gauge", "Bytes of one recurrent-state slot.");
    http_buf_printf(o, "pagoda_state_slot_bytes %zu\n", st->state_bytes);
    head(o, "pagoda_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache.");
    http_buf_printf(o, "pagoda_prefix_cache_queries_total %llu\n",
                    (unsigned long long)st->prefix_query_tokens);
    head(o, "pagoda_prefix_cache_hits_total", "counter",
         "Prompt tokens served from the prefix cache.");
    http_buf_printf(o, "pagoda_prefix_cache_hits_total %llu\n",
                    (unsigned long long)st->prefix_hit_tokens);
    head(o, "pagoda_preemptions_total", "counter", "Requests preempted for KV space.");
    http_buf_printf(o, "pagoda_preemptions_total %llu\n", (unsigned long long)st->preemptions);
    head(o, "pagoda_prompt_tokens_total", "counter", "Prompt tokens prefilled.");
    http_buf_printf(o, "pagoda_prompt_tokens_total %llu\n", (unsigned long long)st->prompt_tokens);
    head(o, "pagoda_generation_tokens_total", "counter", "Tokens generated.");
    http_buf_printf(o, "pagoda_generation_tokens_total %llu\n",
                    (unsigned long long)st->generation_tokens);
    head(o, "pagoda_requests_finished_total", "counter", "Finished requests by reason.");
    static const char *const reasons[] = {"none", "stop", "length", "abort", "error"};
    for (int r = FINISH_STOP; r <= FINISH_ERROR; r++)
        http_buf_printf(o, "pagoda_requests_finished_total{reason=\"%s\"} %llu\n", reasons[r],
                        (unsigned long long)st->requests_finished[r]);
    head(o, "pagoda_engine_steps_total", "counter", "Engine steps run.");
    http_buf_printf(o, "pagoda_engine_steps_total %llu\n", (unsigned long long)st->steps);
    head(o, "pagoda_engine_steps_overlapped_total", "counter",
         "Engine steps launched before the previous step's tokens were read.");
    http_buf_printf(o, "pagoda_engine_steps_overlapped_total %llu\n",
                    (unsigned long long)st->steps_overlapped);
    head(o, "pagoda_engine_step_seconds", "histogram", "Duration of one engine step.");
    hist_lines(o, "pagoda_engine_step_seconds", engine_step_bucket_bounds, ENGINE_STEP_BUCKETS,
               st->step_hist, st->step_time_sum);
    step_render(st, o);
    spec_render(st, o);
    if (st->tier_on || st->host_on) tier_render(st, o);
}

/* A bucket bound as Prometheus' Python client writes it: "1.0", "2560.0", "0.005". */
static void fmt_le(char *out, size_t cap, double v)
{
    if (v == floor(v) && fabs(v) < 1e15)
        snprintf(out, cap, "%.1f", v);
    else
        snprintf(out, cap, "%g", v);
}

/* A vllm:* histogram with the model labels. */
static void v_hist_lines(struct http_buf *o, const char *labels, const char *name, const char *help,
                         const double *bounds, int n, const uint64_t *counts, double sum)
{
    head(o, name, "histogram", help);
    uint64_t cum = 0;
    char le[32];
    for (int b = 0; b < n; b++) {
        cum += counts[b];
        fmt_le(le, sizeof le, bounds[b]);
        http_buf_printf(o, "%s_bucket{%s,le=\"%s\"} %llu\n", name, labels, le,
                        (unsigned long long)cum);
    }
    cum += counts[n];
    http_buf_printf(o, "%s_bucket{%s,le=\"+Inf\"} %llu\n%s_sum{%s} %.9g\n%s_count{%s} %llu\n", name,
                    labels, (unsigned long long)cum, name, labels, sum, name, labels,
                    (unsigned long long)cum);
}

static void v_hist_render(struct http_buf *o, const char *labels, struct hist *h, const char *name,
                          const char *help)
{
    uint64_t counts[24];
    pthread_mutex_lock(&h->mu);
    memcpy(counts, h->counts, sizeof counts);
    double sum = h->sum;
    pthread_mutex_unlock(&h->mu);
    v_hist_lines(o, labels, name, help, h->bounds, h->n, counts, sum);
}

static void v_value(struct http_buf *o, const char *labels, const char *name, const char *type,
                    const char *help, double v)
{
    head(o, name, type, help);
    http_buf_printf(o, "%s{%s} %.17g\n", name, labels, v);
}

/* The names vLLM exports (v1 engine), for routers (llm-d, the Gateway API Inference
 * Extension, production-stack), KEDA / HPA adapters and vLLM's Grafana dashboards. */
static void vllm_render(struct http_metrics *m, const struct engine_stats *st, struct http_buf *o)
{
    const char *l = m->labels;
    if (st) {
        v_value(o, l, "vllm:num_requests_running", "gauge",
                "Number of requests in model execution batches.", st->running);
        v_value(o, l, "vllm:num_requests_waiting", "gauge",
                "Number of requests waiting to be processed.", st->waiting);
        v_value(o, l, "vllm:kv_cache_usage_perc", "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0.0);
        v_value(o, l, "vllm:prefix_cache_queries_total", "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                (double)st->prefix_query_tokens);
        v_value(o, l, "vllm:prefix_cache_hits_total", "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                (double)st->prefix_hit_tokens);
        v_value(o, l, "vllm:num_preemptions_total", "counter",
                "Cumulative number of preemption from the engine.", (double)st->preemptions);
        /* vLLM counts a request's whole prompt, the part served from the cache included */
        v_value(o, l, "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                (double)(st->prompt_tokens + st->prefix_hit_tokens));
        v_value(o, l, "vllm:generation_tokens_total", "counter",
                "Number of generation tokens processed.", (double)st->generation_tokens);
        head(o, "vllm:request_success_total", "counter",
             "Count of successfully processed requests.");
        static const char *const reasons[] = {"none", "stop", "length", "abort", "error"};
        for (int r = FINISH_STOP; r <= FINISH_ERROR; r++)
            http_buf_printf(o, "vllm:request_success_total{%s,finished_reason=\"%s\"} %llu\n", l,
                            reasons[r], (unsigned long long)st->requests_finished[r]);
        v_hist_lines(o, l, "vllm:request_queue_time_seconds",
                     "Histogram of time spent in WAITING phase for request.",
                     engine_queue_bucket_bounds, ENGINE_QUEUE_BUCKETS, st->queue_hist,
                     st->queue_time_sum);
    }
    v_hist_render(o, l, &m->v_ttft, "vllm:time_to_first_token_seconds",
                  "Histogram of time to first token in seconds.");
    v_hist_render(o, l, &m->v_itl, "vllm:inter_token_latency_seconds",
                  "Histogram of inter-token latency in seconds.");
    /* vLLM's older name for the same intervals */
    v_hist_render(o, l, &m->v_itl, "vllm:time_per_output_token_seconds",
                  "Histogram of time per output token in seconds.");
    v_hist_render(o, l, &m->v_e2e, "vllm:e2e_request_latency_seconds",
                  "Histogram of e2e request latency in seconds.");
}

void http_metrics_render(struct http_metrics *m, const struct engine_stats *st, struct http_buf *o)
{
    head(o, "pagoda_http_requests_total", "counter",
         "HTTP requests answered, by route and status.");
    for (int r = 0; r < HTTP_ROUTE_N; r++)
        for (int s = 0; s < N_STATUS; s++) {
            unsigned long v = atomic_load(&m->requests[r][s]);
            if (!v) continue;
            if (s < N_STATUS - 1)
                http_buf_printf(o, "pagoda_http_requests_total{route=\"%s\",status=\"%d\"} %lu\n",
                                route_names[r], statuses[s], v);
            else
                http_buf_printf(o,
                                "pagoda_http_requests_total{route=\"%s\",status=\"other\"} %lu\n",
                                route_names[r], v);
        }
    head(o, "pagoda_http_active_streams", "gauge", "Streaming responses in progress.");
    http_buf_printf(o, "pagoda_http_active_streams %ld\n", (long)atomic_load(&m->streams));
    static const char *const abort_names[HTTP_STREAM_ABORT_N] = {"buffer_full", "idle_timeout"};
    head(o, "pagoda_http_stream_aborts_total", "counter",
         "Streams the server aborted because the client did not read them, by reason.");
    for (int i = 0; i < HTTP_STREAM_ABORT_N; i++)
        http_buf_printf(o, "pagoda_http_stream_aborts_total{reason=\"%s\"} %lu\n", abort_names[i],
                        atomic_load(&m->stream_aborts[i]));
    head(o, "pagoda_http_rapid_reset_goaways_total", "counter",
         "HTTP/2 connections sent GOAWAY (ENHANCE_YOUR_CALM) for resetting streams too fast.");
    http_buf_printf(o, "pagoda_http_rapid_reset_goaways_total %lu\n", atomic_load(&m->goaways));
    head(o, "pagoda_http_requests_rejected_total", "counter",
         "Requests answered 429, by the bound they met.");
    http_buf_printf(o,
                    "pagoda_http_requests_rejected_total{reason=\"max_waiting_requests\"} %lu\n"
                    "pagoda_http_requests_rejected_total{reason=\"max_streams_per_connection\"} "
                    "%lu\n",
                    atomic_load(&m->rejected[0]), atomic_load(&m->rejected[1]));
    hist_render(o, &m->ttft, "pagoda_time_to_first_token_seconds",
                "Seconds from a request's arrival to its first token.");
    hist_render(o, &m->itl, "pagoda_inter_token_latency_seconds",
                "Seconds between consecutive tokens of a sequence.");
    if (st) engine_render(st, o);
    vllm_render(m, st, o);
}
