/* server/api: the OpenAI-compatible wire format. Parses and validates request
 * bodies (jansson) into srv_req, and renders every reply: completions, stream
 * chunks, usage, logprobs, errors, /v1/models, /tokenize and /detokenize. */
#ifndef TL_SERVER_API_H
#define TL_SERVER_API_H

#include <stddef.h>

#include <jansson.h>

#include "server.h"

/* What a rejected request answers: HTTP status and the OpenAI error fields. */
typedef struct api_err {
    int http;
    const char *type;   /* "invalid_request_error", ... (static) */
    char param[64];     /* "" = null */
    char code[48];      /* "" = null */
    char msg[384];
} api_err;

/* Fills e and returns -1 (for `return api_fail(...)`). */
int api_fail(api_err *e, int http, const char *type, const char *param, const char *code,
             const char *fmt, ...) __attribute__((format(printf, 6, 7)));

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

/* Nesting depth of a JSON text ([ and { outside strings). */
int api_json_depth(const char *s, size_t n);

/* Parses and validates a /v1/chat/completions or /v1/completions body into r
 * (fresh from srv_req_new): sampling, stop, logprobs and the tokenized
 * prompt. 0, or -1 with e filled (a 4xx). */
int api_parse_request(const api_ctx *a, srv_kind kind, const char *body, size_t len, srv_req *r,
                      api_err *e);

/* The same from a parsed chat-shaped object (a dialect's translation; not
 * taken). count_only: no length check (count_tokens). */
int api_parse_chat_obj(const api_ctx *a, json_t *root, srv_req *r, int count_only, api_err *e);
/* jansson helpers every reply builder uses. api_jset/api_jpush take v (set or
 * not) and return nonzero on failure, a NULL v (no memory) included;
 * api_field is NULL for a missing or null key; api_dump takes j and returns
 * its compact text (malloc'ed; NULL for a NULL j or no memory). */
int api_jset(json_t *o, const char *k, json_t *v);
int api_jpush(json_t *a, json_t *v);
json_t *api_field(json_t *o, const char *k);
char *api_dump(json_t *j, size_t *len);

/* A JSON object body (depth-limited), or NULL with e filled. */
json_t *api_load_body(const char *body, size_t len, api_err *e);

/* Removes, in place (s NUL-terminated at n), the lines of a system prompt that are known to change on
 * every request: Claude Code's "x-anthropic-billing-header: ..." line. They
 * say nothing to the model and would end the cached prefix at the top.
 * Returns the new length. */
size_t api_volatile_strip(char *s, size_t n);

/* Drops, in place, the bytes of a NUL-terminated string that are not whole
 * UTF-8 characters (what a cut at a byte limit leaves). */
void api_utf8_scrub(char *s);

/* Bytes -> valid UTF-8 (each bad sequence becomes U+FFFD). malloc'ed, NUL-terminated. */
char *api_utf8_fix(const char *s, size_t n, size_t *out_len);

/* The error body {"error":{message,type,param,code}}; malloc'ed. */
char *api_error_json(const api_err *e, size_t *len);

/* The whole non-streamed reply from r's events (r->finished), in r's
 * dialect. malloc'ed. */
char *api_reply_json(const api_ctx *a, const srv_req *r, size_t *len);
/* The chat (or text) completion object the dialects translate. */
json_t *api_reply_obj(const api_ctx *a, const srv_req *r);

/* A growable byte buffer for stream frames. */
typedef struct api_buf {
    char *p;
    size_t n, cap;
} api_buf;
int api_buf_add(api_buf *b, const char *s, size_t n);
void api_buf_free(api_buf *b);

/* A streamed reply's tool calls (server/tools.c). */
typedef struct tools_stream_st {
    api_buf hold;
    int in_call, seen_call, n_calls;
    int plain; /* the reply has shown it holds no calls (a format whose calls open it) */
} tools_stream_st;

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
    api_buf think_hold; /* reasoning text that may be the start of the close marker; before any, what may open it */
    void *ds;           /* the dialect's stream state (server/dialect.h), or NULL */
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

#endif
