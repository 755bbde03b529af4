/*
 * bench decode: prefill and decode throughput of a model on this machine, next to the
 * machine's measured memory read bandwidth (decode is bound by it). The other bench
 * subcommands live in bench_*.c (make-model: bench_make.c).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/args.h"
#include "cli/bench_util.h"
#include "cli/cli.h"
#include "common/threadpool.h"
#include "common/util.h"
#include "model/tp.h"
#include "kernels/cpu/cpu.h"

/* ---- decode ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Best-of-3 read bandwidth of a 1 GiB buffer on `threads` threads, in bytes/s. */
static double measure_read_bw(int threads)
{
    size_t n = (size_t)1 << 30;
    uint8_t *buf = NULL;
    if (posix_memalign((void **)&buf, 64, n) != 0) return 0;
    for (size_t i = 0; i < n; i += 4096) buf[i] = (uint8_t)i;
    struct threadpool *tp = tp_create(threads);
    double best = 0;
    uint64_t sink = 0;
    for (int r = 0; r < 4; r++) {
        double t0 = util_now();
        sink ^= cpu_read_all(tp, buf, n);
        double bw = (double)n / (util_now() - t0);
        if (r > 0 && bw > best) best = bw; /* the first pass warms the pages */
    }
    tp_destroy(tp);
    free(buf);
    if (sink == 42) fprintf(stderr, " "); /* keeps the reads observable */
    return best;
}

/* Bytes of weights a decode step of B sequences streams: every matrix but the embedding
 * table (only rows of it are read) unless it doubles as the output head, and of a MoE
 * layer's experts only those routed to: K of E for one sequence, and for B the expected
 * number of distinct experts under uniform routing, E * (1 - (1 - K / E)^B). */
static size_t step_weight_bytes(const struct model *m, int B)
{
    const struct moe_config *mc = &m->cfg.moe;
    double bytes = (double)model_weight_bytes(m);
    if (m->lm_head.w != m->embed.w) bytes -= (double)qweight_bytes(&m->embed);
    double E = mc->n_experts, read = E * (1.0 - pow(1.0 - (double)mc->top_k / E, B));
    for (int l = 0; l < m->cfg.n_layers && mc->n_experts; l++) {
        if (!m->cfg.layer_moe[l]) continue;
        const struct qweight *x = m->experts + (size_t)l * 3 * mc->n_experts;
        double all = 0;
        for (int i = 0; i < 3 * mc->n_experts; i++) all += (double)qweight_bytes(&x[i]);
        bytes -= all * (E - read) / E;
    }
    return (size_t)bytes;
}

