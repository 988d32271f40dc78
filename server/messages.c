/* server/messages: Anthropic's Messages API (POST /v1/messages and
 * /v1/messages/count_tokens) over the chat engine (dialect.h). Owns the
 * translation of system, content blocks, tools and thinking to chat, the
 * message reply and its stream of events, and Anthropic's error shape. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dialect.h"

static char *msg_reply(const api_ctx *a, const srv_req *r, json_t *chat, size_t *len);
static int msg_stream_chunk(const api_ctx *a, const srv_req *r, void **ds, json_t *chunk, api_buf *out);
static int msg_stream_error(const api_ctx *a, const srv_req *r, void **ds, const char *msg, api_buf *out);
static const api_dialect msg_wire = {msg_reply, msg_stream_chunk, msg_stream_error};

#define BAD(param, ...) api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)


/* ---- errors ---------------------------------------------------------------------- */

static const char *err_type(int http) {
    switch (http) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return http < 500 ? "invalid_request_error" : "api_error";
    }
}

char *msg_error_json(const api_err *e, size_t *len) {
    json_t *o = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", err_type(e->http), "message", e->msg);
    return api_dump(o, len);
}

/* ---- the request ------------------------------------------------------------------- */

typedef struct msg_dx {
    json_t *stop;     /* the stop_sequences, for stop_sequence in the reply */
    json_t *warnings; /* strings, or NULL */
    char id[80];      /* msg_... */
} msg_dx;

static void dx_free(void *p) {
    msg_dx *d = p;
    if (!d) return;
    json_decref(d->stop);
    json_decref(d->warnings);
    free(d);
}

static const char *const TEXT_BLOCKS[] = {"text", NULL};

#define OOM() api_fail(e, 500, "server_error", NULL, NULL, "out of memory")

/* One Anthropic message -> chat messages (tool results become tool messages). */
static int message_to_chat(json_t *m, json_t *msgs, api_err *e) {
    const char *role = json_string_value(api_field(m, "role"));
    if (!json_is_object(m) || !role ||
        !(strcmp(role, "user") == 0 || strcmp(role, "assistant") == 0 || strcmp(role, "system") == 0))
        return BAD("messages", "each message needs a role of user or assistant");
    json_t *c = api_field(m, "content");
    if (!c) return BAD("messages", "each message needs 'content'");
    api_buf text = {0}, think = {0};
    json_t *calls = NULL;
    int rc = 0, n_text = 0;
    if (json_is_string(c)) {
        rc = api_buf_add(&text, json_string_value(c), json_string_length(c)) ? -2 : 0;
        n_text = 1;
    } else if (!json_is_array(c)) {
        rc = BAD("messages", "'content' must be a string or an array of blocks");
    } else {
        size_t i;
        json_t *bl;
        json_array_foreach(c, i, bl) {
            const char *t = json_string_value(api_field(bl, "type"));
            if (!t) {
                rc = BAD("messages", "each content block needs a 'type'");
                break;
            }
            if (!strcmp(t, "text")) {
                json_t *s = api_field(bl, "text");
                if (!json_is_string(s)) {
                    rc = BAD("messages", "a text block needs a string 'text'");
                    break;
                }
                if ((n_text++ && api_buf_add(&text, "\n", 1)) || api_buf_add(&text, json_string_value(s), json_string_length(s)))
                    rc = -2;
            } else if (!strcmp(t, "thinking")) {
                json_t *s = api_field(bl, "thinking");
                if (!json_is_string(s)) {
                    rc = BAD("messages", "a thinking block needs a string 'thinking'");
                    break;
                }
                if (api_buf_add(&think, json_string_value(s), json_string_length(s))) rc = -2;
            } else if (!strcmp(t, "redacted_thinking")) {
                continue;
            } else if (!strcmp(t, "tool_use")) {
                json_t *id = api_field(bl, "id"), *name = api_field(bl, "name"), *input = api_field(bl, "input");
                if (!json_is_string(id) || !json_is_string(name) || (input && !json_is_object(input))) {
                    rc = BAD("messages", "a tool_use block needs a string 'id' and 'name' and an object 'input'");
                    break;
                }
                char *args = input ? json_dumps(input, JSON_COMPACT) : strdup("{}");
                if (!calls) calls = json_array();
                if (!args || !calls ||
                    api_jpush(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name",
                                           name, "arguments", args)))
                    rc = -2;
                free(args);
            } else if (!strcmp(t, "tool_result")) {
                json_t *id = api_field(bl, "tool_use_id"), *rc_c = api_field(bl, "content");
                if (!json_is_string(id)) {
                    rc = BAD("messages", "a tool_result block needs a string 'tool_use_id'");
                    break;
                }
                api_buf r = {0};
                if (rc_c && (rc = dialect_text(rc_c, "messages", TEXT_BLOCKS, &r, e))) {
                    api_buf_free(&r);
                    break;
                }
                json_t *is_err = api_field(bl, "is_error");
                if (is_err && json_is_true(is_err) && !r.n && api_buf_add(&r, "error", 5)) rc = -2;
                if (!rc && api_jpush(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content", dialect_str(&r))))
                    rc = -2;
                api_buf_free(&r);
            } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
                rc = BAD("messages", "'%s' blocks are not supported: this model reads text only", t);
                break;
            } else {
                continue; /* server tool blocks and the like: nothing for a local model */
            }
            if (rc) break;
        }
    }
    if (!rc && (n_text || calls || think.n)) {
        const char *r = !strcmp(role, "system") ? "system" : role;
        json_t *cm = json_pack("{s:s, s:o}", "role", r, "content", dialect_str(&text));
        if (!cm || (calls && json_object_set(cm, "tool_calls", calls)) ||
            (think.n && json_object_set_new(cm, "reasoning_content", dialect_str(&think))) || api_jpush(msgs, cm))
            rc = -2;
    }
    api_buf_free(&text);
    api_buf_free(&think);
    json_decref(calls);
    return rc == -2 ? OOM() : rc;
}

