/*
 * The speculative-sampling rule (spec_rule) on fixed laws p (target) and q (drafter): drafts
 * drawn from q, 1,000,000 verifications a case. The tokens kept follow p (Pearson's
 * chi-square at significance 0.001, dof = the tokens of p's support - 1), the tokens drawn
 * after a rejection follow max(0, p - q) normalized (the same test), the acceptance rate is
 * sum min(p, q) (within 5 standard deviations), and no token outside p's support comes out.
 * Cases: overlapping supports of different shapes, q = p (every draft kept), disjoint
 * supports (none kept), q wider than p. Then spec_verify on a fake engine with drafts drawn by
 * spec_q_pick from fixed rows: with the target's own rows as the drafter's, every draft is
 * kept and the tokens are plain sampling's; with other rows, the first token and the one
 * after a kept draft follow the target's rows (200,000 verifications), and the request's
 * generator winds on by one number a token kept. The generators are seeded: the outcome is
 * fixed.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sched/spec.h"
#include "test_util.h"
#include "unit/sched/spec_stats.h"

#define V 12
#define N 1000000L

/* 99.9th percentiles of chi-square, dof 1..11 */
static const double crit999[] = {0,     10.83, 13.82, 16.27, 18.47, 20.52,
                                 22.46, 24.32, 26.12, 27.88, 29.59, 31.26};

/* A law as the sampler gives it: candidates (support, in a shuffled order) and probabilities. */
struct law {
    int32_t ids[V];
    float p[V];
    int n;
    double dense[V];
};

static void law_make(struct law *l, const double *w)
{
    double sum = 0;
    for (int t = 0; t < V; t++) sum += w[t];
    l->n = 0;
    /* a fixed non-sorted order, as top-k's selection leaves it */
    static const int order[V] = {5, 2, 9, 0, 11, 7, 3, 8, 1, 10, 4, 6};
    for (int i = 0; i < V; i++) {
        int t = order[i];
        l->dense[t] = w[t] / sum;
        if (w[t] > 0) {
            l->ids[l->n] = t;
            l->p[l->n++] = (float)(w[t] / sum);
        }
    }
}

static void run_case(const char *name, const double *wp, const double *wq, int want)
{
    struct law p, q;
    law_make(&p, wp);
    law_make(&q, wq);
    double res[V], rsum = 0, overlap = 0;
    for (int t = 0; t < V; t++) {
        double x = p.dense[t] - q.dense[t];
        res[t] = x > 0 ? x : 0;
        rsum += res[t];
        overlap += p.dense[t] < q.dense[t] ? p.dense[t] : q.dense[t];
    }
    for (int t = 0; t < V; t++) res[t] = rsum > 0 ? res[t] / rsum : 0;
    float scratch[V] = {0};
    struct rng gq, g;
    rng_seed(&gq, 2024);
    rng_seed(&g, 77);
    long all[V] = {0}, rej[V] = {0}, n_acc = 0;
    for (long i = 0; i < N; i++) {
        /* the draft: inverse CDF of q in its candidates' order */
        double u = rng_uniform(&gq), acc = 0;
        int at = q.n - 1;
        for (int j = 0; j < q.n; j++) {
            acc += q.p[j];
            if (u < acc) {
                at = j;
                break;
            }
        }
        int accepted;
        int32_t t =
            spec_rule(p.ids, p.p, p.n, q.ids, q.p, q.n, q.ids[at], q.p[at], &g, scratch, &accepted);
        CHECK(t >= 0 && t < V, "%s: token %d", name, t);
        if (t < 0 || t >= V) return;
        all[t]++;
        if (accepted) {
            n_acc++;
            CHECK(t == q.ids[at], "%s: accepted %d, draft %d", name, t, q.ids[at]);
        } else {
            rej[t]++;
        }
    }
    for (int t = 0; t < V; t++) CHECK(scratch[t] == 0, "%s: scratch left dirty at %d", name, t);
    int dof;
    double x = spec_chi2(all, p.dense, V, N, &dof);
    CHECK(dof >= 1 && dof < 12 && x < crit999[dof], "%s: kept tokens vs p: chi2 %.2f, dof %d", name,
          x, dof);
    printf("%-10s kept     chi2 %7.2f dof %2d (crit %.2f)  accepted %.4f, sum min(p,q) %.4f\n",
           name, x, dof, dof >= 1 && dof < 12 ? crit999[dof] : 0, (double)n_acc / N, overlap);
    long n_rej = N - n_acc;
    if (n_rej > 0) {
        x = spec_chi2(rej, res, V, n_rej, &dof);
        CHECK(dof >= 0 && dof < 12 && (dof == 0 || x < crit999[dof]),
              "%s: after rejections vs residual: chi2 %.2f, dof %d", name, x, dof);
        printf("%-10s residual chi2 %7.2f dof %2d (%ld draws)\n", name, x, dof, n_rej);
    }
    double sd = sqrt(overlap * (1 - overlap) / N);
    CHECK(fabs((double)n_acc / N - overlap) <= 5 * sd + 1e-9, "%s: acceptance %.5f, want %.5f",
          name, (double)n_acc / N, overlap);
    if (want >= 0) CHECK(n_acc == (want ? N : 0), "%s: %ld of %ld accepted", name, n_acc, N);
}

