/*
 * head: a draft head that runs on a target model's hidden states, for speculative decoding.
 *
 * MTP (the multi-token-prediction module of Qwen3.5/3.6 checkpoints, tensors mtp.*): for a
 * row at position p it takes the target's final-normed hidden state h_p (the one that
 * predicted token p + 1) and the embedding of token p + 1, and predicts token p + 2:
 *
 *     x = fc([pre_fc_norm_embedding(embed(t_{p+1})), pre_fc_norm_hidden(h_p)])   [2H -> H]
 *     x = decoder layer (full attention, the target's MLP or experts) over the head's own KV
 *     y = norm(x);  logits = lm_head(y)                    (embedding and head: the target's)
 *
 * The next draft feeds y back as the hidden state of its row.
 *
 * EAGLE-3 (a head folder in the published Hugging Face layout, LlamaForCausalLMEagle3): the
 * target keeps the residual rows entering three of its layers (model_aux_alloc; by default
 * 2, n/2 and n - 3, or the config's eagle_aux_hidden_state_layer_ids), and
 *
 *     r = fc([a_low, a_mid, a_high])                          [3H -> H]  (target rows)
 *     a = attn([input_layernorm(embed(t_{p+1})), hidden_norm(r)])   q/k/v over 2H
 *     x = r + a;  x += mlp(post_attention_layernorm(x))             (midlayer.*)
 *     logits = lm_head(norm(x)) over the draft vocabulary; token = d + d2t[d]
 *
 * and the next draft feeds x (before the norm) back as r. The head's KV has the target's
 * block layout (a block id of the target's pool names the same positions here), so that
 * prefix caching and preemption need nothing of their own; blocks past the pool's are
 * scratch for draft rows beyond a request's blocks.
 *
 *     struct model_head *h = model_head_load_mtp(target, &e);
 *     model_head_alloc(h, max_tokens, max_logits, n_blocks, block_size, &e);
 *     model_head_forward(h, &batch, 1, target_rows);   // rows' hidden from the target's step
 *     model_argmax(h->m, batch.n_logits, picks);
 */
#ifndef PAGODA_MODEL_HEAD_H
#define PAGODA_MODEL_HEAD_H

#include "model/model.h"

enum head_kind { HEAD_MTP, HEAD_EAGLE3 };

struct model_head {
    enum head_kind kind;
    /* The head as a one-layer model: its layer, KV and step buffers; the target's embedding
     * (MTP: also its head and tensors, m->st then being the target's, not owned). */
    struct model *m;
    struct model *target;
    int own_st;
    struct qweight fc; /* MTP [hidden, 2 * hidden]; EAGLE-3 [hidden, 3 * hidden] */
    float *norm_e;     /* [hidden] pre_fc_norm_embedding (EAGLE-3: input_layernorm) */
    float *norm_h;     /* [hidden] pre_fc_norm_hidden (EAGLE-3: hidden_norm) */
    int32_t *d2t;      /* EAGLE-3: host [draft vocab] target id - draft id, else NULL */
    float *res;        /* EAGLE-3: [max_tokens, hidden] r */
    float *pair;       /* [3 * max_tokens, hidden]: the pieces of the rows cat joins */
    float *cat;        /* [max_tokens, 3 * hidden] joined rows */
    float *out;        /* [max_tokens, hidden] the fed-back state of the last forward's rows */
    int32_t *idx;      /* host [3 * max_tokens] the interleaving of pair into cat */
    int max_tokens;
};

/** The MTP module of the target's checkpoint (its tensors mtp.*). NULL + err when the
 * checkpoint has none, or a tensor is missing or misshapen (named). */
struct model_head *model_head_load_mtp(struct model *target, struct err *e);

/** The EAGLE-3 head in folder dir for the target (whose layer stack keeps the three layers'
 * rows once model_head_alloc ran). NULL + err naming the field or tensor at fault. */
struct model_head *model_head_load_eagle3(struct model *target, const char *dir, struct err *e);

/** The target's id of the head's pick d (EAGLE-3 maps its draft vocabulary). */
static inline int32_t model_head_token(const struct model_head *h, int32_t d)
{
    return h->d2t ? d + h->d2t[d] : d;
}

/** Step buffers for max_tokens rows (max_logits of them with logits) and KV storage of
 * n_blocks blocks of block_size tokens. 0, or -1 + err when out of memory. */
int model_head_alloc(struct model_head *h, int max_tokens, int max_logits, int n_blocks,
                     int block_size, struct err *e);

/** One step of the head over b (b->tokens: the token after each row's position). Row i's
 * hidden input is, with from_target, row src_rows[i] of the target's last step (read where
 * it lies, final-normed here), else row src_rows[i] of the head's own last forward. Logits
 * of b->logit_rows in h->m->logits (model_argmax reads them). */
void model_head_forward(struct model_head *h, const struct fwd_batch *b, int from_target,
                        const int32_t *src_rows);

void model_head_destroy(struct model_head *h);

#endif
