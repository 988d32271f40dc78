/* server/ollama: Ollama's API (ollama.h). /api/chat and /api/generate are
 * translated into a chat object (a raw generate into a completion) for the
 * core, with Ollama's option names and defaults, and their replies back:
 * whole ({message|response, done: true, counts, durations}) or as NDJSON
 * lines, one per text piece, tool calls whole in one line, the last with
 * done: true and the counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <nettle/sha2.h>

#include "dialect.h"
#include "load/gguf.h"
#include "ollama.h"

#define BAD(param, ...) api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define OOM() api_fail(e, 500, "server_error", NULL, NULL, "out of memory")
/* The Ollama version this API follows (clients check it; VS Code's needs >= 0.6.4). */
#define OLL_VERSION "0.12.6"

static char *oll_reply(const api_ctx *a, const srv_req *r, json_t *chat, size_t *len);
static int oll_stream_chunk(const api_ctx *a, const srv_req *r, void **ds, json_t *chunk, api_buf *out);
static int oll_stream_error(const api_ctx *a, const srv_req *r, void **ds, const char *msg, api_buf *out);
static const api_dialect oll_wire = {oll_reply, oll_stream_chunk, oll_stream_error};

/* What the reply needs of the request. */
typedef struct oll_dx {
    int generate;        /* /api/generate: "response", else "message" */
    double t0;           /* monotonic seconds at arrival */
} oll_dx;

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* RFC 3339 in UTC with microseconds, as Ollama writes created_at. */
static json_t *now_rfc3339(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char b[40], out[80];
    strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, sizeof out, "%.32s.%06dZ", b, (int)(ts.tv_nsec / 1000 % 1000000));
    return json_string(out);
}

char *oll_error_json(const api_err *e, size_t *len) {
    return api_dump(json_pack("{s:s}", "error", e->msg), len);
}

/* ---- requests ---------------------------------------------------------------- */

/* One Ollama message as a chat message: thinking is reasoning_content, tool
 * calls keep their object arguments, a tool result's tool_name its name. */
static json_t *chat_msg(json_t *m, size_t i, api_err *e) {
    char p[40];
    snprintf(p, sizeof p, "messages[%zu]", i);
    if (!json_is_object(m)) return BAD(p, "'%s' must be an object", p), NULL;
    json_t *imgs = api_field(m, "images");
    if (imgs && (!json_is_array(imgs) || json_array_size(imgs)))
        return BAD(p, "images are not supported: this model reads text only"), NULL;
    json_t *o = json_object();
    if (!o) return OOM(), NULL;
    static const char *const KEEP[][2] = {{"role", "role"}, {"content", "content"}, {"thinking", "reasoning_content"},
                                          {"tool_name", "name"}, {"tool_call_id", "tool_call_id"}};
    for (size_t k = 0; k < sizeof KEEP / sizeof *KEEP; k++) {
        json_t *v = api_field(m, KEEP[k][0]);
        if (v && !(json_is_string(v) && !json_string_length(v) && !strcmp(KEEP[k][0], "thinking")) &&
            json_object_set(o, KEEP[k][1], v)) {
            json_decref(o);
            return OOM(), NULL;
        }
    }
    json_t *tc = api_field(m, "tool_calls");
    if (tc && json_is_array(tc) && json_array_size(tc)) {
        json_t *calls = json_array();
        size_t j;
        json_t *c;
        json_array_foreach(tc, j, c) {
            json_t *fn = json_object_get(c, "function");
            json_t *nm = fn ? json_object_get(fn, "name") : NULL, *args = fn ? json_object_get(fn, "arguments") : NULL;
            if (!json_is_string(nm)) {
                json_decref(calls);
                json_decref(o);
                return BAD(p, "'%s.tool_calls' entries need function.name", p), NULL;
            }
            if (api_jpush(calls, json_pack("{s:s, s:{s:O, s:o}}", "type", "function", "function", "name", nm,
                                           "arguments", args ? json_incref(args) : json_object()))) {
                json_decref(calls);
                json_decref(o);
                return OOM(), NULL;
            }
        }
        if (json_object_set_new(o, "tool_calls", calls)) {
            json_decref(o);
            return OOM(), NULL;
        }
    }
    return o;
}

