/* The load client's statistics, SLO parsing, Prometheus counters and datasets. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/dataset.h"
#include "bench/metrics.h"
#include "bench/stats.h"
#include "common/util.h"
#include "text/tokenizer.h"
#include "test_util.h"

#define NEAR(a, b) (fabs((a) - (b)) < 1e-9) /* exact arithmetic on small decimals */

static void test_quantiles(void)
{
    const double v[] = {1, 2, 3, 4};
    CHECK(NEAR(stats_quantile(v, 4, 0.5), 2.5), "median");
    CHECK(NEAR(stats_quantile(v, 4, 0.9), 3.7), "p90 %.6f", stats_quantile(v, 4, 0.9));
    CHECK(NEAR(stats_quantile(v, 4, 0.0), 1) && NEAR(stats_quantile(v, 4, 1.0), 4), "ends");
    CHECK(NEAR(stats_quantile(v, 1, 0.99), 1), "one sample");
    CHECK(isnan(stats_quantile(v, 0, 0.5)), "no sample");
}

/* Two requests with known timings: every figure of the summary by hand. */
static void test_summary(void)
{
    struct req_result r[3];
    memset(r, 0, sizeof r);
    double t0[] = {0.05, 0.15, 0.25, 0.35}; /* request 0: 4 chunks (times mid-bin) */
    double t1[] = {0.55, 0.95};             /* request 1: 2 chunks */
    r[0] = (struct req_result){.ok = 1,
                               .status = 200,
                               .input_len = 10,
                               .prompt_tokens = 12,
                               .completion_tokens = 4,
                               .cached_tokens = 8,
                               .chunks = 4,
                               .start = 0,
                               .ttft = 0.1,
                               .e2e = 0.4,
                               .n_chunk_t = 4};
    r[0].chunk_t = t0;
    r[1] = (struct req_result){.ok = 1,
                               .status = 200,
                               .input_len = 20,
                               .prompt_tokens = -1,
                               .completion_tokens = -1,
                               .cached_tokens = -1,
                               .chunks = 2,
                               .start = 0.3,
                               .ttft = 0.2,
                               .e2e = 0.6,
                               .n_chunk_t = 2};
    r[1].chunk_t = t1;
    r[2] = (struct req_result){
        .ok = 0, .status = 500, .prompt_tokens = -1, .completion_tokens = -1, .cached_tokens = -1};
    struct summary s = {.prefix_cache_hit_rate = NAN};
    struct slo slo = {.ttft_ms = 150};
    summary_compute(r, 3, 2.0, &slo, &s);
    CHECK(s.completed == 2 && s.failed == 1, "counts %d %d", s.completed, s.failed);
    CHECK(s.input_tokens == 32, "input tokens %lld (usage 12 + client 20)", s.input_tokens);
    CHECK(s.output_tokens == 6, "output tokens %lld (usage 4 + chunks 2)", s.output_tokens);
    CHECK(NEAR(s.request_throughput, 1.0) && NEAR(s.output_throughput, 3.0) &&
              NEAR(s.total_token_throughput, 19.0),
          "throughputs %f %f %f", s.request_throughput, s.output_throughput,
          s.total_token_throughput);
    CHECK(NEAR(s.ttft.mean, 150) && NEAR(s.ttft.median, 150) && NEAR(s.ttft.p99, 199),
          "ttft %f %f %f", s.ttft.mean, s.ttft.median, s.ttft.p99);
    /* TPOT: (0.4 - 0.1) / 3 = 100 ms and (0.6 - 0.2) / 1 = 400 ms */
    CHECK(NEAR(s.tpot.mean, 250) && NEAR(s.tpot.min, 100) && NEAR(s.tpot.max, 400), "tpot %f",
          s.tpot.mean);
    /* ITL: 100, 100, 100 and 400 ms */
    CHECK(s.itl.n == 4 && NEAR(s.itl.median, 100) && NEAR(s.itl.mean, 175), "itl n %d %f", s.itl.n,
          s.itl.mean);
    CHECK(NEAR(s.e2el.mean, 500), "e2e %f", s.e2el.mean);
    CHECK(s.slo_set && s.good == 1 && NEAR(s.goodput, 0.5), "goodput %d %f", s.good, s.goodput);
    CHECK(s.cached_reported == 1 && s.cached_tokens == 8, "cached %lld", s.cached_tokens);
    /* timeline: a 2 s run gets 20 bins of 0.1 s; one token in bins 0-3, 5 and 9 */
    CHECK(s.n_bins == 20 && NEAR(s.bin_s, 0.1), "timeline %d bins of %f", s.n_bins, s.bin_s);
    for (int b = 0; b < s.n_bins; b++) {
        int one = b <= 3 || b == 5 || b == 9;
        CHECK(fabs(s.out_tps[b] - (one ? 10 : 0)) < 1e-6, "bin %d: %f tokens/s", b, s.out_tps[b]);
    }
    /* peak: whole seconds only; all 6 tokens fall in the first */
    CHECK(fabs(s.peak_output_throughput - 6) < 1e-9, "peak %f", s.peak_output_throughput);

    cJSON *j = summary_json(&s);
    const char *names[] = {"request_throughput",
                           "output_throughput",
                           "total_token_throughput",
                           "mean_ttft_ms",
                           "median_ttft_ms",
                           "p90_ttft_ms",
                           "p99_ttft_ms",
                           "mean_tpot_ms",
                           "median_tpot_ms",
                           "p90_tpot_ms",
                           "p99_tpot_ms",
                           "mean_itl_ms",
                           "median_itl_ms",
                           "p90_itl_ms",
                           "p99_itl_ms",
                           "mean_e2el_ms",
                           "median_e2el_ms",
                           "p90_e2el_ms",
                           "p99_e2el_ms",
                           "goodput",
                           "failed",
                           "completed",
                           "prefix_cache_hit_rate"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        CHECK(cJSON_GetObjectItemCaseSensitive(j, names[i]) != NULL, "json lacks %s", names[i]);
    CHECK(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "prefix_cache_hit_rate")),
          "unknown hit rate is null");
    cJSON_Delete(j);
}

