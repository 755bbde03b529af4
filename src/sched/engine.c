/* The engine's API: creation, submission, aborts, the engine thread, statistics. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "model/tp.h"
#include "paged_kv/kv_events.h"
#include "sched/engine_impl.h"
#include "sched/spec.h"

const double engine_step_bucket_bounds[ENGINE_STEP_BUCKETS] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0};
const double engine_queue_bucket_bounds[ENGINE_QUEUE_BUCKETS] = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

const char *finish_reason_name(enum finish_reason r)
{
    switch (r) {
    case FINISH_STOP:
        return "stop";
    case FINISH_LENGTH:
        return "length";
    case FINISH_ABORT:
        return "abort";
    case FINISH_ERROR:
        return "error";
    default:
        return "none";
    }
}

void sampling_params_default(struct sampling_params *sp)
{
    memset(sp, 0, sizeof *sp);
    sp->temperature = 1.0f;
    sp->top_p = 1.0f;
    sp->repetition_penalty = 1.0f;
    sp->max_tokens = 16;
    sp->prompt_logprobs = -1;
}

/* ---- request lists ---- */

void list_append(struct req_list *l, struct request *r)
{
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail)
        l->tail->next = r;
    else
        l->head = r;
    l->tail = r;
    l->n++;
}

void list_remove(struct req_list *l, struct request *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        l->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        l->tail = r->prev;
    r->prev = r->next = NULL;
    l->n--;
}

static int before(const struct request *a, const struct request *b)
{
    return a->priority != b->priority ? a->priority < b->priority : a->arrival < b->arrival;
}

void list_insert_ordered(struct req_list *l, struct request *r)
{
    struct request *at = l->tail;
    while (at && before(r, at)) at = at->prev;
    /* insert after `at` (or at the head) */
    r->prev = at;
    r->next = at ? at->next : l->head;
    if (r->next)
        r->next->prev = r;
    else
        l->tail = r;
    if (at)
        at->next = r;
    else
        l->head = r;
    l->n++;
}

/* ---- creation ---- */

static void *engine_main(void *arg);

/* Recurrent-state slots of a hybrid model: one per running request plus half as many for
 * prefix snapshots, in at most half of `mem`. */
static long state_slots(const struct engine_config *cfg, size_t mem, size_t per_state)
{
    long n = cfg->max_num_seqs + cfg->max_num_seqs / 2 + 1;
    if ((size_t)n * per_state > mem / 2) n = (long)(mem / 2 / per_state);
    return n;
}

/* The scheduling options: a message naming the option for a value out of range. */
static int check_sched_config(const struct engine_config *cfg, struct err *e)
{
    if (!(cfg->max_step_ms >= 0 && cfg->max_step_ms <= 1e6))
        return err_set(e, "--max-step-ms: %g is not in [0, 1000000] (0: no bound)",
                       cfg->max_step_ms),
               -1;
    if (cfg->long_prefill_token_threshold < 0)
        return err_set(e, "--long-prefill-token-threshold: %d is negative (0: no cap)",
                       cfg->long_prefill_token_threshold),
               -1;
    if (cfg->scheduling_policy != SCHED_POLICY_PRIORITY &&
        cfg->scheduling_policy != SCHED_POLICY_FCFS)
        return err_set(e, "--scheduling-policy: unknown policy %d", (int)cfg->scheduling_policy),
               -1;
    /* Swapping keeps a preempted request's blocks in the host tier: it needs one (the CPU
     * backend refuses it: its pool is host memory already). */
    if (cfg->preemption_mode == PREEMPTION_SWAP && !cfg->kv_host_memory)
        return err_set(e, "--preemption-mode swap: needs a host KV tier to swap blocks to "
                          "(--kv-host-memory, CUDA; on the CPU the pool is host memory "
                          "already); use recompute"),
               -1;
    if (cfg->preemption_mode == PREEMPTION_SWAP && cfg->disable_prefix_caching)
        return err_set(e, "--preemption-mode swap: the host KV tier finds blocks by their "
                          "prefix hashes: it needs prefix caching on"),
               -1;
    if (cfg->preemption_mode != PREEMPTION_RECOMPUTE && cfg->preemption_mode != PREEMPTION_SWAP)
        return err_set(e, "--preemption-mode: unknown mode %d", (int)cfg->preemption_mode), -1;
    return 0;
}