/* options -> the chat object's sampling fields (Ollama's defaults where not
 * given: temperature 0.8, top_k 40, top_p 0.9); repeat_penalty and
 * repeat_last_n, which chat requests have not, come back through *rp. */
static int options(json_t *root, json_t *chat, float *rp, int *rp_n, api_err *e) {
    json_t *op = api_field(root, "options");
    if (op && !json_is_object(op)) return BAD("options", "'options' must be an object");
    static const char *const SAME[] = {"temperature", "top_k", "top_p", "min_p", "seed", "stop",
                                       "presence_penalty", "frequency_penalty", NULL};
    for (int k = 0; SAME[k]; k++) {
        json_t *v = op ? api_field(op, SAME[k]) : NULL;
        if (v && json_object_set(chat, SAME[k], v)) return OOM();
    }
    if (!json_object_get(chat, "temperature") && api_jset(chat, "temperature", json_real(0.8))) return OOM();
    if (!json_object_get(chat, "top_k") && api_jset(chat, "top_k", json_integer(40))) return OOM();
    if (!json_object_get(chat, "top_p") && api_jset(chat, "top_p", json_real(0.9))) return OOM();
    json_t *np = op ? api_field(op, "num_predict") : NULL;
    if (np && !json_is_integer(np)) return BAD("options", "'options.num_predict' must be an integer");
    if (np && json_integer_value(np) > 0 && api_jset(chat, "max_tokens", json_integer(json_integer_value(np))))
        return OOM();
    long long x;
    int rc;
    *rp = 1.1f;
    *rp_n = 64;
    if (op && api_get_num(op, "repeat_penalty", 0, 10, 0, rp, e) < 0) return -1;
    if (op && (rc = api_get_int(op, "repeat_last_n", -1, 1 << 20, &x, e)) < 0) return -1;
    else if (op && rc) *rp_n = (int)x;
    return 0;
}

/* format: "json" (any JSON object) or a JSON schema. */
static int format(json_t *root, json_t *chat, api_err *e) {
    json_t *f = api_field(root, "format");
    if (!f || (json_is_string(f) && !json_string_length(f))) return 0;
    json_t *rf = NULL;
    if (json_is_string(f) && !strcmp(json_string_value(f), "json")) rf = json_pack("{s:s}", "type", "json_object");
    else if (json_is_object(f))
        rf = json_pack("{s:s, s:{s:s, s:O}}", "type", "json_schema", "json_schema", "name", "format", "schema", f);
    else return BAD("format", "'format' must be \"json\" or a JSON schema object");
    return api_jset(chat, "response_format", rf) ? OOM() : 0;
}

/* think: true, false or an effort (low, medium, high). */
static int think(json_t *root, json_t *chat, api_err *e) {
    json_t *t = api_field(root, "think");
    if (!t || json_is_true(t)) return 0;
    if (json_is_false(t)) return api_jset(chat, "max_thinking_tokens", json_integer(0)) ? OOM() : 0;
    const char *s = json_string_value(t);
    if (!s || (strcmp(s, "low") && strcmp(s, "medium") && strcmp(s, "high")))
        return BAD("think", "'think' must be true, false, low, medium or high");
    return api_jset(chat, "reasoning_effort", json_string(s)) ? OOM() : 0;
}

/* /api/chat's messages, or /api/generate's system and prompt, as chat
 * messages. */
static int messages(json_t *root, int generate, json_t *chat, api_err *e) {
    json_t *msgs = json_array();
    if (!msgs || json_object_set_new(chat, "messages", msgs)) return OOM();
    if (generate) {
        json_t *sys = api_field(root, "system"), *pr = api_field(root, "prompt");
        if (sys && !json_is_string(sys)) return BAD("system", "'system' must be a string");
        if (!json_is_string(pr)) return BAD("prompt", "'prompt' must be a string");
        if (sys && json_string_length(sys) &&
            api_jpush(msgs, json_pack("{s:s, s:O}", "role", "system", "content", sys)))
            return OOM();
        return api_jpush(msgs, json_pack("{s:s, s:O}", "role", "user", "content", pr)) ? OOM() : 0;
    }
    json_t *ms = api_field(root, "messages");
    if (!json_is_array(ms) || !json_array_size(ms)) return BAD("messages", "'messages' must be a non-empty array");
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        json_t *c = chat_msg(m, i, e);
        if (!c || json_array_append_new(msgs, c)) return c ? OOM() : -1;
    }
    return 0;
}

