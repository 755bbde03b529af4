/*
 * convert_config: DST/config.json from the source's text. Its top-level members are copied
 * byte for byte (so 8.0 stays 8.0 and key order and indentation stay), except the
 * quantization entries, which are dropped and, for a quantized target, written again at the
 * end in the file's own indentation:
 *
 *   "quantization": {"group_size": 64, "bits": 4, ["mode": "mxfp4",]
 *                    "model.layers.0.mlp.gate": {"group_size": 64, "bits": 8}, ...}
 *
 * and the same object as "quantization_config" (both are read in the wild).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/convert.h"
#include "common/util.h"

/* One top-level member: the whitespace before it, the key (quotes included), the value. */
struct member {
    const char *lead, *key, *kend, *val, *vend;
};

static const char *skip_ws(const char *s, const char *end)
{
    while (s < end && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')) s++;
    return s;
}

static const char *skip_string(const char *s, const char *end)
{
    for (s++; s < end; s++) {
        if (*s == '\\')
            s++;
        else if (*s == '"')
            return s + 1;
    }
    return NULL;
}

static const char *skip_value(const char *s, const char *end)
{
    if (s >= end) return NULL;
    if (*s == '"') return skip_string(s, end);
    if (*s == '{' || *s == '[') {
        int depth = 0;
        while (s < end) {
            if (*s == '"') {
                if (!(s = skip_string(s, end))) return NULL;
                continue;
            }
            if (*s == '{' || *s == '[') depth++;
            if ((*s == '}' || *s == ']') && --depth == 0) return s + 1;
            s++;
        }
        return NULL;
    }
    while (s < end && !strchr(",}] \t\r\n", *s)) s++;
    return s;
}

static int key_is(const struct member *m, const char *k)
{
    size_t n = strlen(k);
    return (size_t)(m->kend - m->key) == n + 2 && !memcmp(m->key + 1, k, n);
}

/* Layout of the appended members: a newline and `unit` per depth, or nothing (minified). */
struct layout {
    const char *unit;
    int unit_len, newlines;
    const char *colon; /* between key and value, as the file spells it */
    int colon_len;
};

static void line(FILE *f, const struct layout *l, int depth)
{
    if (!l->newlines) return;
    fputc('\n', f);
    for (int i = 0; i < depth; i++) fwrite(l->unit, 1, (size_t)l->unit_len, f);
}

static void key(FILE *f, const struct layout *l, const char *k)
{
    fputc('"', f);
    for (const char *c = k; *c; c++) {
        if (*c == '"' || *c == '\\') fputc('\\', f);
        if ((unsigned char)*c < 0x20)
            fprintf(f, "\\u%04x", (unsigned char)*c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
    fwrite(l->colon, 1, (size_t)l->colon_len, f);
}

static const char *mode_name(enum wfmt f)
{
    return f == WFMT_MXFP4 ? "mxfp4" : f == WFMT_MXFP8 ? "mxfp8" : f == WFMT_NVFP4 ? "nvfp4" : NULL;
}

/* {"group_size": G, "bits": B[, "mode": M]} at `depth`, with the plan's per-module entries
 * when p is given. */
static void spec(FILE *f, const struct layout *l, int depth, const struct quant_target *q,
                 const struct cv_plan *p)
{
    fputc('{', f);
    line(f, l, depth + 1);
    key(f, l, "group_size");
    fprintf(f, "%d,", q->group);
    line(f, l, depth + 1);
    key(f, l, "bits");
    fprintf(f, "%d", q->bits);
    const char *mode = mode_name(q->fmt);
    if (mode) {
        fputc(',', f);
        line(f, l, depth + 1);
        key(f, l, "mode");
        fprintf(f, "\"%s\"", mode);
    }
    for (int i = 0; p && i < p->n_ov; i++) {
        fputc(',', f);
        line(f, l, depth + 1);
        key(f, l, p->ov[i].module);
        spec(f, l, depth + 1, &p->ov[i].q, NULL);
    }
    line(f, l, depth);
    fputc('}', f);
}

int cv_config_write(const struct cv_options *o, const struct cv_plan *p, const char *src,
                    size_t len, const char *path, struct err *e)
{
    const char *end = src + len, *s = skip_ws(src, end);
    if (s >= end || *s != '{') return err_set(e, "config.json: not a JSON object");
    const char *open = s + 1;
    struct member *mem = NULL;
    int n = 0;
    s = open;
    for (;;) {
        const char *lead = s;
        s = skip_ws(s, end);
        if (s < end && *s == '}') break;
        mem = xrealloc(mem, (size_t)(n + 1) * sizeof *mem);
        struct member *m = &mem[n++];
        m->lead = lead;
        m->key = s;
        m->kend = s < end && *s == '"' ? skip_string(s, end) : NULL;
        s = m->kend ? skip_ws(m->kend, end) : end;
        m->val = s < end && *s == ':' ? skip_ws(s + 1, end) : end;
        if (!(m->vend = skip_value(m->val, end))) {
            free(mem);
            return err_set(e, "config.json: cannot read its top-level members");
        }
        s = skip_ws(m->vend, end);
        if (s < end && *s == ',') s++;
    }
    const char *tail = n ? mem[n - 1].vend : open; /* whitespace, the closing brace, ... */

    struct layout l = {"", 0, 0, ": ", 2};
    if (n) {
        const struct member *last = &mem[n - 1];
        const char *nl = NULL;
        for (const char *c = last->lead; c < last->key; c++)
            if (*c == '\n') nl = c;
        if (nl) {
            l.newlines = 1;
            l.unit = nl + 1;
            l.unit_len = (int)(last->key - nl - 1);
        }
        l.colon = mem[0].kend;
        l.colon_len = (int)(mem[0].val - mem[0].kend);
    }

    FILE *f = fopen(path, "wb");
    if (!f) {
        free(mem);
        return err_set(e, "%s: %s", path, strerror(errno));
    }
    fwrite(src, 1, (size_t)(open - src), f);
    int written = 0;
    const char *dtype = o->fdt == ST_F16 ? "\"float16\"" : "\"bfloat16\"";
    for (int i = 0; i < n; i++) {
        const struct member *m = &mem[i];
        if (key_is(m, "quantization") || key_is(m, "quantization_config")) continue;
        if (written++) fputc(',', f);
        fwrite(m->lead, 1, (size_t)(m->val - m->lead), f);
        if (!o->quantized && (key_is(m, "torch_dtype") || key_is(m, "dtype")) && *m->val == '"')
            fputs(dtype, f);
        else
            fwrite(m->val, 1, (size_t)(m->vend - m->val), f);
    }
    if (o->quantized) {
        static const char *const names[2] = {"quantization", "quantization_config"};
        for (int i = 0; i < 2; i++) {
            if (written++) fputc(',', f);
            line(f, &l, 1);
            key(f, &l, names[i]);
            spec(f, &l, 1, &o->q, p);
        }
    }
    fwrite(tail, 1, (size_t)(end - tail), f);
    free(mem);
    if (fclose(f) != 0) return err_set(e, "%s: write failed: %s", path, strerror(errno));
    return 0;
}
