/*
 * Speculative decoding's pieces on fixed inputs: prompt lookup (exact drafts), the draft
 * length (exact), and the verification (spec_verify with the engine's own sampler) on
 * fixed logit rows: over 200,000 draws at T = 1 with top-k and top-p, the kept tokens
 * follow the target distribution, the tokens kept after a rejected draft follow the
 * residual distribution (the target without the draft, renormalized), and the token after
 * an accepted draft follows the next row's distribution (chi-square tests); greedy rows
 * accept exactly the drafts equal to their argmax.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sched/spec.h"
#include "test_util.h"
#include "unit/sched/spec_stats.h"

#define V 16

static void test_ngram(void)
{
    int32_t out[8];
    /* "1 2 3 4 9 1 2 3": the 3-gram "1 2 3" occurred at 0, followed by 4 9 1 2 3 */
    int32_t a[16] = {1, 2, 3, 4, 9, 1, 2, 3};
    int n = spec_ngram_propose(a, 8, 1, 4, 3, out);
    CHECK(n == 3 && out[0] == 4 && out[1] == 9 && out[2] == 1, "lookup: %d drafts %d %d %d", n,
          out[0], out[1], out[2]);
    /* the latest occurrence wins: "5 7 ... 5 8 ... 5" proposes 8 */
    int32_t b[16] = {5, 7, 0, 5, 8, 0, 5};
    n = spec_ngram_propose(b, 7, 1, 1, 2, out);
    CHECK(n == 2 && out[0] == 8 && out[1] == 0, "latest: %d drafts %d %d", n, out[0], out[1]);
    /* a longer match beats a later shorter one: "0 5" matches at 2 (followed by 8) */
    n = spec_ngram_propose(b, 7, 1, 2, 1, out);
    CHECK(n == 1 && out[0] == 8, "longest: %d drafts %d", n, out[0]);
    /* no draft past the context's end, none below ngram_min, none without a match */
    int32_t c[8] = {4, 4};
    n = spec_ngram_propose(c, 2, 1, 3, 4, out);
    CHECK(n == 1 && out[0] == 4, "at the end: %d", n);
    int32_t d[8] = {1, 2, 3, 4};
    CHECK(spec_ngram_propose(d, 4, 1, 3, 4, out) == 0, "no match");
    CHECK(spec_ngram_propose(b, 7, 2, 3, 4, out) == 3 && out[0] == 8, "min 2: '0 5' matches");
    CHECK(spec_ngram_propose(b, 7, 3, 3, 4, out) == 0, "min 3: no 3-gram repeats");
}

static void test_k(void)
{
    struct spec s = {.cfg = {.method = SPEC_NGRAM, .num_tokens = 4}, .disable_n = 64};
    struct engine en = {.spec = &s};
    struct request r = {.spec_rate = 1.0f, .n_output = 1};
    r.sp.max_tokens = 100;
    CHECK(spec_k(&en, &r, 1) == 4, "batch 1: %d", spec_k(&en, &r, 1));
    CHECK(spec_k(&en, &r, 32) == 2, "batch 32: %d", spec_k(&en, &r, 32));
    CHECK(spec_k(&en, &r, 48) == 1, "batch 48: %d", spec_k(&en, &r, 48));
    CHECK(spec_k(&en, &r, 63) == 1, "batch 63: %d", spec_k(&en, &r, 63));
    CHECK(spec_k(&en, &r, 64) == 0, "batch 64: %d", spec_k(&en, &r, 64));
    r.spec_rate = 0.5f; /* 0.5^2 = 1/4: two drafts */
    CHECK(spec_k(&en, &r, 1) == 2, "rate 0.5: %d", spec_k(&en, &r, 1));
    r.spec_rate = 0.2f; /* below the threshold: none */
    CHECK(spec_k(&en, &r, 1) == 0, "rate 0.2: %d", spec_k(&en, &r, 1));
    /* steps of 1 to 5 rows costing 1 + rows ms: a = b, so a row must be worth 1/2 a token
     * at batch 1 (0.72^2 = 0.52: two drafts), 8/9 at batch 8 (none) */
    for (int i = 0; i < 50; i++) spec_observe(&en, 1 + i % 5, (2 + i % 5) * 1e-3);
    CHECK(fabs(spec_threshold(&en, 1) - 0.5) < 1e-6, "threshold %.6f", spec_threshold(&en, 1));
    CHECK(fabs(spec_threshold(&en, 8) - 8.0 / 9) < 1e-6, "threshold at 8: %.6f",
          spec_threshold(&en, 8));
    r.spec_rate = 0.72f;
    CHECK(spec_k(&en, &r, 1) == 2, "fitted, batch 1: %d", spec_k(&en, &r, 1));
    CHECK(spec_k(&en, &r, 8) == 0, "fitted, batch 8: %d", spec_k(&en, &r, 8));
    r.spec_rate = 1.0f;
    r.n_output = 98; /* one more output may follow the kept token */
    CHECK(spec_k(&en, &r, 1) == 1, "near max_tokens: %d", spec_k(&en, &r, 1));
    r.n_output = 99;
    CHECK(spec_k(&en, &r, 1) == 0, "at max_tokens: %d", spec_k(&en, &r, 1));
}

