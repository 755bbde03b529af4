/* pagoda-bench's command line: see opts.h. */
#include "bench/opts.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void opts_usage(FILE *f)
{
    fputs(
        "usage: pagoda-bench [options]\n"
        "Load-tests an OpenAI-compatible server (pagoda, vLLM, llama.cpp) with streamed requests.\n"
        "\nserver:\n"
        "  --base-url URL           http[s]://host:port[/prefix] (default http://127.0.0.1:8080)\n"
        "  --endpoint E             completions (default) or chat\n"
        "  --model NAME             model field of requests (default: first of GET /v1/models)\n"
        "  --http2                  HTTP/2: h2c (prior knowledge), or h2 by ALPN for https\n"
        "  --http2-connections N    connections the HTTP/2 streams are spread over (default 1)\n"
        "  --api-key KEY            Authorization: Bearer KEY (default $OPENAI_API_KEY)\n"
        "  --cacert FILE            https: verify the server with these PEM CA certificates\n"
        "  --insecure               https: do not verify the server's certificate\n"
        "\nload:\n"
        "  --concurrency C          requests in flight at most (closed loop without a rate)\n"
        "  --request-rate R         open loop: R requests/s (default inf: all at once)\n"
        "  --arrival A              poisson (default) or constant gaps\n"
        "  --burstiness B           gamma shape of the gaps; 1 = Poisson, < 1 burstier\n"
        "  --num-prompts N          measured requests (default 100; 0 = until --duration)\n"
        "  --duration S             send no new request after S seconds\n"
        "  --warmup N               unmeasured requests first (default 1)\n"
        "  --timeout S              per request (default 600)\n"
        "  --sweep L1,L2,...        run once per load: concurrencies, or request rates when\n"
        "                           --request-rate is given; prints a table (and --plot)\n"
        "\nserver sweep:\n"
        "  --server-cmd CMD         start the server with this shell command for each run, wait\n"
        "                           for /health (or /v1/models), stop it after (SIGTERM)\n"
        "  --sweep-server-args \"A1;A2;...\"  one run per item: CMD A1, CMD A2, ... (an empty\n"
        "                           item: CMD alone); a table, --json runs and --plot by args\n"
        "  --server-timeout S       seconds a server may take to answer (default 600)\n"
        "  --server-grace S         seconds from SIGTERM to SIGKILL (default 30)\n"
        "  --server-log FILE        append the server's output here (default: stderr)\n"
        "\nprompts:\n"
        "  --dataset D              random (default), sharegpt, prefix-repetition, jsonl,\n"
        "                           multi-turn, trace\n"
        "  --dataset-path FILE      ShareGPT JSON or JSON-lines file\n"
        "  --trace-file FILE        trace: Azure LLM inference CSV or Mooncake JSON lines; each\n"
        "                           request at its arrival time, max_tokens its output length\n"
        "                           (implies --ignore-eos); --num-prompts / --duration cut it\n"
        "  --trace-speedup X        trace: arrivals X times faster (default 1)\n"
        "  --trace-block-size N     trace: tokens of a Mooncake hash id block (default 512)\n"
        "  --input-len N            random: prompt tokens (default 128)\n"
        "  --output-len N           max_tokens (default 128; overrides file datasets)\n"
        "  --range-ratio R          random: lengths uniform in len*(1-R)..len*(1+R) (default 0)\n"
        "  --prefix-len N           prefix-repetition: shared prefix tokens (default 256)\n"
        "  --suffix-len N           prefix-repetition: distinct suffix tokens (default 64)\n"
        "  --num-prefixes N         prefix-repetition: distinct prefixes (default 4)\n"
        "  --num-conversations N    multi-turn: conversations, run side by side (default 8)\n"
        "  --turns T                multi-turn: turns of each (default 4); each turn sends the\n"
        "                           whole conversation so far (completions, token ids)\n"
        "  --turn-input-len I       multi-turn: new prompt tokens a turn (default 128)\n"
        "  --turn-output-len O      multi-turn: max_tokens a turn (default 64)\n"
        "  --tokenizer DIR          the model's tokenizer.json: token-exact text prompts\n"
        "  --vocab-size N           without --tokenizer, completions prompts are token ids\n"
        "                           drawn below N (default 1000)\n"
        "  --temperature T          (default 0; negative: not sent)\n"
        "  --ignore-eos             ask for exactly max_tokens outputs (vLLM, pagoda, llama.cpp)\n"
        "  --extra-body JSON        members added to every request body\n"
        "  --seed S                 prompts and arrivals (default 0)\n"
        "\nreport:\n"
        "  --slo ttft:MS,tpot:MS,e2e:MS   goodput: requests/s meeting every objective\n"
        "  --json FILE              the results as JSON\n"
        "  --plot FILE.svg          latency CDFs and throughput over time (sweep: vs latency)\n"
        "  --progress, --no-progress   the live progress line (default: on a terminal)\n"
        "  --no-metrics             do not read the server's /metrics\n",
        f);
}

