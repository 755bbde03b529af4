/*
 * Golden test: every model folder of the reference test data whose architecture pagoda
 * supports runs through the real CLI (`pagoda generate --json`, `pagoda score`) and is
 * compared with the Hugging Face goldens by the rule of testdata/README.md:
 *   - greedy ids equal, or the first difference is at a step whose golden margin is below
 *     0.05 with our token in the golden top 2 (then the paths legitimately diverge);
 *   - while the paths agree, every golden top-5 log-probability within 1e-3 (float32 path);
 *   - prompt log-probabilities within 1e-3.
 * The bundled models/demo (relative to the working directory) is compared the same way, and
 * so is every variant under tests/golden/variants (rope scalings, nvfp4, BitNet), assembled in a
 * temporary folder from its config.json, golden.json and weights with the tokenizer (and,
 * without its own weights, the weights) of the reference model its golden names as `base`.
 * With --device cuda the same comparison runs through the CUDA backend at bf16 tolerance
 * (CUDA_TOL below): prefill products round activations to bf16 and KV rows are stored as
 * bf16. Without a GPU that run reports "no GPU: not run" and exits 77 (skipped).
 * With --kv-cache-dtype fp8 every run stores its KV cache as e4m3 (KV_FP8_TOL below).
 * On the CPU the commands run in the default mode (CPU_FAST_TOL), or with --mode invariant
 * in batch-invariant mode (--batch-invariant: float32 products, CPU_TOL).
 * With --tensor-parallel-size N every command splits the model over N ranks (N GPUs from
 * the device named; on the CPU, N CPU backends) and the same goldens are held to the same
 * tolerances: the folders of the families that split (Llama, Mistral, Qwen2, Qwen3, Gemma 2, 3
 * and 4) whose shapes divide N ways are compared; for the others the command must refuse the
 * split at load time, naming why. Fewer GPUs than N: "not run" (skipped).
 * usage: golden_test_models PAGODA_BINARY TESTDATA_DIR [--device DEV] [--kv-cache-dtype D]
 *        [--mode default|invariant] [--tensor-parallel-size N]
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "golden/golden_util.h"
#include "test_util.h"

#include "model/backend.h"

/* Log-probability tolerance on the float32 CPU path and on the CUDA path (bf16 activations
 * in prefill products, bf16 KV): the largest deviation seen there over all 96 cases was
 * 0.037, on the 300-token prompts of the 3- and 8-bit Qwen3 copies. */
#define CPU_TOL  1e-3
#define CUDA_TOL 5e-2
/* The CPU's default mode: products of 9 or more rows (every prompt of these goldens) round
 * activations to bf16 (bf16 weights) or int8 per weight group (MLX 4- and 8-bit; see
 * kernels/cpu/gemm.h). Largest deviation seen: 0.095 (qwen3-tiny-mlx8), 0.028 over the bf16
 * folders; Gemma 4, which magnifies any rounding (see golden_util.h: 0.35 and 0.59 here),
 * runs its goldens in batch-invariant mode, as on CUDA. --mode invariant runs every folder
 * on the float32 path at CPU_TOL. */
#define CPU_FAST_TOL 0.15
/* The hybrid architectures on CUDA: their Gated DeltaNet states carry the rounding of the
 * prefill products (q, k, v, the gates' inputs) from token to token over a whole prompt. The
 * largest deviation seen was 0.054, on a late prompt log-probability of qwen3_5-tiny's
 * 300-token prompt; with every product in float32 (PAGODA_CUDA_BATCH_INVARIANT=1) it is
 * 0.003 there. */
#define CUDA_TOL_HYBRID 8e-2
/* BitNet on the CPU: its products are exact (int8 activations times ternary weights), but
 * the int8 rounding of each activation turns a last-bit difference upstream (a norm's or the
 * attention's summation order) into a whole quantization step whenever a value sits at a
 * rounding boundary, and steps then carry through the KV. Prompt log-probabilities agree to
 * 1e-6 in the median; the largest deviation seen was 0.032 (bitnet-bf16, whose reference
 * also sums dequantized floats), 0.015 with packed weights. */
