#include "model/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

/* The header is JSON of at most this size (the format's own limit is 100 MB). */
#define ST_MAX_HEADER (100u << 20)

static const struct {
    const char *name;
    size_t size;
} dtypes[ST_DTYPE_COUNT] = {
    [ST_F32] = {"F32", 4},   [ST_F16] = {"F16", 2},         [ST_BF16] = {"BF16", 2},
    [ST_F64] = {"F64", 8},   [ST_I8] = {"I8", 1},           [ST_U8] = {"U8", 1},
    [ST_I16] = {"I16", 2},   [ST_U16] = {"U16", 2},         [ST_I32] = {"I32", 4},
    [ST_U32] = {"U32", 4},   [ST_I64] = {"I64", 8},         [ST_U64] = {"U64", 8},
    [ST_BOOL] = {"BOOL", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_F8_E5M2] = {"F8_E5M2", 1},
};

size_t st_dtype_size(enum st_dtype t)
{
    return dtypes[t].size;
}

const char *st_dtype_name(enum st_dtype t)
{
    return dtypes[t].name;
}

int64_t st_numel(const struct st_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

const char *st_shape_str(const int64_t *shape, int ndim, char *buf, size_t n)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, n - off, "[");
    for (int i = 0; i < ndim && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < n) snprintf(buf + off, n - off, "]");
    return buf;
}

