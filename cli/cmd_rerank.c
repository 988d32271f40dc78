/* cli/cmd_rerank: `tokenloop rerank`, a query scored against documents by a
 * reranker (tl_rerank_tokens, then tl_ctx_embed with rank pooling), printed
 * as POST /v1/rerank's reply: the same tokens and the same bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char RERANK_HELP[] =
    "usage: tokenloop rerank -m FILE -q QUERY -d DOC [-d DOC ...] [--top-n N]\n"
    "                        [-c N] [-b N] [-t N] [--numerics fast|exact]\n"
    "\n"
    "Scores each document's relevance to the query with a reranker (a file with a\n"
    "classification head: Qwen3-Reranker, BERT cross-encoders) and prints JSON in the\n"
    "shape of POST /v1/rerank's reply: {\"model\":...,\"object\":\"list\",\"usage\":{...},\n"
    "\"results\":[{\"index\":i,\"relevance_score\":s},...]}, the best first. Each pair is\n"
    "formatted as llama-server formats it (the file's rerank template, else\n"
    "[BOS] query [EOS] [SEP] document [EOS]) and run as its own sequence.\n"
    "\n"
    "  -m, --model FILE        GGUF reranker\n"
    "  -q, --query TEXT        the query\n"
    "  -d, --document TEXT     a document (repeatable)\n"
    "      --top-n N           print the N best only (default: all)\n"
    "  -c, --ctx-size N        the longest pair in tokens (default: the longest given)\n"
    "  -b, --batch-size N      tokens per forward call (default 512; longer pairs are chunked)\n"
    "  -t, --threads N         threads (default: the cores)\n" CLI_NUMERICS_HELP;

#define MAX_DOCS 4096

typedef struct rr_opts {
    const char *model, *query;
    const char **docs;
    int n_docs, top_n, n_ctx, n_batch, n_threads, numerics;
} rr_opts;

/* 0: run; 1: done (help); EXIT_USAGE: bad arguments. */
static int parse(int argc, char **argv, rr_opts *o) {
    cli_args p = cli_args_start(argc, argv);
    const char *a, *v;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(RERANK_HELP, stdout);
            return 1;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(o->model = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "-q") || !strcmp(a, "--query")) {
            if (!(o->query = cli_arg(&p))) return EXIT_USAGE;
        } else if (!strcmp(a, "-d") || !strcmp(a, "--document")) {
            if (!(v = cli_arg(&p))) return EXIT_USAGE;
            if (o->n_docs == MAX_DOCS) {
                cli_error("more than %d documents", MAX_DOCS);
                return EXIT_USAGE;
            }
            o->docs[o->n_docs++] = v;
        } else if (!strcmp(a, "--top-n")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, MAX_DOCS, &o->top_n)) return EXIT_USAGE;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1 << 24, &o->n_ctx)) return EXIT_USAGE;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1 << 20, &o->n_batch)) return EXIT_USAGE;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!(v = cli_arg(&p)) || cli_int(a, v, 1, 1024, &o->n_threads)) return EXIT_USAGE;
        } else if (!strcmp(a, "--numerics")) {
            if (!(v = cli_arg(&p)) || cli_numerics(a, v, &o->numerics)) return EXIT_USAGE;
        } else {
            cli_error("unknown option '%s' (try 'tokenloop rerank --help')", a);
            return EXIT_USAGE;
        }
    }
    if (more < 0) return EXIT_USAGE;
    if (!o->query || !o->query[0] || o->n_docs == 0) {
        cli_error("rerank needs a query and at least one document (-q TEXT -d TEXT)");
        return EXIT_USAGE;
    }
    return 0;
}

/* The best first, equal scores by index: server/rerank.c's order. */
typedef struct item {
    float score;
    int index;
} item;