struct engine *engine_create(const struct engine_config *cfg_in, struct err *e)
{
    struct engine *en = xcalloc(1, sizeof *en);
    en->cfg = *cfg_in;
    struct engine_config *cfg = &en->cfg;
    if (cfg->block_size <= 0) cfg->block_size = 16;
    if (cfg->max_num_batched_tokens <= 0) cfg->max_num_batched_tokens = 2048;
    if (cfg->max_num_seqs <= 0) cfg->max_num_seqs = 256;
    if (check_sched_config(cfg, e)) {
        if (cfg->backend) { /* the caller's: destroyed as promised */
            struct backend b = *cfg->backend;
            backend_destroy(&b);
        }
        free(en);
        return NULL;
    }
    if (cfg->batch_invariant) backend_batch_invariant_set(1);
    if (cfg->disable_custom_all_reduce) backend_custom_all_reduce_set(0);
    if (cfg->backend)
        en->be = *cfg->backend;
    else if (backend_create(&en->be, cfg->device, cfg->threads, e)) {
        free(en);
        return NULL;
    }
    /* a split model runs every speculative method: draft models and heads load whole on the
     * lead's device (the heads with whole copies of the embedding, an MTP module of the
     * model's head too) and n-gram drafts need no model */
    int tp = cfg->tensor_parallel_size > 1 ? cfg->tensor_parallel_size : 1;
    en->m = model_load_tp(cfg->model_dir, &en->be, cfg->device, tp, cfg->threads, e);
    if (!en->m) {
        backend_destroy(&en->be);
        free(en);
        return NULL;
    }
    struct err le = {0};
    if (cfg->mlock && st_lock(&en->m->st, &le)) /* as llama.cpp: warn and go on */
        fprintf(stderr, "pagoda: warning: the weights stay pageable: %s\n", le.msg);
    const struct model_config *mc = &en->m->cfg;
    en->vocab = mc->vocab;
    en->block_size = cfg->block_size;
    int ctx = mc->max_pos > 0 ? mc->max_pos : 4096;
    if (cfg->max_model_len > 0) ctx = cfg->max_model_len;