/* The verification on a fake engine: three fixed logit rows, drafts d0 and d1. */
struct fake {
    struct engine en;
    struct model m;
    struct spec s;
    struct request r;
    int32_t toks[64], out[4];
    int n_out;
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct fake *f = user;
    if (ev->kind == ENGINE_EV_TOKEN && f->n_out < 4) f->out[f->n_out++] = ev->token;
}

static void fake_init(struct fake *f, float temperature)
{
    memset(f, 0, sizeof *f);
    f->s = (struct spec){.cfg = {.method = SPEC_NGRAM, .num_tokens = 2}, .disable_n = 64};
    struct engine *en = &f->en;
    en->spec = &f->s;
    en->m = &f->m;
    en->vocab = V;
    en->block_size = 16;
    en->max_model_len = 1 << 20;
    en->cfg.disable_prefix_caching = 1;
    en->logits = xcalloc(3 * V, sizeof(float));
    en->greedy = xcalloc(3, sizeof(int32_t));
    en->work = xcalloc(V, sizeof(float));
    en->cand = xcalloc(V, sizeof(int32_t));
    en->scand = xcalloc(V, sizeof(struct sampler_cand));
    en->counts = xcalloc(V, sizeof(uint32_t));
    pthread_mutex_init(&en->mu, NULL);
    struct request *r = &f->r;
    r->tokens = f->toks;
    r->cap = 64;
    r->state = RS_RUNNING;
    r->ph_pos = r->ph_row = -1;
    r->state_slot = -1;
    r->state_backup = -1;
    r->spec_rate = 1;
    sampling_params_default(&r->sp);
    r->sp.temperature = temperature;
    r->sp.top_k = 6;
    r->sp.top_p = 0.9f;
    r->sp.max_tokens = 1000;
    r->sp.ignore_eos = 1;
    r->cb = on_event;
    r->user = f;
    rng_seed(&r->rng, 12345);
    /* three rows of distinct logits over V tokens */
    for (int j = 0; j < 3; j++)
        for (int t = 0; t < V; t++) en->logits[j * V + t] = (float)((t * 7 + j * 5) % V) * 0.25f;
}

static void fake_free(struct fake *f)
{
    free(f->en.logits);
    free(f->en.greedy);
    free(f->en.work);
    free(f->en.cand);
    free(f->en.scand);
    free(f->en.counts);
    pthread_mutex_destroy(&f->en.mu);
}

/* One verification of drafts d0, d1 after a 4-token context: the tokens kept into f->out. */
static void verify_once(struct fake *f, int32_t d0, int32_t d1)
{
    struct request *r = &f->r;
    r->n_tokens = 4;
    r->n_computed = 3;
    r->n_output = 1;
    r->n_blocks = 0;
    r->tokens[4] = d0;
    r->tokens[5] = d1;
    f->n_out = 0;
    struct step_seq p = {
        .r = r, .n_new = 3, .logit_row = 0, .n_logits = 3, .samples = 1, .n_spec = 2};
    spec_verify(&f->en, &p);
}

