/*
 * bench make-model: a random-weight checkpoint of any shape, for measuring models nobody
 * has to download. Llama, Qwen3, Qwen3-MoE, the hybrid Qwen3.5 / 3.6 (dense and MoE),
 * Gemma 4 (dense and MoE, bf16 only) and BitNet b1.58 (ternary linear layers packed as
 * microsoft/bitnet-b1.58-2B-4T stores them, a bf16 embedding: --format bf16), in the Hugging
 * Face layout (bf16: per-expert `mlp.experts.N.*`, conv1d [C, 1, K]) or the MLX one (mlx4,
 * mlx8, mxfp4, mxfp8: experts stacked as `mlp.switch_mlp.*` [E, n, k], conv1d [C, K, 1],
 * routers at 8 bits). Values are deterministic for a seed and scaled so that every product
 * keeps unit variance for unit inputs.
 *
 * Next to the weights go a tokenizer and a chat template, so `pagoda serve` runs the model:
 * a byte-level BPE of the model's vocabulary size (text/tokenizer_gen.h), or with
 * --tokenizer DIR a copy of a real one (Llama 3's for a vocabulary of 128256), whose BOS and
 * EOS ids then go into config.json and generation_config.json.
 *
 * Tensors are declared first and streamed to the file in 8 MiB pieces by st_writer, each
 * piece computed from its tensor's fill descriptor: memory stays at a few MiB whatever the
 * size, so a 70 GB checkpoint can go to /dev/shm on a machine with little disk.
 */
#include <assert.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "cli/args.h"
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "common/threadpool.h"
#include "common/util.h"
#include "model/st_writer.h"
#include "text/tokenizer.h"
#include "text/tokenizer_gen.h"

enum fill_kind {
    FILL_BF16_UNIFORM,     /* c + a * u, u uniform in [-1, 1) */
    FILL_BF16_LOG_UNIFORM, /* log(c + a * u): A_log as the model initializes it */
    FILL_BF16_CONST,       /* a */
    FILL_RANDOM_BITS,
    FILL_U8_CONST,
    FILL_FP8_RANDOM, /* random e4m3 codes, never the NaN codes 0x7f / 0xff */
    FILL_TERNARY     /* bytes of four random 2-bit codes in {0, 1, 2} (BitNet's packing) */
};

struct fill {
    enum fill_kind kind;
    uint64_t seed;
    float a, c;
    uint8_t byte;
    struct threadpool *tp; /* fills the pieces in parallel (set by mk_tensor) */
};

/* Bytes [off, off + n) of the tensor f describes; off and n even, random bits whole 8-byte
 * words except for a tail. */
