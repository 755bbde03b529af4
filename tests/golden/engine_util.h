/*
 * What the engine-level golden tests (test_engine.c, test_spec.c, test_step_bound.c) share:
 * their arguments ([--device DEV]), a model folder's golden cases, a request's tokens and
 * log-probabilities collected from its events, greedy sampling parameters, stepping a manual
 * engine until it is idle, the all-free check of the KV pool and the state slots, and the
 * testdata README rule on a run's token ids. Include after test_util.h and golden_util.h.
 */
#ifndef PAGODA_TESTS_GOLDEN_ENGINE_UTIL_H
#define PAGODA_TESTS_GOLDEN_ENGINE_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/backend.h"
#include "sched/engine.h"

/* The engine tests' arguments: PAGODA_BINARY TESTDATA_DIR [--device DEV]. Sets *device
 * for --device; on CUDA asks for the backend's batch-invariant mode (the tests compare rows
 * across batches; PAGODA_CUDA_BATCH_INVARIANT=0 in the environment runs the default
 * kernels). Returns -1 to go on, else the exit status (2: usage, 77: no GPU, the test
 * `what` not run). *on_cuda (may be NULL) is set when DEV is a CUDA device. */
static inline int eng_args(int argc, char **argv, const char **device, const char *what,
                           int *on_cuda)
{
    if (on_cuda) *on_cuda = 0;
    if (argc != 3 && !(argc == 5 && !strcmp(argv[3], "--device"))) {
        fprintf(stderr, "usage: %s PAGODA_BINARY TESTDATA_DIR [--device DEV]\n", argv[0]);
        return 2;
    }
    if (argc == 5) {
        *device = argv[4];
        if (!strncmp(*device, "cuda", 4)) {
            if (!backend_cuda_available()) {
                printf("no GPU: not run (%s on CUDA needs a CUDA GPU)\n", what);
                return 77;
            }
            if (on_cuda) *on_cuda = 1;
            setenv("PAGODA_CUDA_BATCH_INVARIANT", "1", 0);
        }
    }
    return -1;
}

#define MAX_CASES 16

/* A request's output as its events deliver it: token ids, their log-probabilities, and how
 * it finished. */
#define ENGINE_MAX_OUT 64
struct eng_result {
    int32_t ids[ENGINE_MAX_OUT];
    float lp[ENGINE_MAX_OUT];
    int n;
    enum finish_reason finish;
};

/* engine_submit's event callback for a struct eng_result. */
static inline void eng_on_event(void *user, const struct engine_event *ev)
{
    struct eng_result *r = user;
    if (ev->kind == ENGINE_EV_TOKEN && r->n < ENGINE_MAX_OUT) {
        r->lp[r->n] = ev->logprob;
        r->ids[r->n++] = ev->token;
    }
    if (ev->finish != FINISH_NONE) r->finish = ev->finish;
}

struct golden_case {
    int32_t *prompt;
    int n_prompt;
    const cJSON *greedy, *steps, *plp;
};

/* The cases of DIR/golden.json (at most MAX_CASES) into cs; *root owns the JSON. */
static inline int load_cases(const char *dir, cJSON **root, struct golden_case *cs)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *s = util_read_file(path, NULL, NULL);
    *root = s ? cJSON_Parse(s) : NULL;
    free(s);
    const cJSON *cases = cJSON_GetObjectItem(*root, "cases");
    int n = 0;
    for (const cJSON *c = cases ? cases->child : NULL; c && n < MAX_CASES; c = c->next, n++) {
        const cJSON *p = cJSON_GetObjectItem(c, "prompt_ids");
        cs[n].n_prompt = cJSON_GetArraySize(p);
        cs[n].prompt = xmalloc(sizeof(int32_t) * (size_t)cs[n].n_prompt);
        int k = 0;
        for (const cJSON *x = p->child; x; x = x->next) cs[n].prompt[k++] = x->valueint;
        cs[n].greedy = cJSON_GetObjectItem(c, "greedy_ids");
        cs[n].steps = cJSON_GetObjectItem(c, "steps");
        cs[n].plp = cJSON_GetObjectItem(c, "prompt_logprobs");
    }
    return n;
}

static inline void drain(struct engine *en)
{
    for (int guard = 0; engine_step(en) > 0 && guard < 100000; guard++) {
    }
}

static inline struct sampling_params greedy_params(int n)
{
    struct sampling_params sp;
    sampling_params_default(&sp);
    sp.temperature = 0;
    sp.max_tokens = n;
    sp.ignore_eos = 1;
    return sp;
}

static inline void check_pool_free(struct engine *en, const char *name, const char *what)
{
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.kv_blocks_free == st.kv_blocks_total && st.kv_blocks_used == 0 && st.running == 0 &&
              st.waiting == 0,
          "%s %s: pool not all free (%d of %d free, %d running, %d waiting)", name, what,
          st.kv_blocks_free, st.kv_blocks_total, st.running, st.waiting);
    /* recurrent-state slots: none held once nothing runs (snapshots stay, free and named) */
    CHECK(st.state_slots_free == st.state_slots_total && st.state_slots_used == 0,
          "%s %s: state slots not all free (%d of %d free, %d used)", name, what,
          st.state_slots_free, st.state_slots_total, st.state_slots_used);
}

/* The testdata README rule on a run's ids[0, n): equal to the golden's until a step whose
 * golden margin is below `margin` (GOLDEN_MARGIN, or golden_util.h's looser one) and our token
 * the golden's second; there the paths part. */
static inline void check_golden_rule(const char *name, int ci, const struct golden_case *c,
                                     const int32_t *ids, int n_ids, double margin)
{
    int n = cJSON_GetArraySize(c->greedy);
    CHECK(n_ids == n, "%s case %d: %d tokens, want %d", name, ci, n_ids, n);
    for (int i = 0; i < n && i < n_ids; i++) {
        int want = cJSON_GetArrayItem(c->greedy, i)->valueint;
        if (ids[i] == want) continue;
        const cJSON *st = cJSON_GetArrayItem(c->steps, i);
        double m = cJSON_GetObjectItem(st, "margin")->valuedouble;
        const cJSON *top = cJSON_GetObjectItem(st, "top");
        int second = cJSON_GetArrayItem(cJSON_GetArrayItem(top, 1), 0)->valueint;
        CHECK(m < margin && ids[i] == second, "%s case %d step %d: token %d, golden %d", name, ci,
              i, ids[i], want);
        break;
    }
}

#endif
