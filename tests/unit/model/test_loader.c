/*
 * Loader tests: each kind of bad model folder gives one clear error naming the file and
 * the tensor, never a crash; a sharded checkpoint loads and computes exactly what the
 * single-file one does. Fixtures are built from testdata/models/llama-tiny in a temp dir.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "model/model.h"
#include "model/st_writer.h"
#include "paged_kv/kv_quant.h"
#include "test_util.h"

static char src[4096], tmp[4096];
static struct backend be;

static void write_file(const char *dir, const char *name, const void *data, size_t n)
{
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) {
        perror(p);
        exit(1);
    }
    fwrite(data, 1, n, f);
    fclose(f);
}

static char *read_src(const char *name, size_t *n)
{
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", src, name);
    struct err e;
    char *d = util_read_file(p, n, &e);
    if (!d) {
        fprintf(stderr, "test data missing: %s\n", e.msg);
        exit(1);
    }
    return d;
}

/* A fresh fixture folder with llama-tiny's config and (optionally) its weights. */
static const char *fixture(const char *name, int with_weights)
{
    static char dir[8192];
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    mkdir(dir, 0755);
    size_t n;
    char *cfg = read_src("config.json", &n);
    write_file(dir, "config.json", cfg, n);
    free(cfg);
    if (with_weights) {
        char *w = read_src("model.safetensors", &n);
        write_file(dir, "model.safetensors", w, n);
        free(w);
    }
    return dir;
}

/* Loads dir and expects failure with every `want` substring in the message. */
static void expect_error(const char *what, const char *dir, const char *want1, const char *want2)
{
    struct err e = {{0}};
    struct model *m = model_load(dir, &be, &e);
    CHECK(m == NULL, "%s: loaded a bad folder", what);
    if (m) {
        model_destroy(m);
        return;
    }
    CHECK(strstr(e.msg, want1) != NULL, "%s: message '%s' lacks '%s'", what, e.msg, want1);
    if (want2)
        CHECK(strstr(e.msg, want2) != NULL, "%s: message '%s' lacks '%s'", what, e.msg, want2);
    CHECK(strchr(e.msg, '\n') == NULL, "%s: message spans lines", what);
    printf("  %-22s -> %s\n", what, e.msg);
}

/* Patches the safetensors header text: replaces `from` with `to` (same length). */
static void patched_weights(const char *dir, const char *from, const char *to)
{
    size_t n;
    char *w = read_src("model.safetensors", &n);
    char *p = memmem(w, n, from, strlen(from));
    if (!p || strlen(from) != strlen(to)) {
        fprintf(stderr, "fixture: '%s' not found in the header\n", from);
        exit(1);
    }
    memcpy(p, to, strlen(to));
    write_file(dir, "model.safetensors", w, n);
    free(w);
}

