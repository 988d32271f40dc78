/* server/rerank: POST /v1/rerank (and /rerank, /v1/reranking, as
 * llama-server routes them) in Jina's and Cohere's shape, or in Text
 * Embeddings Inference's ("texts", llama-server's is_tei_format), parsed
 * into an SRV_EMBED request of rank pooling, which the scheduler runs as it
 * runs embeddings (srv_sched_embed), and its reply. */
#ifndef TL_SERVER_RERANK_H
#define TL_SERVER_RERANK_H

#include "api.h"

/* Parses a rerank body into r (fresh from srv_req_new): r->kind SRV_EMBED,
 * r->emb an EMB_RERANK job with one input per document, the pair tokenized
 * as llama-server's format_prompt_rerank does (tl_rerank_tokens). 0, or -1
 * with e filled (a 4xx; 500 for want of memory). */
int rr_parse(const api_ctx *a, const char *body, size_t len, srv_req *r, api_err *e);

/* The reply of a finished (DONE) rerank request: results by relevance,
 * the best first; malloc'ed, NULL for want of memory. */
char *rr_reply_json(const api_ctx *a, const srv_req *r, size_t *len);

#endif
