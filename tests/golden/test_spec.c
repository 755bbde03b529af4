/*
 * Speculative decoding on the reference models (CPU unless --device), in-process:
 *   - greedy tokens of every golden prompt with n-gram drafts, and with the model as its
 *     own draft model, are those of plain decoding (and pass the golden rule); the model as
 *     its own draft has every draft accepted;
 *   - the same concurrently with staggered arrivals, a small step budget and a pool small
 *     enough to force preemption, prefix caching on;
 *   - a different model with the same tokenizer as the draft: the same greedy tokens;
 *   - sampled requests (seeded, top-k, top-p, min-p, penalties, logit bias, logprobs) give
 *     the tokens and log-probabilities of plain decoding;
 *   - hybrid models (recurrent state rolled back on rejection) the same, with a dense draft
 *     model of the same tokenizer (a hybrid draft model is refused with a message);
 *   - the pool and the state slots are all free after every scenario.
 * usage: golden_test_spec PAGODA_BINARY TESTDATA_DIR [--device DEV]
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "model/backend.h"
#include "sched/engine.h"
#include "golden/golden_util.h"
#include "test_util.h"
#include "golden/engine_util.h"

#define MAX_OUT 64

static const char *device = "cpu";

struct result {
    int32_t ids[MAX_OUT];
    float lp[MAX_OUT];
    int n;
    enum finish_reason finish;
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct result *r = user;
    if (ev->kind == ENGINE_EV_TOKEN && r->n < MAX_OUT) {
        r->lp[r->n] = ev->logprob;
        r->ids[r->n++] = ev->token;
    }
    if (ev->finish != FINISH_NONE) r->finish = ev->finish;
}

static void submit(struct engine *en, const struct golden_case *c, struct sampling_params sp,
                   struct result *res)
{
    memset(res, 0, sizeof *res);
    struct engine_request q = {
        .prompt = c->prompt, .n_prompt = c->n_prompt, .sp = sp, .on_event = on_event, .user = res};
    struct err e = {0};
    CHECK(engine_submit(en, &q, &e) > 0, "submit: %s", e.msg);
}

static struct engine *open_engine(const char *dir, int budget, int blocks, enum spec_method m,
                                  const char *draft, struct err *e)
{
    struct engine_config cfg = {.model_dir = dir,
                                .device = device,
                                .max_num_batched_tokens = budget,
                                .num_blocks = blocks,
                                .manual = 1,
                                .spec = {.method = m, .num_tokens = 4, .model_dir = draft}};
    return engine_create(&cfg, e);
}

/* The divergence margin of the golden rule (golden_util.h: looser for Gemma 4 on CUDA). */
static double margin_tol = GOLDEN_MARGIN;

static int same_ids(const struct result *a, const struct result *b)
{
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n);
}

/* Every case alone with method m (draft: the draft model's folder), against plain[]. */
static void run_alone(const char *dir, const char *name, struct golden_case *cs, int nc,
                      enum spec_method m, const char *draft, const struct result *plain,
                      int want_all_accepted)
{
    struct err e = {0};
    struct engine *en = open_engine(dir, 2048, 0, m, draft, &e);
    CHECK(en != NULL, "%s: engine_create (%s): %s", name, spec_method_name(m), e.msg);
    if (!en) return;
    int n_gen = cJSON_GetArraySize(cs[0].greedy);
    for (int i = 0; i < nc; i++) {
        struct result r;
        submit(en, &cs[i], greedy_params(n_gen), &r);
        drain(en);
        CHECK(same_ids(&r, &plain[i]), "%s %s%s case %d: tokens differ from plain decoding", name,
              spec_method_name(m), draft && strcmp(draft, dir) ? " (other model)" : "", i);
    }
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.spec_drafts[m] > 0 && st.spec_draft_tokens[m] >= st.spec_accepted_tokens[m],
          "%s %s: %llu verifications, %llu drafted, %llu accepted", name, spec_method_name(m),
          (unsigned long long)st.spec_drafts[m], (unsigned long long)st.spec_draft_tokens[m],
          (unsigned long long)st.spec_accepted_tokens[m]);
    if (want_all_accepted)
        CHECK(st.spec_accepted_tokens[m] == st.spec_draft_tokens[m],
              "%s: its own draft: %llu of %llu drafts accepted", name,
              (unsigned long long)st.spec_accepted_tokens[m],
              (unsigned long long)st.spec_draft_tokens[m]);
    uint64_t hist = 0, acc = 0;
    for (int a = 0; a <= SPEC_MAX_TOKENS; a++) {
        hist += st.spec_accept_hist[m][a];
        acc += (uint64_t)a * st.spec_accept_hist[m][a];
    }
    CHECK(hist == st.spec_drafts[m] && acc == st.spec_accepted_tokens[m],
          "%s %s: the acceptance histogram disagrees with the counters", name, spec_method_name(m));
    printf("  %-22s %-5s %5llu verifications, %5llu of %5llu drafts accepted\n", name,
           spec_method_name(m), (unsigned long long)st.spec_drafts[m],
           (unsigned long long)st.spec_accepted_tokens[m],
           (unsigned long long)st.spec_draft_tokens[m]);
    check_pool_free(en, name, "alone");
    engine_destroy(en);
}