static void test_errors(void)
{
    expect_error("missing folder", "/nonexistent/model", "/nonexistent/model/config.json", NULL);
    expect_error("missing weights", fixture("noweights", 0), "no model.safetensors", NULL);

    const char *d = fixture("truncated", 0);
    size_t n;
    char *w = read_src("model.safetensors", &n);
    write_file(d, "model.safetensors", w, n - 1000);
    expect_error("truncated file", d, "model.safetensors: truncated", "model.");
    write_file(d, "model.safetensors", w, 5);
    expect_error("truncated header", d, "model.safetensors: truncated", NULL);
    free(w);

    d = fixture("corrupt", 0);
    write_file(d, "model.safetensors", "\x10\0\0\0\0\0\0\0{not json at al}", 24);
    expect_error("corrupt header", d, "model.safetensors: corrupt header", NULL);
    write_file(d, "model.safetensors", "\xff\xff\xff\xff\xff\0\0\0{}", 10);
    expect_error("absurd header length", d, "model.safetensors: corrupt header", NULL);

    d = fixture("dtype", 0);
    patched_weights(d, "\"BF16\"", "\"QF16\"");
    expect_error("unknown dtype", d, "unknown dtype 'QF16'", "tensor '");

    d = fixture("offsets", 0);
    patched_weights(d, "[2048,128]", "[2048,129]");
    expect_error("shape vs offsets", d, "needs", "data_offsets");

    d = fixture("shape", 1);
    char cfgp[8192];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", d);
    char *cfg = read_src("config.json", &n);
    char *pos = strstr(cfg, "\"intermediate_size\": 256");
    CHECK(pos != NULL, "fixture config has intermediate_size 256");
    if (pos) memcpy(pos, "\"intermediate_size\": 512", 24);
    write_file(d, "config.json", cfg, n);
    expect_error("shape mismatch", d, "model.layers.0.mlp.gate_proj.weight", "expected [512, 128]");
    free(cfg);

    d = fixture("arch", 1);
    cfg = read_src("config.json", &n);
    pos = strstr(cfg, "LlamaForCausalLM");
    if (pos) memcpy(pos, "LlamaForCausalXX", 16);
    write_file(d, "config.json", cfg, n);
    expect_error("unsupported arch", d, "config.json", "'LlamaForCausalXX' is not supported");
    expect_error("unsupported arch names the supported", d, "config.json",
                 "(supported: LlamaForCausalLM, MistralForCausalLM, ");
    free(cfg);

    d = fixture("badjson", 1);
    write_file(d, "config.json", "{\"architectures\": [", 19);
    expect_error("corrupt config", d, "config.json", "not a JSON object");

    d = fixture("missing-tensor", 0);
    patched_weights(d, "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.wXight");
    expect_error("missing tensor", d, "'model.layers.1.mlp.up_proj.weight' is missing",
                 "model.safetensors");
}

struct copy_ctx {
    const uint8_t *data;
};

static void copy_fill(void *ctx, uint8_t *buf, size_t off, size_t n)
{
    memcpy(buf, ((struct copy_ctx *)ctx)->data + off, n);
}

/* Logits of one forward step over a fixed prompt. */
static float *run(const char *dir, int *vocab)
{
    struct err e = {{0}};
    struct model *m = model_load(dir, &be, &e);
    CHECK(m != NULL, "load %s: %s", dir, e.msg);
    if (!m) return NULL;
    model_state_alloc(m, 8, 1, 1, 16, 1, &e);
    int32_t tok[4] = {5, 17, 300, 1999}, pos[4] = {0, 1, 2, 3}, slot[4] = {0, 1, 2, 3};
    int32_t qs[2] = {0, 4}, len[1] = {4}, bt[1] = {0}, rows[1] = {3}, state[1] = {0};
    struct fwd_batch b = {4, tok,  pos,  slot,  1, qs,   len,  bt, 1,
                          1, rows, NULL, state, 0, NULL, NULL, 0};
    *vocab = m->cfg.vocab;
    float *lg = xmalloc(sizeof(float) * (size_t)*vocab);
    model_forward(m, &b, lg);
    model_destroy(m);
    return lg;
}

static void test_sharded(void)
{
    const char *d = fixture("sharded", 0);
    char single[8192];
    snprintf(single, sizeof single, "%s", src);
    struct safetensors st;
    struct err e = {{0}};
    CHECK(st_open(&st, src, &e) == 0, "open source: %s", e.msg);
    /* Two shards: even-numbered tensors in the first, odd in the second. */
    struct st_writer *w[2] = {st_writer_create(), st_writer_create()};
    struct copy_ctx *cc = xcalloc((size_t)st.ntensors, sizeof *cc);
    char *index = xmalloc(1 << 20);
    size_t off = (size_t)snprintf(index, 1 << 20, "{\"metadata\": {}, \"weight_map\": {");
    for (int i = 0; i < st.ntensors; i++) {
        const struct st_tensor *t = &st.tensors[i];
        cc[i].data = t->data;
        st_writer_add(w[i % 2], t->name, t->dtype, t->ndim, t->shape, copy_fill, &cc[i]);
        off += (size_t)snprintf(index + off, (1 << 20) - off,
                                "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "",
                                t->name, i % 2 + 1);
    }
    snprintf(index + off, (1 << 20) - off, "}}");
    char p[8192];
    for (int s = 0; s < 2; s++) {
        snprintf(p, sizeof p, "%s/model-0000%d-of-00002.safetensors", d, s + 1);
        CHECK(st_writer_write(w[s], p, "pt", &e) == 0, "write shard: %s", e.msg);
        st_writer_destroy(w[s]);
    }
    write_file(d, "model.safetensors.index.json", index, strlen(index));
    int v1, v2;
    float *a = run(single, &v1), *b = run(d, &v2);
    CHECK(a && b && v1 == v2 && memcmp(a, b, sizeof(float) * (size_t)v1) == 0,
          "sharded logits differ from single-file logits");
    free(a);
    free(b);

    /* An index naming a tensor no shard holds. */
    char *bad = strstr(index, "\"model.norm.weight\"");
    CHECK(bad != NULL, "index names model.norm.weight");
    if (bad) memcpy(bad, "\"model.norm.wXight\"", 19);
    write_file(d, "model.safetensors.index.json", index, strlen(index));
    expect_error("index names missing", d,
                 "'model.norm.wXight' named by model.safetensors.index.json", NULL);
    write_file(d, "model.safetensors.index.json", "{\"weight_map\": 3}", 17);
    expect_error("corrupt index", d, "model.safetensors.index.json", "weight_map");
    free(index);
    free(cc);
    st_close(&st);
}

