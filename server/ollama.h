/* server/ollama: Ollama's API on the same server and port (server/ollama.c).
 * /api/chat and /api/generate are a dialect (dialect.h): translated into a
 * chat-shaped object (or, for a raw generate, a completion) that the core
 * parses as any request, so caching, grammars, tools and reasoning are the
 * same code; replies and NDJSON stream lines are translated back from the
 * chat reply and chunks. The model endpoints (/api/version, /api/tags,
 * /api/show, /api/ps) describe the one loaded model; /api/embed and
 * /api/embeddings are server/embed.c's. */
#ifndef TL_SERVER_OLLAMA_H
#define TL_SERVER_OLLAMA_H

#include "api.h"

/* generate: /api/generate (else /api/chat). *empty: a generate with no
 * prompt (Ollama's "load the model" call), answered by oll_load_json with
 * nothing to run. 0, or -1 with e filled. */
int oll_parse(const api_ctx *a, int generate, const char *body, size_t len, srv_req *r, int *empty, api_err *e);
char *oll_load_json(const api_ctx *a, size_t *len);

/* GET /api/version, GET /api/tags, GET /api/ps, POST /api/show (body: the
 * model's name, any). NULL for want of memory (or, for show, e filled). */
char *oll_version_json(size_t *len);
char *oll_tags_json(const api_ctx *a, int ps, size_t *len);
char *oll_show_json(const api_ctx *a, const char *body, size_t blen, size_t *len, api_err *e);

/* Ollama's error body {"error": "message"}. */
char *oll_error_json(const api_err *e, size_t *len);

#endif
