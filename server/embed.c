/* server/embed: embedding requests. OpenAI's POST /v1/embeddings (input: a
 * string, strings, token ids or arrays of them; encoding_format float or
 * base64; dimensions only as the model's width) and Ollama's POST /api/embed
 * (input: a string or strings) and older /api/embeddings (prompt), parsed
 * into one SRV_EMBED request that the scheduler runs (srv_sched_embed), and
 * their replies. The vectors are tl_ctx_embed's, the same bits as
 * `tokenloop embed`'s for the same text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "embed.h"
#include "rerank.h"

#define BAD(param, ...) api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define OOM() api_fail(e, 500, "server_error", NULL, NULL, "out of memory")
/* Inputs one request may carry (OpenAI's limit). */
#define EMB_MAX_INPUTS 2048

/* ---- parsing ------------------------------------------------------------------ */

static double emb_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

srv_embed *emb_new(srv_req *r, int fmt, int d) {
    srv_embed *em = calloc(1, sizeof *em);
    if (!em) return NULL;
    r->kind = SRV_EMBED;
    r->emb = em;
    r->t_arrival = emb_mono_s();
    em->fmt = fmt;
    em->d = d;
    return em;
}

/* One text as llama-embedding tokenizes it: BOS where the model adds one,
 * special tokens parsed, EOS where the file asks (tokenizer.ggml.add_eos_token). */
static int text_tokens(const api_ctx *a, json_t *v, int i, int32_t **ids, int *n, api_err *e) {
    if (json_string_length(v) == 0) return BAD("input", "input %d is an empty string", i);
    return api_tokenize_text(a->m, json_string_value(v), json_string_length(v),
                             TL_TOK_PARSE_SPECIAL | TL_TOK_ADD_SPECIAL, ids, n, e);
}

/* The inputs: a string, an array of strings, an array of token ids, or an
 * array of arrays of token ids (ollama: a string or strings). */
static int parse_inputs(const api_ctx *a, json_t *in, int tokens_ok, const char *param, srv_embed *em, api_err *e) {
    if (!in) return BAD(param, "'%s' is required", param);
    const int one = json_is_string(in) || (json_is_array(in) && json_array_size(in) > 0 &&
                                           json_is_integer(json_array_get(in, 0)));
    if (!one && !json_is_array(in))
        return BAD(param, "'%s' must be a string or an array of strings%s", param,
                   tokens_ok ? " or token ids" : "");
    const size_t n = one ? 1 : json_array_size(in);
    if (n == 0) return BAD(param, "'%s' is empty", param);
    if (n > EMB_MAX_INPUTS) return BAD(param, "'%s' has %zu inputs; at most %d", param, n, EMB_MAX_INPUTS);
    em->tok = calloc(n, sizeof *em->tok);
    em->n_tok = calloc(n, sizeof *em->n_tok);
    if (!em->tok || !em->n_tok) return OOM();
    em->n = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *v = one ? in : json_array_get(in, i);
        if (json_is_string(v)) {
            if (text_tokens(a, v, (int)i, &em->tok[i], &em->n_tok[i], e)) return -1;
        } else if (tokens_ok && json_is_array(v)) {
            if (json_array_size(v) == 0) return BAD(param, "input %zu has no tokens", i);
            if (api_token_array(a, v, param, &em->tok[i], &em->n_tok[i], e)) return -1;
        } else {
            return BAD(param, "input %zu must be a string%s", i, tokens_ok ? " or an array of token ids" : "");
        }
        if (em->n_tok[i] == 0) return BAD(param, "input %zu has no tokens", i);
    }
    return 0;
}

/* The rows to fill: one per input, or one per token (pooling none). */
int emb_alloc_out(srv_embed *em, api_err *e) {
    em->off = calloc((size_t)em->n, sizeof *em->off);
    if (!em->off) return OOM();
    size_t total = 0;
    for (int i = 0; i < em->n; i++) {
        em->off[i] = total;
        const size_t rows = em->pooling == TL_POOL_NONE ? (size_t)em->n_tok[i] : 1;
        if (rows > ((size_t)1 << 40) / (size_t)em->d) return OOM();
        total += rows * (size_t)em->d;
    }
    em->out = malloc((total ? total : 1) * sizeof *em->out);
    return em->out ? 0 : OOM();
}

/* OpenAI's and llama-server's options: encoding_format, dimensions, and the
 * pooling and normalisation (normalize, or llama-server's embd_normalize 2
 * or -1). */
