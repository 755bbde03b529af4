/*
 * What h2o's http2_internal.h needs of klib's khash.h, which the packaged h2o headers
 * include but do not ship. conns.c reads a connection's state and write buffer through that
 * header to send GOAWAY; it never looks into the stream table, so the table is declared
 * with the same layout and the lookup only so that the header's inline helper compiles
 * (it is never called).
 */
#ifndef PAGODA_HTTP_KHASH_H
#define PAGODA_HTTP_KHASH_H

#include <stdint.h>

typedef uint32_t khint_t;
typedef khint_t khiter_t;

#define khash_t(name) kh_##name##_t
#define KHASH_MAP_INIT_INT64(name, khval_t)                                                        \
    typedef struct kh_##name##_s {                                                                 \
        khint_t n_buckets, size, n_occupied, upper_bound;                                          \
        uint32_t *flags;                                                                           \
        uint64_t *keys;                                                                            \
        khval_t *vals;                                                                             \
    } kh_##name##_t;
#define kh_get(name, h, k) ((void)(k), (h)->n_buckets)
#define kh_end(h)          ((h)->n_buckets)
#define kh_val(h, x)       ((h)->vals[x])

#endif
