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
        "\nprompts:\n"
        "  --dataset D              random (default), sharegpt, prefix-repetition, jsonl\n"
        "  --dataset-path FILE      ShareGPT JSON or JSON-lines file\n"
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
        } else
            rc = bad(a, NULL, "unknown option (see --help)");
        if (rc) return -1;
    }
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
