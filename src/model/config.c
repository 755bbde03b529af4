#include "model/config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/arch.h"

const char *config_rope_type_name(enum rope_type t)
{
    static const char *names[] = {"default", "linear", "dynamic", "yarn", "llama3", "proportional"};
    return names[t];
}

const cJSON *config_get(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNull(v) ? NULL : v;
}

/* Reads an integer field; missing -> def. A present field of the wrong type is an error. */
int config_get_int(const cJSON *o, const char *k, int def, int *out, struct err *e)
{
    const cJSON *v = config_get(o, k);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > 1e9)
        return err_set(e, "config.json: '%s' must be a non-negative integer", k);
    *out = (int)v->valuedouble;
    return 0;
}

int config_get_num(const cJSON *o, const char *k, double def, double *out, struct err *e)
{
    const cJSON *v = config_get(o, k);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v)) return err_set(e, "config.json: '%s' must be a number", k);
    *out = v->valuedouble;
    return 0;
}

bool config_get_bool(const cJSON *o, const char *k, bool def)
{
    const cJSON *v = config_get(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

/* Parses one rope parameter set: `p` holds rope_type/type, factor, ...; theta from p or root. */
static int parse_rope(const cJSON *p, double theta_def, int max_pos, struct rope_params *r,
                      struct err *e)
{
    memset(r, 0, sizeof *r);
    r->theta = theta_def;
    r->factor = 1;
    r->orig_max_pos = max_pos;
    r->low_freq_factor = 1;
    r->high_freq_factor = 4;
    r->beta_fast = 32;
    r->beta_slow = 1;
    r->truncate = true;
    r->partial = 1;
    if (!p) return 0;
    if (!cJSON_IsObject(p)) return err_set(e, "config.json: rope parameters must be an object");
    const cJSON *t = config_get(p, "rope_type");
    if (!t) t = config_get(p, "type");
    const char *ty = cJSON_IsString(t) ? t->valuestring : "default";
    if (!strcmp(ty, "default"))
        r->type = ROPE_DEFAULT;
    else if (!strcmp(ty, "linear"))
        r->type = ROPE_LINEAR;
    else if (!strcmp(ty, "dynamic"))
        r->type = ROPE_DYNAMIC;
    else if (!strcmp(ty, "yarn"))
        r->type = ROPE_YARN;
    else if (!strcmp(ty, "llama3"))
        r->type = ROPE_LLAMA3;
    else if (!strcmp(ty, "proportional"))
        r->type = ROPE_PROPORTIONAL;
    else
        return err_set(e, "config.json: rope type '%s' is not supported", ty);
    if (config_get_num(p, "rope_theta", theta_def, &r->theta, e) ||
        config_get_num(p, "factor", 1, &r->factor, e) ||
        config_get_int(p, "original_max_position_embeddings", max_pos, &r->orig_max_pos, e) ||
        config_get_num(p, "low_freq_factor", 1, &r->low_freq_factor, e) ||
        config_get_num(p, "high_freq_factor", 4, &r->high_freq_factor, e) ||
        config_get_num(p, "beta_fast", 32, &r->beta_fast, e) ||
        config_get_num(p, "beta_slow", 1, &r->beta_slow, e) ||
        config_get_num(p, "attention_factor", 0, &r->attention_factor, e) ||
        config_get_num(p, "mscale", 0, &r->mscale, e) ||
        config_get_num(p, "mscale_all_dim", 0, &r->mscale_all_dim, e) ||
        config_get_num(p, "partial_rotary_factor", 1, &r->partial, e))
        return -1;
    if (r->partial <= 0 || r->partial > 1)
        return err_set(e, "config.json: partial_rotary_factor must be in (0, 1]");
    r->truncate = config_get_bool(p, "truncate", true);
    if (r->theta <= 0) return err_set(e, "config.json: rope_theta must be positive");
    if (r->type != ROPE_DEFAULT && r->factor <= 0)
        return err_set(e, "config.json: rope factor must be positive");
    return 0;
}

static int parse_quant_spec(const cJSON *q, struct quant_spec def, struct quant_spec *out,
                            const char *where, struct err *e)
{
    *out = def;
    if (cJSON_IsFalse(q)) {
        out->mode = QMODE_NONE;
        return 0;
    }
    if (!cJSON_IsObject(q))
        return err_set(e, "config.json: quantization '%s' must be an object", where);
    const cJSON *mode = config_get(q, "mode");
    if (mode) {
        if (!cJSON_IsString(mode))
            return err_set(e, "config.json: quantization mode must be a string");
        if (!strcmp(mode->valuestring, "affine"))
            out->mode = QMODE_AFFINE;
        else if (!strcmp(mode->valuestring, "mxfp4"))
            out->mode = QMODE_MXFP4;
        else if (!strcmp(mode->valuestring, "mxfp8"))
            out->mode = QMODE_MXFP8;
        else if (!strcmp(mode->valuestring, "nvfp4"))
            out->mode = QMODE_NVFP4;
        else
            return err_set(e, "config.json: quantization mode '%s' is not supported",
                           mode->valuestring);
    } else if (out->mode == QMODE_NONE) {
        out->mode = QMODE_AFFINE;
    }
    if (config_get_int(q, "bits", out->bits, &out->bits, e) ||
        config_get_int(q, "group_size", out->group, &out->group, e))
        return -1;
    int ok;
    switch (out->mode) {
    case QMODE_AFFINE:
        ok = (out->bits >= 2 && out->bits <= 8 && out->bits != 7) &&
             (out->group == 32 || out->group == 64 || out->group == 128);
        break;
    case QMODE_MXFP4:
        ok = out->bits == 4 && out->group == 32;
        break;
    case QMODE_MXFP8:
        ok = out->bits == 8 && out->group == 32;
        break;
    case QMODE_NVFP4:
        ok = out->bits == 4 && out->group == 16;
        break;
    default:
        ok = 1;
    }
    if (!ok)
        return err_set(e,
                       "config.json: quantization '%s': %d bits at group size %d is not supported",
                       where, out->bits, out->group);
    return 0;
}

static int parse_quant(struct model_config *c, const cJSON *root, struct err *e)
{
    const cJSON *q = config_get(root, "quantization");
    if (!q) q = config_get(root, "quantization_config");
    /* BitNet's quantization is its family's (c->bitnet), not a weight format of this table */
    const cJSON *qm = cJSON_IsObject(q) ? config_get(q, "quant_method") : NULL;
    if (cJSON_IsString(qm) && !strcmp(qm->valuestring, "bitnet")) q = NULL;
    c->quant.mode = QMODE_NONE;
    if (!q) return 0;
    struct quant_spec none = {QMODE_NONE, 4, 64};
    if (parse_quant_spec(q, none, &c->quant, "quantization", e)) return -1;
    for (const cJSON *it = q->child; it; it = it->next) {
        if (!cJSON_IsObject(it) && !cJSON_IsFalse(it)) continue;
        struct quant_override ov;
        if (parse_quant_spec(it, c->quant, &ov.spec, it->string, e)) return -1;
        ov.prefix = xstrdup(it->string);
        c->quant_overrides =
            xrealloc(c->quant_overrides, (size_t)(c->n_quant_overrides + 1) * sizeof ov);
        c->quant_overrides[c->n_quant_overrides++] = ov;
    }
    return 0;
}

struct quant_spec config_quant_for(const struct model_config *c, const char *prefix)
{
    for (int i = 0; i < c->n_quant_overrides; i++)
        if (!strcmp(c->quant_overrides[i].prefix, prefix)) return c->quant_overrides[i].spec;
    return c->quant;
}

static int parse_eos(struct model_config *c, const cJSON *v)
{
    if (cJSON_IsNumber(v)) {
        c->n_eos = 1;
        c->eos_ids[0] = (int32_t)v->valuedouble;
        return 1;
    }
    if (cJSON_IsArray(v)) {
        c->n_eos = 0;
        for (const cJSON *it = v->child; it && c->n_eos < CONFIG_MAX_EOS; it = it->next)
            if (cJSON_IsNumber(it)) c->eos_ids[c->n_eos++] = (int32_t)it->valuedouble;
        return 1;
    }
    return 0;
}

static int parse_layer_kinds(struct model_config *c, const cJSON *root, struct err *e)
{
    c->layer_kinds = xcalloc((size_t)c->n_layers, sizeof *c->layer_kinds);
    const cJSON *lt = config_get(root, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->n_layers)
            return err_set(e, "config.json: layer_types must list %d layer types", c->n_layers);
        int i = 0;
        for (const cJSON *it = lt->child; it; it = it->next, i++) {
            if (!cJSON_IsString(it))
                return err_set(e, "config.json: layer_types[%d] is not a string", i);
            if (!strcmp(it->valuestring, "full_attention"))
                c->layer_kinds[i] = LAYER_FULL;
            else if (!strcmp(it->valuestring, "sliding_attention"))
                c->layer_kinds[i] = LAYER_SLIDING;
            else if (!strcmp(it->valuestring, "linear_attention"))
                c->layer_kinds[i] = LAYER_LINEAR;
            else
                return err_set(e, "config.json: layer type '%s' is not supported", it->valuestring);
        }
        c->layer_types_given = true;
    }
    return 0;
}

static int parse_ropes(struct model_config *c, const cJSON *root, struct err *e)
{
    double theta = 10000;
    if (config_get_num(root, "rope_theta", 10000, &theta, e)) return -1;
    const cJSON *rp = config_get(root, "rope_parameters");
    if (rp && cJSON_IsObject(rp) &&
        (config_get(rp, "full_attention") || config_get(rp, "sliding_attention"))) {
        const cJSON *full = config_get(rp, "full_attention"),
                    *sl = config_get(rp, "sliding_attention");
        if (parse_rope(full, theta, c->max_pos, &c->rope_full, e)) return -1;
        return parse_rope(sl ? sl : full, theta, c->max_pos, &c->rope_sliding, e);
    }
    const cJSON *rs = rp ? rp : config_get(root, "rope_scaling");
    if (parse_rope(rs, theta, c->max_pos, &c->rope_full, e)) return -1;
    c->rope_sliding = c->rope_full;
    /* Older Gemma 3 configs: local layers use rope_local_base_freq, unscaled. */
    double local = 0;
    if (config_get_num(root, "rope_local_base_freq", 0, &local, e)) return -1;
    if (local > 0) {
        parse_rope(NULL, local, c->max_pos, &c->rope_sliding, e);
    }
    return 0;
}

int config_load(struct model_config *c, const char *dir, struct err *e)
{
    memset(c, 0, sizeof *c);
    c->bos_id = -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    size_t len;
    char *text = util_read_file(path, &len, e);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len), *top = root;
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_set(e, "%s: not a JSON object", path);
    }
    int rc = -1;
    const cJSON *ar = config_get(root, "architectures");
    const char *an = cJSON_IsArray(ar) && cJSON_IsString(ar->child) ? ar->child->valuestring : NULL;
    if (!an) {
        err_set(e, "config.json: no 'architectures' entry");
        goto out;
    }
    snprintf(c->arch_name, sizeof c->arch_name, "%s", an);
    c->arch = arch_find(an);
    if (!c->arch) {
        char names[512];
        arch_list(names, sizeof names);
        err_set(e, "config.json: architecture '%s' is not supported (supported: %s)", an, names);
        goto out;
    }
    /* A multimodal checkpoint (...ForConditionalGeneration) keeps the text tower's fields in
     * text_config; quantization and the token ids may sit at the top level. */
    const cJSON *tc = config_get(root, "text_config");
    if (cJSON_IsObject(tc)) root = (cJSON *)tc;

    if (config_get_int(root, "hidden_size", 0, &c->hidden, e) ||
        config_get_int(root, "num_hidden_layers", 0, &c->n_layers, e) ||
        config_get_int(root, "num_attention_heads", 0, &c->n_heads, e) ||
        config_get_int(root, "num_key_value_heads", c->n_heads, &c->n_kv_heads, e) ||
        config_get_int(root, "intermediate_size", 0, &c->ffn, e) ||
        config_get_int(root, "vocab_size", 0, &c->vocab, e) ||
        config_get_int(root, "max_position_embeddings", 4096, &c->max_pos, e) ||
        config_get_int(root, "sliding_window", 0, &c->sliding_window, e))
        goto out;
    if (!c->hidden || !c->n_layers || !c->n_heads || !c->ffn || !c->vocab || !c->n_kv_heads) {
        err_set(e, "config.json: hidden_size, num_hidden_layers, num_attention_heads, "
                   "intermediate_size and vocab_size must all be positive");
        goto out;
    }
    if (c->n_heads % c->n_kv_heads) {
        err_set(e,
                "config.json: num_attention_heads (%d) is not a multiple of "
                "num_key_value_heads (%d)",
                c->n_heads, c->n_kv_heads);
        goto out;
    }
    if (config_get_int(root, "head_dim", c->hidden / c->n_heads, &c->head_dim, e)) goto out;
    if (c->head_dim <= 0 || c->head_dim % 2 || c->head_dim > 512) {
        err_set(e, "config.json: head_dim %d is not supported (even, at most 512)", c->head_dim);
        goto out;
    }
    double eps;
    if (config_get_num(root, "rms_norm_eps", 1e-6, &eps, e)) goto out;
    c->rms_eps = (float)eps;

    const cJSON *act = config_get(root, "hidden_activation");
    if (!act) act = config_get(root, "hidden_act");
    const char *an2 = cJSON_IsString(act) ? act->valuestring : "silu";
    if (!strcmp(an2, "silu") || !strcmp(an2, "swish"))
        c->act = ACT_SILU;
    else if (!strcmp(an2, "gelu_pytorch_tanh") || !strcmp(an2, "gelu_new") ||
             !strcmp(an2, "gelu_fast"))
        c->act = ACT_GELU_TANH;
    else if (!strcmp(an2, "relu2"))
        c->act = ACT_RELU2;
    else {
        err_set(e, "config.json: activation '%s' is not supported", an2);
        goto out;
    }

    if (parse_ropes(c, root, e) || parse_layer_kinds(c, root, e)) goto out;

    const cJSON *tie = config_get(root, "tie_word_embeddings");
    c->tie_explicit = cJSON_IsBool(tie);
    c->tie_embeddings = c->tie_explicit ? cJSON_IsTrue(tie) : false;
    c->attn_bias = c->o_bias = config_get_bool(root, "attention_bias", false);
    c->mlp_bias = config_get_bool(root, "mlp_bias", false);
    double cap = 0;
    if (config_get_num(root, "attn_logit_softcapping", 0, &cap, e)) goto out;
    c->attn_softcap = (float)cap;
    if (config_get_num(root, "final_logit_softcapping", 0, &cap, e)) goto out;
    c->final_softcap = (float)cap;
    c->attn_scale = (float)(1.0 / sqrt((double)c->head_dim));
    c->embed_scale = 1.0f;
    c->rope_dim = c->head_dim;
    c->layer_moe = xcalloc((size_t)c->n_layers, sizeof *c->layer_moe);
    c->layer_head_dim = xcalloc((size_t)c->n_layers, sizeof *c->layer_head_dim);
    c->layer_kv_heads = xcalloc((size_t)c->n_layers, sizeof *c->layer_kv_heads);
    c->kv_source = xcalloc((size_t)c->n_layers, sizeof *c->kv_source);
    for (int i = 0; i < c->n_layers; i++) {
        c->layer_head_dim[i] = c->head_dim;
        c->layer_kv_heads[i] = c->n_kv_heads;
        c->kv_source[i] = i;
    }
    /* The family's own fields and defaults (layer patterns, biases, norms). */
    if (c->arch->config && c->arch->config(c, root, e)) goto out;
    if (!c->rope_dims[0]) c->rope_dims[0] = c->rope_dims[1] = c->rope_dim;
    for (int i = 0; i < c->n_layers; i++) {
        int d = c->layer_head_dim[i], kv = d * c->layer_kv_heads[i];
        c->max_head_dim = d > c->max_head_dim ? d : c->max_head_dim;
        c->max_kv_dim = kv > c->max_kv_dim ? kv : c->max_kv_dim;
    }
    /* Without a window every attention layer is full attention, whatever its declared type. */
    if (c->sliding_window == 0)
        for (int i = 0; i < c->n_layers; i++)
            if (c->layer_kinds[i] == LAYER_SLIDING) c->layer_kinds[i] = LAYER_FULL;

    if (parse_quant(c, config_get(top, "quantization") ? top : root, e)) goto out;

    if (!parse_eos(c, config_get(root, "eos_token_id")))
        parse_eos(c, config_get(top, "eos_token_id"));
    const cJSON *bos = config_get(root, "bos_token_id");
    if (!bos) bos = config_get(top, "bos_token_id");
    if (cJSON_IsNumber(bos)) c->bos_id = (int32_t)bos->valuedouble;

    /* generation_config.json's ids win, as in transformers' generate(). */
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    struct err ge;
    text = util_read_file(path, &len, &ge);
    if (text) {
        cJSON *g = cJSON_ParseWithLength(text, len);
        free(text);
        if (!cJSON_IsObject(g)) {
            cJSON_Delete(g);
            err_set(e, "generation_config.json: not a JSON object");
            goto out;
        }
        parse_eos(c, config_get(g, "eos_token_id"));
        bos = config_get(g, "bos_token_id");
        if (cJSON_IsNumber(bos)) c->bos_id = (int32_t)bos->valuedouble;
        cJSON_Delete(g);
    }
    rc = 0;
out:
    cJSON_Delete(top);
    if (rc) config_dispose(c);
    return rc;
}

void config_dispose(struct model_config *c)
{
    free(c->layer_kinds);
    free(c->layer_moe);
    free(c->layer_head_dim);
    free(c->layer_kv_heads);
    free(c->kv_source);
    c->layer_moe = NULL;
    c->layer_head_dim = c->layer_kv_heads = c->kv_source = NULL;
    for (int i = 0; i < c->n_quant_overrides; i++) free(c->quant_overrides[i].prefix);
    free(c->quant_overrides);
    c->layer_kinds = NULL;
    c->quant_overrides = NULL;
    c->n_quant_overrides = 0;
}
