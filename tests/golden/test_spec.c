/*
 * Speculative decoding on the reference models (CPU unless --device), in-process:
 *   - greedy tokens of every golden prompt with n-gram drafts, and with the model as its
 *     own draft model, are those of plain decoding (and pass the golden rule); the model as
 *     its own draft has every draft accepted;
 *   - the same concurrently with staggered arrivals, a small step budget and a pool small
 *     enough to force preemption, prefix caching on;
 *   - a different model with the same tokenizer as the draft: the same greedy tokens;
 *   - sampled requests (seeded, top-k, top-p, min-p, penalties, logit bias, logprobs) give
 *     the tokens and log-probabilities of plain decoding with n-gram drafts and with the
 *     model as its own draft model (drafts drawn from its law, all kept); with a different
 *     draft model, an MTP module or an EAGLE-3 head (through d2t) they are reproducible, the
 *     same twice
 *     (test_spec_sample checks their law);
 *   - hybrid models (recurrent state rolled back on rejection) the same, with a dense draft
 *     model of the same tokenizer (a hybrid draft model is refused with a message);
 *   - Qwen3.5 (dense and MoE) with a multi-token-prediction module (mtp.*, written here with
 *     random fc over a copy of the last layer: greedy output does not depend on the drafts'
 *     quality): the same greedy tokens alone and concurrently; the head's forward checked
 *     against a host computation for heads whose output is known exactly; a module that
 *     repeats its input token, against a logit bias, has drafts kept and rejected; a checkpoint
 *     without the module, or with a tensor of it missing, refused with the name;
 *   - Llama with an EAGLE-3 head (written here: random, or one whose logits are the model's
 *     own, or one that always drafts token 7 through d2t against a bias towards 7: drafts
 *     kept and rejected), the same greedy tokens; its forward checked against the model's
 *     logits;
 *   - the pool and the state slots are all free after every scenario.
 * With --tensor-parallel-size N (last) the target is split N ways (N GPUs, or N CPU backends)
 * on the folders whose family and shapes split (golden_tp_fits): n-gram drafts and draft
 * models (the model itself, for llama-tiny also qwen3-tiny, for a hybrid target qwen3-tiny
 * alone, its recurrent states restored on every rank after rejections: run whole on the
 * lead's device), for llama-tiny an EAGLE-3 head (with a whole copy of the embedding) and
 * for qwen3_5-tiny an MTP module (whole on the lead, with whole copies of the embedding and
 * the head) alone and concurrently against plain split decoding, sampled requests as above,
 * and the heads' forward against the split model's logits (EAGLE-3) or the host (MTP);
 * MTP on a checkpoint without the module is refused with the reason. Fewer GPUs than N:
 * skipped.
 * --part K/N (last) runs the K-th of N shares of the model folders (folder i when
 * i % N == K - 1), for hosts that bound a run's time.
 * usage: golden_test_spec PAGODA_BINARY TESTDATA_DIR [--device DEV] [--tensor-parallel-size N]
 *        [--part K/N]
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
#include "golden/head_fixture.h"
#include "model/head.h"
#include "model/model.h"
#include "model/tp.h"

static const char *device = "cpu";
static int tp = 1; /* --tensor-parallel-size */

static void submit(struct engine *en, const struct golden_case *c, struct sampling_params sp,
                   struct eng_result *res)
{
    memset(res, 0, sizeof *res);
    struct engine_request q = {.prompt = c->prompt,
                               .n_prompt = c->n_prompt,
                               .sp = sp,
                               .on_event = eng_on_event,
                               .user = res};
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
                                .tensor_parallel_size = tp,
                                .spec = {.method = m, .num_tokens = 4, .model_dir = draft}};
    return engine_create(&cfg, e);
}

/* The divergence margin of the golden rule (golden_util.h: looser for Gemma 4 on CUDA). */
static double margin_tol = GOLDEN_MARGIN;

static int same_ids(const struct eng_result *a, const struct eng_result *b)
{
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n);
}

