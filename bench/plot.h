/*
 * plot: SVG charts of a benchmark, written directly (no plotting library).
 *   plot_run_svg    latency CDFs of TTFT, TPOT, ITL and E2E, and output tokens/s over time
 *   plot_sweep_svg  throughput against latency over the loads of a sweep
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

#endif