static int bench_decode(int argc, char **argv)
{
    const char *dir = NULL, *device = NULL;
    long B = 1, P = 128, G = 32, threads = 0, K = 0, S = 0, tp = 1;
    int json = 0, no_bw = 0, overlap = -1;
    struct kv_spec kv = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int kr = arg_kv_option(argc, argv, &i, &kv);
        if (kr < 0) return 2;
        if (kr > 0) continue;
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--disable-overlap-schedule")) {
            overlap = 0;
            continue;
        }
        if (!strcmp(a, "--no-bandwidth")) {
            no_bw = 1;
            continue;
        }
        if (!strcmp(a, "--batch-invariant")) {
            backend_batch_invariant_set(1);
            continue;
        }
        if (!strcmp(a, "--disable-custom-all-reduce")) {
            backend_custom_all_reduce_set(0);
            continue;
        }
        if (!(v = arg_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "--model"))
            dir = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--batch")) {
            if (arg_int(a, v, 1, 4096, &B)) return 2;
        } else if (!strcmp(a, "--prompt-len")) {
            if (arg_int(a, v, 1, 1 << 20, &P)) return 2;
        } else if (!strcmp(a, "--gen-len")) {
            if (arg_int(a, v, 1, 1 << 20, &G)) return 2;
        } else if (!strcmp(a, "--threads")) {
            if (arg_int(a, v, 1, 1024, &threads)) return 2;
        } else if (!strcmp(a, "--prefill-seqs")) {
            if (arg_int(a, v, 1, 4096, &K)) return 2;
        } else if (!strcmp(a, "--spec-rows")) {
            if (arg_int(a, v, 0, 16, &S)) return 2;
        } else if (!strcmp(a, "--tensor-parallel-size") || !strcmp(a, "-tp")) {
            if (arg_int(a, v, 1, TP_MAX, &tp)) return 2;
        } else {
            fprintf(stderr, "pagoda bench decode: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: pagoda bench decode --model DIR [--batch B] [--prompt-len P] "
                        "[--gen-len G] [--prefill-seqs K] [--threads N] [--device D] [--json] "
                        "[--no-bandwidth] [--disable-overlap-schedule] [--spec-rows K]\n"
                        "        [--batch-invariant] [--kv-cache-dtype D ...] "
                        "[--tensor-parallel-size N] [--disable-custom-all-reduce]\n"
                        "  --prefill-seqs K  prompts prefilled per step (default: as many as fit\n"
                        "                 2048 tokens, at least one)\n"
                        "  --spec-rows K  also time verification steps: 1 + K rows a sequence,\n"
                        "                 logits on every row, K rolled back after each step\n");
        return 2;
    }
    /* Prefill K sequences per step (K * P tokens), as a server batches prompts under its step
     * budget: by default as many as the engine's default budget (2048 tokens) holds. */
    if (!K) K = P < 2048 ? 2048 / P : 1;
    if (K > B) K = B;
    int nth = threads ? (int)threads : util_num_cores();
    struct runner r;
    int max_tokens = (int)(P * K > B * (1 + S) ? P * K : B * (1 + S));
    if (runner_open_tp(&r, dir, device, nth, (int)tp, (int)B, (int)(P + (S ? 2 : 1) * G + S + 1),
                       max_tokens, (int)(B * (1 + S)), &kv))
        return 1;
    const struct model_config *c = &r.m->cfg;
    int on_cpu = !strcmp(r.be.ops->name, "cpu");
    if (overlap < 0) overlap = r.be.ops->async_picks; /* as the engine's default */
    if (tp > 1) overlap = 0; /* the other ranks read the step's tokens from the host */
    struct backend_info bi;
    r.be.ops->info(r.be.ctx, &bi);
    /* Greedy picks happen where the logits are (no logits copied to the host). */
    r.keep_logits = 1;
    /* Pin and pre-read the weights so the figures measure compute and memory, not the page
     * cache refilling from disk (a GPU backend holds its own copy already). */
    struct err le = {0};
    if (on_cpu && st_lock(&r.m->st, &le)) fprintf(stderr, "pagoda bench: warning: %s\n", le.msg);
    if (on_cpu) {
        struct threadpool *tp = tp_create(nth);
        uint64_t sink = 0;
        for (int f = 0; f < r.m->st.nfiles; f++)
            sink ^= cpu_read_all(tp, r.m->st.files[f].map, r.m->st.files[f].size / 64 * 64);
        tp_destroy(tp);
        if (sink == 42) fprintf(stderr, " ");
    }
    int32_t *prompt = xmalloc(sizeof(int32_t) * (size_t)(P * K));
    int *sids = xmalloc(sizeof(int) * (size_t)K);
    int32_t *next = xmalloc(sizeof(int32_t) * (size_t)B);
    const int32_t **toks = xmalloc(sizeof(int32_t *) * (size_t)B);
    int *counts = xmalloc(sizeof(int) * (size_t)B), *all = xcalloc((size_t)B, sizeof(int));
    uint64_t x = 12345;
    /* One untimed prefill and decode step (kernel loading, plans, graphs), then the
     * sequence starts over. */
    {
        for (long i = 0; i < P * K; i++)
            prompt[i] = (int32_t)(bench_mix(x + (uint64_t)i) % (uint64_t)c->vocab);
        for (long s = 0; s < K; s++) {
            sids[s] = (int)s;
            toks[s] = prompt + s * P;
            counts[s] = (int)P;
        }
        runner_step(&r, (int)K, sids, toks, counts, all);
        for (long s = 0; s < B; s++) {
            next[s] = 0;
            toks[s] = &next[s];
            counts[s] = 1;
        }
        memset(r.len, 0, sizeof(int32_t) * (size_t)B);
        for (long s = 0; s < B; s++) r.len[s] = (int32_t)P;
        runner_step(&r, (int)B, NULL, toks, counts, all);
        memset(r.len, 0, sizeof(int32_t) * (size_t)B);
    }
    double t0 = util_now();
    for (long s0 = 0; s0 < B; s0 += K) {
        int n = (int)(B - s0 < K ? B - s0 : K);
        for (int j = 0; j < n; j++) {
            for (long i = 0; i < P; i++)
                prompt[j * P + i] = (int32_t)(bench_mix(x++) % (uint64_t)c->vocab);
            sids[j] = (int)(s0 + j);
            toks[j] = prompt + j * P;
            counts[j] = (int)P;
        }
        int nl = runner_step(&r, n, sids, toks, counts, all);
        /* The step's first tokens, as a server picks them; this also waits for the step to
         * finish on a backend that runs asynchronously. */
        model_argmax(r.m, nl, next);
    }
    double t_prefill = util_now() - t0;
    for (long s = 0; s < B; s++) {
        next[s] = (int32_t)(bench_mix(x++) % (uint64_t)c->vocab);
        toks[s] = &next[s];
        counts[s] = 1;
    }
    double *step_t = xmalloc(sizeof(double) * (size_t)G);
    int32_t *pick_rows = xmalloc(sizeof(int32_t) * (size_t)B);
    for (long s = 0; s < B; s++) pick_rows[s] = (int32_t)s; /* sequence s: logit row s */
    t0 = util_now();
    if (overlap) {
        /* As the engine runs greedy steps: each step goes out before the previous step's
         * picks are read, its tokens those picks on the device. A step's time runs from
         * the previous step's tokens reaching the host to its own. */
        int nl = runner_step(&r, (int)B, NULL, toks, counts, all);
        model_argmax(r.m, nl, NULL);
        double ts = t0;
        r.pick_rows = pick_rows;
        for (long g = 0; g < G; g++) {
            if (g + 1 < G) {
                nl = runner_step(&r, (int)B, NULL, toks, counts, all);
                model_argmax(r.m, nl, NULL);
            }
            model_picks(r.m, nl, next);
            double now = util_now();
            step_t[g] = now - ts;
            ts = now;
        }
        r.pick_rows = NULL;
    } else {
        for (long g = 0; g < G; g++) {
            double ts = util_now();
            int nl = runner_step(&r, (int)B, NULL, toks, counts, all);
            model_argmax(r.m, nl, next);
            step_t[g] = util_now() - ts;
        }
    }
    double t_decode = util_now() - t0;
    free(pick_rows);
    qsort(step_t, (size_t)G, sizeof(double), cmp_double);
    double med = step_t[G / 2];
    /* Speculative verification: every sequence appends its token and S drafts, logits on
     * each row, greedy picks of them all; then its S draft rows are rolled back (the
     * sequence grows by one a step, as with every draft rejected). */
    double med_spec = 0;
    if (S > 0) {
        int32_t *vt = xmalloc(sizeof(int32_t) * (size_t)(B * (1 + S)));
        int32_t *vpick = xmalloc(sizeof(int32_t) * (size_t)(B * (1 + S)));
        for (long s = 0; s < B; s++) {
            for (long j = 0; j <= S; j++)
                vt[s * (1 + S) + j] = (int32_t)(bench_mix(x++) % (uint64_t)c->vocab);
            toks[s] = vt + s * (1 + S);
            counts[s] = (int)(1 + S);
            all[s] = 1;
        }
        for (long s = 0; s < B; s++) r.len[s] -= 1; /* re-run the last decode position */
        for (long g = 0; g < G; g++) {
            double ts = util_now();
            int nl = runner_step(&r, (int)B, NULL, toks, counts, all);
            model_argmax(r.m, nl, vpick);
            step_t[g] = util_now() - ts;
            for (long s = 0; s < B; s++) r.len[s] -= (int32_t)S;
        }
        qsort(step_t, (size_t)G, sizeof(double), cmp_double);
        med_spec = step_t[G / 2];
        free(vt);
        free(vpick);
    }
    size_t step_bytes = step_weight_bytes(r.m, (int)B);
    double prefill_tps = (double)(B * P) / t_prefill;
    double decode_tps = (double)B / med;
    double eff_bw = (double)step_bytes / med;
    double bw = no_bw || !on_cpu ? 0 : measure_read_bw(nth);
    double gflop_tok =
        2.0 * (double)(model_param_count(r.m) - (int64_t)r.m->embed.n * r.m->embed.k);
    if (json) {
        printf("{\"model\": \"%s\", \"device\": \"%s\", \"threads\": %d, \"isa\": \"%s\", "
               "\"batch\": %ld, \"prefill_seqs\": %ld, "
               "\"prompt_len\": %ld, \"gen_len\": %ld, \"prefill_tokens_per_s\": %.2f, "
               "\"decode_tokens_per_s\": %.2f, \"decode_step_ms_median\": %.3f, "
               "\"decode_tokens_per_s_mean\": %.2f, \"weight_bytes_per_step\": %zu, "
               "\"effective_read_gb_s\": %.2f, \"measured_read_gb_s\": %.2f, "
               "\"prefill_gflop_s\": %.1f, \"overlap_schedule\": %s, \"spec_rows\": %ld, "
               "\"verify_step_ms_median\": %.3f, \"verify_over_decode\": %.3f}\n",
               dir, bi.device, nth, cpu_isa_name(cpu_isa_get()), B, K, P, G, prefill_tps,
               decode_tps, med * 1e3, (double)(B * G) / t_decode, step_bytes, eff_bw / 1e9,
               bw / 1e9, prefill_tps * gflop_tok / 1e9, overlap ? "true" : "false", S,
               med_spec * 1e3, S > 0 ? med_spec / med : 0.0);
    } else {
        printf("model      %s (%s, %.2f GB of weights streamed per decode step)\n", dir,
               c->arch_name, (double)step_bytes / 1e9);
        if (on_cpu)
            printf("setup      %d threads (%s), batch %ld, prompt %ld, generate %ld\n", nth,
                   cpu_isa_name(cpu_isa_get()), B, P, G);
        else
            printf("setup      %s, batch %ld, prompt %ld, generate %ld\n", bi.device, B, P, G);
        printf("prefill    %.2f tokens/s (%.1f GFLOP/s; %ld prompt%s a step)\n", prefill_tps,
               prefill_tps * gflop_tok / 1e9, K, K == 1 ? "" : "s");
        printf("decode     %.2f tokens/s (median step %.2f ms; mean %.2f tokens/s%s)\n", decode_tps,
               med * 1e3, (double)(B * G) / t_decode, overlap ? "" : "; steps not overlapped");
        if (S > 0)
            printf("verify     median step %.2f ms with 1 + %ld rows a sequence: %.3fx a decode "
                   "step (steps not overlapped)\n",
                   med_spec * 1e3, S, med_spec / med);
        if (bw > 0)
            printf("bandwidth  %.2f GB/s effective of %.2f GB/s measured read bandwidth (%.1f%%)\n",
                   eff_bw / 1e9, bw / 1e9, 100.0 * eff_bw / bw);
    }
    free(step_t);
    free(prompt);
    free(sids);
    free(next);
    free(toks);
    free(counts);
    free(all);
    runner_close(&r);
    return 0;
}

int cli_bench(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "make-model"))
        return cli_bench_make_model(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "decode")) return bench_decode(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "tokenize")) return cli_bench_tokenize(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "throughput"))
        return cli_bench_throughput(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "matmul")) return cli_bench_matmul(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "grammar")) return cli_bench_grammar(argc - 1, argv + 1);
    fprintf(stderr, "usage: pagoda bench make-model ... | decode ... | throughput ... | matmul ... "
                    "| tokenize ... | grammar ...\n");
    return 2;
}