    if (model_set_kv_format(en->m, &cfg->kv, e)) {
        engine_destroy(en);
        return NULL;
    }
    size_t per_block = model_kv_bytes_per_block(en->m, NULL, en->block_size);
    size_t per_state = model_state_bytes(en->m);
    en->hybrid = per_state > 0;
    /* The delta rule's chunk: 16 tokens where the block size allows (the chunk must divide
     * it, so that prefix snapshots fall on chunk boundaries), else the largest power of two
     * that divides it; none where a step's budget could not hold one. */
    if (en->hybrid) {
        int c = ENGINE_DELTA_CHUNK;
        while (c > 1 && en->block_size % c) c /= 2;
        en->delta_chunk = c >= 2 && c <= cfg->max_num_batched_tokens ? c : 0;
    }
    long n_blocks = cfg->num_blocks, n_states = 0;
    size_t mem = cfg->kv_cache_memory ? cfg->kv_cache_memory : (size_t)1 << 30;
    if (n_blocks <= 0) {
        if (!cfg->kv_cache_memory && strcmp(en->be.ops->name, "cpu") != 0 && en->be.ops->info) {
            /* On a GPU the pool takes what --gpu-memory-utilization leaves once the
             * weights (already resident) and the step buffers are accounted for. */
            struct backend_info bi;
            en->be.ops->info(en->be.ctx, &bi);
            size_t act = sizeof(float) * (size_t)cfg->max_num_batched_tokens *
                             (size_t)(3 * mc->hidden + 2 * mc->n_heads * mc->max_head_dim +
                                      2 * mc->max_kv_dim + 2 * mc->ffn) +
                         sizeof(float) * 2 * (size_t)(cfg->max_num_seqs + 256) * (size_t)mc->vocab;
            double util = cfg->gpu_memory_utilization > 0 ? cfg->gpu_memory_utilization : 0.9;
            mem =
                backend_kv_budget(&bi, util, model_weight_bytes(en->m) + act + ((size_t)256 << 20));
        }
        if (en->hybrid) { /* the blocks take what the recurrent states leave */
            n_states = state_slots(cfg, mem, per_state);
            mem -= (size_t)n_states * per_state;
        }
        n_blocks = (long)(mem / per_block);
        /* no point in more than every running request at full length */
        long useful = ((long)ctx + en->block_size - 1) / en->block_size * (long)cfg->max_num_seqs;
        if (n_blocks > useful) n_blocks = useful;
    }
    if (en->hybrid && n_states <= 0) n_states = state_slots(cfg, mem, per_state);
    if (en->hybrid && n_states < 2) {
        err_set(e,
                "the memory for recurrent states holds %ld slot(s) of %zu bytes; give "
                "--kv-cache-memory more",
                n_states, per_state);
        engine_destroy(en);
        return NULL;
    }
    if (n_blocks < 1) {
        err_set(e, "the KV pool holds no block: %zu bytes per block of %d tokens", per_block,
                en->block_size);
        engine_destroy(en);
        return NULL;
    }
    if ((long)ctx > n_blocks * en->block_size) ctx = (int)(n_blocks * en->block_size);
    en->max_model_len = ctx;
    en->max_blocks = (ctx + en->block_size - 1) / en->block_size;
    int seq_cap = cfg->max_num_seqs < cfg->max_num_batched_tokens ? cfg->max_num_seqs
                                                                  : cfg->max_num_batched_tokens;
    int lp_rows = cfg->max_num_batched_tokens < 256 ? cfg->max_num_batched_tokens : 256;
    en->max_logits = seq_cap + lp_rows;
    if (cfg->spec.method != SPEC_NONE) { /* verification rows: K more per speculating request */
        int k = cfg->spec.num_tokens > 0 ? cfg->spec.num_tokens : 1, extra = seq_cap * k;
        if (extra > 256) extra = 256;
        if (extra > cfg->max_num_batched_tokens) extra = cfg->max_num_batched_tokens;
        en->max_logits += extra;
    }
    if (model_state_alloc(en->m, cfg->max_num_batched_tokens, en->max_logits, (int)n_blocks,
                          en->block_size, (int)n_states, e)) {
        engine_destroy(en);
        return NULL;
    }
    if (pooling_config_load(&en->pooling, cfg->model_dir, mc->hidden, e)) {
        engine_destroy(en);
        return NULL;
    }
    if (en->pooling.can_embed) {
        /* mean pooling reads every row of a step; the others one row a sequence */
        en->max_hidden = en->pooling.kind == POOLING_MEAN ? cfg->max_num_batched_tokens : seq_cap;
        if (model_hidden_alloc(en->m, en->max_hidden, e)) {
            engine_destroy(en);
            return NULL;
        }
        en->b_hidden_rows = xmalloc(sizeof(int32_t) * (size_t)en->max_hidden);
        en->hidden = xmalloc(sizeof(float) * (size_t)en->max_hidden * (size_t)mc->hidden);
        en->emb_out = xmalloc(sizeof(float) * (size_t)mc->hidden);
    }
    en->overlap = cfg->overlap > 0 || (cfg->overlap == 0 && en->be.ops->async_picks);
    /* a split model's other ranks embed the step's tokens too: they come from the host */
    if (tp > 1) en->overlap = 0;
    en->window = mc->sliding_window;
    en->sliding_only = mc->sliding_window > 0;
    for (int l = 0; l < mc->n_layers; l++)
        if (!mc->layer_kinds || mc->layer_kinds[l] != LAYER_SLIDING) en->sliding_only = 0;

    /* The fingerprint: architecture, shapes, weight bytes and the KV format. */
    char fp[768];
    int fpn =
        snprintf(fp, sizeof fp, "%s|%d|%d|%d|%d|%d|%d|%zu|%lld|kv=%s:%d:%s:%s|bs=%d|skip",
                 mc->arch_name, mc->hidden, mc->n_layers, mc->n_heads, mc->n_kv_heads, mc->head_dim,
                 mc->vocab, model_weight_bytes(en->m), (long long)model_param_count(en->m),
                 en->be.ops->name, en->be.ops->kv_value_bytes, kv_dtype_name(cfg->kv.k),
                 kv_dtype_name(cfg->kv.v), en->block_size);
    for (int l = 0; l < mc->n_layers && fpn < (int)sizeof fp - 16; l++)
        if (kv_spec_skips(&cfg->kv, l, mc->n_layers))
            fpn += snprintf(fp + fpn, sizeof fp - (size_t)fpn, ",%d", l);
    kv_pool_init(&en->pool, (int)n_blocks, en->block_size, fp, (size_t)fpn);
    kv_pool_init(&en->states, (int)n_states, 1, fp, (size_t)fpn);
    if (cfg->kv_events) {
        en->pool.events = cfg->kv_events;
        kv_events_attach(cfg->kv_events, en->block_size,
                         strcmp(en->be.ops->name, "cuda") ? "CPU" : "GPU");
    }
    if (spec_create(en, e)) {
        engine_destroy(en);
        return NULL;
    }
    /* A verification's tokens are not one pick per row: no step goes out before the last
     * one's tokens are read (and each step's time is its own, for the draft length). */
    if (en->spec) en->overlap = 0;
    if (tier_open(en, fp, e)) {
        engine_destroy(en);
        return NULL;
    }
    if (cfg->preemption_mode == PREEMPTION_SWAP && !en->host) {
        err_set(e, "--preemption-mode swap: the host KV tier is off for this model (see the "
                   "note above); use recompute");
        engine_destroy(en);
        return NULL;
    }
    tier_publish(en, &en->stats); /* /metrics names the tier from the start */

