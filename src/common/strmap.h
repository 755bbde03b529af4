/*
 * strmap: an open-addressing hash map from NUL-terminated strings to int32 values.
 * Keys are copied into the map. Lookups cost one hash (XXH3) and a short probe; the
 * table stays at most half full, so probes stay short.
 */
#ifndef PAGODA_COMMON_STRMAP_H
#define PAGODA_COMMON_STRMAP_H

#include <stddef.h>
#include <stdint.h>

struct strmap {
    char **keys;     /* cap entries; NULL = empty */
    uint32_t *klens; /* key lengths */
    int32_t *vals;
    size_t cap, len;
};

void strmap_init(struct strmap *m);
void strmap_dispose(struct strmap *m);

/** Sets key -> val (replacing an existing value). Key bytes [k, k+n) need no NUL. */
void strmap_put(struct strmap *m, const char *k, size_t n, int32_t val);

/** Returns 1 and fills *val when the key is present, else 0. */
int strmap_get(const struct strmap *m, const char *k, size_t n, int32_t *val);

#endif
