/* serve: the HTTP server (OpenAI and Anthropic APIs) in front of the engine. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "common/util.h"
#include "http/server.h"
#include "paged_kv/kv_events.h"
#include "text/grammar.h"
#include "text/reasoning.h"
#include "text/toolcall.h"

/* The model served when --model is not given (when that folder exists). */
#define DEFAULT_MODEL "models/demo"

static void usage_serve(FILE *f)
{
    fprintf(f,
            "usage: pagoda serve [--model DIR | --model NAME=DIR ...] [options]\n"
            "  --model DIR              model folder (default " DEFAULT_MODEL ")\n"
            "  --model NAME[,ALIAS...]=DIR  repeated: several models, routed by the request's\n"
            "                           \"model\", each loaded when a request first names it\n"
            "  --models-file F          models one a line, as NAME[,ALIAS...]=DIR ('#' comments)\n"
            "  --served-model-name S... the names of the one model clients send, the first in\n"
            "                           responses (default: DIR's name)\n"
            "  --model-idle-timeout S   unload a model nothing used for S seconds; the next\n"
            "                           request loads it again (default 0: never)\n"
            "  --models-memory-budget BYTES  bytes the loaded models may take (folder files\n"
            "                           plus KV pool); idle models are unloaded, least recently\n"
            "                           used first, to load another (default 0: no bound)\n"
            "  --host H                 listen address (default 127.0.0.1)\n"
            "  --port P                 listen port (default 8080; 0 picks a free one)\n"
            "  --http-threads N         event-loop threads (default 1)\n"
            "  --tls-cert F --tls-key F serve HTTPS (HTTP/2 by ALPN) with these PEM files\n"
            "  --api-key KEY            require 'Authorization: Bearer KEY' or 'x-api-key'\n"
            "  --max-body-size BYTES    largest request body (default 8388608)\n"
            "  --shutdown-timeout S     seconds in-flight requests get on SIGTERM (default 30)\n"
            "  --grammar-compile-timeout MS\n"
            "                           compiling a request's JSON schema, regex or grammar past\n"
            "                           this is a 400 (default 5000; 0: no bound)\n"
            "  --chat-template FILE     a Jinja chat template in place of the model's\n"
            "  --tool-call-parser NAME  how tool calls look in the output: hermes, qwen3_xml,\n"
            "                           llama3_json, mistral, gemma4, harmony (default: from the\n"
            "                           template)\n"
            "  --enable-auto-tool-choice  accepted for vLLM compatibility (auto is always on)\n"
            "  --reasoning-parser NAME  qwen3, deepseek_r1, gemma4 or harmony: thinking text goes\n"
            "                           to reasoning_content / thinking blocks (default: none)\n"
            "  --skip-tokenizer-init    load no tokenizer: /v1/completions takes token-id prompts\n"
            "                           and answers with token_ids (text \"\"); chat, text\n"
            "                           prompts, stop strings, /tokenize are a 400\n"
            "  --allowed-origins L      CORS origins: * (default), a comma or JSON list, or ''\n"
            "                           for no CORS headers\n"
            "  --max-waiting-requests N requests waiting for the engine at most; more get a\n"
            "                           429 with Retry-After (default 0: no bound)\n"
            "  --max-streams-per-connection N  generation requests one connection may have\n"
            "                           in progress; more get a 429 (default 0: no bound)\n"
            "  --max-stream-buffer BYTES  output a stream may hold for a client that does not\n"
            "                           read; past it the request is aborted (default 1048576)\n"
            "  --stream-idle-timeout S  a stream whose write waits S seconds for its client\n"
            "                           is aborted and its connection closed (default 60)\n"
            "  --kv-events-config JSON  publish KV-cache events over ZeroMQ as vLLM does, e.g.\n"
            "                           '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\n"
            "                           \"endpoint\":\"tcp://*:5557\",\"topic\":\"kv-events\"}'\n"
            "%s",
            arg_engine_usage);
}