static int bad(const char *opt, const char *v, const char *what)
{
    if (v)
        fprintf(stderr, "pagoda-bench: %s %s: %s\n", opt, v, what);
    else
        fprintf(stderr, "pagoda-bench: %s: %s\n", opt, what);
    return -1;
}

static int get_int(const char *opt, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        char msg[96];
        snprintf(msg, sizeof msg, "expected an integer in [%ld, %ld]", lo, hi);
        return bad(opt, v, msg);
    }
    *out = (int)x;
    return 0;
}

static int get_double(const char *opt, const char *v, double lo, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (!strcmp(v, "inf")) x = INFINITY, end = (char *)v + 3;
    if (errno || end == v || *end || isnan(x) || x < lo) {
        char msg[96];
        snprintf(msg, sizeof msg, "expected a number >= %g", lo);
        return bad(opt, v, msg);
    }
    *out = x;
    return 0;
}

/* "A1;A2;...": items trimmed; an empty item is the command alone. */
static int parse_server_args(const char *opt, const char *v, struct opts *o)
{
    free(o->server_args_buf);
    char *buf = o->server_args_buf = strdup(v);
    if (!buf) return bad(opt, NULL, "out of memory");
    o->n_server_args = 0;
    for (char *p = buf;;) {
        char *semi = strchr(p, ';');
        if (semi) *semi = 0;
        while (*p == ' ' || *p == '\t') p++;
        size_t len = strlen(p);
        while (len && (p[len - 1] == ' ' || p[len - 1] == '\t')) p[--len] = 0;
        if (o->n_server_args == OPTS_MAX_SWEEP)
            return bad(opt, v, "at most 32 items separated by ';'");
        o->server_args[o->n_server_args++] = p;
        if (!semi) break;
        p = semi + 1;
    }
    return 0;
}

void opts_dispose(struct opts *o)
{
    free(o->server_args_buf);
    o->server_args_buf = NULL;
}

