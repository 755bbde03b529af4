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
#include "bench/server.h"
#include "bench/stats.h"
#include "bench/trace.h"
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
    static const char *const ds[] = {"random", "sharegpt",   "prefix-repetition",
                                     "jsonl",  "multi-turn", "trace"};
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
    if (o->dataset == DS_TRACE) {
        cJSON_AddStringToObject(c, "trace_file", o->trace_file);
        cJSON_AddNumberToObject(c, "trace_speedup", o->trace_speedup);
        cJSON_AddNumberToObject(c, "trace_block_size", o->trace_block_size);
    }
    if (o->server_cmd) {
        cJSON_AddStringToObject(c, "server_cmd", o->server_cmd);
        if (o->n_server_args)
            cJSON_AddItemToObject(c, "sweep_server_args",
                                  cJSON_CreateStringArray(o->server_args, o->n_server_args));
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

/* The label of a server sweep point. */
static const char *args_label(const char *args)
{
    return args && args[0] ? args : "(no extra args)";
}

/* One row per server sweep point, labelled by its args; a failed point says why. */
static void server_table(FILE *f, const struct summary *s, char *const *errs, int n,
                         const struct opts *o)
{
    fprintf(f, "%3s %8s %10s %9s %9s %9s %9s %9s %7s  %s\n", "#", "req/s", "out tok/s", "TTFT p50",
            "TTFT p99", "ITL p50", "ITL p99", "TPOT p99", "failed", "server args");
    for (int i = 0; i < n; i++) {
        if (errs[i]) {
            fprintf(f, "%3d %s: %s\n", i + 1, args_label(o->server_args[i]), errs[i]);
            continue;
        }
        fprintf(f, "%3d %8.2f %10.1f %9.1f %9.1f %9.2f %9.2f %9.2f %7d  %s\n", i + 1,
                s[i].request_throughput, s[i].output_throughput, s[i].ttft.median, s[i].ttft.p99,
                s[i].itl.median, s[i].itl.p99, s[i].tpot.p99, s[i].failed,
                args_label(o->server_args[i]));
    }
    fprintf(f, "(latencies in ms; server: %s ARGS)\n", o->server_cmd);
}

/* The server of one run: started with args, a client for it, ready, the model known. On a
 * failure *srv may be set (stop it) and err says why. */
static int server_up(const struct opts *o, const char *args, const struct hc_url *url,
                     struct server **srv, struct hc **c, char **model, struct err *e)
{
    if (!(*srv = server_start(o->server_cmd, args, o->server_log, e))) return -1;
    struct hc_tls_opts tls = {.insecure = o->insecure, .cafile = o->cafile};
    *c = hc_create(url, o->http2 ? HC_HTTP2 : HC_HTTP1, o->h2_connections, o->api_key, &tls, e);
    if (!*c) return -1;
    if (server_wait_ready(*srv, *c, o->server_timeout, &run_interrupted, e)) return -1;
    if (!*model && !(*model = first_model(*c, e))) return -1;
    return 0;
}

/* A server sweep point that did not run: the message, and an entry of the JSON runs. */
static char *point_failed(cJSON *runs, const char *args, const struct err *e)
{
    fprintf(stderr, "pagoda-bench: %s\n", e->msg);
    cJSON *rj = cJSON_CreateObject();
    cJSON_AddStringToObject(rj, "server_args", args);
    cJSON_AddStringToObject(rj, "error", e->msg);
    cJSON_AddItemToArray(runs, rj);
    return xstrdup(e->msg);
}

static void server_down(const struct opts *o, struct server **srv, struct hc **c)
{
    hc_destroy(*c);
    *c = NULL;
    if (!*srv) return;
    int st = server_stop(*srv, o->server_grace);
    *srv = NULL;
    if (st != 0 && st != 128 + SIGTERM)
        fprintf(stderr, "pagoda-bench: note: the server ended with %s %d\n",
                st < 0     ? "SIGKILL, status"
                : st > 128 ? "signal"
                           : "exit status",
                st > 128 ? st - 128 : st);
}

int main(int argc, char **argv)
{
    struct opts o;
    int rc = opts_parse(argc, argv, &o);
    if (rc) {
        opts_dispose(&o);
        return rc > 0 ? 0 : 2;
    }
    raise_fd_limit(&o);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_sigint);

    struct err e = {{0}};
    struct hc_url url;
    struct tok *tok = NULL;
    cJSON *extra = NULL;
    char *model = NULL;
    struct hc *c = NULL;
    struct server *srv = NULL;
    struct dataset ds = {0};
    struct trace tr = {0};
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
    if (o.model) model = xstrdup(o.model);
    if (!o.server_cmd) {
        struct hc_tls_opts tls = {.insecure = o.insecure, .cafile = o.cafile};
        c = hc_create(&url, o.http2 ? HC_HTTP2 : HC_HTTP1, o.h2_connections, o.api_key, &tls, &e);
        if (!c) goto fail;
        if (!model && !(model = first_model(c, &e))) goto fail;
    }
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

    /* Each run of a load sweep gets its own prompts (a prefix cache must not carry one run's
     * prompts into the next); the points of a server sweep, each on a fresh server, all send
     * the same ones. The warm-up prompts come after all of them. */
    int n_runs = o.n_sweep ? o.n_sweep : o.n_server_args ? o.n_server_args : 1;
    int sets = o.n_sweep ? o.n_sweep : 1;
    int base = o.num_prompts > 0 ? o.num_prompts : 1000;
    int num_prompts = o.num_prompts;
    double duration = o.duration;
    struct dataset_cfg dc = {.kind = o.dataset,
                             .path = o.dataset_path,
                             .num = base * sets + o.warmup,
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
    if ((o.dataset == DS_SHAREGPT || o.dataset == DS_JSONL || o.dataset == DS_TRACE) &&
        !o.output_len_given)
        dc.output_len = 0;
    if (o.dataset == DS_TRACE) {
        /* the trace is cut before the run, so that every run sends exactly these requests */
        if (trace_load(o.trace_file, &tr, &e)) goto fail;
        base = trace_count(&tr, o.trace_speedup, o.duration, o.num_given ? o.num_prompts : 0);
        if (base < 1) {
            err_set(&e, "%s: no request arrives within --duration %g s", o.trace_file, o.duration);
            goto fail;
        }
        if (trace_build(&tr, base, o.warmup, o.trace_speedup, o.trace_block_size, &dc, &ds, &e))
            goto fail;
        num_prompts = base;
        duration = 0;
        fprintf(stderr,
                "pagoda-bench: %s: %s trace, %d requests over %.1f s (of %d), speed-up %g\n",
                o.trace_file, trace_format_name(tr.format), base, ds.p[base - 1].arrival, tr.n,
                o.trace_speedup);
    } else if (dataset_build(&dc, &ds, &e)) {
        goto fail;
    }

    const char *load_name = o.rate_given ? "request rate" : "concurrency";
    int sweep = o.n_sweep || o.n_server_args;
    struct summary *sums = xcalloc((size_t)n_runs, sizeof *sums);
    char **errs = xcalloc((size_t)n_runs, sizeof *errs); /* server sweep: why a point failed */
    cJSON *doc = cJSON_CreateObject();
    cJSON *runs_json = sweep ? cJSON_AddArrayToObject(doc, "runs") : NULL;
    int show = o.progress < 0 ? isatty(2) : o.progress;
    char amount[64];
    if (num_prompts > 0)
        snprintf(amount, sizeof amount, "%d prompts", num_prompts);
    else
        snprintf(amount, sizeof amount, "for %g s", duration);
    fprintf(stderr, "pagoda-bench: %s %s, model %s, %s, %s\n", o.base_url,
            o.chat ? "chat" : "completions", model ? model : "(from the server)",
            o.http2   ? (url.tls ? "HTTP/2 (h2, TLS)" : "HTTP/2 (h2c)")
            : url.tls ? "HTTP/1.1 over TLS"
                      : "HTTP/1.1",
            amount);
    int fatal = 0;
    for (int k = 0; k < n_runs && !run_interrupted; k++) {
        const char *sargs = o.n_server_args ? o.server_args[k] : NULL;
        if (o.n_server_args) fprintf(stderr, "-- server args %d: %s\n", k + 1, args_label(sargs));
        if (o.server_cmd && server_up(&o, sargs, &url, &srv, &c, &model, &e)) {
            server_down(&o, &srv, &c);
            if (!o.n_server_args) {
                fatal = 1;
                break;
            }
            errs[k] = point_failed(runs_json, sargs, &e);
            continue;
        }
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
                              .num_prompts = num_prompts,
                              .duration = duration,
                              .warmup = o.warmup,
                              .warmup_base = base * sets,
                              .first_index = o.n_sweep ? k * base : 0,
                              .replay = o.dataset == DS_TRACE,
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
            server_down(&o, &srv, &c);
            if (!o.n_server_args) {
                fatal = 1;
                break;
            }
            errs[k] = point_failed(runs_json, sargs, &e);
            continue;
        }
        read_metrics(c, o.metrics, &after);
        if (o.server_cmd) server_down(&o, &srv, &c);
        struct summary *s = &sums[k];
        s->load = o.n_sweep ? o.sweep[k] : o.rate_given ? o.rate : o.concurrency;
        s->prefix_cache_hit_rate = metrics_hit_rate(&before, &after);
        metrics_spec(&before, &after, &s->spec_acceptance_rate, &s->spec_acceptance_length);
        summary_compute(out.r, out.n, out.duration, &o.slo, s);
        if (!sweep) summary_print(stdout, s);
        for (int i = 0, shown = 0; i < out.n && shown < 3; i++)
            if (!out.r[i].ok) {
                fprintf(stderr, "pagoda-bench: request %d failed: %s\n", i, out.r[i].error);
                shown++;
            }
        cJSON *sj = summary_json(s);
        if (sweep) {
            if (o.n_server_args) cJSON_AddStringToObject(sj, "server_args", sargs);
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
    if (!fatal && o.n_sweep) {
        sweep_table(stdout, sums, n_runs, load_name);
        char title[512];
        snprintf(title, sizeof title, "%s (%s, %s): throughput vs latency", model,
                 o.chat ? "chat" : "completions", proto_name(&o));
        if (o.plot_path && plot_sweep_svg(o.plot_path, sums, n_runs, load_name, title, &e))
            fprintf(stderr, "pagoda-bench: %s\n", e.msg);
    }
    if (!fatal && o.n_server_args) {
        int done_runs = cJSON_GetArraySize(runs_json);
        server_table(stdout, sums, errs, done_runs, &o);
        char title[512];
        snprintf(title, sizeof title, "%s (%s, %s): throughput vs P99 latency by server args",
                 model ? model : "", o.chat ? "chat" : "completions", proto_name(&o));
        if (o.plot_path && plot_server_svg(o.plot_path, sums, o.server_args,
                                           (const char *const *)errs, done_runs, title, &e))
            fprintf(stderr, "pagoda-bench: %s\n", e.msg);
    }
    status = fatal;
    if (!fatal) {
        cJSON *cfg = config_json(&o, model ? model : "");
        if (o.dataset == DS_TRACE) {
            cJSON_AddStringToObject(cfg, "trace_format", trace_format_name(tr.format));
            cJSON_ReplaceItemInObjectCaseSensitive(cfg, "num_prompts", cJSON_CreateNumber(base));
        }
        cJSON_AddItemToObject(doc, "config", cfg);
        cJSON_DetachItemViaPointer(doc, cfg); /* keeps its name: back in as the first member */
        cJSON_InsertItemInArray(doc, 0, cfg);
        if (o.json_path && write_json(o.json_path, doc)) status = 1;
    }
    for (int k = 0; k < n_runs; k++) {
        if (sums[k].failed) status = status ? status : 3;
        if (errs[k]) status = status ? status : 4;
        free(errs[k]);
    }
    cJSON_Delete(doc);
    free(sums);
    free(errs);
    if (fatal) goto fail;
    if (run_interrupted) {
        fprintf(stderr, "pagoda-bench: interrupted\n");
        status = 130;
    }
    goto done;
fail:
    fprintf(stderr, "pagoda-bench: %s\n", e.msg);
done:
    server_down(&o, &srv, &c);
    dataset_free(&ds);
    trace_free(&tr);
    tok_destroy(tok);
    cJSON_Delete(extra);
    free(model);
    opts_dispose(&o);
    return status;
}