/* Fields Ollama has that change nothing here, or that this server cannot do. */
static int unsupported(json_t *root, int generate, api_err *e) {
    json_t *v = api_field(root, "images");
    if (v && (!json_is_array(v) || json_array_size(v))) return BAD("images", "images are not supported: this model reads text only");
    v = api_field(root, "suffix");
    if (v && !(json_is_string(v) && !json_string_length(v))) return BAD("suffix", "'suffix' is not supported");
    v = api_field(root, "template");
    if (v && !(json_is_string(v) && !json_string_length(v)))
        return BAD("template", "'template' is not supported: the model's own chat template is used");
    if (api_field(root, "logprobs") && json_is_true(api_field(root, "logprobs")))
        return BAD("logprobs", "'logprobs' is not supported on /api/*; use /v1/chat/completions");
    return 0;
}

static json_t *to_chat(json_t *root, int generate, int raw, float *rp, int *rp_n, api_err *e) {
    json_t *chat = json_object();
    if (!chat) return OOM(), NULL;
    json_t *st = api_field(root, "stream");
    if (st && !json_is_boolean(st)) {
        json_decref(chat);
        return BAD("stream", "'stream' must be true or false"), NULL;
    }
    int bad = api_jset(chat, "stream", json_boolean(!st || json_is_true(st))) ? OOM() : 0; /* Ollama streams by default */
    if (!bad && raw) bad = api_jset(chat, "prompt", json_incref(api_field(root, "prompt"))) ? OOM() : 0;
    if (!bad && !raw) bad = messages(root, generate, chat, e);
    if (!bad) bad = options(root, chat, rp, rp_n, e) || format(root, chat, e) || unsupported(root, generate, e);
    if (!bad && !raw) bad = think(root, chat, e);
    json_t *tools = api_field(root, "tools");
    if (!bad && tools && !generate && json_array_size(tools) && json_object_set(chat, "tools", tools)) bad = OOM();
    /* not Ollama's (its calls are always the model's choice): chat's tool_choice, passed on */
    json_t *tch = api_field(root, "tool_choice");
    if (!bad && tch && json_object_get(chat, "tools") && json_object_set(chat, "tool_choice", tch)) bad = OOM();
    if (bad) {
        json_decref(chat);
        return NULL;
    }
    return chat;
}

static void dx_free(void *p) { free(p); }

int oll_parse(const api_ctx *a, int generate, const char *body, size_t len, srv_req *r, int *empty, api_err *e) {
    memset(e, 0, sizeof *e);
    *empty = 0;
    json_t *root = api_load_body(body, len, e);
    if (!root) return -1;
    int rc = -1, raw = 0;
    json_t *chat = NULL;
    oll_dx *d = calloc(1, sizeof *d);
    if (!d) {
        OOM();
        goto out;
    }
    d->generate = generate;
    d->t0 = mono_s();
    r->dialect = SRV_DIALECT_OLLAMA;
    r->wire = &oll_wire;
    r->dx = d;
    r->dx_free = dx_free;
    if (generate) {
        json_t *pr = api_field(root, "prompt");
        if (pr && !json_is_string(pr)) {
            BAD("prompt", "'prompt' must be a string");
            goto out;
        }
        if (!pr || !json_string_length(pr)) { /* Ollama's way to load a model: nothing to run */
            *empty = 1;
            rc = 0;
            goto out;
        }
        if (api_get_bool(root, "raw", &raw, e) < 0) goto out;
    }
    float rp = 1.1f;
    int rp_n = 64;
    if (!(chat = to_chat(root, generate, raw, &rp, &rp_n, e))) goto out;
    if (raw) {
        char *s = api_dump(json_incref(chat), NULL);
        if (!s) {
            OOM();
            goto out;
        }
        rc = api_parse_request(a, SRV_COMPLETION, s, strlen(s), r, e);
        free(s);
    } else {
        rc = api_parse_chat_obj(a, chat, r, 0, e);
    }
    if (rc) goto out;
    r->dialect = SRV_DIALECT_OLLAMA; /* api_parse_request starts the request afresh */
    r->wire = &oll_wire;
    r->sp.repeat_penalty = rp;
    r->sp.penalty_last_n = rp_n;
out:
    json_decref(chat);
    json_decref(root);
    if (rc && !e->http) api_fail(e, 500, "server_error", NULL, NULL, "the request could not be read");
    return rc;
}

