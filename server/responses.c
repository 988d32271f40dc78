/* server/responses: OpenAI's Responses API (POST /v1/responses, GET and
 * DELETE /v1/responses/{id}) over the chat engine (dialect.h). Owns the
 * translation of input items to chat messages, the response object, its
 * stream of typed events and the store of finished responses that
 * previous_response_id continues. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dialect.h"

static char *resp_reply(const api_ctx *a, const srv_req *r, json_t *chat, size_t *len);
static int resp_stream_chunk(const api_ctx *a, const srv_req *r, void **ds, json_t *chunk, api_buf *out);
static int resp_stream_error(const api_ctx *a, const srv_req *r, void **ds, const char *msg, api_buf *out);
static const api_dialect resp_wire = {resp_reply, resp_stream_chunk, resp_stream_error};
#include "base/util.h"

#define BAD(param, ...) api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)


/* ---- the store ------------------------------------------------------------------ */

/* One response and the items its turn added (its new input, its output);
 * the turns before are reached through prev, so a long chain of turns costs
 * each turn once, not the whole conversation again per turn. */
typedef struct stored {
    char id[80];
    char prev[80];   /* the previous_response_id it continued, or "" */
    double t;        /* monotonic seconds it was stored */
    size_t bytes;    /* its JSON text's size, for the byte budget */
    json_t *items;   /* this turn's items */
    json_t *resp;    /* the response object */
} stored;

struct resp_store {
    pthread_mutex_t mu;
    stored *e;
    int n, max_n, ttl;
    size_t bytes, max_bytes; /* held, and the budget (their JSON text's size) */
};


resp_store *resp_store_new(int max_n, int ttl_s, size_t max_bytes) {
    resp_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->max_n = max_n > 0 ? max_n : 1;
    s->ttl = ttl_s > 0 ? ttl_s : 1;
    s->max_bytes = max_bytes ? max_bytes : (size_t)1 << 20;
    if (!(s->e = calloc((size_t)s->max_n, sizeof *s->e)) || pthread_mutex_init(&s->mu, NULL)) {
        free(s->e);
        free(s);
        return NULL;
    }
    return s;
}

static void drop_at(resp_store *s, int i) {
    s->bytes -= s->e[i].bytes;
    json_decref(s->e[i].items);
    json_decref(s->e[i].resp);
    memmove(s->e + i, s->e + i + 1, (size_t)(s->n - i - 1) * sizeof *s->e);
    s->n--;
}

void resp_store_free(resp_store *s) {
    if (!s) return;
    while (s->n) drop_at(s, s->n - 1);
    pthread_mutex_destroy(&s->mu);
    free(s->e);
    free(s);
}

/* Oldest first; the expired go, and the oldest when full. Under mu. */
static void expire(resp_store *s) {
    double now = tl_now();
    while (s->n && now - s->e[0].t > s->ttl) drop_at(s, 0);
}

static int find(resp_store *s, const char *id) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->e[i].id, id)) return i;
    return -1;
}

/* Takes items and resp. */
static void store_put(resp_store *s, const char *id, const char *prev, json_t *items, json_t *resp) {
    if (!s || !items || !resp) {
        json_decref(items);
        json_decref(resp);
        return;
    }
    /* the JSON text's size stands for the memory (jansson's nodes take a few
     * times more, in proportion): measured once, outside the lock */
    size_t bytes = json_dumpb(items, NULL, 0, JSON_COMPACT) + json_dumpb(resp, NULL, 0, JSON_COMPACT);
    if (bytes > s->max_bytes) { /* alone over the budget: not kept */
        json_decref(items);
        json_decref(resp);
        return;
    }
    pthread_mutex_lock(&s->mu);
    expire(s);
    if (s->n == s->max_n) drop_at(s, 0);
    while (s->n && s->bytes + bytes > s->max_bytes) drop_at(s, 0);
    s->bytes += bytes;
    stored *x = &s->e[s->n++];
    x->bytes = bytes;
    snprintf(x->id, sizeof x->id, "%s", id);
    snprintf(x->prev, sizeof x->prev, "%s", prev ? prev : "");
    x->t = tl_now();
    x->items = items;
    x->resp = resp;
    pthread_mutex_unlock(&s->mu);
}

/* Deep copies (the caller's): the whole conversation up to and including
 * response id (every turn's items, oldest first), and the response. -1 if
 * it, or a turn it continued, is not stored (any more). */
static int store_get(resp_store *s, const char *id, json_t **items, json_t **resp) {
    if (!s) return -1;
    pthread_mutex_lock(&s->mu);
    expire(s);
    int i = find(s, id), rc = i >= 0 ? 0 : -1;
    if (!rc && resp) *resp = json_deep_copy(s->e[i].resp);
    if (!rc && items) {
        int *chain = malloc((size_t)s->n * sizeof *chain), n = 0;
        for (int k = i; chain && k >= 0 && n < s->n;) { /* n < s->n: no cycle can hold it */
            chain[n++] = k;
            k = s->e[k].prev[0] ? find(s, s->e[k].prev) : -2;
            if (k == -1) rc = -1; /* a turn in the middle expired */
        }
        *items = chain && !rc ? json_array() : NULL;
        for (int k = n - 1; *items && k >= 0; k--) {
            size_t j;
            json_t *it;
            json_array_foreach(s->e[chain[k]].items, j, it) json_array_append_new(*items, json_deep_copy(it));
        }
        if (!*items) rc = -1;
        free(chain);
    }
    pthread_mutex_unlock(&s->mu);
    if (rc && resp) {
        json_decref(*resp);
        *resp = NULL;
    }
    return rc;
}

