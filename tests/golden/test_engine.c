/*
 * The engine on the reference models, in-process (manual stepping, so arrivals land at
 * exact steps):
 *   - batch invariance: every golden prompt alone, then all of them concurrently with
 *     staggered arrivals, small step budgets (varied chunk sizes) and a pool small enough
 *     to force preemption: identical greedy tokens, which pass the golden rule;
 *   - prefix sharing: a repeated prompt and a shared-prefix prompt hit the cache (asserted
 *     in tokens) and give identical tokens;
 *   - a seeded sampled request gives identical tokens alone and inside a batch, and with
 *     log-probabilities (its rows sampled on the host; on CUDA the plain one's on the GPU);
 *   - sampling controls with exact outcomes (top_k 1, logit bias, stop ids, max_tokens),
 *     prompt log-probabilities against the golden, aborts;
 *   - after every scenario the pool is all free again;
 *   - Gemma 4's KV-shared layers own no KV storage: the pool is sized by the other layers
 *     (split too: each rank's pool by its share of their heads);
 *   - the BitNet variants of tests/golden/variants through the same invariance checks.
 *   - batch invariance and prefix sharing again with quantized KV caches (fp8, and tq4 keys
 *     with tq3 values) on a dense, a sliding-window and a hybrid model: formats that scale
 *     each token alone give every token the same codes however the steps are cut (the
 *     golden rule is not applied there: the KV rounding moves the tokens).
 * With --device cuda the same checks run on the CUDA backend (without a GPU: "no GPU: not
 * run", exit 77, which ctest counts as skipped). Prompt log-probabilities are then compared at
 * the CUDA golden tolerance (bf16 activations and KV), with the backend in its batch-invariant
 * mode (PAGODA_CUDA_BATCH_INVARIANT=1, set here unless the environment sets it).
 * With --tensor-parallel-size N (last) every engine splits its model N ways (N GPUs, or N CPU
 * backends) and the golden rule, the concurrent and preempted runs and the quantized KV caches
 * are checked on the folders whose family and shapes split (golden_tp_fits); fewer GPUs than
 * N: skipped.
 * usage: golden_test_engine PAGODA_BINARY TESTDATA_DIR [--device DEV] [--tensor-parallel-size N]
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "model/backend.h"
#include "model/model.h"
#include "model/tp.h"
#include "sched/engine.h"
#include "golden/golden_util.h"
#include "test_util.h"
#include "golden/engine_util.h"

#define MAX_OUT 64

static const char *device = "cpu";
static int tp = 1; /* --tensor-parallel-size */
static double plp_tol = 1e-3;
static double margin_tol = GOLDEN_MARGIN; /* see golden_util.h */

struct result {
    int32_t ids[MAX_OUT];
    int n;
    enum finish_reason finish;
    int n_cached, got_plp;
    float plp[512];
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct result *r = user;
    if (ev->kind == ENGINE_EV_TOKEN && r->n < MAX_OUT) r->ids[r->n++] = ev->token;
    if (ev->kind == ENGINE_EV_PROMPT_LOGPROBS) {
        r->got_plp = 1;
        for (int i = 0; i < ev->n_prompt_lp && i < 512; i++) r->plp[i] = ev->prompt_lp[i];
    }
    if (ev->finish != FINISH_NONE) {
        r->finish = ev->finish;
        r->n_cached = ev->n_cached;
    }
}

static uint64_t submit(struct engine *en, const struct golden_case *c, struct sampling_params sp,
                       struct result *res)
{
    memset(res, 0, sizeof *res);
    struct engine_request q = {
        .prompt = c->prompt, .n_prompt = c->n_prompt, .sp = sp, .on_event = on_event, .user = res};
    struct err e = {0};
    uint64_t id = engine_submit(en, &q, &e);
    CHECK(id > 0, "submit: %s", e.msg);
    return id;
}

static int same_ids(const struct result *a, const struct result *b)
{
    return a->n == b->n && !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n);
}

/* sync: each step's tokens read before the next step is planned (else steps overlap where
 * every token is picked where the logits are) */
static int state_interval;    /* hybrid_state_interval of the engines opened next */
static struct kv_spec kv_fmt; /* KV cache formats of the engines opened next */

static struct engine *open_engine(const char *dir, int budget, int blocks, int caching, int sync)
{
    struct engine_config cfg = {.hybrid_state_interval = state_interval,
                                .model_dir = dir,
                                .device = device,
                                .max_num_batched_tokens = budget,
                                .num_blocks = blocks,
                                .disable_prefix_caching = !caching,
                                .manual = 1,
                                .overlap = sync ? -1 : 1,
                                .tensor_parallel_size = tp,
                                .kv = kv_fmt};
    struct err e = {0};
    struct engine *en = engine_create(&cfg, &e);
    CHECK(en != NULL, "%s: engine_create: %s", dir, e.msg);
    return en;
}

