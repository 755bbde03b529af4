/* The scheduling options shared by the engine commands (vLLM's names). */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"

int arg_sched_option(int argc, char **argv, int *i, struct engine_config *cfg)
{
    const char *a = argv[*i];
    if (!strcmp(a, "--max-step-ms")) {
        const char *v = arg_value(argc, argv, i);
        double x;
        if (!v || arg_float(a, v, &x)) return -1;
        if (!(x >= 0 && x <= 1e6)) {
            fprintf(stderr, "pagoda: %s: '%s' is not in [0, 1000000] (0: no bound)\n", a, v);
            return -1;
        }
        cfg->max_step_ms = x;
        return 1;
    }
    if (!strcmp(a, "--long-prefill-token-threshold")) {
        const char *v = arg_value(argc, argv, i);
        long x;
        if (!v || arg_int(a, v, 0, 1 << 30, &x)) return -1;
        cfg->long_prefill_token_threshold = (int)x;
        return 1;
    }
    if (!strcmp(a, "--scheduling-policy")) {
        const char *v = arg_value(argc, argv, i);
        if (!v) return -1;
        if (!strcmp(v, "priority"))
            cfg->scheduling_policy = SCHED_POLICY_PRIORITY;
        else if (!strcmp(v, "fcfs"))
            cfg->scheduling_policy = SCHED_POLICY_FCFS;
        else {
            fprintf(stderr, "pagoda: %s: '%s' is not a policy (fcfs, priority)\n", a, v);
            return -1;
        }
        return 1;
    }
    if (!strcmp(a, "--preemption-mode")) {
        const char *v = arg_value(argc, argv, i);
        if (!v) return -1;
        if (!strcmp(v, "recompute"))
            cfg->preemption_mode = PREEMPTION_RECOMPUTE;
        else if (!strcmp(v, "swap"))
            cfg->preemption_mode = PREEMPTION_SWAP; /* engine_create checks the host tier */
        else {
            fprintf(stderr, "pagoda: %s: '%s' is not a mode (recompute, swap)\n", a, v);
            return -1;
        }
        return 1;
    }
    return 0;
}