static void test_config_layouts(const char *testdata)
{
    struct model_config c;
    struct err e = {{0}};
    char dir[8192];
    /* rope_parameters with per-layer-type sets (Gemma 3) */
    snprintf(dir, sizeof dir, "%s/models/gemma3-tiny", testdata);
    CHECK(config_load(&c, dir, &e) == 0, "gemma3 config: %s", e.msg);
    CHECK(c.rope_full.theta == 1000000.0 && c.rope_sliding.theta == 10000.0, "gemma3 rope thetas");
    CHECK(c.layer_kinds[0] == LAYER_SLIDING && c.layer_kinds[2] == LAYER_FULL,
          "gemma3 layer kinds");
    CHECK(c.sliding_window == 16 && c.qk_norm && c.norm_plus_one, "gemma3 flags");
    CHECK(c.n_eos == 1 && c.eos_ids[0] == 1 && c.bos_id == 2, "gemma3 eos/bos");
    config_dispose(&c);
    /* rope_theta at the top level (older layout), sliding window on every layer */
    snprintf(dir, sizeof dir, "%s/models/mistral-tiny", testdata);
    CHECK(config_load(&c, dir, &e) == 0, "mistral config: %s", e.msg);
    CHECK(c.rope_full.theta == 10000.0 && c.rope_full.type == ROPE_DEFAULT, "mistral rope");
    CHECK(c.sliding_window == 24 && c.layer_kinds[0] == LAYER_SLIDING, "mistral window");
    config_dispose(&c);
    /* llama3 scaling inside rope_parameters */
    snprintf(dir, sizeof dir, "%s/models/llama-tiny", testdata);
    CHECK(config_load(&c, dir, &e) == 0, "llama config: %s", e.msg);
    CHECK(c.rope_full.type == ROPE_LLAMA3 && c.rope_full.factor == 8.0 &&
              c.rope_full.orig_max_pos == 64 && c.rope_full.theta == 500000.0,
          "llama3 rope parameters");
    config_dispose(&c);
    /* routed experts, with the router kept at 8 bits by a per-layer override (MLX) */
    snprintf(dir, sizeof dir, "%s/models/qwen3moe-tiny-mlx4", testdata);
    CHECK(config_load(&c, dir, &e) == 0, "qwen3moe config: %s", e.msg);
    CHECK(c.moe.n_experts == 8 && c.moe.top_k == 2 && c.moe.inner == 64 && c.moe.norm_topk &&
              c.moe.shared_inner == 0 && c.layer_moe[0] && c.layer_moe[2] && c.qk_norm,
          "qwen3moe experts");
    struct quant_spec rq = config_quant_for(&c, "model.layers.1.mlp.gate");
    CHECK(rq.bits == 8 && rq.group == 64 &&
              config_quant_for(&c, "model.layers.1.mlp.switch_mlp.up_proj").bits == 4,
          "qwen3moe router at 8 bits, experts at 4");
    config_dispose(&c);
    /* the hybrid stack: layer types, Gated DeltaNet shape, partial rotary, shared expert */
    snprintf(dir, sizeof dir, "%s/models/qwen3_5_moe-tiny", testdata);
    CHECK(config_load(&c, dir, &e) == 0, "qwen3_5_moe config: %s", e.msg);
    CHECK(c.layer_kinds[0] == LAYER_LINEAR && c.layer_kinds[1] == LAYER_LINEAR &&
              c.layer_kinds[2] == LAYER_FULL,
          "qwen3_5 layer kinds");
    CHECK(c.lin.n_k_heads == 2 && c.lin.n_v_heads == 4 && c.lin.k_dim == 32 && c.lin.v_dim == 32 &&
              c.lin.conv_k == 4,
          "qwen3_5 linear attention shape");
    CHECK(c.rope_dim == 8 && c.attn_gate && c.norm_plus_one && c.moe.shared_inner == 64 &&
              c.moe.n_experts == 8,
          "qwen3_5 rope %d, gate, norms, experts", c.rope_dim);
    config_dispose(&c);
    /* a model the CPU backend runs, refused where a backend lacks an operation it needs */
    {
        struct backend be;
        backend_cpu_create(&be, 1, &e);
        struct backend_ops ops = *be.ops;
        ops.delta_net = NULL;
        struct backend lacking = {&ops, be.ctx};
        struct model *m = model_load(dir, &lacking, &e);
        CHECK(m == NULL && strstr(e.msg, "needs Gated DeltaNet layers") &&
                  strstr(e.msg, "qwen3_5_moe-tiny"),
              "a missing operation refused at load: %s", e.msg);
        backend_destroy(&be);
    }
    const char *fx = fixture("quant", 0);
    const char *qcfg =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"num_hidden_layers\": 1,"
        "\"num_attention_heads\": 2, \"intermediate_size\": 128, \"vocab_size\": 10,"
        "\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, "
        "\"original_max_position_embeddings\": 2048},"
        "\"quantization\": {\"group_size\": 64, \"bits\": 4, \"model.layers.0.mlp.gate_proj\": "
        "{\"group_size\": 32, \"bits\": 8}, \"lm_head\": false}}";
    write_file(fx, "config.json", qcfg, strlen(qcfg));
    CHECK(config_load(&c, fx, &e) == 0, "quant config: %s", e.msg);
    struct quant_spec q = config_quant_for(&c, "model.layers.0.mlp.gate_proj");
    CHECK(q.mode == QMODE_AFFINE && q.bits == 8 && q.group == 32, "override %d %d %d", q.mode,
          q.bits, q.group);
    q = config_quant_for(&c, "model.layers.0.mlp.up_proj");
    CHECK(q.mode == QMODE_AFFINE && q.bits == 4 && q.group == 64, "default quant");
    CHECK(config_quant_for(&c, "lm_head").mode == QMODE_NONE, "lm_head unquantized");
    CHECK(c.rope_full.type == ROPE_YARN && c.rope_full.factor == 4.0 &&
              c.rope_full.orig_max_pos == 2048,
          "yarn in rope_scaling");
    CHECK(c.head_dim == 32 && c.n_kv_heads == 2, "defaults: head_dim, kv heads");
    config_dispose(&c);
}