/* Hybrid models: with a state snapshot every block, a prompt sharing 40 tokens resumes at
 * 32 with the same tokens as without any cache, a continued conversation after the answer; a budget
 * that would cut a prompt mid-chunk cuts it at the chunk; aborted, finished and preempted requests
 * leave no slot held. */
static void test_hybrid_states(const char *dir, const char *name, const struct golden_case *L)
{
    state_interval = 1;
    struct engine *en = open_engine(dir, 64, 0, 1, 0);
    state_interval = 0;
    if (!en) return;
    struct golden_case fork = *L;
    fork.prompt = xmalloc(sizeof(int32_t) * (size_t)L->n_prompt);
    memcpy(fork.prompt, L->prompt, sizeof(int32_t) * (size_t)L->n_prompt);
    for (int i = 40; i < fork.n_prompt; i++) fork.prompt[i] = (fork.prompt[i] * 5 + 1) % 64;
    struct result r1, r2, solo_r, ab[3];
    submit(en, L, greedy_params(8), &r1);
    drain(en);
    submit(en, &fork, greedy_params(8), &r2);
    drain(en);
    CHECK(r2.n_cached == 32, "%s: state every block: hit %d tokens, want 32", name, r2.n_cached);
    struct engine *solo = open_engine(dir, 64, 0, 0, 0);
    if (solo) {
        submit(solo, &fork, greedy_params(8), &solo_r);
        drain(solo);
        CHECK(same_ids(&r2, &solo_r), "%s: resumed from a state snapshot, other tokens", name);
        engine_destroy(solo);
    }
    /* A continued conversation (the first prompt, its 8 tokens, 5 more) resumes after the
     * answer's last full block, from a state taken while decoding (token by token, where
     * the uncached run takes those positions in chunks: the same tokens, not bitwise). */
    struct golden_case conv = *L;
    conv.n_prompt = L->n_prompt + r1.n + 5;
    conv.prompt = xmalloc(sizeof(int32_t) * (size_t)conv.n_prompt);
    memcpy(conv.prompt, L->prompt, sizeof(int32_t) * (size_t)L->n_prompt);
    for (int i = 0; i < r1.n; i++) conv.prompt[L->n_prompt + i] = r1.ids[i];
    for (int i = 0; i < 5; i++) conv.prompt[L->n_prompt + r1.n + i] = 3 + i;
    int want = (L->n_prompt + r1.n - 1) / 16 * 16;
    struct result r3, solo3;
    submit(en, &conv, greedy_params(8), &r3);
    drain(en);
    CHECK(want > L->n_prompt / 16 * 16 && r3.n_cached == want,
          "%s: continued conversation: hit %d tokens, want %d", name, r3.n_cached, want);
    solo = open_engine(dir, 64, 0, 0, 0);
    if (solo) {
        submit(solo, &conv, greedy_params(8), &solo3);
        drain(solo);
        CHECK(same_ids(&r3, &solo3), "%s: resumed after the answer, other tokens", name);
        engine_destroy(solo);
    }
    free(conv.prompt);
    /* A step budget of 23 would end the prompt's first piece mid-chunk: it ends at 16 (the
     * delta rule's chunks stay whole, so every prompt token takes the same form as in one
     * piece) and the tokens are those of the request alone. */
    struct engine *cut = open_engine(dir, 23, 0, 0, 1);
    if (cut) {
        struct result rc;
        struct engine_stats cs;
        submit(cut, L, greedy_params(8), &rc);
        engine_step(cut);
        engine_stats(cut, &cs);
        CHECK(cs.prompt_tokens == 16, "%s: budget 23: first piece of %llu tokens, want 16", name,
              (unsigned long long)cs.prompt_tokens);
        drain(cut);
        CHECK(same_ids(&rc, &r1), "%s: budget 23: other tokens than in one piece", name);
        engine_destroy(cut);
    }
    /* aborts mid-prompt and mid-output beside a request that finishes */
    uint64_t a0 = submit(en, L, greedy_params(20), &ab[0]);
    uint64_t a1 = submit(en, &fork, greedy_params(20), &ab[1]);
    submit(en, L, greedy_params(4), &ab[2]);
    engine_step(en);
    engine_abort(en, a0);
    for (int i = 0; i < 12; i++) engine_step(en);
    engine_abort(en, a1);
    drain(en);
    CHECK(ab[0].finish == FINISH_ABORT && ab[1].finish == FINISH_ABORT && ab[2].n == 4,
          "%s: aborts beside a finished request: %s %s, %d tokens", name,
          finish_reason_name(ab[0].finish), finish_reason_name(ab[1].finish), ab[2].n);
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.state_slots_cached > 0, "%s: no state snapshot kept", name);
    check_pool_free(en, name, "hybrid states");
    engine_destroy(en);
    free(fork.prompt);
}

