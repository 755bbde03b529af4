/* embed: embedding vectors of texts or token-id prompts through the engine, all inputs
 * submitted at once (the engine batches them into shared steps). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/cli.h"
#include "common/util.h"
#include "model/config.h"
#include "model/pooling.h"
#include "sched/engine.h"
#include "text/tokenizer.h"

static void usage_embed(FILE *f)
{
    fprintf(f,
            "usage: pagoda embed --model DIR (--text T | --texts-file F | --prompt-ids \"1 2 3\"\n"
            "                     | --ids-file F) [options]\n"
            "  --text T           one text (may be given several times)\n"
            "  --texts-file F     one text per line\n"
            "  --prompt-ids IDS   one prompt of token ids (may be given several times)\n"
            "  --ids-file F       one prompt of token ids per line\n"
            "  --prompt-name NAME prepend this prompt of config_sentence_transformers.json\n"
            "                     to every text\n"
            "  --dimensions N     keep the first N values, renormalized (Matryoshka)\n"
            "  --json             each vector as a JSON array (one a line)\n"
            "  --time             report inputs/s and tokens/s on stderr\n");
    fputs(arg_engine_usage, f);
}

struct emb_in {
    int32_t *ids;
    size_t n;
    int pool_skip;
    float *vec; /* [dim] once done */
    enum finish_reason finish;
};

struct emb_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int remaining, dim;
};

struct emb_ctx {
    struct emb_run *run;
    struct emb_in *in;
};

static void on_event(void *user, const struct engine_event *ev)
{
    struct emb_ctx *c = user;
    if (ev->kind == ENGINE_EV_EMBEDDING) {
        c->in->vec = xmalloc(sizeof(float) * (size_t)ev->n_embedding);
        memcpy(c->in->vec, ev->embedding, sizeof(float) * (size_t)ev->n_embedding);
    }
    if (ev->finish == FINISH_NONE) return;
    pthread_mutex_lock(&c->run->mu);
    c->in->finish = ev->finish;
    c->run->remaining--;
    pthread_cond_signal(&c->run->cv);
    pthread_mutex_unlock(&c->run->mu);
}

/* Inputs as given on the command line: text or ids, in order. */
struct emb_arg {
    const char *value;
    int is_ids;
    char *owned; /* a line of a file: value's storage */
};

static int add_lines(const char *path, int is_ids, struct emb_arg **args, int *n)
{
    size_t len;
    struct err e = {0};
    char *text = util_read_file(path, &len, &e);
    if (!text) {
        fprintf(stderr, "pagoda embed: %s\n", e.msg);
        return -1;
    }
    for (char *line = text, *nl; line && *line; line = nl) {
        nl = strchr(line, '\n');
        if (nl) *nl++ = 0;
        size_t l = strlen(line);
        if (l && line[l - 1] == '\r') line[--l] = 0;
        if (!l) continue;
        *args = xrealloc(*args, sizeof **args * (size_t)(*n + 1));
        char *own = xstrdup(line);
        (*args)[(*n)++] = (struct emb_arg){own, is_ids, own};
    }
    free(text);
    return 0;
}

/* Tokenizes a text input, the prompt prepended; mean pooling without the prompt skips
 * its tokens as sentence-transformers counts them (the prompt tokenized alone, less one). */
static int encode_text(const struct tok *tok, const struct pooling_config *pc, const char *prompt,
                       const char *text, struct emb_in *in, struct err *e)
{
    size_t pl = prompt ? strlen(prompt) : 0, tl = strlen(text);
    char *full = xmalloc(pl + tl + 1);
    memcpy(full, prompt ? prompt : "", pl);
    memcpy(full + pl, text, tl + 1);
    int rc = tok_encode(tok, full, pl + tl, 1, &in->ids, &in->n, e);
    free(full);
    if (rc || !prompt || pc->include_prompt || pc->kind != POOLING_MEAN) return rc;
    int32_t *p_ids;
    size_t pn;
    if (tok_encode(tok, prompt, pl, 1, &p_ids, &pn, e)) return -1;
    free(p_ids);
    in->pool_skip = pn > 1 ? (int)pn - 1 : 0;
    if (in->pool_skip >= (int)in->n) in->pool_skip = (int)in->n - 1; /* a token is always pooled */
    return 0;
}