/* o's text (o taken), or NULL with e filled. */
static char *dump_or_fail(json_t *o, size_t *len, api_err *e) {
    char *s = api_dump(o, len);
    if (!s) api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return s;
}

char *resp_get(const api_ctx *a, const char *id, size_t *len, api_err *e) {
    json_t *r = NULL;
    if (store_get(a->store, id, NULL, &r) || !r) {
        api_fail(e, 404, "invalid_request_error", "response_id", NULL, "no stored response with id '%.64s'", id);
        return NULL;
    }
    return dump_or_fail(r, len, e);
}

char *resp_input_items(const api_ctx *a, const char *id, int asc, size_t *len, api_err *e) {
    json_t *items = NULL, *r = NULL;
    if (store_get(a->store, id, &items, &r) || !items || !r) {
        json_decref(items);
        json_decref(r);
        api_fail(e, 404, "invalid_request_error", "response_id", NULL, "no stored response with id '%.64s'", id);
        return NULL;
    }
    /* the conversation that led to the response: all but its own output */
    size_t n_out = json_array_size(json_object_get(r, "output")), n = json_array_size(items);
    n = n > n_out ? n - n_out : 0;
    json_t *data = json_array();
    for (size_t k = 0; data && k < n; k++) {
        size_t i = asc ? k : n - 1 - k;
        json_t *it = json_deep_copy(json_array_get(items, i));
        if (!it) continue;
        if (!json_object_get(it, "type")) json_object_set_new(it, "type", json_string("message"));
        if (!json_object_get(it, "id")) {
            char iid[120];
            snprintf(iid, sizeof iid, "in_%s_%zu", id + (strncmp(id, "resp_", 5) ? 0 : 5), i);
            json_object_set_new(it, "id", json_string(iid));
        }
        json_array_append_new(data, it);
    }
    json_decref(items);
    json_decref(r);
    json_t *o = data ? json_pack("{s:s, s:o, s:O?, s:O?, s:b}", "object", "list", "data", data, "first_id",
                                 json_object_get(json_array_get(data, 0), "id"), "last_id",
                                 json_object_get(json_array_get(data, json_array_size(data) - 1), "id"), "has_more", 0)
                     : NULL;
    return dump_or_fail(o, len, e);
}

char *resp_delete(const api_ctx *a, const char *id, size_t *len, api_err *e) {
    int i = -1;
    if (a->store) {
        pthread_mutex_lock(&a->store->mu);
        if ((i = find(a->store, id)) >= 0) drop_at(a->store, i);
        pthread_mutex_unlock(&a->store->mu);
    }
    if (i < 0) {
        api_fail(e, 404, "invalid_request_error", "response_id", NULL, "no stored response with id '%.64s'", id);
        return NULL;
    }
    json_t *o = json_pack("{s:s, s:s, s:b}", "id", id, "object", "response", "deleted", 1);
    return dump_or_fail(o, len, e);
}

/* ---- the request ----------------------------------------------------------------- */

typedef struct resp_dx {
    json_t *items;    /* the conversation: stored history, then this input */
    size_t n_hist;    /* of those, from the history */
    char prev[80];    /* previous_response_id, or "" */
    json_t *echo;     /* the fields the response object repeats */
    json_t *warnings; /* strings, or NULL */
    json_t *custom;   /* names of the custom (freeform) tools, offered as functions of one string */
    int store;
    char id[80];      /* resp_... */
} resp_dx;

static void dx_free(void *p) {
    resp_dx *d = p;
    if (!d) return;
    json_decref(d->items);
    json_decref(d->echo);
    json_decref(d->warnings);
    json_decref(d->custom);
    free(d);
}

static int warn(resp_dx *d, const char *msg) {
    if (!d->warnings && !(d->warnings = json_array())) return -1;
    return api_jpush(d->warnings, json_string(msg));
}

/* Text parts of input and output items; images, files and audio are refused. */
static const char *const TEXT_PARTS[] = {"input_text", "output_text", "text", "refusal", "summary_text",
                                         "reasoning_text", NULL};

/* The last chat message, if it is the assistant's and may take tool calls. */
static json_t *open_assistant(json_t *msgs, int joinable) {
    size_t n = json_array_size(msgs);
    json_t *m = n && joinable ? json_array_get(msgs, n - 1) : NULL;
    const char *role = json_string_value(json_object_get(m, "role"));
    return role && !strcmp(role, "assistant") ? m : NULL;
}