/* spec_verify on a fake engine (no model): the target's rows and the drafter's rows are
 * fixed logit rows over W tokens, the drafts drawn by spec_q_pick from the drafter's rows. */
#define W 16
struct fake {
    struct engine en;
    struct model m, dm;
    struct spec s;
    struct request r;
    int32_t toks[64], out[4];
    int n_out;
    float drows[2 * W];
};

static void host_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    memcpy(dst, src, bytes);
}

static struct backend_ops host_ops;

static void on_event(void *user, const struct engine_event *ev)
{
    struct fake *f = user;
    if (ev->kind == ENGINE_EV_TOKEN && f->n_out < 4) f->out[f->n_out++] = ev->token;
}

static void fake_init(struct fake *f, int same)
{
    memset(f, 0, sizeof *f);
    host_ops.download = host_copy;
    struct engine *en = &f->en;
    en->be.ops = &host_ops;
    f->s = (struct spec){.cfg = {.method = SPEC_DRAFT, .num_tokens = 2}, .disable_n = 64};
    en->spec = &f->s;
    en->m = &f->m;
    en->vocab = W;
    en->block_size = 16;
    en->max_model_len = 1 << 20;
    en->cfg.max_num_seqs = 1;
    en->cfg.disable_prefix_caching = 1;
    en->logits = xcalloc(3 * W, sizeof(float));
    en->work = xcalloc(W, sizeof(float));
    en->cand = xcalloc(W, sizeof(int32_t));
    en->scand = xcalloc(W, sizeof(struct sampler_cand));
    en->counts = xcalloc(W, sizeof(uint32_t));
    pthread_mutex_init(&en->mu, NULL);
    spec_q_init(en);
    f->dm.cfg.vocab = W;
    f->dm.logits = f->drows;
    struct request *r = &f->r;
    r->tokens = f->toks;
    r->cap = 64;
    r->state = RS_RUNNING;
    r->ph_pos = r->ph_row = -1;
    r->state_slot = -1;
    r->state_backup = -1;
    r->spec_rate = 1;
    sampling_params_default(&r->sp);
    r->sp.temperature = 1.0f;
    r->sp.top_k = 6;
    r->sp.top_p = 0.9f;
    r->sp.max_tokens = 1000;
    r->sp.ignore_eos = 1;
    r->cb = on_event;
    r->user = f;
    rng_seed(&r->rng, 12345);
    rng_seed(&r->rng_spec, 999);
    for (int j = 0; j < 3; j++)
        for (int t = 0; t < W; t++) en->logits[j * W + t] = (float)((t * 7 + j * 5) % W) * 0.25f;
    /* the drafter: the target's rows, or rows that agree on some tokens only */
    for (int j = 0; j < 2; j++)
        for (int t = 0; t < W; t++)
            f->drows[j * W + t] =
                same ? en->logits[j * W + t] : (float)((t * 5 + j * 3) % W) * 0.25f;
}

static void fake_free(struct fake *f)
{
    spec_q_dispose(&f->s);
    free(f->en.logits);
    free(f->en.work);
    free(f->en.cand);
    free(f->en.scand);
    free(f->en.counts);
    pthread_mutex_destroy(&f->en.mu);
}

