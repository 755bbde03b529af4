/*
 * What the KV tier tests share (tests/unit/sched/test_tier_*engine.c, tests/cuda/test_cuda_tier.c):
 * a greedy request of TIER_OUT tokens whose events are collected. Include after test_util.h.
 */
#ifndef PAGODA_TESTS_TIER_UTIL_H
#define PAGODA_TESTS_TIER_UTIL_H

#include <stdint.h>

#include "sched/engine.h"

#define TIER_OUT 8

struct out {
    int32_t ids[TIER_OUT];
    int n, n_cached;
    enum finish_reason finish;
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct out *o = user;
    if (ev->kind == ENGINE_EV_TOKEN && o->n < TIER_OUT) o->ids[o->n++] = ev->token;
    o->n_cached = ev->n_cached;
    if (ev->finish != FINISH_NONE) o->finish = ev->finish;
}

/* Submits prompt p [n], greedy, TIER_OUT tokens ignoring the end of sequence, into o. */
static uint64_t submit(struct engine *en, const int32_t *p, int n, struct out *o)
{
    struct engine_request q = {.prompt = p, .n_prompt = n, .on_event = on_event, .user = o};
    sampling_params_default(&q.sp);
    q.sp.temperature = 0;
    q.sp.max_tokens = TIER_OUT;
    q.sp.ignore_eos = 1;
    struct err e = {0};
    uint64_t id = engine_submit(en, &q, &e);
    CHECK(id, "submit: %s", e.msg);
    return id;
}

#endif
