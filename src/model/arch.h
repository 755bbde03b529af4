/*
 * arch: one descriptor per architecture (config.json's "architectures" name), grouped in one
 * file per family (arch_<family>.c) over the shared blocks of model/blocks.h. A family states
 * three things: its config fields and defaults, the tensors of its layers, and its layer stack.
 * model_load and model_forward do the rest (embedding, rope tables, final norm, head).
 *
 * Adding a family: an arch_<family>.c with its descriptors, their entry in arch.c's table,
 * any config fields it needs in struct model_config, and its goldens.
 */
#ifndef PAGODA_MODEL_ARCH_H
#define PAGODA_MODEL_ARCH_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

struct cJSON;
struct fwd_batch;
struct model;
struct model_config;

struct arch {
    const char *name;   /* config.json architectures[0], e.g. "LlamaForCausalLM" */
    const char *family; /* short name shown by `pagoda info` */
    /* Reads the family's fields of config.json after the common ones (config.c) and sets its
     * defaults: layer patterns when layer_types is absent, biases, norms, scales. 0 or -1. */
    int (*config)(struct model_config *c, const struct cJSON *root, struct err *e);
    /* Loads every layer's tensors into m->layers (allocated, n_layers zeroed entries). */
    int (*load)(struct model *m, struct err *e);
    /* The layer stack over one step: m->x [n_tokens, hidden] holds the embedded rows on entry
     * and the last layer's output on return. */
    void (*layers)(struct model *m, const struct fwd_batch *b);
    /* Its load and layers split attention heads and MLP width over a tensor-parallel group
     * (model/tp.h): blk_attn_load/blk_mlp_load/blk_moe_load load the rank's share and the layer
     * stack sums the partial outputs (blk_reduce). Families without it run at one rank only. */
    bool tensor_parallel;
};

/** The descriptor of an architecture name, or NULL when pagoda does not run it. */
const struct arch *arch_find(const char *name);
/** The config.json names of every supported architecture, ", "-separated, into buf[n]. */
void arch_list(char *buf, size_t n);

extern const struct arch arch_llama, arch_mistral, arch_qwen2, arch_qwen3;
extern const struct arch arch_gemma2, arch_gemma3, arch_gemma4, arch_gemma4_vl;
extern const struct arch arch_qwen3_moe;
extern const struct arch arch_bitnet;
extern const struct arch arch_qwen3_5, arch_qwen3_5_vl, arch_qwen3_5_moe, arch_qwen3_5_moe_vl;

/** Reads the routed-experts fields (num_experts or num_local_experts, num_experts_per_tok,
 * moe_intermediate_size, shared_expert_intermediate_size, norm_topk_prob, with
 * norm_default when absent, decoder_sparse_step, mlp_only_layers) into c->moe and
 * c->layer_moe. No num_experts: a dense model. */
int arch_moe_config(struct model_config *c, const struct cJSON *root, bool norm_default,
                    struct err *e);

#endif
