/* Server-Sent Events parser: see sse.h. Cost: each input byte is copied once into the line
 * buffer and data bytes once more into the event buffer. */
#include "bench/sse.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void sse_init(struct sse_parser *p, sse_event_fn on_event, void *ctx)
{
    memset(p, 0, sizeof *p);
    p->on_event = on_event;
    p->ctx = ctx;
}

void sse_dispose(struct sse_parser *p)
{
    free(p->line);
    free(p->data);
    memset(p, 0, sizeof *p);
}

static void grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    *buf = xrealloc(*buf, c);
    *cap = c;
}

/* Handles one complete line (without its terminator). Returns the callback's stop value. */
static int process_line(struct sse_parser *p)
{
    const char *l = p->line;
    size_t n = p->line_len;
    if (n == 0) {
        int rc = 0;
        if (p->has_data) {
            /* drop the LF after the last data line */
            if (p->data_len) p->data_len--;
            grow(&p->data, &p->data_cap, p->data_len + 1);
            p->data[p->data_len] = 0;
            p->events++;
            rc = p->on_event(p->ctx, p->event[0] ? p->event : "message", p->data, p->data_len);
        }
        p->data_len = 0;
        p->has_data = 0;
        p->event[0] = 0;
        return rc;
    }
    if (l[0] == ':') {
        p->comments++;
        return 0;
    }
    const char *colon = memchr(l, ':', n);
    size_t flen = colon ? (size_t)(colon - l) : n;
    const char *v = colon ? colon + 1 : l + n;
    size_t vlen = colon ? n - flen - 1 : 0;
    if (vlen && v[0] == ' ') {
        v++;
        vlen--;
    }
    if (flen == 4 && !memcmp(l, "data", 4)) {
        grow(&p->data, &p->data_cap, p->data_len + vlen + 2);
        memcpy(p->data + p->data_len, v, vlen);
        p->data_len += vlen;
        p->data[p->data_len++] = '\n';
        p->has_data = 1;
    } else if (flen == 5 && !memcmp(l, "event", 5)) {
        size_t k = vlen < sizeof p->event - 1 ? vlen : sizeof p->event - 1;
        memcpy(p->event, v, k);
        p->event[k] = 0;
    }
    /* id, retry and unknown fields are ignored, as the standard says */
    return 0;
}

int sse_feed(struct sse_parser *p, const char *buf, size_t n)
{
    static const unsigned char bom[3] = {0xEF, 0xBB, 0xBF};
    size_t i = 0;
    while (p->bom_state < 3 && i < n) {
        if ((unsigned char)buf[i] == bom[p->bom_state]) {
            p->bom_state++;
            i++;
            continue;
        }
        /* not a BOM after all: the bytes matched so far belong to the first line */
        if (p->bom_state) {
            grow(&p->line, &p->line_cap, p->line_len + (size_t)p->bom_state);
            memcpy(p->line + p->line_len, bom, (size_t)p->bom_state);
            p->line_len += (size_t)p->bom_state;
        }
        p->bom_state = 3;
    }
    while (i < n) {
        char c = buf[i];
        if (p->after_cr) {
            p->after_cr = 0;
            if (c == '\n') {
                i++;
                continue;
            }
        }
        if (c == '\r' || c == '\n') {
            p->after_cr = c == '\r';
            i++;
            int rc = process_line(p);
            p->line_len = 0;
            if (rc) return rc;
            continue;
        }
        /* copy the run of ordinary bytes up to the next line end at once */
        size_t j = i;
        while (j < n && buf[j] != '\r' && buf[j] != '\n') j++;
        if (p->line_len + (j - i) > SSE_MAX_LINE) return -1;
        grow(&p->line, &p->line_cap, p->line_len + (j - i));
        memcpy(p->line + p->line_len, buf + i, j - i);
        p->line_len += j - i;
        i = j;
    }
    return 0;
}

int sse_pending(const struct sse_parser *p)
{
    return p->line_len > 0 || p->has_data;
}