static void fill_range(const struct fill *f, uint8_t *buf, size_t off, size_t n)
{
    switch (f->kind) {
    case FILL_BF16_UNIFORM:
    case FILL_BF16_LOG_UNIFORM:
        for (size_t i = 0; i < n / 2; i++) {
            uint64_t r = bench_mix(f->seed + (off / 2 + i));
            float u = (float)(r >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
            float v = f->c + u * f->a;
            ((uint16_t *)buf)[i] = f32_to_bf16(f->kind == FILL_BF16_LOG_UNIFORM ? logf(v) : v);
        }
        break;
    case FILL_BF16_CONST:
        for (size_t i = 0; i < n / 2; i++) ((uint16_t *)buf)[i] = f32_to_bf16(f->a);
        break;
    case FILL_RANDOM_BITS:
        for (size_t i = 0; i < (n + 7) / 8; i++) {
            uint64_t r = bench_mix(f->seed + (off / 8 + i));
            memcpy(buf + i * 8, &r, n - i * 8 < 8 ? n - i * 8 : 8);
        }
        break;
    case FILL_U8_CONST:
        memset(buf, f->byte, n);
        break;
    case FILL_FP8_RANDOM:
        for (size_t i = 0; i < n; i++) {
            uint8_t b = (uint8_t)(bench_mix(f->seed + off + i) >> 24);
            buf[i] = (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
        }
        break;
    case FILL_TERNARY:
        for (size_t i = 0; i < n; i++) {
            uint64_t r = bench_mix(f->seed + off + i) >> 8;
            buf[i] = (uint8_t)(r % 3 | (r / 3 % 3) << 2 | (r / 9 % 3) << 4 | (r / 27 % 3) << 6);
        }
        break;
    }
}

struct fill_job {
    const struct fill *f;
    uint8_t *buf;
    size_t off, n;
};

static void fill_task(void *arg, int ith, int nth)
{
    struct fill_job *j = arg;
    long lo, hi;
    tp_range((long)j->n, ith, nth, 64, &lo, &hi);
    if (lo < hi) fill_range(j->f, j->buf + lo, j->off + (size_t)lo, (size_t)(hi - lo));
}

/* st_writer's callback: a piece of up to 8 MiB, split over the pool (random bf16 values
 * cost about 5 ns each: one core fills a 70 GB checkpoint in minutes, slower than a tmpfs
 * takes the bytes). Pieces start at multiples of 64 bytes of the tensor. */
static void fill_cb(void *ctx, uint8_t *buf, size_t off, size_t n)
{
    struct fill *f = ctx;
    struct fill_job j = {f, buf, off, n};
    if (f->tp && n >= (1u << 16))
        tp_run(f->tp, fill_task, &j);
    else
        fill_range(f, buf, off, n);
}

static struct fill uniform(uint64_t seed, float half, float center)
{
    return (struct fill){.kind = FILL_BF16_UNIFORM, .seed = seed, .a = half, .c = center};
}

static struct fill constant(float v)
{
    return (struct fill){.kind = FILL_BF16_CONST, .a = v};
}

struct mm_spec {
    const char *format; /* bf16 | mlx4 | mlx8 | mxfp4 | mxfp8 */
    int bits, group;
};

/* The 8-bit affine format mlx-lm keeps MoE routers and shared-expert gates in. */
static const struct mm_spec router_spec = {"mlx8", 8, 64};

enum mk_arch { MK_LLAMA, MK_QWEN3, MK_QWEN3_MOE, MK_QWEN3_5, MK_QWEN3_5_MOE, MK_GEMMA4, MK_BITNET };

static const struct {
    const char *flag, *hf, *model_type;
} arch_names[] = {
    [MK_LLAMA] = {"llama", "LlamaForCausalLM", "llama"},
    [MK_QWEN3] = {"qwen3", "Qwen3ForCausalLM", "qwen3"},
    [MK_QWEN3_MOE] = {"qwen3_moe", "Qwen3MoeForCausalLM", "qwen3_moe"},
    [MK_QWEN3_5] = {"qwen3_5", "Qwen3_5ForCausalLM", "qwen3_5_text"},
    [MK_QWEN3_5_MOE] = {"qwen3_5_moe", "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text"},
    [MK_GEMMA4] = {"gemma4", "Gemma4ForCausalLM", "gemma4_text"},
    [MK_BITNET] = {"bitnet", "BitNetForCausalLM", "bitnet"},
};

/* What the flags set; names follow the config.json fields they become. */
struct mk_shape {
    enum mk_arch arch;
    long hidden, layers, heads, kv_heads, head_dim, ffn, vocab, ctx, seed;
    long experts, top_k, expert_ffn, shared_ffn;                 /* MoE (experts 0: dense) */
    long full_every, lk_heads, lv_heads, lk_dim, lv_dim, conv_k; /* Qwen3.5 (and Gemma 4) */
    long mtp; /* Qwen3.5: multi-token-prediction layers (mtp.*), mtp_num_hidden_layers */
    long global_head_dim, global_kv_heads, window, ple_dim, kv_shared, k_eq_v; /* Gemma 4 */
    const char *tokenizer;  /* --tokenizer DIR or NULL */
    int32_t bos, eos, eos2; /* the tokenizer's special ids (eos2: a second EOS, or -1) */
};

/* Gemma 4: every full_every-th layer is full attention, with its own head size and (with K
 * as V) KV heads; the last kv_shared layers store no K or V. */
static int g4_full(const struct mk_shape *s, long l)
{
    return (l + 1) % s->full_every == 0;
}

static long g4_head_dim(const struct mk_shape *s, long l)
{
    return g4_full(s, l) ? s->global_head_dim : s->head_dim;
}

static long g4_kv_heads(const struct mk_shape *s, long l)
{
    return g4_full(s, l) && s->k_eq_v ? s->global_kv_heads : s->kv_heads;
}

static int is_hybrid(const struct mk_shape *s)
{
    return s->arch == MK_QWEN3_5 || s->arch == MK_QWEN3_5_MOE;
}

static int is_linear_layer(const struct mk_shape *s, long l)
{
    return is_hybrid(s) && (l + 1) % s->full_every != 0;
}

/* The file being declared: its format, fill descriptors (one a tensor, alive until the
 * file is written, never moved: the writer holds pointers to them) and its size. */
struct mk {
    struct st_writer *w;
    struct threadpool *tp;
    struct fill *pool;
    int np, cap;
    struct mm_spec f;
    size_t bytes;
    int ntensors;
    cJSON *overrides; /* per-module quantization entries of config.json */
    const char *pre;  /* of the layer being written: "model.", or "mtp." for the MTP module */
};

static void mk_tensor(struct mk *m, const char *name, enum st_dtype dt, int ndim,
                      const int64_t *shape, struct fill fill)
{
    assert(m->np < m->cap);
    struct fill *f = &m->pool[m->np++];
    *f = fill;
    f->tp = m->tp;
    st_writer_add(m->w, name, dt, ndim, shape, fill_cb, f);
    size_t n = st_dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    m->bytes += n;
    m->ntensors++;
}

static void mk_vec(struct mk *m, const char *name, int64_t n, struct fill fill)
{
    mk_tensor(m, name, ST_BF16, 1, &n, fill);
}

/* A linear layer `prefix` of [n, k] in format f, or with E > 0 a stack of E of them
 * ([E, n, k], MLX switch_mlp). Weights are uniform in +-sqrt(3 / k): unit output variance
 * for unit inputs. */
static void mk_linear(struct mk *m, const char *prefix, int64_t E, int64_t n, int64_t k,
                      const struct mm_spec *f, uint64_t seed)
{
    char name[300];
    float a = sqrtf(3.0f / (float)k);
    int nd = E > 0 ? 3 : 2;
    int64_t lead = E > 0 ? E : 1;
    snprintf(name, sizeof name, "%s.weight", prefix);
    if (!strcmp(f->format, "bf16")) {
        int64_t shape[3] = {lead, n, k};
        mk_tensor(m, name, ST_BF16, nd, shape + 3 - nd, uniform(seed, a, 0.0f));
        return;
    }
    int64_t wshape[3] = {lead, n, k * f->bits / 32}, sshape[3] = {lead, n, k / f->group};
    int64_t *ws = wshape + 3 - nd, *ss = sshape + 3 - nd;
    int mx = !strcmp(f->format, "mxfp4") || !strcmp(f->format, "mxfp8");
    mk_tensor(
        m, name, ST_U32, nd, ws,
        (struct fill){.kind = !strcmp(f->format, "mxfp8") ? FILL_FP8_RANDOM : FILL_RANDOM_BITS,
                      .seed = seed});
    snprintf(name, sizeof name, "%s.scales", prefix);
    if (mx) {
        /* e2m1 magnitudes reach 6, random e4m3 codes have an RMS of about 128: a power-of-two
         * scale near a / 3 or a / 128 keeps |w| near a. */
        float top = !strcmp(f->format, "mxfp4") ? 3.0f : 128.0f;
        uint8_t e8 = (uint8_t)(127 + (int)lrintf(log2f(a / top)));
        mk_tensor(m, name, ST_U8, nd, ss, (struct fill){.kind = FILL_U8_CONST, .byte = e8});
        return;
    }
    float levels = (float)((1 << f->bits) - 1);
    mk_tensor(m, name, ST_BF16, nd, ss, constant(2.0f * a / levels));
    snprintf(name, sizeof name, "%s.biases", prefix);
    mk_tensor(m, name, ST_BF16, nd, ss, constant(-a));
}

/* A router-like linear layer: at 8 bits in a quantized checkpoint, as mlx-lm keeps them,
 * with its entry in config.json's quantization. */
static void mk_router(struct mk *m, const char *prefix, int64_t n, int64_t k, uint64_t seed)
{
    if (!strcmp(m->f.format, "bf16") || !strcmp(m->f.format, "mlx8")) {
        mk_linear(m, prefix, 0, n, k, &m->f, seed);
        return;
    }
    mk_linear(m, prefix, 0, n, k, &router_spec, seed);
    cJSON *o = cJSON_AddObjectToObject(m->overrides, prefix);
    cJSON_AddNumberToObject(o, "group_size", router_spec.group);
    cJSON_AddNumberToObject(o, "bits", router_spec.bits);
    if (strncmp(m->f.format, "mlx", 3) != 0) cJSON_AddStringToObject(o, "mode", "affine");
}

/* A seed for tensor `tag` of layer l, far from every other tensor's stream. */
static uint64_t tseed(const struct mk_shape *s, long l, uint64_t tag)
{
    return bench_mix(((uint64_t)s->seed << 40) ^ ((uint64_t)(l + 1) << 24) ^ tag);
}

#define NAME(...) (snprintf(p, sizeof p, __VA_ARGS__), p)

static void mk_attention(struct mk *m, const struct mk_shape *s, long l, uint64_t ls,
                         struct fill norm)
{
    char p[300];
    int64_t H = s->hidden, D = s->head_dim, qd = s->heads * D, kvd = s->kv_heads * D;
    /* Qwen3.5's q_proj also yields the output gate: [Hq * 2D, hidden]. */
    int64_t qrows = is_hybrid(s) ? 2 * qd : qd;
    const char *names[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    int64_t ns[] = {qrows, kvd, kvd, H}, ks[] = {H, H, H, qd};
    for (int i = 0; i < 4; i++)
        mk_linear(m, NAME("%slayers.%ld.self_attn.%s", m->pre, l, names[i]), 0, ns[i], ks[i], &m->f,
                  ls + ((uint64_t)i << 28));
    if (s->arch == MK_LLAMA) return;
    norm.seed = tseed(s, l, 1);
    mk_vec(m, NAME("%slayers.%ld.self_attn.q_norm.weight", m->pre, l), D, norm);
    norm.seed = tseed(s, l, 2);
    mk_vec(m, NAME("%slayers.%ld.self_attn.k_norm.weight", m->pre, l), D, norm);
}

/* Gated DeltaNet: in_proj_qkv [2 Hk dk + Hv dv, hidden], in_proj_z [Hv dv, hidden],
 * in_proj_b / in_proj_a [Hv, hidden], out_proj [hidden, Hv dv], the depthwise conv over
 * the qkv channels, A_log and dt_bias [Hv], the gated norm [dv]. */
static void mk_delta_net(struct mk *m, const struct mk_shape *s, long l)
{
    char p[300];
    int64_t H = s->hidden, kd = s->lk_heads * s->lk_dim, vd = s->lv_heads * s->lv_dim;
    int64_t C = 2 * kd + vd, K = s->conv_k, Hv = s->lv_heads;
    const char *names[] = {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"};
    int64_t ns[] = {C, vd, Hv, Hv, H}, ks[] = {H, H, H, H, vd};
    for (int i = 0; i < 5; i++)
        mk_linear(m, NAME("%slayers.%ld.linear_attn.%s", m->pre, l, names[i]), 0, ns[i], ks[i],
                  &m->f, tseed(s, l, 16 + (uint64_t)i));
    int mlx = strcmp(m->f.format, "bf16") != 0;
    int64_t cshape[3] = {C, mlx ? K : 1, mlx ? 1 : K};
    mk_tensor(m, NAME("%slayers.%ld.linear_attn.conv1d.weight", m->pre, l), ST_BF16, 3, cshape,
              uniform(tseed(s, l, 24), sqrtf(3.0f / (float)K), 0.0f));
    /* A = -exp(A_log) in [-16, -1], the decay's input shifted by dt_bias = 1. */
    mk_vec(m, NAME("%slayers.%ld.linear_attn.A_log", m->pre, l), Hv,
           (struct fill){
               .kind = FILL_BF16_LOG_UNIFORM, .seed = tseed(s, l, 25), .a = 7.5f, .c = 8.5f});
    mk_vec(m, NAME("%slayers.%ld.linear_attn.dt_bias", m->pre, l), Hv, constant(1.0f));
    /* The gated norm multiplies by plain w: around 1. */
    mk_vec(m, NAME("%slayers.%ld.linear_attn.norm.weight", m->pre, l), s->lv_dim,
           uniform(tseed(s, l, 26), 0.1f, 1.0f));
}

/* Routed experts (router [E, hidden], E experts of [I, hidden] x2 and [hidden, I]) and the
 * optional shared expert of width S with its gate [1, hidden]. */
static void mk_moe(struct mk *m, const struct mk_shape *s, long l)
{
    char p[300];
    int64_t H = s->hidden, E = s->experts, I = s->expert_ffn, S = s->shared_ffn;
    static const char *const proj[3] = {"gate_proj", "up_proj", "down_proj"};
    mk_router(m, NAME("%slayers.%ld.mlp.gate", m->pre, l), E, H, tseed(s, l, 32));
    for (int j = 0; j < 3; j++) {
        int64_t n = j == 2 ? H : I, k = j == 2 ? I : H;
        if (strcmp(m->f.format, "bf16") != 0) {
            mk_linear(m, NAME("%slayers.%ld.mlp.switch_mlp.%s", m->pre, l, proj[j]), E, n, k, &m->f,
                      tseed(s, l, 40 + (uint64_t)j));
            continue;
        }
        for (int64_t x = 0; x < E; x++)
            mk_linear(m, NAME("%slayers.%ld.mlp.experts.%lld.%s", m->pre, l, (long long)x, proj[j]),
                      0, n, k, &m->f, tseed(s, l, ((uint64_t)(x + 1) << 8) + 40 + (uint64_t)j));
    }
    if (!S) return;
    for (int j = 0; j < 3; j++)
        mk_linear(m, NAME("%slayers.%ld.mlp.shared_expert.%s", m->pre, l, proj[j]), 0,
                  j == 2 ? H : S, j == 2 ? S : H, &m->f, tseed(s, l, 48 + (uint64_t)j));
    mk_router(m, NAME("%slayers.%ld.mlp.shared_expert_gate", m->pre, l), 1, H, tseed(s, l, 51));
}

/* Gemma 4: tied embeddings, per-layer inputs, q/k norms, layer scalars, the MoE block's
 * router, fused experts and extra norms beside the dense MLP. Norms (plain w) are 1. */
static void mk_gemma4_layers(struct mk *m, const struct mk_shape *s)
{
    char p[300];
    int64_t H = s->hidden, P = s->ple_dim, L = s->layers, E = s->experts, I = s->expert_ffn;
    struct fill one = constant(1.0f);
    uint64_t base = (uint64_t)s->seed << 40;
    mk_linear(m, "model.embed_tokens", 0, s->vocab, H, &m->f, base);
    mk_vec(m, "model.norm.weight", H, one);
    if (P) {
        mk_linear(m, "model.embed_tokens_per_layer", 0, s->vocab, L * P, &m->f, tseed(s, -1, 6));
        mk_linear(m, "model.per_layer_model_projection", 0, L * P, H, &m->f, tseed(s, -1, 7));
        mk_vec(m, "model.per_layer_projection_norm.weight", P, one);
    }
    for (long l = 0; l < L; l++) {
        int64_t D = g4_head_dim(s, l), qd = s->heads * D, kvd = g4_kv_heads(s, l) * D;
#define LNAME(x) NAME("%slayers.%ld.%s", m->pre, l, x)
        mk_linear(m, LNAME("self_attn.q_proj"), 0, qd, H, &m->f, tseed(s, l, 60));
        mk_linear(m, LNAME("self_attn.o_proj"), 0, H, qd, &m->f, tseed(s, l, 61));
        mk_vec(m, LNAME("self_attn.q_norm.weight"), D, one);
        if (l < L - s->kv_shared) {
            mk_linear(m, LNAME("self_attn.k_proj"), 0, kvd, H, &m->f, tseed(s, l, 62));
            if (!(g4_full(s, l) && s->k_eq_v))
                mk_linear(m, LNAME("self_attn.v_proj"), 0, kvd, H, &m->f, tseed(s, l, 63));
            mk_vec(m, LNAME("self_attn.k_norm.weight"), D, one);
        }
        mk_linear(m, LNAME("mlp.gate_proj"), 0, s->ffn, H, &m->f, tseed(s, l, 64));
        mk_linear(m, LNAME("mlp.up_proj"), 0, s->ffn, H, &m->f, tseed(s, l, 65));
        mk_linear(m, LNAME("mlp.down_proj"), 0, H, s->ffn, &m->f, tseed(s, l, 66));
        static const char *const norms[] = {
            "input_layernorm.weight", "post_attention_layernorm.weight",
            "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"};
        for (int i = 0; i < 4; i++) mk_vec(m, LNAME(norms[i]), H, one);
        mk_vec(m, LNAME("layer_scalar"), 1, one);
        if (P) {
            mk_linear(m, LNAME("per_layer_input_gate"), 0, P, H, &m->f, tseed(s, l, 67));
            mk_linear(m, LNAME("per_layer_projection"), 0, H, P, &m->f, tseed(s, l, 68));
            mk_vec(m, LNAME("post_per_layer_input_norm.weight"), H, one);
        }
        if (!E) continue;
        mk_linear(m, LNAME("router.proj"), 0, E, H, &m->f, tseed(s, l, 69));
        mk_vec(m, LNAME("router.scale"), H, one);
        mk_vec(m, LNAME("router.per_expert_scale"), E, one);
        int64_t gu[3] = {E, 2 * I, H}, dn[3] = {E, H, I};
        mk_tensor(m, LNAME("experts.gate_up_proj"), ST_BF16, 3, gu,
                  uniform(tseed(s, l, 70), sqrtf(3.0f / (float)H), 0.0f));
        mk_tensor(m, LNAME("experts.down_proj"), ST_BF16, 3, dn,
                  uniform(tseed(s, l, 71), sqrtf(3.0f / (float)I), 0.0f));
        static const char *const moe_norms[] = {"pre_feedforward_layernorm_2.weight",
                                                "post_feedforward_layernorm_1.weight",
                                                "post_feedforward_layernorm_2.weight"};
        for (int i = 0; i < 3; i++) mk_vec(m, LNAME(moe_norms[i]), H, one);
#undef LNAME
    }
}

/* BitNet's BitLinear `prefix` [n, k] packed as microsoft/bitnet-b1.58-2B-4T stores it: uint8
 * [n/4, k] of four ternary codes, and weight_scale = sqrt(2k/3), which the product divides
 * by: about unit output variance for unit inputs, two thirds of the values being nonzero. */
static void mk_bitlinear(struct mk *m, const char *prefix, int64_t n, int64_t k, uint64_t seed)
{
    char name[320];
    int64_t shape[2] = {n / 4, k}, one = 1;
    snprintf(name, sizeof name, "%s.weight", prefix);
    mk_tensor(m, name, ST_U8, 2, shape, (struct fill){.kind = FILL_TERNARY, .seed = seed});
    snprintf(name, sizeof name, "%s.weight_scale", prefix);
    mk_tensor(m, name, ST_BF16, 1, &one, constant(sqrtf(2.0f * (float)k / 3.0f)));
}

/* BitNet b1.58: a tied bf16 embedding, the Llama layer with attn_sub_norm [Hq*D] and
 * ffn_sub_norm [ffn], every decoder linear a packed BitLinear. */
static void mk_bitnet_layers(struct mk *m, const struct mk_shape *s)
{
    char p[300];
    int64_t H = s->hidden, F = s->ffn, qd = s->heads * s->head_dim, kvd = s->kv_heads * s->head_dim;
    uint64_t base = (uint64_t)s->seed << 40;
    mk_linear(m, "model.embed_tokens", 0, s->vocab, H, &m->f, base);
    mk_vec(m, "model.norm.weight", H, constant(1.0f));
    static const char *const names[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                         "mlp.down_proj"};
    int64_t ns[7] = {qd, kvd, kvd, H, F, F, H}, ks[7] = {H, H, H, qd, H, H, F};
    for (long l = 0; l < s->layers; l++) {
        for (int i = 0; i < 7; i++)
            mk_bitlinear(m, NAME("%slayers.%ld.%s", m->pre, l, names[i]), ns[i], ks[i],
                         tseed(s, l, 80 + (uint64_t)i));
        mk_vec(m, NAME("%slayers.%ld.self_attn.attn_sub_norm.weight", m->pre, l), qd,
               constant(1.0f));
        mk_vec(m, NAME("%slayers.%ld.mlp.ffn_sub_norm.weight", m->pre, l), F, constant(1.0f));
        mk_vec(m, NAME("%slayers.%ld.input_layernorm.weight", m->pre, l), H, constant(1.0f));
        mk_vec(m, NAME("%slayers.%ld.post_attention_layernorm.weight", m->pre, l), H,
               constant(1.0f));
    }
}

static void mk_layers(struct mk *m, const struct mk_shape *s)
{
    if (s->arch == MK_GEMMA4) {
        mk_gemma4_layers(m, s);
        return;
    }
    if (s->arch == MK_BITNET) {
        mk_bitnet_layers(m, s);
        return;
    }
    char p[300];
    int64_t H = s->hidden;
    /* Norms: (1 + w) on Qwen3.5, so w near 0 there; plain w = 1 elsewhere. */
    struct fill norm = is_hybrid(s) ? uniform(0, 0.1f, 0.0f) : constant(1.0f);
    uint64_t base = (uint64_t)s->seed << 40;
    mk_linear(m, "model.embed_tokens", 0, s->vocab, H, &m->f, base);
    mk_linear(m, "lm_head", 0, s->vocab, H, &m->f, base + (1ull << 38));
    norm.seed = tseed(s, -1, 3);
    mk_vec(m, "model.norm.weight", H, norm);
    /* the layers, then the MTP module's (mtp.layers.N: full attention, the model's MLP) */
    for (long i = 0; i < s->layers + s->mtp; i++) {
        uint64_t ls = base + ((uint64_t)(i + 1) << 32);
        long l = i < s->layers ? i : i - s->layers;
        m->pre = i < s->layers ? "model." : "mtp.";
        if (i < s->layers && is_linear_layer(s, l))
            mk_delta_net(m, s, l);
        else
            mk_attention(m, s, l, ls, norm);
        if (s->experts) {
            mk_moe(m, s, l);
        } else {
            const char *names[] = {"gate_proj", "up_proj", "down_proj"};
            int64_t ns[] = {s->ffn, s->ffn, H}, ks[] = {H, H, s->ffn};
            for (int i = 0; i < 3; i++)
                mk_linear(m, NAME("%slayers.%ld.mlp.%s", m->pre, l, names[i]), 0, ns[i], ks[i],
                          &m->f, ls + ((uint64_t)(4 + i) << 28));
        }
        norm.seed = tseed(s, l, 4);
        mk_vec(m, NAME("%slayers.%ld.input_layernorm.weight", m->pre, l), H, norm);
        norm.seed = tseed(s, l, 5);
        mk_vec(m, NAME("%slayers.%ld.post_attention_layernorm.weight", m->pre, l), H, norm);
    }
    m->pre = "model.";
    if (!s->mtp) return;
    /* fc [H, 2H] over [embedding, hidden], and its three norms */
    mk_linear(m, "mtp.fc", 0, H, 2 * H, &m->f, tseed(s, -1, 6));
    static const char *const mtp_norms[] = {"mtp.pre_fc_norm_embedding.weight",
                                            "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"};
    for (int i = 0; i < 3; i++) {
        norm.seed = tseed(s, -1, 7 + (uint64_t)i);
        mk_vec(m, mtp_norms[i], H, norm);
    }
}

#undef NAME

static int cmp_items(const void *a, const void *b)
{
    return strcmp((*(cJSON *const *)a)->string, (*(cJSON *const *)b)->string);
}

/* Orders an object's keys as transformers writes them (json.dumps(sort_keys=True)). */
static void sort_keys(cJSON *o)
{
    int n = cJSON_GetArraySize(o);
    cJSON **it = xmalloc(sizeof *it * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) it[i] = cJSON_DetachItemFromArray(o, 0);
    qsort(it, (size_t)n, sizeof *it, cmp_items);
    for (int i = 0; i < n; i++) {
        if (cJSON_IsObject(it[i])) sort_keys(it[i]);
        cJSON_AddItemToArray(o, it[i]);
    }
    free(it);
}

/* Gemma 4's config.json in transformers 5.17's layout (per_layer_config for the full layers,
 * as the reference checkpoints of tests/golden have it). */
static cJSON *mk_config_gemma4(const struct mk_shape *s)
{
    cJSON *c = cJSON_CreateObject();
    cJSON *ar = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(ar, cJSON_CreateString(arch_names[s->arch].hf));
    cJSON_AddStringToObject(c, "model_type", arch_names[s->arch].model_type);
    static const char *const num_names[] = {"hidden_size",
                                            "num_hidden_layers",
                                            "num_attention_heads",
                                            "num_key_value_heads",
                                            "head_dim",
                                            "intermediate_size",
                                            "vocab_size",
                                            "max_position_embeddings",
                                            "sliding_window",
                                            "hidden_size_per_layer_input",
                                            "vocab_size_per_layer_input",
                                            "num_kv_shared_layers"};
    long nums[] = {s->hidden, s->layers, s->heads,  s->kv_heads, s->head_dim, s->ffn,
                   s->vocab,  s->ctx,    s->window, s->ple_dim,  s->vocab,    s->kv_shared};
    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
        cJSON_AddNumberToObject(c, num_names[i], (double)nums[i]);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-6);
    cJSON_AddStringToObject(c, "hidden_activation", "gelu_pytorch_tanh");
    cJSON_AddTrueToObject(c, "tie_word_embeddings");
    cJSON_AddNumberToObject(c, "bos_token_id", 2);
    cJSON_AddNumberToObject(c, "eos_token_id", 1);
    cJSON_AddNumberToObject(c, "pad_token_id", 0);
    cJSON_AddNumberToObject(c, "final_logit_softcapping", 30.0);
    cJSON_AddFalseToObject(c, "attention_bias");
    cJSON_AddBoolToObject(c, "attention_k_eq_v", s->k_eq_v != 0);
    cJSON_AddFalseToObject(c, "use_double_wide_mlp");
    cJSON_AddBoolToObject(c, "enable_moe_block", s->experts > 0);
    if (s->experts) {
        cJSON_AddNumberToObject(c, "num_experts", (double)s->experts);
        cJSON_AddNumberToObject(c, "top_k_experts", (double)s->top_k);
        cJSON_AddNumberToObject(c, "moe_intermediate_size", (double)s->expert_ffn);
    }
    cJSON_AddStringToObject(c, "dtype", "bfloat16");
    cJSON_AddStringToObject(c, "transformers_version", "5.17.0");
    cJSON *lt = cJSON_AddArrayToObject(c, "layer_types");
    cJSON *plc = cJSON_AddObjectToObject(c, "per_layer_config");
    for (long l = 0; l < s->layers; l++) {
        cJSON_AddItemToArray(
            lt, cJSON_CreateString(g4_full(s, l) ? "full_attention" : "sliding_attention"));
        if (!g4_full(s, l)) continue;
        char key[24];
        snprintf(key, sizeof key, "%ld", l);
        cJSON *o = cJSON_AddObjectToObject(plc, key);
        cJSON_AddNumberToObject(o, "head_dim", (double)s->global_head_dim);
        cJSON_AddNumberToObject(o, "num_key_value_heads", (double)g4_kv_heads(s, l));
    }
    cJSON *rp = cJSON_AddObjectToObject(c, "rope_parameters");
    cJSON *full = cJSON_AddObjectToObject(rp, "full_attention");
    cJSON_AddNumberToObject(full, "partial_rotary_factor", 0.25);
    cJSON_AddNumberToObject(full, "rope_theta", 1e6);
    cJSON_AddStringToObject(full, "rope_type", "proportional");
    cJSON *sl = cJSON_AddObjectToObject(rp, "sliding_attention");
    cJSON_AddNumberToObject(sl, "rope_theta", 1e4);
    cJSON_AddStringToObject(sl, "rope_type", "default");
    sort_keys(c);
    return c;
}

/* config.json with the fields and defaults transformers saves for the architecture (as in
 * the reference checkpoints of tests/golden), then mlx-lm's quantization entries. */
/* BitNet's config.json as microsoft/bitnet-b1.58-2B-4T has it. */
/* The fields every Llama-like config shares: architecture, model type and the shape. */
static cJSON *mk_config_shape(const struct mk_shape *s)
{
    cJSON *c = cJSON_CreateObject();
    cJSON *ar = cJSON_AddArrayToObject(c, "architectures");
    cJSON_AddItemToArray(ar, cJSON_CreateString(arch_names[s->arch].hf));
    cJSON_AddStringToObject(c, "model_type", arch_names[s->arch].model_type);
    cJSON_AddNumberToObject(c, "hidden_size", (double)s->hidden);
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)s->layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", (double)s->heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", (double)s->kv_heads);
    cJSON_AddNumberToObject(c, "head_dim", (double)s->head_dim);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)s->ffn);
    cJSON_AddNumberToObject(c, "vocab_size", (double)s->vocab);
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)s->ctx);
    return c;
}