static int by_score(const void *pa, const void *pb) {
    const item *x = pa, *y = pb;
    const int nx = isnan(x->score), ny = isnan(y->score);
    if (nx != ny) return nx - ny;
    if (!nx && x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static void print_reply(const char *path, const rr_opts *o, item *it, int total) {
    qsort(it, (size_t)o->n_docs, sizeof *it, by_score);
    const char *base = strrchr(path, '/');
    printf("{\"model\":");
    cli_print_json_str(base ? base + 1 : path);
    printf(",\"object\":\"list\",\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d},\"results\":[", total, total);
    const int n = o->top_n && o->top_n < o->n_docs ? o->top_n : o->n_docs;
    for (int k = 0; k < n; k++) {
        printf(k ? ",{\"index\":%d," : "{\"index\":%d,", it[k].index);
        if (isfinite(it[k].score)) printf("\"relevance_score\":%.9g}", (double)it[k].score);
        else printf("\"relevance_score\":null}");
    }
    printf("]}\n");
}

/* Every pair tokenized, scored one by one, printed. */
static int run(const char *path, const rr_opts *o, tl_model *m) {
    tl_error err = {0};
    int32_t **ids = calloc((size_t)o->n_docs, sizeof *ids);
    size_t *nids = calloc((size_t)o->n_docs, sizeof *nids);
    item *it = calloc((size_t)o->n_docs, sizeof *it);
    const int n_out = tl_model_n_cls_out(m);
    float *sc = n_out > 0 ? malloc((size_t)n_out * sizeof *sc) : NULL;
    tl_ctx *ctx = NULL;
    int rc = 1, longest = 0, total = 0;
    if (n_out <= 0) {
        cli_error("%s: this file has no classification head (cls.weight or cls.output.weight): it is not a "
                  "reranker", path);
        goto out;
    }
    if (!ids || !nids || !it || !sc) {
        cli_error("out of memory");
        goto out;
    }
    for (int i = 0; i < o->n_docs; i++) {
        if (tl_rerank_tokens(m, o->query, strlen(o->query), o->docs[i], strlen(o->docs[i]), &ids[i], &nids[i],
                             &err)) {
            cli_tl_error(&err);
            goto out;
        }
        if (nids[i] == 0 || nids[i] > (size_t)1 << 24) {
            cli_error("document %d: the pair makes %zu tokens", i, nids[i]);
            goto out;
        }
        longest = (int)nids[i] > longest ? (int)nids[i] : longest;
        total += (int)nids[i];
    }
    if (o->n_ctx && o->n_ctx < longest) {
        cli_error("-c %d is shorter than the longest pair (%d tokens)", o->n_ctx, longest);
        goto out;
    }
    tl_ctx_params cp = {.n_ctx = o->n_ctx ? o->n_ctx : longest, .n_batch = o->n_batch, .n_threads = o->n_threads,
                        .numerics = o->numerics, .n_seq_max = 1};
    if (tl_ctx_new(m, &cp, &ctx, &err)) {
        cli_tl_error(&err);
        goto out;
    }
    for (int i = 0; i < o->n_docs; i++) {
        if (tl_ctx_embed(ctx, ids[i], nids[i], TL_POOL_RANK, 0, sc, &err) < 0) {
            cli_tl_error(&err);
            goto out;
        }
        it[i] = (item){sc[0], i};
    }
    print_reply(path, o, it, total);
    rc = 0;
out:
    for (int i = 0; ids && i < o->n_docs; i++) tl_free(ids[i]);
    free(ids);
    free(nids);
    free(it);
    free(sc);
    tl_ctx_free(ctx);
    return rc;
}

int cmd_rerank(int argc, char **argv) {
    rr_opts o = {.n_batch = 512};
    if (!(o.docs = calloc(MAX_DOCS, sizeof *o.docs))) {
        cli_error("out of memory");
        return 1;
    }
    int rc = parse(argc, argv, &o);
    if (rc) {
        free(o.docs);
        return rc == 1 ? 0 : rc;
    }
    tl_error err = {0};
    tl_model *m = NULL;
    char buf[4096];
    const char *path = o.model ? o.model : cli_default_model(buf, sizeof buf);
    if (tl_model_load(path, &m, &err)) {
        cli_error("%s: %s", path, err.msg);
        free(o.docs);
        return 1;
    }
    rc = run(path, &o, m);
    tl_model_free(m);
    free(o.docs);
    return rc;
}