/* An Anthropic tool as a chat function (dialect_tool_fn): client tools
 * (no type, or "custom") with their input_schema; server tools are left out. */
static int msg_tool(json_t *t, void *user, json_t **params, char *why, size_t why_cap, api_err *e) {
    const char *type = json_string_value(api_field(t, "type"));
    json_t *name = api_field(t, "name"), *schema = api_field(t, "input_schema");
    if (type && strcmp(type, "custom")) {
        snprintf(why, why_cap, "tools of type '%.40s' are not supported here and were ignored", type);
        return 0;
    }
    if (!json_is_string(name) || (schema && !json_is_object(schema)))
        return BAD("tools", "a tool needs a string 'name' and an object 'input_schema'");
    *params = schema ? json_incref(schema) : json_object();
    return *params ? 1 : api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
}

static json_t *to_chat(const api_ctx *a, json_t *root, msg_dx *d, int count_only, api_err *e) {
    json_t *chat = json_object(), *msgs = json_array();
    if (!chat || !msgs || json_object_set_new(chat, "messages", msgs)) {
        json_decref(chat);
        OOM();
        return NULL;
    }
    json_t *sys = api_field(root, "system");
    if (sys) {
        api_buf b = {0};
        int rc = dialect_text(sys, "system", TEXT_BLOCKS, &b, e);
        if (!rc && api_jpush(msgs, json_pack("{s:s, s:o}", "role", "system", "content", dialect_str(&b)))) rc = -2;
        api_buf_free(&b);
        if (rc) {
            if (rc == -2) OOM();
            goto fail;
        }
    }
    json_t *ms = api_field(root, "messages");
    if (!json_is_array(ms) || !json_array_size(ms)) {
        BAD("messages", "'messages' must be a non-empty array");
        goto fail;
    }
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) if (message_to_chat(m, msgs, e)) goto fail;
    int n_fn = 0, trc = dialect_tools(root, msg_tool, NULL, chat, &d->warnings, &n_fn, e);
    if (trc == -2) goto oom;
    if (trc) goto fail;
    json_t *tc = api_field(root, "tool_choice");
    if (tc && !json_is_object(tc)) {
        BAD("tool_choice", "'tool_choice' must be an object");
        goto fail;
    }
    if (tc && n_fn) {
        const char *type = json_string_value(api_field(tc, "type"));
        json_t *v = NULL;
        if (type && !strcmp(type, "auto")) v = json_string("auto");
        else if (type && !strcmp(type, "any")) v = json_string("required");
        else if (type && !strcmp(type, "none")) v = json_string("none");
        else if (type && !strcmp(type, "tool") && json_is_string(api_field(tc, "name")))
            v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", api_field(tc, "name"));
        else {
            BAD("tool_choice", "'tool_choice.type' must be auto, any, tool (with a name) or none");
            goto fail;
        }
        if (api_jset(chat, "tool_choice", v)) goto oom;
        json_t *dp = api_field(tc, "disable_parallel_tool_use");
        if (dp && json_is_true(dp) && api_jset(chat, "parallel_tool_calls", json_false())) goto oom;
    }
    /* thinking: a budget, or none */
    json_t *th = api_field(root, "thinking");
    if (th) {
        const char *type = json_string_value(api_field(th, "type"));
        if (!json_is_object(th) || !type) {
            BAD("thinking", "'thinking' must be an object with a 'type'");
            goto fail;
        }
        if (!strcmp(type, "enabled")) {
            json_t *b = api_field(th, "budget_tokens");
            if (!json_is_integer(b) || json_integer_value(b) < 0) {
                BAD("thinking", "'thinking.budget_tokens' must be a non-negative integer");
                goto fail;
            }
            json_int_t v = json_integer_value(b);
            if (api_jset(chat, "max_thinking_tokens", json_integer(v > a->n_ctx ? a->n_ctx : v))) goto oom;
        } else if (!strcmp(type, "disabled")) {
            if (api_jset(chat, "max_thinking_tokens", json_integer(0))) goto oom;
        } else if (strcmp(type, "adaptive")) {
            BAD("thinking", "'thinking.type' must be enabled, disabled or adaptive");
            goto fail;
        }
    }
    json_t *mt = api_field(root, "max_tokens");
    if (!mt && !count_only) {
        BAD("max_tokens", "'max_tokens' is required");
        goto fail;
    }
    if (mt && !count_only) {
        if (!json_is_integer(mt) || json_integer_value(mt) < 1) {
            BAD("max_tokens", "'max_tokens' must be a positive integer");
            goto fail;
        }
        json_int_t v = json_integer_value(mt);
        if (api_jset(chat, "max_tokens", json_integer(v > a->n_ctx ? a->n_ctx : v))) goto oom;
    }
    json_t *ss = api_field(root, "stop_sequences");
    if (ss && !json_is_array(ss)) {
        BAD("stop_sequences", "'stop_sequences' must be an array of strings");
        goto fail;
    }
    if (ss && json_array_size(ss)) {
        if (api_jset(chat, "stop", json_incref(ss))) goto oom;
        d->stop = json_incref(ss);
    }
    /* grammar: llama.cpp's GBNF, as on chat */
    static const char *const SAME[] = {"temperature", "top_p", "top_k", "stream", "model", "grammar", NULL};
    for (int k = 0; SAME[k]; k++) {
        json_t *v = api_field(root, SAME[k]);
        if (v && !count_only && api_jset(chat, SAME[k], json_incref(v))) goto oom;
    }
    json_t *md = api_field(root, "metadata");
    if (md && !json_is_object(md)) {
        BAD("metadata", "'metadata' must be an object");
        goto fail;
    }
    json_t *uid = md ? api_field(md, "user_id") : NULL;
    if (json_is_string(uid) && api_jset(chat, "user", json_incref(uid))) goto oom;
    return chat;
