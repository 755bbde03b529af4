/*
 * BitNet loading: the three checkpoint layouts give the same ternary weights, each with the
 * scaling its linear class computes; MLX's conversion (same tensors, an F32 scale, "mlx"
 * metadata) computes bitwise what the packed original does; bad checkpoints give one clear
 * error; a backend without ternary products refuses the model when it loads. Fixtures are
 * rewritten copies of tests/golden/variants/bitnet-packed and bitnet-bf16 (run from the
 * repository root).
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
#include "test_util.h"

#define PACKED "tests/golden/variants/bitnet-packed"
#define MASTER "tests/golden/variants/bitnet-bf16"

static char tmp[4096];
static struct backend be;

/* One change to a copied checkpoint: tensor `name` replaced (data != NULL), or dropped. */
struct edit {
    const char *name;
    enum st_dtype dt;
    int ndim;
    int64_t shape[2];
    const void *data;
};

static void copy_fill(void *ctx, uint8_t *buf, size_t off, size_t n)
{
    memcpy(buf, (const uint8_t *)ctx + off, n);
}

/* A copy of folder `from` as tmp/name: config.json with quantization_config's `key` set to
 * `value` (key NULL: unchanged), the tensors with the edits applied. */
static const char *fixture(const char *name, const char *from, const char *key, const char *value,
                           const struct edit *ed, int ned, const char *meta)
{
    static char dir[8192];
    char p[8300];
    struct err e = {{0}};
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/config.json", from);
    char *text = util_read_file(p, NULL, &e);
    cJSON *cfg = cJSON_Parse(text);
    free(text);
    if (key) {
        cJSON *q = cJSON_GetObjectItem(cfg, "quantization_config");
        cJSON_ReplaceItemInObject(q, key, cJSON_CreateString(value));
    }
    char *out = cJSON_Print(cfg);
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    fputs(out, f);
    fclose(f);
    free(out);
    cJSON_Delete(cfg);

    struct safetensors st;
    memset(&st, 0, sizeof st);
    if (st_open(&st, from, &e)) {
        fprintf(stderr, "fixture: %s\n", e.msg);
        exit(1);
    }
    struct st_writer *w = st_writer_create();
    for (int i = 0; i < st.ntensors; i++) {
        const struct st_tensor *t = &st.tensors[i];
        const struct edit *x = NULL;
        for (int j = 0; j < ned; j++)
            if (!strcmp(ed[j].name, t->name)) x = &ed[j];
        if (x && !x->data) continue;
        if (x)
            st_writer_add(w, t->name, x->dt, x->ndim, x->shape, copy_fill, (void *)x->data);
        else
            st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, copy_fill, (void *)t->data);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    if (st_writer_write(w, p, meta, &e)) {
        fprintf(stderr, "fixture: %s\n", e.msg);
        exit(1);
    }
    st_writer_destroy(w);
    st_close(&st);
    return dir;
}

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
    printf("  %-26s -> %s\n", what, e.msg);
}

/* Logits of one forward step over a fixed prompt. */
static float *run(struct model *m)
{
    struct err e = {{0}};
    model_state_alloc(m, 8, 1, 1, 16, 0, &e);
    int32_t tok[4] = {5, 17, 300, 1999}, pos[4] = {0, 1, 2, 3}, slot[4] = {0, 1, 2, 3};
    int32_t qs[2] = {0, 4}, len[1] = {4}, bt[1] = {0}, rows[1] = {3};
    struct fwd_batch b = {4, tok,  pos,  slot, 1, qs,   len,  bt, 1,
                          1, rows, NULL, NULL, 0, NULL, NULL, 0};
    float *lg = xmalloc(sizeof(float) * (size_t)m->cfg.vocab);
    model_forward(m, &b, lg);
    return lg;
}

static struct model *load(const char *dir)
{
    struct err e = {{0}};
    struct model *m = model_load(dir, &be, &e);
    CHECK(m != NULL, "load %s: %s", dir, e.msg);
    return m;
}

/* The layer-0 q_proj of a loaded model. */
static const struct qweight *q0(const struct model *m)
{
    return &m->layers[0].attn.wq;
}

