/* cli/tools: tokenize, info, perplexity and logits: the subcommands that
 * inspect a file or measure a model rather than chat with it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define USAGE_ERR(...) (cli_error(__VA_ARGS__), EXIT_USAGE)

/* ---- tokenize ---- */

static const char TOKENIZE_HELP[] =
    "usage: tokenloop tokenize -m FILE (-p TEXT | --stdin) [--ids] [--bos] [--no-special]\n"
    "\n"
    "  -m, --model FILE  GGUF file (a vocabulary-only file is enough)\n"
    "  -p, --prompt TEXT the text\n"
    "      --stdin       read the text from stdin, verbatim (no escape processing)\n"
    "      --ids         print the ids as one JSON array on one line\n"
    "      --bos         prepend the BOS token (default: none)\n"
    "      --no-special  treat special-token text such as <|im_start|> as plain text\n"
    "\n"
    "Without --ids, prints one line per token: id and its text.\n";

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL;
    int from_stdin = 0, ids_only = 0, bos = 0, special = 1;
    cli_args p = cli_args_start(argc, argv);
    const char *a;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(TOKENIZE_HELP, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "--stdin")) {
            from_stdin = 1;
        } else if (!strcmp(a, "--ids")) {
            ids_only = 1;
        } else if (!strcmp(a, "--bos")) {
            bos = 1;
        } else if (!strcmp(a, "--no-special")) {
            special = 0;
        } else {
            return USAGE_ERR("unknown option '%s' (try 'tokenloop tokenize --help')", a);
        }
    }
    if (more < 0) return EXIT_USAGE;
    if (!model) return USAGE_ERR("tokenize needs -m FILE");
    if (!prompt == !from_stdin) return USAGE_ERR("give exactly one of -p TEXT or --stdin");
    size_t len;
    char *owned = NULL;
    if (from_stdin) {
        if (!(owned = cli_read_file("-", &len))) return 1;
        prompt = owned;
    } else {
        len = strlen(prompt);
    }
    tl_error err = {0};
    tl_model *m = NULL;
    if (tl_model_load_vocab(model, &m, &err)) {
        free(owned);
        cli_error("%s: %s", model, err.msg);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int flags = (bos ? TL_TOK_ADD_BOS : 0) | (special ? TL_TOK_PARSE_SPECIAL : 0);
    int rc = tl_tokenize(m, prompt, len, flags, &ids, &n, &err);
    if (rc) {
        cli_tl_error(&err);
    } else if (ids_only) {
        putchar('[');
        for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
        puts("]");
    } else {
        char piece[512];
        for (size_t i = 0; i < n; i++) {
            size_t pl = tl_token_piece(m, ids[i], 1, piece, sizeof piece);
            printf("%6d -> '%.*s'\n", ids[i], (int)(pl < sizeof piece ? pl : sizeof piece), piece);
        }
    }
    tl_free(ids);
    tl_model_free(m);
    free(owned);
    return rc ? 1 : 0;
}

/* ---- info ---- */

