/*
 * Speculative sampling end to end (CPU unless --device; the batch-invariant kernels, so that
 * a context's row is the same in every batch): llama-tiny with its 4-bit copy
 * (llama-tiny-mlx4, the same tokenizer) drafting, seeded requests of one fixed prompt at
 * T = 1, top-k 4, top-p 0.9, three tokens each (100,000 requests; --requests N for another
 * count). The
 * first token comes from the prompt's step; the second from the verification of a draft (kept,
 * or a draw from the residual); the third after a kept draft from the bonus row, else from a
 * plain step. The joint law of the three tokens is compared with the target's, computed here
 * from the model's logits of every context (a forward each): Pearson's chi-square over the
 * token triples, those expected fewer than 5 times pooled into one cell, significance 0.001
 * (critical value by the Wilson-Hilferty approximation), dof = cells - 1. A triple the target
 * cannot produce fails outright. The seeds are fixed, so the outcome is too. Drafts are kept
 * and rejected (counted). First, the model as its own draft model: the same sampled tokens
 * and log-probabilities as plain decoding with the same seeds, every draft kept.
 * usage: golden_test_spec_sample PAGODA_BINARY TESTDATA_DIR [--device DEV] [--requests N]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "kernels/cpu/cpu.h"
#include "model/backend.h"
#include "model/model.h"
#include "sched/engine.h"
#include "test_util.h"

static const char *device = "cpu";
static int n_req = 100000; /* --requests */

#define CHUNK   4000
#define TOP_K   4
#define TOP_P   0.9f
#define N_GEN   3
#define MAX_CTX 16

static const int32_t prompt[] = {1, 300};
#define N_PROMPT 2

struct out {
    int32_t t[N_GEN];
    float lp[N_GEN];
    int n;
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct out *o = user;
    if (ev->kind == ENGINE_EV_TOKEN && o->n < N_GEN) {
        o->lp[o->n] = ev->logprob;
        o->t[o->n++] = ev->token;
    }
}

static struct sampling_params params(uint64_t seed)
{
    struct sampling_params sp;
    sampling_params_default(&sp);
    sp.temperature = 1.0f;
    sp.top_k = TOP_K;
    sp.top_p = TOP_P;
    sp.max_tokens = N_GEN;
    sp.ignore_eos = 1;
    sp.has_seed = 1;
    sp.seed = seed;
    sp.logprobs = 1;
    return sp;
}

static struct engine *open_engine(const char *dir, enum spec_method m, const char *draft,
                                  struct err *e)
{
    struct engine_config cfg = {
        .model_dir = dir,
        .device = device,
        .max_num_seqs = 512,
        .manual = 1,
        .spec = {
            .method = m, .num_tokens = 2, .model_dir = draft, .disable_by_batch_size = 1 << 20}};
    return engine_create(&cfg, e);
}

/* Runs n seeded requests (seeds seed0, seed0 + 1, ...) of the prompt through en into o. */
static void run(struct engine *en, struct out *o, int n, uint64_t seed0)
{
    for (int c = 0; c < n; c += CHUNK) {
        for (int i = c; i < n && i < c + CHUNK; i++) {
            memset(&o[i], 0, sizeof o[i]);
            struct engine_request q = {.prompt = prompt,
                                       .n_prompt = N_PROMPT,
                                       .sp = params(seed0 + (uint64_t)i),
                                       .on_event = on_event,
                                       .user = &o[i]};
            struct err e = {0};
            CHECK(engine_submit(en, &q, &e) > 0, "submit: %s", e.msg);
        }
        for (int guard = 0; engine_step(en) > 0 && guard < 1000000; guard++) {
        }
    }
}

/* The target's law after T = 1, top-k, top-p (the sampler's definition: the k largest, then
 * the shortest prefix of them, largest first and lower id first among equals, whose
 * probabilities reach top_p of theirs) into p[V]. */
static void law(const float *row, int V, double *p)
{
    int ids[TOP_K];
    for (int k = 0; k < TOP_K; k++) {
        int best = -1;
        for (int t = 0; t < V; t++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= ids[j] == t;
            if (!taken && (best < 0 || row[t] > row[best])) best = t;
        }
        ids[k] = best;
    }
    double w[TOP_K], sum = 0, acc = 0;
    for (int k = 0; k < TOP_K; k++) sum += w[k] = exp((double)row[ids[k]] - row[ids[0]]);
    int n = 0;
    while (n < TOP_K) {
        acc += w[n++];
        if (acc >= (double)TOP_P * sum) break;
    }
    memset(p, 0, sizeof(double) * (size_t)V);
    for (int k = 0; k < n; k++) p[ids[k]] = w[k] / acc;
}