static void test_layouts(void)
{
    struct model *pk = load(PACKED), *ms = load(MASTER);
    if (!pk || !ms) return;
    CHECK(pk->cfg.bitnet == BITNET_OFFLINE_DIV && ms->cfg.bitnet == BITNET_ONLINE, "modes %d %d",
          pk->cfg.bitnet, ms->cfg.bitnet);
    /* The packed checkpoint was made from the same bf16 master by the reference's absmean
     * quantization: the master quantized here gives the same values, and its scale rounded
     * to bf16 is the stored weight_scale. */
    const struct qweight *lp[7], *lm[7];
    for (int l = 0; l < pk->cfg.n_layers; l++) {
        const struct model_layer *a = &pk->layers[l], *b = &ms->layers[l];
        const struct qweight *x[7] = {&a->attn.wq,  &a->attn.wk, &a->attn.wv, &a->attn.wo,
                                      &a->mlp.gate, &a->mlp.up,  &a->mlp.down};
        const struct qweight *y[7] = {&b->attn.wq,  &b->attn.wk, &b->attn.wv, &b->attn.wo,
                                      &b->mlp.gate, &b->mlp.up,  &b->mlp.down};
        memcpy(lp, x, sizeof x);
        memcpy(lm, y, sizeof y);
        for (int i = 0; i < 7; i++) {
            CHECK(lp[i]->fmt == WFMT_TERNARY && lm[i]->fmt == WFMT_TERNARY, "layer %d: formats", l);
            CHECK(lp[i]->n == lm[i]->n && lp[i]->row_bytes == lm[i]->row_bytes, "layer %d: shapes",
                  l);
            CHECK(!memcmp(lp[i]->w, lm[i]->w, (size_t)lp[i]->n * lp[i]->row_bytes),
                  "layer %d linear %d: the master's ternary values differ from the packed ones", l,
                  i);
            CHECK(bf16_to_f32(f32_to_bf16(lm[i]->t_div)) == lp[i]->t_div && lp[i]->t_mul == 1 &&
                      lm[i]->t_mul == 1,
                  "layer %d linear %d: scales %.9g (bf16 %.9g) vs %.9g", l, i, lm[i]->t_div,
                  bf16_to_f32(f32_to_bf16(lm[i]->t_div)), lp[i]->t_div);
        }
    }
    /* 2 bits a weight: 128 inputs in 32 bytes */
    CHECK(q0(pk)->row_bytes == 32 && q0(pk)->n == 128, "q_proj %lld rows of %zu bytes",
          (long long)q0(pk)->n, q0(pk)->row_bytes);

    /* autobitlinear offline: the same packed tensors, the product multiplied by the scale */
    struct model *mul =
        load(fixture("mul", PACKED, "linear_class", "autobitlinear", NULL, 0, NULL));
    if (mul) {
        CHECK(mul->cfg.bitnet == BITNET_OFFLINE_MUL, "mode %d", mul->cfg.bitnet);
        CHECK(q0(mul)->t_div == 1 && q0(mul)->t_mul == q0(pk)->t_div, "scales %g %g",
              q0(mul)->t_div, q0(mul)->t_mul);
        CHECK(!memcmp(q0(mul)->w, q0(pk)->w, 128 * 32), "values differ");
        model_destroy(mul);
    }

    /* MLX's conversion: the same tensors, written by MLX with an F32 weight_scale */
    struct edit ed[21];
    float scales[21];
    char names[21][96];
    static const char *const proj[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                        "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                        "mlp.down_proj"};
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < 7; i++) {
            int j = l * 7 + i;
            snprintf(names[j], sizeof names[j], "model.layers.%d.%s.weight_scale", l, proj[i]);
            const struct st_tensor *t = st_find(&pk->st, names[j]);
            scales[j] = bf16_to_f32(((const uint16_t *)t->data)[0]);
            ed[j] = (struct edit){names[j], ST_F32, 1, {1, 0}, &scales[j]};
        }
    struct model *mlx = load(fixture("mlx", PACKED, NULL, NULL, ed, 21, "mlx"));
    if (mlx) {
        float *a = run(pk), *b = run(mlx);
        CHECK(!memcmp(a, b, sizeof(float) * (size_t)pk->cfg.vocab),
              "the MLX copy computes other logits (%g vs %g)", a[0], b[0]);
        free(a);
        free(b);
        model_destroy(mlx);
    }
    model_destroy(pk);
    model_destroy(ms);
}