    int T = cfg->max_num_batched_tokens;
    en->b_tokens = xmalloc(sizeof(int32_t) * (size_t)T);
    en->b_pos = xmalloc(sizeof(int32_t) * (size_t)T);
    en->b_slot = xmalloc(sizeof(int32_t) * (size_t)T);
    en->b_qstart = xmalloc(sizeof(int32_t) * (size_t)(seq_cap + 1));
    en->b_seqlen = xmalloc(sizeof(int32_t) * (size_t)seq_cap);
    en->b_state = xmalloc(sizeof(int32_t) * (size_t)seq_cap);
    en->b_chunked = xmalloc(sizeof(int32_t) * (size_t)seq_cap);
    en->b_bt = xmalloc(sizeof(int32_t) * (size_t)seq_cap * (size_t)en->max_blocks);
    en->b_logit_rows = xmalloc(sizeof(int32_t) * (size_t)en->max_logits);
    en->logits = xmalloc(sizeof(float) * (size_t)en->max_logits * (size_t)en->vocab);
    en->greedy = xmalloc(sizeof(int32_t) * (size_t)en->max_logits);
    en->srow = xcalloc((size_t)en->max_logits, sizeof(struct sample_row));
    en->b_pick = xmalloc(sizeof(int32_t) * (size_t)T);
    for (int i = 0; i < 2; i++) en->plans[i] = xmalloc(sizeof(struct step_seq) * (size_t)seq_cap);
    en->hit_blocks = xmalloc(sizeof(int32_t) * (size_t)en->max_blocks);
    en->hit_hashes = xmalloc(sizeof(struct kv_hash) * (size_t)en->max_blocks);
    en->work = xmalloc(sizeof(float) * (size_t)en->vocab);
    en->gmask = xmalloc(sizeof(uint32_t) * (size_t)((en->vocab + 31) / 32));
    en->counts = xcalloc((size_t)en->vocab, sizeof(uint32_t));
    en->cand = xmalloc(sizeof(int32_t) * (size_t)en->vocab);
    en->scand = xmalloc(sizeof(struct sampler_cand) * (size_t)en->vocab);
    rng_seed(&en->seeder, 0x70a60da5eedull ^ (uint64_t)(util_now() * 1e9));

    pthread_mutex_init(&en->mu, NULL);
    pthread_cond_init(&en->cv, NULL);
    en->next_id = 1;
    en->stats.kv_blocks_total = (int)n_blocks;
    en->stats.kv_blocks_free = (int)n_blocks;
    en->stats.state_slots_total = (int)n_states;
    en->stats.state_slots_free = (int)n_states;
    en->stats.state_bytes = per_state;
    if (!cfg->manual) {
        if (pthread_create(&en->thread, NULL, engine_main, en)) {
            err_set(e, "cannot start the engine thread");
            engine_destroy(en);
            return NULL;
        }
        en->has_thread = 1;
    }
    return en;
}

const struct model_config *engine_model_config(const struct engine *en)
{
    return &en->m->cfg;
}

int engine_max_model_len(const struct engine *en)
{
    return en->max_model_len;
}

int engine_block_size(const struct engine *en)
{
    return en->block_size;
}

const struct pooling_config *engine_pooling(const struct engine *en)
{
    return &en->pooling;
}

/* ---- submission ---- */

