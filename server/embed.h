/* server/embed: embedding requests (server/embed.c): OpenAI's POST
 * /v1/embeddings and Ollama's /api/embed and /api/embeddings parsed into an
 * SRV_EMBED srv_req (its srv_embed: the inputs tokenized, the rows to fill),
 * which the scheduler runs between decode steps (srv_sched_embed), and their
 * replies rendered from the filled rows. */
#ifndef TL_SERVER_EMBED_H
#define TL_SERVER_EMBED_H

#include "api.h"

/* The reply shapes (srv_embed.fmt). */
/* EMB_RERANK_TEI: a rerank body in Text Embeddings Inference's shape
 * ("texts"), answered with its bare array, as llama-server does. */
enum { EMB_OPENAI = 0, EMB_OLLAMA = 1, EMB_OLLAMA_OLD = 2, EMB_RERANK = 3, EMB_RERANK_TEI = 4 };

/* Parses a body of shape fmt into r (fresh from srv_req_new): r->kind
 * SRV_EMBED, r->emb with the inputs tokenized (as llama-embedding and
 * llama-server do: BOS where the model adds one, EOS where the file asks,
 * special tokens parsed; token ids as given) and the output allocated.
 * pooling: the server's default (--pooling; TL_POOL_MODEL: the file's, else
 * mean). 0, or -1 with e filled (a 4xx; 500 for want of memory). */
int emb_parse(const api_ctx *a, int fmt, int pooling, const char *body, size_t len, srv_req *r, api_err *e);

/* The reply of a finished (DONE) embedding request; malloc'ed, NULL for want
 * of memory. */
char *emb_reply_json(const api_ctx *a, const srv_req *r, size_t *len);

/* Shared with server/rerank.c: r made an SRV_EMBED request of reply shape
 * fmt and d floats per row (NULL for want of memory); the rows to fill
 * (em->n, n_tok, pooling and d set); the model's id as a JSON string. */
srv_embed *emb_new(srv_req *r, int fmt, int d);
int emb_alloc_out(srv_embed *em, api_err *e);
int emb_add_model(api_buf *b, const api_ctx *a);

/* Standard base64 (RFC 4648, padded) of n bytes into out (4 * ((n + 2) / 3)
 * bytes, then a NUL). */
void emb_base64(const unsigned char *p, size_t n, char *out);

#endif