/* The model's logits after ctx[0..n) (one sequence in block 0). */
static void logits_of(struct model *m, const int32_t *ctx, int n, float *out)
{
    int32_t pos[MAX_CTX], qs[2] = {0, n}, sl[1] = {n}, bt[1] = {0}, lr[1] = {n - 1};
    for (int i = 0; i < n; i++) pos[i] = i;
    struct fwd_batch b = {.n_tokens = n,
                          .tokens = ctx,
                          .pos = pos,
                          .slot = pos,
                          .n_seqs = 1,
                          .q_start = qs,
                          .seq_len = sl,
                          .block_table = bt,
                          .max_blocks = 1,
                          .n_logits = 1,
                          .logit_rows = lr};
    model_forward(m, &b, out);
}

/* A token triple's cell. */
struct cell {
    int32_t t[3];
    double e;
    long n;
};

static void test_chi2(const char *dir, const char *draft)
{
    struct err e = {0};
    struct backend be;
    CHECK(backend_create(&be, device, 0, &e) == 0, "backend: %s", e.msg);
    struct model *m = model_load(dir, &be, &e);
    CHECK(m && model_state_alloc(m, MAX_CTX, 1, 1, 16, 0, &e) == 0, "llama-tiny: %s", e.msg);
    if (!m) return;
    const int V = m->cfg.vocab;
    float *row = malloc(sizeof(float) * (size_t)V);
    double *p1 = malloc(sizeof(double) * (size_t)V), *p2 = malloc(sizeof(double) * (size_t)V),
           *p3 = malloc(sizeof(double) * (size_t)V);
    struct cell *cells = calloc(TOP_K * TOP_K * TOP_K, sizeof *cells);
    int nc = 0;
    int32_t ctx[MAX_CTX];
    memcpy(ctx, prompt, sizeof prompt);
    logits_of(m, ctx, N_PROMPT, row);
    law(row, V, p1);
    for (int a = 0; a < V; a++) {
        if (p1[a] == 0) continue;
        ctx[N_PROMPT] = a;
        logits_of(m, ctx, N_PROMPT + 1, row);
        law(row, V, p2);
        for (int b = 0; b < V; b++) {
            if (p2[b] == 0) continue;
            ctx[N_PROMPT + 1] = b;
            logits_of(m, ctx, N_PROMPT + 2, row);
            law(row, V, p3);
            for (int c = 0; c < V; c++)
                if (p3[c] > 0)
                    cells[nc++] = (struct cell){{a, b, c}, p1[a] * p2[b] * p3[c] * n_req, 0};
        }
    }
    model_destroy(m);
    backend_destroy(&be);

    struct engine *en = open_engine(dir, SPEC_DRAFT, draft, &e);
    CHECK(en != NULL, "engine_create: %s", e.msg);
    if (!en) return;
    struct out *o = malloc(sizeof *o * n_req);
    double t0 = util_now();
    run(en, o, n_req, 1);
    double dt = util_now() - t0;
    struct engine_stats st;
    engine_stats(en, &st);
    engine_destroy(en);
    long impossible = 0;
    for (int i = 0; i < n_req; i++) {
        CHECK(o[i].n == N_GEN, "request %d: %d tokens", i, o[i].n);
        int at = -1;
        for (int c = 0; c < nc && at < 0; c++)
            if (!memcmp(cells[c].t, o[i].t, sizeof cells[c].t)) at = c;
        if (at < 0)
            impossible++;
        else
            cells[at].n++;
    }
    CHECK(impossible == 0, "%ld requests drew a triple of probability 0", impossible);
    /* pool the cells expected fewer than 5 times */
    double x = 0, pe = 0;
    long pn = 0;
    int k = 0;
    for (int c = 0; c < nc; c++) {
        if (cells[c].e < 5) {
            pe += cells[c].e;
            pn += cells[c].n;
            continue;
        }
        x += (cells[c].n - cells[c].e) * (cells[c].n - cells[c].e) / cells[c].e;
        k++;
    }
    if (pe > 0) {
        x += (pn - pe) * (pn - pe) / pe;
        k++;
    }
    int dof = k - 1;
    double h = 2.0 / (9.0 * dof), z = 3.0902; /* the 99.9th percentile of the normal */
    double crit = dof * pow(1 - h + z * sqrt(h), 3);
    uint64_t drafted = st.spec_draft_tokens[SPEC_DRAFT], kept = st.spec_accepted_tokens[SPEC_DRAFT];
    printf("chi2 %.2f, dof %d, critical %.2f (significance 0.001); %d triples, %d requests in "
           "%.1f s; %llu drafts, %llu kept\n",
           x, dof, crit, nc, n_req, dt, (unsigned long long)drafted, (unsigned long long)kept);
    CHECK(dof >= 3 && x < crit, "token triples vs the target's law: chi2 %.2f, dof %d, crit %.2f",
          x, dof, crit);
    CHECK(kept > 0 && kept < drafted && drafted > (uint64_t)n_req / 2, "%llu drafts, %llu kept",
          (unsigned long long)drafted, (unsigned long long)kept);
    free(o);
    free(cells);
    free(row);
    free(p1);
    free(p2);
    free(p3);
}