char *oll_load_json(const api_ctx *a, size_t *len) {
    return api_dump(json_pack("{s:o, s:o, s:s, s:b, s:s}", "model", api_jstr_bytes(a->model_id, strlen(a->model_id)),
                              "created_at", now_rfc3339(), "response", "", "done", 1, "done_reason", "load"),
                    len);
}

/* ---- replies ------------------------------------------------------------------ */

/* The head every reply line has: model and created_at. */
static json_t *head(const api_ctx *a) {
    return json_pack("{s:o, s:o}", "model", api_jstr_bytes(a->model_id, strlen(a->model_id)), "created_at",
                     now_rfc3339());
}

/* Chat's tool calls ({id, type, function{name, arguments: text}}) as
 * Ollama's ({function{name, arguments: object}}). */
static json_t *calls_of(json_t *tc) {
    json_t *out = json_array();
    size_t i;
    json_t *c;
    json_array_foreach(tc, i, c) {
        json_t *fn = json_object_get(c, "function");
        json_t *args = json_object_get(fn, "arguments");
        json_t *av = json_is_string(args) ? json_loads(json_string_value(args), 0, NULL) : json_incref(args);
        if (!json_is_object(av)) {
            json_decref(av);
            av = json_object();
        }
        if (api_jpush(out, json_pack("{s:{s:i, s:O, s:o}}", "function", "index", (int)i, "name",
                                     json_object_get(fn, "name"), "arguments", av))) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

static const char *done_reason(const char *finish) {
    return finish && !strcmp(finish, "length") ? "length" : "stop";
}

/* done: true with the counts and durations (nanoseconds). */
static int finish_fields(json_t *o, const srv_req *r, const char *finish) {
    const oll_dx *d = r->dx;
    const double now = mono_s(), t0 = d ? d->t0 : now;
    const double tf = r->t_first > t0 ? r->t_first : now;
    const int pt = r->prompt_tokens ? r->prompt_tokens : r->n_prompt;
    return api_jset(o, "done", json_true()) || api_jset(o, "done_reason", json_string(done_reason(finish))) ||
           api_jset(o, "total_duration", json_integer((json_int_t)((now - t0) * 1e9))) ||
           api_jset(o, "load_duration", json_integer(0)) || api_jset(o, "prompt_eval_count", json_integer(pt)) ||
           api_jset(o, "prompt_eval_duration", json_integer((json_int_t)((tf - t0) * 1e9))) ||
           api_jset(o, "eval_count", json_integer(r->completion_tokens)) ||
           api_jset(o, "eval_duration", json_integer((json_int_t)((now - tf) * 1e9)));
}

/* The message (chat) or response (generate) fields of a reply line. */
static int body_fields(json_t *o, const oll_dx *d, json_t *content, json_t *thinking, json_t *calls) {
    if (d->generate) {
        if (api_jset(o, "response", content ? json_incref(content) : json_string(""))) return -1;
        return thinking && api_jset(o, "thinking", json_incref(thinking));
    }
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", content ? json_incref(content) : json_string(""));
    if (!m || (thinking && api_jset(m, "thinking", json_incref(thinking))) ||
        (calls && api_jset(m, "tool_calls", json_incref(calls)))) {
        json_decref(m);
        return -1;
    }
    return api_jset(o, "message", m);
}

static char *oll_reply(const api_ctx *a, const srv_req *r, json_t *chat, size_t *len) {
    const oll_dx *d = r->dx;
    json_t *c = json_array_get(json_object_get(chat, "choices"), 0);
    json_t *msg = json_object_get(c, "message");
    json_t *content = msg ? json_object_get(msg, "content") : json_object_get(c, "text");
    json_t *thinking = msg ? json_object_get(msg, "reasoning_content") : NULL;
    json_t *tc = msg ? json_object_get(msg, "tool_calls") : NULL;
    json_t *calls = json_array_size(tc) ? calls_of(tc) : NULL;
    json_t *o = head(a);
    const char *finish = json_string_value(json_object_get(c, "finish_reason"));
    int bad = !o || (json_array_size(tc) && !calls) ||
              body_fields(o, d, json_is_string(content) ? content : NULL,
                          json_string_length(thinking) ? thinking : NULL, calls) ||
              finish_fields(o, r, finish);
    json_decref(calls);
    json_decref(chat);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return api_dump(o, len);
}

/* ---- streams ------------------------------------------------------------------ */

typedef struct oll_ds {
    dialect_stream base;
    json_t *calls;       /* chat's tool-call deltas gathered: [{function{name, arguments text}}] */
    char finish[16];
} oll_ds;

static void ds_free(dialect_stream *p) {
    oll_ds *d = (oll_ds *)p;
    json_decref(d->calls);
    free(d);
}

static oll_ds *ds_get(void **ds) {
    if (!*ds) {
        oll_ds *d = calloc(1, sizeof *d);
        if (!d || !(d->calls = json_array())) {
            free(d);
            return NULL;
        }
        d->base.free = ds_free;
        *ds = d;
    }
    return *ds;
}

/* One NDJSON line (o taken). */
static int line(api_buf *out, json_t *o) {
    char *s = api_dump(o, NULL);
    if (!s) return -1;
    int rc = api_buf_add(out, s, strlen(s)) || api_buf_add(out, "\n", 1);
    free(s);
    return rc ? -1 : 0;
}

/* Adds one tool-call delta (index, id, function{name, arguments piece}). */
static int gather_call(oll_ds *d, json_t *tc) {
    json_t *fn = json_object_get(tc, "function");
    size_t idx = json_is_integer(json_object_get(tc, "index")) ? (size_t)json_integer_value(json_object_get(tc, "index"))
                                                                 : json_array_size(d->calls);
    while (json_array_size(d->calls) <= idx)
        if (api_jpush(d->calls, json_pack("{s:{s:s, s:s}}", "function", "name", "", "arguments", ""))) return -1;
    json_t *have = json_object_get(json_array_get(d->calls, idx), "function");
    json_t *nm = json_object_get(fn, "name"), *ar = json_object_get(fn, "arguments");
    if (json_is_string(nm) && json_string_length(nm) && json_object_set(have, "name", nm)) return -1;
    if (json_is_string(ar)) {
        const char *old = json_string_value(json_object_get(have, "arguments"));
        size_t n0 = strlen(old), n1 = json_string_length(ar);
        char *cat = malloc(n0 + n1 + 1);
        if (!cat) return -1;
        memcpy(cat, old, n0);
        memcpy(cat + n0, json_string_value(ar), n1);
        cat[n0 + n1] = 0;
        int rc = api_jset(have, "arguments", json_stringn(cat, n0 + n1));
        free(cat);
        if (rc) return -1;
    }
    return 0;
}

static int oll_stream_chunk(const api_ctx *a, const srv_req *r, void **ds, json_t *chunk, api_buf *out) {
    const oll_dx *dx = r->dx;
    oll_ds *d = ds_get(ds);
    json_t *choices = json_object_get(chunk, "choices");
    int rc = -1;
    if (!d) goto done;
    if (!json_array_size(choices)) { /* the usage chunk: the last line */
        json_t *o = head(a);
        if (!o || body_fields(o, dx, NULL, NULL, NULL) || finish_fields(o, r, d->finish)) {
            json_decref(o);
            goto done;
        }
        rc = line(out, o);
        goto done;
    }
    json_t *c = json_array_get(choices, 0);
    json_t *delta = json_object_get(c, "delta");
    json_t *content = delta ? json_object_get(delta, "content") : json_object_get(c, "text");
    json_t *thinking = delta ? json_object_get(delta, "reasoning_content") : NULL;
    json_t *tc = delta ? json_object_get(delta, "tool_calls") : NULL;
    size_t i;
    json_t *t;
    json_array_foreach(tc, i, t) if (gather_call(d, t)) goto done;
    const int has_text = json_string_length(content) > 0, has_think = json_string_length(thinking) > 0;
    if (has_text || has_think) {
        json_t *o = head(a);
        if (!o || body_fields(o, dx, has_text ? content : NULL, has_think ? thinking : NULL, NULL) ||
            api_jset(o, "done", json_false())) {
            json_decref(o);
            goto done;
        }
        if (line(out, o)) goto done;
    }
    const char *fin = json_string_value(json_object_get(c, "finish_reason"));
    if (fin) {
        snprintf(d->finish, sizeof d->finish, "%s", fin);
        if (json_array_size(d->calls)) { /* Ollama sends the calls whole, in one line */
            json_t *calls = calls_of(d->calls), *o = head(a);
            if (!calls || !o || body_fields(o, dx, NULL, NULL, calls) || api_jset(o, "done", json_false())) {
                json_decref(calls);
                json_decref(o);
                goto done;
            }
            json_decref(calls);
            if (line(out, o)) goto done;
        }
    }
    rc = 0;
done:
    json_decref(chunk);
    return rc;
}

static int oll_stream_error(const api_ctx *a, const srv_req *r, void **ds, const char *msg, api_buf *out) {
    return line(out, json_pack("{s:s}", "error", msg));
}

/* ---- the model ------------------------------------------------------------------ */

/* llama.cpp's file types (general.file_type), as Ollama names the quantization. */
static const char *ftype_name(int64_t t) {
    static const char *const N[] = {"F32",     "F16",    "Q4_0",   "Q4_1",   NULL,     NULL,     NULL,    "Q8_0",
                                    "Q5_0",    "Q5_1",   "Q2_K",   "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
                                    "Q5_K_S",  "Q5_K_M", "Q6_K",   "IQ2_XXS", "IQ2_XS", "Q2_K_S", "IQ3_XS", "IQ3_XXS",
                                    "IQ1_S",   "IQ4_NL", "IQ3_S",  "IQ3_M",  "IQ2_S",  "IQ2_M",  "IQ4_XS", "IQ1_M",
                                    "BF16",    NULL,     NULL,     NULL,     "TQ1_0",  "TQ2_0",  "MXFP4"};
    return t >= 0 && t < (int64_t)(sizeof N / sizeof *N) && N[t] ? N[t] : "unknown";
}

/* What Ollama says of a model, from the file's header. */
typedef struct model_facts {
    char family[64], psize[32], quant[16], digest[65], modified[40];
    uint64_t size, n_params;
    const char *arch_tmpl;
} model_facts;

static void tl_str_copy(char *dst, size_t cap, tl_str s) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = 0;
}

static void facts(const api_ctx *a, model_facts *f, tl_gguf **keep) {
    memset(f, 0, sizeof *f);
    snprintf(f->family, sizeof f->family, "unknown");
    snprintf(f->quant, sizeof f->quant, "unknown");
    struct stat st;
    const char *path = a->model_path ? a->model_path : "";
    if (stat(path, &st) == 0) f->size = (uint64_t)st.st_size;
    time_t mt = stat(path, &st) == 0 ? st.st_mtime : 0;
    struct tm tm;
    gmtime_r(&mt, &tm);
    strftime(f->modified, sizeof f->modified, "%Y-%m-%dT%H:%M:%SZ", &tm);
    /* not the file's sha256 (that would read every byte of a large file):
     * one of its name, size and modification time, which change with it */
    struct sha256_ctx h;
    sha256_init(&h);
    sha256_update(&h, strlen(a->model_id), (const uint8_t *)a->model_id);
    sha256_update(&h, sizeof f->size, (const uint8_t *)&f->size);
    sha256_update(&h, sizeof mt, (const uint8_t *)&mt);
    uint8_t dg[SHA256_DIGEST_SIZE];
    sha256_digest(&h, sizeof dg, dg);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++) snprintf(f->digest + 2 * i, 3, "%02x", dg[i]);
    tl_gguf *g = NULL;
    tl_error err = {0};
    if (tl_gguf_open(path, &g, &err) != 0) return;
    tl_str s;
    int64_t ft;
    if (tl_gguf_get_str(g, "general.architecture", &s) == 1) tl_str_copy(f->family, sizeof f->family, s);
    if (tl_gguf_get_int(g, "general.file_type", &ft) == 1) snprintf(f->quant, sizeof f->quant, "%s", ftype_name(ft));
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        uint64_t n = 1;
        for (uint32_t k = 0; k < g->tensors[i].n_dims; k++) n *= (uint64_t)g->tensors[i].ne[k];
        f->n_params += n;
    }
    const double p = (double)f->n_params;
    if (p >= 1e9) snprintf(f->psize, sizeof f->psize, "%.1fB", p / 1e9);
    else if (p >= 1e6) snprintf(f->psize, sizeof f->psize, "%.0fM", p / 1e6);
    else snprintf(f->psize, sizeof f->psize, "%.0fK", p / 1e3);
    if (keep) *keep = g;
    else tl_gguf_close(g);
}