static void copy_cb(void *ctx, uint8_t *buf, size_t off, size_t n)
{
    memcpy(buf, (const uint8_t *)ctx + off, n);
}

/* A multimodal checkpoint's text tower (...ForConditionalGeneration: the fields in
 * text_config, the tensors under a language_model prefix) computes exactly what the text
 * model does, in the Hugging Face and the MLX naming. */
static void test_text_tower(const char *testdata)
{
    static const char *const model[2] = {"qwen3_5_moe-tiny", "qwen3_5_moe-tiny-mlx8"};
    static const char *const body[2] = {"model.language_model.", "language_model.model."};
    static const char *const head[2] = {"lm_head", "language_model.lm_head"};
    for (int k = 0; k < 2; k++) {
        char orig[8192], dir[8192], path[8300];
        snprintf(orig, sizeof orig, "%s/models/%s", testdata, model[k]);
        snprintf(dir, sizeof dir, "%s/tower%d", tmp, k);
        mkdir(dir, 0755);
        snprintf(path, sizeof path, "%s/config.json", orig);
        char *text = util_read_file(path, NULL, NULL);
        cJSON *cfg = text ? cJSON_Parse(text) : NULL;
        free(text);
        CHECK(cfg != NULL, "%s: config.json", model[k]);
        if (!cfg) continue;
        cJSON *tc = cJSON_Duplicate(cfg, 1), *top = cJSON_CreateObject();
        cJSON_DeleteItemFromObject(tc, "quantization");
        cJSON_DeleteItemFromObject(tc, "quantization_config");
        cJSON *arch = cJSON_CreateArray();
        cJSON_AddItemToArray(arch, cJSON_CreateString("Qwen3_5MoeForConditionalGeneration"));
        cJSON_AddItemToObject(top, "architectures", arch);
        cJSON_AddItemToObject(top, "text_config", tc);
        if (cJSON_GetObjectItem(cfg, "quantization"))
            cJSON_AddItemToObject(top, "quantization",
                                  cJSON_Duplicate(cJSON_GetObjectItem(cfg, "quantization"), 1));
        char *out = cJSON_Print(top);
        write_file(dir, "config.json", out, strlen(out));
        free(out);
        cJSON_Delete(top);
        cJSON_Delete(cfg);
        struct safetensors st;
        struct err e = {{0}};
        CHECK(st_open(&st, orig, &e) == 0, "%s: %s", model[k], e.msg);
        struct st_writer *w = st_writer_create();
        char names[512][160];
        for (int i = 0; i < st.ntensors && i < 512; i++) {
            const struct st_tensor *t = &st.tensors[i];
            if (!strncmp(t->name, "model.", 6))
                snprintf(names[i], sizeof names[i], "%s%s", body[k], t->name + 6);
            else
                snprintf(names[i], sizeof names[i], "%s%s", head[k], t->name + 7);
            st_writer_add(w, names[i], t->dtype, t->ndim, t->shape, copy_cb, (void *)t->data);
        }
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK(st_writer_write(w, path, "pt", &e) == 0, "write %s: %s", path, e.msg);
        st_writer_destroy(w);
        st_close(&st);
        int va, vb;
        float *a = run(orig, &va), *b = run(dir, &vb);
        CHECK(a && b && va == vb && !memcmp(a, b, sizeof(float) * (size_t)va),
              "%s as a text tower (%s): other logits", model[k], body[k]);
        free(a);
        free(b);
    }
}

