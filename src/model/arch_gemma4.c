/*
 * Gemma 4 (text tower): the Gemma sandwich layer with plain-w norms, a per-layer input and a
 * per-layer output scale.
 *
 *     x += post_norm(o(attn(norm(x))))
 *     x += post_norm(post_mlp_norm(mlp(pre_norm(x))) + post_moe_norm(moe(pre_moe_norm(x))))
 *     x += ple_norm(ple_proj(gelu(ple_gate(x)) * ple[l]));  x *= layer_scalar
 *
 * (the experts' term only with enable_moe_block; the router reads x through its own scaled
 * norm and its chosen weights are renormalized, then scaled per expert). Attention has q/k
 * norms, a weightless v norm and scale 1; global (full) layers may have their own head size
 * (per_layer_config, or the older global_head_dim), take V from the K projection
 * (attention_k_eq_v) and rotate only a share of each head's pairs (proportional rope). The
 * last num_kv_shared_layers layers read the K and V of the last earlier layer of their type
 * and store none.
 *
 * Per-layer inputs: ple[l] = (norm(x0 . Wp / sqrt(hidden)) + E_ple[token] * sqrt(P)) / sqrt(2)
 * over the embedded rows x0, P = hidden_size_per_layer_input. The two constant factors of a
 * norm's input are folded into its epsilon: RMSNorm(s * y, eps) = RMSNorm(y, eps / s^2).
 *
 * Split over a group (model/tp.h): q/k/v, the MLP's gate/up and each expert's gate/up by
 * rows, o, down and each expert's down by columns (the experts by their intermediate width),
 * each layer's key-value heads shared out by their own count (global layers may have fewer);
 * a KV-shared layer reads its source's share, the same heads. The partial sums are added up
 * before the norm after them: after o, after the dense MLP and after the experts. The router,
 * the per-layer inputs' projections and gate and every norm are whole on every rank (the
 * residual rows are the same everywhere, so their results are too); the per-layer embedding
 * is split by vocabulary rows as the embedding is, its rows summed over the group.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"
#include "model/arch.h"
#include "model/blocks.h"

/* Reads per_layer_config {"<layer>": {head_dim, num_key_value_heads}} and the older flat
 * global_head_dim / num_global_key_value_heads. */
static int gemma4_heads(struct model_config *c, const cJSON *root, struct err *e)
{
    int ghd = 0, gkv = 0;
    if (config_get_int(root, "global_head_dim", 0, &ghd, e) ||
        config_get_int(root, "num_global_key_value_heads", 0, &gkv, e))
        return -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kinds[l] != LAYER_FULL) continue;
        if (ghd) c->layer_head_dim[l] = ghd;
        if (gkv && c->k_eq_v) c->layer_kv_heads[l] = gkv;
    }
    const cJSON *plc = config_get(root, "per_layer_config");
    if (plc && !cJSON_IsObject(plc))
        return err_set(e, "config.json: per_layer_config must be an object");
    for (const cJSON *it = plc ? plc->child : NULL; it; it = it->next) {
        char *end;
        long l = strtol(it->string, &end, 10);
        if (*end || end == it->string || l < 0 || l >= c->n_layers || !cJSON_IsObject(it))
            return err_set(e, "config.json: per_layer_config: '%s' is not a layer index (0..%d)",
                           it->string, c->n_layers - 1);
        int heads = c->n_heads;
        if (config_get_int(it, "head_dim", c->layer_head_dim[l], &c->layer_head_dim[l], e) ||
            config_get_int(it, "num_key_value_heads", c->layer_kv_heads[l], &c->layer_kv_heads[l],
                           e) ||
            config_get_int(it, "num_attention_heads", c->n_heads, &heads, e))
            return -1;
        if (heads != c->n_heads)
            return err_set(e,
                           "config.json: per_layer_config: layer %ld has %d query heads; "
                           "per-layer query head counts are not supported",
                           l, heads);
    }
    for (int l = 0; l < c->n_layers; l++) {
        int d = c->layer_head_dim[l], kv = c->layer_kv_heads[l];
        if (d <= 0 || d % 2 || d > 512 || kv <= 0 || c->n_heads % kv)
            return err_set(e,
                           "config.json: layer %d: head_dim %d with %d KV heads is not supported "
                           "(even, at most 512, dividing %d query heads)",
                           l, d, kv, c->n_heads);
    }
    /* One rope table per layer kind, as wide as that kind's heads. */
    int dims[2] = {0, 0};
    for (int l = 0; l < c->n_layers; l++) {
        int k = c->layer_kinds[l] == LAYER_SLIDING, d = c->layer_head_dim[l];
        if (dims[k] && dims[k] != d)
            return err_set(e, "config.json: the %s layers have head sizes %d and %d",
                           k ? "sliding" : "full", dims[k], d);
        dims[k] = d;
    }
    c->rope_dims[0] = dims[0] ? dims[0] : dims[1];
    c->rope_dims[1] = dims[1] ? dims[1] : dims[0];
    return 0;
}