static cJSON *mk_config_bitnet(const struct mk_shape *s)
{
    cJSON *c = mk_config_shape(s);
    cJSON_AddNumberToObject(c, "rms_norm_eps", 1e-5);
    cJSON_AddNumberToObject(c, "rope_theta", 500000.0);
    cJSON_AddStringToObject(c, "hidden_act", "relu2");
    cJSON_AddTrueToObject(c, "tie_word_embeddings");
    cJSON_AddFalseToObject(c, "attention_bias");
    cJSON_AddNumberToObject(c, "bos_token_id", s->bos);
    cJSON_AddNumberToObject(c, "eos_token_id", s->eos);
    cJSON_AddStringToObject(c, "torch_dtype", "bfloat16");
    sort_keys(c);
    cJSON *q = cJSON_AddObjectToObject(c, "quantization_config");
    cJSON_AddStringToObject(q, "quant_method", "bitnet");
    cJSON_AddStringToObject(q, "linear_class", "bitlinear");
    cJSON_AddStringToObject(q, "quantization_mode", "offline");
    return c;
}

static cJSON *mk_config(const struct mk_shape *s, const struct mk *m)
{
    if (s->arch == MK_GEMMA4) return mk_config_gemma4(s);
    if (s->arch == MK_BITNET) return mk_config_bitnet(s);
    cJSON *c = mk_config_shape(s);
    int moe = s->experts > 0, qwen = s->arch != MK_LLAMA, hf5 = s->arch >= MK_QWEN3_MOE;
    cJSON_AddNumberToObject(c, "rms_norm_eps", hf5 ? 1e-6 : 1e-5);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddFalseToObject(c, "tie_word_embeddings");
    cJSON_AddNumberToObject(c, "eos_token_id", s->eos);
    cJSON *rp = cJSON_AddObjectToObject(c, "rope_parameters");
    cJSON_AddNumberToObject(rp, "rope_theta", is_hybrid(s) ? 1e7 : qwen ? 1e6 : 500000.0);
    cJSON_AddStringToObject(rp, "rope_type", qwen ? "default" : "llama3");
    if (!qwen) {
        cJSON_AddNumberToObject(rp, "factor", 8.0);
        cJSON_AddNumberToObject(rp, "low_freq_factor", 1.0);
        cJSON_AddNumberToObject(rp, "high_freq_factor", 4.0);
        cJSON_AddNumberToObject(rp, "original_max_position_embeddings", 8192);
    }
    if (!hf5) {
        cJSON_AddNumberToObject(c, "bos_token_id", s->bos);
        cJSON_AddStringToObject(c, "torch_dtype", "bfloat16");
    } else {
        cJSON_AddFalseToObject(c, "attention_bias");
        cJSON_AddNumberToObject(c, "attention_dropout", 0.0);
        cJSON_AddNullToObject(c, "bos_token_id");
        cJSON_AddNullToObject(c, "pad_token_id");
        cJSON_AddStringToObject(c, "dtype", "bfloat16");
        cJSON_AddNumberToObject(c, "initializer_range", 0.02);
        cJSON_AddStringToObject(c, "transformers_version", "5.17.0");
        cJSON_AddTrueToObject(c, "use_cache");
    }
    if (moe) {
        cJSON_AddNumberToObject(c, "moe_intermediate_size", (double)s->expert_ffn);
        cJSON_AddNumberToObject(c, "num_experts_per_tok", (double)s->top_k);
        cJSON_AddFalseToObject(c, "output_router_logits");
        cJSON_AddNumberToObject(c, "router_aux_loss_coef", 0.001);
    }
    if (s->arch == MK_QWEN3_MOE) {
        cJSON_AddNumberToObject(c, "num_local_experts", (double)s->experts);
        cJSON_AddNumberToObject(c, "decoder_sparse_step", 1);
        cJSON_AddArrayToObject(c, "mlp_only_layers");
        cJSON_AddTrueToObject(c, "norm_topk_prob");
        cJSON_AddNullToObject(c, "sliding_window");
        cJSON_AddFalseToObject(c, "use_sliding_window");
    }
    if (is_hybrid(s)) {
        if (moe) {
            cJSON_AddNumberToObject(c, "num_experts", (double)s->experts);
            cJSON_AddNumberToObject(c, "shared_expert_intermediate_size", (double)s->shared_ffn);
        }
        cJSON *lt = cJSON_AddArrayToObject(c, "layer_types");
        for (long l = 0; l < s->layers; l++)
            cJSON_AddItemToArray(lt, cJSON_CreateString(is_linear_layer(s, l) ? "linear_attention"
                                                                              : "full_attention"));
        cJSON_AddNumberToObject(c, "linear_conv_kernel_dim", (double)s->conv_k);
        cJSON_AddNumberToObject(c, "linear_key_head_dim", (double)s->lk_dim);
        cJSON_AddNumberToObject(c, "linear_num_key_heads", (double)s->lk_heads);
        cJSON_AddNumberToObject(c, "linear_num_value_heads", (double)s->lv_heads);
        cJSON_AddNumberToObject(c, "linear_value_head_dim", (double)s->lv_dim);
        if (s->mtp) cJSON_AddNumberToObject(c, "mtp_num_hidden_layers", (double)s->mtp);
        cJSON_AddNumberToObject(c, "partial_rotary_factor", 0.25);
        cJSON_AddNumberToObject(rp, "partial_rotary_factor", 0.25);
    }
    sort_keys(c);
    if (m->f.bits != 16) {
        for (int i = 0; i < 2; i++) {
            cJSON *q = cJSON_AddObjectToObject(c, i ? "quantization_config" : "quantization");
            cJSON_AddNumberToObject(q, "group_size", m->f.group);
            cJSON_AddNumberToObject(q, "bits", m->f.bits);
            if (!strcmp(m->f.format, "mxfp4") || !strcmp(m->f.format, "mxfp8"))
                cJSON_AddStringToObject(q, "mode", m->f.format);
            for (cJSON *o = m->overrides->child; o; o = o->next)
                cJSON_AddItemToObject(q, o->string, cJSON_Duplicate(o, 1));
        }
    }
    return c;
}