/* Items -> chat messages. */
static int items_to_chat(json_t *items, json_t *msgs, api_err *e) {
    size_t i;
    json_t *it;
    json_t *reasoning = NULL; /* waits for the assistant message it belongs to */
    int joinable = 0;         /* the last message came from an assistant-side item */
    int rc = 0;
    json_array_foreach(items, i, it) {
        if (!json_is_object(it)) {
            rc = BAD("input", "input items must be objects");
            break;
        }
        const char *type = json_string_value(api_field(it, "type"));
        if (!type) type = api_field(it, "role") ? "message" : "";
        api_buf b = {0};
        if (!strcmp(type, "message")) {
            const char *role = json_string_value(api_field(it, "role"));
            if (!role || !(strcmp(role, "user") == 0 || strcmp(role, "assistant") == 0 || strcmp(role, "system") == 0 ||
                           strcmp(role, "developer") == 0)) {
                rc = BAD("input", "a message's role must be user, assistant, system or developer");
                break;
            }
            json_t *c = api_field(it, "content");
            if (!c) {
                rc = BAD("input", "a message needs 'content'");
                break;
            }
            if ((rc = dialect_text(c, "input", TEXT_PARTS, &b, e))) {
                api_buf_free(&b);
                if (rc == -2) rc = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
                break;
            }
            int sys = !strcmp(role, "system") || !strcmp(role, "developer");
            json_t *m = json_pack("{s:s, s:o}", "role", sys ? "system" : role, "content", dialect_str(&b));
            if (m && !strcmp(role, "assistant") && reasoning) {
                json_object_set_new(m, "reasoning_content", reasoning);
                reasoning = NULL;
            }
            if (api_jpush(msgs, m)) rc = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            joinable = !strcmp(role, "assistant");
        } else if (!strcmp(type, "function_call") || !strcmp(type, "custom_tool_call")) {
            /* a custom (freeform) tool's call carries its text as 'input' */
            int custom = !strcmp(type, "custom_tool_call");
            json_t *name = api_field(it, "name"), *args = api_field(it, custom ? "input" : "arguments"), *cid = api_field(it, "call_id");
            if (!json_is_string(name) || !json_is_string(args) || !json_is_string(cid)) {
                rc = BAD("input", "a function_call item needs string 'call_id', 'name' and 'arguments'");
                break;
            }
            json_t *m = open_assistant(msgs, joinable);
            if (!m) {
                m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
                if (api_jpush(msgs, m)) {
                    rc = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
                    break;
                }
            }
            if (reasoning) {
                json_object_set_new(m, "reasoning_content", reasoning);
                reasoning = NULL;
            }
            json_t *calls = json_object_get(m, "tool_calls");
            if (!calls) json_object_set_new(m, "tool_calls", calls = json_array());
            /* chat arguments are JSON: a custom tool's free text goes in as {"input": text} */
            json_t *wo = custom ? json_pack("{s:O}", "input", args) : NULL;
            char *wrapped = api_dump(wo, NULL);
            if (!calls || (custom && !wrapped) ||
                api_jpush(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", cid, "type", "function", "function", "name",
                                       name, "arguments", custom ? wrapped : json_string_value(args))))
                rc = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            free(wrapped);
            joinable = 1;
        } else if (!strcmp(type, "function_call_output") || !strcmp(type, "custom_tool_call_output")) {
            json_t *cid = api_field(it, "call_id"), *out = api_field(it, "output");
            if (!json_is_string(cid) || !out) {
                rc = BAD("input", "a function_call_output item needs a string 'call_id' and an 'output'");
                break;
            }
            if ((rc = dialect_text(out, "input", TEXT_PARTS, &b, e))) {
                api_buf_free(&b);
                if (rc == -2) rc = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
                break;
            }
            if (api_jpush(msgs, json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", cid, "content", dialect_str(&b))))
                rc = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            joinable = 0;
        } else if (!strcmp(type, "reasoning")) {
            json_t *c = api_field(it, "content");
            if (!c || !json_array_size(c)) c = api_field(it, "summary");
            if (c && (rc = dialect_text(c, "input", TEXT_PARTS, &b, e))) {
                api_buf_free(&b);
                if (rc == -2) rc = api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
                break;
            }
            json_decref(reasoning);
            reasoning = dialect_str(&b);
        } else if (!strcmp(type, "web_search_call") || !strcmp(type, "local_shell_call") ||
                   !strcmp(type, "local_shell_call_output") || !strcmp(type, "file_search_call") ||
                   !strcmp(type, "image_generation_call") || !strcmp(type, "code_interpreter_call") ||
                   !strcmp(type, "computer_call") || !strcmp(type, "computer_call_output") ||
                   !strcmp(type, "mcp_call") || !strcmp(type, "mcp_list_tools")) {
            /* the traces of tools this server does not run (an agent's history
             * from another backend): left out rather than failing the turn */
            joinable = 0;
        } else {
            rc = BAD("input", "input items of type '%.40s' are not supported", type);
            break;
        }
        api_buf_free(&b);
        if (rc) break;
    }
    json_decref(reasoning);
    return rc;
}

/* Copies the scalar fields that mean the same in chat. */
static int copy_if(json_t *from, const char *k, json_t *to, const char *tk) {
    json_t *v = api_field(from, k);
    return v ? api_jset(to, tk, json_incref(v)) : 0;
}

/* A Responses tool as a chat function (dialect_tool_fn): functions, and
 * custom tools taking free text as a function of one string whose calls go
 * back as custom_tool_call items; other kinds are left out. */
static int resp_tool(json_t *t, void *user, json_t **params, char *why, size_t why_cap, api_err *e) {
    resp_dx *d = user;
    const char *type = json_string_value(api_field(t, "type"));
    if (!type) return BAD("tools", "each tool needs a 'type'");
    const int custom = !strcmp(type, "custom");
    if (strcmp(type, "function") && !custom) {
        snprintf(why, why_cap, "tools of type '%.40s' are not supported here and were ignored", type);
        return 0;
    }
    json_t *name = api_field(t, "name");
    if (!json_is_string(name)) return BAD("tools", "a function tool needs a string 'name'");
    if (custom) {
        *params = json_pack("{s:s, s:{s:{s:s}}, s:[s], s:b}", "type", "object", "properties", "input", "type",
                            "string", "required", "input", "additionalProperties", 0);
        if (!*params || (!d->custom && !(d->custom = json_array())) || json_array_append(d->custom, name)) {
            json_decref(*params);
            *params = NULL;
            return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    } else if (api_field(t, "parameters")) {
        *params = json_incref(api_field(t, "parameters"));
    }
    return 1;
}

static const char *const KNOWN[] = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning",
    "max_output_tokens", "temperature", "top_p", "stream", "store", "previous_response_id", "metadata", "user",
    "prompt_cache_key", "truncation", "include", "service_tier", "top_logprobs", "safety_identifier",
    "stream_options", "background", "max_tool_calls", "prompt_cache_retention", "grammar", NULL};

static int known(const char *k) {
    for (int i = 0; KNOWN[i]; i++)
        if (!strcmp(KNOWN[i], k)) return 1;
    return 0;
}

/* Responses fields -> a chat object. */
static json_t *to_chat(const api_ctx *a, json_t *root, resp_dx *d, api_err *e) {
    json_t *chat = json_object(), *msgs = json_array();
    if (!chat || !msgs || json_object_set_new(chat, "messages", msgs)) {
        json_decref(chat);
        api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return NULL;
    }
    json_t *ins = api_field(root, "instructions");
    if (ins && !json_is_string(ins)) {
        BAD("instructions", "'instructions' must be a string");
        goto fail;
    }
    if (ins && api_jpush(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins))) goto oom;
    if (items_to_chat(d->items, msgs, e)) goto fail;
    /* tools: functions; other kinds are left out with a warning */
    int n_fn = 0, trc = dialect_tools(root, resp_tool, d, chat, &d->warnings, &n_fn, e);
    if (trc == -2) goto oom;
    if (trc) goto fail;
    json_t *tc = api_field(root, "tool_choice");
    if (tc && n_fn) {
        if (json_is_string(tc)) {
            if (api_jset(chat, "tool_choice", json_incref(tc))) goto oom;
        } else if (json_is_object(tc)) {
            const char *type = json_string_value(api_field(tc, "type"));
            json_t *name = api_field(tc, "name");
            if (type && (!strcmp(type, "function") || !strcmp(type, "custom")) && json_is_string(name)) {
                if (api_jset(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", name)))
                    goto oom;
            } else if (warn(d, "a tool_choice other than auto, none, required or a function was taken as auto")) {
                goto oom;
            }
        } else {
            BAD("tool_choice", "'tool_choice' must be a string or an object");
            goto fail;
        }
    }
    if (n_fn && copy_if(root, "parallel_tool_calls", chat, "parallel_tool_calls")) goto oom;
    /* text.format: JSON mode or a schema */
    json_t *text = api_field(root, "text");
    if (text && !json_is_object(text)) {
        BAD("text", "'text' must be an object");
        goto fail;
    }
    json_t *fmt = text ? api_field(text, "format") : NULL;
    if (fmt) {
        const char *type = json_string_value(api_field(fmt, "type"));
        if (!type) {
            BAD("text.format", "'text.format' needs a 'type'");
            goto fail;
        }
        if (!strcmp(type, "json_object")) {
            if (api_jset(chat, "response_format", json_pack("{s:s}", "type", "json_object"))) goto oom;
        } else if (!strcmp(type, "json_schema")) {
            json_t *js = json_object();
            if (!js || api_jset(chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js)) ||
                copy_if(fmt, "name", js, "name") || copy_if(fmt, "schema", js, "schema") ||
                copy_if(fmt, "strict", js, "strict"))
                goto oom;
            if (!api_field(fmt, "schema")) {
                BAD("text.format", "a json_schema format needs a 'schema'");
                goto fail;
            }
        } else if (strcmp(type, "text")) {
            BAD("text.format", "'text.format.type' must be text, json_object or json_schema");
            goto fail;
        }
    }
    json_t *rs = api_field(root, "reasoning");
    if (rs && !json_is_object(rs)) {
        BAD("reasoning", "'reasoning' must be an object");
        goto fail;
    }
    json_t *effort = rs ? api_field(rs, "effort") : NULL;
    if (effort) {
        const char *ev = json_string_value(effort);
        /* "xhigh" (newer models) is high here */
        if (api_jset(chat, "reasoning_effort", ev && !strcmp(ev, "xhigh") ? json_string("high") : json_incref(effort)))
            goto oom;
    }
    json_t *mo = api_field(root, "max_output_tokens");
    if (mo) {
        if (!json_is_integer(mo) || json_integer_value(mo) < 1) {
            BAD("max_output_tokens", "'max_output_tokens' must be a positive integer");
            goto fail;
        }
        json_int_t v = json_integer_value(mo);
        if (api_jset(chat, "max_tokens", json_integer(v > a->n_ctx ? a->n_ctx : v))) goto oom;
    }
    if (copy_if(root, "temperature", chat, "temperature") || copy_if(root, "top_p", chat, "top_p") ||
        copy_if(root, "stream", chat, "stream") || copy_if(root, "prompt_cache_key", chat, "prompt_cache_key") ||
        copy_if(root, "user", chat, "user") || copy_if(root, "model", chat, "model") ||
        copy_if(root, "grammar", chat, "grammar")) /* llama.cpp's GBNF, as on chat */
        goto oom;
    return chat;
oom:
    api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
fail:
    json_decref(chat);
    return NULL;
}

/* The chat parser names chat fields; the client sent these. */
static void rename_param(api_err *e) {
    static const char *const MAP[][2] = {{"messages", "input"}, {"max_tokens", "max_output_tokens"},
                                         {"response_format", "text.format"}, {"reasoning_effort", "reasoning.effort"}};
    for (size_t i = 0; i < sizeof MAP / sizeof *MAP; i++)
        if (!strcmp(e->param, MAP[i][0])) snprintf(e->param, sizeof e->param, "%s", MAP[i][1]);
}

int resp_parse(const api_ctx *a, const char *body, size_t len, srv_req *r, api_err *e) {
    memset(e, 0, sizeof *e);
    json_t *root = api_load_body(body, len, e);
    if (!root) return -1;
    resp_dx *d = calloc(1, sizeof *d);
    json_t *chat = NULL;
    int rc = -1;
    if (!d) {
        api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    r->dialect = SRV_DIALECT_RESPONSES;
    r->wire = &resp_wire;
    r->dx = d;
    r->dx_free = dx_free;
    const char *k;
    json_t *v;
    /* fields this server does not know are ignored with a warning, as vLLM
     * does: agents add new ones faster than servers learn them, and a 400
     * would stop the agent */
    json_object_foreach(root, k, v) if (!known(k)) {
        char m[160];
        snprintf(m, sizeof m, "unknown field '%.48s' was ignored", k);
        api_utf8_scrub(m);
        if (warn(d, m)) goto oom;
    }
    json_t *bg = api_field(root, "background");
    if (bg && json_is_true(bg)) {
        BAD("background", "'background' responses are not supported");
        goto out;
    }
    json_t *st = api_field(root, "store");
    if (st && !json_is_boolean(st)) {
        BAD("store", "'store' must be true or false");
        goto out;
    }
    d->store = !st || json_is_true(st);
    json_t *prev = api_field(root, "previous_response_id");
    if (prev && !json_is_string(prev)) {
        BAD("previous_response_id", "'previous_response_id' must be a string");
        goto out;
    }
    if (prev) {
        snprintf(d->prev, sizeof d->prev, "%s", json_string_value(prev));
        if (store_get(a->store, json_string_value(prev), &d->items, NULL) || !d->items) {
            BAD("previous_response_id", "previous response '%.64s' not found (not stored, expired or deleted)",
                json_string_value(prev));
            goto out;
        }
    } else if (!(d->items = json_array())) {
        goto oom;
    }
    d->n_hist = json_array_size(d->items);
    json_t *in = api_field(root, "input");
    if (json_is_string(in)) {
        if (api_jpush(d->items, json_pack("{s:s, s:s, s:O}", "type", "message", "role", "user", "content", in))) goto oom;
    } else if (json_is_array(in)) {
        size_t i;
        json_t *it;
        json_array_foreach(in, i, it) if (api_jpush(d->items, json_deep_copy(it))) goto oom;
    } else {
        BAD("input", "'input' must be a string or an array of items");
        goto out;
    }
    json_t *md = api_field(root, "metadata");
    if (md && !json_is_object(md)) {
        BAD("metadata", "'metadata' must be an object");
        goto out;
    }
    /* what the response object repeats */
    d->echo = json_object();
    if (!d->echo) goto oom;
    static const char *const ECHO[] = {"instructions", "tools", "tool_choice", "temperature", "top_p",
                                       "max_output_tokens", "previous_response_id", "metadata", "user",
                                       "parallel_tool_calls", "text", "reasoning", NULL};
    for (int i = 0; ECHO[i]; i++)
        if (copy_if(root, ECHO[i], d->echo, ECHO[i])) goto oom;
    if (!(chat = to_chat(a, root, d, e))) goto out;
    if (api_parse_chat_obj(a, chat, r, 0, e)) {
        rename_param(e);
        goto out;
    }
    snprintf(d->id, sizeof d->id, "resp_%s", strchr(r->id, '-') ? strchr(r->id, '-') + 1 : r->id);
    rc = 0;
    goto out;
oom:
    api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
out:
    json_decref(chat);
    json_decref(root);
    return rc;
}

/* ---- the reply ---------------------------------------------------------------------- */

static json_t *usage_of(json_t *cu) {
    json_int_t in = json_integer_value(json_object_get(cu, "prompt_tokens"));
    json_int_t out = json_integer_value(json_object_get(cu, "completion_tokens"));
    json_int_t cached = json_integer_value(json_object_get(json_object_get(cu, "prompt_tokens_details"), "cached_tokens"));
    json_int_t rs = json_integer_value(json_object_get(json_object_get(cu, "completion_tokens_details"), "reasoning_tokens"));
    return json_pack("{s:I, s:{s:I}, s:I, s:{s:I}, s:I}", "input_tokens", in, "input_tokens_details", "cached_tokens",
                     cached, "output_tokens", out, "output_tokens_details", "reasoning_tokens", rs, "total_tokens",
                     in + out);
}

static json_t *echo_or(const resp_dx *d, const char *k, json_t *dflt) {
    json_t *v = api_field(d->echo, k);
    if (v) {
        json_decref(dflt);
        return json_incref(v);
    }
    return dflt;
}

/* The response object; output and usage taken (usage may be NULL: null). */
static json_t *resp_object(const api_ctx *a, const srv_req *r, const char *status, const char *incomplete,
                           json_t *output, json_t *usage) {
    const resp_dx *d = r->dx;
    json_t *o = json_object();
    json_t *reasoning = echo_or(d, "reasoning", json_pack("{s:n, s:n}", "effort", "summary"));
    json_t *text = echo_or(d, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    if (!o) {
        json_decref(reasoning);
        json_decref(text);
        json_decref(output);
        json_decref(usage);
        return NULL;
    }
    int bad = api_jset(o, "id", json_string(d->id)) || api_jset(o, "object", json_string("response")) ||
              api_jset(o, "created_at", json_integer(r->created)) || api_jset(o, "status", json_string(status));
    /* the values this function owns are set (and so taken) whatever failed before */
    bad |= api_jset(o, "output", output);
    bad |= api_jset(o, "usage", usage ? usage : json_null());
    bad |= api_jset(o, "reasoning", reasoning);
    bad |= api_jset(o, "text", text);
    bad = bad || api_jset(o, "error", json_null()) ||
              api_jset(o, "incomplete_details", incomplete ? json_pack("{s:s}", "reason", incomplete) : json_null()) ||
              api_jset(o, "instructions", echo_or(d, "instructions", json_null())) ||
              api_jset(o, "max_output_tokens", echo_or(d, "max_output_tokens", json_null())) ||
              api_jset(o, "model", json_string(a->model_id)) ||
              api_jset(o, "parallel_tool_calls", echo_or(d, "parallel_tool_calls", json_true())) ||
              api_jset(o, "previous_response_id", echo_or(d, "previous_response_id", json_null())) ||
              api_jset(o, "store", json_boolean(d->store)) ||
              api_jset(o, "temperature", echo_or(d, "temperature", json_real(1.0))) ||
              api_jset(o, "tool_choice", echo_or(d, "tool_choice", json_string("auto"))) ||
              api_jset(o, "tools", echo_or(d, "tools", json_array())) ||
              api_jset(o, "top_p", echo_or(d, "top_p", json_real(1.0))) || api_jset(o, "truncation", json_string("disabled")) ||
              api_jset(o, "user", echo_or(d, "user", json_null())) ||
              api_jset(o, "metadata", echo_or(d, "metadata", json_object()));
    if (!bad && d->warnings) bad = api_jset(o, "warnings", json_incref(d->warnings));
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *message_item(const char *id, const char *status, const char *text, size_t n) {
    return json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s%, s:[]}]}", "id", id, "type", "message", "status", status,
                     "role", "assistant", "content", "type", "output_text", "text", text, n, "annotations");
}

