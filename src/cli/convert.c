/*
 * `pagoda convert`: a checkpoint folder rewritten in another weight format.
 *
 *   pagoda convert --model SRC --out DST --format F [--group-size G] [--keep-8bit PATTERN]...
 *                  [--max-shard-size BYTES]
 *
 * Exit status: 0 done, 1 bad input (folder, tensors, config.json, I/O), 2 usage errors.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "cli/convert.h"
#include "common/threadpool.h"
#include "common/util.h"
#include "kernels/cpu/quant.h"
#include "model/st_writer.h"

static int usage(FILE *f)
{
    fprintf(f, "usage: pagoda convert --model SRC --out DST --format F [--group-size G]\n"
               "                      [--keep-8bit PATTERN]... [--max-shard-size BYTES]\n"
               "  --format F             bf16, f16 (Hugging Face layout), mlx2, mlx3, mlx4, mlx5,\n"
               "                         mlx6, mlx8 (MLX affine), mxfp4, mxfp8, nvfp4\n"
               "  --group-size G         values per scale: 32, 64 (default) or 128 for mlxN;\n"
               "                         mxfp4 / mxfp8 take 32, nvfp4 16\n"
               "  --keep-8bit PATTERN    modules at 8 bits (mlxN: affine, same group size;\n"
               "                         fp4 formats: mxfp8): whole dotted parts of the module\n"
               "                         path (mlp.gate) or a glob over it (*.mlp.gate)\n"
               "  --max-shard-size BYTES tensor bytes per file (default 5GiB), e.g. 2GB, 500MiB\n");
    return f == stdout ? 0 : 2;
}

/* The target of --format / --group-size into o; a message and -1 when it is not one. */
static int parse_format(const char *f, long group, struct cv_options *o)
{
    o->q8 = (struct quant_target){WFMT_MXFP8, 8, 32, ST_U8};
    o->quantized = 1;
    if (!strcmp(f, "bf16") || !strcmp(f, "f16")) {
        o->quantized = 0;
        o->fdt = f[0] == 'b' ? ST_BF16 : ST_F16;
        if (group) {
            fprintf(stderr, "pagoda convert: --group-size applies to quantized formats only\n");
            return -1;
        }
        return 0;
    }
    if (!strncmp(f, "mlx", 3) && strlen(f) == 4 && strchr("234568", f[3])) {
        if (!group) group = 64;
        if (group != 32 && group != 64 && group != 128) {
            fprintf(stderr, "pagoda convert: --group-size %ld: %s takes 32, 64 or 128\n", group, f);
            return -1;
        }
        o->q = (struct quant_target){WFMT_AFFINE, f[3] - '0', (int)group, ST_BF16};
        o->q8 = (struct quant_target){WFMT_AFFINE, 8, (int)group, ST_BF16};
        return 0;
    }
    static const struct {
        const char *name;
        struct quant_target q;
    } fp[] = {{"mxfp4", {WFMT_MXFP4, 4, 32, ST_U8}},
              {"mxfp8", {WFMT_MXFP8, 8, 32, ST_U8}},
              {"nvfp4", {WFMT_NVFP4, 4, 16, ST_U8}}};
    for (int i = 0; i < 3; i++)
        if (!strcmp(f, fp[i].name)) {
            if (group && group != fp[i].q.group) {
                fprintf(stderr, "pagoda convert: --group-size %ld: %s takes %d only\n", group, f,
                        fp[i].q.group);
                return -1;
            }
            o->q = fp[i].q;
            return 0;
        }
    fprintf(stderr,
            "pagoda convert: --format '%s' is not one of bf16, f16, mlx2, mlx3, mlx4, mlx5, "
            "mlx6, mlx8, mxfp4, mxfp8, nvfp4\n",
            f);
    return -1;
}

static float load_value(const void *p, enum st_dtype t, size_t i)
{
    return quant_load_scale(p, t, (int64_t)i);
}

static void store_value(void *p, enum st_dtype t, size_t i, float v)
{
    if (t == ST_BF16)
        ((uint16_t *)p)[i] = f32_to_bf16(v);
    else if (t == ST_F16)
        ((uint16_t *)p)[i] = f32_to_f16(v);
    else
        ((float *)p)[i] = v;
}

/* Row r of a row-made tensor into out (t->bytes / rows bytes); x scratch of k floats. */
static void make_row(const struct cv_tensor *t, int64_t r, uint8_t *out, float *x)
{
    const struct cv_matrix *m = t->m;
    quant_dequant_row(&m->parts[r / m->n], r % m->n, 0, m->k, x);
    switch (t->kind) {
    case CV_CODES:
        quant_quantize_row(&m->q, x, m->k, out, NULL, NULL);
        break;
    case CV_SCALES:
        quant_quantize_row(&m->q, x, m->k, NULL, out, NULL);
        break;
    case CV_BIASES:
        quant_quantize_row(&m->q, x, m->k, NULL, NULL, out);
        break;
    default:
        for (int64_t j = 0; j < m->k; j++) store_value(out, t->dt, (size_t)j, x[j]);
    }
}