static const char usage[] =
    "usage: pagoda bench make-model --arch "
    "llama|qwen3|qwen3_moe|qwen3_5|qwen3_5_moe|gemma4|bitnet\n"
    "         --hidden H --layers L --heads A --kv-heads K [--head-dim D] --ffn F --vocab V\n"
    "         --format bf16|mlx4|mlx8|mxfp4|mxfp8 [--context N] [--seed S]\n"
    "         [--tokenizer DIR]   (default: a byte-level BPE of --vocab ids)\n"
    "         [--experts E --experts-per-tok K --expert-ffn I --shared-expert-ffn S]\n"
    "         [--full-attention-interval N --linear-key-heads N --linear-value-heads N\n"
    "          --linear-key-dim N --linear-value-dim N --conv-kernel N\n"
    "          --mtp-layers N (a multi-token-prediction module, mtp.*)]\n"
    "         [gemma4: --global-head-dim D --global-kv-heads K --sliding-window W\n"
    "          --per-layer-dim P --kv-shared-layers S --k-eq-v 0|1] OUT\n";

/* Checks the shape against the architecture and the format's group size; 0 or a message. */
static const char *check_shape(const struct mk_shape *s, const struct mm_spec *f, int moe_flags,
                               int hybrid_flags, int gemma4_flags)
{
    int gemma4 = s->arch == MK_GEMMA4;
    int moe_arch = s->arch == MK_QWEN3_MOE || s->arch == MK_QWEN3_5_MOE || gemma4;
    if (moe_flags && !moe_arch)
        return "--experts and its options need --arch qwen3_moe, qwen3_5_moe or gemma4";
    if (hybrid_flags && !is_hybrid(s) && !(gemma4 && hybrid_flags == 1))
        return "--full-attention-interval and the linear-attention options need --arch qwen3_5 "
               "or qwen3_5_moe (gemma4 takes --full-attention-interval)";
    if (gemma4_flags && !gemma4) return "the Gemma 4 options need --arch gemma4";
    if (s->arch == MK_BITNET) {
        if (f->group)
            return "BitNet checkpoints are made packed with a bf16 embedding (--format bf16)";
        if ((s->heads * s->head_dim) % 4 || (s->kv_heads * s->head_dim) % 4 || s->hidden % 4 ||
            s->ffn % 4)
            return "BitNet packs four output rows a byte: hidden, heads * head-dim, kv-heads * "
                   "head-dim and ffn must be multiples of 4";
    }
    if (gemma4) {
        if (f->group) return "Gemma 4 checkpoints are made in bf16 only";
        if (s->global_head_dim % 2 || s->global_head_dim > 512 || s->head_dim > 512)
            return "head sizes must be even and at most 512";
        if (s->heads % s->global_kv_heads) return "--heads must be a multiple of --global-kv-heads";
        if (s->kv_shared >= s->layers - s->full_every + 1 && s->kv_shared)
            return "--kv-shared-layers must leave a full and a sliding layer before it";
        if (s->experts && s->top_k > s->experts)
            return "--experts-per-tok must be at most --experts";
    }
    if (s->heads % s->kv_heads) return "--heads must be a multiple of --kv-heads";
    if (s->head_dim % 2) return "--head-dim must be even";
    if (moe_arch && !gemma4 && s->top_k > s->experts)
        return "--experts-per-tok must be at most --experts";
    if (s->arch == MK_QWEN3_MOE && s->shared_ffn)
        return "Qwen3-MoE has no shared expert (--shared-expert-ffn 0)";
    if (is_hybrid(s)) {
        if (s->lv_heads % s->lk_heads)
            return "--linear-value-heads must be a multiple of --linear-key-heads";
        if (s->conv_k > 16) return "--conv-kernel must be at most 16";
        if (s->head_dim % 8) return "--head-dim must be a multiple of 8 (rotary quarter, even)";
    }
    if (!f->group) return NULL;
    /* every product's input width must split into whole groups (the 8-bit routers' too) */
    long ks[] = {s->hidden,
                 s->heads * s->head_dim,
                 s->ffn,
                 moe_arch ? s->expert_ffn : s->hidden,
                 s->shared_ffn ? s->shared_ffn : s->hidden,
                 is_hybrid(s) ? s->lv_heads * s->lv_dim : s->hidden};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        if (ks[i] % f->group)
            return "every product's input width (hidden, heads * head-dim, ffn, expert-ffn, "
                   "shared-expert-ffn, linear value heads * dim) must be a multiple of the "
                   "format's group size";
    if (moe_arch && s->hidden % router_spec.group)
        return "--hidden must be a multiple of 64 (the routers' 8-bit groups)";
    return NULL;
}