/* Every case alone with method m (draft: the draft model's folder), against plain[]. */
static void run_alone(const char *dir, const char *name, struct golden_case *cs, int nc,
                      enum spec_method m, const char *draft, const struct eng_result *plain,
                      int want_all_accepted)
{
    struct err e = {0};
    struct engine *en = open_engine(dir, 2048, 0, m, draft, &e);
    CHECK(en != NULL, "%s: engine_create (%s): %s", name, spec_method_name(m), e.msg);
    if (!en) return;
    int n_gen = cJSON_GetArraySize(cs[0].greedy);
    for (int i = 0; i < nc; i++) {
        struct eng_result r;
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
                           enum spec_method m, const char *draft, const struct eng_result *plain)
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
    struct eng_result conc[MAX_CASES];
    int next = 0, steps = 0;
    /* every request finishes well within this many steps (under a hundred): one that never
     * does fails here instead of holding the run */
    const int max_steps = 2000;
    for (; (next < nc || engine_live(en) > 0) && steps < max_steps; steps++) {
        for (int k = 0; k < 2 && next < nc; k++, next++) /* the longest prompts first */
            submit(en, &cs[nc - 1 - next], greedy_params(n_gen), &conc[nc - 1 - next]);
        engine_step(en);
    }
    CHECK(engine_live(en) == 0, "%s %s concurrent: %d requests still running after %d steps", name,
          spec_method_name(m), engine_live(en), steps);
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
    printf("  %-22s %-5s concurrent: %d steps, %llu preemptions\n", name, spec_method_name(m),
           steps, (unsigned long long)st.preemptions);
    check_pool_free(en, name, "concurrent");
    engine_destroy(en);
}

/* Seeded sampling parameters: variant v (0: T = 1; 1: with top-k, top-p, min-p; 2: also
 * T = 0.6, penalties, logit bias, logprobs) for case i. */
static struct sampling_params sampled_params(int v, int i)
{
    static const struct logit_bias bias[] = {{5, 2.0f}, {9, -3.0f}};
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
    return sp;
}

/* Every case in every variant, a variant's cases at once, through model with method m
 * (draft: the draft model's or head's folder) into res; 0, or -1 when the engine did not
 * open. *kept and *drafted: the drafts. */
static int sampled_pass(const char *model, const char *name, struct golden_case *cs, int nc,
                        enum spec_method m, const char *draft, struct eng_result res[3][MAX_CASES],
                        uint64_t *kept, uint64_t *drafted)
{
    struct err e = {0};
    struct engine *en = open_engine(model, 64, 0, m, draft, &e);
    CHECK(en != NULL, "%s: engine_create: %s", name, e.msg);
    if (!en) return -1;
    for (int v = 0; v < 3; v++) {
        for (int i = 0; i < nc; i++) submit(en, &cs[i], sampled_params(v, i), &res[v][i]);
        drain(en);
    }
    struct engine_stats st;
    engine_stats(en, &st);
    *kept = st.spec_accepted_tokens[m];
    *drafted = st.spec_draft_tokens[m];
    CHECK(m == SPEC_NONE || st.spec_drafts[m] > 0, "%s sampled %s: no verification", name,
          spec_method_name(m));
    check_pool_free(en, name, "sampled");
    engine_destroy(en);
    return 0;
}

/* The tokens (and, variant 2, log-probabilities) of b against a. */
static void same_results(const char *name, const char *what, struct eng_result a[3][MAX_CASES],
                         struct eng_result b[3][MAX_CASES], int nc)
{
    for (int v = 0; v < 3; v++)
        for (int i = 0; i < nc; i++) {
            CHECK(same_ids(&a[v][i], &b[v][i]), "%s sampled %s variant %d case %d: tokens differ",
                  name, what, v, i);
            for (int t = 0; v == 2 && t < a[v][i].n && t < b[v][i].n; t++)
                CHECK(a[v][i].lp[t] == b[v][i].lp[t],
                      "%s sampled %s case %d token %d: logprob %.6f, want %.6f", name, what, i, t,
                      (double)b[v][i].lp[t], (double)a[v][i].lp[t]);
        }
}

/* Sampled requests: every option, seeded. With n-gram drafts (point masses: the target's
 * own draws decide) and, where self, with the model as its own draft model (drafts drawn from
 * its law, which is the target's: every draft kept), the same tokens and log-probabilities
 * as without drafts. */