/* All cases concurrently, two arriving a step, a budget of 23 and a pool that forces preemption. */
static void run_concurrent(const char *dir, const char *name, struct golden_case *cs, int nc,
                           enum spec_method m, const char *draft, const struct result *plain)
{
    int n_gen = cJSON_GetArraySize(cs[0].greedy), max_need = 0;
    for (int i = 0; i < nc; i++) {
        int need = (cs[i].n_prompt + n_gen + 15) / 16;
        if (need > max_need) max_need = need;
    }
    struct err e = {0};
    struct engine *en = open_engine(dir, 23, max_need, m, draft, &e);
    CHECK(en != NULL, "%s: engine_create: %s", name, e.msg);
    if (!en) return;
    struct result conc[MAX_CASES];
    int next = 0;
    for (int step = 0; (next < nc || engine_live(en) > 0) && step < 200000; step++) {
        for (int k = 0; k < 2 && next < nc; k++, next++) /* the longest prompts first */
            submit(en, &cs[nc - 1 - next], greedy_params(n_gen), &conc[nc - 1 - next]);
        engine_step(en);
    }
    for (int i = 0; i < nc; i++)
        CHECK(same_ids(&conc[i], &plain[i]), "%s %s concurrent case %d: tokens differ", name,
              spec_method_name(m), i);
    struct engine_stats st;
    engine_stats(en, &st);
    const struct model_config *mc = engine_model_config(en);
    int sliding_only = mc->sliding_window > 0;
    for (int l = 0; l < mc->n_layers; l++)
        sliding_only &= mc->layer_kinds && mc->layer_kinds[l] == LAYER_SLIDING;
    CHECK(st.preemptions > 0 || sliding_only, "%s %s: no preemption (%llu steps, %llu verif)", name,
          spec_method_name(m), (unsigned long long)st.steps, (unsigned long long)st.spec_drafts[m]);
    check_pool_free(en, name, "concurrent");
    engine_destroy(en);
}

/* Sampled requests: every option, seeded; the same tokens and log-probabilities with and
 * without drafts (the target's own draws decide). */