static void test_slo_parse(void)
{
    struct slo s;
    char err[256];
    CHECK(slo_parse("ttft:200,tpot:50", &s, err) == 0 && s.ttft_ms == 200 && s.tpot_ms == 50 &&
              s.e2e_ms == 0,
          "ttft+tpot");
    CHECK(slo_parse("e2e:1500.5", &s, err) == 0 && s.e2e_ms == 1500.5, "e2e");
    CHECK(slo_parse("ttft", &s, err) == -1 && strstr(err, "NAME:MS"), "no value: %s", err);
    CHECK(slo_parse("ttft:-1", &s, err) == -1, "negative");
    CHECK(slo_parse("latency:5", &s, err) == -1 && strstr(err, "unknown"), "unknown: %s", err);
    CHECK(slo_parse("ttft:5x", &s, err) == -1, "junk");
}

static void test_metrics(void)
{
    const char *a = "# HELP pagoda_prefix_cache_queries_total Prompt tokens looked up.\n"
                    "# TYPE pagoda_prefix_cache_queries_total counter\n"
                    "pagoda_prefix_cache_queries_total 100\n"
                    "pagoda_prefix_cache_hits_total 25\n"
                    "pagoda_requests_running 3\n";
    const char *b = "pagoda_prefix_cache_queries_total 300\npagoda_prefix_cache_hits_total 175\n";
    struct prefix_counters x, y;
    metrics_parse(a, &x);
    metrics_parse(b, &y);
    CHECK(x.found && x.queries == 100 && x.hits == 25, "pagoda counters");
    CHECK(NEAR(metrics_hit_rate(&x, &y), 0.75), "hit rate %f", metrics_hit_rate(&x, &y));
    const char *v = "vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 40.0\n"
                    "vllm:prefix_cache_queries_total{engine=\"1\",model_name=\"m\"} 60.0\n"
                    "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 50.0\n";
    metrics_parse(v, &x);
    CHECK(x.found && x.queries == 100 && x.hits == 50, "vLLM counters summed over labels");
    metrics_parse("llamacpp:prompt_tokens_total 5\n", &y);
    CHECK(!y.found && isnan(metrics_hit_rate(&x, &y)), "no counters: no rate");
    metrics_parse(v, &y);
    CHECK(isnan(metrics_hit_rate(&x, &y)), "no query during the run: no rate");
}