/* One scalar tensor's bytes for the KV-scale fixtures. */
struct scale_t {
    char name[96];
    enum st_dtype dt;
    int ndim;
    int64_t shape[1];
    uint8_t bytes[8];
};

/* llama-tiny with a KV scale tensor per layer (`which`: "k_scale", "v_scale" or "kv_scale")
 * of dtype dt and value v; ndim 0 is a scalar, else shape [n] with every value v. */
static const char *scaled_fixture(const char *name, const char *const *which, int n_which,
                                  enum st_dtype dt, float v, int n)
{
    const char *d = fixture(name, 0);
    struct safetensors st;
    struct err e = {{0}};
    CHECK(st_open(&st, src, &e) == 0, "open source: %s", e.msg);
    struct st_writer *w = st_writer_create();
    for (int i = 0; i < st.ntensors; i++) {
        const struct st_tensor *t = &st.tensors[i];
        st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, copy_cb, (void *)t->data);
    }
    static struct scale_t sc[3 * 3];
    int k = 0;
    for (int l = 0; l < 3; l++)
        for (int j = 0; j < n_which; j++, k++) {
            struct scale_t *s = &sc[k];
            snprintf(s->name, sizeof s->name, "model.layers.%d.self_attn.%s", l, which[j]);
            s->dt = dt;
            s->ndim = n > 1 ? 1 : 0;
            s->shape[0] = n;
            for (int i = 0; i < n && i < 2; i++) {
                if (dt == ST_F32)
                    memcpy(s->bytes + 4 * i, &v, 4);
                else {
                    uint16_t h = f32_to_bf16(v);
                    memcpy(s->bytes + 2 * i, &h, 2);
                }
            }
            st_writer_add(w, s->name, dt, s->ndim, s->shape, copy_cb, s->bytes);
        }
    char p[8300];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    CHECK(st_writer_write(w, p, "pt", &e) == 0, "write %s: %s", p, e.msg);
    st_writer_destroy(w);
    st_close(&st);
    return d;
}

