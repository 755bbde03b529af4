#include "http/choice.h"

#include <stdlib.h>
#include <string.h>

void http_choice_init(struct http_choice *c, const struct tok *t, int skip_special,
                      char *const *stop, int n_stop)
{
    memset(c, 0, sizeof *c);
    c->ts = t ? tok_stream_create(t, skip_special) : NULL; /* no tokenizer: no text */
    c->stop = stop;
    c->n_stop = n_stop;
    c->stop_index = -1;
}

void http_choice_dispose(struct http_choice *c)
{
    if (c->ts) tok_stream_destroy(c->ts);
    http_buf_dispose(&c->held);
    c->ts = NULL;
}

static const char *find(const char *h, size_t hn, const char *n, size_t nn)
{
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == n[0] && !memcmp(h + i, n, nn)) return h + i;
    return NULL;
}

/* Checks the held text for stop strings and releases what can no longer start one.
 * at_end: nothing more will come, release everything. Cost: O(held * stops), and held
 * stays shorter than the longest stop string between calls. */
static int release(struct http_choice *c, struct http_buf *out, int at_end)
{
    const char *h = c->held.p;
    size_t hn = c->held.len;
    const char *first = NULL;
    for (int k = 0; k < c->n_stop; k++) {
        const char *m = find(h, hn, c->stop[k], strlen(c->stop[k]));
        if (m && (!first || m < first)) first = m, c->stop_index = k;
    }
    if (first) {
        http_buf_append(out, h, (size_t)(first - h));
        c->held.len = 0;
        c->stopped = 1;
        return 1;
    }
    size_t keep = 0;
    if (!at_end)
        for (int k = 0; k < c->n_stop; k++) {
            size_t sl = strlen(c->stop[k]);
            for (size_t l = sl - 1 < hn ? sl - 1 : hn; l > keep; l--)
                if (!memcmp(h + hn - l, c->stop[k], l)) {
                    keep = l;
                    break;
                }
        }
    http_buf_append(out, h, hn - keep);
    memmove(c->held.p, h + hn - keep, keep);
    c->held.len = keep;
    return 0;
}

int http_choice_push(struct http_choice *c, int32_t id, struct http_buf *out)
{
    if (c->stopped || !c->ts) return 0;
    size_t len = 0;
    char *s = tok_stream_push_len(c->ts, id, &len);
    if (s) http_buf_append(&c->held, s, len);
    free(s);
    if (!c->held.len) return 0;
    return release(c, out, 0);
}

int http_choice_push_text(struct http_choice *c, const char *s, size_t n, struct http_buf *out)
{
    if (c->stopped || !c->ts) return 0;
    http_buf_append(&c->held, s, n);
    return c->held.len ? release(c, out, 0) : 0;
}

void http_choice_finish(struct http_choice *c, struct http_buf *out)
{
    if (c->stopped || !c->ts) return;
    size_t len = 0;
    char *s = tok_stream_finish_len(c->ts, &len);
    if (s) http_buf_append(&c->held, s, len);
    free(s);
    if (c->held.len) release(c, out, 1);
}