/* The tokenizer's fit and special ids, before anything is written: a --tokenizer DIR must
 * load and have no more ids than the model; a generated one needs TOK_GEN_MIN_VOCAB ids.
 * 0, or 2 with a message. */
static int check_tokenizer(struct mk_shape *s)
{
    s->eos2 = -1;
    if (!s->tokenizer) {
        if (s->vocab < TOK_GEN_MIN_VOCAB) {
            fprintf(stderr,
                    "pagoda bench make-model: --vocab must be at least %d for the byte-level "
                    "tokenizer (256 bytes and 4 special tokens), or give --tokenizer DIR\n",
                    TOK_GEN_MIN_VOCAB);
            return 2;
        }
        s->bos = tok_gen_bos_id((int32_t)s->vocab);
        s->eos = tok_gen_eos_id((int32_t)s->vocab);
        s->eos2 = tok_gen_end_of_text_id((int32_t)s->vocab);
        return 0;
    }
    struct err e = {0};
    struct tok *t = tok_load(s->tokenizer, &e);
    if (!t) {
        fprintf(stderr, "pagoda bench make-model: --tokenizer %s: %s\n", s->tokenizer, e.msg);
        return 2;
    }
    int32_t n = tok_vocab_size(t);
    s->bos = tok_bos_id(t);
    s->eos = tok_eos_id(t);
    tok_destroy(t);
    if (n > s->vocab) {
        fprintf(stderr,
                "pagoda bench make-model: the tokenizer in %s has %d ids, more than the model's "
                "--vocab %ld (give --vocab %d or more)\n",
                s->tokenizer, n, s->vocab, n);
        return 2;
    }
    if (s->eos < 0) {
        fprintf(stderr,
                "pagoda bench make-model: --tokenizer %s: tokenizer_config.json names no "
                "eos_token\n",
                s->tokenizer);
        return 2;
    }
    return 0;
}