static void run_sampled(const char *dir, const char *name, struct golden_case *cs, int nc)
{
    static const struct logit_bias bias[] = {{5, 2.0f}, {9, -3.0f}};
    struct result plain[3][MAX_CASES], spec[3][MAX_CASES];
    for (int pass = 0; pass < 2; pass++) {
        struct err e = {0};
        struct engine *en = open_engine(dir, 64, 0, pass ? SPEC_NGRAM : SPEC_NONE, NULL, &e);
        CHECK(en != NULL, "%s: engine_create: %s", name, e.msg);
        if (!en) return;
        for (int v = 0; v < 3; v++) {
            for (int i = 0; i < nc; i++) {
                struct sampling_params sp;
                sampling_params_default(&sp);
                sp.max_tokens = 40;
                sp.ignore_eos = 1;
                sp.has_seed = 1;
                sp.seed = 1000 + (uint64_t)i;
                sp.temperature = v == 2 ? 0.6f : 1.0f;
                if (v >= 1) {
                    sp.top_k = 40;
                    sp.top_p = 0.9f;
                    sp.min_p = 0.02f;
                }
                if (v == 2) {
                    sp.repetition_penalty = 1.1f;
                    sp.frequency_penalty = 0.2f;
                    sp.presence_penalty = 0.1f;
                    sp.logit_bias = bias;
                    sp.n_logit_bias = 2;
                    sp.logprobs = 1;
                }
                submit(en, &cs[i], sp, pass ? &spec[v][i] : &plain[v][i]);
            }
            drain(en);
        }
        if (pass) {
            struct engine_stats st;
            engine_stats(en, &st);
            CHECK(st.spec_drafts[SPEC_NGRAM] > 0, "%s sampled: no verification", name);
        }
        check_pool_free(en, name, "sampled");
        engine_destroy(en);
    }
    for (int v = 0; v < 3; v++)
        for (int i = 0; i < nc; i++) {
            CHECK(same_ids(&plain[v][i], &spec[v][i]),
                  "%s sampled variant %d case %d: tokens differ", name, v, i);
            for (int t = 0; v == 2 && t < plain[v][i].n && t < spec[v][i].n; t++)
                CHECK(plain[v][i].lp[t] == spec[v][i].lp[t],
                      "%s case %d token %d: logprob %.6f, plain %.6f", name, i, t,
                      (double)spec[v][i].lp[t], (double)plain[v][i].lp[t]);
        }
}

/* Hybrid models: a logit bias that makes one token win often (not always) gives repeats
 * that n-gram drafts guess, so that verifications keep every draft as well as reject some:
 * the tokens, which follow the recurrent state where the bias does not decide, are those of
 * plain decoding. */
static void run_biased(const char *dir, const char *name, struct golden_case *cs, int nc)
{
    static const struct logit_bias bias[] = {{7, 3.0f}};
    struct result plain[MAX_CASES], spec[MAX_CASES];
    uint64_t kept = 0, drafted = 0;
    int sevens = 0, total = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct err e = {0};
        struct engine *en = open_engine(dir, 64, 0, pass ? SPEC_NGRAM : SPEC_NONE, NULL, &e);
        CHECK(en != NULL, "%s: engine_create: %s", name, e.msg);
        if (!en) return;
        for (int i = 0; i < nc; i++) {
            struct sampling_params sp = greedy_params(48);
            sp.logit_bias = bias;
            sp.n_logit_bias = 1;
            submit(en, &cs[i], sp, pass ? &spec[i] : &plain[i]);
        }
        drain(en);
        struct engine_stats st;
        engine_stats(en, &st);
        kept = st.spec_accepted_tokens[SPEC_NGRAM];
        drafted = st.spec_draft_tokens[SPEC_NGRAM];
        check_pool_free(en, name, "biased");
        engine_destroy(en);
    }
    for (int i = 0; i < nc; i++) {
        CHECK(same_ids(&plain[i], &spec[i]), "%s biased case %d: tokens differ", name, i);
        for (int t = 0; t < plain[i].n; t++, total++) sevens += plain[i].ids[t] == 7;
    }
    printf("  %-22s bias  %d of %d tokens biased, %llu of %llu drafts accepted\n", name, sevens,
           total, (unsigned long long)kept, (unsigned long long)drafted);
    CHECK(kept > 0 && kept < drafted && sevens < total, "%s biased: %llu of %llu kept", name,
          (unsigned long long)kept, (unsigned long long)drafted);
}

