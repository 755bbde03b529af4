#include "common/strmap.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/util.h"

void strmap_init(struct strmap *m)
{
    memset(m, 0, sizeof *m);
}

void strmap_dispose(struct strmap *m)
{
    for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
    free(m->keys);
    free(m->klens);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static size_t find_slot(const struct strmap *m, const char *k, size_t n)
{
    size_t mask = m->cap - 1;
    size_t i = (size_t)XXH3_64bits(k, n) & mask;
    while (m->keys[i] && !(m->klens[i] == n && memcmp(m->keys[i], k, n) == 0)) i = (i + 1) & mask;
    return i;
}

static void grow(struct strmap *m)
{
    struct strmap old = *m;
    m->cap = old.cap ? old.cap * 2 : 64;
    m->keys = xcalloc(m->cap, sizeof(char *));
    m->klens = xcalloc(m->cap, sizeof(uint32_t));
    m->vals = xcalloc(m->cap, sizeof(int32_t));
    for (size_t i = 0; i < old.cap; i++) {
        if (!old.keys[i]) continue;
        size_t j = find_slot(m, old.keys[i], old.klens[i]);
        m->keys[j] = old.keys[i];
        m->klens[j] = old.klens[i];
        m->vals[j] = old.vals[i];
    }
    free(old.keys);
    free(old.klens);
    free(old.vals);
}

void strmap_put(struct strmap *m, const char *k, size_t n, int32_t val)
{
    if ((m->len + 1) * 2 > m->cap) grow(m);
    size_t i = find_slot(m, k, n);
    if (!m->keys[i]) {
        char *c = xmalloc(n + 1);
        memcpy(c, k, n);
        c[n] = 0;
        m->keys[i] = c;
        m->klens[i] = (uint32_t)n;
        m->len++;
    }
    m->vals[i] = val;
}

int strmap_get(const struct strmap *m, const char *k, size_t n, int32_t *val)
{
    if (!m->cap) return 0;
    size_t i = find_slot(m, k, n);
    if (!m->keys[i]) return 0;
    if (val) *val = m->vals[i];
    return 1;
}