/* gemma4moe-tiny: layers 2 and 3 read the KV of layers 0 (sliding, 2 KV heads of 32) and 1
 * (full, 2 of 512). On the CPU (float32 KV) a token takes 2 * (64 + 1024) * 4 = 8704 bytes,
 * not 17408, so 1 MiB holds 7 blocks of 16 tokens, not 3. Split 2 or 4 ways each rank holds
 * one head of each (4 ways: two ranks a head): 4352 bytes a token, 15 blocks in its 1 MiB. */
static void test_kv_shared(const char *dir, const char *name)
{
    if (strcmp(device, "cpu")) return;
    const size_t per_token = tp > 1 ? 4352 : 8704;
    const int blocks = tp > 1 ? 15 : 7;
    struct backend be;
    struct err e = {0};
    CHECK(backend_cpu_create(&be, 1, &e) == 0, "%s: cpu backend: %s", name, e.msg);
    struct model *m = model_load_rank(dir, &be, tp > 1 ? tp - 1 : 0, tp, &e); /* the last rank */
    CHECK(m != NULL, "%s: model_load: %s", name, e.msg);
    if (m) {
        const struct model_config *c = &m->cfg;
        CHECK(c->kv_source[0] == 0 && c->kv_source[1] == 1 && c->kv_source[2] == 0 &&
                  c->kv_source[3] == 1,
              "%s: KV sources %d %d %d %d, want 0 1 0 1", name, c->kv_source[0], c->kv_source[1],
              c->kv_source[2], c->kv_source[3]);
        CHECK(model_kv_bytes_per_token(m) == per_token, "%s: %zu KV bytes a token, want %zu", name,
              model_kv_bytes_per_token(m), per_token);
        CHECK(model_state_alloc_rank(m, 16, 4, 4, 16, 0, &e) == 0, "%s: state: %s", name, e.msg);
        CHECK(m->kv[0].k && m->kv[1].k && !m->kv[2].k && !m->kv[2].v && !m->kv[3].k && !m->kv[3].v,
              "%s: KV-shared layers hold storage", name);
        for (int l = 2; l < 4; l++)
            CHECK(m->kvg[l].n_kv_heads == m->kvg[l - 2].n_kv_heads &&
                      m->kvg[l].head_dim == m->kvg[l - 2].head_dim &&
                      m->kvg[l].n_kv_heads == (tp > 1 ? 1 : 2),
                  "%s: layer %d reads %d KV heads of %d, its source %d of %d", name, l,
                  m->kvg[l].n_kv_heads, m->kvg[l].head_dim, m->kvg[l - 2].n_kv_heads,
                  m->kvg[l - 2].head_dim);
        model_destroy(m);
    }
    backend_destroy(&be);
    struct engine_config cfg = {.model_dir = dir,
                                .device = device,
                                .kv_cache_memory = (size_t)1 << 20,
                                .manual = 1,
                                .tensor_parallel_size = tp};
    struct engine *en = engine_create(&cfg, &e);
    CHECK(en != NULL, "%s: engine_create: %s", name, e.msg);
    if (!en) return;
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.kv_blocks_total == blocks, "%s: %d KV blocks in 1 MiB, want %d", name,
          st.kv_blocks_total, blocks);
    engine_destroy(en);
}