static void progress(struct cv_run *r, int finished)
{
    double now = util_now();
    if (!r->tty || (!finished && now - r->last < 0.2)) return;
    r->last = now;
    fprintf(stderr, "\rpagoda convert: %d/%d tensors, %.1f/%.1f MB", r->done, r->n_tensors,
            (double)r->done_bytes / 1e6, (double)r->total_bytes / 1e6);
    fflush(stderr);
}

/* Whole rows [r0, r1) of a chunk that starts at byte off, split over the pool's threads. */
struct rows_job {
    const struct cv_tensor *t;
    uint8_t *buf;
    size_t off, rb;
    int64_t r0, r1;
};

static void rows_worker(void *ctx, int ith, int nth)
{
    const struct rows_job *j = ctx;
    long lo, hi;
    tp_range((long)(j->r1 - j->r0), ith, nth, 1, &lo, &hi);
    float *x = j->t->run->x + (size_t)ith * (size_t)(j->t->m->k + 1);
    for (int64_t r = j->r0 + lo; r < j->r0 + hi; r++)
        make_row(j->t, r, j->buf + ((size_t)r * j->rb - j->off), x);
}

void cv_fill(void *ctx, uint8_t *buf, size_t off, size_t n)
{
    struct cv_tensor *t = ctx;
    if (t->kind == CV_RAW) {
        memcpy(buf, (const uint8_t *)t->src->data + off, n);
    } else if (t->kind == CV_CAST) {
        /* st_writer's chunks are whole elements: 8 MiB apart, ending at the tensor's end */
        size_t sz = st_dtype_size(t->dt);
        for (size_t i = 0; i < n / sz; i++)
            store_value(buf, t->dt, i, load_value(t->src->data, t->src->dtype, off / sz + i));
    } else {
        int64_t rows = (int64_t)t->m->n_parts * t->m->n;
        size_t rb = t->bytes / (size_t)rows;
        /* rows wholly inside the chunk go straight to buf, in parallel; a row cut by the
         * chunk's edge is made in scratch and its part copied */
        struct rows_job j = {
            t, buf, off, rb, (int64_t)((off + rb - 1) / rb), (int64_t)((off + n) / rb)};
        if (j.r1 > j.r0) tp_run(t->run->tp, rows_worker, &j);
        for (int64_t r = (int64_t)(off / rb); r < rows && (size_t)r * rb < off + n; r++) {
            size_t a = (size_t)r * rb, b = a + rb;
            if (r >= j.r0 && r < j.r1) continue;
            make_row(t, r, t->run->row, t->run->x);
            size_t from = a > off ? a : off, to = b < off + n ? b : off + n;
            memcpy(buf + (from - off), t->run->row + (from - a), to - from);
        }
    }
    t->run->done_bytes += n;
    if (off + n == t->bytes) t->run->done++;
    progress(t->run, 0);
}

/* safetensors' own order inside a file: dtypes from the widest down, then names. */
static int dtype_rank(enum st_dtype t)
{
    static const enum st_dtype order[] = {ST_BOOL, ST_U8,  ST_I8,  ST_F8_E5M2, ST_F8_E4M3,
                                          ST_I16,  ST_U16, ST_F16, ST_BF16,    ST_I32,
                                          ST_U32,  ST_F32, ST_F64, ST_I64,     ST_U64};
    for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++)
        if (order[i] == t) return i;
    return 0;
}

static int cmp_layout(const void *a, const void *b)
{
    const struct cv_tensor *x = *(struct cv_tensor *const *)a, *y = *(struct cv_tensor *const *)b;
    int d = dtype_rank(y->dt) - dtype_rank(x->dt);
    return d ? d : strcmp(x->name, y->name);
}

/* Checks a written file's size against its header and data (a full disk shows here). */
static int check_size(const char *path, size_t data, struct err *e)
{
    FILE *f = fopen(path, "rb");
    uint8_t h[8] = {0};
    struct stat sb;
    int ok = f && fread(h, 1, 8, f) == 8 && stat(path, &sb) == 0;
    if (f) fclose(f);
    uint64_t hl = 0;
    for (int i = 0; i < 8; i++) hl |= (uint64_t)h[i] << (8 * i);
    if (!ok || (uint64_t)sb.st_size != 8 + hl + data)
        return err_set(e, "%s: short write (disk full?)", path);
    return 0;
}