/* Copies DIR/name into OUT when it exists (required: it must); 0 or 1 with a message. */
static int copy_file(const char *dir, const char *out, const char *name, int required)
{
    char from[4096], to[4096];
    snprintf(from, sizeof from, "%s/%s", dir, name);
    snprintf(to, sizeof to, "%s/%s", out, name);
    struct stat sb;
    if (stat(from, &sb) != 0 && !required) return 0;
    struct err e = {0};
    size_t len = 0;
    char *data = util_read_file(from, &len, &e);
    if (!data) {
        fprintf(stderr, "pagoda bench make-model: %s\n", e.msg);
        return 1;
    }
    FILE *f = fopen(to, "wb");
    int bad = !f || fwrite(data, 1, len, f) != len;
    if ((f && fclose(f) != 0) || bad) {
        fprintf(stderr, "pagoda bench make-model: %s: cannot write\n", to);
        bad = 1;
    }
    free(data);
    return bad;
}

static int write_text(const char *out, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out, name);
    FILE *fp = fopen(path, "w");
    int bad = !fp || fputs(text, fp) < 0;
    if ((fp && fclose(fp) != 0) || bad) {
        fprintf(stderr, "pagoda: %s: cannot write\n", path);
        return 1;
    }
    return 0;
}

/* The tokenizer files and generation_config.json (BOS and EOS ids; a generated tokenizer
 * stops at <|end_of_text|> and <|im_end|>). 0 or 1 with a message. */