static void test_model(const char *mdir, const char *name, struct golden_case *cs, int nc)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/%s", mdir, name);
    struct err e = {0};
    struct engine *en = open_engine(dir, 2048, 0, SPEC_NONE, NULL, &e);
    CHECK(en != NULL, "%s: engine_create: %s", name, e.msg);
    if (!en) return;
    struct engine_stats st;
    engine_stats(en, &st);
    int hybrid = st.state_slots_total > 0;
    int n_gen = cJSON_GetArraySize(cs[0].greedy);
    struct result plain[MAX_CASES];
    for (int i = 0; i < nc; i++) {
        submit(en, &cs[i], greedy_params(n_gen), &plain[i]);
        drain(en);
        check_golden_rule(name, i, &cs[i], plain[i].ids, plain[i].n, margin_tol);
    }
    engine_destroy(en);
    run_alone(dir, name, cs, nc, SPEC_NGRAM, NULL, plain, 0);
    run_concurrent(dir, name, cs, nc, SPEC_NGRAM, NULL, plain);
    if (hybrid) {
        /* a hybrid draft model is refused; a dense one with the same tokenizer drafts */
        struct engine *sp = open_engine(dir, 2048, 0, SPEC_DRAFT, dir, &e);
        CHECK(sp == NULL && strstr(e.msg, "linear-attention"), "%s: hybrid draft not refused (%s)",
              name, e.msg);
        if (sp) engine_destroy(sp);
        char other[4200];
        snprintf(other, sizeof other, "%s/qwen3-tiny", mdir);
        run_alone(dir, name, cs, nc, SPEC_DRAFT, other, plain, 0);
        run_concurrent(dir, name, cs, nc, SPEC_DRAFT, other, plain);
        run_biased(dir, name, cs, nc);
        if (!strcmp(name, "qwen3_5-tiny")) run_sampled(dir, name, cs, nc);
        return;
    }
    run_alone(dir, name, cs, nc, SPEC_DRAFT, dir, plain, 1);
    run_concurrent(dir, name, cs, nc, SPEC_DRAFT, dir, plain);
    if (!strcmp(name, "llama-tiny")) { /* a different model, same tokenizer, as the draft */
        char other[4200];
        snprintf(other, sizeof other, "%s/qwen3-tiny", mdir);
        run_alone(dir, name, cs, nc, SPEC_DRAFT, other, plain, 0);
        run_concurrent(dir, name, cs, nc, SPEC_DRAFT, other, plain);
        run_sampled(dir, name, cs, nc);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3 && !(argc == 5 && !strcmp(argv[3], "--device"))) {
        fprintf(stderr, "usage: %s PAGODA_BINARY TESTDATA_DIR [--device DEV]\n", argv[0]);
        return 2;
    }
    if (argc == 5) {
        device = argv[4];
        if (!strncmp(device, "cuda", 4)) {
            if (!backend_cuda_available()) {
                printf("no GPU: not run (the speculative test on CUDA needs a CUDA GPU)\n");
                return 77;
            }
            setenv("PAGODA_CUDA_BATCH_INVARIANT", "1", 0);
        }
    }
    /* every check here compares rows across batches: the CPU's batch-invariant mode */
    cpu_batch_invariant_set(1);
    printf("device %s\n", device);
    char mdir[4096];
    snprintf(mdir, sizeof mdir, "%s/models", argv[2]);
    char *names[256];
    int nn = golden_list(mdir, names, 256), tested = 0;
    if (nn < 0) return 1;
    for (int i = 0; i < nn; i++) {
        char dir[4200], arch[128];
        snprintf(dir, sizeof dir, "%s/%s", mdir, names[i]);
        if (!golden_arch(dir, arch, sizeof arch) || !golden_device_runs(arch, device)) {
            free(names[i]);
            continue;
        }
        cJSON *root;
        struct golden_case cs[MAX_CASES];
        int nc = load_cases(dir, &root, cs);
        CHECK(nc > 0, "%s: no golden cases", names[i]);
        int before = test_failures;
        margin_tol = golden_kv16_sensitive(arch, device) ? GOLDEN_MARGIN_KV16 : GOLDEN_MARGIN;
        if (nc > 0) test_model(mdir, names[i], cs, nc);
        printf("%-24s %s\n", names[i], test_failures == before ? "ok" : "FAILED");
        tested++;
        for (int k = 0; k < nc; k++) free(cs[k].prompt);
        cJSON_Delete(root);
        free(names[i]);
    }
    CHECK(tested >= 12, "only %d model folders tested", tested);
    TEST_DONE();
}