oom:
    OOM();
fail:
    json_decref(chat);
    return NULL;
}

int msg_parse(const api_ctx *a, const char *body, size_t len, srv_req *r, int count_only, api_err *e) {
    memset(e, 0, sizeof *e);
    json_t *root = api_load_body(body, len, e);
    if (!root) return -1;
    msg_dx *d = calloc(1, sizeof *d);
    json_t *chat = NULL;
    int rc = -1;
    if (!d) {
        OOM();
        goto out;
    }
    r->dialect = SRV_DIALECT_MESSAGES;
    r->wire = &msg_wire;
    r->dx = d;
    r->dx_free = dx_free;
    if (!(chat = to_chat(a, root, d, count_only, e))) goto out;
    if (api_parse_chat_obj(a, chat, r, count_only, e)) {
        if (!strcmp(e->param, "stop")) snprintf(e->param, sizeof e->param, "stop_sequences");
        goto out;
    }
    snprintf(d->id, sizeof d->id, "msg_%s", strchr(r->id, '-') ? strchr(r->id, '-') + 1 : r->id);
    rc = 0;
out:
    json_decref(chat);
    json_decref(root);
    return rc;
}

char *msg_count_json(const srv_req *r, size_t *len) {
    json_t *o = json_pack("{s:i}", "input_tokens", r->n_prompt);
    return api_dump(o, len);
}

/* ---- the reply ------------------------------------------------------------------------ */