static void test_model(const char *dir, const char *name, struct golden_case *cs, int nc)
{
    int n_gen = cJSON_GetArraySize(cs[0].greedy);
    struct result alone[MAX_CASES], conc[MAX_CASES];

    /* 1. Each prompt alone (its own step budget of 2048: one prefill chunk). */
    struct engine *en = open_engine(dir, 2048, 0, 0, 0);
    if (!en) return;
    for (int i = 0; i < nc; i++) {
        submit(en, &cs[i], greedy_params(n_gen), &alone[i]);
        drain(en);
        CHECK(alone[i].finish == FINISH_LENGTH, "%s case %d: finish %s", name, i,
              finish_reason_name(alone[i].finish));
        if (kv_fmt.k == KV_DTYPE_AUTO)
            check_golden_rule(name, i, &cs[i], alone[i].ids, alone[i].n, margin_tol);
    }
    check_pool_free(en, name, "alone");
    engine_destroy(en);

    /* 2. All concurrently: staggered arrivals, small budgets, a pool that forces preemption;
     * steps overlapped (the default) and not. */
    int max_need = 0;
    for (int i = 0; i < nc; i++) {
        int need = (cs[i].n_prompt + n_gen + 15) / 16;
        if (need > max_need) max_need = need;
    }
    static const int budgets[] = {64, 23, 64, 23};
    for (int b = 0; b < 4; b++) {
        const int sync = b >= 2;
        en = open_engine(dir, budgets[b], max_need + 2, 1, sync);
        if (!en) return;
        int next = 0;
        for (int step = 0; next < nc || engine_live(en) > 0; step++) {
            if (next < nc && step % (b + 2) == 0) {
                submit(en, &cs[next], greedy_params(n_gen), &conc[next]);
                next++;
            }
            engine_step(en);
            if (step > 200000) break;
        }
        struct engine_stats st;
        engine_stats(en, &st);
        /* Models windowed on every layer release blocks behind the window instead. */
        const struct model_config *mc = engine_model_config(en);
        int sliding_only = mc->sliding_window > 0;
        for (int l = 0; l < mc->n_layers; l++)
            sliding_only &= mc->layer_kinds && mc->layer_kinds[l] == LAYER_SLIDING;
        CHECK(st.preemptions > 0 || sliding_only,
              "%s budget %d: the small pool forced no preemption", name, budgets[b]);
        for (int i = 0; i < nc; i++)
            CHECK(same_ids(&alone[i], &conc[i]),
                  "%s budget %d%s case %d: batched tokens differ from the solo run (first %d vs "
                  "%d)",
                  name, budgets[b], sync ? " sync" : "", i, alone[i].ids[0], conc[i].ids[0]);
        /* a split model's steps are never overlapped (its ranks embed tokens from the host) */
        CHECK(sync || tp > 1 ? st.steps_overlapped == 0 : st.steps_overlapped > 0,
              "%s budget %d%s: %llu of %llu steps overlapped", name, budgets[b],
              sync ? " sync" : "", (unsigned long long)st.steps_overlapped,
              (unsigned long long)st.steps);
        check_pool_free(en, name, "concurrent");
        engine_destroy(en);
    }

    /* 3. Prefix sharing: the longest prompt twice, then its first 40 tokens + a new tail. */
    int longest = 0;
    for (int i = 1; i < nc; i++)
        if (cs[i].n_prompt > cs[longest].n_prompt) longest = i;
    const struct golden_case *L = &cs[longest];
    en = open_engine(dir, 2048, 0, 1, 0);
    if (!en) return;
    struct engine_stats st0;
    engine_stats(en, &st0);
    int hybrid = st0.state_slots_total > 0;
    struct result r1, r2, r3, r3_alone;
    submit(en, L, greedy_params(n_gen), &r1);
    drain(en);
    submit(en, L, greedy_params(n_gen), &r2);
    drain(en);
    int want_hit = (L->n_prompt - 1) / 16 * 16;
    CHECK(r1.n_cached == 0 && r2.n_cached == want_hit, "%s: cached %d then %d, want 0 then %d",
          name, r1.n_cached, r2.n_cached, want_hit);
    CHECK(same_ids(&r1, &r2), "%s: the cached run gives other tokens", name);
    if (L->n_prompt > 48) {
        struct golden_case fork = *L;
        fork.prompt = xmalloc(sizeof(int32_t) * (size_t)L->n_prompt);
        memcpy(fork.prompt, L->prompt, sizeof(int32_t) * (size_t)L->n_prompt);
        for (int i = 40; i < fork.n_prompt; i++) fork.prompt[i] = (fork.prompt[i] * 7 + 3) % 64;
        submit(en, &fork, greedy_params(8), &r3);
        drain(en);
        /* A hybrid model keeps states at the end of each prompt's last full block only (by
         * default): a prompt that shares 40 tokens of a 300-token one resumes nowhere. */
        int want_fork = hybrid ? 0 : 32;
        CHECK(r3.n_cached == want_fork, "%s: shared prefix of 40 tokens hit %d tokens, want %d",
              name, r3.n_cached, want_fork);
        struct engine *solo = open_engine(dir, 2048, 0, 0, 1);
        submit(solo, &fork, greedy_params(8), &r3_alone);
        drain(solo);
        CHECK(r3_alone.n_cached == 0 && same_ids(&r3, &r3_alone),
              "%s: the shared-prefix request gives other tokens than without the cache", name);
        engine_destroy(solo);
        free(fork.prompt);
    }
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(st.prefix_hit_tokens >= (uint64_t)want_hit, "%s: hit tokens %llu", name,
          (unsigned long long)st.prefix_hit_tokens);
    check_pool_free(en, name, "prefix");
    engine_destroy(en);
    if (hybrid && L->n_prompt > 48) test_hybrid_states(dir, name, L);
}