static void run_sampled(const char *dir, const char *name, struct golden_case *cs, int nc, int self)
{
    static struct eng_result plain[3][MAX_CASES], spec[3][MAX_CASES];
    uint64_t kept, drafted;
    if (sampled_pass(dir, name, cs, nc, SPEC_NONE, NULL, plain, &kept, &drafted)) return;
    if (sampled_pass(dir, name, cs, nc, SPEC_NGRAM, NULL, spec, &kept, &drafted) == 0)
        same_results(name, "ngram", plain, spec, nc);
    if (self && sampled_pass(dir, name, cs, nc, SPEC_DRAFT, dir, spec, &kept, &drafted) == 0) {
        same_results(name, "own draft", plain, spec, nc);
        CHECK(kept == drafted, "%s sampled, its own draft: %llu of %llu drafts kept", name,
              (unsigned long long)kept, (unsigned long long)drafted);
    }
}

/* Sampled requests with drafts drawn from a law other than the target's (method m, draft:
 * its folder, through the model folder `model`): kept or not by the rejection rule, so the
 * tokens follow the target's law without being plain decoding's (golden/test_spec_sample
 * checks the law); run twice, they are the same (seeded requests are reproducible). */
static void run_sampled_twice(const char *model, const char *name, struct golden_case *cs, int nc,
                              enum spec_method m, const char *draft)
{
    static struct eng_result a[3][MAX_CASES], b[3][MAX_CASES];
    uint64_t kept, drafted;
    if (sampled_pass(model, name, cs, nc, m, draft, a, &kept, &drafted) ||
        sampled_pass(model, name, cs, nc, m, draft, b, &kept, &drafted))
        return;
    same_results(name, spec_method_name(m), a, b, nc);
    /* a split model drafting with itself whole: the two laws differ by the rounding of the
     * exchange sums alone, so a rejection is rare (tolerance: 1 draft in 100) */
    if (tp > 1 && m == SPEC_DRAFT && !strcmp(draft, model))
        CHECK(kept * 100 >= drafted * 99,
              "%s sampled, split, its own draft whole: %llu of %llu "
              "drafts kept",
              name, (unsigned long long)kept, (unsigned long long)drafted);
    printf("  %-22s sampled %-6s %llu of %llu drafts kept, the same tokens twice\n", name,
           spec_method_name(m), (unsigned long long)kept, (unsigned long long)drafted);
}

/* Hybrid models: a logit bias that makes one token win often (not always) gives repeats
 * that n-gram drafts guess, so that verifications keep every draft as well as reject some:
 * the tokens, which follow the recurrent state where the bias does not decide, are those of
 * plain decoding. */
static void run_biased(const char *dir, const char *name, struct golden_case *cs, int nc,
                       enum spec_method m, const char *model, const char *draft)
{
    static const struct logit_bias bias[] = {{7, 3.0f}};
    struct eng_result plain[MAX_CASES], spec[MAX_CASES];
    uint64_t kept = 0, drafted = 0;
    int sevens = 0, total = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct err e = {0};
        struct engine *en =
            open_engine(pass && model ? model : dir, 64, 0, pass ? m : SPEC_NONE, draft, &e);
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
        kept = st.spec_accepted_tokens[m];
        drafted = st.spec_draft_tokens[m];
        check_pool_free(en, name, "biased");
        engine_destroy(en);
    }
    for (int i = 0; i < nc; i++) {
        CHECK(same_ids(&plain[i], &spec[i]), "%s biased case %d: tokens differ", name, i);
        for (int t = 0; t < plain[i].n; t++, total++) sevens += plain[i].ids[t] == 7;
    }
    printf("  %-22s bias %-6s %d of %d tokens biased, %llu of %llu drafts accepted\n", name,
           spec_method_name(m), sevens, total, (unsigned long long)kept,
           (unsigned long long)drafted);
    CHECK(kept > 0 && kept < drafted && sevens < total, "%s biased: %llu of %llu kept", name,
          (unsigned long long)kept, (unsigned long long)drafted);
}

/* RMSNorm with weight 1 (the fixtures' (1 + 0) norms), in double. */
static void host_rms(const float *x, int n, double eps, double *out)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * r;
}

