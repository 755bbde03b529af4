/*
 * Test checkpoints with a multi-token-prediction module: a reference model's folder (linked,
 * its weights as a shard named by an index) plus mtp.safetensors holding mtp.* in the
 * layout Qwen3.5 checkpoints ship: fc [H, 2H], pre_fc_norm_embedding/hidden, norm, and
 * layers.0.* with the shapes of the model's last full-attention layer (its values copied,
 * so the MoE layout follows the model's). Which fc, and whether the layer adds nothing
 * (o_proj and every down_proj zero), is the caller's choice: the numeric checks build heads
 * whose output is known exactly.
 */
#ifndef PAGODA_TESTS_GOLDEN_HEAD_FIXTURE_H
#define PAGODA_TESTS_GOLDEN_HEAD_FIXTURE_H

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "model/safetensors.h"
#include "model/st_writer.h"

enum mtp_fc {
    MTP_FC_RANDOM, /* uniform in +-1/sqrt(H), a fixed seed */
    MTP_FC_EMBED,  /* [I | 0]: the normed embedding only */
    MTP_FC_HIDDEN  /* [0 | I]: the normed hidden state only */
};

struct mtp_fill {
    const uint8_t *copy; /* bf16 values to copy, else generated */
    int zero, fc, H;
    uint64_t seed;
};

static inline uint16_t mtp_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

static inline void mtp_fill_cb(void *ctx, uint8_t *buf, size_t off, size_t n)
{
    const struct mtp_fill *f = ctx;
    if (f->copy) {
        memcpy(buf, f->copy + off, n);
        return;
    }
    for (size_t b = 0; b < n; b += 2) {
        size_t i = (off + b) / 2;
        float v = 0;
        if (f->fc == MTP_FC_RANDOM) {
            uint64_t x = (f->seed + i) * 0x9E3779B97F4A7C15ull;
            x ^= x >> 29;
            x *= 0xBF58476D1CE4E5B9ull;
            x ^= x >> 32;
            v = ((float)(x & 0xffffff) / 16777216.0f * 2 - 1) / sqrtf((float)f->H);
        } else if (f->fc) {
            size_t row = i / (size_t)(2 * f->H), col = i % (size_t)(2 * f->H);
            v = col == row + (f->fc == MTP_FC_HIDDEN ? (size_t)f->H : 0) ? 1.0f : 0.0f;
        }
        uint16_t h = f->zero ? 0 : mtp_bf16(v);
        memcpy(buf + b, &h, 2);
    }
}

static const char *const mtp_links[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json"};

/* Removes a folder mtp_fixture made. */
static inline void mtp_fixture_remove(const char *dir)
{
    char p[4300];
    const char *files[] = {"config.json",
                           "generation_config.json",
                           "tokenizer.json",
                           "tokenizer_config.json",
                           "base.safetensors",
                           "mtp.safetensors",
                           "model.safetensors.index.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* Makes a temporary folder (its path into out[cap]) with src's model and an MTP module;
 * `drop`, when not NULL, is a tensor of it left out. 0, or -1 with a message on stderr. */
static inline int mtp_fixture(const char *src, char *out, size_t cap, enum mtp_fc fc, int identity,
                              const char *drop)
{
    snprintf(out, cap, "/tmp/pagoda-mtp-XXXXXX");
    if (!mkdtemp(out)) return fprintf(stderr, "mkdtemp failed\n"), -1;
    char a[4300], b[4300];
    for (size_t i = 0; i < sizeof mtp_links / sizeof mtp_links[0]; i++) {
        snprintf(a, sizeof a, "%s/%s", src, mtp_links[i]);
        snprintf(b, sizeof b, "%s/%s", out, mtp_links[i]);
        if (access(a, F_OK) == 0 && symlink(a, b)) return fprintf(stderr, "symlink %s\n", b), -1;
    }
    snprintf(a, sizeof a, "%s/model.safetensors", src);
    snprintf(b, sizeof b, "%s/base.safetensors", out);
    if (symlink(a, b)) return fprintf(stderr, "symlink %s\n", b), -1;
    struct safetensors st;
    struct err e = {0};
    if (st_open(&st, src, &e)) return fprintf(stderr, "%s\n", e.msg), -1;
    /* the last layer with full attention, and the hidden size */
    int last = -1, H = 0;
    for (int i = 0; i < st.ntensors; i++) {
        int l;
        if (sscanf(st.tensors[i].name, "model.layers.%d.self_attn.q_proj", &l) == 1 && l > last)
            last = l;
        if (!strcmp(st.tensors[i].name, "model.norm.weight")) H = (int)st.tensors[i].shape[0];
    }
    cJSON *idx = cJSON_CreateObject(), *map = cJSON_AddObjectToObject(idx, "weight_map");
    cJSON_AddObjectToObject(idx, "metadata");
    for (int i = 0; i < st.ntensors; i++)
        cJSON_AddStringToObject(map, st.tensors[i].name, "base.safetensors");
    struct st_writer *w = st_writer_create();
    struct mtp_fill *fills = calloc((size_t)st.ntensors + 8, sizeof *fills);
    int nf = 0;
    char pre[64], name[300];
    snprintf(pre, sizeof pre, "model.layers.%d.", last);
    for (int i = 0; i < st.ntensors; i++) {
        const struct st_tensor *t = &st.tensors[i];
        if (strncmp(t->name, pre, strlen(pre)) || t->dtype != ST_BF16) continue;
        snprintf(name, sizeof name, "mtp.layers.0.%s", t->name + strlen(pre));
        if (drop && !strcmp(name, drop)) continue;
        struct mtp_fill *f = &fills[nf++];
        f->copy = t->data;
        if (identity && (strstr(name, "o_proj.") || strstr(name, "down_proj.")))
            f->copy = NULL, f->zero = 1;
        if (strstr(name, "layernorm.")) f->copy = NULL, f->zero = 1; /* (1 + 0) */
        st_writer_add(w, name, ST_BF16, t->ndim, t->shape, mtp_fill_cb, f);
        cJSON_AddStringToObject(map, name, "mtp.safetensors");
    }
    static const char *const norms[] = {"mtp.pre_fc_norm_embedding.weight",
                                        "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"};
    int64_t hs[1] = {H}, fs[2] = {H, 2 * (int64_t)H};
    for (int i = 0; i < 4; i++) {
        const char *n = i < 3 ? norms[i] : "mtp.fc.weight";
        if (drop && !strcmp(n, drop)) continue;
        struct mtp_fill *f = &fills[nf++];
        f->H = H;
        f->zero = i < 3;
        f->fc = i < 3 ? 0 : (int)fc;
        f->seed = 12345;
        if (i == 3 && fc == MTP_FC_RANDOM) f->fc = MTP_FC_RANDOM;
        st_writer_add(w, n, ST_BF16, i < 3 ? 1 : 2, i < 3 ? hs : fs, mtp_fill_cb, f);
        cJSON_AddStringToObject(map, n, "mtp.safetensors");
    }
    snprintf(b, sizeof b, "%s/mtp.safetensors", out);
    int rc = st_writer_write(w, b, "pt", &e);
    if (rc) fprintf(stderr, "%s\n", e.msg);
    st_writer_destroy(w);
    free(fills);
    st_close(&st);
    char *text = cJSON_Print(idx);
    cJSON_Delete(idx);
    snprintf(b, sizeof b, "%s/model.safetensors.index.json", out);
    FILE *fp = fopen(b, "w");
    if (!fp || fputs(text, fp) < 0) rc = -1;
    if (fp) fclose(fp);
    free(text);
    return rc || last < 0 || H <= 0 ? -1 : 0;
}

#endif
