/*
 * pagoda-bench: a load client for OpenAI-compatible servers. It sends streamed completion or
 * chat requests over HTTP/1.1 or HTTP/2 (h2c, or h2 over TLS), closed or open loop, and reports
 * throughput, latency percentiles (TTFT, TPOT, ITL, E2E), goodput and the server's prefix-cache hit
 * rate.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "bench/dataset.h"
#include "bench/multiturn.h"
#include "bench/hc.h"
#include "bench/metrics.h"
#include "bench/opts.h"
#include "bench/plot.h"
#include "bench/run.h"
#include "bench/stats.h"
#include "common/util.h"
#include "text/tokenizer.h"

static void on_sigint(int sig)
{
    (void)sig;
    run_interrupted = 1;
    signal(SIGINT, SIG_DFL); /* a second ^C ends the program at once */
}

/* Raises the soft open-files limit to the hard one (a connection is a descriptor) and says so;
 * warns when the limit is below what --concurrency needs. */
static void raise_fd_limit(const struct opts *o)
{
    unsigned long long hard, soft = util_raise_nofile("pagoda-bench", &hard);
    unsigned long long need = (unsigned long long)(o->concurrency > 0 ? o->concurrency : 0) + 64;
    if (!o->http2 && soft && soft < need)
        fprintf(stderr,
                "pagoda-bench: open files limit %llu (hard limit %llu) is below the %llu that "
                "--concurrency %d needs over HTTP/1.1\n",
                soft, hard, need, o->concurrency);
}

/* The id of the first model of GET /v1/models, or NULL + err. */
static char *first_model(struct hc *c, struct err *e)
{
    int status;
    char *body;
    if (hc_fetch(c, "GET", "/v1/models", NULL, 30, &status, &body, NULL, e)) return NULL;
    cJSON *j = cJSON_Parse(body);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "data"), 0), "id");
    char *name = status == 200 && cJSON_IsString(id) ? xstrdup(id->valuestring) : NULL;
    if (!name) err_set(e, "GET /v1/models answered %d without a model id; pass --model", status);
    cJSON_Delete(j);
    free(body);
    return name;
}

static void read_metrics(struct hc *c, int enabled, struct prefix_counters *pc)
{
    memset(pc, 0, sizeof *pc);
    if (!enabled) return;
    int status;
    char *body;
    struct err e = {{0}};
    if (hc_fetch(c, "GET", "/metrics", NULL, 10, &status, &body, NULL, &e)) return;
    if (status == 200) metrics_parse(body, pc);
    free(body);
}

static const char *proto_name(const struct opts *o)
{
    int tls = !strncasecmp(o->base_url, "https://", 8);
    return o->http2 ? (tls ? "h2" : "h2c") : "http/1.1";
}

static cJSON *config_json(const struct opts *o, const char *model)
{
    static const char *const ds[] = {"random", "sharegpt", "prefix-repetition", "jsonl",
                                     "multi-turn"};
    cJSON *c = cJSON_CreateObject();
    cJSON_AddStringToObject(c, "base_url", o->base_url);
    cJSON_AddStringToObject(c, "endpoint", o->chat ? "chat" : "completions");
    cJSON_AddStringToObject(c, "model", model);
    cJSON_AddStringToObject(c, "protocol", proto_name(o));
    cJSON_AddNumberToObject(c, "concurrency", o->concurrency);
    if (o->rate > 0)
        cJSON_AddNumberToObject(c, "request_rate", o->rate);
    else
        cJSON_AddStringToObject(c, "request_rate", "inf");
    cJSON_AddStringToObject(c, "arrival", o->constant_arrival ? "constant" : "poisson");
    cJSON_AddNumberToObject(c, "burstiness", o->burstiness);
    cJSON_AddNumberToObject(c, "num_prompts", o->num_prompts);
    cJSON_AddNumberToObject(c, "duration", o->duration);
    cJSON_AddNumberToObject(c, "warmup", o->warmup);
    cJSON_AddStringToObject(c, "dataset", ds[o->dataset]);
    if (o->dataset_path) cJSON_AddStringToObject(c, "dataset_path", o->dataset_path);
    cJSON_AddNumberToObject(c, "input_len", o->input_len);
    cJSON_AddNumberToObject(c, "output_len", o->output_len);
    cJSON_AddNumberToObject(c, "range_ratio", o->range_ratio);
    if (o->dataset == DS_MULTITURN) {
        cJSON_AddNumberToObject(c, "num_conversations", o->num_conversations);
        cJSON_AddNumberToObject(c, "turns", o->turns);
        cJSON_AddNumberToObject(c, "turn_input_len", o->turn_input_len);
        cJSON_AddNumberToObject(c, "turn_output_len", o->turn_output_len);
    }
    if (o->dataset == DS_PREFIX) {
        cJSON_AddNumberToObject(c, "prefix_len", o->prefix_len);
        cJSON_AddNumberToObject(c, "suffix_len", o->suffix_len);
        cJSON_AddNumberToObject(c, "num_prefixes", o->num_prefixes);
    }
    cJSON_AddBoolToObject(c, "tokenizer", o->tokenizer != NULL);
    cJSON_AddNumberToObject(c, "temperature", o->temperature);
    cJSON_AddBoolToObject(c, "ignore_eos", o->ignore_eos);
    cJSON_AddNumberToObject(c, "seed", (double)o->seed);
    cJSON *slo = cJSON_AddObjectToObject(c, "slo");
    if (o->slo.ttft_ms > 0) cJSON_AddNumberToObject(slo, "ttft_ms", o->slo.ttft_ms);
    if (o->slo.tpot_ms > 0) cJSON_AddNumberToObject(slo, "tpot_ms", o->slo.tpot_ms);
    if (o->slo.e2e_ms > 0) cJSON_AddNumberToObject(slo, "e2e_ms", o->slo.e2e_ms);
    return c;
}