/* Sampling and control paths on one model: exact outcomes. */
static void test_controls(const char *dir, struct golden_case *cs, int nc)
{
    struct engine *en = open_engine(dir, 2048, 0, 1, 0);
    if (!en) return;
    const struct golden_case *c = &cs[nc > 4 ? 4 : 0];
    struct result g, r, others[MAX_CASES];
    submit(en, c, greedy_params(12), &g);
    drain(en);

    /* top_k 1 at any temperature is greedy */
    struct sampling_params sp = greedy_params(12);
    sp.temperature = 1.5f;
    sp.top_k = 1;
    submit(en, c, sp, &r);
    drain(en);
    CHECK(same_ids(&g, &r), "top_k 1 differs from greedy");
    /* min_p 1 keeps only the most likely token */
    sp = greedy_params(12);
    sp.temperature = 1.0f;
    sp.min_p = 1.0f;
    submit(en, c, sp, &r);
    drain(en);
    CHECK(same_ids(&g, &r), "min_p 1 differs from greedy");
    /* a +100 logit bias forces a token */
    struct logit_bias lb = {.id = 7, .bias = 100};
    sp = greedy_params(5);
    sp.logit_bias = &lb;
    sp.n_logit_bias = 1;
    submit(en, c, sp, &r);
    drain(en);
    CHECK(r.n == 5 && r.ids[0] == 7 && r.ids[4] == 7, "logit bias: %d tokens, first %d", r.n,
          r.ids[0]);
    /* a stop id ends the request with reason stop, the stop token included */
    sp = greedy_params(12);
    int32_t stop = g.ids[3];
    sp.stop_ids = &stop;
    sp.n_stop_ids = 1;
    submit(en, c, sp, &r);
    drain(en);
    int first = 0;
    while (g.ids[first] != stop) first++;
    CHECK(r.finish == FINISH_STOP && r.n == first + 1, "stop id: finish %s after %d tokens",
          finish_reason_name(r.finish), r.n);
    /* max_tokens gives reason length */
    submit(en, c, greedy_params(3), &r);
    drain(en);
    CHECK(r.finish == FINISH_LENGTH && r.n == 3 && !memcmp(r.ids, g.ids, 3 * sizeof(int32_t)),
          "max_tokens 3");
    /* Overlapped steps meet requests that need their rows on the host: a greedy request,
     * then one with log-probabilities and one with a stop id join it mid-stream; each gives
     * the tokens it gives alone. */
    {
        struct engine_stats st0, st1;
        engine_stats(en, &st0);
        struct result ga, lp, so;
        submit(en, c, greedy_params(12), &ga);
        for (int i = 0; i < 4; i++) engine_step(en);
        sp = greedy_params(12);
        sp.logprobs = 1;
        submit(en, c, sp, &lp);
        engine_step(en);
        sp = greedy_params(12);
        sp.stop_ids = &stop;
        sp.n_stop_ids = 1;
        submit(en, c, sp, &so);
        drain(en);
        engine_stats(en, &st1);
        CHECK(same_ids(&g, &ga) && same_ids(&g, &lp) && ga.finish == FINISH_LENGTH,
              "mixed: greedy %d tokens, with logprobs %d, not as alone", ga.n, lp.n);
        CHECK(so.finish == FINISH_STOP && so.n == first + 1 &&
                  !memcmp(so.ids, g.ids, 4 * (size_t)so.n),
              "mixed: stop id: finish %s after %d tokens", finish_reason_name(so.finish), so.n);
        CHECK(st1.steps_overlapped > st0.steps_overlapped, "mixed: no step overlapped");
        /* max_tokens 1 and 2: the first token ends the request, or the one after it */
        submit(en, c, greedy_params(1), &ga);
        submit(en, c, greedy_params(2), &lp);
        drain(en);
        CHECK(ga.n == 1 && lp.n == 2 && ga.ids[0] == g.ids[0] && lp.ids[1] == g.ids[1],
              "max_tokens 1 and 2: %d and %d tokens", ga.n, lp.n);
        check_pool_free(en, "controls", "mixed");
    }

    /* presence penalty 2 with a large repetition penalty: no token repeats in 12 (greedy) */
    sp = greedy_params(12);
    sp.repetition_penalty = 100.0f;
    submit(en, c, sp, &r);
    drain(en);
    int repeats = 0;
    for (int i = 0; i < r.n; i++) {
        for (int k = 0; k < i; k++) repeats += r.ids[k] == r.ids[i];
        for (int k = 0; k < c->n_prompt; k++) repeats += c->prompt[k] == r.ids[i];
    }
    CHECK(repeats == 0, "repetition penalty 100: %d repeats", repeats);

    /* a seeded sampled request: the same tokens alone and inside a busy batch */
    struct sampling_params ss;
    sampling_params_default(&ss);
    ss.temperature = 0.9f;
    ss.top_p = 0.95f;
    ss.top_k = 40;
    ss.max_tokens = 24;
    ss.ignore_eos = 1;
    ss.has_seed = 1;
    ss.seed = 1234;
    struct result s_alone, s_batch;
    submit(en, c, ss, &s_alone);
    drain(en);
    engine_destroy(en);
    en = open_engine(dir, 37, 0, 0, 0);
    for (int i = 0; i < nc; i++) {
        struct sampling_params o = ss;
        o.seed = 99 + (uint64_t)i;
        submit(en, &cs[i], o, &others[i]);
        if (i == 1) submit(en, c, ss, &s_batch);
        engine_step(en);
    }
    drain(en);
    CHECK(s_alone.n == 24 && same_ids(&s_alone, &s_batch),
          "the seeded request differs inside a batch (%d vs %d tokens)", s_alone.n, s_batch.n);
    check_pool_free(en, "controls", "seeded");

    /* Seeded requests with log-probabilities have their rows sampled on the host, the same
     * requests without them where the logits are (on CUDA: on the GPU): the same tokens, at
     * T = 1 with no filter (the host once walked its candidates in index order there) and
     * with top-k and top-p. */
    for (int v = 0; v < 2; v++) {
        struct sampling_params a = ss;
        if (v == 0) {
            a.temperature = 1.0f;
            a.top_k = 0;
            a.top_p = 1.0f;
        }
        struct result r_plain, r_lp;
        submit(en, c, a, &r_plain);
        drain(en);
        a.logprobs = 1;
        submit(en, c, a, &r_lp);
        drain(en);
        CHECK(r_plain.n == 24 && same_ids(&r_plain, &r_lp),
              "seeded %s: other tokens with log-probabilities (sampled on the host)",
              v ? "top-k 40 top-p 0.95" : "T = 1");
    }
    check_pool_free(en, "controls", "seeded with log-probabilities");

    /* prompt log-probabilities against the golden (1e-3 on the CPU) */
    struct sampling_params pp = greedy_params(1);
    pp.prompt_logprobs = 0;
    const struct golden_case *lpc = &cs[nc > 5 ? 5 : 0];
    submit(en, lpc, pp, &r);
    drain(en);
    CHECK(r.got_plp, "no prompt logprobs event");
    CHECK(isnan(r.plp[0]), "position 0 has no log-probability");
    int bad = 0;
    for (int i = 1; i < lpc->n_prompt && i < 512; i++)
        if (fabs(r.plp[i] - cJSON_GetArrayItem(lpc->plp, i)->valuedouble) > plp_tol) bad++;
    CHECK(bad == 0, "%d prompt logprobs off by more than %g", bad, plp_tol);

    /* abort: a running request and a waiting one both end with reason abort */
    struct result a1, a2;
    uint64_t id1 = submit(en, c, greedy_params(40), &a1);
    engine_step(en);
    engine_step(en);
    uint64_t id2 = submit(en, c, greedy_params(40), &a2);
    engine_abort(en, id1);
    engine_abort(en, id2);
    engine_abort(en, 999999); /* unknown ids are ignored */
    drain(en);
    CHECK(a1.finish == FINISH_ABORT && a2.finish == FINISH_ABORT && a1.n < 40,
          "abort: %s %s after %d tokens", finish_reason_name(a1.finish),
          finish_reason_name(a2.finish), a1.n);
    check_pool_free(en, "controls", "abort");

    /* invalid requests are refused with the field named */
    struct engine_request q = {.prompt = c->prompt, .n_prompt = c->n_prompt};
    sampling_params_default(&q.sp);
    struct err e = {0};
    q.sp.top_p = 0;
    CHECK(engine_submit(en, &q, &e) == 0 && strstr(e.msg, "top_p"), "top_p 0: %s", e.msg);
    sampling_params_default(&q.sp);
    q.sp.max_tokens = engine_max_model_len(en);
    CHECK(engine_submit(en, &q, &e) == 0 && strstr(e.msg, "context length"), "too long: %s", e.msg);
    sampling_params_default(&q.sp);
    int32_t bad_id = 1 << 30;
    q.prompt = &bad_id;
    q.n_prompt = 1;
    CHECK(engine_submit(en, &q, &e) == 0 && strstr(e.msg, "vocabulary"), "bad id: %s", e.msg);
    engine_destroy(en);
}