static void test_rejection(void)
{
    struct fake f;
    fake_init(&f, 1.0f);
    double p0[V], p1[V], res[V];
    spec_law_k6_p09(f.en.logits, V, p0);
    spec_law_k6_p09(f.en.logits + V, V, p1);
    /* the draft: the second most likely token of row 0 (accepted about a third of the time) */
    int32_t d0 = -1, d1 = 3;
    double best = 0;
    for (int t = 0; t < V; t++)
        if (p0[t] > best) best = p0[t];
    double second = 0;
    for (int t = 0; t < V; t++)
        if (p0[t] < best && p0[t] > second) second = p0[t], d0 = t;
    for (int t = 0; t < V; t++) res[t] = t == d0 ? 0 : p0[t] / (1 - p0[d0]);

    const long N = 200000;
    long all[V] = {0}, rej[V] = {0}, next[V] = {0}, n_rej = 0, n_acc = 0;
    for (long i = 0; i < N; i++) {
        verify_once(&f, d0, d1);
        all[f.out[0]]++;
        if (f.out[0] == d0) {
            n_acc++;
            CHECK(f.n_out >= 2, "an accepted draft keeps a next token");
            next[f.out[1]]++;
        } else {
            n_rej++;
            rej[f.out[0]]++;
            CHECK(f.n_out == 1, "a rejected draft ends the walk (%d tokens)", f.n_out);
        }
    }
    /* 99.99th percentiles of chi-square: dof 2: 18.4, 3: 21.1, 4: 23.5, 5: 25.7 */
    static const double crit[] = {0, 13.8, 18.4, 21.1, 23.5, 25.7};
    int dof;
    double x = spec_chi2(all, p0, V, N, &dof);
    CHECK(dof >= 2 && dof <= 5 && x < crit[dof], "kept tokens vs target: chi2 %.2f, dof %d", x,
          dof);
    printf("target   chi2 %6.2f dof %d (%ld draws; draft %d accepted %.4f, p %.4f)\n", x, dof, N,
           d0, (double)n_acc / N, p0[d0]);
    x = spec_chi2(rej, res, V, n_rej, &dof);
    CHECK(dof >= 1 && dof <= 5 && x < crit[dof], "after a rejection vs residual: chi2 %.2f, dof %d",
          x, dof);
    printf("residual chi2 %6.2f dof %d (%ld draws)\n", x, dof, n_rej);
    x = spec_chi2(next, p1, V, n_acc, &dof);
    CHECK(dof >= 1 && dof <= 5 && x < crit[dof], "after an acceptance vs row 1: chi2 %.2f, dof %d",
          x, dof);
    printf("next     chi2 %6.2f dof %d (%ld draws)\n", x, dof, n_acc);
    /* the acceptance rate is p(d0): within 5 standard deviations */
    double sd = sqrt(p0[d0] * (1 - p0[d0]) / N);
    CHECK(fabs((double)n_acc / N - p0[d0]) < 5 * sd, "acceptance %.4f, p(draft) %.4f",
          (double)n_acc / N, p0[d0]);
    struct engine_stats *st = &f.en.stats;
    CHECK(st->spec_drafts[SPEC_NGRAM] == (uint64_t)N &&
              st->spec_draft_tokens[SPEC_NGRAM] == 2 * (uint64_t)N,
          "counted %llu verifications", (unsigned long long)st->spec_drafts[SPEC_NGRAM]);
    CHECK(st->spec_accept_hist[SPEC_NGRAM][0] == (uint64_t)n_rej, "histogram: %llu rejections",
          (unsigned long long)st->spec_accept_hist[SPEC_NGRAM][0]);

    /* Seeded: the same generator gives the same tokens, and the same as plain sampling of
     * the rows in turn (the target's own draws decide). */
    struct fake g;
    fake_init(&g, 1.0f);
    struct rng plain;
    rng_seed(&plain, 12345);
    for (int i = 0; i < 1000; i++) {
        verify_once(&g, d0, d1);
        struct request pr = g.r;
        pr.rng = plain;
        pr.n_tokens = 4;
        int32_t t = sample_next(&g.en, &pr, g.en.logits);
        CHECK(t == g.out[0], "draw %d: %d, plain sampling %d", i, g.out[0], t);
        if (g.n_out >= 2) {
            pr.tokens[4] = t;
            pr.n_tokens = 5;
            int32_t t1 = sample_next(&g.en, &pr, g.en.logits + V);
            CHECK(t1 == g.out[1], "draw %d second: %d, plain %d", i, g.out[1], t1);
            if (g.n_out == 3) sample_next(&g.en, &pr, g.en.logits + 2 * V);
        }
        plain = pr.rng;
    }
    fake_free(&g);
    fake_free(&f);
}

static void test_greedy(void)
{
    struct fake f;
    fake_init(&f, 0);
    f.en.greedy_step = 1; /* picks made where the logits are */
    f.en.greedy[0] = 7;
    f.en.greedy[1] = 2;
    f.en.greedy[2] = 11;
    verify_once(&f, 7, 2); /* both accepted, then the bonus token */
    CHECK(f.n_out == 3 && f.out[0] == 7 && f.out[1] == 2 && f.out[2] == 11, "all: %d tokens",
          f.n_out);
    CHECK(f.r.n_computed == 5 && f.r.n_tokens == 7, "all: computed %d, tokens %d", f.r.n_computed,
          f.r.n_tokens);
    verify_once(&f, 7, 3); /* the second rejected: 7, then the target's 2 */
    CHECK(f.n_out == 2 && f.out[0] == 7 && f.out[1] == 2, "second rejected: %d tokens", f.n_out);
    CHECK(f.r.n_computed == 4 && f.r.n_tokens == 6, "second rejected: computed %d, tokens %d",
          f.r.n_computed, f.r.n_tokens);
    verify_once(&f, 1, 2); /* the first rejected */
    CHECK(f.n_out == 1 && f.out[0] == 7 && f.r.n_computed == 3, "first rejected: %d tokens",
          f.n_out);
    const struct engine_stats *st = &f.en.stats;
    CHECK(st->spec_accept_hist[SPEC_NGRAM][0] == 1 && st->spec_accept_hist[SPEC_NGRAM][1] == 1 &&
              st->spec_accept_hist[SPEC_NGRAM][2] == 1 &&
              st->spec_accepted_pos[SPEC_NGRAM][0] == 2 &&
              st->spec_accepted_pos[SPEC_NGRAM][1] == 1 && st->generation_tokens == 3,
          "greedy counts");
    fake_free(&f);
}

int main(void)
{
    test_ngram();
    test_k();
    test_greedy();
    test_rejection();
    TEST_DONE();
}