int cmd_info(int argc, char **argv) {
    const char *model = NULL;
    cli_args p = cli_args_start(argc, argv);
    const char *a;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            puts("usage: tokenloop info -m FILE\n\nDescribes a GGUF file: architecture, "
                 "hyperparameters, tensor types, vocabulary,\nspecial tokens, chat template, "
                 "file size; then whether this build runs it\n(\"runs: yes\", with the weight bytes a "
                 "token reads, or \"runs: no\" naming the\narchitecture, tensor, type or metadata key it "
                 "lacks), and the KV cache bytes per position for each cache type. Exit status 0 when the file\nis described, whether or not it runs; "
                 "corrupt files get an error, exit status 1.");
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_arg(&p))) return EXIT_USAGE;
        } else if (!model && a[0] != '-') {
            model = a;
        } else {
            return USAGE_ERR("unknown option '%s' (try 'tokenloop info --help')", a);
        }
    }
    if (more < 0) return EXIT_USAGE;
    if (!model) return USAGE_ERR("info needs -m FILE");
    tl_error err = {0};
    if (tl_gguf_describe(model, stdout, &err)) {
        fflush(stdout);
        cli_error("%s: %s", model, err.msg);
        return 1;
    }
    printf("this build runs: architectures %s; tokenizers %s; weight types %s\n",
           tl_supported_architectures(), tl_supported_tokenizers(), tl_supported_weight_types());
    /* the loader's own checks, so the verdict is exactly what run and serve
     * would find */
    tl_model *m = NULL;
    if (tl_model_load(model, &m, &err)) {
        printf("runs: no: %s\n", err.msg);
    } else if (!tl_model_can_run(m)) {
        printf("runs: no: a vocabulary only (no architecture or weights)\n");
    } else {
        const double mib = (double)tl_model_decode_bytes(m) / (1024.0 * 1024.0);
        printf("runs: yes; a token reads %.1f MiB of weights", mib);
        int used = 0;
        const int ne = tl_model_n_expert(m, &used);
        if (ne > 0) printf(" (the chosen %d of %d experts in each layer)", used, ne);
        putchar('\n');
        /* what a context costs, per cache type (--kv-type) */
        const int train = tl_model_n_ctx_train(m);
        printf("KV cache per position:");
        for (int t = TL_KV_F16; t <= TL_KV_Q4_0; t++) {
            const size_t b = tl_model_kv_bytes_per_pos(m, t, t);
            if (b || tl_model_kv_window_bytes(m, t, t, NULL)) printf(" %s %zu bytes%s", tl_kv_type_name(t), b, train > 0 ? "" : ";");
            else printf(" %s (no: the head size is not a multiple of 32)%s", tl_kv_type_name(t), t < TL_KV_Q4_0 ? "," : "");
            if (b && train > 0) printf(" (%.1f MiB for the training context of %d)%s", (double)b * train / (1 << 20), train,
                                       t < TL_KV_Q4_0 ? "," : "");
        }
        putchar('\n');
        int n_swa = 0;
        const size_t wb = tl_model_kv_window_bytes(m, TL_KV_F16, TL_KV_F16, &n_swa);
        if (wb)
            printf("sliding-window layers: %zu bytes per position more in f16, a sequence keeping only its last %d "
                   "(the window) plus a batch of them: %.1f MiB at -b 512 (--swa-full: every position)\n",
                   wb, n_swa, (double)wb * tl_model_kv_ring_positions(m, 512) / (1 << 20));
        int n_rec = 0;
        const size_t sb = tl_model_state_bytes(m, &n_rec);
        if (sb)
            printf("recurrent state per sequence: %.2f MiB in %d Gated DeltaNet layers (the KV cache is the attention "
                   "layers')\n",
                   (double)sb / (1 << 20), n_rec);
    }
    tl_model_free(m);
    return 0;
}

/* ---- shared: load a runnable model and a context ---- */

static int open_ctx(const char *model, int n_ctx, int n_batch, int n_threads, int numerics, int kv_k, int kv_v,
                    int swa_full, tl_model **m, tl_ctx **ctx) {
    char buf[4096];
    tl_error err = {0};
    const char *path = model ? model : cli_default_model(buf, sizeof buf);
    if (tl_model_load(path, m, &err)) {
        cli_error("%s: %s", path, err.msg);
        return -1;
    }
    tl_ctx_params cp = {.n_ctx = n_ctx, .n_batch = n_batch, .n_threads = n_threads, .numerics = numerics,
                        .kv_type_k = kv_k, .kv_type_v = kv_v, .swa_full = swa_full};
    cli_kv_type_warn(kv_k, kv_v);
    if (tl_ctx_new(*m, &cp, ctx, &err)) {
        cli_tl_error(&err);
        tl_model_free(*m);
        return -1;
    }
    return 0;
}

/* ---- perplexity: llama.cpp's protocol (tools/perplexity) ---- */

static const char PPL_HELP[] =
    "usage: tokenloop perplexity -m FILE -f TEXT [-c 512] [--chunks N] [-b N] [-t N]\n"
    "                             [--numerics fast|exact] [--kv-type f16|q8_0|q4_0] [--kv-type-k T] [--kv-type-v T]\n"
    "                             [--swa-full]\n"
    "\n"
    "The text is tokenized whole and cut into non-overlapping chunks of -c tokens;\n"
    "the first token of each chunk becomes BOS where the model adds one; only the\n"
    "second half of each chunk is scored. Needs at least 2*c tokens. Prints a running\n"
    "estimate per chunk and a last line 'Final estimate: PPL = <value> +/- <stderr>'.\n"
    "--chunks N scores the first N chunks only (llama-perplexity's --chunks; default all).\n";