static json_t *details(const model_facts *f) {
    return json_pack("{s:s, s:s, s:s, s:[s], s:s, s:s}", "parent_model", "", "format", "gguf", "family", f->family,
                     "families", f->family, "parameter_size", f->psize, "quantization_level", f->quant);
}

char *oll_version_json(size_t *len) { return api_dump(json_pack("{s:s}", "version", OLL_VERSION), len); }

char *oll_tags_json(const api_ctx *a, int ps, size_t *len) {
    model_facts f;
    facts(a, &f, NULL);
    json_t *m = json_pack("{s:o, s:o, s:I, s:s, s:o}", "name", api_jstr_bytes(a->model_id, strlen(a->model_id)),
                          "model", api_jstr_bytes(a->model_id, strlen(a->model_id)), "size", (json_int_t)f.size,
                          "digest", f.digest, "details", details(&f));
    if (m && !ps && api_jset(m, "modified_at", json_string(f.modified))) m = (json_decref(m), NULL);
    if (m && ps) {
        /* loaded for as long as the server runs: an expiry far ahead */
        if (api_jset(m, "expires_at", json_string("2318-01-01T00:00:00Z")) ||
            api_jset(m, "size_vram", json_integer(0)) || api_jset(m, "context_length", json_integer(a->n_ctx)))
            m = (json_decref(m), NULL);
    }
    return m ? api_dump(json_pack("{s:[o]}", "models", m), len) : NULL;
}