/*
 * The head's forward against a host computation where it is exact by construction: with the
 * layer adding nothing (o_proj and down_proj zero) and norms of weight 1, fc = [I | 0] gives
 * y = rms(rms(embed(t))) and fc = [0 | I] gives y = rms(rms(h)), h the model's final-normed
 * hidden state of the row (read with fwd_batch.hidden_rows). Either catches the order of
 * [embedding, hidden], a hidden row of the wrong position and a wrong norm. Tolerance 2e-4
 * on the CPU (float sums in another order, values of size 1); 3e-2 on CUDA, whose products
 * may round their inputs to bf16 (a relative 2^-8 of values up to about 4), far below
 * what a wrong row or order gives (of size 1).
 */
static void check_head_forward(const char *dir, const char *name)
{
    for (int fc = MTP_FC_EMBED; fc <= MTP_FC_HIDDEN; fc++) {
        char fx[4200];
        if (mtp_fixture(dir, fx, sizeof fx, (enum mtp_fc)fc, 1, NULL)) {
            CHECK(0, "%s: the MTP fixture could not be written", name);
            return;
        }
        struct err e = {0};
        struct backend be;
        CHECK(backend_create(&be, device, 0, &e) == 0, "backend: %s", e.msg);
        struct model *m = model_load_tp(fx, &be, device, tp, 0, &e);
        CHECK(m != NULL, "%s: model_load: %s", name, e.msg);
        enum { N = 7, BS = 16 };
        CHECK(m && model_state_alloc(m, 64, 8, 4, BS, 2, &e) == 0 &&
                  model_hidden_alloc(m, N, &e) == 0,
              "%s: alloc: %s", name, e.msg);
        struct model_head *h = m ? model_head_load_mtp(m, &e) : NULL;
        CHECK(h != NULL, "%s: model_head_load_mtp: %s", name, e.msg);
        if (h && model_head_alloc(h, 64, 8, 4, BS, &e)) CHECK(0, "%s: head alloc: %s", name, e.msg);
        if (h && h->out) {
            int H = m->cfg.hidden, V = m->cfg.vocab;
            int32_t toks[N + 1] = {3, 17, 250, 9, 1000, 42, 7, 77}, pos[N], slot[N], rows[N];
            int32_t qs[2] = {0, N}, sl[1] = {N}, bt[4] = {0, 1, 2, 3}, state[1] = {0},
                    lr[1] = {N - 1};
            for (int i = 0; i < N; i++) pos[i] = slot[i] = rows[i] = i;
            struct fwd_batch b = {.n_tokens = N,
                                  .tokens = toks,
                                  .pos = pos,
                                  .slot = slot,
                                  .n_seqs = 1,
                                  .q_start = qs,
                                  .seq_len = sl,
                                  .block_table = bt,
                                  .max_blocks = 4,
                                  .state_slot = m->n_states ? state : NULL,
                                  .n_hidden = N,
                                  .hidden_rows = rows};
            model_forward(m, &b, NULL);
            float *hid = malloc(sizeof(float) * N * (size_t)H),
                  *out = malloc(sizeof(float) * N * (size_t)H);
            float *lg = malloc(sizeof(float) * (size_t)V);
            model_hidden(m, N, hid);
            /* the head's rows: position i, the token after it, the model's hidden row i */
            struct fwd_batch hb = {.n_tokens = N,
                                   .tokens = toks + 1,
                                   .pos = pos,
                                   .slot = slot,
                                   .n_seqs = 1,
                                   .q_start = qs,
                                   .seq_len = sl,
                                   .block_table = bt,
                                   .max_blocks = 4,
                                   .n_logits = 1,
                                   .logit_rows = lr};
            model_head_forward(h, &hb, 1, rows);
            be.ops->download(be.ctx, out, h->out, sizeof(float) * N * (size_t)H);
            be.ops->download(be.ctx, lg, h->m->logits, sizeof(float) * (size_t)V);
            const struct st_tensor *emb = st_find(&m->st, "model.embed_tokens.weight");
            const struct st_tensor *head = st_find(&m->st, "lm_head.weight");
            if (!head) head = emb;
            double *a = malloc(sizeof(double) * (size_t)H), *y = malloc(sizeof(double) * (size_t)H);
            float *src = malloc(sizeof(float) * (size_t)H);
            double worst = 0, worst_lg = 0;
            for (int i = 0; i < N; i++) {
                for (int j = 0; j < H; j++)
                    src[j] = fc == MTP_FC_EMBED
                                 ? bf16_to_f32(
                                       ((const uint16_t *)emb->data)[(size_t)toks[i + 1] * H + j])
                                 : hid[(size_t)i * H + j];
                host_rms(src, H, m->cfg.rms_eps, a);
                for (int j = 0; j < H; j++) src[j] = (float)a[j];
                host_rms(src, H, m->cfg.rms_eps, y);
                for (int j = 0; j < H; j++) {
                    double d = fabs(y[j] - out[(size_t)i * H + j]);
                    if (d > worst) worst = d;
                }
            }
            for (int v = 0; v < V; v++) { /* the last row's logits: lm_head . y */
                double s = 0;
                for (int j = 0; j < H; j++)
                    s += bf16_to_f32(((const uint16_t *)head->data)[(size_t)v * H + j]) *
                         (double)out[(size_t)(N - 1) * H + j];
                double d = fabs(s - lg[v]);
                if (d > worst_lg) worst_lg = d;
            }
            int gpu = !strncmp(device, "cuda", 4);
            CHECK(worst < (gpu ? 3e-2 : 2e-4) && worst_lg < (gpu ? 5e-2 : 1e-3),
                  "%s head fc=%s: |y - host| %.3g, |logits - host| %.3g", name,
                  fc == MTP_FC_EMBED ? "[I|0]" : "[0|I]", worst, worst_lg);
            printf("  %-22s mtp head fc=%s: |y - host| %.2g, |logits - host| %.2g\n", name,
                   fc == MTP_FC_EMBED ? "[I|0]" : "[0|I]", worst, worst_lg);
            free(a), free(y), free(src), free(hid), free(out), free(lg);
        }
        model_head_destroy(h);
        model_destroy(m);
        backend_destroy(&be);
        mtp_fixture_remove(fx);
    }
}

