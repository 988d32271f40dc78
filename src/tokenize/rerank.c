/* rerank: a (query, document) pair as the tokens a reranker scores, the
 * way llama-server builds them (tools/server/server-common.cpp,
 * format_prompt_rerank, llama.cpp as of commit 0c1e570, October 2026), so a
 * score here is the score llama-server gives for the same pair. */
#include <stdlib.h>
#include <string.h>

#include "tokenize/tokenizer.h"

#include "load/model.h"
#include "base/util.h"

/* A growable text: the template with its placeholders replaced. */
typedef struct rr_buf {
    char *p;
    size_t n, cap;
} rr_buf;

static int buf_add(rr_buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

/* string_replace_all(prompt, "{query}", query), then "{document}": one pass
 * for each, left to right, so a query holding "{document}" has it replaced
 * by the second pass exactly as llama-server's two calls do. */
static int replace_all(const char *s, size_t n, const char *key, const char *with, size_t with_n, rr_buf *out) {
    const size_t kn = strlen(key);
    size_t i = 0;
    out->n = 0;
    if (buf_add(out, "", 0)) return -1;
    while (i < n) {
        const char *hit = kn <= n - i ? memmem(s + i, n - i, key, kn) : NULL;
        const size_t upto = hit ? (size_t)(hit - s) : n;
        if (buf_add(out, s + i, upto - i)) return -1;
        if (!hit) break;
        if (buf_add(out, with, with_n)) return -1;
        i = upto + kn;
    }
    return 0;
}

/* ids[0..*n) += add[0..k) */
static int append(int32_t **ids, size_t *n, size_t *cap, const int32_t *add, size_t k) {
    if (*n + k > *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        while (c < *n + k) c *= 2;
        int32_t *q = realloc(*ids, c * sizeof *q);
        if (!q) return -1;
        *ids = q;
        *cap = c;
    }
    memcpy(*ids + *n, add, k * sizeof *add);
    *n += k;
    return 0;
}

static int templated(const tl_model *m, const char *q, size_t qn, const char *d, size_t dn, int32_t **ids,
                     size_t *n_ids, tl_error *err) {
    rr_buf a = {0}, b = {0};
    const char *tpl = m->rerank_template;
    int st = replace_all(tpl, strlen(tpl), "{query}", q, qn, &a) ||
                     replace_all(a.p, a.n, "{document}", d, dn, &b)
                 ? tl_fail(err, TL_ERR_NOMEM, "out of memory")
                 : TL_OK;
    /* tokenize_input_subprompt(..., add_special false, parse_special true) */
    if (!st) st = tl_tokenizer_encode(m->tok, b.p, b.n, TL_TOK_PARSE_SPECIAL, ids, n_ids, err);
    free(a.p);
    free(b.p);
    return st;
}

/* [BOS] query [EOS] [SEP] doc [EOS]: each marker where the vocabulary adds
 * it (add_bos, add_eos, add_sep), the text tokenized without special tokens;
 * EOS falls back to SEP when the vocabulary has none. */
static int paired(const tl_model *m, const char *q, size_t qn, const char *d, size_t dn, int32_t **ids,
                  size_t *n_ids, tl_error *err) {
    int32_t *qt = NULL, *dt = NULL;
    size_t nq = 0, nd = 0, n = 0, cap = 0;
    int st = tl_tokenizer_encode(m->tok, q, qn, 0, &qt, &nq, err);
    if (!st) st = tl_tokenizer_encode(m->tok, d, dn, 0, &dt, &nd, err);
    int32_t eos = tl_tokenizer_eos(m->tok), bos = tl_tokenizer_bos(m->tok), sep = tl_tokenizer_sep(m->tok);
    if (eos < 0) eos = sep;
    const int add_eos = tl_tokenizer_add_eos_key(m->tok) && eos >= 0;
    int32_t *out = NULL;
    if (!st && ((tl_tokenizer_add_bos(m->tok) && append(&out, &n, &cap, &bos, 1)) ||
                append(&out, &n, &cap, qt, nq) || (add_eos && append(&out, &n, &cap, &eos, 1)) ||
                (tl_tokenizer_add_sep(m->tok) && append(&out, &n, &cap, &sep, 1)) ||
                append(&out, &n, &cap, dt, nd) || (add_eos && append(&out, &n, &cap, &eos, 1))))
        st = tl_fail(err, TL_ERR_NOMEM, "out of memory");
    free(qt);
    free(dt);
    if (st) {
        free(out);
        return st;
    }
    *ids = out;
    *n_ids = n;
    return TL_OK;
}

int tl_rerank_tokens(const tl_model *m, const char *query, size_t query_len, const char *doc, size_t doc_len,
                     int32_t **ids, size_t *n_ids, tl_error *err) {
    if (!m || !query || !doc || !ids || !n_ids) return tl_fail(err, TL_ERR_ARG, "tl_rerank_tokens: NULL argument");
    *ids = NULL;
    *n_ids = 0;
    return m->rerank_template ? templated(m, query, query_len, doc, doc_len, ids, n_ids, err)
                              : paired(m, query, query_len, doc, doc_len, ids, n_ids, err);
}
