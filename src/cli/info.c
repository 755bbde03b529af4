/* info: what a model folder holds and what running it takes. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "kernels/cpu/cpu.h"
#include "model/arch.h"
#include "model/model.h"

/* Distinct weight formats of the model's matrices with their share of parameters. */
struct fmt_tally {
    char name[32];
    int64_t params;
    size_t bytes;
};

static void tally(struct fmt_tally *t, int *n, const struct qweight *w)
{
    char name[32];
    qweight_format_name(w, name, sizeof name);
    for (int i = 0; i < *n; i++)
        if (!strcmp(t[i].name, name)) {
            t[i].params += w->n * w->k;
            t[i].bytes += qweight_bytes(w);
            return;
        }
    snprintf(t[*n].name, sizeof t[*n].name, "%s", name);
    t[*n].params = w->n * w->k;
    t[*n].bytes = qweight_bytes(w);
    (*n)++;
}

/* Parameters a token multiplies: all but the experts it is not routed to. */
static int64_t active_params(const struct model *m)
{
    const struct moe_config *mc = &m->cfg.moe;
    int64_t n = model_param_count(m);
    for (int l = 0; l < m->cfg.n_layers && mc->n_experts; l++) {
        if (!m->cfg.layer_moe[l]) continue;
        const struct qweight *x = m->experts + (size_t)l * 3 * mc->n_experts;
        int64_t all = 0;
        for (int i = 0; i < 3 * mc->n_experts; i++) all += x[i].n * x[i].k;
        n -= all / mc->n_experts * (mc->n_experts - mc->top_k);
    }
    return n;
}

/* Bytes per token and tokens per GiB of each KV cache format (--kv-cache-dtype), blocks of
 * 16 tokens with their scales, every attention layer in the format. */
static void kv_formats(const struct model *m, int json)
{
    printf(json ? "\"kv_formats\": [" : "KV formats      tokens per GiB (bytes per token):");
    for (int d = KV_DTYPE_BF16; d < KV_DTYPE_COUNT; d++) {
        struct kv_spec s = {.k = (uint8_t)d, .v = (uint8_t)d};
        double per_tok = (double)model_kv_bytes_per_block(m, &s, 16) / 16.0;
        double per_gib = per_tok > 0 ? 1073741824.0 / per_tok : 0;
        if (json)
            printf("%s{\"dtype\": \"%s\", \"bytes_per_token\": %.2f, \"tokens_per_gib\": %.0f}",
                   d > KV_DTYPE_BF16 ? ", " : "", kv_dtype_name(d), per_tok, per_gib);
        else
            printf("%s %s %.0f (%.1f)", d > KV_DTYPE_BF16 ? "," : "", kv_dtype_name(d), per_gib,
                   per_tok);
    }
    printf(json ? "]" : "\n");
}