static int gemma4_kv_sharing(struct model_config *c, const cJSON *root, struct err *e)
{
    int shared = 0;
    if (config_get_int(root, "num_kv_shared_layers", 0, &shared, e)) return -1;
    int first = c->n_layers - shared;
    if (shared && first <= 0)
        return err_set(e, "config.json: num_kv_shared_layers %d leaves no layer that stores KV",
                       shared);
    for (int l = first; l < c->n_layers; l++) {
        int src = -1;
        for (int j = 0; j < first; j++)
            if (c->layer_kinds[j] == c->layer_kinds[l]) src = j;
        if (src < 0)
            return err_set(e, "config.json: KV-shared layer %d has no earlier layer of its type",
                           l);
        if (c->layer_head_dim[src] != c->layer_head_dim[l])
            return err_set(e, "config.json: KV-shared layer %d has head size %d, its source %d", l,
                           c->layer_head_dim[l], c->layer_head_dim[src]);
        c->kv_source[l] = src;
        c->layer_kv_heads[l] = c->layer_kv_heads[src];
    }
    c->ffn_double_wide = shared > 0 && config_get_bool(root, "use_double_wide_mlp", false);
    return 0;
}

static int gemma4_config(struct model_config *c, const cJSON *root, struct err *e)
{
    c->norm_plus_one = false; /* Gemma 4's norms multiply by w itself */
    c->embed_scale = sqrtf((float)c->hidden);
    c->attn_scale = 1.0f; /* q and k are normalized per head */
    c->k_eq_v = config_get_bool(root, "attention_k_eq_v", false);
    c->layer_scale = true;
    if (!c->layer_types_given) return err_set(e, "config.json: Gemma 4 needs layer_types");
    for (int l = 0; l < c->n_layers; l++) {
        if (c->layer_kinds[l] == LAYER_LINEAR)
            return err_set(e, "config.json: Gemma 4 has no linear-attention layers");
        if (c->layer_kinds[l] == LAYER_SLIDING && c->sliding_window <= 0)
            return err_set(e, "config.json: sliding layers need a positive sliding_window");
    }
    if (gemma4_heads(c, root, e) || gemma4_kv_sharing(c, root, e)) return -1;

    int pv = c->vocab;
    if (config_get_int(root, "hidden_size_per_layer_input", 0, &c->ple_dim, e) ||
        config_get_int(root, "vocab_size_per_layer_input", c->vocab, &pv, e))
        return -1;
    if (c->ple_dim && pv != c->vocab)
        return err_set(e,
                       "config.json: vocab_size_per_layer_input %d differs from vocab_size %d "
                       "(not supported)",
                       pv, c->vocab);

    if (!config_get_bool(root, "enable_moe_block", false)) return 0;
    struct moe_config *mc = &c->moe;
    if (config_get_int(root, "num_experts", 0, &mc->n_experts, e) ||
        config_get_int(root, "top_k_experts", 0, &mc->top_k, e) ||
        config_get_int(root, "moe_intermediate_size", 0, &mc->inner, e))
        return -1;
    if (mc->n_experts < 1 || mc->top_k < 1 || mc->top_k > mc->n_experts || mc->inner < 1)
        return err_set(e,
                       "config.json: enable_moe_block needs num_experts, top_k_experts (%d) in "
                       "1..num_experts (%d) and a positive moe_intermediate_size",
                       mc->top_k, mc->n_experts);
    mc->norm_topk = true;
    mc->beside_mlp = true;
    for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = true;
    return 0;
}

/* The router (its input norm's weight is router.scale / sqrt(hidden), its per-expert scales
 * stay on the host for the moe op), the fused experts and the block's three extra norms. */