/* Draws two drafts after a 4-token context and verifies them: tokens kept into f->out. */
static void draft_and_verify(struct fake *f)
{
    struct request *r = &f->r;
    r->n_tokens = 4;
    r->n_computed = 3;
    r->n_output = 1;
    r->n_blocks = 0;
    r->n_q = 0;
    f->s.q_used = 0;
    for (int j = 0; j < 2; j++) r->tokens[4 + j] = spec_q_pick(&f->en, r, j, &f->dm, j, NULL, -1);
    CHECK(r->n_q == 2, "both drafts drawn from the law (%d)", r->n_q);
    f->n_out = 0;
    struct step_seq p = {
        .r = r, .n_new = 3, .logit_row = 0, .n_logits = 3, .samples = 1, .n_spec = 2};
    spec_verify(&f->en, &p);
}

/* The drafter's law is the target's: every draft kept, and the tokens are plain sampling's
 * with the same generator. Another law: the first token kept follows row 0's law, the one
 * after a kept draft row 1's (200,000 verifications); the generator winds on by one number
 * a token kept. */
static void test_verify(void)
{
    struct fake f;
    fake_init(&f, 1);
    struct rng plain;
    rng_seed(&plain, 12345);
    for (int i = 0; i < 2000; i++) {
        draft_and_verify(&f);
        CHECK(f.n_out == 3, "own law: %d tokens kept of 3", f.n_out);
        struct request pr = f.r;
        pr.rng = plain;
        pr.n_tokens = 4;
        for (int j = 0; j < f.n_out; j++) {
            int32_t t = sample_next(&f.en, &pr, f.en.logits + j * W);
            CHECK(t == f.out[j], "own law, draw %d token %d: %d, plain %d", i, j, f.out[j], t);
            pr.tokens[pr.n_tokens++] = t;
        }
        plain = pr.rng;
        CHECK(!memcmp(&plain, &f.r.rng, sizeof plain), "own law: the generator's place");
    }
    CHECK(f.en.stats.spec_accepted_tokens[SPEC_DRAFT] == 4000, "own law: %llu kept",
          (unsigned long long)f.en.stats.spec_accepted_tokens[SPEC_DRAFT]);
    fake_free(&f);

    fake_init(&f, 0);
    double p0[W], p1[W];
    spec_law_k6_p09(f.en.logits, W, p0);
    spec_law_k6_p09(f.en.logits + W, W, p1);
    const long n = 200000;
    long first[W] = {0}, next[W] = {0}, n_acc = 0;
    for (long i = 0; i < n; i++) {
        struct rng before = f.r.rng;
        draft_and_verify(&f);
        first[f.out[0]]++;
        if (f.n_out >= 2) {
            n_acc++;
            next[f.out[1]]++;
        }
        for (int j = 0; j < f.n_out; j++) rng_uniform(&before);
        CHECK(!memcmp(&before, &f.r.rng, sizeof before), "the generator winds on by %d", f.n_out);
    }
    int dof;
    double x = spec_chi2(first, p0, W, n, &dof);
    CHECK(dof >= 1 && dof < 12 && x < crit999[dof],
          "verify: first token vs row 0: chi2 %.2f dof %d", x, dof);
    printf("verify     first    chi2 %7.2f dof %2d (%ld verifications, %ld first drafts kept)\n", x,
           dof, n, n_acc);
    x = spec_chi2(next, p1, W, n_acc, &dof);
    CHECK(dof >= 1 && dof < 12 && x < crit999[dof],
          "verify: after a kept draft vs row 1: chi2 "
          "%.2f dof %d",
          x, dof);
    printf("verify     next     chi2 %7.2f dof %2d (%ld draws)\n", x, dof, n_acc);
    CHECK(n_acc > n / 10 && n_acc < n, "verify: %ld of %ld first drafts kept", n_acc, n);
    fake_free(&f);
}

int main(void)
{
    /* p on 0..7, q on 2..11, shapes unlike each other */
    const double p1[V] = {3, 1, 4, 1, 5, 9, 2, 6, 0, 0, 0, 0};
    const double q1[V] = {0, 0, 2, 7, 1, 8, 2, 8, 1, 8, 2, 8};
    run_case("overlap", p1, q1, -1);
    run_case("q = p", p1, p1, 1);
    const double q2[V] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4};
    run_case("disjoint", p1, q2, 0);
    /* q close to p but wider: most drafts kept, a residual on p's heavy tokens */
    const double q3[V] = {3, 1, 3, 1, 4, 7, 2, 5, 1, 1, 1, 1};
    run_case("wider", p1, q3, -1);
    test_verify();
    TEST_DONE();
}