int cli_info(int argc, char **argv)
{
    const char *dir = NULL, *device = NULL;
    double util = 0.9;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--model")) {
            if (!(dir = arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--device")) {
            if (!(device = arg_value(argc, argv, &i))) return 2;
        } else if (!strcmp(argv[i], "--gpu-memory-utilization")) {
            const char *v = arg_value(argc, argv, &i);
            if (!v || arg_float(argv[i - 1], v, &util)) return 2;
            if (util <= 0 || util > 1) {
                fprintf(stderr, "pagoda info: --gpu-memory-utilization must be in (0, 1]\n");
                return 2;
            }
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: pagoda info --model DIR [--device D] [--gpu-memory-utilization F] "
                   "[--json]\n"
                   "  --device D                  the device whose memory plan is shown (cpu, "
                   "cuda, cuda:N;\n"
                   "                              default: cuda when a GPU is present)\n"
                   "  --gpu-memory-utilization F  share of GPU memory for weights, activations "
                   "and KV (0.9)\n");
            return 0;
        } else {
            fprintf(stderr, "pagoda info: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "pagoda info: --model DIR is required\n");
        return 2;
    }
    /* The model is read on the CPU backend (weights stay mapped); a GPU is only asked for
     * its name and memory. */
    struct err e = {0};
    struct backend dev;
    if (backend_create(&dev, device, 1, &e)) {
        fprintf(stderr, "pagoda: %s\n", e.msg);
        return 1;
    }
    struct backend_info bi;
    dev.ops->info(dev.ctx, &bi);
    int gpu = strcmp(dev.ops->name, "cpu") != 0;
    backend_destroy(&dev);
    struct backend be;
    backend_cpu_create(&be, 1, &e);
    struct model *m = model_load(dir, &be, &e);
    if (!m) {
        fprintf(stderr, "pagoda: %s\n", e.msg);
        backend_destroy(&be);
        return 1;
    }
    const struct model_config *c = &m->cfg;
    struct fmt_tally t[16];
    int nt = 0;
    for (int i = 0; i < m->tensors.n_linears; i++) tally(t, &nt, m->tensors.linears[i]);
    int64_t params = model_param_count(m);
    size_t wbytes = model_weight_bytes(m);
    size_t kv_tok = model_kv_bytes_per_token(m) / sizeof(float) * (size_t)bi.kv_value_bytes;
    size_t kv_ctx = kv_tok * (size_t)c->max_pos;
    /* Step buffers for a 512-token prefill step plus one row of logits. */
    size_t act = sizeof(float) * 512 *
                     (size_t)(3 * c->hidden + 2 * c->n_heads * c->max_head_dim + 2 * c->max_kv_dim +
                              2 * c->ffn) +
                 sizeof(float) * (size_t)c->vocab;
    double bpw = 8.0 * (double)wbytes / (double)params;
    /* The GPU plan: weights and activations resident, the rest of the allowed share is KV
     * blocks of 16 tokens. */
    size_t resident = wbytes + act + ((size_t)64 << 20); /* + library workspace, graphs */
    size_t budget = backend_kv_budget(&bi, util, resident);
    size_t kv_blocks = kv_tok ? budget / (kv_tok * 16) : 0;
    int sliding = 0, linear = 0, moe = 0;
    for (int l = 0; l < c->n_layers; l++) {
        sliding += c->layer_kinds[l] == LAYER_SLIDING;
        linear += c->layer_kinds[l] == LAYER_LINEAR;
        moe += c->layer_moe[l];
    }
    int64_t active = active_params(m);
    size_t state = model_state_bytes(m);
    if (json) {
        printf("{\"architecture\": \"%s\", \"family\": \"%s\", \"hidden_size\": %d, "
               "\"num_layers\": %d, \"num_heads\": %d, \"num_kv_heads\": %d, \"head_dim\": %d, "
               "\"intermediate_size\": %d, \"vocab_size\": %d, \"context_length\": %d, "
               "\"sliding_window\": %d, \"sliding_layers\": %d, \"rope_type\": \"%s\", "
               "\"rope_theta\": %g, \"tied_embeddings\": %s, \"parameters\": %lld, "
               "\"active_parameters\": %lld, \"weight_bytes\": %zu, \"bits_per_weight\": %.3f, "
               "\"rotary_dim\": %d, ",
               c->arch_name, c->arch->family, c->hidden, c->n_layers, c->n_heads, c->n_kv_heads,
               c->head_dim, c->ffn, c->vocab, c->max_pos, c->sliding_window, sliding,
               config_rope_type_name(c->rope_full.type), c->rope_full.theta,
               m->lm_head.w == m->embed.w ? "true" : "false", (long long)params, (long long)active,
               wbytes, bpw, c->rope_dim);
        if (moe)
            printf("\"experts\": {\"layers\": %d, \"num_experts\": %d, \"experts_per_token\": %d, "
                   "\"expert_ffn\": %d, \"shared_expert_ffn\": %d}, ",
                   moe, c->moe.n_experts, c->moe.top_k, c->moe.inner, c->moe.shared_inner);
        if (linear)
            printf("\"linear_attention\": {\"layers\": %d, \"key_heads\": %d, \"value_heads\": "
                   "%d, \"key_dim\": %d, \"value_dim\": %d, \"conv_kernel\": %d, "
                   "\"state_bytes_per_sequence\": %zu}, ",
                   linear, c->lin.n_k_heads, c->lin.n_v_heads, c->lin.k_dim, c->lin.v_dim,
                   c->lin.conv_k, state);
        printf("\"formats\": [");
        for (int i = 0; i < nt; i++)
            printf("%s{\"format\": \"%s\", \"parameters\": %lld, \"bits_per_weight\": %.3f}",
                   i ? ", " : "", t[i].name, (long long)t[i].params,
                   8.0 * (double)t[i].bytes / (double)t[i].params);
        printf("], ");
        kv_formats(m, 1);
        printf(", \"memory\": {\"weights\": %zu, \"kv_per_token\": %zu, "
               "\"state_per_sequence\": %zu, \"kv_full_context\": %zu, \"activations\": %zu, "
               "\"total\": %zu}, "
               "\"device\": {\"name\": \"%s\", \"memory\": %zu, \"free\": %zu, "
               "\"kv_value_bytes\": %d, \"cpu_kernels\": \"%s\"",
               wbytes, kv_tok, state, kv_ctx, act, wbytes + kv_ctx + state + act, bi.device,
               bi.mem_total, bi.mem_free, bi.kv_value_bytes, cpu_isa_name(cpu_isa_get()));
        if (gpu)
            printf(", \"gpu_memory_utilization\": %.3f, \"kv_pool_bytes\": %zu, "
                   "\"kv_blocks\": %zu, \"kv_tokens\": %zu",
                   util, budget, kv_blocks, kv_blocks * 16);
        printf("}}\n");
    } else {
        printf("architecture    %s (%s)\n", c->arch_name, c->arch->family);
        printf("dimensions      hidden %d, %d layers, %d heads / %d kv heads of %d, ffn %d\n",
               c->hidden, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn);
        printf("vocabulary      %d\n", c->vocab);
        printf("context         %d tokens", c->max_pos);
        if (sliding)
            printf(" (%d of %d layers use a %d-token window)", sliding, c->n_layers,
                   c->sliding_window);
        printf("\nrope            %s, theta %g", config_rope_type_name(c->rope_full.type),
               c->rope_full.theta);
        if (c->rope_dim < c->head_dim)
            printf(", %d of %d dimensions rotated", c->rope_dim, c->head_dim);
        printf("\n");
        int kv_shared = 0, other_heads = -1;
        for (int l = 0; l < c->n_layers; l++) {
            kv_shared += c->kv_source[l] != l;
            if (c->layer_head_dim[l] != c->head_dim) other_heads = l;
        }
        if (other_heads >= 0)
            printf("per layer       %s layers: %d kv heads of %d\n",
                   c->layer_kinds[other_heads] == LAYER_FULL ? "full" : "some",
                   c->layer_kv_heads[other_heads], c->layer_head_dim[other_heads]);
        if (kv_shared)
            printf("kv sharing      the last %d layers read earlier layers' KV and store none\n",
                   kv_shared);
        if (c->ple_dim) printf("per-layer input %d values a layer\n", c->ple_dim);
        if (linear)
            printf(
                "linear attn     %d of %d layers Gated DeltaNet: %d key / %d value heads of %d / "
                "%d, conv %d; state %.2f MiB per sequence\n",
                linear, c->n_layers, c->lin.n_k_heads, c->lin.n_v_heads, c->lin.k_dim, c->lin.v_dim,
                c->lin.conv_k, (double)state / 1048576.0);
        if (moe) {
            printf("experts         %d of %d layers: %d routed, %d per token, width %d", moe,
                   c->n_layers, c->moe.n_experts, c->moe.top_k, c->moe.inner);
            if (c->moe.shared_inner)
                printf("; shared expert %d\n", c->moe.shared_inner);
            else
                printf("; no shared expert\n");
        }
        printf("parameters      %lld (%.2f M)", (long long)params, (double)params / 1e6);
        if (active != params)
            printf(", %lld (%.2f M) active per token", (long long)active, (double)active / 1e6);
        printf("\n");
        printf("weights         %.2f MiB, %.2f bits per weight\n", (double)wbytes / 1048576.0, bpw);
        for (int i = 0; i < nt; i++)
            printf("  %-12s  %lld parameters, %.3f bits per weight\n", t[i].name,
                   (long long)t[i].params, 8.0 * (double)t[i].bytes / (double)t[i].params);
        printf("memory          weights %.2f MiB + KV %.2f MiB for the full context "
               "(%zu bytes/token, %s)",
               (double)wbytes / 1048576.0, (double)kv_ctx / 1048576.0, kv_tok,
               bi.kv_value_bytes == 2 ? "bf16" : "float32");
        if (state)
            printf(" + recurrent state %.2f MiB (%zu bytes/sequence, float32)",
                   (double)state / 1048576.0, state);
        printf(" + activations %.2f MiB = %.2f MiB\n", (double)act / 1048576.0,
               (double)(wbytes + kv_ctx + state + act) / 1048576.0);
        kv_formats(m, 0);
        printf("device          %s, %.2f GiB (%.2f GiB free)\n", bi.device,
               (double)bi.mem_total / 1073741824.0, (double)bi.mem_free / 1073741824.0);
        printf("cpu kernels     %s (available:", cpu_isa_name(cpu_isa_get()));
        for (int i = CPU_ISA_PORTABLE; i <= CPU_ISA_BEST; i++)
            if (cpu_isa_available((enum cpu_isa)i)) printf(" %s", cpu_isa_name((enum cpu_isa)i));
        printf("; PAGODA_CPU_ISA picks a lower one)\n");
        if (gpu)
            printf("memory plan     %.0f%% of the GPU: weights %.2f GiB + activations and "
                   "workspace %.2f GiB + KV pool %.2f GiB = %zu blocks of 16 tokens (%zu tokens)\n",
                   util * 100, (double)wbytes / 1073741824.0,
                   (double)(resident - wbytes) / 1073741824.0, (double)budget / 1073741824.0,
                   kv_blocks, kv_blocks * 16);
    }
    model_destroy(m);
    backend_destroy(&be);
    return 0;
}