/* Qwen3.5 with an MTP module: the greedy tokens of plain decoding, alone and concurrently;
 * the start-up errors. */
static void run_mtp(const char *dir, const char *name, struct golden_case *cs, int nc,
                    const struct eng_result *plain)
{
    struct err e = {0};
    struct engine *bad = open_engine(dir, 2048, 0, SPEC_MTP, NULL, &e);
    CHECK(bad == NULL && strstr(e.msg, "multi-token-prediction"),
          "%s: a checkpoint without mtp.* not refused (%s)", name, e.msg);
    if (bad) engine_destroy(bad);
    char fx[4200];
    if (mtp_fixture(dir, fx, sizeof fx, MTP_FC_RANDOM, 0, "mtp.layers.0.self_attn.k_proj.weight") ==
        0) {
        bad = open_engine(fx, 2048, 0, SPEC_MTP, NULL, &e);
        CHECK(bad == NULL && strstr(e.msg, "mtp.layers.0.self_attn.k_proj"),
              "%s: a missing MTP tensor not named (%s)", name, e.msg);
        if (bad) engine_destroy(bad);
        mtp_fixture_remove(fx);
    }
    if (mtp_fixture(dir, fx, sizeof fx, MTP_FC_RANDOM, 0, NULL)) {
        CHECK(0, "%s: the MTP fixture could not be written", name);
        return;
    }
    run_alone(fx, name, cs, nc, SPEC_MTP, NULL, plain, 0);
    run_concurrent(fx, name, cs, nc, SPEC_MTP, NULL, plain);
    if (!strcmp(name, "qwen3_5-tiny")) run_sampled_twice(fx, name, cs, nc, SPEC_MTP, NULL);
    mtp_fixture_remove(fx);
    /* a module that repeats its input token (fc = [I | 0], the layer adding nothing: with
     * qwen3_5-tiny's tied head, the embedding's own row wins) against a bias towards 7:
     * drafts kept and rejected, the recurrent state rolled back */
    if (!strcmp(name, "qwen3_5-tiny") &&
        mtp_fixture(dir, fx, sizeof fx, MTP_FC_EMBED, 1, NULL) == 0) {
        run_biased(dir, name, cs, nc, SPEC_MTP, fx, NULL);
        mtp_fixture_remove(fx);
    }
    check_head_forward(dir, name);
}