static int write_tokenizer(const struct mk_shape *s, const char *out)
{
    if (s->tokenizer) {
        static const char *const files[] = {"tokenizer.json", "tokenizer_config.json",
                                            "special_tokens_map.json", "generation_config.json"};
        for (int i = 0; i < 4; i++)
            if (copy_file(s->tokenizer, out, files[i], i == 0)) return 1;
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/generation_config.json", s->tokenizer);
        if (stat(path, &sb) == 0) return 0;
    } else {
        struct err e = {0};
        if (tok_gen_write(out, (int32_t)s->vocab, &e) != 0) {
            fprintf(stderr, "pagoda bench make-model: %s\n", e.msg);
            return 1;
        }
    }
    cJSON *g = cJSON_CreateObject();
    if (s->bos >= 0) cJSON_AddNumberToObject(g, "bos_token_id", s->bos);
    if (s->eos2 >= 0) {
        int ids[2] = {s->eos2, s->eos};
        cJSON_AddItemToObject(g, "eos_token_id", cJSON_CreateIntArray(ids, 2));
    } else {
        cJSON_AddNumberToObject(g, "eos_token_id", s->eos);
    }
    char *text = cJSON_Print(g);
    cJSON_Delete(g);
    int rc = write_text(out, "generation_config.json", text);
    free(text);
    return rc;
}