/* Events checked against the engine's statistics as they arrive: every token, prompt token
 * and end that a client has seen is counted already (so that a client that reads /metrics
 * after its last token finds it there). */
struct counted {
    struct engine *en;
    struct engine_stats base;
    uint64_t tokens, prompt_tokens, ends[FINISH_ERROR + 1];
    int late; /* events that went out before their counts */
};

static void on_event_counted(void *user, const struct engine_event *ev)
{
    struct counted *k = user;
    if (ev->kind == ENGINE_EV_TOKEN) {
        k->tokens++;
        if (ev->n_output == 1) k->prompt_tokens += (uint64_t)(ev->n_prompt - ev->n_cached);
    }
    if (ev->finish != FINISH_NONE) k->ends[ev->finish]++;
    struct engine_stats st;
    engine_stats(k->en, &st);
    if (st.generation_tokens - k->base.generation_tokens < k->tokens) k->late++;
    if (st.prompt_tokens - k->base.prompt_tokens < k->prompt_tokens) k->late++;
    for (int i = 0; i <= FINISH_ERROR; i++)
        if (st.requests_finished[i] - k->base.requests_finished[i] < k->ends[i]) k->late++;
}

static uint64_t submit_counted(struct engine *en, const struct golden_case *c,
                               struct sampling_params sp, struct counted *k)
{
    struct engine_request q = {.prompt = c->prompt,
                               .n_prompt = c->n_prompt,
                               .sp = sp,
                               .on_event = on_event_counted,
                               .user = k};
    struct err e = {0};
    uint64_t id = engine_submit(en, &q, &e);
    CHECK(id > 0, "submit: %s", e.msg);
    return id;
}