/* EAGLE-3 on a Llama model: a head whose logits are the model's own (head_fixture.h) gives
 * them at every row (the rows kept from the last layer, fc's third part, the norm and head:
 * tolerance 1e-4 on the CPU, 5e-2 on CUDA where fc's product may round its input to bf16);
 * random heads give the greedy
 * tokens of plain decoding alone and concurrently; start-up errors name what is wrong. */
/* A head whose logits are the model's own last rows (fixture 1): its forward against the
 * model's (split tp ways: the head then embeds with a whole copy of the embedding). */
static void check_eagle3_forward(const char *dir, const char *name)
{
    struct err e = {0};
    char fx[4200];
    if (eagle3_fixture(dir, fx, sizeof fx, 1, NULL)) {
        CHECK(0, "%s: the EAGLE-3 fixture could not be written", name);
        return;
    }
    struct backend be;
    CHECK(backend_create(&be, device, 0, &e) == 0, "backend: %s", e.msg);
    struct model *m = model_load_tp(dir, &be, device, tp, 0, &e);
    CHECK(m && model_state_alloc(m, 64, 8, 4, 16, 0, &e) == 0, "%s: %s", name, e.msg);
    struct model_head *h = m ? model_head_load_eagle3(m, fx, &e) : NULL;
    CHECK(h && model_head_alloc(h, 64, 8, 4, 16, &e) == 0, "%s: eagle3 head: %s", name, e.msg);
    if (h && h->out) {
        enum { N = 6 };
        int V = m->cfg.vocab;
        int32_t toks[N + 1] = {3, 17, 250, 9, 1000, 42, 7}, pos[N], rows[N];
        int32_t qs[2] = {0, N}, sl[1] = {N}, bt[4] = {0, 1, 2, 3};
        for (int i = 0; i < N; i++) pos[i] = rows[i] = i;
        struct fwd_batch b = {.n_tokens = N,
                              .tokens = toks,
                              .pos = pos,
                              .slot = pos,
                              .n_seqs = 1,
                              .q_start = qs,
                              .seq_len = sl,
                              .block_table = bt,
                              .max_blocks = 4,
                              .n_logits = N,
                              .logit_rows = rows};
        float *want = malloc(sizeof(float) * N * (size_t)V),
              *got = malloc(sizeof(float) * N * (size_t)V);
        model_forward(m, &b, want);
        b.tokens = toks + 1;
        model_head_forward(h, &b, 1, rows);
        be.ops->download(be.ctx, got, h->m->logits, sizeof(float) * N * (size_t)V);
        double worst = 0;
        for (size_t i = 0; i < (size_t)N * V; i++)
            if (fabs((double)got[i] - want[i]) > worst) worst = fabs((double)got[i] - want[i]);
        CHECK(worst < (strncmp(device, "cuda", 4) ? 1e-4 : 5e-2),
              "%s eagle3 head: |logits - the model's| %.3g", name, worst);
        printf("  %-22s eagle3 head = the model's last rows: |logits - the model's| %.2g\n", name,
               worst);
        if (tp > 1) { /* the head embeds with the whole table, not the lead's share */
            struct model *whole = model_load(dir, &be, &e);
            CHECK(whole != NULL, "%s: %s", name, e.msg);
            const int H = m->cfg.hidden;
            int32_t ids[N] = {1, V / 2 + 3, V - 1, 17, V / 2 - 1, V / 3};
            b.tokens = ids;
            float *d1 = be.ops->alloc(be.ctx, sizeof(float) * N * (size_t)H),
                  *d2 = be.ops->alloc(be.ctx, sizeof(float) * N * (size_t)H);
            float *a1 = malloc(sizeof(float) * N * (size_t)H),
                  *a2 = malloc(sizeof(float) * N * (size_t)H);
            if (whole) {
                be.ops->embed(be.ctx, d1, &h->m->embed, &b, 1.0f);
                be.ops->embed(be.ctx, d2, &whole->embed, &b, 1.0f);
                be.ops->download(be.ctx, a1, d1, sizeof(float) * N * (size_t)H);
                be.ops->download(be.ctx, a2, d2, sizeof(float) * N * (size_t)H);
                CHECK(h->m->embed.n == V && !memcmp(a1, a2, sizeof(float) * N * (size_t)H),
                      "%s split %d ways: the EAGLE-3 head's embedding (%lld rows) is not the "
                      "model's whole table (%d rows)",
                      name, tp, (long long)h->m->embed.n, V);
            }
            be.ops->free(be.ctx, d1);
            be.ops->free(be.ctx, d2);
            free(a1);
            free(a2);
            model_destroy(whole);
        }
        free(want);
        free(got);
    }
    model_head_destroy(h);
    model_destroy(m);
    backend_destroy(&be);
    mtp_fixture_remove(fx);
}