/* Raises the soft open-files limit to the hard one (every connection is a descriptor) and
 * says so; warns when even the hard limit is below what the admission settings let in: the
 * running requests of every model and the waiting ones, one connection each, plus the
 * models' and loops' own. */
static void raise_fd_limit(const struct http_config *cfg)
{
    unsigned long long hard, soft = util_raise_nofile("pagoda serve", &hard);
    int seqs = cfg->engine.max_num_seqs > 0 ? cfg->engine.max_num_seqs : 256;
    int waiting = cfg->max_waiting > 0 ? cfg->max_waiting : 0;
    /* every model has its own engine, each running up to seqs requests */
    unsigned long long need = (unsigned long long)seqs * (unsigned long long)cfg->n_models +
                              (unsigned long long)waiting + 64;
    if (soft && soft < need)
        fprintf(stderr,
                "pagoda serve: open files limit %llu (hard limit %llu) is below the %llu that "
                "--max-num-seqs %d and --max-waiting-requests %d (0: no bound) need; more "
                "connections wait in the listen queue\n",
                soft, hard, need, seqs, waiting);
}

/* The models to serve from --model (DIR or NAME=DIR, repeated), --models-file and
 * --served-model-name (names of a single model given as DIR, as vLLM's). */
static int collect_models(const char **args, int n_args, const char *file, const char **names,
                          int n_names, struct http_model_spec **specs, int *n)
{
    struct err e = {0};
    for (int k = 0; k < n_args; k++) {
        struct http_model_spec sp;
        if (http_model_spec_parse(args[k], &sp, &e) < 0) goto fail;
        *specs = xrealloc(*specs, sizeof **specs * (size_t)(*n + 1));
        (*specs)[(*n)++] = sp;
    }
    if (file && http_model_specs_read(file, specs, n, &e) < 0) goto fail;
    if (*n == 0) {
        struct stat st;
        if (stat(DEFAULT_MODEL, &st) != 0 || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "pagoda serve: --model DIR is required (no %s folder here)\n",
                    DEFAULT_MODEL);
            return -1;
        }
        *specs = xcalloc(1, sizeof **specs);
        if (http_model_spec_parse(DEFAULT_MODEL, &(*specs)[(*n)++], &e) < 0) goto fail;
    }
    if (n_names) {
        if (*n > 1 || file ||
            (n_args == 1 && strchr(args[0], '=') && strcmp((*specs)[0].dir, args[0]) != 0)) {
            fprintf(stderr, "pagoda serve: --served-model-name names the one model of --model "
                            "DIR; with several models give the names as --model NAME,ALIAS=DIR\n");
            return -1;
        }
        struct http_model_spec *sp = &(*specs)[0];
        for (int k = 0; k < sp->n_names; k++) free(sp->names[k]);
        sp->n_names = 0;
        for (int k = 0; k < n_names; k++) sp->names[sp->n_names++] = xstrdup(names[k]);
    }
    return 0;
fail:
    fprintf(stderr, "pagoda serve: %s\n", e.msg);
    return -1;
}

