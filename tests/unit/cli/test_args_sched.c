/*
 * The scheduling options: each value lands in the engine config, and each bad value is
 * refused (-1) with a message naming the option and the value (captured from stderr).
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.c"
#include "cli/args_kv.c"
#include "cli/args_sched.c"
#include "test_util.h"

static char said[512];

/* Parses argv[0..argc) as engine options from the first; the return of the last call. */
static int parse(int argc, char **argv, struct engine_config *cfg)
{
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    dup2(fileno(tmp), 2);
    int rc = 0;
    for (int i = 0; i < argc && rc >= 0; i++) rc = arg_engine_option(argc, argv, &i, cfg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(said, 1, sizeof said - 1, tmp);
    said[n] = 0;
    fclose(tmp);
    return rc;
}

static void good(void)
{
    char *argv[] = {"--max-step-ms",
                    "12.5",
                    "--long-prefill-token-threshold",
                    "256",
                    "--scheduling-policy",
                    "fcfs",
                    "--preemption-mode",
                    "recompute",
                    "--block-size",
                    "32",
                    "--max-num-batched-tokens",
                    "4096"};
    struct engine_config cfg = {0};
    CHECK(parse(12, argv, &cfg) == 1 && !said[0], "good options: %s", said);
    CHECK(cfg.max_step_ms == 12.5 && cfg.long_prefill_token_threshold == 256 &&
              cfg.scheduling_policy == SCHED_POLICY_FCFS &&
              cfg.preemption_mode == PREEMPTION_RECOMPUTE && cfg.block_size == 32 &&
              cfg.max_num_batched_tokens == 4096,
          "values %g %d %d %d %d %d", cfg.max_step_ms, cfg.long_prefill_token_threshold,
          (int)cfg.scheduling_policy, (int)cfg.preemption_mode, cfg.block_size,
          cfg.max_num_batched_tokens);
    char *p2[] = {"--scheduling-policy", "priority", "--preemption-mode", "swap"};
    CHECK(parse(4, p2, &cfg) == 1 && cfg.scheduling_policy == SCHED_POLICY_PRIORITY &&
              cfg.preemption_mode == PREEMPTION_SWAP,
          "priority, swap (engine_create refuses swap)");
}

static void bad(const char *opt, const char *val, const char *want)
{
    char *argv[] = {(char *)opt, (char *)val};
    struct engine_config cfg = {0};
    int rc = parse(val ? 2 : 1, argv, &cfg);
    CHECK(rc == -1 && strstr(said, opt) && strstr(said, want), "%s %s: rc %d, said '%s'", opt,
          val ? val : "(none)", rc, said);
}

int main(void)
{
    good();
    bad("--max-step-ms", "-1", "not in [0, 1000000]");
    bad("--max-step-ms", "fast", "not a number");
    bad("--max-step-ms", "nan", "not a number");
    bad("--max-step-ms", "inf", "not in [0, 1000000]");
    bad("--max-step-ms", NULL, "needs a value");
    bad("--long-prefill-token-threshold", "-3", "not an integer in [0,");
    bad("--long-prefill-token-threshold", "1.5", "not an integer");
    bad("--scheduling-policy", "lifo", "'lifo' is not a policy (fcfs, priority)");
    bad("--preemption-mode", "evict", "'evict' is not a mode (recompute, swap)");
    bad("--block-size", "0", "not an integer in [1, 1024]");
    bad("--max-num-batched-tokens", "-5", "not an integer in [1,");
    TEST_DONE();
}