static json_t *reasoning_item(const char *id, const char *text, size_t n) {
    return json_pack("{s:s, s:s, s:[], s:[{s:s, s:s%}]}", "id", id, "type", "reasoning", "summary", "content",
                     "type", "reasoning_text", "text", text, n);
}

static int is_custom(const resp_dx *d, json_t *name) {
    size_t i;
    json_t *n;
    json_array_foreach(d->custom, i, n) if (json_equal(n, name)) return 1;
    return 0;
}

/* A custom tool's call: the text of its one argument (the grammar made the
 * arguments {"input": "..."}). New reference. */
static json_t *custom_input(json_t *args) {
    json_t *a = json_loads(json_string_value(args) ? json_string_value(args) : "", 0, NULL);
    json_t *in = json_is_string(json_object_get(a, "input")) ? json_incref(json_object_get(a, "input")) : json_incref(args);
    json_decref(a);
    return in;
}

static json_t *call_item(const resp_dx *d, const char *id, const char *status, json_t *call) {
    json_t *fn = json_object_get(call, "function"), *name = json_object_get(fn, "name");
    if (is_custom(d, name))
        return json_pack("{s:s, s:s, s:s, s:O, s:O, s:o}", "id", id, "type", "custom_tool_call", "status", status,
                         "call_id", json_object_get(call, "id"), "name", name, "input",
                         custom_input(json_object_get(fn, "arguments")));
    return json_pack("{s:s, s:s, s:s, s:O, s:O, s:O}", "id", id, "type", "function_call", "status", status, "call_id",
                     json_object_get(call, "id"), "name", name, "arguments", json_object_get(fn, "arguments"));
}

