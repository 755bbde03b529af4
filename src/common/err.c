#include "common/err.h"

#include <stdio.h>
#include <string.h>

int err_set(struct err *e, const char *fmt, ...)
{
    if (!e) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

int err_wrap(struct err *e, const char *fmt, ...)
{
    if (!e) return -1;
    char prefix[512];
    va_list ap;
    va_start(ap, fmt);
    int pl = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (pl < 0) return -1;
    size_t n = (size_t)pl < sizeof prefix ? (size_t)pl : sizeof prefix - 1;
    size_t old = strnlen(e->msg, sizeof e->msg - 1);
    if (n + 2 + old >= sizeof e->msg) old = sizeof e->msg - 1 - n - 2;
    memmove(e->msg + n + 2, e->msg, old);
    memcpy(e->msg, prefix, n);
    e->msg[n] = ':';
    e->msg[n + 1] = ' ';
    e->msg[n + 2 + old] = 0;
    return -1;
}
