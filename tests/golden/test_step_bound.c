/*
 * The step-time bound changes how steps are cut, never what comes out: on a dense
 * (llama-tiny), a sliding-window (gemma3-tiny) and a hybrid model (qwen3_5-tiny, whose
 * prompt pieces must end at chunk marks), every golden prompt alone (one chunk, no bound)
 * against all of them concurrently with staggered arrivals, --max-step-ms far below one
 * step (every step takes its decode rows and a block of prefill: prompts spread over many
 * steps), a long-prefill threshold, and a pool small enough to force preemption: the same
 * greedy tokens and bitwise the same log-probabilities (the batch-invariant backend), with
 * steps overlapped where the tokens allow and not; the bound cut steps (counted), and the
 * pool is all free afterwards.
 * With --device cuda the same on the CUDA backend in its batch-invariant mode (without a
 * GPU: exit 77, skipped).
 * usage: golden_test_step_bound PAGODA_BINARY TESTDATA_DIR [--device DEV]
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/backend.h"
#include "sched/engine.h"
#include "golden/golden_util.h"
#include "test_util.h"
#include "golden/engine_util.h"

static const char *device = "cpu";

static struct engine *open_engine(const char *dir, double max_step_ms, int threshold, int blocks,
                                  int sync)
{
    struct engine_config cfg = {.model_dir = dir,
                                .device = device,
                                .max_num_batched_tokens = 64,
                                .max_step_ms = max_step_ms,
                                .long_prefill_token_threshold = threshold,
                                .num_blocks = blocks,
                                .manual = 1,
                                .overlap = sync ? -1 : 1,
                                /* solo and concurrent rows compared bitwise */
                                .batch_invariant = 1};
    struct err e = {0};
    struct engine *en = engine_create(&cfg, &e);
    CHECK(en != NULL, "%s: engine_create: %s", dir, e.msg);
    return en;
}

static void submit(struct engine *en, const struct golden_case *c, int n_gen, int lp,
                   struct eng_result *res)
{
    memset(res, 0, sizeof *res);
    struct sampling_params sp = greedy_params(n_gen);
    sp.logprobs = lp;
    struct engine_request q = {.prompt = c->prompt,
                               .n_prompt = c->n_prompt,
                               .sp = sp,
                               .on_event = eng_on_event,
                               .user = res};
    struct err e = {0};
    CHECK(engine_submit(en, &q, &e) > 0, "submit: %s", e.msg);
}

static void test_model(const char *dir, const char *name, const struct golden_case *cs, int nc)
{
    int n_gen = cJSON_GetArraySize(cs[0].greedy);
    if (n_gen > ENGINE_MAX_OUT) n_gen = ENGINE_MAX_OUT;
    int max_need = 0;
    for (int i = 0; i < nc; i++) {
        int need = (cs[i].n_prompt + n_gen + 15) / 16;
        if (need > max_need) max_need = need;
    }
    /* lp: log-probabilities asked (rows read on the host: steps never overlap); else
     * greedy picks on the backend with steps overlapped */
    for (int lp = 1; lp >= 0; lp--) {
        struct eng_result alone[MAX_CASES], conc[MAX_CASES];
        struct engine *en = open_engine(dir, 0, 0, 0, 1);
        if (!en) return;
        for (int i = 0; i < nc; i++) {
            submit(en, &cs[i], n_gen, lp, &alone[i]);
            drain(en);
        }
        engine_destroy(en);
        static const struct {
            double ms;
            int threshold;
        } runs[] = {{1e-3, 0}, {1e-3, 24}, {0, 24}};
        for (int k = 0; k < 3; k++) {
            en = open_engine(dir, runs[k].ms, runs[k].threshold, max_need + 2, lp);
            if (!en) return;
            int next = 0;
            for (int step = 0; next < nc || engine_live(en) > 0; step++) {
                if (next < nc && step % 3 == 0) {
                    submit(en, &cs[next], n_gen, lp, &conc[next]);
                    next++;
                }
                engine_step(en);
                if (step > 200000) break;
            }
            struct engine_stats st;
            engine_stats(en, &st);
            char what[160];
            snprintf(what, sizeof what, "%s%s bound %g ms threshold %d", name,
                     lp ? " logprobs" : " overlapped", runs[k].ms, runs[k].threshold);
            /* the model is fitted after a few steps of different sizes: then every step of
             * this run that has prefill left over is cut */
            CHECK(runs[k].ms == 0 || st.steps_time_capped > 0, "%s: no step was cut", what);
            CHECK(lp || st.steps_overlapped > 0, "%s: no step overlapped", what);
            for (int i = 0; i < nc; i++) {
                CHECK(alone[i].n == conc[i].n &&
                          !memcmp(alone[i].ids, conc[i].ids, sizeof(int32_t) * (size_t)alone[i].n),
                      "%s case %d: tokens differ from the solo run", what, i);
                CHECK(!lp || !memcmp(alone[i].lp, conc[i].lp, sizeof(float) * (size_t)alone[i].n),
                      "%s case %d: log-probabilities differ from the solo run", what, i);
            }
            check_pool_free(en, name, what);
            engine_destroy(en);
        }
    }
}

int main(int argc, char **argv)
{
    int rc = eng_args(argc, argv, &device, "the step-bound test", NULL);
    if (rc >= 0) return rc;
    static const char *const models[] = {"llama-tiny", "gemma3-tiny", "qwen3_5-tiny"};
    int tested = 0;
    for (int m = 0; m < 3; m++) {
        char dir[4200], arch[128];
        snprintf(dir, sizeof dir, "%s/models/%s", argv[2], models[m]);
        if (!golden_arch(dir, arch, sizeof arch) || !golden_device_runs(arch, device)) continue;
        cJSON *root;
        struct golden_case cs[MAX_CASES];
        int nc = load_cases(dir, &root, cs);
        CHECK(nc > 0, "%s: no golden cases", models[m]);
        int before = test_failures;
        if (nc > 0) test_model(dir, models[m], cs, nc);
        printf("%-16s %s\n", models[m], test_failures == before ? "ok" : "FAILED");
        tested++;
        for (int k = 0; k < nc; k++) free(cs[k].prompt);
        cJSON_Delete(root);
    }
    CHECK(tested == 3, "only %d models tested", tested);
    TEST_DONE();
}
