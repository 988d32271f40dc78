/* server/dialect: the other wire formats agents speak, over the same engine
 * as Chat Completions. A dialect translates its request body into a
 * chat-shaped object (messages, tools, tool_choice, response_format, ...)
 * that the chat core (validate.c) parses as any chat request, and translates the chat reply back:
 * the whole reply from the chat completion object, a stream from the chat
 * chunks reply.c produces (role, content, reasoning_content and tool_calls
 * deltas, the finish, the usage), one at a time.
 *
 *   server/responses.c  OpenAI's Responses API: POST /v1/responses, the
 *                       stored responses behind previous_response_id,
 *                       GET and DELETE /v1/responses/{id}
 *   server/messages.c   Anthropic's Messages API: POST /v1/messages and
 *                       /v1/messages/count_tokens, its error shape
 *
 * Known per-request lines in system prompts are dropped where every dialect's
 * chat messages pass (api_volatile_strip, prompt.c), so that an agent's turns
 * share their prefix in the cache. */
#ifndef TL_SERVER_DIALECT_H
#define TL_SERVER_DIALECT_H

#include "api.h"

/* ---- the Responses API (server/responses.c) ------------------------------- */
typedef struct resp_store resp_store;
/* At most max_n responses and max_bytes of their JSON, each kept up to ttl_s
 * seconds; the oldest go first. */
resp_store *resp_store_new(int max_n, int ttl_s, size_t max_bytes);
void resp_store_free(resp_store *s);

int resp_parse(const api_ctx *a, const char *body, size_t len, srv_req *r, api_err *e);
/* The request's reply and stream come back through r->wire (api_dialect):
 * the reply stored when the request asked to. */
/* GET /v1/responses/{id}: the stored response, or NULL with e filled (404). */
char *resp_get(const api_ctx *a, const char *id, size_t *len, api_err *e);
/* GET /v1/responses/{id}/input_items: the items that led to it, oldest first
 * if asc (OpenAI's default order is newest first); one page. */
char *resp_input_items(const api_ctx *a, const char *id, int asc, size_t *len, api_err *e);
/* DELETE /v1/responses/{id}. */
char *resp_delete(const api_ctx *a, const char *id, size_t *len, api_err *e);

/* ---- the Messages API (server/messages.c) --------------------------------- */
/* count_only: /v1/messages/count_tokens (max_tokens not required). */
int msg_parse(const api_ctx *a, const char *body, size_t len, srv_req *r, int count_only, api_err *e);
/* {"type":"error","error":{"type","message"}} for an api_err. */
char *msg_error_json(const api_err *e, size_t *len);
/* count_tokens' reply. */
char *msg_count_json(const srv_req *r, size_t *len);


/* ---- shared ------------------------------------------------------------------ */
/* The text of content given as a string or as parts whose type is one of
 * types (NULL-terminated), joined by newlines; a part's text is its "text"
 * (a refusal part's "refusal"). 0; -1 with e filled (a 400); -2: no memory. */
int dialect_text(json_t *c, const char *param, const char *const *types, api_buf *b, api_err *e);
/* The buffer's bytes as a JSON string (NULL: no memory). */
json_t *dialect_str(const api_buf *b);
/* Appends an SSE event "event: type\ndata: json\n\n" (j taken). */
int dialect_event(api_buf *out, const char *type, json_t *j);

/* What one of a dialect's tools is as a chat function: 1 to take it, with
 * *params the parameters' schema (a new reference; NULL leaves them out);
 * 0 to leave it out, with why saying so (a warning the reply carries); -1
 * when the request is bad (e filled). */
typedef int (*dialect_tool_fn)(json_t *tool, void *user, json_t **params, char *why, size_t why_cap, api_err *e);
/* The request's "tools" as chat's, into chat.tools (left out when none is
 * taken), each {"type":"function","function":{name, description,
 * parameters}} in the order chat clients send, so the rendered tools and the
 * prefix cache are the same whichever dialect an agent speaks. *n_fn: the
 * functions taken. 0, -1 (e filled) or -2 (no memory). */
int dialect_tools(json_t *root, dialect_tool_fn fn, void *user, json_t *chat, json_t **warnings, int *n_fn,
                  api_err *e);

#endif
