/* opts: the command line of pagoda-bench (see opts_usage for every flag). */
#ifndef PAGODA_BENCH_OPTS_H
#define PAGODA_BENCH_OPTS_H

#include <stdint.h>
#include <stdio.h>

#include "bench/dataset.h"
#include "bench/stats.h"

#define OPTS_MAX_SWEEP 32

struct opts {
    const char *base_url;
    int chat;
    const char *model;
    int http2, h2_connections;
    const char *api_key;
    int insecure;
    const char *cafile;
    int concurrency;
    double rate; /* 0 = infinite */
    int rate_given;
    int constant_arrival;
    double burstiness;
    int num_prompts;
    int num_given;
    double duration;
    int warmup;
    double timeout;
    enum dataset_kind dataset;
    const char *dataset_path;
    int input_len, output_len, output_len_given;
    double range_ratio;
    int prefix_len, suffix_len, num_prefixes;
    int num_conversations, turns, turn_input_len, turn_output_len; /* multi-turn */
    const char *tokenizer;
    int vocab_size;
    double temperature;
    int ignore_eos;
    const char *extra_body;
    struct slo slo;
    uint64_t seed;
    const char *json_path, *plot_path;
    double sweep[OPTS_MAX_SWEEP];
    int n_sweep;
    int progress; /* -1 auto (a terminal), 0, 1 */
    int metrics;
    /* trace replay (--dataset trace) */
    const char *trace_file;
    double trace_speedup;
    int trace_block_size;
    /* a server started for each run (--server-cmd), with each of server_args appended */
    const char *server_cmd, *server_log;
    double server_timeout, server_grace;
    char *server_args_buf; /* heap: the --sweep-server-args text, split in place */
    const char *server_args[OPTS_MAX_SWEEP];
    int n_server_args; /* 0: no server sweep */
};

void opts_usage(FILE *f);
/** Parses argv; 0, 1 when --help was asked (usage printed), or -1 with a message printed. */
int opts_parse(int argc, char **argv, struct opts *o);
/** Frees what opts_parse allocated. */
void opts_dispose(struct opts *o);

#endif