static int gemma4_moe_load(struct model *m, int l, struct model_layer *L, float *host,
                           struct err *e)
{
    const struct model_config *c = &m->cfg;
    int H = c->hidden, E = c->moe.n_experts, I = c->moe.inner;
    char p[256];
    struct moe_block *mb = &L->moe;
    mb->gate = m->experts + (size_t)l * 3 * E;
    mb->up = mb->gate + E;
    mb->down = mb->up + E;
    float *es = m->host_scales + (size_t)l * E;
    mb->expert_scale = es;
#define NAME(s) blk_name(m, p, sizeof p, l, s)
    if (model_load_linear(m, NAME("router.proj"), E, H, &mb->router, e) ||
        model_read_vec(m, NAME("router.scale"), H, host, e) ||
        model_read_vec(m, NAME("router.per_expert_scale"), E, es, e))
        return -1;
    for (int i = 0; i < H; i++) host[i] /= sqrtf((float)H);
    if (!(L->router_norm = model_upload_vec(m, host, H, e))) return -1;
    /* MLX stores the experts as three stacks (switch_glu), in any weight format; Hugging
     * Face fuses gate and up into one float stack [E, 2I, H] */
    char q[256];
    if (st_find(&m->st, NAME("experts.switch_glu.gate_proj.weight"))) {
        static const char *const proj[3] = {"experts.switch_glu.gate_proj",
                                            "experts.switch_glu.up_proj",
                                            "experts.switch_glu.down_proj"};
        struct qweight *dst[3] = {mb->gate, mb->up, mb->down};
        for (int k = 0; k < 3; k++) {
            snprintf(q, sizeof q, "%s", NAME(proj[k]));
            for (int x = 0; x < E; x++)
                if (model_load_expert_split(m, q, x, k == 2 ? H : I, k == 2 ? I : H,
                                            k == 2 ? SPLIT_COLS : SPLIT_ROWS, &dst[k][x], e))
                    return -1;
        }
    } else {
        /* I is the rank's share: up starts after the whole gate */
        int64_t up0 = (int64_t)I * m->tp_size;
        for (int x = 0; x < E; x++)
            if (model_load_expert_rows(m, NAME("experts.gate_up_proj"), x, 0, I, H, SPLIT_ROWS,
                                       &mb->gate[x], e) ||
                model_load_expert_rows(m, NAME("experts.gate_up_proj"), x, up0, I, H, SPLIT_ROWS,
                                       &mb->up[x], e) ||
                model_load_expert_rows(m, NAME("experts.down_proj"), x, 0, H, I, SPLIT_COLS,
                                       &mb->down[x], e))
                return -1;
    }
    if (blk_norm_load(m, NAME("pre_feedforward_layernorm_2.weight"), H, &L->pre_moe_norm, e) ||
        blk_norm_load(m, NAME("post_feedforward_layernorm_1.weight"), H, &L->post_mlp_norm, e) ||
        blk_norm_load(m, NAME("post_feedforward_layernorm_2.weight"), H, &L->post_moe_norm, e))
        return -1;
#undef NAME
    return 0;
}

static int gemma4_layer_load(struct model *m, int l, float *host, const float *ones, struct err *e)
{
    const struct model_config *c = &m->cfg;
    struct model_layer *L = &m->layers[l];
    struct attn_block *a = &L->attn;
    int H = c->hidden, D = c->layer_head_dim[l], P = c->ple_dim;
    int qdim = c->n_heads * D, kvdim = c->layer_kv_heads[l] * D;
    int shared = c->kv_source[l] != l;
    int ffn = c->ffn * (shared && c->ffn_double_wide ? 2 : 1);
    char p[256];
#define NAME(s) blk_name(m, p, sizeof p, l, s)
    model_kv_share_layer(m, l);
    if (model_load_linear_split(m, NAME("self_attn.q_proj"), qdim, H, SPLIT_ROWS, &a->wq, e) ||
        model_load_linear_split(m, NAME("self_attn.o_proj"), H, qdim, SPLIT_COLS, &a->wo, e) ||
        blk_norm_load(m, NAME("self_attn.q_norm.weight"), D, &a->q_norm, e))
        return -1;
    if (!shared) {
        if (model_load_linear_split(m, NAME("self_attn.k_proj"), kvdim, H, SPLIT_KV, &a->wk, e) ||
            blk_norm_load(m, NAME("self_attn.k_norm.weight"), D, &a->k_norm, e) ||
            !(L->v_norm = model_upload_vec(m, ones, D, e)))
            return -1;
        int k_is_v = c->k_eq_v && c->layer_kinds[l] == LAYER_FULL;
        if (!k_is_v &&
            model_load_linear_split(m, NAME("self_attn.v_proj"), kvdim, H, SPLIT_KV, &a->wv, e))
            return -1;
    }
    if (blk_mlp_load(m, NAME("mlp"), ffn, &L->mlp, e) ||
        blk_norm_load(m, NAME("input_layernorm.weight"), H, &L->attn_norm, e) ||
        blk_norm_load(m, NAME("post_attention_layernorm.weight"), H, &L->post_attn_norm, e) ||
        blk_norm_load(m, NAME("pre_feedforward_layernorm.weight"), H, &L->ffn_norm, e) ||
        blk_norm_load(m, NAME("post_feedforward_layernorm.weight"), H, &L->post_ffn_norm, e))
        return -1;
    if (P && (model_load_linear(m, NAME("per_layer_input_gate"), P, H, &L->ple_gate, e) ||
              model_load_linear(m, NAME("per_layer_projection"), H, P, &L->ple_proj, e) ||
              blk_norm_load(m, NAME("post_per_layer_input_norm.weight"), H, &L->ple_norm, e)))
        return -1;
    L->layer_scalar = 1.0f;
    if (st_find(&m->st, NAME("layer_scalar")) &&
        model_read_vec(m, NAME("layer_scalar"), 1, &L->layer_scalar, e))
        return -1;
#undef NAME
    return c->moe.beside_mlp ? gemma4_moe_load(m, l, L, host, e) : 0;
}

