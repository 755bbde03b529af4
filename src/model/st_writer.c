#include "model/st_writer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

struct st_entry {
    char *name;
    enum st_dtype dt;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t bytes;
    st_fill_fn fill;
    void *ctx;
};

struct st_writer {
    struct st_entry *e;
    int n;
};

struct st_writer *st_writer_create(void)
{
    return xcalloc(1, sizeof(struct st_writer));
}

void st_writer_add(struct st_writer *w, const char *name, enum st_dtype dt, int ndim,
                   const int64_t *shape, st_fill_fn fill, void *ctx)
{
    w->e = xrealloc(w->e, (size_t)(w->n + 1) * sizeof *w->e);
    struct st_entry *t = &w->e[w->n++];
    t->name = xstrdup(name);
    t->dt = dt;
    t->ndim = ndim;
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        numel *= (size_t)shape[i];
    }
    t->bytes = numel * st_dtype_size(dt);
    t->fill = fill;
    t->ctx = ctx;
}

int st_writer_write(struct st_writer *w, const char *path, const char *metadata_format,
                    struct err *e)
{
    cJSON *h = cJSON_CreateObject();
    if (metadata_format) {
        cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
        cJSON_AddStringToObject(meta, "format", metadata_format);
    }
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        struct st_entry *t = &w->e[i];
        cJSON *o = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(o, "dtype", st_dtype_name(t->dt));
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *of = cJSON_AddArrayToObject(o, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + t->bytes)));
        off += t->bytes;
    }
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hl = strlen(text), padded = (hl + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(text);
        return err_set(e, "%s: %s", path, strerror(errno));
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(text, 1, hl, f);
    for (size_t i = hl; i < padded; i++) fputc(' ', f);
    free(text);
    size_t cap = 8u << 20;
    uint8_t *buf = xmalloc(cap);
    for (int i = 0; i < w->n; i++) {
        struct st_entry *t = &w->e[i];
        for (size_t o = 0; o < t->bytes; o += cap) {
            size_t n = t->bytes - o < cap ? t->bytes - o : cap;
            t->fill(t->ctx, buf, o, n);
            fwrite(buf, 1, n, f);
        }
    }
    free(buf);
    if (fclose(f) != 0) return err_set(e, "%s: write failed: %s", path, strerror(errno));
    return 0;
}

void st_writer_destroy(struct st_writer *w)
{
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    free(w);
}