#define BITNET_TOL 5e-2
/* BitNet on CUDA: on top of that, the bf16 KV rows (and the bf16 activations of the prefill
 * head products) move values across int8 rounding steps too. Measured on the CPU path with
 * the KV cache in bf16 (--kv-cache-dtype bf16, default fast products): largest deviation
 * 0.054 (bitnet-packed) and 0.053 (bitnet-bf16), 4 values above 0.05, no greedy path
 * diverging. The bound leaves twice that; not yet measured on a GPU. */
#define CUDA_TOL_BITNET 0.1

/* With the KV cache in fp8 (e4m3: 3 mantissa bits, a scale per token and head), on top of
 * the device's own tolerance. These tiny random-weight models magnify KV rounding: on the
 * CPU the largest deviation seen was 0.32 (models/demo) over the other folders, 1.01 on
 * gemma4-tiny and 2.04 on gemma4moe-tiny, whose log-probabilities even bf16 KV moves by
 * 0.12; hence Gemma 4's own bound. */
#define KV_FP8_TOL    0.35
#define KV_FP8_TOL_G4 2.5

static double TOL = CPU_TOL;
static double MARGIN = GOLDEN_MARGIN; /* see golden_util.h */
static double KV_TOL = 0;             /* added by the KV cache format (0: auto) */
static int on_cuda;
static const char *device = "cpu";
static const char *kv_dtype = "auto";
/* " --batch-invariant" with --mode invariant, else "" (the default kernels) */
static const char *mode_opt = "";
static double max_dev;          /* largest log-probability deviation seen */
static int tp = 1;              /* --tensor-parallel-size */
static int part = 1, parts = 1; /* --part K/N */
static char tp_opt[32];         /* " -tp N" with N > 1 */

