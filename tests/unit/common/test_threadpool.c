/*
 * The thread pool: every part of a job runs exactly once and has finished when tp_run
 * returns, over many back-to-back jobs whose parts see their own job's context; beside a part
 * that stalls (as on a descheduled thread), every other part still runs once.
 */
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "common/threadpool.h"
#include "common/util.h"
#include "test_util.h"

enum { NTH = 4, JOBS = 2000 };

struct job {
    int id;
    atomic_int runs[NTH];
    atomic_int wrong_job;
    int slow_part; /* -1: none */
};

static void part(void *ctx, int ith, int nth)
{
    struct job *j = ctx;
    if (nth != NTH) atomic_fetch_add(&j->wrong_job, 1);
    atomic_fetch_add(&j->runs[ith], 1);
    if (ith == j->slow_part) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

int main(void)
{
    struct threadpool *tp = tp_create(NTH);
    CHECK(tp_size(tp) == NTH, "pool of %d threads", tp_size(tp));
    static struct job jobs[JOBS];
    int bad = 0;
    for (int k = 0; k < JOBS; k++) {
        struct job *j = &jobs[k];
        memset(j, 0, sizeof *j);
        j->id = k;
        j->slow_part = -1;
        tp_run(tp, part, j);
        for (int i = 0; i < NTH; i++) bad += atomic_load(&j->runs[i]) != 1;
        bad += atomic_load(&j->wrong_job);
    }
    CHECK(bad == 0, "%d parts ran other than once over %d jobs", bad, JOBS);
    /* a slow part: the others all run once, and tp_run waits for it */
    struct job *j = &jobs[0];
    memset(j, 0, sizeof *j);
    j->slow_part = 2;
    double t0 = util_now();
    tp_run(tp, part, j);
    double t = util_now() - t0;
    for (int i = 0; i < NTH; i++)
        CHECK(atomic_load(&j->runs[i]) == 1, "part %d ran %d times beside a slow one", i,
              atomic_load(&j->runs[i]));
    CHECK(t >= 0.019, "tp_run returned before its slow part finished (%.4f s)", t);
    tp_destroy(tp);
    TEST_DONE();
}