static int read_pooling(const char *dir, struct pooling_config *pc, struct err *e)
{
    struct model_config mc;
    if (config_load(&mc, dir, e)) return -1;
    int rc = pooling_config_load(pc, dir, mc.hidden, e);
    config_dispose(&mc);
    return rc;
}

static void free_args(struct emb_arg *args, int n)
{
    for (int i = 0; i < n; i++) free(args[i].owned);
    free(args);
}

static void print_vec(const float *v, int n, int json)
{
    if (json) putchar('[');
    for (int i = 0; i < n; i++) printf("%s%.9g", i ? (json ? ", " : " ") : "", v[i]);
    printf(json ? "]\n" : "\n");
}

int cli_embed(int argc, char **argv)
{
    const char *dir = NULL, *prompt_name = NULL;
    long dims = 0;
    int json = 0, timing = 0, n_args = 0, rc = 0;
    struct emb_arg *args = NULL;
    struct engine_config cfg = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int eo = arg_engine_option(argc, argv, &i, &cfg);
        if (eo < 0) {
            rc = 2;
            break;
        }
        if (eo) continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_embed(stdout);
            rc = -1;
            break;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--time")) {
            timing = 1;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--text") || !strcmp(a, "--texts-file") ||
                   !strcmp(a, "--prompt-ids") || !strcmp(a, "--ids-file") ||
                   !strcmp(a, "--prompt-name") || !strcmp(a, "--dimensions")) {
            if (!(v = arg_value(argc, argv, &i))) {
                rc = 2;
                break;
            }
            if (!strcmp(a, "--model")) {
                dir = v;
            } else if (!strcmp(a, "--prompt-name")) {
                prompt_name = v;
            } else if (!strcmp(a, "--dimensions")) {
                if (arg_int(a, v, 1, 1 << 20, &dims)) {
                    rc = 2;
                    break;
                }
            } else if (!strcmp(a, "--texts-file") || !strcmp(a, "--ids-file")) {
                if (add_lines(v, !strcmp(a, "--ids-file"), &args, &n_args)) {
                    rc = 1;
                    break;
                }
            } else {
                args = xrealloc(args, sizeof *args * (size_t)(n_args + 1));
                args[n_args++] = (struct emb_arg){v, !strcmp(a, "--prompt-ids"), NULL};
            }
        } else {
            fprintf(stderr, "pagoda embed: unknown option '%s'\n", a);
            usage_embed(stderr);
            rc = 2;
            break;
        }
    }
    if (!rc && (!dir || n_args == 0)) {
        fprintf(stderr, "pagoda embed: --model and at least one input (--text, --texts-file, "
                        "--prompt-ids, --ids-file) are required\n");
        usage_embed(stderr);
        rc = 2;
    }
    if (rc) {
        free_args(args, n_args);
        return rc < 0 ? 0 : rc;
    }

    struct err e = {0};
    struct tok *tok = NULL;
    struct emb_in *ins = xcalloc((size_t)n_args, sizeof *ins);
    struct emb_ctx *ctx = xcalloc((size_t)n_args, sizeof *ctx);
    struct engine *en = NULL;
    long total_tokens = 0;
    int has_text = 0, bs = cfg.block_size ? cfg.block_size : 16;
    for (int i = 0; i < n_args; i++) has_text |= !args[i].is_ids;
    /* The engine reads the pooling files too; they are read here for the prompt before the
     * weights load, so that a bad --prompt-name fails at once. */
    struct pooling_config pc = {0};
    if (read_pooling(dir, &pc, &e)) {
        fprintf(stderr, "pagoda embed: %s\n", e.msg);
        rc = 1;
    } else if (has_text && !(tok = tok_load(dir, &e))) {
        fprintf(stderr, "pagoda embed: text inputs need the model's tokenizer: %s\n", e.msg);
        rc = 1;
    } else if (!pc.can_embed) {
        fprintf(stderr, "pagoda embed: %s cannot embed: %s\n", dir, pc.why);
        rc = 1;
    } else if (dims > pc.dim) {
        fprintf(stderr, "pagoda embed: --dimensions %ld is more than the model's %d\n", dims,
                pc.dim);
        rc = 2;
    }
    const char *prompt = NULL;
    if (!rc && (prompt_name || pc.default_prompt)) {
        prompt = pooling_prompt(&pc, prompt_name ? prompt_name : pc.default_prompt);
        if (!prompt) {
            fprintf(stderr, "pagoda embed: --prompt-name '%s' is not a prompt of the model (",
                    prompt_name);
            for (int k = 0; k < pc.n_prompts; k++)
                fprintf(stderr, "%s'%s'", k ? ", " : "", pc.prompts[k].name);
            fprintf(stderr, "%s)\n", pc.n_prompts ? "" : "it has none");
            rc = 2;
        }
    }
    for (int i = 0; i < n_args && !rc; i++) {
        struct emb_in *in = &ins[i];
        if (args[i].is_ids) {
            if (prompt_name) {
                fprintf(stderr, "pagoda embed: --prompt-name applies to texts, not token ids\n");
                rc = 2;
            } else if (arg_ids(args[i].value, &in->ids, &in->n)) {
                rc = 2;
            }
        } else if (encode_text(tok, &pc, prompt, args[i].value, in, &e)) {
            fprintf(stderr, "pagoda embed: input %d: %s\n", i + 1, e.msg);
            rc = 1;
        }
        if (!rc && in->n == 0) {
            fprintf(stderr, "pagoda embed: input %d is empty\n", i + 1);
            rc = 2;
        }
        total_tokens += (long)in->n;
    }
    pooling_config_dispose(&pc);
    if (rc) goto out;

    /* A pool just big enough for every input at once unless its size was given. */
    if (!cfg.num_blocks && !cfg.kv_cache_memory) {
        long blocks = 0;
        for (int i = 0; i < n_args; i++) blocks += ((long)ins[i].n + bs - 1) / bs;
        cfg.num_blocks = blocks > (1 << 20) ? 1 << 20 : (int)blocks;
    }
    cfg.model_dir = dir;
    if (!(en = engine_create(&cfg, &e))) {
        fprintf(stderr, "pagoda embed: %s\n", e.msg);
        rc = 1;
        goto out;
    }
    struct emb_run run = {.remaining = 0};
    pthread_mutex_init(&run.mu, NULL);
    pthread_cond_init(&run.cv, NULL);
    double t0 = util_now();
    pthread_mutex_lock(&run.mu);
    for (int i = 0; i < n_args; i++) {
        ctx[i] = (struct emb_ctx){&run, &ins[i]};
        struct engine_request q = {.prompt = ins[i].ids,
                                   .n_prompt = (int)ins[i].n,
                                   .embed = 1,
                                   .pool_skip = ins[i].pool_skip,
                                   .on_event = on_event,
                                   .user = &ctx[i]};
        if (!engine_submit(en, &q, &e)) {
            fprintf(stderr, "pagoda embed: input %d: %s\n", i + 1, e.msg);
            rc = 2;
            break;
        }
        run.remaining++;
    }
    while (run.remaining > 0) pthread_cond_wait(&run.cv, &run.mu);
    pthread_mutex_unlock(&run.mu);
    double dt = util_now() - t0;
    int dim = engine_pooling(en)->dim;
    for (int i = 0; i < n_args && !rc; i++) {
        if (!ins[i].vec) {
            fprintf(stderr, "pagoda embed: input %d: %s\n", i + 1,
                    ins[i].finish == FINISH_ERROR ? "it does not fit the KV pool" : "aborted");
            rc = 1;
            break;
        }
        if (dims) pooling_truncate(ins[i].vec, (int)dims);
        print_vec(ins[i].vec, dims ? (int)dims : dim, json);
    }
    if (timing && !rc)
        fprintf(stderr,
                "pagoda embed: %d inputs, %ld tokens in %.3f s: %.3g inputs/s, %.3g tokens/s\n",
                n_args, total_tokens, dt, n_args / dt, total_tokens / dt);
    pthread_mutex_destroy(&run.mu);
    pthread_cond_destroy(&run.cv);
out:
    engine_destroy(en);
    for (int i = 0; i < n_args; i++) free(ins[i].ids), free(ins[i].vec);
    free(ins);
    free(ctx);
    free_args(args, n_args);
    tok_destroy(tok);
    return rc;
}