int opts_parse(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->base_url = "http://127.0.0.1:8080";
    o->h2_connections = 1;
    o->api_key = getenv("OPENAI_API_KEY");
    o->burstiness = 1.0;
    o->num_prompts = 100;
    o->warmup = 1;
    o->timeout = 600;
    o->input_len = 128;
    o->output_len = 128;
    o->prefix_len = 256;
    o->suffix_len = 64;
    o->num_prefixes = 4;
    o->num_conversations = 8;
    o->turns = 4;
    o->turn_input_len = 128;
    o->turn_output_len = 64;
    o->vocab_size = 1000;
    o->progress = -1;
    o->metrics = 1;
    o->trace_speedup = 1;
    o->trace_block_size = 512;
    o->server_timeout = 600;
    o->server_grace = 30;
    int dataset_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            opts_usage(stdout);
            return 1;
        }
        /* flags without a value */
        if (!strcmp(a, "--http2")) {
            o->http2 = 1;
            continue;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = 1;
            continue;
        } else if (!strcmp(a, "--progress")) {
            o->progress = 1;
            continue;
        } else if (!strcmp(a, "--no-progress")) {
            o->progress = 0;
            continue;
        } else if (!strcmp(a, "--no-metrics")) {
            o->metrics = 0;
            continue;
        } else if (!strcmp(a, "--insecure")) {
            o->insecure = 1;
            continue;
        }
        if (strncmp(a, "--", 2)) return bad(a, NULL, "unexpected argument (see --help)");
        if (i + 1 >= argc) return bad(a, NULL, "needs a value (or is unknown: see --help)");
        const char *v = argv[++i];
        int rc = 0;
        struct err e = {{0}};
        if (!strcmp(a, "--base-url"))
            o->base_url = v;
        else if (!strcmp(a, "--endpoint")) {
            if (!strcmp(v, "chat"))
                o->chat = 1;
            else if (!strcmp(v, "completions"))
                o->chat = 0;
            else
                rc = bad(a, v, "expected chat or completions");
        } else if (!strcmp(a, "--model"))
            o->model = v;
        else if (!strcmp(a, "--http2-connections"))
            rc = get_int(a, v, 1, 1024, &o->h2_connections);
        else if (!strcmp(a, "--api-key"))
            o->api_key = v;
        else if (!strcmp(a, "--cacert"))
            o->cafile = v;
        else if (!strcmp(a, "--concurrency"))
            rc = get_int(a, v, 1, 1000000, &o->concurrency);
        else if (!strcmp(a, "--request-rate")) {
            rc = get_double(a, v, 0, &o->rate);
            if (!rc && !(o->rate > 0)) rc = bad(a, v, "must be positive (or inf)");
            if (isinf(o->rate)) o->rate = 0;
            o->rate_given = 1;
        } else if (!strcmp(a, "--arrival")) {
            if (!strcmp(v, "poisson"))
                o->constant_arrival = 0;
            else if (!strcmp(v, "constant"))
                o->constant_arrival = 1;
            else
                rc = bad(a, v, "expected poisson or constant");
        } else if (!strcmp(a, "--burstiness")) {
            rc = get_double(a, v, 0, &o->burstiness);
            if (!rc && !(o->burstiness > 0 && isfinite(o->burstiness)))
                rc = bad(a, v, "must be a positive number");
        } else if (!strcmp(a, "--num-prompts")) {
            rc = get_int(a, v, 0, 100000000, &o->num_prompts);
            o->num_given = 1;
        } else if (!strcmp(a, "--duration")) {
            rc = get_double(a, v, 0, &o->duration);
            if (!rc && !(o->duration > 0 && isfinite(o->duration)))
                rc = bad(a, v, "must be a positive number of seconds");
        } else if (!strcmp(a, "--warmup"))
            rc = get_int(a, v, 0, 100000, &o->warmup);
        else if (!strcmp(a, "--timeout")) {
            rc = get_double(a, v, 0, &o->timeout);
            if (!rc && !(o->timeout > 0)) rc = bad(a, v, "must be positive");
        } else if (!strcmp(a, "--dataset")) {
            dataset_given = 1;
            if (dataset_kind_parse(v, &o->dataset, &e)) {
                fprintf(stderr, "pagoda-bench: %s\n", e.msg);
                rc = -1;
            }
        } else if (!strcmp(a, "--dataset-path"))
            o->dataset_path = v;
        else if (!strcmp(a, "--input-len"))
            rc = get_int(a, v, 1, 10000000, &o->input_len);
        else if (!strcmp(a, "--output-len")) {
            rc = get_int(a, v, 1, 10000000, &o->output_len);
            o->output_len_given = 1;
        } else if (!strcmp(a, "--range-ratio")) {
            rc = get_double(a, v, 0, &o->range_ratio);
            if (!rc && o->range_ratio >= 1) rc = bad(a, v, "must be in [0, 1)");
        } else if (!strcmp(a, "--prefix-len"))
            rc = get_int(a, v, 0, 10000000, &o->prefix_len);
        else if (!strcmp(a, "--suffix-len"))
            rc = get_int(a, v, 1, 10000000, &o->suffix_len);
        else if (!strcmp(a, "--num-prefixes"))
            rc = get_int(a, v, 1, 1000000, &o->num_prefixes);
        else if (!strcmp(a, "--num-conversations"))
            rc = get_int(a, v, 1, 100000, &o->num_conversations);
        else if (!strcmp(a, "--turns"))
            rc = get_int(a, v, 1, 10000, &o->turns);
        else if (!strcmp(a, "--turn-input-len"))
            rc = get_int(a, v, 1, 10000000, &o->turn_input_len);
        else if (!strcmp(a, "--turn-output-len"))
            rc = get_int(a, v, 1, 10000000, &o->turn_output_len);
        else if (!strcmp(a, "--tokenizer"))
            o->tokenizer = v;
        else if (!strcmp(a, "--vocab-size"))
            rc = get_int(a, v, 2, 100000000, &o->vocab_size);
        else if (!strcmp(a, "--temperature")) {
            char *end;
            o->temperature = strtod(v, &end);
            if (end == v || *end || isnan(o->temperature)) rc = bad(a, v, "expected a number");
        } else if (!strcmp(a, "--extra-body"))
            o->extra_body = v;
        else if (!strcmp(a, "--slo")) {
            char msg[256];
            if (slo_parse(v, &o->slo, msg)) {
                fprintf(stderr, "pagoda-bench: %s\n", msg);
                rc = -1;
            }
        } else if (!strcmp(a, "--seed")) {
            int s;
            rc = get_int(a, v, 0, 2147483647, &s);
            o->seed = (uint64_t)s;
        } else if (!strcmp(a, "--json"))
            o->json_path = v;
        else if (!strcmp(a, "--plot"))
            o->plot_path = v;
        else if (!strcmp(a, "--sweep")) {
            const char *p = v;
            o->n_sweep = 0;
            while (*p) {
                char *end;
                double x = strtod(p, &end);
                if (end == p || !(x > 0) || !isfinite(x) || (*end && *end != ',') ||
                    o->n_sweep == OPTS_MAX_SWEEP) {
                    rc = bad(a, v, "expected up to 32 positive numbers separated by commas");
                    break;
                }
                o->sweep[o->n_sweep++] = x;
                p = *end ? end + 1 : end;
            }
            if (!rc && !o->n_sweep) rc = bad(a, v, "no load given");
        } else if (!strcmp(a, "--trace-file"))
            o->trace_file = v;
        else if (!strcmp(a, "--trace-speedup")) {
            rc = get_double(a, v, 0, &o->trace_speedup);
            if (!rc && !(o->trace_speedup > 0 && isfinite(o->trace_speedup)))
                rc = bad(a, v, "must be a positive number");
        } else if (!strcmp(a, "--trace-block-size"))
            rc = get_int(a, v, 1, 10000000, &o->trace_block_size);
        else if (!strcmp(a, "--server-cmd")) {
            o->server_cmd = v;
            if (!v[0]) rc = bad(a, NULL, "empty command");
        } else if (!strcmp(a, "--server-log"))
            o->server_log = v;
        else if (!strcmp(a, "--server-timeout")) {
            rc = get_double(a, v, 0, &o->server_timeout);
            if (!rc && !(o->server_timeout > 0)) rc = bad(a, v, "must be positive");
        } else if (!strcmp(a, "--server-grace"))
            rc = get_double(a, v, 0, &o->server_grace);
        else if (!strcmp(a, "--sweep-server-args"))
            rc = parse_server_args(a, v, o);
        else
            rc = bad(a, NULL, "unknown option (see --help)");
        if (rc) return -1;
    }
    if (o->trace_file && !dataset_given) o->dataset = DS_TRACE;
    if (o->dataset == DS_TRACE) {
        if (!o->trace_file) return bad("--dataset trace", NULL, "needs --trace-file FILE");
        if (o->rate_given)
            return bad("--request-rate", NULL,
                       "a trace sets its own arrivals (use --trace-speedup to scale them)");
        if (o->n_sweep)
            return bad("--sweep", NULL,
                       "a trace sets its own load (use --trace-speedup, or --sweep-server-args)");
        o->ignore_eos = 1; /* the trace's output lengths, whatever the model would say */
    } else if (o->trace_file) {
        return bad("--trace-file", o->trace_file, "needs --dataset trace");
    }
    if (o->n_server_args && !o->server_cmd)
        return bad("--sweep-server-args", NULL, "needs --server-cmd");
    if (o->n_server_args && o->n_sweep)
        return bad("--sweep-server-args", NULL,
                   "cannot be combined with --sweep (sweep the loads for one set of server "
                   "args at a time)");
    if (o->server_cmd && o->dataset == DS_MULTITURN)
        return bad("--server-cmd", NULL, "is not supported with --dataset multi-turn");
    if (o->duration > 0 && !o->num_given) o->num_prompts = 0;
    if (o->num_prompts == 0 && o->duration <= 0)
        return bad("--num-prompts", "0", "needs --duration");
    if (o->chat && o->vocab_size != 1000 && !o->tokenizer)
        fprintf(stderr, "pagoda-bench: note: --vocab-size has no effect on chat prompts\n");
    if (o->n_sweep && !o->rate_given) {
        for (int i = 0; i < o->n_sweep; i++)
            if (o->sweep[i] != floor(o->sweep[i]))
                return bad("--sweep", NULL, "concurrencies must be whole numbers");
    }
    return 0;
}