/* The GGUF's metadata as Ollama's model_info: scalars and short arrays (the
 * vocabulary's are left out, as Ollama leaves them out unless verbose). */
static json_t *model_info(const tl_gguf *g, const model_facts *f) {
    json_t *o = json_object();
    for (uint64_t i = 0; o && g && i < g->n_kv; i++) {
        const tl_gguf_kv *kv = &g->kv[i];
        char key[160];
        tl_str_copy(key, sizeof key, kv->key);
        json_t *v = NULL;
        int64_t iv;
        double dv;
        int bv;
        tl_str sv;
        if (!strncmp(key, "tokenizer.", 10) || kv->type == GGUF_TYPE_ARRAY) continue;
        if (tl_gguf_get_int(g, key, &iv) == 1) v = json_integer(iv);
        else if (tl_gguf_get_float(g, key, &dv) == 1) v = json_real(dv);
        else if (tl_gguf_get_bool(g, key, &bv) == 1) v = json_boolean(bv);
        else if (tl_gguf_get_str(g, key, &sv) == 1) v = api_jstr_bytes(sv.ptr, (size_t)sv.len);
        if (v && json_object_set_new(o, key, v)) {
            json_decref(o);
            return NULL;
        }
    }
    if (o && api_jset(o, "general.parameter_count", json_integer((json_int_t)f->n_params))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *oll_show_json(const api_ctx *a, const char *body, size_t blen, size_t *len, api_err *e) {
    memset(e, 0, sizeof *e);
    json_t *root = api_load_body(body, blen, e);
    if (!root) return NULL;
    json_decref(root); /* the one model, whatever name is asked */
    model_facts f;
    tl_gguf *g = NULL;
    facts(a, &f, &g);
    const char *tm = tl_model_chat_template(a->m);
    json_t *caps = json_array();
    if (caps && tm) {
        api_jpush(caps, json_string("completion"));
        api_jpush(caps, json_string("tools"));
        if (a->reasoning) api_jpush(caps, json_string("thinking"));
    } else if (caps) {
        api_jpush(caps, json_string("completion"));
    }
    if (caps) api_jpush(caps, json_string("embedding"));
    char params[64];
    snprintf(params, sizeof params, "num_ctx %d", a->n_ctx);
    char mf[256];
    snprintf(mf, sizeof mf, "# served by tokenloop\nFROM %s\n", a->model_path ? a->model_path : a->model_id);
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:s}", "license", "", "modelfile", mf, "parameters",
                          params, "template", tm ? tm : "", "details", details(&f), "model_info", model_info(g, &f),
                          "capabilities", caps, "modified_at", f.modified);
    tl_gguf_close(g);
    char *s = o ? api_dump(o, len) : NULL;
    if (!s) OOM();
    return s;
}