static int write_json(const char *path, cJSON *doc)
{
    char *s = cJSON_Print(doc);
    FILE *f = fopen(path, "w");
    int ok = f && fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f)) ok = 0;
    free(s);
    if (!ok) fprintf(stderr, "pagoda-bench: cannot write %s\n", path);
    return ok ? 0 : -1;
}

/* One row per run; with --slo a goodput column (requests/s meeting every objective). */
static void sweep_table(FILE *f, const struct summary *s, int n, const char *load)
{
    int slo = n > 0 && s[0].slo_set;
    fprintf(f, "%12s %8s %10s %9s %9s %9s %9s %9s %7s", load, "req/s", "out tok/s", "TTFT p50",
            "TTFT p99", "TPOT p50", "TPOT p99", "E2E p50", "failed");
    fprintf(f, slo ? " %9s\n" : "\n", "goodput");
    for (int i = 0; i < n; i++) {
        fprintf(f, "%12g %8.2f %10.1f %9.1f %9.1f %9.2f %9.2f %9.1f %7d", s[i].load,
                s[i].request_throughput, s[i].output_throughput, s[i].ttft.median, s[i].ttft.p99,
                s[i].tpot.median, s[i].tpot.p99, s[i].e2el.median, s[i].failed);
        if (slo)
            fprintf(f, " %9.2f\n", s[i].goodput);
        else
            fputc('\n', f);
    }
    fprintf(f, "(latencies in ms%s)\n", slo ? "; goodput: requests/s meeting --slo" : "");
}

