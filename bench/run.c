/* The load generator: see run.h. */
#include "bench/run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

volatile int run_interrupted;

struct runner {
    struct hc *c;
    const struct run_cfg *cfg;
    const struct dataset *ds;
    struct req_result **res; /* one allocation each: in-flight requests point into them */
    int n_res, cap_res;
    struct breq **inflight; /* slots; NULL when free */
    int n_slots, running, finished, failed;
    double t0, t_last;
    long chunks;
};

static void on_finished(void *owner, struct breq *b)
{
    struct runner *R = owner;
    R->inflight[b->slot] = NULL;
    R->running--;
    R->finished++;
    if (!b->res->ok) R->failed++;
    double now = util_now();
    if (now > R->t_last) R->t_last = now;
    breq_dispose(b);
    free(b);
}

static void submit(struct runner *R, int idx)
{
    if (R->n_res == R->cap_res) {
        R->cap_res = R->cap_res ? R->cap_res * 2 : 256;
        R->res = xrealloc(R->res, sizeof *R->res * (size_t)R->cap_res);
    }
    struct req_result *res = xmalloc(sizeof *res);
    R->res[R->n_res++] = res;
    const struct prompt *p = &R->ds->p[idx % R->ds->n];
    int slot = 0;
    while (slot < R->n_slots && R->inflight[slot]) slot++;
    if (slot == R->n_slots) {
        int n = R->n_slots ? R->n_slots * 2 : 64;
        R->inflight = xrealloc(R->inflight, sizeof *R->inflight * (size_t)n);
        for (int i = R->n_slots; i < n; i++) R->inflight[i] = NULL;
        R->n_slots = n;
    }
    struct breq *b = xmalloc(sizeof *b);
    breq_init(b, res, R->t0, on_finished, R);
    res->input_len = p->input_len;
    res->max_tokens = p->output_len;
    b->slot = slot;
    b->chunk_counter = &R->chunks;
    R->inflight[slot] = b;
    R->running++;
    char *body = request_body(&R->cfg->req, p);
    b->t_send = util_now();
    res->start = b->t_send - R->t0;
    /* on_finished may run inside hc_submit (connection refused): then b is already freed */
    struct hc_req *h =
        hc_submit(R->c, "POST", R->cfg->path, body, strlen(body), &breq_callbacks, b);
    if (h) b->h = h;
    free(body);
}

static void progress(const struct runner *R, int total, int final)
{
    double el = util_now() - R->t0;
    char tot[32] = "";
    if (total > 0) snprintf(tot, sizeof tot, "/%d", total);
    fprintf(stderr, "\r\033[K%7.1f s  %d%s done  %d running  %d failed  %ld chunks  %.1f chunks/s",
            el, R->finished, tot, R->running, R->failed, R->chunks, el > 0 ? R->chunks / el : 0.0);
    if (final) fputc('\n', stderr);
    fflush(stderr);
}

/* The arrival of prompt idx in replay, s since the run started. */
static double arrival(const struct runner *R, int idx)
{
    return R->ds->p[idx % R->ds->n].arrival;
}