/* resp_<hex> -> <prefix>_<hex>_<k> */
static void item_id(const resp_dx *d, const char *prefix, int k, char *out, size_t cap) {
    snprintf(out, cap, "%s_%s_%d", prefix, d->id + 5, k);
}

/* Stores the finished response with the items its turn added. */
static void keep(const api_ctx *a, const resp_dx *d, json_t *resp) {
    if (!d->store || !a->store || !resp) return;
    json_t *items = json_array(), *out = json_object_get(resp, "output");
    size_t i;
    json_t *it;
    for (i = d->n_hist; items && i < json_array_size(d->items); i++)
        json_array_append_new(items, json_deep_copy(json_array_get(d->items, i)));
    if (items) json_array_foreach(out, i, it) json_array_append_new(items, json_deep_copy(it));
    store_put(a->store, d->id, d->prev, items, json_deep_copy(resp));
}

static char *resp_reply(const api_ctx *a, const srv_req *r, json_t *chat, size_t *len) {
    const resp_dx *d = r->dx;
    json_t *ch = json_array_get(json_object_get(chat, "choices"), 0);
    json_t *m = json_object_get(ch, "message");
    const char *finish = json_string_value(json_object_get(ch, "finish_reason"));
    json_t *output = json_array();
    json_t *rs = api_field(m, "reasoning_content"), *content = api_field(m, "content"), *calls = api_field(m, "tool_calls");
    char id[96];
    int k = 0, bad = !output;
    if (!bad && rs && json_string_length(rs)) {
        item_id(d, "rs", k++, id, sizeof id);
        bad = api_jpush(output, reasoning_item(id, json_string_value(rs), json_string_length(rs)));
    }
    /* as the stream does: a message item for content, or an empty one when there is no item at all */
    if (!bad && ((content && json_string_length(content)) || (!json_array_size(calls) && !json_array_size(output)))) {
        item_id(d, "msg", k++, id, sizeof id);
        bad = api_jpush(output, message_item(id, "completed", content ? json_string_value(content) : "",
                                         content ? json_string_length(content) : 0));
    }
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        item_id(d, "fc", k++, id, sizeof id);
        bad = bad || api_jpush(output, call_item(d, id, "completed", c));
    }
    int cut = finish && !strcmp(finish, "length");
    json_t *o = bad ? NULL
                    : resp_object(a, r, cut ? "incomplete" : "completed", cut ? "max_output_tokens" : NULL, output,
                                  usage_of(json_object_get(chat, "usage")));
    if (bad) json_decref(output);
    json_decref(chat);
    keep(a, d, o);
    return api_dump(o, len);
}