/* Anthropic counts input apart from what the cache supplied. */
static json_t *usage_of(const srv_req *r, json_t *cu, int with_input) {
    json_int_t in = json_integer_value(json_object_get(cu, "prompt_tokens"));
    json_int_t out = json_integer_value(json_object_get(cu, "completion_tokens"));
    json_int_t cached = json_integer_value(json_object_get(json_object_get(cu, "prompt_tokens_details"), "cached_tokens"));
    if (!with_input) return json_pack("{s:I}", "output_tokens", out);
    return json_pack("{s:I, s:I, s:I, s:I}", "input_tokens", in - cached, "cache_creation_input_tokens", (json_int_t)0,
                     "cache_read_input_tokens", cached, "output_tokens", out);
}

static json_t *stop_reason(const srv_req *r, const char *finish, int calls) {
    if (calls) return json_string("tool_use");
    if (finish && !strcmp(finish, "length")) return json_string("max_tokens");
    if (r->stop_index >= 0) return json_string("stop_sequence");
    return json_string("end_turn");
}

static json_t *stop_seq(const srv_req *r) {
    const msg_dx *d = r->dx;
    json_t *s = r->stop_index >= 0 ? json_array_get(d->stop, (size_t)r->stop_index) : NULL;
    return s ? json_incref(s) : json_null();
}

/* A tool_use block from a chat tool call: its arguments parsed (the grammar
 * made them JSON; anything else is kept as a string under "input"). */
static json_t *tool_block(json_t *call, int with_input) {
    json_t *fn = json_object_get(call, "function");
    const char *args = json_string_value(json_object_get(fn, "arguments"));
    json_t *in = with_input && args ? json_loads(args, 0, NULL) : NULL;
    if (with_input && !json_is_object(in)) {
        json_decref(in);
        in = json_pack("{s:s}", "input", args ? args : "");
    }
    return json_pack("{s:s, s:O, s:O, s:o}", "type", "tool_use", "id", json_object_get(call, "id"), "name",
                     json_object_get(fn, "name"), "input", with_input ? in : json_object());
}

static json_t *message_head(const api_ctx *a, const srv_req *r, json_t *content, json_t *stop, json_t *seq,
                            json_t *usage) {
    const msg_dx *d = r->dx;
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o}", "id", d->id, "type", "message", "role",
                          "assistant", "model", a->model_id, "content", content, "stop_reason", stop, "stop_sequence",
                          seq, "usage", usage);
    if (o && d->warnings) json_object_set(o, "warnings", d->warnings);
    return o;
}

static char *msg_reply(const api_ctx *a, const srv_req *r, json_t *chat, size_t *len) {
    json_t *ch = json_array_get(json_object_get(chat, "choices"), 0);
    json_t *m = json_object_get(ch, "message");
    const char *finish = json_string_value(json_object_get(ch, "finish_reason"));
    json_t *content = json_array();
    json_t *rs = api_field(m, "reasoning_content"), *text = api_field(m, "content"), *calls = api_field(m, "tool_calls");
    int bad = !content;
    if (!bad && rs && json_string_length(rs))
        bad = api_jpush(content, json_pack("{s:s, s:O, s:s}", "type", "thinking", "thinking", rs, "signature", ""));
    if (!bad && text && json_string_length(text)) bad = api_jpush(content, json_pack("{s:s, s:O}", "type", "text", "text", text));
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) bad = bad || api_jpush(content, tool_block(c, 1));
    json_t *o = bad ? NULL
                    : message_head(a, r, content, stop_reason(r, finish, json_array_size(calls) > 0), stop_seq(r),
                                   usage_of(r, json_object_get(chat, "usage"), 1));
    if (bad) json_decref(content);
    json_decref(chat);
    return api_dump(o, len);
}

/* ---- the stream -------------------------------------------------------------------------- */

typedef struct msg_ds {
    dialect_stream base;
    int started;
    int cur;       /* the open block: 0 none, 1 thinking, 2 text */
    int index;     /* the next block's index */
    int calls;     /* tool_use blocks sent */
    char finish[16];
} msg_ds;

static void ds_free(dialect_stream *p) { free(p); }

static int ev(api_buf *out, const char *type, json_t *o) {
    if (!o || api_jset(o, "type", json_string(type))) {
        json_decref(o);
        return -1;
    }
    return dialect_event(out, type, o);
}

static int close_block(msg_ds *d, api_buf *out) {
    if (!d->cur) return 0;
    int rc = d->cur == 1 && ev(out, "content_block_delta",
                               json_pack("{s:i, s:{s:s, s:s}}", "index", d->index, "delta", "type", "signature_delta",
                                         "signature", ""));
    rc = rc || ev(out, "content_block_stop", json_pack("{s:i}", "index", d->index));
    d->cur = 0;
    d->index++;
    return rc ? -1 : 0;
}

