/* server/api: the chat core under every dialect: requests validated into
 * srv_req (validate.c), their prompts built (prompt.c), replies and stream
 * chunks rendered (reply.c), the small endpoints (endpoints.c), over the
 * wire utilities (wire.h). Dialects (dialect.h) sit on top of it; it never
 * names one. */
#ifndef TL_SERVER_API_H
#define TL_SERVER_API_H

#include <stddef.h>

#include <jansson.h>

#include "server.h"
#include "tools.h"
#include "wire.h"

/* What the API needs from the server: the model, its id and the context. */
typedef struct api_ctx {
    const tl_model *m;
    const char *model_id;
    int n_ctx;          /* positions per sequence */
    int max_messages;   /* 1024 */
    int reasoning;      /* 0 off; 1: the model's own <think> (from its template); 2: on, the
                         * server opens <think> after the generation prompt if the template did not */
    const tl_chat_template *tmpl; /* the model's, compiled once; NULL: compiled per request */
    struct resp_store *store;     /* stored Responses (previous_response_id); NULL: none kept */
    const char *model_path;       /* for /props */
    int n_parallel;               /* for /props */
} api_ctx;

/* Parses and validates a /v1/chat/completions or /v1/completions body into r
 * (fresh from srv_req_new): sampling, stop, logprobs and the tokenized
 * prompt. 0, or -1 with e filled (a 4xx). */
int api_parse_request(const api_ctx *a, srv_kind kind, const char *body, size_t len, srv_req *r,
                      api_err *e);

/* The same from a parsed chat-shaped object (a dialect's translation; not
 * taken). count_only: no length check (count_tokens). */
int api_parse_chat_obj(const api_ctx *a, json_t *root, srv_req *r, int count_only, api_err *e);
/* Removes, in place (s NUL-terminated at n), the lines of a system prompt that are known to change on
 * every request: Claude Code's "x-anthropic-billing-header: ..." line. They
 * say nothing to the model and would end the cached prefix at the top.
 * Returns the new length. */
size_t api_volatile_strip(char *s, size_t n);

/* The whole non-streamed reply from r's events (r->finished), in r's
 * dialect. malloc'ed. */
char *api_reply_json(const api_ctx *a, const srv_req *r, size_t *len);
/* The chat (or text) completion object the dialects translate. */
json_t *api_reply_obj(const api_ctx *a, const srv_req *r);

/* A dialect's reply and stream over the chat ones, set on the request by the
 * dialect's parser (dialect.h): the core calls through it and never names a
 * dialect, so dialects depend on the core and not the reverse. */
typedef struct api_dialect {
    /* the reply from the chat completion object (taken) */
    char *(*reply)(const api_ctx *a, const srv_req *r, json_t *chat, size_t *len);
    /* the dialect's events for one chat chunk (taken); *ds: its stream state */
    int (*stream_chunk)(const api_ctx *a, const srv_req *r, void **ds, json_t *chunk, api_buf *out);
    int (*stream_error)(const api_ctx *a, const srv_req *r, void **ds, const char *msg, api_buf *out);
} api_dialect;

/* A dialect's stream state starts with this, so the core can free it. */
typedef struct dialect_stream {
    void (*free)(struct dialect_stream *);
} dialect_stream;

/* Stream state across events of one request. */
typedef struct api_stream {
    int started;      /* first frame (chat role delta, echo) sent */
    int ended;        /* [DONE] written */
    size_t text_off;  /* legacy text_offset so far (code points) */
    tools_stream_st tools;
    int think;        /* 0: before any reasoning, 1: inside, 2: after */
    int content_on;   /* after reasoning: the content's leading blank lines are dropped until text comes */
    int think_opening; /* the reasoning's start: its open marker (the reply's own) is still to drop */
    int think_lead;    /* the blanks after it (Gemma 4's channel header) are still to drop */
    api_buf think_hold; /* reasoning text that may be the start of the close marker; before any, what may open it */
    void *ds;           /* the dialect's stream state (server/dialect.h), or NULL */
    tl_harmony *harmony; /* a harmony reply's parser (made at its first text), or NULL */
    int harmony_calls;   /* the calls it has sent */
} api_stream;
void api_stream_free(api_stream *st);

/* Appends the SSE frames ("data: {json}\n\n") that event ev of r produces,
 * and the final "data: [DONE]\n\n" after DONE or ERROR. 0 or -1 (no memory). */
int api_stream_event(const api_ctx *a, const srv_req *r, api_stream *st, const srv_event *ev,
                     api_buf *out);

char *api_models_json(const api_ctx *a, size_t *len);
char *api_props_json(const api_ctx *a, size_t *len);
/* /tokenize and /detokenize: reply body, or NULL with e filled. */
char *api_tokenize(const api_ctx *a, const char *body, size_t len, size_t *out_len, api_err *e);
char *api_detokenize(const api_ctx *a, const char *body, size_t len, size_t *out_len, api_err *e);

/* ---- shared by the core's files ------------------------------------------- */
/* Text to token ids, with the API's error on failure. */
int api_tokenize_text(const tl_model *m, const char *s, size_t n, int flags, int32_t **ids, int *n_ids,
                      api_err *e);
/* A chat request's reasoning, as its prompt sees it. */
typedef struct api_think {
    int budget;  /* reasoning tokens it may take; -1: no limit; 0: none (Gemma 4's template is
                  * then rendered with enable_thinking false) */
    int eager;   /* a grammar holds the reply from its first token: a template that lets the
                  * model open its reasoning itself (Gemma 4's) gets it opened in the prompt */
    int started; /* out: the prompt opened the reasoning (it ends with the open marker) */
} api_think;
/* A chat request's prompt: messages rendered through the template and
 * tokenized. th may be NULL (/tokenize: no budget, nothing eager). n_shared
 * (if not NULL, and the model keeps a state beside its KV cache: recurrent
 * or sliding-window layers) gets the prompt tokens before the first message
 * that is not a system one: the system prompt and tools other conversations
 * may share (0: none, or not worked out). */
int api_chat_prompt(const api_ctx *a, json_t *msgs, const tools_req *t, json_t *kwargs, int add_gen,
                    api_think *th, int32_t **ids, int *n, int *n_shared, api_err *e);
/* An array of token ids (param names it in errors). */
int api_token_array(const api_ctx *a, json_t *arr, const char *param, int32_t **ids, int *n, api_err *e);
/* A completion's prompt: a string, or token ids. */
int api_completion_prompt(const api_ctx *a, json_t *p, int32_t **ids, int *n, api_err *e);

#endif
