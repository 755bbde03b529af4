/*
 * Steering through the engine with a random-weight model (llama-tiny), greedy so that
 * runs compare token for token: a lazy grammar leaves the output free until its trigger
 * and then constrains it (the run matches the free one up to the trigger, then ends as the
 * grammar says); a thinking budget forces the end-of-thinking ids after exactly N counted
 * tokens, counted from the start of the output or from a start sequence.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched/engine.h"
#include "test_util.h"

#define MAX_OUT 64

struct out {
    int32_t ids[MAX_OUT];
    int n;
    enum finish_reason finish;
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct out *o = user;
    if (ev->kind == ENGINE_EV_TOKEN && o->n < MAX_OUT) o->ids[o->n++] = ev->token;
    if (ev->finish != FINISH_NONE) o->finish = ev->finish;
}

static int32_t prompt[] = {1, 300, 301, 302, 303};

static void run(struct engine *en, struct sampling_params *sp, struct out *o)
{
    struct err e = {0};
    memset(o, 0, sizeof *o);
    sp->temperature = 0;
    struct engine_request q = {
        .prompt = prompt, .n_prompt = 5, .sp = *sp, .on_event = on_event, .user = o};
    CHECK(engine_submit(en, &q, &e) > 0, "submit: %s", e.msg);
    for (int guard = 0; engine_step(en) > 0 && guard < 10000; guard++) {
    }
}

static void test_lazy(struct engine *en)
{
    struct err e = {0};
    const struct gram_vocab *v = engine_grammar_vocab(en, &e);
    CHECK(v, "%s", e.msg);
    struct sampling_params sp;
    sampling_params_default(&sp);
    sp.max_tokens = 24;
    sp.ignore_eos = 1;
    struct out free_run;
    run(en, &sp, &free_run);
    CHECK(free_run.n == 24, "free run: %d tokens", free_run.n);
    /* the trigger: the bytes of the first output token from index 2 on whose text has not
     * been seen before it (so that its first occurrence is there) */
    char seen[1024] = "", trigger[64] = "";
    size_t seen_len = 0;
    int k = -1;
    for (int i = 0; i < free_run.n && k < 0; i++) {
        size_t len = 0;
        const char *b = gram_vocab_token(v, free_run.ids[i], &len);
        if (i >= 2 && b && len >= 2 && len < sizeof trigger) {
            memcpy(trigger, b, len);
            trigger[len] = 0;
            if (!strstr(seen, trigger)) k = i;
        }
        if (b && seen_len + len < sizeof seen) memcpy(seen + seen_len, b, len), seen_len += len;
        seen[seen_len] = 0;
    }
    CHECK(k >= 0, "no usable trigger in the free run");
    if (k < 0) return;
    char choice[96];
    snprintf(choice, sizeof choice, "%s123", trigger);
    const char *ch[] = {choice};
    size_t chl[] = {strlen(choice)};
    sp.grammar = gram_from_choices(ch, chl, 1, &e);
    sp.grammar_trigger = trigger;
    sp.ignore_eos = 0;
    struct out lazy;
    run(en, &sp, &lazy);
    /* regression (lazy_grammar_reference): the request took the caller's reference instead
     * of its own, and the grammar was freed under the caller when the request ended */
    struct gram_matcher *m = gram_matcher_create(sp.grammar);
    CHECK(gram_matcher_accept_bytes(m, choice, strlen(choice)), "the caller's grammar");
    gram_matcher_destroy(m);
    gram_unref(sp.grammar);
    /* the same tokens through the trigger, then the grammar's "123" and the end */
    CHECK(lazy.finish == FINISH_STOP, "lazy: finish %s", finish_reason_name(lazy.finish));
    CHECK(lazy.n > k, "lazy: %d tokens, trigger at %d", lazy.n, k);
    for (int i = 0; i <= k && i < lazy.n; i++)
        CHECK(lazy.ids[i] == free_run.ids[i], "token %d: %d, free run %d", i, lazy.ids[i],
              free_run.ids[i]);
    char tail[64] = "";
    size_t tl = 0;
    for (int i = k + 1; i < lazy.n; i++) {
        size_t len = 0;
        const char *b = gram_vocab_token(v, lazy.ids[i], &len);
        if (b && tl + len < sizeof tail) memcpy(tail + tl, b, len), tl += len;
    }
    tail[tl] = 0;
    CHECK(!strcmp(tail, "123"), "after the trigger: '%s'", tail);
}

static void test_budget(struct engine *en)
{
    struct sampling_params sp;
    sampling_params_default(&sp);
    sp.max_tokens = 12;
    sp.ignore_eos = 1;
    struct out free_run, b;
    run(en, &sp, &free_run);
    int32_t end[2] = {500, 501};
    sp.think_budget = 5;
    sp.think_end = end;
    sp.n_think_end = 2;
    run(en, &sp, &b);
    CHECK(b.n == 12, "%d tokens", b.n);
    for (int i = 0; i < 5; i++) CHECK(b.ids[i] == free_run.ids[i], "token %d differs", i);
    CHECK(b.ids[5] == 500 && b.ids[6] == 501, "forced: %d %d", b.ids[5], b.ids[6]);
    /* counted from a start sequence: the free run's token 1 */
    int32_t start[1] = {free_run.ids[1]};
    sp.think_start = start;
    sp.n_think_start = 1;
    run(en, &sp, &b);
    for (int i = 0; i < 7; i++) CHECK(b.ids[i] == free_run.ids[i], "token %d differs", i);
    CHECK(b.ids[7] == 500 && b.ids[8] == 501, "forced after the start: %d %d", b.ids[7], b.ids[8]);
}

int main(int argc, char **argv)
{
    const char *testdata = argc > 1 ? argv[1] : "../shared/testdata";
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", testdata);
    struct engine_config cfg = {.model_dir = dir, .manual = 1, .threads = 2, .max_num_seqs = 4};
    struct err e = {0};
    struct engine *en = engine_create(&cfg, &e);
    CHECK(en, "engine_create: %s", e.msg);
    if (!en) TEST_DONE();
    test_lazy(en);
    test_budget(en);
    engine_destroy(en);
    TEST_DONE();
}
