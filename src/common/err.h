/*
 * err: the error record of operations that can fail for reasons a user can act on
 * (I/O, parse, bad model folder). The callee fills it with one line naming the file
 * and the problem; the caller prints or forwards it.
 *
 *     struct err e = {0};
 *     if (model_load(dir, &m, &e) != 0) fprintf(stderr, "pagoda: %s\n", e.msg);
 */
#ifndef PAGODA_COMMON_ERR_H
#define PAGODA_COMMON_ERR_H

#include <stdarg.h>

struct err {
    char msg[1024];
};

/** Formats the message into `e` (when non-NULL) and returns -1, for `return err_set(...)`. */
int err_set(struct err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Prefixes the existing message with more context ("loading X: <old message>"). Returns -1. */
int err_wrap(struct err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