/* ---- the stream ------------------------------------------------------------------------ */

typedef struct resp_ds {
    dialect_stream base;
    int seq;         /* sequence_number of the next event */
    int started;
    int cur;         /* the open item: 0 none, 1 reasoning, 2 message */
    int cur_index;   /* its output_index */
    char cur_id[96];
    api_buf text;    /* its text so far */
    json_t *output;  /* finished items */
    char finish[16];
} resp_ds;

static void ds_free(dialect_stream *p) {
    resp_ds *d = (resp_ds *)p;
    api_buf_free(&d->text);
    json_decref(d->output);
    free(d);
}

/* One event: o (taken) gets its type and sequence number. */
static int ev(resp_ds *d, api_buf *out, const char *type, json_t *o) {
    if (!o || api_jset(o, "type", json_string(type)) || api_jset(o, "sequence_number", json_integer(d->seq++))) {
        json_decref(o);
        return -1;
    }
    return dialect_event(out, type, o);
}

static int item_event(resp_ds *d, api_buf *out, const char *type, int index, json_t *item) {
    return ev(d, out, type, item ? json_pack("{s:i, s:o}", "output_index", index, "item", item) : NULL);
}

static int close_item(const srv_req *r, resp_ds *d, api_buf *out) {
    if (!d->cur) return 0;
    const char *t = d->text.p ? d->text.p : "";
    size_t n = d->text.n;
    json_t *item;
    int rc;
    if (d->cur == 1) {
        rc = ev(d, out, "response.reasoning_text.done",
                json_pack("{s:s, s:i, s:i, s:s%}", "item_id", d->cur_id, "output_index", d->cur_index, "content_index", 0,
                          "text", t, n));
        item = reasoning_item(d->cur_id, t, n);
    } else {
        json_t *part = json_pack("{s:s, s:s%, s:[]}", "type", "output_text", "text", t, n, "annotations");
        rc = !part || ev(d, out, "response.output_text.done",
                         json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", d->cur_id, "output_index", d->cur_index,
                                   "content_index", 0, "text", t, n, "logprobs"));
        if (rc) json_decref(part);
        else rc = ev(d, out, "response.content_part.done",
                     json_pack("{s:s, s:i, s:i, s:o}", "item_id", d->cur_id, "output_index", d->cur_index,
                               "content_index", 0, "part", part));
        item = message_item(d->cur_id, "completed", t, n);
    }
    if (rc || !item) {
        json_decref(item);
        rc = -1;
    } else {
        rc = json_array_append(d->output, item) || item_event(d, out, "response.output_item.done", d->cur_index, item);
    }
    d->cur = 0;
    d->text.n = 0;
    return rc ? -1 : 0;
}