static int parse_dtype(const char *s, enum st_dtype *out)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
        if (strcmp(s, dtypes[i].name) == 0) {
            *out = (enum st_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* Parses one header entry into t; data pointers are set relative to `data` of `avail` bytes. */
static int parse_entry(const cJSON *item, const char *file, const uint8_t *data, size_t avail,
                       struct st_tensor *t, struct err *e)
{
    const char *name = item->string;
    if (!cJSON_IsObject(item))
        return err_set(e, "%s: corrupt header: entry '%s' is not an object", file, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsArray(offs) ||
        cJSON_GetArraySize(offs) != 2)
        return err_set(e, "%s: corrupt header: tensor '%s' lacks dtype, shape or data_offsets",
                       file, name);
    if (parse_dtype(dt->valuestring, &t->dtype) != 0)
        return err_set(e, "%s: tensor '%s': unknown dtype '%s'", file, name, dt->valuestring);
    int nd = cJSON_GetArraySize(shape);
    if (nd > ST_MAX_DIMS)
        return err_set(e, "%s: tensor '%s': %d dimensions (at most %d supported)", file, name, nd,
                       ST_MAX_DIMS);
    t->ndim = nd;
    int64_t numel = 1;
    for (int i = 0; i < nd; i++) {
        const cJSON *d = cJSON_GetArrayItem(shape, i);
        if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 1e15)
            return err_set(e, "%s: corrupt header: tensor '%s' has a bad shape", file, name);
        t->shape[i] = (int64_t)d->valuedouble;
        numel *= t->shape[i];
        if (numel > (int64_t)1 << 50)
            return err_set(e, "%s: corrupt header: tensor '%s' is impossibly large", file, name);
    }
    const cJSON *o0 = cJSON_GetArrayItem(offs, 0), *o1 = cJSON_GetArrayItem(offs, 1);
    if (!cJSON_IsNumber(o0) || !cJSON_IsNumber(o1) || o0->valuedouble < 0 ||
        o1->valuedouble < o0->valuedouble)
        return err_set(e, "%s: corrupt header: tensor '%s' has bad data_offsets", file, name);
    size_t begin = (size_t)o0->valuedouble, end = (size_t)o1->valuedouble;
    size_t want = (size_t)numel * st_dtype_size(t->dtype);
    char sbuf[128];
    if (end - begin != want)
        return err_set(e,
                       "%s: tensor '%s': shape %s of %s needs %zu bytes but data_offsets span %zu",
                       file, name, st_shape_str(t->shape, nd, sbuf, sizeof sbuf), dt->valuestring,
                       want, end - begin);
    if (end > avail)
        return err_set(e,
                       "%s: truncated: tensor '%s' ends at byte %zu of the data section, which "
                       "holds only %zu bytes",
                       file, name, end, avail);
    t->data = data + begin;
    t->nbytes = want;
    t->name = xstrdup(name);
    return 0;
}

int st_open_file(struct safetensors *st, const char *path, struct err *e)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_set(e, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return err_set(e, "%s: %s", path, strerror(errno));
    }
    size_t size = (size_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return err_set(e, "%s: truncated: %zu bytes, too short for a safetensors header", base,
                       size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return err_set(e, "%s: mmap: %s", path, strerror(errno));

    const uint8_t *p = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | p[i];
    if (hlen > ST_MAX_HEADER || hlen > size - 8) {
        munmap(map, size);
        if (hlen > ST_MAX_HEADER)
            return err_set(e, "%s: corrupt header: header length %llu is not plausible", base,
                           (unsigned long long)hlen);
        return err_set(e, "%s: truncated: header of %llu bytes but the file has %zu", base,
                       (unsigned long long)hlen, size);
    }
    cJSON *root = cJSON_ParseWithLength((const char *)p + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        munmap(map, size);
        return err_set(e, "%s: corrupt header: not a JSON object", base);
    }

    struct st_file *f;
    st->files = xrealloc(st->files, (size_t)(st->nfiles + 1) * sizeof *st->files);
    f = &st->files[st->nfiles++];
    f->path = xstrdup(path);
    f->base = xstrdup(base);
    f->map = map;
    f->size = size;

    const uint8_t *data = p + 8 + hlen;
    size_t avail = size - 8 - (size_t)hlen;
    int rc = 0;
    for (const cJSON *it = root->child; it; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        if (strmap_get(&st->index, it->string, strlen(it->string), NULL)) {
            rc = err_set(e, "%s: tensor '%s' appears twice in the checkpoint", f->base, it->string);
            break;
        }
        struct st_tensor t = {0};
        if ((rc = parse_entry(it, f->base, data, avail, &t, e)) != 0) break;
        t.file = f->base;
        st->tensors = xrealloc(st->tensors, (size_t)(st->ntensors + 1) * sizeof t);
        st->tensors[st->ntensors] = t;
        strmap_put(&st->index, t.name, strlen(t.name), st->ntensors);
        st->ntensors++;
    }
    cJSON_Delete(root);
    return rc;
}

int st_open(struct safetensors *st, const char *dir, struct err *e)
{
    memset(st, 0, sizeof *st);
    strmap_init(&st->index);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    if (access(path, F_OK) != 0) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        if (access(path, F_OK) != 0)
            return err_set(e, "%s: no model.safetensors or model.safetensors.index.json", dir);
        return st_open_file(st, path, e);
    }
    size_t len;
    char *text = util_read_file(path, &len, e);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return err_set(e, "model.safetensors.index.json: corrupt: no weight_map object");
    }
    /* Open each distinct shard once, in the order the index first names it. */
    int rc = 0;
    struct strmap opened;
    strmap_init(&opened);
    for (const cJSON *it = map->child; it && rc == 0; it = it->next) {
        if (!cJSON_IsString(it)) {
            rc = err_set(e, "model.safetensors.index.json: tensor '%s' maps to a non-string",
                         it->string);
            break;
        }
        const char *shard = it->valuestring;
        if (strchr(shard, '/') || strcmp(shard, "..") == 0) {
            rc = err_set(e, "model.safetensors.index.json: shard name '%s' is not a file name",
                         shard);
            break;
        }
        if (strmap_get(&opened, shard, strlen(shard), NULL)) continue;
        strmap_put(&opened, shard, strlen(shard), 1);
        snprintf(path, sizeof path, "%s/%s", dir, shard);
        rc = st_open_file(st, path, e);
    }
    /* Every tensor the index names must be in its shard. */
    for (const cJSON *it = map->child; it && rc == 0; it = it->next) {
        const struct st_tensor *t = st_find(st, it->string);
        if (!t)
            rc = err_set(e, "%s: tensor '%s' named by model.safetensors.index.json is missing",
                         it->valuestring, it->string);
    }
    strmap_dispose(&opened);
    cJSON_Delete(root);
    return rc;
}

void st_close(struct safetensors *st)
{
    for (int i = 0; i < st->nfiles; i++) {
        munmap(st->files[i].map, st->files[i].size);
        free(st->files[i].path);
        free(st->files[i].base);
    }
    for (int i = 0; i < st->ntensors; i++) free(st->tensors[i].name);
    free(st->files);
    free(st->tensors);
    strmap_dispose(&st->index);
    memset(st, 0, sizeof *st);
}

int st_lock(struct safetensors *st, struct err *e)
{
    for (int i = 0; i < st->nfiles; i++)
        if (mlock(st->files[i].map, st->files[i].size) != 0)
            return err_set(e, "%s: mlock: %s", st->files[i].base, strerror(errno));
    return 0;
}

const struct st_tensor *st_find(const struct safetensors *st, const char *name)
{
    int32_t i;
    if (!strmap_get(&st->index, name, strlen(name), &i)) return NULL;
    return &st->tensors[i];
}