static char *run(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 >= cap) buf = xrealloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    if (st != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

static char *ids_str(const cJSON *arr)
{
    size_t cap = 16 + (size_t)cJSON_GetArraySize(arr) * 8, n = 0;
    char *s = xmalloc(cap);
    s[0] = 0;
    for (const cJSON *it = arr->child; it; it = it->next)
        n += (size_t)snprintf(s + n, cap - n, "%s%d", n ? " " : "", it->valueint);
    return s;
}

/* Returns the number of failed checks for one case. */
static int check_case(const char *bin, const char *dir, const char *name, int ci, const cJSON *cs)
{
    int fails = 0;
    const cJSON *pids = cJSON_GetObjectItem(cs, "prompt_ids");
    const cJSON *greedy = cJSON_GetObjectItem(cs, "greedy_ids");
    const cJSON *steps = cJSON_GetObjectItem(cs, "steps");
    const cJSON *plp = cJSON_GetObjectItem(cs, "prompt_logprobs");
    char *ids = ids_str(pids);
    size_t cmdlen = strlen(ids) + 4096;
    char *cmd = xmalloc(cmdlen);
    snprintf(
        cmd, cmdlen,
        "'%s' generate --device %s%s%s --kv-cache-dtype %s --model '%s' --prompt-ids '%s' -n %d "
        "--temperature 0 --ignore-eos --top-logprobs 5 --json",
        bin, device, mode_opt, tp_opt, kv_dtype, dir, ids, cJSON_GetArraySize(greedy));
    char *out = run(cmd);
    cJSON *res = out ? cJSON_Parse(out) : NULL;
    if (!res) {
        fprintf(stderr, "%s case %d: generate failed: %s\n", name, ci, cmd);
        free(out);
        free(ids);
        free(cmd);
        return 1;
    }
    const cJSON *got = cJSON_GetObjectItem(res, "ids");
    const cJSON *tops = cJSON_GetObjectItem(res, "top_logprobs");
    int n = cJSON_GetArraySize(greedy);
    CHECK(cJSON_GetArraySize(got) == n, "%s case %d: %d tokens, expected %d", name, ci,
          cJSON_GetArraySize(got), n);
    for (int i = 0; i < n && i < cJSON_GetArraySize(got); i++) {
        const cJSON *st = cJSON_GetArrayItem(steps, i);
        const cJSON *gtop = cJSON_GetObjectItem(st, "top");
        int want = cJSON_GetArrayItem(greedy, i)->valueint;
        int have = cJSON_GetArrayItem(got, i)->valueint;
        /* top-5 log-probabilities while the paths agree */
        const cJSON *mytop = cJSON_GetArrayItem(tops, i);
        for (const cJSON *g = gtop->child; g; g = g->next) {
            int gid = cJSON_GetArrayItem(g, 0)->valueint;
            double glp = cJSON_GetArrayItem(g, 1)->valuedouble;
            int found = 0;
            for (const cJSON *m = mytop->child; m; m = m->next) {
                if (cJSON_GetArrayItem(m, 0)->valueint != gid) continue;
                found = 1;
                double mlp = cJSON_GetArrayItem(m, 1)->valuedouble;
                if (fabs(mlp - glp) > max_dev) max_dev = fabs(mlp - glp);
                if (fabs(mlp - glp) > TOL) {
                    fprintf(stderr, "%s case %d step %d: logprob of %d is %.6f, golden %.6f\n",
                            name, ci, i, gid, mlp, glp);
                    fails++;
                }
            }
            /* A golden top-5 entry may fall just outside ours only when it ties with our 5th. */
            if (!found) {
                double my5 = cJSON_GetArrayItem(cJSON_GetArrayItem(mytop, 4), 1)->valuedouble;
                if (fabs(glp - my5) > TOL) {
                    fprintf(stderr, "%s case %d step %d: golden top token %d (%.6f) not in ours\n",
                            name, ci, i, gid, glp);
                    fails++;
                }
            }
        }
        if (have != want) {
            double margin = cJSON_GetObjectItem(st, "margin")->valuedouble;
            int second = cJSON_GetArrayItem(cJSON_GetArrayItem(gtop, 1), 0)->valueint;
            /* A quantized KV cache moves every log-probability by up to its tolerance, more
             * than the gaps of these models' flat distributions: the greedy paths may part
             * anywhere; the steps before and the prompt log-probabilities are compared. */
            if (KV_TOL == 0 && !(margin < MARGIN && (have == want || have == second))) {
                fprintf(stderr, "%s case %d step %d: token %d, golden %d (margin %.4f)\n", name, ci,
                        i, have, want, margin);
                fails++;
            }
            break; /* the paths diverge legitimately from here on */
        }
    }
    cJSON_Delete(res);
    free(out);

    snprintf(cmd, cmdlen,
             "'%s' score --device %s%s%s --kv-cache-dtype %s --model '%s' --prompt-ids '%s' --json",
             bin, device, mode_opt, tp_opt, kv_dtype, dir, ids);
    out = run(cmd);
    res = out ? cJSON_Parse(out) : NULL;
    const cJSON *lp = cJSON_GetObjectItem(res, "prompt_logprobs");
    if (!lp || cJSON_GetArraySize(lp) != cJSON_GetArraySize(plp)) {
        fprintf(stderr, "%s case %d: score failed or has the wrong length\n", name, ci);
        fails++;
    } else {
        CHECK(cJSON_IsNull(cJSON_GetArrayItem(lp, 0)), "%s case %d: first prompt logprob not null",
              name, ci);
        for (int i = 1; i < cJSON_GetArraySize(plp); i++) {
            double g = cJSON_GetArrayItem(plp, i)->valuedouble;
            double m = cJSON_GetArrayItem(lp, i)->valuedouble;
            if (fabs(g - m) > max_dev) max_dev = fabs(g - m);
            if (fabs(g - m) > TOL) {
                fprintf(stderr, "%s case %d: prompt logprob %d is %.6f, golden %.6f\n", name, ci, i,
                        m, g);
                fails++;
            }
        }
    }
    cJSON_Delete(res);
    free(out);
    free(ids);
    free(cmd);
    return fails;
}

/* Compares one model folder with its golden.json; returns 1 when compared, 0 when skipped. */
static int check_folder(const char *bin, const char *dir, const char *name)
{
    char path[8192], arch[128];
    int ok = golden_arch(dir, arch, sizeof arch);
    if (!ok) {
        printf("%-24s %s: not an architecture of this engine, not compared\n", name, arch);
        return 0;
    }
    char why[64];
    if (tp > 1 && (!golden_tp_splits(arch) || !golden_tp_fits(dir, tp, why, sizeof why))) {
        /* refused when it loads, naming why */
        char cmd[9000];
        snprintf(cmd, sizeof cmd,
                 "%s score --device %s%s --model %s --prompt-ids '1 2' 2>&1; echo exit=$?", bin,
                 device, tp_opt, dir);
        char *out = run(cmd);
        const char *want = golden_tp_splits(arch) ? why : "does not run split";
        CHECK(out && strstr(out, want) && strstr(out, "exit=1"),
              "%s: a split %d ways should be refused at load time (\"%s\"): %s", name, tp, want,
              out ? out : "(no output)");
        free(out);
        printf("%-24s %s: refused split %d ways at load time, not compared\n", name, arch, tp);
        return 0;
    }
    if (!golden_device_runs(arch, device)) {
        /* refused when it loads, with a message naming what is missing: never mid-step */
        char cmd[9000];
        snprintf(cmd, sizeof cmd,
                 "%s score --device %s --model %s --prompt-ids '1 2' 2>&1; echo exit=$?", bin,
                 device, dir);
        char *out = run(cmd);
        CHECK(out && strstr(out, "does not run yet") && strstr(out, "exit=1"),
              "%s: the %s backend should refuse %s at load time: %s", name, device, arch,
              out ? out : "(no output)");
        free(out);
        printf("%-24s %s: refused by the %s backend at load time, not compared\n", name, arch,
               device);
        return 0;
    }
    const double tol = TOL;
    /* what the KV cache format adds (Gemma 4 its own bound) to the device's tolerance */
    const double kv_add = KV_TOL > 0 && !strcmp(arch, "Gemma4ForCausalLM") ? KV_FP8_TOL_G4 : KV_TOL;
    TOL = tol - KV_TOL + kv_add;
    if (on_cuda && (!strcmp(arch, "Qwen3_5ForCausalLM") || !strcmp(arch, "Qwen3_5MoeForCausalLM")))
        TOL = CUDA_TOL_HYBRID + kv_add;
    const char *inv = getenv("PAGODA_CUDA_BATCH_INVARIANT");
    char *inv_was = inv ? strdup(inv) : NULL;
    if (golden_kv16_sensitive(arch, device)) {
        TOL = GOLDEN_TOL_KV16 + kv_add;
        MARGIN = GOLDEN_MARGIN_KV16;
        setenv("PAGODA_CUDA_BATCH_INVARIANT", "1", 1); /* float32 products: see golden_util.h */
    }
    const char *mode_was = mode_opt;
    if (!on_cuda && !*mode_opt && !strcmp(arch, "Gemma4ForCausalLM")) {
        mode_opt = " --batch-invariant";
        TOL = CPU_TOL + kv_add;
    }
    if (on_cuda && !strcmp(arch, "BitNetForCausalLM")) TOL = CUDA_TOL_BITNET + kv_add;
    if (TOL == CPU_FAST_TOL && !strcmp(arch, "BitNetForCausalLM")) TOL = BITNET_TOL;
    if (TOL == CPU_TOL && !strcmp(arch, "BitNetForCausalLM")) TOL = BITNET_TOL;
    snprintf(path, sizeof path, "%s/golden.json", dir);
    char *gtext = util_read_file(path, NULL, NULL);
    cJSON *g = gtext ? cJSON_Parse(gtext) : NULL;
    free(gtext);
    const cJSON *cases = cJSON_GetObjectItem(g, "cases");
    CHECK(cJSON_GetArraySize(cases) > 0, "%s: golden.json has no cases", name);
    int before = test_failures, ci = 0;
    const double dev_before = max_dev;
    max_dev = 0;
    for (const cJSON *cs = cases ? cases->child : NULL; cs; cs = cs->next, ci++)
        test_failures += check_case(bin, dir, name, ci, cs);
    printf("%-24s %-20s %d cases: %s (largest deviation %.4f, tolerance %g)\n", name, arch, ci,
           test_failures == before ? "ok" : "FAILED", max_dev, TOL);
    if (dev_before > max_dev) max_dev = dev_before;
    TOL = tol;
    MARGIN = GOLDEN_MARGIN;
    mode_opt = mode_was;
    if (inv_was)
        setenv("PAGODA_CUDA_BATCH_INVARIANT", inv_was, 1);
    else
        unsetenv("PAGODA_CUDA_BATCH_INVARIANT");
    free(inv_was);
    cJSON_Delete(g);
    return 1;
}

/* Builds a variant's folder under tmp (links to its files and the base model's); returns 1
 * when compared. */
static int check_variant(const char *bin, const char *mdir, const char *vdir, const char *name,
                         const char *tmp)
{
    char path[8192], dir[4400];
    snprintf(path, sizeof path, "%s/golden.json", vdir);
    char *g = util_read_file(path, NULL, NULL);
    cJSON *j = g ? cJSON_Parse(g) : NULL;
    free(g);
    const cJSON *base = cJSON_GetObjectItem(j, "base");
    if (!cJSON_IsString(base)) {
        CHECK(0, "%s: golden.json names no base model", name);
        cJSON_Delete(j);
        return 0;
    }
    snprintf(dir, sizeof dir, "%s/%s", tmp, name);
    const char *fmt =
        "mkdir -p '%s' && for f in '%s/%s'/*; do ln -sf \"$(realpath \"$f\")\" "
        "'%s'/; done && for f in '%s'/*; do ln -sf \"$(realpath \"$f\")\" '%s'/; done";
    int len = snprintf(NULL, 0, fmt, dir, mdir, base->valuestring, dir, vdir, dir);
    char *cmd = xmalloc((size_t)len + 1);
    snprintf(cmd, (size_t)len + 1, fmt, dir, mdir, base->valuestring, dir, vdir, dir);
    cJSON_Delete(j);
    int rc = system(cmd);
    free(cmd);
    if (rc != 0) {
        CHECK(0, "%s: cannot assemble the variant folder", name);
        return 0;
    }
    return check_folder(bin, dir, name);
}

int main(int argc, char **argv)
{
    int bad = argc < 3 || argc % 2 == 0;
    for (int i = 3; i + 1 < argc && !bad; i += 2) {
        if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
        else if (!strcmp(argv[i], "--kv-cache-dtype"))
            kv_dtype = argv[i + 1];
        else if (!strcmp(argv[i], "--mode") && !strcmp(argv[i + 1], "invariant"))
            mode_opt = " --batch-invariant";
        else if (!strcmp(argv[i], "--mode") && !strcmp(argv[i + 1], "default"))
            mode_opt = "";
        else if (!strcmp(argv[i], "--tensor-parallel-size") && atoi(argv[i + 1]) >= 1)
            tp = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--part") && sscanf(argv[i + 1], "%d/%d", &part, &parts) == 2 &&
                 parts >= 1 && part >= 1 && part <= parts)
            continue;
        else
            bad = 1;
    }
    if (bad) {
        fprintf(stderr,
                "usage: %s PAGODA_BINARY TESTDATA_DIR [--device DEV] [--kv-cache-dtype D] "
                "[--mode default|invariant] [--tensor-parallel-size N] [--part K/N]\n"
                "  --part K/N: only the K-th of N shares of the model folders (folder i when\n"
                "  i %% N == K - 1; the demo model and the variants with the first), for hosts\n"
                "  that bound a run's time\n",
                argv[0]);
        return 2;
    }
    if (!strncmp(device, "cuda", 4)) {
        if (!backend_cuda_available()) {
            printf("no GPU: not run (the CUDA golden comparison needs a CUDA GPU)\n");
            return 77;
        }
        if (backend_gpu_count() < tp) {
            printf("no GPU: not run (%d GPUs, the split needs %d)\n", backend_gpu_count(), tp);
            return 77;
        }
        TOL = CUDA_TOL;
        on_cuda = 1;
    } else if (!*mode_opt) {
        TOL = CPU_FAST_TOL;
    }
    if (!strcmp(kv_dtype, "fp8")) {
        KV_TOL = KV_FP8_TOL;
        TOL += KV_TOL;
    } else if (strcmp(kv_dtype, "auto")) {
        fprintf(stderr, "--kv-cache-dtype: only auto and fp8 have golden tolerances\n");
        return 2;
    }
    if (tp > 1) snprintf(tp_opt, sizeof tp_opt, " -tp %d", tp);
    printf("device %s, KV cache %s, log-probability tolerance %g, tensor parallel %d\n", device,
           kv_dtype, TOL, tp);
    char mdir[4096];
    snprintf(mdir, sizeof mdir, "%s/models", argv[2]);
    char *names[256];
    int nn = golden_list(mdir, names, 256);
    if (nn < 0) return 1;
    int tested = 0;
    for (int i = 0; i < nn; i++) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/%s", mdir, names[i]);
        if (i % parts == part - 1) tested += check_folder(argv[1], dir, names[i]);
    }
    /* The bundled demo model (tools/train_demo.py wrote its golden with transformers). */
    if (part == 1)
        CHECK(check_folder(argv[1], "models/demo", "models/demo") == 1,
              "models/demo is missing or not a dense architecture");
    if (tp > 1 || part > 1) { /* split: the folders of the families that split; no variants */
        for (int i = 0; i < nn; i++) free(names[i]);
        printf("largest log-probability deviation: %.6f\n", max_dev);
        /* 10 architectures in bf16 (Gemma 4 dense and MoE apart) and 9 quantized copies, less
         * those a split refuses (qwen3moe-tiny-mlx4's expert width 4 ways: 16 inputs, no
         * whole group; Qwen3.5's and Qwen3.5 MoE's 2 linear-attention key heads 4 ways) */
        CHECK(parts > 1 || tested >= (tp == 2 ? 19 : 15), "only %d folders compared split %d ways",
              tested, tp);
        /* a share may hold none of them: the caller sums the shares' counts */
        printf("folders compared: %d\n", tested);
        TEST_DONE();
    }
    for (int i = 0; i < nn; i++) free(names[i]);

    /* Variants with goldens of their own. */
    char tmp[] = "/tmp/pagoda-variants-XXXXXX";
    int variants = 0;
    DIR *d = opendir("tests/golden/variants");
    struct dirent *de;
    CHECK(d && mkdtemp(tmp), "tests/golden/variants or a temporary folder is missing");
    while (d && (de = readdir(d))) {
        char vdir[4200];
        snprintf(vdir, sizeof vdir, "tests/golden/variants/%s", de->d_name);
        char gp[4400];
        snprintf(gp, sizeof gp, "%s/golden.json", vdir);
        if (de->d_name[0] == '.' || access(gp, R_OK) != 0) continue;
        variants += check_variant(argv[1], mdir, vdir, de->d_name, tmp);
    }
    if (d) closedir(d);
    char rm[256];
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmp);
    if (system(rm) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    /* rope-linear, rope-dynamic, rope-yarn, nvfp4, bitnet-packed, bitnet-bf16 */
    const int want_variants = 6;
    CHECK(variants == want_variants, "%d variants compared, want %d", variants, want_variants);

    printf("largest log-probability deviation: %.6f\n", max_dev);
    /* The reference data holds 12 dense folders (6 architectures, 6 quantized copies). */
    CHECK(parts > 1 || tested >= 12, "only %d dense model folders found", tested);
    TEST_DONE();
}