static int check_params(const struct engine *en, const struct engine_request *q, struct err *e)
{
    const struct sampling_params *sp = &q->sp;
    if (q->n_prompt < 1 || !q->prompt)
        return err_set(e, "prompt: must hold at least one token"), -1;
    if (q->priority && en->cfg.scheduling_policy == SCHED_POLICY_FCFS)
        return err_set(e, "priority: the scheduling policy is fcfs (the server takes priorities "
                          "with --scheduling-policy priority)"),
               -1;
    for (int i = 0; i < q->n_prompt; i++)
        if (q->prompt[i] < 0 || q->prompt[i] >= en->vocab)
            return err_set(e,
                           "prompt: token id %d at position %d is outside the vocabulary (0..%d)",
                           (int)q->prompt[i], i, en->vocab - 1),
                   -1;
    if (q->embed) {
        if (!en->pooling.can_embed)
            return err_set(e, "the model cannot embed: %s", en->pooling.why), -1;
        if (q->n_prompt > en->max_model_len)
            return err_set(e, "input: %d tokens exceed the context length (%d)", q->n_prompt,
                           en->max_model_len),
                   -1;
        if (q->pool_skip < 0 || q->pool_skip >= q->n_prompt)
            return err_set(e, "input: no token is left to pool once the prompt's %d are left out",
                           q->pool_skip),
                   -1;
        return 0;
    }
    if (sp->max_tokens < 1) return err_set(e, "max_tokens: must be at least 1"), -1;
    if ((long)q->n_prompt + sp->max_tokens > en->max_model_len)
        return err_set(e,
                       "max_tokens: the prompt (%d tokens) plus max_tokens (%d) exceeds the "
                       "context length (%d)",
                       q->n_prompt, sp->max_tokens, en->max_model_len),
               -1;
    if (!(sp->temperature >= 0) || sp->temperature > 100)
        return err_set(e, "temperature: must be in [0, 100]"), -1;
    if (!(sp->top_p > 0 && sp->top_p <= 1)) return err_set(e, "top_p: must be in (0, 1]"), -1;
    if (!(sp->min_p >= 0 && sp->min_p <= 1)) return err_set(e, "min_p: must be in [0, 1]"), -1;
    if (!(sp->repetition_penalty > 0 && sp->repetition_penalty <= 100))
        return err_set(e, "repetition_penalty: must be in (0, 100]"), -1;
    if (!(sp->presence_penalty >= -2 && sp->presence_penalty <= 2))
        return err_set(e, "presence_penalty: must be in [-2, 2]"), -1;
    if (!(sp->frequency_penalty >= -2 && sp->frequency_penalty <= 2))
        return err_set(e, "frequency_penalty: must be in [-2, 2]"), -1;
    if (sp->top_logprobs < 0 || sp->top_logprobs > ENGINE_MAX_TOP_LOGPROBS)
        return err_set(e, "top_logprobs: must be in [0, %d]", ENGINE_MAX_TOP_LOGPROBS), -1;
    if (sp->prompt_logprobs < -1 || sp->prompt_logprobs > ENGINE_MAX_TOP_LOGPROBS)
        return err_set(e, "prompt_logprobs: must be in [0, %d]", ENGINE_MAX_TOP_LOGPROBS), -1;
    for (int i = 0; i < sp->n_stop_ids; i++)
        if (sp->stop_ids[i] < 0 || sp->stop_ids[i] >= en->vocab)
            return err_set(e, "stop_token_ids: %d is outside the vocabulary", (int)sp->stop_ids[i]),
                   -1;
    for (int i = 0; i < sp->n_logit_bias; i++) {
        if (sp->logit_bias[i].id < 0 || sp->logit_bias[i].id >= en->vocab)
            return err_set(e, "logit_bias: token id %d is outside the vocabulary",
                           (int)sp->logit_bias[i].id),
                   -1;
        float b = sp->logit_bias[i].bias;
        if (!(b >= -100 && b <= 100))
            return err_set(e, "logit_bias: the bias of token %d must be in [-100, 100]",
                           (int)sp->logit_bias[i].id),
                   -1;
    }
    return 0;
}