/* -log p(tok | logits), with the log-sum-exp in double. */
static double nll_of(const float *logits, int n_vocab, int32_t tok) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > mx) mx = logits[i];
    double sum = 0.0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)(logits[i] - mx));
    return log(sum) - (double)(logits[tok] - mx);
}

int cmd_perplexity(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    int n_ctx = 512, n_batch = 0, n_threads = 0, numerics = 0, kv_k = 0, kv_v = 0, kt, max_chunks = 0, swa_full = 0;
    cli_args p = cli_args_start(argc, argv);
    const char *a;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        const char *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(PPL_HELP, stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 8, 1 << 20, &n_ctx)) return EXIT_USAGE;
        } else if (!strcmp(a, "--chunks")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1 << 30, &max_chunks)) return EXIT_USAGE;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1 << 20, &n_batch)) return EXIT_USAGE;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1024, &n_threads)) return EXIT_USAGE;
        } else if (!strcmp(a, "--numerics")) {
            if (!(v = cli_arg(&p)) || cli_numerics(a, v, &numerics)) return EXIT_USAGE;
        } else if ((kt = cli_kv_type_opt(&p, a, &kv_k, &kv_v)) != 0) {
            if (kt < 0) return EXIT_USAGE;
        } else if (!strcmp(a, "--swa-full")) {
            swa_full = 1;
        } else {
            return USAGE_ERR("unknown option '%s' (try 'tokenloop perplexity --help')", a);
        }
    }
    if (more < 0) return EXIT_USAGE;
    if (!file) return USAGE_ERR("perplexity needs -f TEXT");
    size_t len;
    char *text = cli_read_file(file, &len);
    if (!text) return 1;
    tl_model *m;
    tl_ctx *ctx;
    if (open_ctx(model, n_ctx, n_batch ? n_batch : n_ctx, n_threads, numerics, kv_k, kv_v, swa_full, &m, &ctx)) {
        free(text);
        return 1;
    }
    tl_error err = {0};
    int32_t *ids = NULL, *chunk = NULL;
    size_t n = 0;
    int rc = 1, add_bos = tl_model_add_bos(m), nv = tl_model_n_vocab(m);
    if (tl_tokenize(m, text, len, TL_TOK_PARSE_SPECIAL | (add_bos ? TL_TOK_ADD_BOS : 0), &ids, &n, &err)) {
        cli_tl_error(&err);
        goto done;
    }
    if (n < 2 * (size_t)n_ctx) {
        cli_error("the text has %zu tokens; perplexity with -c %d needs at least %d", n, n_ctx, 2 * n_ctx);
        goto done;
    }
    size_t n_chunk = n / (size_t)n_ctx;
    if (max_chunks > 0 && (size_t)max_chunks < n_chunk) n_chunk = (size_t)max_chunks;
    int first = n_ctx / 2;
    fprintf(stderr, "perplexity: %zu tokens, %zu chunks of %d, scoring positions %d..%d\n", n,
            n_chunk, n_ctx, first, n_ctx - 2);
    if (!(chunk = malloc((size_t)n_ctx * sizeof *chunk))) {
        cli_error("out of memory");
        goto done;
    }
    double nll = 0, nll2 = 0;
    long count = 0;
    for (size_t c = 0; c < n_chunk; c++) {
        size_t start = c * (size_t)n_ctx;
        memcpy(chunk, ids + start, (size_t)n_ctx * sizeof *chunk);
        if (add_bos) chunk[0] = tl_token_bos(m);
        if (tl_ctx_truncate(ctx, 0, &err) || tl_ctx_eval(ctx, chunk, (size_t)n_ctx, 1, &err)) {
            cli_tl_error(&err);
            goto done;
        }
        for (int j = first; j < n_ctx - 1; j++) {
            double v = nll_of(tl_ctx_logits(ctx, j), nv, ids[start + (size_t)j + 1]);
            nll += v;
            nll2 += v * v;
            count++;
        }
        fprintf(stderr, "[%zu]%.4f,", c + 1, exp(nll / (double)count));
        fflush(stderr);
    }
    double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
    double ppl = exp(mean);
    double se = var > 0 && count > 1 ? sqrt(var / (double)(count - 1)) : 0;
    fprintf(stderr, "\n");
    printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, se * ppl);
    rc = 0;
done:
    free(chunk);
    tl_free(ids);
    tl_ctx_free(ctx);
    tl_model_free(m);
    free(text);
    return rc;
}

