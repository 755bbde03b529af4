/*
 * plot: SVG charts of a benchmark, written directly (no plotting library).
 *   plot_run_svg    latency CDFs of TTFT, TPOT, ITL and E2E, and output tokens/s over time
 *   plot_sweep_svg  throughput against latency over the loads of a sweep
 *   plot_server_svg throughput against P99 ITL and P99 TTFT, one point per server args
 */
#ifndef PAGODA_BENCH_PLOT_H
#define PAGODA_BENCH_PLOT_H

#include "bench/stats.h"
#include "common/err.h"

int plot_run_svg(const char *path, const struct req_result *r, int n, const struct summary *s,
                 const char *title, struct err *e);

/** load_name: "concurrency" or "request rate" (the x label of the points). */
int plot_sweep_svg(const char *path, const struct summary *runs, int n, const char *load_name,
                   const char *title, struct err *e);

/**
 * One numbered point per server sweep run (a legend below names its args); a filled point is
 * on the frontier: no other run has at least its throughput at no more P99 latency. Runs
 * whose errs[i] is set did not run and are listed as failed.
 */
int plot_server_svg(const char *path, const struct summary *runs, const char *const *args,
                    const char *const *errs, int n, const char *title, struct err *e);

#endif