const struct gram_vocab *engine_grammar_vocab(struct engine *en, struct err *e)
{
    pthread_mutex_lock(&en->mu);
    const struct gram_vocab *v = en->gvocab;
    pthread_mutex_unlock(&en->mu);
    if (v) return v;
    /* built outside the lock: the engine thread keeps stepping meanwhile */
    struct tok *t = tok_load(en->cfg.model_dir, e);
    if (!t) return NULL;
    const struct model_config *c = &en->m->cfg;
    int32_t eos[CONFIG_MAX_EOS + 1];
    int n = 0;
    for (int i = 0; i < c->n_eos; i++) eos[n++] = c->eos_ids[i];
    if (tok_eos_id(t) >= 0) eos[n++] = tok_eos_id(t);
    struct gram_vocab *nv = gram_vocab_create(t, en->vocab, eos, n, en->cfg.grammar_tags, e);
    tok_destroy(t);
    if (!nv) return NULL;
    pthread_mutex_lock(&en->mu);
    if (!en->gvocab) en->gvocab = nv, nv = NULL; /* else another thread was first: keep its trie */
    v = en->gvocab;
    pthread_mutex_unlock(&en->mu);
    gram_vocab_destroy(nv);
    return v;
}

uint64_t engine_submit(struct engine *en, const struct engine_request *q, struct err *e)
{
    if (check_params(en, q, e)) return 0;
    if (q->sp.grammar && !q->embed) {
        const struct gram_vocab *gv = engine_grammar_vocab(en, e);
        if (!gv) return 0;
        gram_prepare(q->sp.grammar, gv); /* the grammar's token sets, once: no trie walks at
                                            mask time (here, off the engine thread) */
    }
    struct request *r = xcalloc(1, sizeof *r);
    r->n_prompt = r->n_tokens = q->n_prompt;
    r->ph_pos = r->ph_row = -1;
    r->state_slot = -1;
    r->spec_rate = 1.0f;
    r->state_backup = -1;
    if (en->spec && en->spec->draft) r->dblocks = xmalloc(sizeof(int32_t) * (size_t)en->max_blocks);
    r->load_id = -1;
    r->load_snap = -1;
    r->cap = q->n_prompt + (q->embed ? 0 : q->sp.max_tokens);
    r->tokens = xmalloc(sizeof(int32_t) * (size_t)r->cap);
    memcpy(r->tokens, q->prompt, sizeof(int32_t) * (size_t)q->n_prompt);
    r->blocks = xmalloc(sizeof(int32_t) * (size_t)en->max_blocks);
    r->hashes = xmalloc(sizeof(struct kv_hash) * (size_t)en->max_blocks);
    r->sp = q->sp;
    if (q->embed) { /* nothing is sampled: plain greedy parameters, no copies to make */
        sampling_params_default(&r->sp);
        r->sp.temperature = 0;
        r->embed = 1;
        r->pool_skip = en->pooling.kind == POOLING_MEAN ? q->pool_skip : 0;
        r->pool = xcalloc((size_t)en->m->cfg.hidden, sizeof(double));
    }
    if (r->sp.n_stop_ids) {
        r->stop_ids = xmalloc(sizeof(int32_t) * (size_t)q->sp.n_stop_ids);
        memcpy(r->stop_ids, q->sp.stop_ids, sizeof(int32_t) * (size_t)q->sp.n_stop_ids);
    }
    if (r->sp.n_logit_bias) {
        r->bias = xmalloc(sizeof(struct logit_bias) * (size_t)q->sp.n_logit_bias);
        memcpy(r->bias, q->sp.logit_bias, sizeof(struct logit_bias) * (size_t)q->sp.n_logit_bias);
    }
    r->sp.stop_ids = r->stop_ids;
    r->sp.logit_bias = r->bias;
    r->steer = steer_create(&r->sp); /* takes the grammar when it waits for a trigger */
    if (r->sp.grammar) r->gm = gram_matcher_create(r->sp.grammar); /* holds the reference */
    r->sp.grammar = NULL; /* r->gm stands for it from here on */
    if (r->sp.prompt_logprobs >= 0) {
        int k = q->sp.prompt_logprobs;
        r->plp = xmalloc(sizeof(float) * (size_t)q->n_prompt);
        r->plp[0] = NAN;
        if (k) r->ptop = xmalloc(sizeof(struct token_logprob) * (size_t)k * (size_t)q->n_prompt);
        if (k) memset(r->ptop, 0, sizeof(struct token_logprob) * (size_t)k);
    }
    r->priority = q->priority;
    r->cb = q->on_event;
    r->user = q->user;
    r->state = RS_WAITING;
    r->t_submit = util_now();

    pthread_mutex_lock(&en->mu);
    uint64_t id = r->id = en->next_id++;
    uint64_t seed = q->sp.has_seed ? q->sp.seed : rng_next(&en->seeder);
    rng_seed(&r->rng, seed);
    rng_seed(&r->rng_spec, seed ^ 0x5bec5a3b1e0fd7c3ull); /* speculative sampling's own */
    list_append(&en->incoming, r);
    en->live++;
    pthread_cond_signal(&en->cv);
    pthread_mutex_unlock(&en->mu);
    return id; /* not r->id: once queued, r may already be finished and freed */
}