/* One loop over the given load; results in R->res. */
static void loop(struct runner *R, int num, double rate, int concurrency, int show, int base)
{
    const struct run_cfg *cfg = R->cfg;
    struct rng rng = {cfg->seed ^ 0x5851F42D4C957F2Dull};
    int replay = cfg->replay;
    if (replay) rate = 0;
    R->t0 = R->t_last = util_now();
    double next_arrival = R->t0 + (replay ? arrival(R, base) : 0), next_progress = R->t0;
    int issued = 0, cancelled_all = 0;
    for (;;) {
        double now = util_now();
        int stop = (num > 0 && issued >= num) ||
                   (cfg->duration > 0 && now - R->t0 >= cfg->duration) || run_interrupted;
        int burst = 0;
        while (!stop && (concurrency <= 0 || R->running < concurrency) &&
               ((rate <= 0 && !replay) || now >= next_arrival)) {
            submit(R, base + issued++);
            /* A request goes out only once its connection is up, which hc_poll sees: in a
             * burst of thousands of fresh connections, write the requests of those already
             * up every 64 opened, or the first ones wait for the whole burst to be opened
             * (seconds for 10,000 on a busy machine) and the server's request timeout (h2o:
             * 10 s from accept to a complete request) closes them unanswered. */
            if (++burst % 64 == 0) hc_poll(R->c, 0);
            if (replay) {
                next_arrival = R->t0 + arrival(R, base + issued);
            } else if (rate > 0) {
                double gap = cfg->constant_arrival
                                 ? 1.0 / rate
                                 : rng_gamma(&rng, cfg->burstiness, 1.0 / (rate * cfg->burstiness));
                next_arrival += gap;
            }
            stop =
                (num > 0 && issued >= num) || (cfg->duration > 0 && now - R->t0 >= cfg->duration);
        }
        if (run_interrupted && !cancelled_all) {
            cancelled_all = 1;
            for (int i = 0; i < R->n_slots; i++)
                if (R->inflight[i] && R->inflight[i]->h)
                    hc_cancel(R->c, R->inflight[i]->h, "interrupted");
        }
        if (stop && R->running == 0) break;
        for (int i = 0; i < R->n_slots; i++) {
            struct breq *b = R->inflight[i];
            if (b && b->h && now - b->t_send > cfg->timeout) hc_cancel(R->c, b->h, "timed out");
        }
        if (show && now >= next_progress) {
            progress(R, num, 0);
            next_progress = now + 0.25;
        }
        double wait = show ? next_progress - now : 0.5;
        if (!stop && (rate > 0 || replay) && (concurrency <= 0 || R->running < concurrency) &&
            next_arrival - now < wait)
            wait = next_arrival - now;
        if (cfg->duration > 0 && !stop && R->t0 + cfg->duration - now < wait)
            wait = R->t0 + cfg->duration - now;
        if (wait < 0) wait = 0;
        hc_poll(R->c, (int)ceil(wait * 1000));
    }
    if (show) progress(R, num, 1);
}

static void free_results(struct req_result **r, int n)
{
    for (int i = 0; i < n; i++) {
        req_result_dispose(r[i]);
        free(r[i]);
    }
    free(r);
}

int run_bench(struct hc *c, const struct run_cfg *cfg, const struct dataset *ds,
              struct run_out *out, struct err *e)
{
    memset(out, 0, sizeof *out);
    if (!ds->n) return err_set(e, "no prompts to send");
    if (cfg->num_prompts <= 0 && cfg->duration <= 0)
        return err_set(e, "give --num-prompts or --duration");
    struct runner R = {.c = c, .cfg = cfg, .ds = ds};
    if (cfg->warmup > 0) {
        int conc =
            cfg->concurrency > 0 && cfg->concurrency < cfg->warmup ? cfg->concurrency : cfg->warmup;
        struct run_cfg w = *cfg;
        w.duration = 0;
        w.replay = 0;
        R.cfg = &w;
        loop(&R, cfg->warmup, 0, conc, 0, cfg->warmup_base);
        int failed = R.failed;
        char first[300] = "";
        for (int i = 0; i < R.n_res && !first[0]; i++)
            if (!R.res[i]->ok) snprintf(first, sizeof first, "%s", R.res[i]->error);
        free_results(R.res, R.n_res);
        free(R.inflight);
        memset(&R, 0, sizeof R);
        R.c = c;
        R.ds = ds;
        if (failed == cfg->warmup && !run_interrupted)
            return err_set(e, "every warm-up request failed: %s", first);
    }
    R.cfg = cfg;
    loop(&R, cfg->num_prompts, cfg->rate, cfg->concurrency, cfg->progress, cfg->first_index);
    out->r = xcalloc((size_t)(R.n_res ? R.n_res : 1), sizeof *out->r);
    int k = 0;
    for (int i = 0; i < R.n_res; i++) {
        /* requests cut off by ^C are not failures of the server: leave them out */
        if (R.res[i]->error && !strcmp(R.res[i]->error, "interrupted"))
            req_result_dispose(R.res[i]);
        else
            out->r[k++] = *R.res[i]; /* the record moves; its heap parts go with it */
        free(R.res[i]);
    }
    free(R.res);
    out->n = k;
    out->duration = R.t_last - R.t0;
    out->interrupted = run_interrupted;
    free(R.inflight);
    return 0;
}

void run_out_free(struct run_out *o)
{
    for (int i = 0; i < o->n; i++) req_result_dispose(&o->r[i]);
    free(o->r);
    memset(o, 0, sizeof *o);
}