/* Parses the flags into s and f; 0, or 2 after a usage message. */
static int parse_flags(int argc, char **argv, struct mk_shape *s, struct mm_spec *f,
                       const char **out)
{
    const char *arch = "llama", *format = "bf16";
    long head_dim = 0, shared = -1;
    *s = (struct mk_shape){.hidden = 2048,
                           .layers = 16,
                           .heads = 32,
                           .kv_heads = 8,
                           .ffn = 8192,
                           .vocab = 32000,
                           .ctx = 4096,
                           .seed = 1,
                           .experts = 64,
                           .top_k = 8,
                           .expert_ffn = 512,
                           .full_every = 4,
                           .lk_heads = 16,
                           .lv_heads = 32,
                           .lk_dim = 128,
                           .lv_dim = 128,
                           .conv_k = 4,
                           .global_head_dim = 512,
                           .window = 512,
                           .ple_dim = 256};
    int moe_flags = 0, hybrid_flags = 0, gemma4_flags = 0, interval_given = 0;
    *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (a[0] != '-') {
            *out = a;
            continue;
        }
        if (!(v = arg_value(argc, argv, &i))) return 2;
        static const struct {
            const char *flag;
            size_t off;
            long lo;
            int group; /* 1: MoE, 2: hybrid, 3: Gemma 4, 4: hybrid or Gemma 4 */
        } opts[] = {
            {"--hidden", offsetof(struct mk_shape, hidden), 1, 0},
            {"--layers", offsetof(struct mk_shape, layers), 1, 0},
            {"--heads", offsetof(struct mk_shape, heads), 1, 0},
            {"--kv-heads", offsetof(struct mk_shape, kv_heads), 1, 0},
            {"--ffn", offsetof(struct mk_shape, ffn), 1, 0},
            {"--vocab", offsetof(struct mk_shape, vocab), 1, 0},
            {"--context", offsetof(struct mk_shape, ctx), 1, 0},
            {"--seed", offsetof(struct mk_shape, seed), 1, 0},
            {"--experts", offsetof(struct mk_shape, experts), 1, 1},
            {"--experts-per-tok", offsetof(struct mk_shape, top_k), 1, 1},
            {"--expert-ffn", offsetof(struct mk_shape, expert_ffn), 1, 1},
            {"--full-attention-interval", offsetof(struct mk_shape, full_every), 1, 4},
            {"--linear-key-heads", offsetof(struct mk_shape, lk_heads), 1, 2},
            {"--linear-value-heads", offsetof(struct mk_shape, lv_heads), 1, 2},
            {"--linear-key-dim", offsetof(struct mk_shape, lk_dim), 1, 2},
            {"--linear-value-dim", offsetof(struct mk_shape, lv_dim), 1, 2},
            {"--conv-kernel", offsetof(struct mk_shape, conv_k), 1, 2},
            {"--mtp-layers", offsetof(struct mk_shape, mtp), 0, 2},
            {"--global-head-dim", offsetof(struct mk_shape, global_head_dim), 2, 3},
            {"--global-kv-heads", offsetof(struct mk_shape, global_kv_heads), 1, 3},
            {"--sliding-window", offsetof(struct mk_shape, window), 1, 3},
            {"--per-layer-dim", offsetof(struct mk_shape, ple_dim), 0, 3},
            {"--kv-shared-layers", offsetof(struct mk_shape, kv_shared), 0, 3},
            {"--k-eq-v", offsetof(struct mk_shape, k_eq_v), 0, 3},
        };
        size_t k = 0;
        while (k < sizeof opts / sizeof opts[0] && strcmp(a, opts[k].flag)) k++;
        if (k < sizeof opts / sizeof opts[0]) {
            if (arg_int(a, v, opts[k].lo, 1L << 30, (long *)((char *)s + opts[k].off))) return 2;
            moe_flags |= opts[k].group == 1;
            hybrid_flags |= opts[k].group == 2 ? 2 : opts[k].group == 4 ? 1 : 0;
            gemma4_flags |= opts[k].group == 3;
            interval_given |= opts[k].group == 4;
        } else if (!strcmp(a, "--head-dim")) {
            if (arg_int(a, v, 2, 1 << 16, &head_dim)) return 2;
        } else if (!strcmp(a, "--shared-expert-ffn")) {
            if (arg_int(a, v, 0, 1L << 30, &shared)) return 2;
            moe_flags = 1;
        } else if (!strcmp(a, "--arch")) {
            arch = v;
        } else if (!strcmp(a, "--format")) {
            format = v;
        } else if (!strcmp(a, "--tokenizer")) {
            s->tokenizer = v;
        } else {
            fprintf(stderr, "pagoda bench make-model: unknown option '%s'\n%s", a, usage);
            return 2;
        }
    }
    if (!*out) {
        fputs(usage, stderr);
        return 2;
    }
    size_t ai = 0;
    while (ai < sizeof arch_names / sizeof arch_names[0] && strcmp(arch, arch_names[ai].flag)) ai++;
    if (ai == sizeof arch_names / sizeof arch_names[0]) {
        fprintf(stderr, "pagoda bench make-model: --arch must be llama, qwen3, qwen3_moe, "
                        "qwen3_5, qwen3_5_moe, gemma4 or bitnet\n");
        return 2;
    }
    s->arch = (enum mk_arch)ai;
    static const struct mm_spec formats[] = {
        {"bf16", 16, 0}, {"mlx4", 4, 64}, {"mlx8", 8, 64}, {"mxfp4", 4, 32}, {"mxfp8", 8, 32}};
    size_t fi = 0;
    while (fi < 5 && strcmp(format, formats[fi].format)) fi++;
    if (fi == 5) {
        fprintf(stderr,
                "pagoda bench make-model: --format must be bf16, mlx4, mlx8, mxfp4 or mxfp8\n");
        return 2;
    }
    *f = formats[fi];
    if (!head_dim && s->hidden % s->heads) {
        fprintf(stderr, "pagoda bench make-model: --hidden is not a multiple of --heads (give "
                        "--head-dim)\n");
        return 2;
    }
    s->head_dim = head_dim ? head_dim : s->hidden / s->heads;
    int moe_arch = s->arch == MK_QWEN3_MOE || s->arch == MK_QWEN3_5_MOE;
    if (s->arch == MK_GEMMA4) { /* dense unless --experts says otherwise; full every 6th */
        moe_arch = moe_flags;
        if (!interval_given) s->full_every = 6;
        if (!s->global_kv_heads) s->global_kv_heads = s->kv_heads;
    }
    if (!moe_arch) s->experts = 0;
    /* Qwen3.5-MoE has a shared expert as wide as a routed one unless told otherwise. */
    s->shared_ffn = shared >= 0 ? shared : s->arch == MK_QWEN3_5_MOE ? s->expert_ffn : 0;
    const char *why = check_shape(s, f, moe_flags, hybrid_flags, gemma4_flags);
    if (why) {
        fprintf(stderr, "pagoda bench make-model: %s\n", why);
        return 2;
    }
    return check_tokenizer(s);
}

/* Checks that OUT's file system (its parent's, when OUT does not exist yet) has room for
 * `bytes`, then creates OUT (or takes an existing directory); 0 or 1 with a message. */
static int prepare_out(const char *out, size_t bytes)
{
    char where[4096];
    snprintf(where, sizeof where, "%s", out);
    struct stat sb;
    if (stat(where, &sb) != 0) {
        char *slash = strrchr(where, '/');
        if (!slash)
            snprintf(where, sizeof where, ".");
        else if (slash == where)
            where[1] = 0;
        else
            *slash = 0;
    }
    struct statvfs vs;
    if (statvfs(where, &vs) == 0) {
        double room = (double)vs.f_bavail * (double)vs.f_frsize;
        if (room < (double)bytes + (64 << 20)) {
            fprintf(stderr,
                    "pagoda bench make-model: %s has %.2f GB free, the checkpoint needs %.2f GB "
                    "(a tmpfs such as /dev/shm holds it in memory)\n",
                    where, room / 1e9, (double)bytes / 1e9);
            return 1;
        }
    }
    if (mkdir(out, 0755) != 0 && (stat(out, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        fprintf(stderr, "pagoda bench make-model: cannot create %s\n", out);
        return 1;
    }
    return 0;
}

int cli_bench_make_model(int argc, char **argv)
{
    struct mk_shape s;
    struct mk m = {0};
    const char *out;
    int rc = parse_flags(argc, argv, &s, &m.f, &out);
    if (rc) return rc;
    /* at most 3 tensors a linear layer: 3E + 9 a layer, with norms and vectors under 16 */
    m.cap = 24 + (int)(s.layers + s.mtp) * (3 * (3 * (int)s.experts + 9) + 16);
    m.pre = "model.";
    m.pool = xcalloc((size_t)m.cap, sizeof *m.pool);
    m.w = st_writer_create();
    m.tp = tp_create(0);
    m.overrides = cJSON_CreateObject();
    double t0 = util_now();
    mk_layers(&m, &s);
    char path[4096];
    struct err e = {0};
    rc = prepare_out(out, m.bytes);
    if (!rc) {
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        if (st_writer_write(m.w, path, m.f.bits == 16 ? "pt" : "mlx", &e)) {
            fprintf(stderr, "pagoda: %s\n", e.msg);
            rc = 1;
        }
    }
    st_writer_destroy(m.w);
    tp_destroy(m.tp);
    free(m.pool);
    if (!rc) {
        cJSON *c = mk_config(&s, &m);
        char *text = cJSON_Print(c);
        cJSON_Delete(c);
        rc = write_text(out, "config.json", text);
        free(text);
    }
    if (!rc) rc = write_tokenizer(&s, out);
    cJSON_Delete(m.overrides);
    if (!rc)
        printf("wrote %s (%s, %s, %d tensors, %.2f GB; tokenizer: %s) in %.1f s\n", out,
               arch_names[s.arch].hf, m.f.format, m.ntensors, (double)m.bytes / 1e9,
               s.tokenizer ? s.tokenizer : "byte-level BPE", util_now() - t0);
    return rc;
}
