/*
 * run: the load generator. Closed loop: keep `concurrency` requests in flight until
 * `num_prompts` were sent (or `duration` passed). Open loop: send at `rate` requests/s with
 * gamma-distributed gaps (shape = burstiness; 1 = Poisson) or a constant gap, optionally
 * capped at `concurrency` in flight (late arrivals wait for a slot, as vLLM's benchmark).
 * Replay: each prompt at its own arrival time (a trace's), with the same optional cap.
 * Warm-up requests run first, closed loop, and are not measured.
 */
#ifndef PAGODA_BENCH_RUN_H
#define PAGODA_BENCH_RUN_H

#include "bench/dataset.h"
#include "bench/hc.h"
#include "bench/request.h"
#include "bench/stats.h"

struct run_cfg {
    const char *path; /* /v1/completions or /v1/chat/completions */
    struct req_opts req;
    int concurrency;      /* 0: no limit */
    double rate;          /* requests/s; 0: all at once (closed loop when concurrency > 0) */
    int constant_arrival; /* open loop: equal gaps instead of gamma */
    double burstiness;    /* gamma shape of the gaps (1 = Poisson) */
    int num_prompts;      /* 0: until duration */
    double duration;      /* s after which no request is sent; 0: none */
    int warmup;           /* unmeasured requests first */
    int warmup_base;      /* the dataset index of the first warm-up prompt */
    int first_index;      /* the dataset index of the first measured prompt */
    int replay;           /* send each prompt at its arrival (trace replay): rate is ignored */
    double timeout;       /* per request, s */
    int progress;         /* a live progress line on stderr */
    uint64_t seed;
};

struct run_out {
    struct req_result *r;
    int n;
    double duration; /* first send to last completion, s */
    int interrupted;
};

/** Runs the benchmark; fills out (free with run_out_free). -1 + err when nothing could run. */
int run_bench(struct hc *c, const struct run_cfg *cfg, const struct dataset *ds,
              struct run_out *out, struct err *e);
void run_out_free(struct run_out *o);

/** Set from a SIGINT handler: stop sending, cancel what is in flight, report what finished. */
extern volatile int run_interrupted;

#endif
