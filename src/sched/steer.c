/*
 * Output steering that depends on the tokens generated so far:
 *
 * - a lazy grammar: free output until a trigger text appears (a tool call's start tag),
 *   then the grammar constrains the rest, the trigger's bytes being the first it reads.
 *   The output's last bytes (as the grammar vocabulary reads its tokens) are kept in a
 *   window as long as the trigger, so finding it costs O(trigger + token bytes) a token.
 *   A start tag that is a special token reads as GRAM_TAG_MARK + its text (grammar.h); a
 *   trigger written so switches the grammar on exactly when that token is chosen.
 * - a thinking budget: the tokens after the thinking start are counted until the end of
 *   thinking appears; at the budget the end-of-thinking tokens are forced, one a step.
 *   Start and end are matched as token-id sequences (a tag the model writes as other
 *   tokens is not seen; for the models whose tags are single special tokens it is exact).
 *
 * Both read each token on the host when it is chosen, so a request with a steer samples on
 * the host and never runs in an overlapped step (step.c).
 */
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "sched/engine_impl.h"

enum { THINK_WAIT, THINK_IN, THINK_DONE };

struct steer {
    /* lazy grammar */
    struct gram *lazy; /* the grammar until its trigger appears (a reference) */
    char *trigger;
    size_t trigger_len;
    char *win; /* the output's last bytes: [trigger_len - 1 + longest token] at most */
    size_t win_len, win_cap;
    /* thinking budget */
    int budget, think, counted, forced;
    int32_t *start, *end;
    int n_start, n_end;
    int start_seen, end_seen; /* ids of start / end matched so far */
};

static int32_t *copy_ids(const int32_t *ids, int n)
{
    if (!n) return NULL;
    int32_t *c = xmalloc(sizeof *c * (size_t)n);
    memcpy(c, ids, sizeof *c * (size_t)n);
    return c;
}

struct steer *steer_create(struct sampling_params *sp)
{
    int lazy = sp->grammar && sp->grammar_trigger && sp->grammar_trigger[0];
    int think = sp->think_budget > 0 && sp->n_think_end > 0;
    struct steer *s = NULL;
    if (lazy || think) s = xcalloc(1, sizeof *s);
    if (lazy) {
        s->lazy = gram_ref(sp->grammar); /* submit's own reference, as for a matcher */
        sp->grammar = NULL;
        s->trigger = xstrdup(sp->grammar_trigger);
        s->trigger_len = strlen(s->trigger);
    }
    if (think) {
        s->budget = sp->think_budget;
        s->start = copy_ids(sp->think_start, sp->n_think_start);
        s->end = copy_ids(sp->think_end, sp->n_think_end);
        s->n_start = sp->n_think_start;
        s->n_end = sp->n_think_end;
        s->think = s->n_start ? THINK_WAIT : THINK_IN;
    }
    sp->grammar_trigger = NULL;
    sp->think_start = sp->think_end = NULL;
    sp->n_think_start = sp->n_think_end = 0;
    return s;
}

void steer_destroy(struct steer *s)
{
    if (!s) return;
    gram_unref(s->lazy);
    free(s->trigger);
    free(s->win);
    free(s->start);
    free(s->end);
    free(s);
}

int32_t steer_pick(struct request *r, int32_t t)
{
    struct steer *s = r->steer;
    if (s->think == THINK_IN && s->forced < s->n_end && s->counted >= s->budget)
        return s->end[s->forced++];
    return t;
}

/* Advances a match of seq[0..n) by t: the length matched after it. */
static int match(const int32_t *seq, int n, int seen, int32_t t)
{
    if (seen < n && seq[seen] == t) return seen + 1;
    return seq[0] == t ? 1 : 0;
}

static void think_accept(struct steer *s, int32_t t)
{
    if (s->think == THINK_WAIT) {
        s->start_seen = match(s->start, s->n_start, s->start_seen, t);
        if (s->start_seen == s->n_start) s->think = THINK_IN;
        return;
    }
    if (s->think != THINK_IN) return;
    s->end_seen = match(s->end, s->n_end, s->end_seen, t);
    if (s->end_seen == s->n_end || s->forced == s->n_end) {
        s->think = THINK_DONE;
        return;
    }
    if (!s->forced) s->counted++;
}

/* Looks for the trigger in the window after token t's bytes joined it; switches the
 * grammar on there. */
static void lazy_accept(struct engine *en, struct request *r, int32_t t)
{
    struct steer *s = r->steer;
    size_t len = 0;
    const char *b = gram_vocab_token(en->gvocab, t, &len);
    if (!b || !len) return;
    if (s->win_len + len > s->win_cap) {
        s->win_cap = (s->win_len + len) * 2;
        s->win = xrealloc(s->win, s->win_cap);
    }
    memcpy(s->win + s->win_len, b, len);
    s->win_len += len;
    for (size_t i = 0; i + s->trigger_len <= s->win_len; i++) {
        if (memcmp(s->win + i, s->trigger, s->trigger_len)) continue;
        r->gm = gram_matcher_create(s->lazy); /* takes a reference of its own */
        gram_unref(s->lazy);
        s->lazy = NULL;
        /* a model that wrote the tag and then something the grammar refuses goes on
         * unconstrained rather than being stuck */
        if (!gram_matcher_accept_bytes(r->gm, s->win + i, s->win_len - i)) {
            gram_matcher_destroy(r->gm);
            r->gm = NULL;
        }
        return;
    }
    size_t keep = s->trigger_len - 1 < s->win_len ? s->trigger_len - 1 : s->win_len;
    memmove(s->win, s->win + s->win_len - keep, keep);
    s->win_len = keep;
}

void steer_accept(struct engine *en, struct request *r, int32_t t)
{
    struct steer *s = r->steer;
    if (s->budget) think_accept(s, t);
    if (s->lazy && !r->gm && en->gvocab) lazy_accept(en, r, t);
}
