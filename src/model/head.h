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
 * The next draft feeds y back as the hidden state of its row. The head's KV has the target's
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

struct model_head {
    /* The head as a one-layer model: its layer, KV and step buffers; the target's embedding,
     * head and tensors (m->st is the target's, not owned). */
    struct model *m;
    const struct model *target;
    struct qweight fc; /* [hidden, 2 * hidden] */
    float *norm_e;     /* [hidden] pre_fc_norm_embedding */
    float *norm_h;     /* [hidden] pre_fc_norm_hidden */
    float *pair;       /* [2 * max_tokens, hidden]: the normed embeddings, then hiddens */
    float *cat;        /* [max_tokens, 2 * hidden] the rows fc reads */
    float *out;        /* [max_tokens, hidden] y of the last forward's rows */
    int32_t *idx;      /* host [2 * max_tokens] the interleaving of pair into cat */
    int max_tokens;
};

/** The MTP module of the target's checkpoint (its tensors mtp.*). NULL + err when the
 * checkpoint has none, or a tensor is missing or misshapen (named). */
struct model_head *model_head_load_mtp(const struct model *target, struct err *e);

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
