/* server/rerank: POST /v1/rerank, a query scored against documents by a
 * reranker (rank pooling: the file's classification head on each pair's
 * pooled row). Body in Jina's and Cohere's shape: {"model", "query",
 * "documents": [string | {"text": string}], "top_n", "return_documents"};
 * reply {"model", "object": "list", "usage", "results": [{"index",
 * "relevance_score", "document"?: {"text"}}]}, the best first, as
 * llama-server's format_response_rerank sorts them. A body with "texts" in
 * place of "documents" is Text Embeddings Inference's (TEI) shape, as
 * llama-server reads it: {"query", "texts", "return_text"} answered with the
 * bare array [{"index", "score", "text"?}]. Each document runs as its
 * own sequence through the embeddings path (server/embed.c's job, run by the
 * scheduler between decode steps), so its score never depends on the other
 * documents, the request's neighbours or the batch size: the same bits as
 * `tokenloop rerank` gives for the pair. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embed.h"
#include "rerank.h"

#define BAD(param, ...) api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define OOM() api_fail(e, 500, "server_error", NULL, NULL, "out of memory")
/* Documents one request may carry (the embeddings' input limit). */
#define RR_MAX_DOCS 2048

/* Document i's text: a string, or an object whose "text" is one (Cohere's
 * and Jina's object form). */
static int doc_text(json_t *v, const char *dn, size_t i, const char **s, size_t *n, api_err *e) {
    json_t *t = json_is_object(v) ? json_object_get(v, "text") : v;
    if (!json_is_string(t)) return BAD(dn, "%s[%zu] must be a string or an object with a string 'text'", dn, i);
    *s = json_string_value(t);
    *n = json_string_length(t);
    return 0;
}

/* The pairs tokenized, and each text kept when the reply gives it back. */
static int parse_docs(const api_ctx *a, const char *q, size_t qn, json_t *docs, int keep, srv_embed *em,
                      api_err *e) {
    const size_t n = json_array_size(docs);
    em->tok = calloc(n, sizeof *em->tok);
    em->n_tok = calloc(n, sizeof *em->n_tok);
    if (keep) {
        em->text = calloc(n, sizeof *em->text);
        em->text_len = calloc(n, sizeof *em->text_len);
    }
    if (!em->tok || !em->n_tok || (keep && (!em->text || !em->text_len))) return OOM();
    em->n = (int)n;
    const char *dn = em->fmt == EMB_RERANK_TEI ? "texts" : "documents";
    for (size_t i = 0; i < n; i++) {
        const char *s = NULL;
        size_t sn = 0, nt = 0;
        if (doc_text(json_array_get(docs, i), dn, i, &s, &sn, e)) return -1;
        tl_error err = {0};
        int st = tl_rerank_tokens(a->m, q, qn, s, sn, &em->tok[i], &nt, &err);
        if (st == TL_ERR_NOMEM) return OOM();
        if (st) return BAD(dn, "%s[%zu]: %s", dn, i, err.msg);
        if (nt == 0) return BAD(dn, "%s[%zu] and the query make no tokens", dn, i);
        if (nt > (size_t)1 << 30) return BAD(dn, "%s[%zu] is too long", dn, i);
        em->n_tok[i] = (int)nt;
        if (keep) {
            if (!(em->text[i] = malloc(sn + 1))) return OOM();
            memcpy(em->text[i], s, sn);
            em->text[i][sn] = 0;
            em->text_len[i] = sn;
        }
    }
    return 0;
}

/* The fields besides the documents; the model is checked first, so that a
 * server that cannot rank says so whatever the body. */
static int parse_fields(const api_ctx *a, json_t *root, srv_embed *em, const char **q, json_t **docs, int *keep,
                        api_err *e) {
    if (tl_model_n_cls_out(a->m) <= 0)
        return api_fail(e, 400, "invalid_request_error", NULL, "model_not_supported",
                        "this model cannot rerank: its file has no classification head (cls.weight or "
                        "cls.output.weight, which a reranker such as Qwen3-Reranker or a BERT cross-encoder "
                        "converted by llama.cpp carries)");
    if (api_get_str(root, "query", q, e) < 0) return -1;
    if (!*q) return BAD("query", "'query' is required");
    if (json_string_length(api_field(root, "query")) == 0) return BAD("query", "'query' is an empty string");
    *docs = api_field(root, "documents");
    const char *dn = "documents";
    if (!*docs && (*docs = api_field(root, "texts"))) {
        em->fmt = EMB_RERANK_TEI;
        dn = "texts";
    }
    if (!*docs) return BAD("documents", "'documents' (or TEI's 'texts') is required");
    if (!json_is_array(*docs)) return BAD(dn, "'%s' must be an array of strings", dn);
    const size_t n = json_array_size(*docs);
    if (n == 0) return BAD(dn, "'%s' is empty", dn);
    if (n > RR_MAX_DOCS) return BAD(dn, "'%s' has %zu entries; at most %d", dn, n, RR_MAX_DOCS);
    long long top = (long long)n;
    if (api_get_int(root, "top_n", 1, 1LL << 40, &top, e) < 0) return -1;
    em->top_n = top < (long long)n ? (int)top : (int)n;
    *keep = 0;
    if (api_get_bool(root, em->fmt == EMB_RERANK_TEI ? "return_text" : "return_documents", keep, e) < 0)
        return -1;
    const char *pool = NULL;
    if (api_get_str(root, "pooling", &pool, e) < 0) return -1;
    if (pool && strcmp(pool, "rank")) return BAD("pooling", "a rerank's 'pooling' is rank, not '%s'", pool);
    return 0;
}