static int write_shards(const struct cv_options *o, struct cv_plan *p, int n_shards, struct err *e)
{
    char path[PATH_MAX + 64];
    struct cv_tensor **list = xmalloc((size_t)p->n * sizeof *list);
    cJSON *idx = cJSON_CreateObject(), *wm = NULL;
    if (n_shards > 1) {
        size_t total = 0;
        for (int i = 0; i < p->n; i++) total += p->t[i].bytes;
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(idx, "metadata"), "total_size",
                                (double)total);
        wm = cJSON_AddObjectToObject(idx, "weight_map");
    }
    int rc = 0;
    for (int s = 0; s < n_shards && rc == 0; s++) {
        char file[64];
        if (n_shards == 1)
            snprintf(file, sizeof file, "model.safetensors");
        else
            snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        int n = 0;
        size_t data = 0;
        for (int i = 0; i < p->n; i++)
            if (p->t[i].shard == s) {
                list[n++] = &p->t[i];
                data += p->t[i].bytes;
                if (wm) cJSON_AddStringToObject(wm, p->t[i].name, file);
            }
        qsort(list, (size_t)n, sizeof *list, cmp_layout);
        struct st_writer *w = st_writer_create();
        for (int i = 0; i < n; i++)
            st_writer_add(w, list[i]->name, list[i]->dt, list[i]->ndim, list[i]->shape, cv_fill,
                          list[i]);
        snprintf(path, sizeof path, "%s/%s", o->dst, file);
        rc = st_writer_write(w, path, o->quantized ? "mlx" : "pt", e);
        if (rc == 0) rc = check_size(path, data, e);
        st_writer_destroy(w);
    }
    if (rc == 0 && wm) {
        char *text = cJSON_Print(idx);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", o->dst);
        FILE *f = fopen(path, "wb");
        if (!f || fputs(text, f) < 0 || fputc('\n', f) < 0)
            rc = err_set(e, "%s: cannot write", path);
        if (f && fclose(f) != 0 && rc == 0) rc = err_set(e, "%s: write failed", path);
        free(text);
    }
    cJSON_Delete(idx);
    free(list);
    return rc;
}

/* Weights of other formats are not copied; everything else of the folder's top level is. */
static int copied(const char *name)
{
    static const char *const skip[] = {".safetensors", ".bin", ".pt",   ".pth",     ".ckpt",
                                       ".gguf",        ".h5",  ".onnx", ".msgpack", ".npz"};
    if (name[0] == '.' || !strcmp(name, "config.json") ||
        !strcmp(name, "model.safetensors.index.json"))
        return 0;
    size_t n = strlen(name);
    for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++) {
        size_t k = strlen(skip[i]);
        if (n >= k && !strcmp(name + n - k, skip[i])) return 0;
    }
    return 1;
}

static int copy_files(const char *src, const char *dst, int *count, struct err *e)
{
    DIR *d = opendir(src);
    if (!d) return err_set(e, "%s: %s", src, strerror(errno));
    char a[PATH_MAX + 260], b[PATH_MAX + 260];
    uint8_t *buf = xmalloc(1 << 20);
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        struct stat sb;
        snprintf(a, sizeof a, "%s/%s", src, de->d_name);
        if (!copied(de->d_name) || stat(a, &sb) || !S_ISREG(sb.st_mode)) continue;
        snprintf(b, sizeof b, "%s/%s", dst, de->d_name);
        FILE *in = fopen(a, "rb"), *out = in ? fopen(b, "wb") : NULL;
        size_t got;
        while (out && (got = fread(buf, 1, 1 << 20, in)) > 0)
            if (fwrite(buf, 1, got, out) != got) break;
        if (!in || !out || ferror(in) || ferror(out))
            rc = err_set(e, "copying %s to %s failed", a, b);
        if (in) fclose(in);
        if (out && fclose(out) != 0 && rc == 0) rc = err_set(e, "%s: write failed", b);
        (*count)++;
    }
    closedir(d);
    free(buf);
    return rc;
}

/* Creates DST (and its parents); refuses the source folder itself and a folder that already
 * holds weights, which a loader would mix up with the new ones. */
static int prepare_out(const char *src, const char *dst, struct err *e)
{
    char path[PATH_MAX], a[PATH_MAX], b[PATH_MAX];
    snprintf(path, sizeof path, "%s", dst);
    for (char *c = path + 1;; c++) {
        if (*c != '/' && *c) continue;
        char keep = *c;
        *c = 0;
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return err_set(e, "%s: cannot create: %s", path, strerror(errno));
        if (!(*c = keep)) break;
    }
    if (realpath(src, a) && realpath(dst, b) && !strcmp(a, b))
        return err_set(e, "%s: --out must not be the source folder", dst);
    DIR *d = opendir(dst);
    if (!d) return err_set(e, "%s: %s", dst, strerror(errno));
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if ((n > 12 && !strcmp(de->d_name + n - 12, ".safetensors")) ||
            !strcmp(de->d_name, "model.safetensors.index.json"))
            rc = err_set(e, "%s already holds %s: choose an empty folder", dst, de->d_name);
    }
    closedir(d);
    return rc;
}

