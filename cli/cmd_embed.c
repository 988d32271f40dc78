/* cli/cmd_embed: `tokenloop embed`, texts to vectors (tl_ctx_embed), printed
 * as OpenAI's embeddings response. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char EMBED_HELP[] =
    "usage: tokenloop embed -m FILE (-p TEXT ... | -f FILE) [--pooling P] [--no-normalize]\n"
    "                       [-c N] [-b N] [-t N] [--numerics fast|exact]\n"
    "\n"
    "Prints one embedding per text as JSON, in the shape of OpenAI's /v1/embeddings\n"
    "response: {\"object\":\"list\",\"data\":[{\"object\":\"embedding\",\"index\":0,\n"
    "\"embedding\":[...]}],\"model\":...,\"usage\":{...}}. Each text is tokenized as\n"
    "llama-embedding does (BOS and EOS where the file asks for them, special tokens\n"
    "parsed) and run as one sequence; its vector is the output-normed hidden states\n"
    "pooled.\n"
    "\n"
    "  -m, --model FILE        GGUF model\n"
    "  -p, --prompt TEXT       a text to embed (repeatable)\n"
    "  -f, --file FILE         texts to embed, one per line ('-': stdin)\n"
    "      --pooling P         mean, cls, last or none (a vector per token); default: the\n"
    "                          file's pooling_type, else mean. rank: a reranker's scores\n"
    "                          (tl_model_n_cls_out each, not normalized; see tokenloop rerank)\n"
    "      --no-normalize      the pooled vector as it is (default: unit L2 length)\n"
    "  -c, --ctx-size N        the longest text in tokens (default: the longest given)\n"
    "  -b, --batch-size N      tokens per forward call (default 512; longer texts are chunked)\n"
    "  -t, --threads N         threads (default: the cores)\n" CLI_NUMERICS_HELP;

#define MAX_TEXTS 4096

static void print_vec(const float *v, int d) {
    putchar('[');
    for (int i = 0; i < d; i++) printf(i ? ",%.9g" : "%.9g", (double)v[i]);
    putchar(']');
}

int cmd_embed(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    const char **texts = calloc(MAX_TEXTS, sizeof *texts);
    int n_texts = 0, pooling = TL_POOL_MODEL, normalize = 1, n_ctx = 0, n_batch = 512, n_threads = 0, numerics = 0;
    if (!texts) {
        cli_error("out of memory");
        return 1;
    }
    cli_args p = cli_args_start(argc, argv);
    const char *a, *v;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(EMBED_HELP, stdout);
            free(texts);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_arg(&p))) goto usage;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(v = cli_arg(&p))) goto usage;
            if (n_texts == MAX_TEXTS) {
                cli_error("more than %d texts", MAX_TEXTS);
                goto usage;
            }
            texts[n_texts++] = v;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = cli_arg(&p))) goto usage;
        } else if (!strcmp(a, "--pooling")) {
            if (!(v = cli_arg(&p))) goto usage;
            if ((pooling = tl_pooling_parse(v)) < 0) {
                cli_error("--pooling '%s': expected none, mean, cls, last or rank", v);
                goto usage;
            }
        } else if (!strcmp(a, "--no-normalize")) {
            normalize = 0;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1 << 24, &n_ctx)) goto usage;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1 << 20, &n_batch)) goto usage;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1024, &n_threads)) goto usage;
        } else if (!strcmp(a, "--numerics")) {
            if (!(v = cli_arg(&p)) || cli_numerics(a, v, &numerics)) goto usage;
        } else {
            cli_error("unknown option '%s' (try 'tokenloop embed --help')", a);
            goto usage;
        }
    }
    if (more < 0) goto usage;
    char *owned = NULL;
    if (file) {
        size_t len;
        if (!(owned = cli_read_file(file, &len))) {
            free(texts);
            return 1;
        }
        for (char *s = owned, *nl; *s && n_texts < MAX_TEXTS; s = nl + 1) {
            nl = strchr(s, '\n');
            if (nl) *nl = 0;
            if (*s) texts[n_texts++] = s;
            if (!nl) break;
        }
    }
    if (n_texts == 0) {
        free(owned);
        cli_error("embed needs at least one text (-p TEXT or -f FILE)");
        goto usage;
    }
    tl_error err = {0};
    tl_model *m = NULL;
    char buf[4096];
    const char *path = model ? model : cli_default_model(buf, sizeof buf);
    if (tl_model_load(path, &m, &err)) {
        cli_error("%s: %s", path, err.msg);
        free(owned);
        free(texts);
        return 1;
    }
    int32_t **ids = calloc((size_t)n_texts, sizeof *ids);
    size_t *nids = calloc((size_t)n_texts, sizeof *nids);
    int rc = !ids || !nids, longest = 0, total = 0;
    if (rc) cli_error("out of memory");
    for (int i = 0; !rc && i < n_texts; i++) {
        int32_t *t;
        size_t n;
        /* llama.cpp's add_special: BOS, and EOS where the file says so */
        if (tl_tokenize(m, texts[i], strlen(texts[i]), TL_TOK_ADD_SPECIAL | TL_TOK_PARSE_SPECIAL, &t, &n, &err)) {
            cli_tl_error(&err);
            rc = 1;
            break;
        }
        ids[i] = t;
        nids[i] = n;
        longest = (int)n > longest ? (int)n : longest;
        total += (int)n;
    }
    tl_ctx *ctx = NULL;
    if (!rc && n_ctx && n_ctx < longest) {
        cli_error("-c %d is shorter than the longest text (%d tokens)", n_ctx, longest);
        rc = 1;
    }
    tl_ctx_params cp = {.n_ctx = n_ctx ? n_ctx : longest, .n_batch = n_batch, .n_threads = n_threads,
                        .numerics = numerics, .n_seq_max = 1};
    if (!rc && tl_ctx_new(m, &cp, &ctx, &err)) {
        cli_tl_error(&err);
        rc = 1;
    }
    const int pool = pooling == TL_POOL_MODEL ? tl_model_pooling(m) : pooling;
    const int d = pool == TL_POOL_RANK ? tl_model_n_cls_out(m) : tl_model_n_embd(m);
    float *vec = rc || d <= 0 ? NULL : malloc((size_t)(pool == TL_POOL_NONE ? longest : 1) * (size_t)d * sizeof *vec);
    if (!rc && d <= 0) {
        cli_error("%s: pooling rank needs a classification head (cls.weight or cls.output.weight), which this "
                  "file does not have", path);
        rc = 1;
    } else
    if (!rc && !vec) {
        cli_error("out of memory");
        rc = 1;
    }
    if (!rc) printf("{\"object\":\"list\",\"data\":[");
    for (int i = 0; !rc && i < n_texts; i++) {
        int rows = tl_ctx_embed(ctx, ids[i], nids[i], pool, normalize, vec, &err);
        if (rows < 0) {
            printf("]}\n");
            cli_tl_error(&err);
            rc = 1;
            break;
        }
        printf(i ? ",{\"object\":\"embedding\",\"index\":%d,\"embedding\":" : "{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i);
        if (pool == TL_POOL_NONE) {
            putchar('[');
            for (int r = 0; r < rows; r++) {
                if (r) putchar(',');
                print_vec(vec + (size_t)r * d, d);
            }
            putchar(']');
        } else {
            print_vec(vec, d);
        }
        putchar('}');
    }
    if (!rc) {
        const char *base = strrchr(path, '/');
        printf("],\"model\":");
        cli_print_json_str(base ? base + 1 : path);
        printf(",\"pooling\":\"%s\",\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}\n", tl_pooling_name(pool),
               total, total);
    }
    free(vec);
    for (int i = 0; ids && i < n_texts; i++) tl_free(ids[i]);
    free(ids);
    free(nids);
    tl_ctx_free(ctx);
    tl_model_free(m);
    free(owned);
    free(texts);
    return rc;
usage:
    free(texts);
    return EXIT_USAGE;
}