int main(int argc, char **argv)
{
    struct opts o;
    int rc = opts_parse(argc, argv, &o);
    if (rc) return rc > 0 ? 0 : 2;
    raise_fd_limit(&o);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_sigint);

    struct err e = {{0}};
    struct hc_url url;
    struct tok *tok = NULL;
    cJSON *extra = NULL;
    char *model = NULL;
    struct hc *c = NULL;
    struct dataset ds = {0};
    int status = 1;
    if (hc_url_parse(o.base_url, &url, &e)) goto fail;
    if (o.extra_body) {
        extra = cJSON_Parse(o.extra_body);
        if (!cJSON_IsObject(extra)) {
            err_set(&e, "--extra-body: not a JSON object");
            goto fail;
        }
    }
    if (o.tokenizer && !(tok = tok_load(o.tokenizer, &e))) goto fail;
    struct hc_tls_opts tls = {.insecure = o.insecure, .cafile = o.cafile};
    c = hc_create(&url, o.http2 ? HC_HTTP2 : HC_HTTP1, o.h2_connections, o.api_key, &tls, &e);
    if (!c) goto fail;
    model = o.model ? xstrdup(o.model) : first_model(c, &e);
    if (!model) goto fail;
    if (o.dataset == DS_MULTITURN) {
        cJSON *doc = cJSON_CreateObject();
        cJSON_AddItemToObject(doc, "config", config_json(&o, model));
        fprintf(stderr, "pagoda-bench: %s completions, model %s, %d conversations of %d turns\n",
                o.base_url, model, o.num_conversations, o.turns);
        int rc_ = multiturn_run(c, &o, model, extra, doc, &e);
        status = rc_ < 0 ? 1 : rc_;
        if (rc_ >= 0 && o.json_path && write_json(o.json_path, doc)) status = 1;
        cJSON_Delete(doc);
        if (rc_ < 0) goto fail;
        goto done;
    }

    /* Each run of a sweep gets its own prompts (a prefix cache must not carry one run's
     * prompts into the next); the warm-up prompts come after all of them. */
    int n_runs = o.n_sweep ? o.n_sweep : 1;
    int base = o.num_prompts > 0 ? o.num_prompts : 1000;
    struct dataset_cfg dc = {.kind = o.dataset,
                             .path = o.dataset_path,
                             .num = base * n_runs + o.warmup,
                             .input_len = o.input_len,
                             .output_len = o.output_len,
                             .range_ratio = o.range_ratio,
                             .prefix_len = o.prefix_len,
                             .suffix_len = o.suffix_len,
                             .num_prefixes = o.num_prefixes,
                             .token_ids = !o.chat,
                             .vocab_size = o.vocab_size,
                             .seed = o.seed,
                             .tok = tok};
    if ((o.dataset == DS_SHAREGPT || o.dataset == DS_JSONL) && !o.output_len_given)
        dc.output_len = 0;
    if (dataset_build(&dc, &ds, &e)) goto fail;

    const char *load_name = o.rate_given ? "request rate" : "concurrency";
    struct summary *sums = xcalloc((size_t)n_runs, sizeof *sums);
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddItemToObject(doc, "config", config_json(&o, model));
    cJSON *runs_json = o.n_sweep ? cJSON_AddArrayToObject(doc, "runs") : NULL;
    int show = o.progress < 0 ? isatty(2) : o.progress;
    char amount[64];
    if (o.num_prompts > 0)
        snprintf(amount, sizeof amount, "%d prompts", o.num_prompts);
    else
        snprintf(amount, sizeof amount, "for %g s", o.duration);
    fprintf(stderr, "pagoda-bench: %s %s, model %s, %s, %s\n", o.base_url,
            o.chat ? "chat" : "completions", model,
            o.http2   ? (url.tls ? "HTTP/2 (h2, TLS)" : "HTTP/2 (h2c)")
            : url.tls ? "HTTP/1.1 over TLS"
                      : "HTTP/1.1",
            amount);
    for (int k = 0; k < n_runs && !run_interrupted; k++) {
        struct run_cfg rc_ = {.path = o.chat ? "/v1/chat/completions" : "/v1/completions",
                              .req = {.chat = o.chat,
                                      .model = model,
                                      .temperature = o.temperature,
                                      .ignore_eos = o.ignore_eos,
                                      .extra = extra},
                              .concurrency = o.concurrency,
                              .rate = o.rate,
                              .constant_arrival = o.constant_arrival,
                              .burstiness = o.burstiness,
                              .num_prompts = o.num_prompts,
                              .duration = o.duration,
                              .warmup = o.warmup,
                              .warmup_base = base * n_runs,
                              .first_index = k * base,
                              .timeout = o.timeout,
                              .progress = show,
                              .seed = o.seed};
        if (o.n_sweep) {
            if (o.rate_given)
                rc_.rate = o.sweep[k];
            else
                rc_.concurrency = (int)o.sweep[k];
            fprintf(stderr, "-- %s %g\n", load_name, o.sweep[k]);
        }
        struct prefix_counters before, after;
        read_metrics(c, o.metrics, &before);
        struct run_out out;
        if (run_bench(c, &rc_, &ds, &out, &e)) {
            free(sums);
            cJSON_Delete(doc);
            goto fail;
        }
        read_metrics(c, o.metrics, &after);
        struct summary *s = &sums[k];
        s->load = o.n_sweep ? o.sweep[k] : o.rate_given ? o.rate : o.concurrency;
        s->prefix_cache_hit_rate = metrics_hit_rate(&before, &after);
        metrics_spec(&before, &after, &s->spec_acceptance_rate, &s->spec_acceptance_length);
        summary_compute(out.r, out.n, out.duration, &o.slo, s);
        if (!o.n_sweep) summary_print(stdout, s);
        for (int i = 0, shown = 0; i < out.n && shown < 3; i++)
            if (!out.r[i].ok) {
                fprintf(stderr, "pagoda-bench: request %d failed: %s\n", i, out.r[i].error);
                shown++;
            }
        cJSON *sj = summary_json(s);
        if (o.n_sweep) {
            cJSON_AddItemToArray(runs_json, sj);
        } else {
            for (cJSON *it = sj->child; it; it = sj->child) {
                cJSON_DetachItemViaPointer(sj, it);
                cJSON_AddItemToObject(doc, it->string, it);
            }
            cJSON_Delete(sj);
            requests_json(cJSON_AddObjectToObject(doc, "requests"), out.r, out.n);
            if (o.plot_path) {
                char title[512];
                snprintf(title, sizeof title, "%s (%s, %s), %d requests", model,
                         o.chat ? "chat" : "completions", proto_name(&o), out.n);
                if (plot_run_svg(o.plot_path, out.r, out.n, s, title, &e))
                    fprintf(stderr, "pagoda-bench: %s\n", e.msg);
            }
        }
        run_out_free(&out);
    }
    if (o.n_sweep) {
        sweep_table(stdout, sums, n_runs, load_name);
        char title[512];
        snprintf(title, sizeof title, "%s (%s, %s): throughput vs latency", model,
                 o.chat ? "chat" : "completions", proto_name(&o));
        if (o.plot_path && plot_sweep_svg(o.plot_path, sums, n_runs, load_name, title, &e))
            fprintf(stderr, "pagoda-bench: %s\n", e.msg);
    }
    status = 0;
    if (o.json_path && write_json(o.json_path, doc)) status = 1;
    for (int k = 0; k < n_runs; k++)
        if (sums[k].failed) status = status ? status : 3;
    cJSON_Delete(doc);
    free(sums);
    if (run_interrupted) {
        fprintf(stderr, "pagoda-bench: interrupted\n");
        status = 130;
    }
    goto done;
fail:
    fprintf(stderr, "pagoda-bench: %s\n", e.msg);
done:
    dataset_free(&ds);
    hc_destroy(c);
    tok_destroy(tok);
    cJSON_Delete(extra);
    free(model);
    return status;
}