static int text_delta(msg_ds *d, api_buf *out, int kind, json_t *s) {
    if (!json_string_length(s)) return 0;
    if (d->cur != kind) {
        if (close_block(d, out)) return -1;
        d->cur = kind;
        json_t *b = kind == 1 ? json_pack("{s:s, s:s, s:s}", "type", "thinking", "thinking", "", "signature", "")
                              : json_pack("{s:s, s:s}", "type", "text", "text", "");
        if (ev(out, "content_block_start", b ? json_pack("{s:i, s:o}", "index", d->index, "content_block", b) : NULL))
            return -1;
    }
    return ev(out, "content_block_delta",
              kind == 1 ? json_pack("{s:i, s:{s:s, s:O}}", "index", d->index, "delta", "type", "thinking_delta", "thinking", s)
                        : json_pack("{s:i, s:{s:s, s:O}}", "index", d->index, "delta", "type", "text_delta", "text", s));
}

static int calls_delta(msg_ds *d, api_buf *out, json_t *calls) {
    if (close_block(d, out)) return -1;
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *args = json_object_get(json_object_get(c, "function"), "arguments");
        json_t *b = tool_block(c, 0);
        if (ev(out, "content_block_start", b ? json_pack("{s:i, s:o}", "index", d->index, "content_block", b) : NULL) ||
            ev(out, "content_block_delta", json_pack("{s:i, s:{s:s, s:O}}", "index", d->index, "delta", "type",
                                                     "input_json_delta", "partial_json", args)) ||
            ev(out, "content_block_stop", json_pack("{s:i}", "index", d->index)))
            return -1;
        d->index++;
        d->calls++;
    }
    return 0;
}

static msg_ds *ds_get(void **ds) {
    if (!*ds) {
        msg_ds *d = calloc(1, sizeof *d);
        if (!d) return NULL;
        d->base.free = ds_free;
        *ds = d;
    }
    return *ds;
}

static int msg_stream_chunk(const api_ctx *a, const srv_req *r, void **ds, json_t *chunk, api_buf *out) {
    msg_ds *d = ds_get(ds);
    int rc = !d;
    if (!rc && !d->started) {
        d->started = 1;
        /* the first event comes after admission, which set cached_tokens
         * (read after taking the event under the request's mutex) */
        json_t *u = json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", r->n_prompt - r->cached_tokens,
                              "cache_creation_input_tokens", 0, "cache_read_input_tokens", r->cached_tokens,
                              "output_tokens", 0);
        json_t *m = u ? message_head(a, r, json_array(), json_null(), json_null(), u) : NULL;
        rc = ev(out, "message_start", m ? json_pack("{s:o}", "message", m) : NULL);
    }
    json_t *choices = json_object_get(chunk, "choices");
    if (!rc && json_array_size(choices)) {
        json_t *ch = json_array_get(choices, 0), *delta = json_object_get(ch, "delta");
        json_t *rs = api_field(delta, "reasoning_content"), *content = api_field(delta, "content"),
               *calls = api_field(delta, "tool_calls"), *fin = api_field(ch, "finish_reason");
        if (!rc && rs) rc = text_delta(d, out, 1, rs);
        if (!rc && content) rc = text_delta(d, out, 2, content);
        if (!rc && calls) rc = calls_delta(d, out, calls);
        if (!rc && fin) snprintf(d->finish, sizeof d->finish, "%s", json_string_value(fin));
    } else if (!rc && json_is_object(json_object_get(chunk, "usage"))) {
        json_t *u = usage_of(r, json_object_get(chunk, "usage"), 1);
        if (close_block(d, out)) {
            json_decref(u);
            u = NULL;
        }
        rc = !u ||
             ev(out, "message_delta",
                u ? json_pack("{s:{s:o, s:o}, s:o}", "delta", "stop_reason", stop_reason(r, d->finish, d->calls > 0),
                              "stop_sequence", stop_seq(r), "usage", u)
                  : NULL) ||
             ev(out, "message_stop", json_object());
    }
    json_decref(chunk);
    return rc ? -1 : 0;
}

static int msg_stream_error(const api_ctx *a, const srv_req *r, void **ds, const char *msg, api_buf *out) {
    return ev(out, "error", json_pack("{s:{s:s, s:s}}", "error", "type", "api_error", "message", msg));
}
