/*
 * multiturn: the multi-turn benchmark (--dataset multi-turn). N conversations run side by
 * side, T turns each; turn t of a conversation sends everything so far (the earlier turns'
 * prompts and the server's answers, as token ids) plus I new tokens, asking for O. All
 * conversations' turn t go out together (closed loop, --concurrency at most in flight),
 * the next turn once they are back, so that every turn but the first can find its
 * conversation's prefix in the server's caches. Reported per turn: TTFT (mean, median,
 * p99), prompt tokens and the share the server said it had cached
 * (usage.prompt_tokens_details.cached_tokens); then the whole run's summary.
 */
#ifndef PAGODA_BENCH_MULTITURN_H
#define PAGODA_BENCH_MULTITURN_H

#include <cjson/cJSON.h>

#include "bench/hc.h"
#include "bench/opts.h"

/** Runs it and prints the report (and adds "turns" to doc). 0, 3 when a request failed,
 * -1 + err when nothing could run. */
int multiturn_run(struct hc *c, const struct opts *o, const char *model, const cJSON *extra,
                  cJSON *doc, struct err *e);

#endif