/* Logits of run()'s prompt with the KV in format kd (0: auto); *ks / *vs get layer 0's
 * checkpoint scales as loaded. NULL when loading or sizing fails (msg gets the error). */
static float *run_kv(const char *dir, int kd, float *ks, float *vs, char *msg, size_t msg_n)
{
    struct err e = {{0}};
    struct model *m = model_load(dir, &be, &e);
    CHECK(m != NULL, "load %s: %s", dir, e.msg);
    if (!m) return NULL;
    struct kv_spec spec = {(uint8_t)kd, (uint8_t)kd, 0, {0}};
    float *lg = NULL;
    if (model_set_kv_format(m, &spec, &e) == 0 && model_state_alloc(m, 8, 1, 1, 16, 1, &e) == 0) {
        *ks = m->kvg[0].k_scale;
        *vs = m->kvg[0].v_scale;
        int32_t tok[4] = {5, 17, 300, 1999}, pos[4] = {0, 1, 2, 3}, slot[4] = {0, 1, 2, 3};
        int32_t qs[2] = {0, 4}, len[1] = {4}, bt[1] = {0}, rows[1] = {3}, state[1] = {0};
        struct fwd_batch b = {4, tok,  pos,  slot,  1, qs,   len,  bt, 1,
                              1, rows, NULL, state, 0, NULL, NULL, 0};
        lg = xmalloc(sizeof(float) * (size_t)m->cfg.vocab);
        model_forward(m, &b, lg);
    } else if (msg)
        snprintf(msg, msg_n, "%s", e.msg);
    model_destroy(m);
    return lg;
}

static float max_diff(const float *a, const float *b, int n)
{
    float d = 0;
    for (int i = 0; i < n; i++) d = fmaxf(d, fabsf(a[i] - b[i]));
    return d;
}

/* A checkpoint's fp8 KV scales (llm-compressor / vLLM: self_attn.k_scale and v_scale, or
 * the older single kv_scale) are loaded exactly and replace the per-token scales; formats
 * other than fp8 and unusable values ignore them; a per-head scale is refused. */