static void run_eagle3(const char *dir, const char *name, struct golden_case *cs, int nc,
                       const struct eng_result *plain)
{
    struct err e = {0};
    struct engine *bad = open_engine(dir, 2048, 0, SPEC_EAGLE3, NULL, &e);
    CHECK(bad == NULL && strstr(e.msg, "--speculative-model"), "%s: eagle3 without a head (%s)",
          name, e.msg);
    if (bad) engine_destroy(bad);
    char fx[4200];
    if (eagle3_fixture(dir, fx, sizeof fx, 0, "midlayer.self_attn.k_proj.weight") == 0) {
        bad = open_engine(dir, 2048, 0, SPEC_EAGLE3, fx, &e);
        CHECK(bad == NULL && strstr(e.msg, "midlayer.self_attn.k_proj"),
              "%s: a missing EAGLE-3 tensor not named (%s)", name, e.msg);
        if (bad) engine_destroy(bad);
        mtp_fixture_remove(fx);
    }
    if (eagle3_fixture(dir, fx, sizeof fx, 0, NULL)) {
        CHECK(0, "%s: the EAGLE-3 fixture could not be written", name);
        return;
    }
    run_alone(dir, name, cs, nc, SPEC_EAGLE3, fx, plain, 0);
    run_concurrent(dir, name, cs, nc, SPEC_EAGLE3, fx, plain);
    mtp_fixture_remove(fx);
    /* a head that always drafts 7 through d2t (a draft vocabulary): drawn from its law */
    if (eagle3_fixture(dir, fx, sizeof fx, 2, NULL) == 0) {
        run_sampled_twice(dir, name, cs, nc, SPEC_EAGLE3, fx);
        mtp_fixture_remove(fx);
    }
    /* a head that always drafts 7 against a bias towards 7: drafts kept and rejected */
    if (eagle3_fixture(dir, fx, sizeof fx, 2, NULL) == 0) {
        run_biased(dir, name, cs, nc, SPEC_EAGLE3, NULL, fx);
        mtp_fixture_remove(fx);
    }

    check_eagle3_forward(dir, name);
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
    struct eng_result plain[MAX_CASES];
    for (int i = 0; i < nc; i++) {
        submit(en, &cs[i], greedy_params(n_gen), &plain[i]);
        drain(en);
        check_golden_rule(name, i, &cs[i], plain[i].ids, plain[i].n, margin_tol);
    }
    engine_destroy(en);
    run_alone(dir, name, cs, nc, SPEC_NGRAM, NULL, plain, 0);
    run_concurrent(dir, name, cs, nc, SPEC_NGRAM, NULL, plain);
    if (tp > 1) { /* split: draft models whole on the lead's device; heads refused */
        char other[4200];
        snprintf(other, sizeof other, "%s/qwen3-tiny", mdir);
        /* a hybrid target drafts with a dense model (its states restored on every rank) */
        run_alone(dir, name, cs, nc, SPEC_DRAFT, hybrid ? other : dir, plain, !hybrid);
        run_concurrent(dir, name, cs, nc, SPEC_DRAFT, hybrid ? other : dir, plain);
        /* MTP modules whole on the lead, with whole copies of the embedding and the head */
        if (!strcmp(name, "qwen3_5-tiny") || !strcmp(name, "qwen3_5_moe-tiny"))
            run_mtp(dir, name, cs, nc, plain);
        if (strcmp(name, "llama-tiny")) return;
        run_alone(dir, name, cs, nc, SPEC_DRAFT, other, plain, 0);
        run_concurrent(dir, name, cs, nc, SPEC_DRAFT, other, plain);
        /* its own draft runs whole, whose law is the split model's up to rounding: a draw at
         * a boundary of the inverse CDF may pick the neighbouring token, so the tokens are
         * checked to repeat, not to be plain decoding's */
        run_sampled(dir, name, cs, nc, 0);
        run_sampled_twice(dir, name, cs, nc, SPEC_DRAFT, dir);
        char fx[4200];
        if (eagle3_fixture(dir, fx, sizeof fx, 0, NULL) == 0) {
            run_alone(dir, name, cs, nc, SPEC_EAGLE3, fx, plain, 0);
            run_concurrent(dir, name, cs, nc, SPEC_EAGLE3, fx, plain);
            mtp_fixture_remove(fx);
        } else {
            CHECK(0, "%s: the EAGLE-3 fixture could not be written", name);
        }
        check_eagle3_forward(dir, name);
        struct engine *bad = open_engine(dir, 2048, 0, SPEC_MTP, NULL, &e);
        CHECK(bad == NULL && strstr(e.msg, "multi-token-prediction"),
              "%s: MTP without a module not refused split (%s)", name, e.msg);
        if (bad) engine_destroy(bad);
        return;
    }
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
        run_biased(dir, name, cs, nc, SPEC_NGRAM, NULL, NULL);
        if (!strcmp(name, "qwen3_5-tiny")) {
            run_sampled(dir, name, cs, nc, 0);
            run_sampled_twice(dir, name, cs, nc, SPEC_DRAFT, other);
        }
        if (!strcmp(name, "qwen3_5-tiny") || !strcmp(name, "qwen3_5_moe-tiny"))
            run_mtp(dir, name, cs, nc, plain);
        return;
    }
    run_alone(dir, name, cs, nc, SPEC_DRAFT, dir, plain, 1);
    run_concurrent(dir, name, cs, nc, SPEC_DRAFT, dir, plain);
    if (!strcmp(name, "llama-tiny")) { /* a different model, same tokenizer, as the draft */
        char other[4200];
        snprintf(other, sizeof other, "%s/qwen3-tiny", mdir);
        run_alone(dir, name, cs, nc, SPEC_DRAFT, other, plain, 0);
        run_concurrent(dir, name, cs, nc, SPEC_DRAFT, other, plain);
        run_sampled(dir, name, cs, nc, 1);
        run_sampled_twice(dir, name, cs, nc, SPEC_DRAFT, other);
        run_eagle3(dir, name, cs, nc, plain);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress survives a run cut off by a time limit */
    int part = 1, parts = 1;          /* --part K/N: the K-th of N shares of the folders */
    if (argc >= 5 && !strcmp(argv[argc - 2], "--part")) {
        if (sscanf(argv[argc - 1], "%d/%d", &part, &parts) != 2 || parts < 1 || part < 1 ||
            part > parts) {
            fprintf(stderr, "--part K/N: 1 <= K <= N\n");
            return 2;
        }
        argc -= 2;
    }
    if (argc >= 5 && !strcmp(argv[argc - 2], "--tensor-parallel-size")) {
        tp = atoi(argv[argc - 1]);
        argc -= 2;
        if (tp < 1) return 2;
    }
    int on_cuda, rc = eng_args(argc, argv, &device, "the speculative test", &on_cuda);
    if (rc >= 0) return rc;
    if (on_cuda && backend_gpu_count() < tp) {
        printf("no GPU: not run (%d GPUs, the split needs %d)\n", backend_gpu_count(), tp);
        return 77;
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
        char why[64];
        if (i % parts != part - 1 || !golden_arch(dir, arch, sizeof arch) ||
            !golden_device_runs(arch, device) ||
            (tp > 1 && !(golden_tp_splits(arch) && golden_tp_fits(dir, tp, why, sizeof why)))) {
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
    printf("folders tested: %d\n", tested);
    CHECK(parts > 1 || tested >= (tp > 1 ? 4 : 12), "only %d model folders tested", tested);
    TEST_DONE();
}