int rr_parse(const api_ctx *a, const char *body, size_t len, srv_req *r, api_err *e) {
    memset(e, 0, sizeof *e);
    json_t *root = api_load_body(body, len, e);
    if (!root) return -1;
    int rc = -1, keep = 0;
    const char *q = NULL;
    json_t *docs = NULL;
    srv_embed *em = emb_new(r, EMB_RERANK, tl_model_n_cls_out(a->m));
    if (!em) {
        OOM();
        goto out;
    }
    em->pooling = TL_POOL_RANK;
    if (parse_fields(a, root, em, &q, &docs, &keep, e) ||
        parse_docs(a, q, json_string_length(api_field(root, "query")), docs, keep, em, e))
        goto out;
    rc = emb_alloc_out(em, e);
out:
    if (rc && !e->http) api_fail(e, 500, "server_error", NULL, NULL, "the request could not be read");
    json_decref(root);
    return rc;
}

/* ---- reply --------------------------------------------------------------------- */

typedef struct rr_item {
    float score;
    int index;
} rr_item;

/* By score, the best first; NaN last; equal scores by index (qsort is not
 * stable, and a reply must not depend on its order). */
static int by_score(const void *pa, const void *pb) {
    const rr_item *x = pa, *y = pb;
    const int nx = isnan(x->score), ny = isnan(y->score);
    if (nx != ny) return nx - ny;
    if (!nx && x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

static int add_str(api_buf *b, const char *s) { return api_buf_add(b, s, strlen(s)); }

/* Document i's text: ,"document":{"text": ...} (Jina, Cohere) or ,"text": ... (TEI) */
static int add_doc(api_buf *b, const srv_embed *em, int i, int tei) {
    json_t *j = api_jstr_bytes(em->text[i], em->text_len[i]);
    char *s = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    int rc = !s ? -1
             : tei ? add_str(b, ",\"text\":") || add_str(b, s)
                   : add_str(b, ",\"document\":{\"text\":") || add_str(b, s) || add_str(b, "}");
    free(s);
    return rc;
}

static int reply(const api_ctx *a, const srv_embed *em, const rr_item *it, api_buf *b) {
    const int tei = em->fmt == EMB_RERANK_TEI;
    const char *label = tei ? "score" : "relevance_score";
    int total = 0;
    char num[160];
    for (int i = 0; i < em->n; i++) total += em->n_tok[i];
    if (tei) {
        if (add_str(b, "[")) return -1;
    } else {
        if (add_str(b, "{\"model\":") || emb_add_model(b, a)) return -1;
        snprintf(num, sizeof num,
                 ",\"object\":\"list\",\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d},\"results\":[", total,
                 total);
        if (add_str(b, num)) return -1;
    }
    for (int k = 0; k < em->top_n; k++) {
        /* %.9g gives every float32 back exactly */
        if (isfinite(it[k].score))
            snprintf(num, sizeof num, "%s{\"index\":%d,\"%s\":%.9g", k ? "," : "", it[k].index, label,
                     (double)it[k].score);
        else
            snprintf(num, sizeof num, "%s{\"index\":%d,\"%s\":null", k ? "," : "", it[k].index, label);
        if (add_str(b, num) || (em->text && add_doc(b, em, it[k].index, tei)) || add_str(b, "}")) return -1;
    }
    return add_str(b, tei ? "]" : "]}");
}

char *rr_reply_json(const api_ctx *a, const srv_req *r, size_t *len) {
    const srv_embed *em = r->emb;
    rr_item *it = malloc((size_t)em->n * sizeof *it);
    api_buf b = {0};
    if (!it) return NULL;
    for (int i = 0; i < em->n; i++) it[i] = (rr_item){em->out[em->off[i]], i};
    qsort(it, (size_t)em->n, sizeof *it, by_score);
    const int bad = reply(a, em, it, &b);
    free(it);
    if (bad || api_buf_add(&b, "", 1)) {
        api_buf_free(&b);
        return NULL;
    }
    *len = b.n - 1;
    return b.p;
}