static int open_item(const srv_req *r, resp_ds *d, api_buf *out, int kind) {
    if (close_item(r, d, out)) return -1;
    d->cur = kind;
    d->cur_index = (int)json_array_size(d->output);
    item_id(r->dx, kind == 1 ? "rs" : "msg", d->cur_index, d->cur_id, sizeof d->cur_id);
    if (kind == 1)
        return item_event(d, out, "response.output_item.added", d->cur_index,
                          json_pack("{s:s, s:s, s:[], s:[]}", "id", d->cur_id, "type", "reasoning", "summary", "content"));
    return item_event(d, out, "response.output_item.added", d->cur_index,
                      json_pack("{s:s, s:s, s:s, s:s, s:[]}", "id", d->cur_id, "type", "message", "status",
                                "in_progress", "role", "assistant", "content")) ||
                   ev(d, out, "response.content_part.added",
                      json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[]}}", "item_id", d->cur_id, "output_index",
                                d->cur_index, "content_index", 0, "part", "type", "output_text", "text", "",
                                "annotations"))
               ? -1
               : 0;
}

static int text_delta(const srv_req *r, resp_ds *d, api_buf *out, int kind, json_t *s) {
    if (!json_string_length(s)) return 0;
    if (d->cur != kind && open_item(r, d, out, kind)) return -1;
    if (api_buf_add(&d->text, json_string_value(s), json_string_length(s))) return -1;
    if (kind == 1)
        return ev(d, out, "response.reasoning_text.delta",
                  json_pack("{s:s, s:i, s:i, s:O}", "item_id", d->cur_id, "output_index", d->cur_index, "content_index",
                            0, "delta", s));
    return ev(d, out, "response.output_text.delta",
              json_pack("{s:s, s:i, s:i, s:O, s:[]}", "item_id", d->cur_id, "output_index", d->cur_index,
                        "content_index", 0, "delta", s, "logprobs"));
}