static int parse_openai(const api_ctx *a, json_t *root, srv_embed *em, api_err *e) {
    const char *fmt = NULL;
    if (api_get_str(root, "encoding_format", &fmt, e) < 0) return -1;
    if (fmt && strcmp(fmt, "float") && strcmp(fmt, "base64"))
        return BAD("encoding_format", "'encoding_format' must be 'float' or 'base64', not '%s'", fmt);
    em->base64 = fmt && !strcmp(fmt, "base64");
    long long en = 2;
    if (api_get_int(root, "embd_normalize", -1, 100, &en, e) < 0) return -1;
    if (en != 2 && en != -1)
        return BAD("embd_normalize", "'embd_normalize' must be 2 (euclidean, the default) or -1 (none)");
    em->normalize = en == 2;
    if (api_get_bool(root, "normalize", &em->normalize, e) < 0) return -1;
    (void)a;
    return 0;
}

int emb_parse(const api_ctx *a, int fmt, int pooling, const char *body, size_t len, srv_req *r, api_err *e) {
    memset(e, 0, sizeof *e);
    json_t *root = api_load_body(body, len, e);
    if (!root) return -1;
    int rc = -1;
    srv_embed *em = emb_new(r, fmt, tl_model_n_embd(a->m));
    if (!em) {
        OOM();
        goto out;
    }
    em->normalize = fmt != EMB_OLLAMA_OLD; /* Ollama's old endpoint gives the raw vector */
    const char *pool = NULL;
    if (api_get_str(root, "pooling", &pool, e) < 0) goto out;
    if (pool && (pooling = tl_pooling_parse(pool)) < 0) {
        BAD("pooling", "'pooling' must be none, mean, cls, last or rank, not '%s'", pool);
        goto out;
    }
    em->pooling = pooling == TL_POOL_MODEL ? tl_model_pooling(a->m) : pooling;
    if (em->pooling == TL_POOL_RANK) {
        BAD("pooling", "pooling rank gives a reranker's relevance scores, not embeddings: use POST /v1/rerank, "
                       "or ask for another 'pooling' (mean, cls, last)");
        goto out;
    }
    if (fmt == EMB_OPENAI && parse_openai(a, root, em, e)) goto out;
    if (fmt == EMB_OLLAMA && api_get_bool(root, "normalize", &em->normalize, e) < 0) goto out;
    long long dim = 0;
    if (api_get_int(root, "dimensions", 1, 1 << 30, &dim, e) < 0) goto out;
    if (dim && dim != em->d) {
        /* OpenAI's text-embedding-3 vectors are cut and renormalised only
         * for models trained so (Matryoshka); a cut is not the same vector
         * for any other model, so none is made here */
        BAD("dimensions", "this model's embeddings have %d dimensions; 'dimensions' must be %d or left out",
            em->d, em->d);
        goto out;
    }
    if (em->pooling == TL_POOL_NONE && (fmt != EMB_OPENAI || em->base64)) {
        BAD("pooling", "pooling none (a vector per token) is only given as floats by /v1/embeddings");
        goto out;
    }
    const char *key = fmt == EMB_OLLAMA_OLD ? "prompt" : "input";
    if (parse_inputs(a, api_field(root, key), fmt == EMB_OPENAI, key, em, e)) goto out;
    int trunc = 1; /* Ollama's truncate (default true): inputs cut at the context */
    if (fmt != EMB_OPENAI && api_get_bool(root, "truncate", &trunc, e) < 0) goto out;
    for (int i = 0; fmt != EMB_OPENAI && trunc && i < em->n; i++)
        if (em->n_tok[i] > a->n_ctx) em->n_tok[i] = a->n_ctx;
    rc = emb_alloc_out(em, e);
out:
    if (rc && !e->http) api_fail(e, 500, "server_error", NULL, NULL, "the request could not be read");
    json_decref(root);
    return rc;
}

/* ---- replies ------------------------------------------------------------------ */

void emb_base64(const unsigned char *p, size_t n, char *out) {
    static const char T[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0, i = 0;
    for (; i + 2 < n; i += 3) {
        const unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        out[o++] = T[v >> 18 & 63], out[o++] = T[v >> 12 & 63], out[o++] = T[v >> 6 & 63], out[o++] = T[v & 63];
    }
    if (i < n) {
        const unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0u);
        out[o++] = T[v >> 18 & 63], out[o++] = T[v >> 12 & 63];
        out[o++] = i + 1 < n ? T[v >> 6 & 63] : '=';
        out[o++] = '=';
    }
    out[o] = 0;
}

static int add_str(api_buf *b, const char *s) { return api_buf_add(b, s, strlen(s)); }