static void test_counts(const char *dir, struct golden_case *cs, int nc)
{
    /* a budget of 64: prompts in chunks, steps that mix prefill and decode */
    struct engine *en = open_engine(dir, 64, 0, 0, 0);
    if (!en) return;
    struct counted k = {.en = en};
    engine_stats(en, &k.base);
    static const int lens[] = {5, 9, 1};
    for (int i = 0; i < 3; i++) { /* greedy: overlapped steps, picks on the device */
        submit_counted(en, &cs[i % nc], greedy_params(lens[i]), &k);
        engine_step(en);
    }
    struct sampling_params sp = greedy_params(6); /* rows read on the host */
    sp.logprobs = 1;
    submit_counted(en, &cs[nc - 1], sp, &k);
    engine_step(en);
    uint64_t ab = submit_counted(en, &cs[0], greedy_params(40), &k);
    for (int i = 0; i < 3; i++) engine_step(en);
    engine_abort(en, ab);
    drain(en);
    struct engine_stats st;
    engine_stats(en, &st);
    CHECK(k.late == 0, "counts: %d events went out before the statistics counted them", k.late);
    CHECK(k.ends[FINISH_LENGTH] == 4 && k.ends[FINISH_ABORT] == 1,
          "counts: %llu ends by length, %llu by abort", (unsigned long long)k.ends[FINISH_LENGTH],
          (unsigned long long)k.ends[FINISH_ABORT]);
    CHECK(k.tokens >= 21 && k.tokens < 21 + 40, "counts: %llu tokens",
          (unsigned long long)k.tokens);
    CHECK(st.generation_tokens - k.base.generation_tokens == k.tokens,
          "counts: %llu tokens counted, %llu seen",
          (unsigned long long)(st.generation_tokens - k.base.generation_tokens),
          (unsigned long long)k.tokens);
    check_pool_free(en, "counts", "after");
    engine_destroy(en);
}

/* The BitNet variants (tests/golden/variants/bitnet-*: their own weights, llama-tiny's
 * tokenizer), assembled in a temporary folder as the golden model test does, through the same
 * batch-invariance and prefix checks: the ternary products are exact and each row's int8
 * quantization is its own, so a batch changes no token. */