static int calls_delta(const srv_req *r, resp_ds *d, api_buf *out, json_t *calls) {
    if (close_item(r, d, out)) return -1;
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        int idx = (int)json_array_size(d->output);
        char id[96];
        item_id(r->dx, "fc", idx, id, sizeof id);
        const resp_dx *dx = r->dx;
        json_t *added = call_item(dx, id, "in_progress", c), *done = call_item(dx, id, "completed", c);
        int custom = is_custom(dx, json_object_get(json_object_get(c, "function"), "name"));
        json_t *args = custom ? json_object_get(done, "input") : json_object_get(json_object_get(c, "function"), "arguments");
        if (added) json_object_set_new(added, custom ? "input" : "arguments", json_string(""));
        if (!added || !done) {
            json_decref(added);
            json_decref(done);
            return -1;
        }
        int rc = item_event(d, out, "response.output_item.added", idx, added) ||
                 ev(d, out, custom ? "response.custom_tool_call_input.delta" : "response.function_call_arguments.delta",
                    json_pack("{s:s, s:i, s:O}", "item_id", id, "output_index", idx, "delta", args)) ||
                 ev(d, out, custom ? "response.custom_tool_call_input.done" : "response.function_call_arguments.done",
                    json_pack("{s:s, s:i, s:O}", "item_id", id, "output_index", idx, custom ? "input" : "arguments",
                              args)) ||
                 json_array_append(d->output, done) || item_event(d, out, "response.output_item.done", idx, json_incref(done));
        json_decref(done);
        if (rc) return -1;
    }
    return 0;
}

static resp_ds *ds_get(void **ds) {
    if (!*ds) {
        resp_ds *d = calloc(1, sizeof *d);
        if (!d || !(d->output = json_array())) {
            free(d);
            return NULL;
        }
        d->base.free = ds_free;
        *ds = d;
    }
    return *ds;
}

static int start(const api_ctx *a, const srv_req *r, resp_ds *d, api_buf *out) {
    if (d->started) return 0;
    d->started = 1;
    json_t *o1 = resp_object(a, r, "in_progress", NULL, json_array(), NULL);
    if (ev(d, out, "response.created", o1 ? json_pack("{s:o}", "response", o1) : NULL)) return -1;
    json_t *o2 = resp_object(a, r, "in_progress", NULL, json_array(), NULL);
    return ev(d, out, "response.in_progress", o2 ? json_pack("{s:o}", "response", o2) : NULL);
}

static int resp_stream_chunk(const api_ctx *a, const srv_req *r, void **ds, json_t *chunk, api_buf *out) {
    resp_ds *d = ds_get(ds);
    int rc = !d || start(a, r, d, out);
    json_t *choices = json_object_get(chunk, "choices");
    if (!rc && json_array_size(choices)) {
        json_t *ch = json_array_get(choices, 0), *delta = json_object_get(ch, "delta");
        json_t *rs = api_field(delta, "reasoning_content"), *content = api_field(delta, "content"),
               *calls = api_field(delta, "tool_calls"), *fin = api_field(ch, "finish_reason");
        if (!rc && rs) rc = text_delta(r, d, out, 1, rs);
        if (!rc && content) rc = text_delta(r, d, out, 2, content);
        if (!rc && calls) rc = calls_delta(r, d, out, calls);
        if (!rc && fin) snprintf(d->finish, sizeof d->finish, "%s", json_string_value(fin));
    } else if (!rc && json_object_get(chunk, "usage") && json_is_object(json_object_get(chunk, "usage"))) {
        /* the last chunk: what is open closes, and the response is complete */
        if (!json_array_size(d->output) && !d->cur) rc = open_item(r, d, out, 2);
        rc = rc || close_item(r, d, out);
        int cut = !strcmp(d->finish, "length");
        json_t *o = rc ? NULL
                       : resp_object(a, r, cut ? "incomplete" : "completed", cut ? "max_output_tokens" : NULL,
                                     json_incref(d->output), usage_of(json_object_get(chunk, "usage")));
        keep(a, r->dx, o);
        rc = rc || !o || ev(d, out, cut ? "response.incomplete" : "response.completed", json_pack("{s:O}", "response", o));
        json_decref(o);
    }
    json_decref(chunk);
    return rc ? -1 : 0;
}

static int resp_stream_error(const api_ctx *a, const srv_req *r, void **ds, const char *msg, api_buf *out) {
    resp_ds *d = ds_get(ds);
    if (!d || start(a, r, d, out) || close_item(r, d, out)) return -1;
    json_t *o = resp_object(a, r, "failed", NULL, json_incref(d->output), NULL);
    if (o) json_object_set_new(o, "error", json_pack("{s:s, s:s}", "code", "server_error", "message", msg));
    if (ev(d, out, "error", json_pack("{s:s, s:s, s:n}", "code", "server_error", "message", msg, "param"))) {
        json_decref(o);
        return -1;
    }
    return ev(d, out, "response.failed", o ? json_pack("{s:o}", "response", o) : NULL);
}