static void end_early(struct engine *en, uint64_t id, enum finish_reason why)
{
    pthread_mutex_lock(&en->mu);
    if (en->n_aborts == en->cap_aborts) {
        en->cap_aborts = en->cap_aborts ? 2 * en->cap_aborts : 64;
        en->aborts = xrealloc(en->aborts, sizeof(uint64_t) * (size_t)en->cap_aborts);
        en->abort_why = xrealloc(en->abort_why, sizeof *en->abort_why * (size_t)en->cap_aborts);
    }
    en->abort_why[en->n_aborts] = why;
    en->aborts[en->n_aborts++] = id;
    pthread_cond_signal(&en->cv);
    pthread_mutex_unlock(&en->mu);
}

/* ---- the loop ---- */

void engine_abort(struct engine *en, uint64_t id)
{
    end_early(en, id, FINISH_ABORT);
}

void engine_stop_request(struct engine *en, uint64_t id)
{
    end_early(en, id, FINISH_STOP);
}

void engine_recount_stop(struct engine *en, enum finish_reason counted)
{
    if (counted == FINISH_STOP || counted == FINISH_NONE) return;
    pthread_mutex_lock(&en->mu);
    if (en->stats.requests_finished[counted] > 0) {
        en->stats.requests_finished[counted]--;
        en->stats.requests_finished[FINISH_STOP]++;
    }
    pthread_mutex_unlock(&en->mu);
}

static int find_and_mark(struct req_list *l, uint64_t id, enum finish_reason why)
{
    for (struct request *r = l->head; r; r = r->next)
        if (r->id == id) {
            if (!r->aborted) r->aborted = why;
            return 1;
        }
    return 0;
}

/* Moves new requests into the waiting queue and applies aborts. Called with mu held. */
static void intake_locked(struct engine *en)
{
    while (en->incoming.head) {
        struct request *r = en->incoming.head;
        list_remove(&en->incoming, r);
        r->arrival = en->arrivals++;
        list_insert_ordered(&en->waiting, r);
    }
    for (int i = 0; i < en->n_aborts; i++)
        if (!find_and_mark(&en->waiting, en->aborts[i], en->abort_why[i]))
            find_and_mark(&en->running, en->aborts[i], en->abort_why[i]);
    en->n_aborts = 0;
}

static void finish_aborted(struct engine *en, struct req_list *l)
{
    for (struct request *r = l->head, *nx; r; r = nx) {
        nx = r->next;
        if (r->aborted) req_finish(en, r, (enum finish_reason)r->aborted, 1);
    }
}

static int one_iteration(struct engine *en)
{
    pthread_mutex_lock(&en->mu);
    intake_locked(en);
    pthread_mutex_unlock(&en->mu);
    finish_aborted(en, &en->waiting);
    finish_aborted(en, &en->running);
    tier_poll(en, 0);
    if ((en->waiting.n || en->running.n) && step_run(en) == 0 && !en->running.n && en->waiting.n) {
        if (en->n_loading) {
            /* nothing to step but blocks on their way from disk: wait for some */
            tier_poll(en, 0.05);
        } else {
            /* Nothing runs and the first waiting request cannot start even in an idle
             * pool: it can never run, so it ends instead of stalling the queue. */
            req_finish(en, en->waiting.head, FINISH_ERROR, 1);
        }
    }
    step_publish_gauges(en);
    if (en->cfg.kv_events) kv_events_flush(en->cfg.kv_events);
    return en->waiting.n + en->running.n;
}

int engine_step(struct engine *en)
{
    return one_iteration(en);
}

static void *engine_main(void *arg)
{
    struct engine *en = arg;
    for (;;) {
        pthread_mutex_lock(&en->mu);
        while (!en->stop && !en->incoming.head && !en->n_aborts && !en->waiting.n && !en->running.n)
            pthread_cond_wait(&en->cv, &en->mu);
        int stop = en->stop;
        pthread_mutex_unlock(&en->mu);
        if (stop) break;
        one_iteration(en);
    }
    return NULL;
}