static void test_kv_scales(void)
{
    static const char *const kv[2] = {"k_scale", "v_scale"}, *const one[1] = {"kv_scale"};
    int vocab = 0;
    float *ref = run(src, &vocab);
    float ks = -1, vs = -1, ks2, vs2;
    float *plain = run_kv(src, KV_DTYPE_FP8, &ks, &vs, NULL, 0);
    CHECK(ks == 0 && vs == 0, "no checkpoint scale: %g %g", (double)ks, (double)vs);

    /* 0.0625 is exact in bf16; 0.3 is not (its bf16 value is 0.30078125) */
    float *f32 = run_kv(scaled_fixture("kvscale-f32", kv, 2, ST_F32, 0.0625f, 1), KV_DTYPE_FP8, &ks,
                        &vs, NULL, 0);
    CHECK(ks == 0.0625f && vs == 0.0625f, "F32 scales: %g %g", (double)ks, (double)vs);
    float *bf = run_kv(scaled_fixture("kvscale-bf16", one, 1, ST_BF16, 0.3f, 1), KV_DTYPE_FP8, &ks2,
                       &vs2, NULL, 0);
    CHECK(ks2 == 0.30078125f && vs2 == 0.30078125f, "BF16 kv_scale: %g %g", (double)ks2,
          (double)vs2);
    if (ref && plain && f32 && bf) {
        /* The fixed scales are used: other codes, so other logits than the per-token
         * scales give; both stay near the float32 KV (tolerance: fp8 keeps 3 mantissa
         * bits, |e| <= |x| / 16; on this model the logits move by 0.12 to 0.16 under it). */
        CHECK(memcmp(plain, f32, sizeof(float) * (size_t)vocab) != 0,
              "k_scale/v_scale changed nothing");
        CHECK(memcmp(f32, bf, sizeof(float) * (size_t)vocab) != 0, "kv_scale changed nothing");
        float d1 = max_diff(ref, plain, vocab), d2 = max_diff(ref, f32, vocab),
              d3 = max_diff(ref, bf, vocab);
        printf("  fp8 KV against float32: per-token %.4g, k/v_scale %.4g, kv_scale %.4g\n",
               (double)d1, (double)d2, (double)d3);
        CHECK(d1 < 0.25f && d2 < 0.25f && d3 < 0.25f, "fp8 logits off by %g %g %g", (double)d1,
              (double)d2, (double)d3);
    }
    /* A scale so large that every code rounds to zero: K and V vanish, so attention reads
     * zeros and the logits are those of a model whose attention outputs nothing; it is
     * enough here that they are far from the float32 ones (the scale is really applied). */
    float *huge = run_kv(scaled_fixture("kvscale-huge", kv, 2, ST_F32, 1e30f, 1), KV_DTYPE_FP8, &ks,
                         &vs, NULL, 0);
    CHECK(ks == 1e30f && huge && ref && max_diff(ref, huge, vocab) > 0.05f,
          "a huge scale left the logits near float32");

    /* Unusable values fall back to per-token scales: bitwise the plain fp8 logits. */
    float *neg = run_kv(scaled_fixture("kvscale-neg", kv, 2, ST_F32, -1.0f, 1), KV_DTYPE_FP8, &ks,
                        &vs, NULL, 0);
    CHECK(ks == 0 && vs == 0 && neg && plain && !memcmp(neg, plain, sizeof(float) * (size_t)vocab),
          "a negative scale was not ignored");
    float *nan = run_kv(scaled_fixture("kvscale-nan", kv, 2, ST_F32, NAN, 1), KV_DTYPE_FP8, &ks,
                        &vs, NULL, 0);
    CHECK(ks == 0 && nan && plain && !memcmp(nan, plain, sizeof(float) * (size_t)vocab),
          "a NaN scale was not ignored");

    /* int8 KV ignores fp8 scales: bitwise the int8 logits without them. */
    float *i8 = run_kv(src, KV_DTYPE_INT8, &ks, &vs, NULL, 0);
    float *i8s = run_kv(scaled_fixture("kvscale-int8", kv, 2, ST_F32, 0.0625f, 1), KV_DTYPE_INT8,
                        &ks, &vs, NULL, 0);
    CHECK(ks == 0 && i8 && i8s && !memcmp(i8, i8s, sizeof(float) * (size_t)vocab),
          "int8 KV read the fp8 scales");

    /* Per-head scales: a clear error naming the tensor. */
    char msg[1024] = "";
    float *ph = run_kv(scaled_fixture("kvscale-head", kv, 2, ST_F32, 0.0625f, 2), KV_DTYPE_FP8, &ks,
                       &vs, msg, sizeof msg);
    CHECK(ph == NULL && strstr(msg, "model.layers.0.self_attn.k_scale") && strstr(msg, "2 values"),
          "per-head scales: '%s'", msg);
    printf("  per-head scale -> %s\n", msg);
    float *all[] = {ref, plain, f32, bf, huge, neg, nan, i8, i8s, ph};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

int main(int argc, char **argv)
{
    const char *testdata = argc > 1 ? argv[1] : "../shared/testdata";
    snprintf(src, sizeof src, "%s/models/llama-tiny", testdata);
    if (access(src, R_OK) != 0) {
        fprintf(stderr, "test data missing: %s\n", src);
        return 1;
    }
    snprintf(tmp, sizeof tmp, "/tmp/pagoda-test-loader-XXXXXX");
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    struct err e;
    backend_cpu_create(&be, 1, &e);
    test_errors();
    test_sharded();
    test_config_layouts(testdata);
    test_text_tower(testdata);
    test_kv_scales();
    backend_destroy(&be);
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    TEST_DONE();
}