/* The model as its own draft model: its law is the target's, every draft is kept and the
 * tokens are those plain decoding draws with the same seeds, log-probabilities too. */
static void test_self(const char *dir)
{
    enum { N = 200 };
    struct out plain[N], spec[N];
    struct err e = {0};
    uint64_t drafted = 0, kept = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct engine *en =
            pass ? open_engine(dir, SPEC_DRAFT, dir, &e) : open_engine(dir, SPEC_NONE, NULL, &e);
        CHECK(en != NULL, "engine_create: %s", e.msg);
        if (!en) return;
        run(en, pass ? spec : plain, N, 5000);
        struct engine_stats st;
        engine_stats(en, &st);
        drafted = st.spec_draft_tokens[SPEC_DRAFT];
        kept = st.spec_accepted_tokens[SPEC_DRAFT];
        engine_destroy(en);
    }
    for (int i = 0; i < N; i++) {
        CHECK(spec[i].n == plain[i].n && !memcmp(spec[i].t, plain[i].t, sizeof(int32_t) * N_GEN),
              "seed %d: tokens differ from plain decoding", 5000 + i);
        for (int t = 0; t < plain[i].n; t++)
            CHECK(spec[i].lp[t] == plain[i].lp[t], "seed %d token %d: logprob %.6f, plain %.6f",
                  5000 + i, t, (double)spec[i].lp[t], (double)plain[i].lp[t]);
    }
    CHECK(drafted > 0 && kept == drafted, "its own draft: %llu of %llu kept",
          (unsigned long long)kept, (unsigned long long)drafted);
    printf("own draft: %d sampled requests as plain decoding, %llu of %llu drafts kept\n", N,
           (unsigned long long)kept, (unsigned long long)drafted);
}

int main(int argc, char **argv)
{
    for (int i = 3; i < argc || argc < 3; i += 2) {
        if (argc >= 3 && i + 1 < argc && !strcmp(argv[i], "--device")) {
            device = argv[i + 1];
        } else if (i + 1 < argc && !strcmp(argv[i], "--requests") && atoi(argv[i + 1]) > 0) {
            n_req = atoi(argv[i + 1]);
        } else {
            fprintf(stderr, "usage: %s PAGODA_BINARY TESTDATA_DIR [--device DEV] [--requests N]\n",
                    argv[0]);
            return 2;
        }
    }
    if (strncmp(device, "cpu", 3)) {
        if (!strncmp(device, "cuda", 4) && !backend_cuda_available()) {
            printf("no GPU: not run\n");
            return 77;
        }
        setenv("PAGODA_CUDA_BATCH_INVARIANT", "1", 0);
    }
    /* the own-draft check compares rows across batches: the batch-invariant kernels */
    cpu_batch_invariant_set(1);
    char dir[4200], draft[4200];
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", argv[2]);
    snprintf(draft, sizeof draft, "%s/models/llama-tiny-mlx4", argv[2]);
    test_self(dir);
    test_chi2(dir, draft);
    TEST_DONE();
}