int engine_live(struct engine *en)
{
    pthread_mutex_lock(&en->mu);
    int n = en->live;
    pthread_mutex_unlock(&en->mu);
    return n;
}

void engine_stats(struct engine *en, struct engine_stats *out)
{
    pthread_mutex_lock(&en->mu);
    *out = en->stats;
    pthread_mutex_unlock(&en->mu);
    /* the writer works between the gauges' updates (a long step): its figures as of now */
    if (out->tier_on) kv_tier_store_stats(en->tier, &out->tier);
}

static void free_request(struct request *r)
{
    free(r->tokens);
    free(r->blocks);
    free(r->dblocks);
    free(r->hashes);
    free(r->stop_ids);
    free(r->bias);
    free(r->plp);
    free(r->ptop);
    free(r->pool);
    gram_matcher_destroy(r->gm);
    free(r->gmask);
    steer_destroy(r->steer);
    free(r);
}

void req_count_finish(struct engine *en, enum finish_reason why)
{
    pthread_mutex_lock(&en->mu);
    en->stats.requests_finished[why]++;
    pthread_mutex_unlock(&en->mu);
}

void req_finish(struct engine *en, struct request *r, enum finish_reason why, int emit)
{
    /* no plan may name it any more (the step in flight computes its row in vain) */
    for (int i = 0; i < 2; i++)
        for (int s = 0; s < en->plan_n[i]; s++)
            if (en->plans[i][s].r == r) en->plans[i][s].r = NULL;
    if (r->state == RS_RUNNING)
        list_remove(&en->running, r);
    else if (r->state == RS_WAITING)
        list_remove(&en->waiting, r);
    req_release_state(en, r);
    spec_release(en, r);
    tier_cancel(en, r);
    kv_release(&en->pool, r->blocks, r->n_blocks);
    r->n_blocks = 0;
    r->state = RS_DONE;
    if (emit) req_count_finish(en, why);
    if (emit && r->cb) {
        struct engine_event ev = {.kind = ENGINE_EV_FINISH,
                                  .req_id = r->id,
                                  .token = -1,
                                  .finish = why,
                                  .n_prompt = r->n_prompt,
                                  .n_cached = r->n_cached,
                                  .n_output = r->n_output};
        r->cb(r->user, &ev);
    }
    pthread_mutex_lock(&en->mu);
    en->live--;
    pthread_mutex_unlock(&en->mu);
    free_request(r);
}

void engine_destroy(struct engine *en)
{
    if (!en) return;
    if (en->has_thread) {
        pthread_mutex_lock(&en->mu);
        en->stop = 1;
        pthread_cond_signal(&en->cv);
        pthread_mutex_unlock(&en->mu);
        pthread_join(en->thread, NULL);
    }
    if (en->b_tokens) {
        pthread_mutex_lock(&en->mu);
        intake_locked(en);
        pthread_mutex_unlock(&en->mu);
        while (en->running.head) req_finish(en, en->running.head, FINISH_ABORT, 1);
        while (en->waiting.head) req_finish(en, en->waiting.head, FINISH_ABORT, 1);
        /* subscribers forget this server's blocks */
        if (en->cfg.kv_events) {
            kv_events_cleared(en->cfg.kv_events);
            kv_events_flush(en->cfg.kv_events);
        }
        pthread_mutex_destroy(&en->mu);
        pthread_cond_destroy(&en->cv);
    }
    free(en->aborts);
    free(en->abort_why);
    free(en->b_tokens);
    free(en->b_pos);
    free(en->b_slot);
    free(en->b_qstart);
    free(en->b_seqlen);
    free(en->b_state);
    free(en->b_chunked);
    free(en->b_bt);
    free(en->b_logit_rows);
    free(en->logits);
    free(en->greedy);
    free(en->srow);
    free(en->b_pick);
    free(en->plans[0]);
    free(en->plans[1]);
    free(en->hit_blocks);
    free(en->hit_hashes);
    free(en->work);
    masks_stop(en);
    free(en->gmask);
    gram_vocab_destroy(en->gvocab);
    free(en->counts);
    free(en->cand);
    free(en->scand);
    free(en->b_hidden_rows);
    free(en->hidden);
    free(en->emb_out);
    pooling_config_dispose(&en->pooling);
    spec_destroy(en);
    tier_close(en);
    kv_pool_dispose(&en->pool);
    kv_pool_dispose(&en->states);
    if (en->m) model_destroy(en->m);
    backend_destroy(&en->be);
    free(en);
}
