/* Small helpers shared by the subcommands: option parsing and model opening. */
#ifndef PAGODA_CLI_ARGS_H
#define PAGODA_CLI_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "model/backend.h"
#include "model/model.h"
#include "sched/engine.h"

/** Value of option argv[*i] (advancing *i), or NULL with a message when it is missing. */
const char *arg_value(int argc, char **argv, int *i);

/** Parses an integer option value within [lo, hi]; -1 with a message when it is not one. */
int arg_int(const char *opt, const char *v, long lo, long hi, long *out);
int arg_float(const char *opt, const char *v, double *out);

/** Parses a byte size: a number with an optional suffix (B, K/KiB, M/MiB, G/GiB powers of
 * 1024; KB, MB, GB powers of 1000); -1 with a message when it is not one. */
int arg_bytes(const char *opt, const char *v, size_t *out);

/** Parses "1 2 3" (spaces or commas) into a heap array; -1 with a message on bad input. */
int arg_ids(const char *s, int32_t **ids, size_t *n);

/**
 * The engine options shared by generate, serve and bench: --device, --threads,
 * --num-blocks, --block-size, --kv-cache-memory (bytes, with an optional K/M/G/KiB/MiB/GiB
 * suffix), --max-num-batched-tokens, --max-num-seqs, --max-model-len,
 * --no-enable-prefix-caching, --batch-invariant. Returns 1 when argv[*i] was one (consumed, *i
 * advanced past its value), 0 when it is not an engine option, -1 (message printed) on a bad value.
 */
int arg_engine_option(int argc, char **argv, int *i, struct engine_config *cfg);

/** Usage lines for the engine options. */
extern const char arg_engine_usage[];

/** The KV cache format options (src/cli/args_kv.c): --kv-cache-dtype, --kv-cache-dtype-k,
 * --kv-cache-dtype-v, --kv-cache-skip-layers; returns as arg_engine_option. */
int arg_kv_option(int argc, char **argv, int *i, struct kv_spec *s);
#define ARG_KV_USAGE                                                                               \
    "  --kv-cache-dtype D          KV cache format of K and V: auto (the backend's own: float32\n" \
    "                              on the CPU, bf16 on CUDA), bf16, fp8, int8, int4, tq4, tq3,\n"  \
    "                              tq2 (docs/quantization.md)\n"                                   \
    "  --kv-cache-dtype-k D        K's format alone (e.g. int8 keys beside tq3 values)\n"          \
    "  --kv-cache-dtype-v D        V's format alone\n"                                             \
    "  --kv-cache-skip-layers L    layers kept in auto, e.g. 0,1,-2,-1 (negative: from the end)\n"

/** The scheduling options (src/cli/args_sched.c): --max-step-ms, --scheduling-policy,
 * --long-prefill-token-threshold, --preemption-mode; returns as arg_engine_option. */
int arg_sched_option(int argc, char **argv, int *i, struct engine_config *cfg);
#define ARG_SCHED_USAGE                                                                            \
    "  --max-step-ms MS            bound on a step's predicted time: decode rows always run,\n"    \
    "                              prefill tokens join while the fitted step-time model stays\n"   \
    "                              under MS (default 0: the token budget alone)\n"                 \
    "  --long-prefill-token-threshold N  a prefill chunk of one request at most (default 0:\n"     \
    "                              no cap but the budget)\n"                                       \
    "  --scheduling-policy P       priority (requests' priority, then arrival; the default) or\n"  \
    "                              fcfs (arrival alone; a request with a priority is refused)\n"   \
    "  --preemption-mode M         recompute (the default) or swap: a preempted request's\n"       \
    "                              blocks come back from the host tier (--kv-host-memory)\n"

/*
 * A model on a backend with step buffers and a KV pool, and a helper to build one batch
 * of sequences that each append tokens at their next positions (blocks laid out
 * contiguously per sequence: sequence s owns blocks [s * blocks_per_seq, ...)).
 */
struct runner {
    struct backend be;
    struct model *m;
    int block_size, blocks_per_seq, n_seqs, max_tokens;
    int32_t *tokens, *pos, *slot, *q_start, *seq_len, *logit_rows;
    int32_t *block_table;     /* [n_seqs][blocks_per_seq] of every sequence */
    int32_t *bt_step;         /* the rows of this step's sequences, in step order */
    int32_t *state_slot;      /* [n_seqs] recurrent-state slot of each step sequence */
    int32_t *len;             /* [n_seqs] tokens already in each sequence's KV */
    int32_t *chunked;         /* [n_seqs] fwd_batch.delta_chunked: a step's whole chunks */
    float *logits;            /* [max_logits, vocab] host */
    int keep_logits;          /* 1: logits stay in backend memory (model_argmax reads them) */
    const int32_t *pick_rows; /* the step's pick_rows (fwd_batch), or NULL */
};

/** `device` as backend_create takes it (NULL: cuda when a GPU is present, else cpu). */
int runner_open(struct runner *r, const char *dir, const char *device, int threads, int n_seqs,
                int max_ctx, int max_tokens, int max_logits);
/** runner_open with the KV cache in the formats kv names (NULL: auto). */
int runner_open_kv(struct runner *r, const char *dir, const char *device, int threads, int n_seqs,
                   int max_ctx, int max_tokens, int max_logits, const struct kv_spec *kv);
/** runner_open_kv with the model split over tp ranks (model/tp.h; 1: one device). */
int runner_open_tp(struct runner *r, const char *dir, const char *device, int threads, int tp,
                   int n_seqs, int max_ctx, int max_tokens, int max_logits,
                   const struct kv_spec *kv);
void runner_close(struct runner *r);

/**
 * One step over n sequences: the i-th, sequence seq_ids[i] (i itself when seq_ids is
 * NULL), appends counts[i] tokens from toks[i]; want_all[i] asks for logits at every new
 * token (else only the last). Returns the number of logit rows, in step order.
 */
int runner_step(struct runner *r, int n, const int *seq_ids, const int32_t *const *toks,
                const int *counts, const int *want_all);

#endif