static void test_errors(void)
{
    const char *q = "model.layers.1.self_attn.q_proj";
    char w[128], s[128];
    snprintf(w, sizeof w, "%s.weight", q);
    snprintf(s, sizeof s, "%s.weight_scale", q);
    static uint8_t zeros[128 * 128], threes[32 * 128];
    memset(threes, 0xff, sizeof threes);
    float two[2] = {1, 2}, zero = 0;
    struct edit drop_scale = {s, ST_F32, 0, {0, 0}, NULL};
    expect_error("missing weight_scale",
                 fixture("noscale", PACKED, NULL, NULL, &drop_scale, 1, NULL), s, "missing");
    struct edit unpacked = {w, ST_U8, 2, {128, 128}, zeros};
    expect_error("unpacked U8 weight", fixture("unpacked", PACKED, NULL, NULL, &unpacked, 1, NULL),
                 "U8 [128, 128]", "expected U8 [32, 128]");
    struct edit code3 = {w, ST_U8, 2, {32, 128}, threes};
    expect_error("code 3", fixture("code3", PACKED, NULL, NULL, &code3, 1, NULL), w, "code 3");
    struct edit scale2 = {s, ST_F32, 1, {2, 0}, two};
    expect_error("two-value weight_scale", fixture("scale2", PACKED, NULL, NULL, &scale2, 1, NULL),
                 s, "expected one");
    struct edit scale0 = {s, ST_F32, 1, {1, 0}, &zero};
    expect_error("zero weight_scale", fixture("scale0", PACKED, NULL, NULL, &scale0, 1, NULL), s,
                 "finite nonzero");
    expect_error("bitlinear, online",
                 fixture("online", PACKED, "quantization_mode", "online", NULL, 0, NULL),
                 "bitlinear has no online mode", NULL);
    char autodir[8192];
    snprintf(autodir, sizeof autodir, "%s",
             fixture("auto", PACKED, "linear_class", "autobitlinear", NULL, 0, NULL));
    expect_error("packed weights, online",
                 fixture("auto-online", autodir, "quantization_mode", "online", NULL, 0, NULL),
                 "self_attn.q_proj.weight'", "expected float");
    expect_error("master weights, offline",
                 fixture("offline", MASTER, "quantization_mode", "offline", NULL, 0, NULL),
                 "self_attn.q_proj.weight'", "expected U8");
    expect_error("linear class", fixture("cls", PACKED, "linear_class", "binary", NULL, 0, NULL),
                 "linear_class 'binary'", NULL);
    expect_error("quantization mode",
                 fixture("mode", PACKED, "quantization_mode", "dynamic", NULL, 0, NULL),
                 "quantization_mode 'dynamic'", NULL);
}

/* A backend without ternary products (the CUDA backend today) refuses BitNet at load. */
static void test_refused(void)
{
    struct backend_ops ops = *be.ops;
    ops.bitnet = 0;
    struct backend nb = {&ops, be.ctx};
    struct err e = {{0}};
    struct model *m = model_load(PACKED, &nb, &e);
    CHECK(m == NULL, "a backend without ternary products loaded BitNet");
    if (m) model_destroy(m);
    CHECK(strstr(e.msg, "does not run yet") && strstr(e.msg, "BitNetForCausalLM"), "message: %s",
          e.msg);
    printf("  %-26s -> %s\n", "no ternary products", e.msg);
}

int main(void)
{
    if (access(PACKED "/model.safetensors", R_OK) || access(MASTER "/model.safetensors", R_OK)) {
        fprintf(stderr, "run from the repository root: %s is missing\n", PACKED);
        return 1;
    }
    snprintf(tmp, sizeof tmp, "/tmp/pagoda-test-bitnet-XXXXXX");
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    struct err e;
    backend_cpu_create(&be, 1, &e);
    test_layouts();
    test_errors();
    test_refused();
    backend_destroy(&be);
    char cmd[8300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    TEST_DONE();
}