int cli_serve(int argc, char **argv)
{
    struct http_config cfg;
    http_config_default(&cfg);
    const char *model_args[256], *names[HTTP_MODEL_MAX_NAMES], *models_file = NULL;
    int n_model_args = 0, n_names = 0;
    const char *kv_events_json = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int r = arg_engine_option(argc, argv, &i, &cfg.engine);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_serve(stdout);
            return 0;
        }
        if (!strcmp(a, "--skip-tokenizer-init")) {
            cfg.skip_tokenizer_init = 1;
            continue;
        }
        if (!strcmp(a, "--enable-auto-tool-choice")) continue;
        static const char *const with_value[] = {"--model",
                                                 "--served-model-name",
                                                 "--models-file",
                                                 "--model-idle-timeout",
                                                 "--models-memory-budget",
                                                 "--host",
                                                 "--port",
                                                 "--http-threads",
                                                 "--tls-cert",
                                                 "--tls-key",
                                                 "--api-key",
                                                 "--max-body-size",
                                                 "--shutdown-timeout",
                                                 "--max-stream-buffer",
                                                 "--max-waiting-requests",
                                                 "--allowed-origins",
                                                 "--max-streams-per-connection",
                                                 "--stream-idle-timeout",
                                                 "--grammar-compile-timeout",
                                                 "--chat-template",
                                                 "--tool-call-parser",
                                                 "--reasoning-parser",
                                                 "--kv-events-config",
                                                 NULL};
        int known = 0;
        for (int k = 0; with_value[k]; k++) known |= !strcmp(a, with_value[k]);
        if (!known) {
            fprintf(stderr, "pagoda serve: unknown option '%s'\n", a);
            usage_serve(stderr);
            return 2;
        }
        if (!(v = arg_value(argc, argv, &i))) return 2;
        long n;
        double d;
        if (!strcmp(a, "--model")) {
            if (n_model_args == (int)(sizeof model_args / sizeof model_args[0])) {
                fprintf(stderr, "pagoda serve: more than %d --model options\n", n_model_args);
                return 2;
            }
            model_args[n_model_args++] = v;
        } else if (!strcmp(a, "--served-model-name")) {
            /* one or more names: this value and the arguments after it up to an option */
            n_names = 0;
            for (;;) {
                if (n_names == HTTP_MODEL_MAX_NAMES) {
                    fprintf(stderr, "pagoda serve: --served-model-name: more than %d names\n",
                            HTTP_MODEL_MAX_NAMES);
                    return 2;
                }
                if (!*v) {
                    fprintf(stderr, "pagoda serve: --served-model-name: an empty name\n");
                    return 2;
                }
                names[n_names++] = v;
                if (i + 1 >= argc || argv[i + 1][0] == '-') break;
                v = argv[++i];
            }
        } else if (!strcmp(a, "--models-file"))
            models_file = v;
        else if (!strcmp(a, "--model-idle-timeout")) {
            if (arg_float(a, v, &d)) return 2;
            if (!(d >= 0 && d <= 86400 * 365)) {
                fprintf(stderr, "pagoda serve: --model-idle-timeout must be >= 0 seconds\n");
                return 2;
            }
            cfg.model_idle_timeout = d;
        } else if (!strcmp(a, "--models-memory-budget")) {
            if (arg_int(a, v, 0, LONG_MAX, &n)) return 2;
            cfg.models_budget = (size_t)n;
        } else if (!strcmp(a, "--host"))
            cfg.host = v;
        else if (!strcmp(a, "--kv-events-config"))
            kv_events_json = v;
        else if (!strcmp(a, "--tls-cert"))
            cfg.tls_cert = v;
        else if (!strcmp(a, "--tls-key"))
            cfg.tls_key = v;
        else if (!strcmp(a, "--api-key"))
            cfg.api_key = v;
        else if (!strcmp(a, "--chat-template"))
            cfg.chat_template = v;
        else if (!strcmp(a, "--tool-call-parser"))
            cfg.tool_call_parser = v;
        else if (!strcmp(a, "--reasoning-parser"))
            cfg.reasoning_parser = v;
        else if (!strcmp(a, "--port")) {
            if (arg_int(a, v, 0, 65535, &n)) return 2;
            cfg.port = (int)n;
        } else if (!strcmp(a, "--http-threads")) {
            if (arg_int(a, v, 1, 256, &n)) return 2;
            cfg.threads = (int)n;
        } else if (!strcmp(a, "--max-body-size")) {
            if (arg_int(a, v, 1024, 1L << 32, &n)) return 2;
            cfg.max_body = (size_t)n;
        } else if (!strcmp(a, "--grammar-compile-timeout")) {
            if (arg_int(a, v, 0, 3600000, &n)) return 2;
            gram_set_compile_timeout((int)n);
        } else if (!strcmp(a, "--shutdown-timeout")) {
            if (arg_float(a, v, &d)) return 2;
            if (d < 0 || d > 86400) {
                fprintf(stderr, "pagoda serve: --shutdown-timeout must be 0..86400 seconds\n");
                return 2;
            }
            cfg.shutdown_timeout = d;
        } else if (!strcmp(a, "--allowed-origins")) {
            cfg.allowed_origins = v;
        } else if (!strcmp(a, "--max-waiting-requests")) {
            if (arg_int(a, v, 0, 1L << 24, &n)) return 2;
            cfg.max_waiting = (int)n;
        } else if (!strcmp(a, "--max-streams-per-connection")) {
            if (arg_int(a, v, 0, 1L << 20, &n)) return 2;
            cfg.max_conn_streams = (int)n;
        } else if (!strcmp(a, "--max-stream-buffer")) {
            if (arg_int(a, v, 1024, 1L << 32, &n)) return 2;
            cfg.max_stream_buffer = (size_t)n;
        } else if (!strcmp(a, "--stream-idle-timeout")) {
            if (arg_float(a, v, &d)) return 2;
            if (!(d > 0 && d <= 86400)) {
                fprintf(stderr,
                        "pagoda serve: --stream-idle-timeout must be in (0, 86400] seconds\n");
                return 2;
            }
            cfg.stream_idle_timeout = d;
        }
    }
    struct http_model_spec *specs = NULL;
    int n_specs = 0;
    if (collect_models(model_args, n_model_args, models_file, names, n_names, &specs, &n_specs) <
        0) {
        for (int k = 0; k < n_specs; k++) http_model_spec_dispose(&specs[k]);
        free(specs);
        return 2;
    }
    cfg.models = specs;
    cfg.n_models = n_specs;
    if (cfg.api_key && !cfg.api_key[0]) {
        fprintf(stderr, "pagoda serve: --api-key must not be empty\n");
        return 2;
    }
    if (cfg.tool_call_parser && tcall_format_from_name(cfg.tool_call_parser) < 0) {
        fprintf(stderr,
                "pagoda serve: --tool-call-parser '%s' is not known (hermes, qwen3_xml, "
                "llama3_json, mistral, gemma4, harmony)\n",
                cfg.tool_call_parser);
        return 2;
    }
    if (cfg.reasoning_parser && reason_format_from_name(cfg.reasoning_parser) < 0) {
        fprintf(stderr,
                "pagoda serve: --reasoning-parser '%s' is not known (qwen3, "
                "deepseek_r1, gemma4, harmony)\n",
                cfg.reasoning_parser);
        return 2;
    }
    struct err e = {0};
    struct kv_events *kv_events = NULL;
    int rc = 0;
    if (kv_events_json) {
        struct kv_events_config kc;
        if (kv_events_config_parse(kv_events_json, &kc, &e) != 0) {
            fprintf(stderr, "pagoda serve: %s\n", e.msg);
            rc = 2;
        } else if (kc.enable && kc.zmq && cfg.n_models > 1) {
            /* one engine reports into one publisher; several would need one stream each */
            fprintf(stderr, "pagoda serve: --kv-events-config serves one model only (%d given)\n",
                    cfg.n_models);
            rc = 2;
        } else if (!(kv_events = kv_events_create(&kc, &e)) && kc.enable && kc.zmq) {
            fprintf(stderr, "pagoda serve: %s\n", e.msg);
            rc = 1;
        } else if (kv_events) {
            fprintf(stderr, "pagoda serve: KV-cache events on %s (topic \"%s\")\n", kc.endpoint,
                    kc.topic);
        }
        cfg.engine.kv_events = kv_events;
    }
    if (rc == 0) {
        raise_fd_limit(&cfg);
        if (http_serve(&cfg, &e) != 0) {
            fprintf(stderr, "pagoda serve: %s\n", e.msg);
            rc = 1;
        }
    }
    kv_events_destroy(kv_events);
    for (int k = 0; k < n_specs; k++) http_model_spec_dispose(&specs[k]);
    free(specs);
    return rc;
}