static int convert(const struct cv_options *o, struct err *e)
{
    char path[PATH_MAX + 64];
    struct stat sb;
    if (stat(o->src, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return err_set(e, "%s: %s", o->src, stat(o->src, &sb) ? strerror(errno) : "not a folder");
    snprintf(path, sizeof path, "%s/config.json", o->src);
    size_t len;
    char *text = util_read_file(path, &len, e);
    if (!text) return -1;
    cJSON *cfg = cJSON_ParseWithLength(text, len);
    struct safetensors st;
    struct cv_plan p = {0};
    int rc = -1;
    if (!cJSON_IsObject(cfg)) {
        err_set(e, "%s: not a JSON object", path);
        goto out;
    }
    if (st_open(&st, o->src, e)) {
        st_close(&st);
        goto out;
    }
    if (cv_plan_build(&p, o, &st, cfg, e) || prepare_out(o->src, o->dst, e)) goto close;

    struct cv_run run = {0};
    run.tp = tp_create(0);
    run.x = xmalloc(sizeof(float) * (size_t)(p.max_k + 1) * (size_t)tp_size(run.tp));
    run.row = xmalloc(4 * (size_t)p.max_k + 64);
    run.n_tensors = p.n;
    run.tty = isatty(2);
    run.t0 = util_now();
    int shard = 0;
    size_t in_shard = 0;
    for (int i = 0; i < p.n; i++) {
        p.t[i].run = &run;
        if (in_shard > 0 && in_shard + p.t[i].bytes > o->max_shard) {
            shard++;
            in_shard = 0;
        }
        p.t[i].shard = shard;
        in_shard += p.t[i].bytes;
        run.total_bytes += p.t[i].bytes;
    }
    int files = 0;
    snprintf(path, sizeof path, "%s/config.json", o->dst);
    rc = write_shards(o, &p, shard + 1, e);
    progress(&run, 1);
    if (run.tty) fputc('\n', stderr);
    if (rc == 0) rc = cv_config_write(o, &p, text, len, path, e);
    if (rc == 0) rc = copy_files(o->src, o->dst, &files, e);
    if (rc == 0)
        fprintf(stderr,
                "pagoda convert: %s: %d tensors, %.1f MB in %d file%s (%s), %d other "
                "file%s copied, %.1f s\n",
                o->dst, p.n, (double)run.total_bytes / 1e6, shard + 1, shard ? "s" : "", o->format,
                files, files == 1 ? "" : "s", util_now() - run.t0);
    free(run.x);
    free(run.row);
    tp_destroy(run.tp);
close:
    cv_plan_dispose(&p);
    st_close(&st);
out:
    cJSON_Delete(cfg);
    free(text);
    return rc;
}

int cli_convert(int argc, char **argv)
{
    struct cv_options o = {.max_shard = (size_t)5 << 30};
    long group = 0;
    const char **keep = xcalloc((size_t)argc, sizeof *keep);
    int rc = 2;
    static const char *const opts[] = {"--model",      "--out",       "--format",
                                       "--group-size", "--keep-8bit", "--max-shard-size"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            rc = usage(stdout);
            goto done;
        }
        int k = 0;
        while (k < 6 && strcmp(a, opts[k])) k++;
        if (k == 6) {
            fprintf(stderr, "pagoda convert: unknown option %s\n", a);
            usage(stderr);
            goto done;
        }
        if (!(v = arg_value(argc, argv, &i))) goto done;
        if (k == 0)
            o.src = v;
        else if (k == 1)
            o.dst = v;
        else if (k == 2)
            o.format = v;
        else if (k == 3 && arg_int(a, v, 1, 1 << 20, &group))
            goto done;
        else if (k == 4)
            keep[o.n_keep8++] = v;
        else if (k == 5 && arg_bytes(a, v, &o.max_shard))
            goto done;
    }
    if (!o.src || !o.dst || !o.format) {
        fprintf(stderr, "pagoda convert: --model, --out and --format are required\n");
        usage(stderr);
        goto done;
    }
    if (parse_format(o.format, group, &o)) goto done;
    if (o.n_keep8 && !o.quantized) {
        fprintf(stderr, "pagoda convert: --keep-8bit applies to quantized formats only\n");
        goto done;
    }
    o.keep8 = keep;
    quant_init();
    struct err e = {0};
    rc = convert(&o, &e) ? 1 : 0;
    if (rc) fprintf(stderr, "pagoda convert: %s\n", e.msg);
done:
    free(keep);
    return rc;
}