static int gemma4_load(struct model *m, struct err *e)
{
    const struct model_config *c = &m->cfg;
    int H = c->hidden, P = c->ple_dim, LP = c->n_layers * P;
    char n[256];
    if (P) {
        snprintf(n, sizeof n, "%sembed_tokens_per_layer", m->prefix);
        if (model_load_linear_split(m, n, m->vocab_part, LP, SPLIT_VOCAB, &m->ple_embed, e))
            return -1;
        snprintf(n, sizeof n, "%sper_layer_model_projection", m->prefix);
        if (model_load_linear(m, n, LP, H, &m->ple_model_proj, e)) return -1;
        snprintf(n, sizeof n, "%sper_layer_projection_norm.weight", m->prefix);
        if (blk_norm_load(m, n, P, &m->ple_proj_norm, e)) return -1;
    }
    if (c->moe.beside_mlp) {
        size_t E = (size_t)c->moe.n_experts;
        m->experts = xcalloc((size_t)c->n_layers * 3 * E, sizeof *m->experts);
        m->host_scales = xcalloc((size_t)c->n_layers * E, sizeof *m->host_scales);
    }
    float *host = xmalloc(sizeof(float) * (size_t)H);
    float *ones = xmalloc(sizeof(float) * (size_t)c->max_head_dim);
    for (int i = 0; i < c->max_head_dim; i++) ones[i] = 1.0f;
    int rc = 0;
    int kv_part = m->kv_part, kv_parts = m->kv_parts; /* num_key_value_heads' share */
    for (int l = 0; l < c->n_layers && !rc; l++) rc = gemma4_layer_load(m, l, host, ones, e);
    m->kv_part = kv_part;
    m->kv_parts = kv_parts;
    free(host);
    free(ones);
    return rc;
}

/* The step's per-layer inputs, left as [L, n, P] in m->ple_in (layer l's rows together). */
static void gemma4_ple(struct model *m, const struct fwd_batch *b)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    int n = b->n_tokens, L = c->n_layers, P = c->ple_dim;
    o->embed(ctx, m->ple_in, &m->ple_embed, b, sqrtf((float)P));
    /* split: each rank embedded the tokens of its share of the vocabulary (zeros elsewhere) */
    if (m->tp_size > 1) o->all_reduce(ctx, m->ple_in, (int64_t)n * L * P);
    o->matmul(ctx, m->ple, m->x, &m->ple_model_proj, n);
    /* the projection's 1 / sqrt(hidden) folded into the norm's epsilon */
    o->rms_norm(ctx, m->ple, m->ple, m->ple_proj_norm, n * L, P, c->rms_eps * (float)c->hidden);
    o->add(ctx, m->ple, m->ple_in, (int64_t)n * L * P);
    for (int l = 0; l < L; l++)
        for (int t = 0; t < n; t++) m->ple_rows[(size_t)l * n + t] = t * L + l;
    o->gather_rows(ctx, m->ple_in, m->ple, m->ple_rows, n * L, P);
}