/* ---- logits: raw logits of a token sequence, for comparison with peers ---- */

static int parse_ids(const char *s, int32_t **out, size_t *n) {
    size_t cap = 64, k = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return -1;
    while (*s) {
        if (*s == '[' || *s == ']' || *s == ',' || *s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') {
            s++;
            continue;
        }
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) {
            free(ids);
            return -1;
        }
        if (k == cap) {
            int32_t *ni = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!ni) {
                free(ids);
                return -1;
            }
            ids = ni;
        }
        ids[k++] = (int32_t)v;
        s = end;
    }
    *out = ids;
    *n = k;
    return 0;
}

int cmd_logits(int argc, char **argv) {
    const char *model = NULL, *ids_file = NULL, *ids_arg = NULL, *outp = NULL;
    int n_threads = 0, n_batch = 0, numerics = 0, n_ctx = 0, kv_k = 0, kv_v = 0, kt, swa_full = 0;
    cli_args p = cli_args_start(argc, argv);
    const char *a;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        const char *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            puts("usage: tokenloop logits -m FILE (--ids-file F.json | --ids 1,2,3) -o OUT.bin "
                 "[-c N] [-t N] [-b N] [--numerics fast|exact]\n                      [--kv-type T] [--kv-type-k T] [--kv-type-v T] [--swa-full]\n\nEvaluates the token ids from an empty cache (in one batched "
                 "forward call unless -b\nsays otherwise) and writes n_tokens x n_vocab float32 "
                 "little-endian logits.\n-c: the context size (default: the number of ids; Phi-3's LongRoPE\n"
                 "factors depend on it, as in llama.cpp).");
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "--ids-file")) {
            if (!(ids_file = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "--ids")) {
            if (!(ids_arg = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "-o")) {
            if (!(outp = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1024, &n_threads)) return EXIT_USAGE;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1 << 20, &n_batch)) return EXIT_USAGE;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1 << 24, &n_ctx)) return EXIT_USAGE;
        } else if (!strcmp(a, "--numerics")) {
            if (!(v = cli_arg(&p)) || cli_numerics(a, v, &numerics)) return EXIT_USAGE;
        } else if ((kt = cli_kv_type_opt(&p, a, &kv_k, &kv_v)) != 0) {
            if (kt < 0) return EXIT_USAGE;
        } else if (!strcmp(a, "--swa-full")) {
            swa_full = 1;
        } else {
            return USAGE_ERR("unknown option '%s' (try 'tokenloop logits --help')", a);
        }
    }
    if (more < 0) return EXIT_USAGE;
    if (!outp || !ids_file == !ids_arg) return USAGE_ERR("logits needs -o OUT and one of --ids-file/--ids");
    size_t len;
    char *owned = ids_file ? cli_read_file(ids_file, &len) : NULL;
    if (ids_file && !owned) return 1;
    int32_t *ids;
    size_t n;
    if (parse_ids(owned ? owned : ids_arg, &ids, &n) || n == 0) {
        free(owned);
        return USAGE_ERR("could not parse the token ids (a JSON array of non-negative integers)");
    }
    free(owned);
    tl_model *m;
    tl_ctx *ctx;
    int need = (int)n;
    if (n_ctx && n_ctx < need) {
        free(ids);
        return USAGE_ERR("-c %d is shorter than the %d ids", n_ctx, need);
    }
    if (open_ctx(model, n_ctx ? n_ctx : need, n_batch ? n_batch : need, n_threads, numerics, kv_k, kv_v, swa_full, &m,
                 &ctx)) {
        free(ids);
        return 1;
    }
    tl_error err = {0};
    int rc = 1;
    FILE *f = NULL;
    if (tl_ctx_eval(ctx, ids, n, 1, &err)) {
        cli_tl_error(&err);
    } else if (!(f = fopen(outp, "wb"))) {
        cli_error("cannot write %s", outp);
    } else {
        int nv = tl_model_n_vocab(m);
        rc = 0;
        for (size_t i = 0; i < n && !rc; i++)
            if (fwrite(tl_ctx_logits(ctx, (int)i), sizeof(float), (size_t)nv, f) != (size_t)nv) rc = 1;
        if (fclose(f) || rc) {
            cli_error("write to %s failed", outp);
            rc = 1;
        }
    }
    free(ids);
    tl_ctx_free(ctx);
    tl_model_free(m);
    return rc;
}