static int test_variants(const char *mdir)
{
    static const char *const vs[] = {"bitnet-packed", "bitnet-bf16"};
    char tmp[] = "/tmp/pagoda-engine-variants-XXXXXX";
    int tested = 0;
    if (!mkdtemp(tmp)) {
        CHECK(0, "cannot make a temporary folder");
        return 0;
    }
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
        char dir[4400], cmd[13500];
        snprintf(dir, sizeof dir, "%s/%s", tmp, vs[i]);
        snprintf(cmd, sizeof cmd,
                 "mkdir -p '%s' && for f in '%s/llama-tiny'/* tests/golden/variants/%s/*; do "
                 "ln -sf \"$(realpath \"$f\")\" '%s'/; done",
                 dir, mdir, vs[i], dir);
        if (system(cmd) != 0) {
            CHECK(0, "%s: cannot assemble the variant folder", vs[i]);
            continue;
        }
        cJSON *root;
        struct golden_case cs[MAX_CASES];
        int nc = load_cases(dir, &root, cs);
        CHECK(nc > 0, "%s: no golden cases", vs[i]);
        int before = test_failures;
        if (nc > 0) test_model(dir, vs[i], cs, nc);
        printf("%-24s %s\n", vs[i], test_failures == before ? "ok" : "FAILED");
        for (int k = 0; k < nc; k++) free(cs[k].prompt);
        cJSON_Delete(root);
        tested++;
    }
    char rm[256];
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmp);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return tested;
}

int main(int argc, char **argv)
{
    if (argc >= 5 && !strcmp(argv[argc - 2], "--tensor-parallel-size")) {
        tp = atoi(argv[argc - 1]);
        argc -= 2;
        if (tp < 1) return 2;
    }
    int on_cuda, rc = eng_args(argc, argv, &device, "the engine test", &on_cuda);
    if (rc >= 0) return rc;
    if (on_cuda && backend_gpu_count() < tp) {
        printf("no GPU: not run (%d GPUs, the split needs %d)\n", backend_gpu_count(), tp);
        return 77;
    }
    if (on_cuda) plp_tol = 5e-2;
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
        int ok = golden_arch(dir, arch, sizeof arch) && golden_device_runs(arch, device) &&
                 (tp == 1 || (golden_tp_splits(arch) && golden_tp_fits(dir, tp, why, sizeof why)));
        if (!ok) {
            free(names[i]);
            continue;
        }
        cJSON *root;
        struct golden_case cs[MAX_CASES];
        int nc = load_cases(dir, &root, cs);
        CHECK(nc > 0, "%s: no golden cases", names[i]);
        int before = test_failures;
        const double plp_was = plp_tol;
        if (golden_kv16_sensitive(arch, device)) {
            plp_tol = GOLDEN_TOL_KV16;
            margin_tol = GOLDEN_MARGIN_KV16;
        }
        if (nc > 0) test_model(dir, names[i], cs, nc);
        /* the controls (overlapped steps among them) and counts at one rank */
        if (tp == 1 && (!strcmp(names[i], "llama-tiny") || !strcmp(names[i], "qwen3-tiny-mlx8")))
            test_controls(dir, cs, nc);
        if (tp == 1 && !strcmp(names[i], "llama-tiny") && nc > 1) test_counts(dir, cs, nc);
        if (!strcmp(names[i], "gemma4moe-tiny")) test_kv_shared(dir, names[i]);
        if (nc > 0 && (!strcmp(names[i], "llama-tiny") || !strcmp(names[i], "gemma3-tiny") ||
                       !strcmp(names[i], "qwen3_5-tiny"))) {
            static const struct kv_spec fmts[] = {{.k = KV_DTYPE_FP8, .v = KV_DTYPE_FP8},
                                                  {.k = KV_DTYPE_TQ4, .v = KV_DTYPE_TQ3}};
            for (int f = 0; f < 2; f++) {
                char label[160];
                snprintf(label, sizeof label, "%s kv %s/%s", names[i], kv_dtype_name(fmts[f].k),
                         kv_dtype_name(fmts[f].v));
                kv_fmt = fmts[f];
                test_model(dir, label, cs, nc);
                kv_fmt = (struct kv_spec){0};
            }
        }
        plp_tol = plp_was;
        margin_tol = GOLDEN_MARGIN;
        printf("%-24s %s\n", names[i], test_failures == before ? "ok" : "FAILED");
        tested++;
        for (int k = 0; k < nc; k++) free(cs[k].prompt);
        cJSON_Delete(root);
        free(names[i]);
    }
    if (tp > 1) { /* 8 architectures in bf16 (Gemma 4 dense and MoE apart) and 8 quantized
                   * copies, less those that do not split */
        CHECK(tested >= (tp == 2 ? 16 : 15), "only %d model folders tested split %d ways", tested,
              tp);
        TEST_DONE();
    }
    CHECK(tested >= 12, "only %d model folders tested", tested);
    if (golden_device_runs("BitNetForCausalLM", device))
        CHECK(test_variants(mdir) == 2, "the BitNet variants were not both tested");
    TEST_DONE();
}
