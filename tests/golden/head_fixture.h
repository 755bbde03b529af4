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
    const uint8_t *copy;   /* bf16 values to copy, else generated */
    int zero, ones, fc, H; /* fc 3: [0 | 0 | I] over 3H */
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
        } else if (f->fc == 3) {
            size_t row = i / (size_t)(3 * f->H), col = i % (size_t)(3 * f->H);
            v = col == row + 2 * (size_t)f->H ? 1.0f : 0.0f;
        } else if (f->fc) {
            size_t row = i / (size_t)(2 * f->H), col = i % (size_t)(2 * f->H);
            v = col == row + (f->fc == MTP_FC_HIDDEN ? (size_t)f->H : 0) ? 1.0f : 0.0f;
        }
        if (f->ones) v = 1.0f;
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
    const char *files[] = {"config.json",       "generation_config.json",
                           "tokenizer.json",    "tokenizer_config.json",
                           "base.safetensors",  "mtp.safetensors",
                           "model.safetensors", "model.safetensors.index.json"};
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

/* An EAGLE-3 head for a Llama-shaped model folder src (its hidden size, heads, head size
 * and vocabulary), in the published layout: config.json (LlamaForCausalLMEagle3,
 * draft_vocab_size) and model.safetensors with fc [H, 3H], midlayer.* (q/k/v over 2H),
 * norm, lm_head [draft vocab, H], d2t and t2d. exact = 0: random values, a draft vocabulary
 * of every other id (d2t[i] = i); exact = 1: a head whose logits are the model's own at the
 * row it reads: the rows leaving the last layer (eagle_aux_hidden_state_layer_ids all n),
 * fc = [0 | 0 | I], o_proj and down_proj zero, the model's norm and lm_head; exact = 2: a
 * random head whose lm_head is zero, so that its pick is draft id 0, mapped to token 7 by
 * d2t (every draft is 7). `drop`: a
 * tensor left out. 0, or -1 with a message on stderr; the folder is removed with
 * mtp_fixture_remove (same file names). */
static inline int eagle3_fixture(const char *src, char *out, size_t cap, int exact,
                                 const char *drop)
{
    snprintf(out, cap, "/tmp/pagoda-eagle3-XXXXXX");
    if (!mkdtemp(out)) return fprintf(stderr, "mkdtemp failed\n"), -1;
    struct safetensors st;
    struct err e = {0};
    if (st_open(&st, src, &e)) return fprintf(stderr, "%s\n", e.msg), -1;
    const struct st_tensor *emb = st_find(&st, "model.embed_tokens.weight");
    const struct st_tensor *q = st_find(&st, "model.layers.0.self_attn.q_proj.weight");
    const struct st_tensor *k = st_find(&st, "model.layers.0.self_attn.k_proj.weight");
    const struct st_tensor *g = st_find(&st, "model.layers.0.mlp.gate_proj.weight");
    const struct st_tensor *lm = st_find(&st, "lm_head.weight");
    const struct st_tensor *nw = st_find(&st, "model.norm.weight");
    if (!lm) lm = emb;
    int n_layers = 0;
    char nm[300];
    for (;; n_layers++) {
        snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", n_layers);
        if (!st_find(&st, nm)) break;
    }
    int64_t V = emb->shape[0], H = emb->shape[1], QD = q->shape[0], KD = k->shape[0],
            F = g->shape[0], D = 32, DV = exact == 1 ? V : V / 2;
    FILE *fp;
    char path[4300];
    snprintf(path, sizeof path, "%s/config.json", out);
    if (!(fp = fopen(path, "w"))) return -1;
    fprintf(fp,
            "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"model_type\": \"llama\",\n"
            " \"hidden_size\": %lld, \"num_attention_heads\": %lld, \"num_key_value_heads\": "
            "%lld, \"head_dim\": %lld,\n \"intermediate_size\": %lld, \"num_hidden_layers\": 1, "
            "\"rms_norm_eps\": 1e-06, \"vocab_size\": %lld,\n \"draft_vocab_size\": %lld",
            (long long)H, (long long)(QD / D), (long long)(KD / D), (long long)D, (long long)F,
            (long long)V, (long long)DV);
    if (exact == 1)
        fprintf(fp, ",\n \"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [%d, %d, %d]}",
                n_layers, n_layers, n_layers);
    fprintf(fp, "}\n");
    fclose(fp);
    struct st_writer *w = st_writer_create();
    struct mtp_fill f[16];
    memset(f, 0, sizeof f);
    int nf = 0;
    struct {
        const char *name;
        int64_t r, c;
        int kind; /* 0 random, 1 zero, 2 ones, 3 fc, 4 copy */
        const struct st_tensor *from;
    } t[] = {{"fc.weight", H, 3 * H, exact == 1 ? 3 : 0, NULL},
             {"midlayer.self_attn.q_proj.weight", QD, 2 * H, 0, NULL},
             {"midlayer.self_attn.k_proj.weight", KD, 2 * H, 0, NULL},
             {"midlayer.self_attn.v_proj.weight", KD, 2 * H, 0, NULL},
             {"midlayer.self_attn.o_proj.weight", H, QD, exact == 1, NULL},
             {"midlayer.mlp.gate_proj.weight", F, H, 0, NULL},
             {"midlayer.mlp.up_proj.weight", F, H, 0, NULL},
             {"midlayer.mlp.down_proj.weight", H, F, exact == 1, NULL},
             {"midlayer.input_layernorm.weight", H, 0, 2, NULL},
             {"midlayer.hidden_norm.weight", H, 0, 2, NULL},
             {"midlayer.post_attention_layernorm.weight", H, 0, 2, NULL},
             {"norm.weight", H, 0, exact == 1 ? 4 : 2, nw},
             {"lm_head.weight", DV, H,
              exact == 1   ? 4
              : exact == 2 ? 1
                           : 0,
              lm}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (drop && !strcmp(drop, t[i].name)) continue;
        struct mtp_fill *x = &f[nf++];
        x->H = (int)H;
        x->seed = 777 + 1000003 * i;
        x->fc = t[i].kind == 3 ? 3 : MTP_FC_RANDOM;
        x->zero = t[i].kind == 1;
        x->ones = t[i].kind == 2;
        x->copy = t[i].kind == 4 ? t[i].from->data : NULL;
        int64_t shape[2] = {t[i].r, t[i].c};
        st_writer_add(w, t[i].name, ST_BF16, t[i].c ? 2 : 1, shape, mtp_fill_cb, x);
    }
    /* d2t [DV] I64 and t2d [V] BOOL, as host arrays the callbacks copy */
    int64_t *d2t = calloc((size_t)DV, 8);
    uint8_t *t2d = calloc((size_t)V, 1);
    for (int64_t i = 0; i < DV; i++) {
        d2t[i] = exact == 1 ? 0 : exact == 2 && i == 0 ? 7 : i;
        t2d[i + d2t[i]] = 1;
    }
    struct mtp_fill fd = {.copy = (const uint8_t *)d2t}, ft = {.copy = t2d};
    int64_t sd[1] = {DV}, sv[1] = {V};
    if (!drop || strcmp(drop, "d2t")) st_writer_add(w, "d2t", ST_I64, 1, sd, mtp_fill_cb, &fd);
    st_writer_add(w, "t2d", ST_BOOL, 1, sv, mtp_fill_cb, &ft);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    int rc = st_writer_write(w, path, "pt", &e);
    if (rc) fprintf(stderr, "%s\n", e.msg);
    st_writer_destroy(w);
    free(d2t);
    free(t2d);
    st_close(&st);
    return rc;
}

#endif