static void gemma4_attn(struct model *m, const struct model_layer *L, int l,
                        const struct fwd_batch *b)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const struct attn_block *a = &L->attn;
    int n = b->n_tokens, D = c->layer_head_dim[l], Hq = c->n_heads, src = c->kv_source[l];
    int sliding = c->layer_kinds[l] == LAYER_SLIDING;
    int rt = sliding && !m->rope_shared ? 1 : 0;
    o->matmul(ctx, m->q, m->h, &a->wq, n);
    o->rms_norm(ctx, m->q, m->q, a->q_norm, n * Hq, D, c->rms_eps);
    o->rope(ctx, m->q, n, Hq, D, m->rope_cos[rt], m->rope_sin[rt]);
    if (src == l) {
        int Hkv = c->layer_kv_heads[l];
        o->matmul(ctx, m->k, m->h, &a->wk, n);
        if (a->wv.n)
            o->matmul(ctx, m->v, m->h, &a->wv, n);
        else /* attention_k_eq_v: V is the K projection before its norm and rope */
            o->copy(ctx, m->v, m->k, sizeof(float) * (size_t)n * Hkv * D);
        o->rms_norm(ctx, m->k, m->k, a->k_norm, n * Hkv, D, c->rms_eps);
        o->rope(ctx, m->k, n, Hkv, D, m->rope_cos[rt], m->rope_sin[rt]);
        o->rms_norm(ctx, m->v, m->v, L->v_norm, n * Hkv, D, c->rms_eps);
        o->kv_store(ctx, &m->kv[l], &m->kvg[l], m->k, m->v, b);
    }
    struct attn_params ap = {
        .n_heads = Hq,
        .n_kv_heads = c->layer_kv_heads[src],
        .head_dim = D,
        .scale = c->attn_scale,
        .window = sliding ? c->sliding_window : 0,
    };
    o->attention(ctx, m->att, m->q, &m->kv[src], &m->kvg[src], b, &ap);
    o->matmul(ctx, m->h, m->att, &a->wo, n);
}

/* The experts' term of x into m->moe_out (m->h is scratch). */
static void gemma4_moe(struct model *m, const struct model_layer *L, int n)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const struct moe_block *mb = &L->moe;
    struct moe_params mp = blk_moe_params(m, mb);
    blk_norm(m, m->h, m->x, L->router_norm, n);
    o->matmul(ctx, m->router, m->h, &mb->router, n);
    blk_norm(m, m->h, m->x, L->pre_moe_norm, n);
    o->moe(ctx, m->moe_out, m->h, m->router, &mp, n, c->hidden);
    /* split: the experts' partial sums (each rank holds a share of every expert's width) */
    if (m->tp_size > 1) o->all_reduce(ctx, m->moe_out, (int64_t)n * c->hidden);
    blk_norm(m, m->moe_out, m->moe_out, L->post_moe_norm, n);
}

static void gemma4_layers(struct model *m, const struct fwd_batch *b)
{
    const struct model_config *c = &m->cfg;
    const struct backend_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    int n = b->n_tokens, P = c->ple_dim;
    if (P) gemma4_ple(m, b);
    for (int l = 0; l < c->n_layers; l++) {
        const struct model_layer *L = &m->layers[l];
        blk_norm(m, m->h, m->x, L->attn_norm, n);
        gemma4_attn(m, L, l, b);
        blk_reduce(m, n); /* split: before the post-norm */
        blk_norm(m, m->h, m->h, L->post_attn_norm, n);
        blk_add(m, n);
        if (c->moe.beside_mlp) gemma4_moe(m, L, n);
        blk_norm(m, m->h, m->x, L->ffn_norm, n);
        blk_mlp(m, &L->mlp, n);
        blk_reduce(m, n);
        if (c->moe.beside_mlp) {
            blk_norm(m, m->h, m->h, L->post_mlp_norm, n);
            o->add(ctx, m->h, m->moe_out, (int64_t)n * c->hidden);
        }
        blk_norm(m, m->h, m->h, L->post_ffn_norm, n);
        blk_add(m, n);
        if (P) {
            const float *in = m->ple_in + (size_t)l * n * P;
            o->matmul(ctx, m->ple_g, m->x, &L->ple_gate, n);
            o->act_mul(ctx, m->ple_g, m->ple_g, in, (int64_t)n * P, c->act);
            o->matmul(ctx, m->h, m->ple_g, &L->ple_proj, n);
            /* the inputs' 1 / sqrt(2) folded into the norm's epsilon */
            o->rms_norm(ctx, m->h, m->h, L->ple_norm, n, c->hidden, 2.0f * c->rms_eps);
            blk_add(m, n);
        }
        if (L->layer_scalar != 1.0f) o->scale(ctx, m->x, (int64_t)n * c->hidden, L->layer_scalar);
    }
}

const struct arch arch_gemma4 = {"Gemma4ForCausalLM", "gemma4",      gemma4_config,
                                 gemma4_load,         gemma4_layers, true};
const struct arch arch_gemma4_vl = {
    "Gemma4ForConditionalGeneration", "gemma4", gemma4_config, gemma4_load, gemma4_layers, true};