static void test_datasets(const char *testdata)
{
    struct err e = {{0}};
    struct dataset ds;
    struct dataset_cfg c = {.kind = DS_RANDOM,
                            .num = 50,
                            .input_len = 100,
                            .output_len = 20,
                            .range_ratio = 0.5,
                            .token_ids = 1,
                            .vocab_size = 500,
                            .seed = 3};
    CHECK(dataset_build(&c, &ds, &e) == 0, "%s", e.msg);
    int lo = 1 << 30, hi = 0;
    for (int i = 0; i < ds.n; i++) {
        const struct prompt *p = &ds.p[i];
        CHECK(p->ids && p->n_ids == p->input_len && !p->text, "ids prompt");
        if (p->n_ids < lo) lo = p->n_ids;
        if (p->n_ids > hi) hi = p->n_ids;
        for (int k = 0; k < p->n_ids; k++) CHECK(p->ids[k] >= 0 && p->ids[k] < 500, "id range");
        CHECK(p->output_len >= 10 && p->output_len <= 30, "output len %d", p->output_len);
    }
    CHECK(lo >= 50 && hi <= 150 && hi > lo, "input lens in [50, 150]: %d..%d", lo, hi);
    struct dataset again;
    dataset_build(&c, &again, &e);
    CHECK(again.n == ds.n && !memcmp(again.p[7].ids, ds.p[7].ids, sizeof(int32_t) * 10),
          "a seed repeats the prompts");
    dataset_free(&again);
    dataset_free(&ds);

    /* token-exact text through a real tokenizer */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tokenizers/gpt2", testdata);
    struct tok *t = tok_load(dir, &e);
    CHECK(t != NULL, "gpt2 tokenizer: %s", e.msg);
    if (t) {
        c = (struct dataset_cfg){
            .kind = DS_RANDOM, .num = 10, .input_len = 64, .output_len = 8, .seed = 1, .tok = t};
        CHECK(dataset_build(&c, &ds, &e) == 0, "%s", e.msg);
        int exact = 0;
        for (int i = 0; i < ds.n; i++) {
            int32_t *ids = NULL;
            size_t n = 0;
            tok_encode(t, ds.p[i].text, strlen(ds.p[i].text), 0, &ids, &n, &e);
            CHECK((int)n == ds.p[i].input_len, "recorded length %d, encodes to %zu",
                  ds.p[i].input_len, n);
            exact += n == 64;
            free(ids);
        }
        /* re-encoding can merge across joins; the retries reach the target nearly always */
        CHECK(exact >= 8, "only %d of 10 prompts have exactly 64 tokens", exact);
        dataset_free(&ds);

        c = (struct dataset_cfg){.kind = DS_PREFIX,
                                 .num = 12,
                                 .prefix_len = 32,
                                 .suffix_len = 8,
                                 .num_prefixes = 3,
                                 .output_len = 4,
                                 .seed = 2,
                                 .tok = t};
        CHECK(dataset_build(&c, &ds, &e) == 0, "%s", e.msg);
        int distinct = 0;
        for (int i = 0; i < ds.n; i++) {
            int seen = 0;
            for (int j = 0; j < i; j++) seen |= !strncmp(ds.p[i].text, ds.p[j].text, 20);
            distinct += !seen;
        }
        CHECK(distinct == 3, "%d distinct prefixes, expected 3", distinct);
        dataset_free(&ds);
        tok_destroy(t);
    }

    c = (struct dataset_cfg){.kind = DS_PREFIX,
                             .num = 8,
                             .prefix_len = 16,
                             .suffix_len = 4,
                             .num_prefixes = 2,
                             .output_len = 4,
                             .token_ids = 1,
                             .vocab_size = 1000,
                             .seed = 2};
    CHECK(dataset_build(&c, &ds, &e) == 0, "%s", e.msg);
    for (int i = 0; i < ds.n; i++) CHECK(ds.p[i].n_ids == 20, "prefix+suffix ids");
    dataset_free(&ds);

    /* files */
    const char *jsonl_path = "/tmp/pagoda_bench_test.jsonl";
    FILE *f = fopen(jsonl_path, "w");
    fputs("{\"prompt\": \"first\", \"output_len\": 7}\n\n\"second\"\r\nthird plain line\n", f);
    fclose(f);
    c = (struct dataset_cfg){.kind = DS_JSONL, .path = jsonl_path, .num = 10, .output_len = 0};
    CHECK(dataset_build(&c, &ds, &e) == 0, "%s", e.msg);
    CHECK(ds.n == 3 && !strcmp(ds.p[0].text, "first") && ds.p[0].output_len == 7 &&
              !strcmp(ds.p[1].text, "second") && !strcmp(ds.p[2].text, "third plain line") &&
              ds.p[2].output_len == 128,
          "jsonl lines");
    dataset_free(&ds);
    f = fopen(jsonl_path, "w");
    fputs("{\"no_prompt\": 1}\n", f);
    fclose(f);
    CHECK(dataset_build(&c, &ds, &e) == -1 && strstr(e.msg, ":1:"), "bad jsonl: %s", e.msg);

    const char *sg_path = "/tmp/pagoda_bench_test_sharegpt.json";
    f = fopen(sg_path, "w");
    fputs("[{\"id\":\"a\",\"conversations\":[{\"from\":\"human\",\"value\":\"Hello there\"},"
          "{\"from\":\"gpt\",\"value\":\"General Kenobi, you are a bold one.\"}]},"
          "{\"id\":\"b\",\"conversations\":[{\"from\":\"human\",\"value\":\"only one turn\"}]}]",
          f);
    fclose(f);
    c = (struct dataset_cfg){.kind = DS_SHAREGPT, .path = sg_path, .num = 10};
    CHECK(dataset_build(&c, &ds, &e) == 0, "%s", e.msg);
    CHECK(ds.n == 1 && !strcmp(ds.p[0].text, "Hello there") && ds.p[0].output_len == 8,
          "sharegpt: %d prompts, output %d (35 bytes / 4)", ds.n, ds.n ? ds.p[0].output_len : 0);
    dataset_free(&ds);
    c.path = "/nonexistent/file.json";
    CHECK(dataset_build(&c, &ds, &e) == -1 && e.msg[0], "missing file");
    remove(jsonl_path);
    remove(sg_path);
}

static void test_gamma(void)
{
    /* mean shape*scale; variance shape*scale^2 (sampling error well under the tolerance) */
    const double shapes[] = {0.5, 1.0, 4.0};
    for (int k = 0; k < 3; k++) {
        struct rng r = {42};
        double sum = 0, sq = 0;
        int n = 200000;
        for (int i = 0; i < n; i++) {
            double x = rng_gamma(&r, shapes[k], 2.0);
            sum += x;
            sq += x * x;
        }
        double mean = sum / n, var = sq / n - mean * mean;
        CHECK(fabs(mean - 2 * shapes[k]) < 0.03 * 2 * shapes[k], "shape %g: mean %f", shapes[k],
              mean);
        CHECK(fabs(var - 4 * shapes[k]) < 0.06 * 4 * shapes[k], "shape %g: variance %f", shapes[k],
              var);
    }
}

int main(int argc, char **argv)
{
    const char *testdata = argc > 1 ? argv[1] : "../shared/testdata";
    test_quantiles();
    test_summary();
    test_slo_parse();
    test_metrics();
    test_datasets(testdata);
    test_gamma();
    TEST_DONE();
}
