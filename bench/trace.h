/*
 * trace: request traces for replay (--dataset trace --trace-file F). Two public layouts,
 * told apart by the first non-blank line:
 *   Azure LLM inference trace (CSV)  a header naming TIMESTAMP, ContextTokens and
 *       GeneratedTokens (any order, other columns ignored); timestamps are wall-clock
 *       "YYYY-MM-DD HH:MM:SS[.fraction][Z|+HH:MM]" (the 2023 files have 100 ns ticks) or
 *       plain seconds;
 *   Mooncake (JSON lines)  {"timestamp": MS, "input_length": N, "output_length": N,
 *       "hash_ids": [...]}: each hash id names a block of --trace-block-size (512) prompt
 *       tokens, and requests that list the same id share that block, so a prompt is its
 *       blocks in order (the last one cut to input_length), then unshared tokens.
 * Arrival times are seconds after the trace's earliest request; requests are sorted by them
 * (stable: equal times keep the file's order).
 *
 * Usage: trace_load (or trace_parse on text in memory), then trace_build to turn the first
 * requests into prompts with the random dataset's machinery (token ids, --tokenizer text or
 * words), and trace_free.
 */
#ifndef PAGODA_BENCH_TRACE_H
#define PAGODA_BENCH_TRACE_H

#include <stdint.h>

#include "bench/dataset.h"
#include "common/err.h"

enum trace_format { TRACE_AZURE, TRACE_MOONCAKE };

struct trace_req {
    double t;                      /* s after the earliest request of the trace */
    int32_t input_len, output_len; /* tokens, as the trace gives them (output may be 0) */
    int64_t *hash_ids;             /* Mooncake blocks, heap; NULL when none */
    int n_hash;
    int line; /* 1-based line of the file, for messages */
};

struct trace {
    enum trace_format format;
    struct trace_req *r; /* n requests in arrival order */
    int n;
};

/** Reads and parses a trace file. 0, or -1 + err naming the file, the line and the problem. */
int trace_load(const char *path, struct trace *t, struct err *e);
/** Parses the text of a trace; name is used in messages. 0, or -1 + err. */
int trace_parse(const char *name, const char *text, struct trace *t, struct err *e);
void trace_free(struct trace *t);

/** "azure" or "mooncake". */
const char *trace_format_name(enum trace_format f);

/**
 * How many requests of t arrive before `duration` s of replay at `speedup` (0: no cut),
 * and at most `max` (0: no limit).
 */
int trace_count(const struct trace *t, double speedup, double duration, int max);

/**
 * Prompts for the first n requests of t (arrival times divided by speedup), then `extra`
 * prompts with no arrival and no shared block (warm-up) of the first request's lengths.
 * cfg gives the prompt machinery (token_ids, vocab_size, tok, seed) and output_len
 * (> 0: overrides the trace's lengths). A block's tokens depend only on the seed and its
 * hash id, so requests naming the same ids share exactly those leading tokens.
 * 0, or -1 + err.
 */
int trace_build(const struct trace *t, int n, int extra, double speedup, int block_size,
                const struct dataset_cfg *cfg, struct dataset *ds, struct err *e);

#endif