/* A row as a JSON array: %.9g gives every float32 back exactly. */
static int add_row(api_buf *b, const float *v, int d) {
    char num[32];
    if (add_str(b, "[")) return -1;
    for (int i = 0; i < d; i++) {
        const int k = isfinite(v[i]) ? snprintf(num, sizeof num, i ? ",%.9g" : "%.9g", (double)v[i])
                                     : snprintf(num, sizeof num, i ? ",null" : "null");
        if (api_buf_add(b, num, (size_t)k)) return -1;
    }
    return add_str(b, "]");
}

/* The rows as little-endian float32 bytes, base64: what OpenAI's clients
 * decode (numpy.frombuffer(..., dtype="float32")). */
static int add_b64(api_buf *b, const float *v, int d) {
    const size_t nb = (size_t)d * 4;
    unsigned char *raw = malloc(nb);
    char *txt = malloc(4 * ((nb + 2) / 3) + 1);
    int rc = -1;
    if (raw && txt) {
        for (int i = 0; i < d; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int k = 0; k < 4; k++) raw[4 * (size_t)i + (size_t)k] = (unsigned char)(u >> (8 * k));
        }
        emb_base64(raw, nb, txt);
        rc = add_str(b, "\"") || add_str(b, txt) || add_str(b, "\"") ? -1 : 0;
    }
    free(raw);
    free(txt);
    return rc;
}

/* Input i's embedding: a row, a row per token (pooling none) or base64. */
static int add_embedding(api_buf *b, const srv_embed *em, int i) {
    const float *v = em->out + em->off[i];
    if (em->base64) return add_b64(b, v, em->d);
    if (em->pooling != TL_POOL_NONE) return add_row(b, v, em->d);
    if (add_str(b, "[")) return -1;
    for (int t = 0; t < em->n_tok[i]; t++)
        if ((t && add_str(b, ",")) || add_row(b, v + (size_t)t * em->d, em->d)) return -1;
    return add_str(b, "]");
}

/* The model's id as a JSON string. */
int emb_add_model(api_buf *b, const api_ctx *a) {
    json_t *j = api_jstr_bytes(a->model_id, strlen(a->model_id));
    char *s = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    int rc = s ? add_str(b, s) : -1;
    free(s);
    return rc;
}

static int openai_reply(const api_ctx *a, const srv_embed *em, int total, api_buf *b) {
    char num[160];
    if (add_str(b, "{\"object\":\"list\",\"data\":[")) return -1;
    for (int i = 0; i < em->n; i++) {
        snprintf(num, sizeof num, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        if (add_str(b, num) || add_embedding(b, em, i) || add_str(b, "}")) return -1;
    }
    if (add_str(b, "],\"model\":") || emb_add_model(b, a)) return -1;
    snprintf(num, sizeof num, ",\"usage\":{\"prompt_tokens\":%d,\"total_tokens\":%d}}", total, total);
    return add_str(b, num);
}

static int ollama_reply(const api_ctx *a, const srv_embed *em, int total, double secs, api_buf *b) {
    char num[200];
    if (em->fmt == EMB_OLLAMA_OLD) return add_str(b, "{\"embedding\":") || add_row(b, em->out, em->d) || add_str(b, "}");
    if (add_str(b, "{\"model\":") || emb_add_model(b, a) || add_str(b, ",\"embeddings\":[")) return -1;
    for (int i = 0; i < em->n; i++)
        if ((i && add_str(b, ",")) || add_row(b, em->out + em->off[i], em->d)) return -1;
    const long long ns = (long long)(secs * 1e9);
    snprintf(num, sizeof num, "],\"total_duration\":%lld,\"load_duration\":0,\"prompt_eval_count\":%d}", ns, total);
    return add_str(b, num);
}

char *emb_reply_json(const api_ctx *a, const srv_req *r, size_t *len) {
    const srv_embed *em = r->emb;
    if (em->fmt == EMB_RERANK || em->fmt == EMB_RERANK_TEI) return rr_reply_json(a, r, len);
    api_buf b = {0};
    int total = 0;
    for (int i = 0; i < em->n; i++) total += em->n_tok[i];
    const double secs = r->t_arrival > 0 ? emb_mono_s() - r->t_arrival : 0;
    int bad = em->fmt == EMB_OPENAI ? openai_reply(a, em, total, &b) : ollama_reply(a, em, total, secs, &b);
    if (bad || api_buf_add(&b, "", 1)) {
        api_buf_free(&b);
        return NULL;
    }
    *len = b.n - 1;
    return b.p;
}
