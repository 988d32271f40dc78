/* server/reply: the JSON of a finished reply and of a stream's chunks, from
 * the request's events: chat and text completions, logprobs in the chat and
 * legacy shapes, usage, reasoning apart from content (by the engine's flag),
 * tool calls; a dialect's reply goes through its table (api_dialect). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include <jansson.h>

#include "api.h"
#include "chat/chat.h"
#include "tools.h"

#define LP_FLOOR -9999.0 /* stands for log(0): JSON has no -Infinity */

/* JSON has no -Infinity: log(0) is written as LP_FLOOR. */
static json_t *jlogprob(float lp) {
    return json_real(isfinite(lp) ? (double)lp : LP_FLOOR);
}

/* The text a token stands for (control tokens by name). */
static size_t piece(const api_ctx *a, int32_t tok, char *buf, size_t cap) {
    size_t n = tl_token_piece(a->m, tok, 1, buf, cap);
    return n < cap ? n : cap;
}

/* Chat shape: {token, logprob, bytes}. */
static json_t *chat_lp_one(const api_ctx *a, const tl_token_prob *p) {
    char b[256];
    size_t n = piece(a, p->token, b, sizeof b);
    json_t *o = json_object(), *bytes = json_array();
    int bad = !o || !bytes;
    for (size_t i = 0; !bad && i < n; i++) bad = api_jpush(bytes, json_integer((unsigned char)b[i]));
    if (bad || api_jset(o, "token", api_jstr_bytes(b, n)) || api_jset(o, "logprob", jlogprob(p->logprob)) ||
        json_object_set_new(o, "bytes", bytes)) {
        json_decref(o);
        json_decref(bytes);
        return NULL;
    }
    return o;
}

static json_t *chat_lp_entry(const api_ctx *a, const srv_req *r, const srv_event *ev) {
    json_t *o = chat_lp_one(a, &ev->chosen), *tops = json_array();
    int n = ev->n_top < r->top_logprobs ? ev->n_top : r->top_logprobs;
    int bad = !o || !tops;
    for (int i = 0; !bad && i < n; i++) bad = api_jpush(tops, chat_lp_one(a, &ev->top[i]));
    if (bad || json_object_set_new(o, "top_logprobs", tops)) {
        json_decref(o);
        json_decref(tops);
        return NULL;
    }
    return o;
}

/* Legacy dict key: the token's text, or "bytes:\xNN..." when it is not valid UTF-8. */
static void legacy_key(const api_ctx *a, int32_t tok, char *out, size_t cap) {
    char b[256];
    size_t n = piece(a, tok, b, sizeof b);
    if (api_utf8_valid(b, n)) {
        snprintf(out, cap, "%.*s", (int)n, b);
        return;
    }
    size_t k = (size_t)snprintf(out, cap, "bytes:");
    for (size_t i = 0; i < n && k + 5 < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "\\x%02x", (unsigned char)b[i]);
}

/* Legacy logprobs columns, appended to in event order. */
typedef struct legacy_lp {
    json_t *tokens, *token_logprobs, *top_logprobs, *text_offset;
    size_t offset; /* code points so far */
} legacy_lp;

static int legacy_add(const api_ctx *a, const srv_req *r, legacy_lp *l, const srv_event *ev) {
    char b[256], key[1100];
    size_t n = piece(a, ev->token, b, sizeof b);
    int has = ev->kind == SRV_EV_TOKEN || ev->has_logprob;
    json_t *top = has ? json_object() : json_null();
    if (!top) return -1;
    int nt = ev->n_top < r->top_logprobs ? ev->n_top : r->top_logprobs;
    for (int i = 0; has && i < nt; i++) {
        legacy_key(a, ev->top[i].token, key, sizeof key);
        if (api_jset(top, key, jlogprob(ev->top[i].logprob))) goto fail;
    }
    if (has) {
        legacy_key(a, ev->chosen.token, key, sizeof key);
        if (!json_object_get(top, key) && api_jset(top, key, jlogprob(ev->chosen.logprob))) goto fail;
    }
    if (api_jpush(l->tokens, api_jstr_bytes(b, n)) ||
        api_jpush(l->token_logprobs, has ? jlogprob(ev->chosen.logprob) : json_null()) ||
        json_array_append_new(l->top_logprobs, top) ||
        api_jpush(l->text_offset, json_integer((json_int_t)l->offset)))
        return -1;
    l->offset += api_utf8_count(b, n);
    return 0;
fail:
    json_decref(top);
    return -1;
}

static int legacy_init(legacy_lp *l, size_t offset) {
    l->tokens = json_array();
    l->token_logprobs = json_array();
    l->top_logprobs = json_array();
    l->text_offset = json_array();
    l->offset = offset;
    return l->tokens && l->token_logprobs && l->top_logprobs && l->text_offset ? 0 : -1;
}

/* Takes the columns into one object (NULL on failure, columns freed either way). */
static json_t *legacy_obj(legacy_lp *l) {
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "tokens", l->tokens) ||
        json_object_set_new(o, "token_logprobs", l->token_logprobs) ||
        json_object_set_new(o, "top_logprobs", l->top_logprobs) ||
        json_object_set_new(o, "text_offset", l->text_offset)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static void legacy_drop(legacy_lp *l) {
    json_decref(l->tokens);
    json_decref(l->token_logprobs);
    json_decref(l->top_logprobs);
    json_decref(l->text_offset);
}

/* The prompt as text for echo (an added BOS is not part of what was sent). */
static int echo_text(const api_ctx *a, const srv_req *r, api_buf *b) {
    tl_detok d;
    tl_detok_init(&d, 1);
    char tmp[1024];
    int i0 = r->n_prompt && tl_model_add_bos(a->m) && r->prompt[0] == tl_token_bos(a->m);
    if (api_buf_add(b, "", 0)) return -1;
    for (int i = i0; i < r->n_prompt; i++) {
        size_t n = tl_detok_push(&d, a->m, r->prompt[i], tmp, sizeof tmp);
        if (n >= sizeof tmp) n = sizeof tmp - 1;
        if (api_buf_add(b, tmp, n)) return -1;
    }
    size_t n = tl_detok_flush(&d, tmp, sizeof tmp);
    return api_buf_add(b, tmp, n < sizeof tmp ? n : sizeof tmp - 1);
}

/* OpenAI's usage, plus "speculative": {drafted, accepted} (a field of our
 * own beside theirs: clients that do not know it ignore it). */
static json_t *usage_json(const srv_req *r) {
    int pt = r->prompt_tokens ? r->prompt_tokens : r->n_prompt;
    json_t *u = json_object(), *d = json_object(), *sp = json_object();
    if (!u || !d || !sp || api_jset(u, "prompt_tokens", json_integer(pt)) ||
        api_jset(u, "completion_tokens", json_integer(r->completion_tokens)) ||
        api_jset(u, "total_tokens", json_integer(pt + r->completion_tokens)) ||
        api_jset(d, "cached_tokens", json_integer(r->cached_tokens)) ||
        api_jset(sp, "drafted", json_integer(r->spec_drafted)) ||
        api_jset(sp, "accepted", json_integer(r->spec_accepted))) {
        json_decref(u);
        json_decref(d);
        json_decref(sp);
        return NULL;
    }
    if (json_object_set_new(u, "prompt_tokens_details", d)) { /* d is taken either way */
        json_decref(sp);
        json_decref(u);
        return NULL;
    }
    if (json_object_set_new(u, "speculative", sp)) {
        json_decref(u);
        return NULL;
    }
    if ((r->think || r->harmony) && json_object_set_new(u, "completion_tokens_details",
                                        json_pack("{s:i}", "reasoning_tokens", r->reasoning_tokens))) {
        json_decref(u);
        return NULL;
    }
    return u;
}

/* {id, object, created, model} */
static json_t *reply_head(const api_ctx *a, const srv_req *r, const char *object) {
    json_t *o = json_object();
    if (!o || api_jset(o, "id", json_string(r->id)) || api_jset(o, "object", json_string(object)) ||
        api_jset(o, "created", json_integer(r->created)) ||
        api_jset(o, "model", api_jstr_bytes(a->model_id, strlen(a->model_id)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int skip_lp(const api_ctx *a, const srv_event *ev) {
    return ev->kind == SRV_EV_TOKEN && tl_token_is_eog(a->m, ev->token);
}

/* ---- harmony (gpt-oss): the reply's channels, by the chat core's parser ---- */

typedef struct hm_whole {
    const srv_req *r;
    api_buf think, content;
    json_t *calls; /* NULL until one comes */
} hm_whole;

static int hm_whole_piece(void *user, int kind, const char *name, const char *text, size_t n) {
    hm_whole *w = user;
    if (kind == TL_HARMONY_REASONING) return api_buf_add(&w->think, text, n) ? -1 : 0;
    if (kind == TL_HARMONY_CONTENT) return api_buf_add(&w->content, text, n) ? -1 : 0;
    if (!w->r->tool_mode) return 0; /* calls nobody offered: not shown */
    if (!w->calls && !(w->calls = json_array())) return -1;
    const int k = (int)json_array_size(w->calls);
    return api_jpush(w->calls, tools_harmony_call(name, text, n, k, -1, w->r->id)) ? -1 : 0;
}

/* A whole reply's text split: *reasoning (NULL if none), content, *calls (NULL if none). */
static int harmony_whole(const srv_req *r, const char *s, size_t n, api_buf *content, json_t **reasoning,
                         json_t **calls) {
    hm_whole w = {r, {0}, {0}, NULL};
    tl_harmony *h = NULL;
    tl_error err = {0};
    int rc = tl_harmony_new(&h, &err) || tl_harmony_feed(h, s, n, 1, hm_whole_piece, &w) ||
             api_buf_add(&w.content, "", 0);
    tl_harmony_free(h);
    *reasoning = !rc && w.think.n ? api_jstr_bytes(w.think.p, w.think.n) : NULL;
    *calls = w.calls;
    *content = w.content;
    api_buf_free(&w.think);
    if (rc) {
        json_decref(*calls);
        json_decref(*reasoning);
        *calls = *reasoning = NULL;
    }
    return rc ? -1 : 0;
}

/* The request's reasoning markers (its template's), and how many blanks
 * after the open marker at t[0..n) belong to it: those that end Gemma 4's
 * channel header ("<|channel>thought\n"), whose marker names its channel
 * rather than ending in '>'. */
static void think_markers(const srv_req *r, const char **open, const char **close) {
    tl_chat_think_markers(NULL, open, close);
    if (r->think_open && r->think_close) *open = r->think_open, *close = r->think_close;
}
static size_t header_blanks(const char *open, const char *t, size_t n) {
    size_t k = 0;
    if (open[strlen(open) - 1] != '>')
        while (k < n && (t[k] == '\n' || t[k] == ' ')) k++;
    return k;
}

/* Collects text, finish reason and logprobs over all events. */
static json_t *reply_choice(const api_ctx *a, const srv_req *r) {
    api_buf text = {0}, think = {0};
    int in_think = 0, saw_think = 0; /* the last token was reasoning; any was */
    const char *open, *close;
    think_markers(r, &open, &close);
    const size_t ol = strlen(open), cl = strlen(close);
    json_t *chat_lp = r->kind == SRV_CHAT && r->logprobs ? json_array() : NULL;
    legacy_lp l = {0};
    int legacy = r->kind == SRV_COMPLETION && r->logprobs, bad = 0;
    const char *finish = "stop";
    if (r->echo && echo_text(a, r, &text)) bad = 1;
    if (legacy && legacy_init(&l, 0)) bad = 1;
    if (r->kind == SRV_CHAT && r->logprobs && !chat_lp) bad = 1;
    for (int i = 0; !bad && i < r->n_ev; i++) {
        const srv_event *ev = &r->ev[i];
        /* the loop says which tokens are reasoning; the text held back at
         * the end belongs with the last token */
        if (ev->kind == SRV_EV_TOKEN) in_think = r->kind == SRV_CHAT && r->think && ev->reasoning;
        if (in_think && !saw_think) {
            /* the loop knows it reasons once the open marker is whole: text
             * before, blanks and the marker's first pieces, goes with it */
            saw_think = 1;
            size_t k = 0;
            while (k < text.n && (text.p[k] == ' ' || text.p[k] == '\n')) k++;
            if (text.n - k <= ol && !memcmp(text.p ? text.p + k : "", open, text.n - k)) {
                bad = text.n && api_buf_add(&think, text.p, text.n);
                text.n = 0;
            }
        }
        if (ev->kind == SRV_EV_TOKEN || ev->kind == SRV_EV_DONE)
            bad = ev->text_len && api_buf_add(in_think ? &think : &text, ev->text, ev->text_len);
        if (ev->kind == SRV_EV_DONE && ev->finish_reason) finish = ev->finish_reason;
        if (bad || skip_lp(a, ev) || (ev->kind != SRV_EV_TOKEN && ev->kind != SRV_EV_PROMPT)) continue;
        if (chat_lp && ev->kind == SRV_EV_TOKEN) bad = api_jpush(chat_lp, chat_lp_entry(a, r, ev));
        if (legacy) bad = legacy_add(a, r, &l, ev);
    }
    json_t *c = json_object(), *lp = NULL;
    if (!bad && chat_lp) {
        lp = json_object();
        if (!lp || json_object_set(lp, "content", chat_lp) || api_jset(lp, "refusal", json_null())) bad = 1;
    } else if (!bad && legacy) {
        lp = legacy_obj(&l);
        legacy = 0;
        bad = !lp;
    }
    json_decref(chat_lp);
    if (legacy) legacy_drop(&l);
    /* reasoning: the reasoning tokens' text without its markers (the open
     * one only if the reply wrote it); the content, without leading blanks */
    const char *body = text.p ? text.p : "";
    size_t blen = text.n;
    json_t *reasoning = NULL, *calls = NULL;
    api_buf joined = {0};
    const int harmony = r->kind == SRV_CHAT && r->harmony;
    if (!bad && harmony) {
        bad = harmony_whole(r, body, blen, &joined, &reasoning, &calls);
        body = joined.p ? joined.p : "";
        blen = joined.n;
    }
    if (!bad && r->kind == SRV_CHAT && r->think && (saw_think || r->think_started)) {
        const char *rs = think.p ? think.p : "";
        size_t rn = think.n, k = 0;
        while (k < rn && (rs[k] == ' ' || rs[k] == '\n')) k++;
        if (!r->think_started && rn - k >= ol && !memcmp(rs + k, open, ol)) rs += k + ol, rn -= k + ol;
        k = header_blanks(open, rs, rn);
        rs += k, rn -= k;
        const char *end = rn ? memmem(rs, rn, close, cl) : NULL;
        reasoning = api_jstr_bytes(rs, end ? (size_t)(end - rs) : rn);
        const size_t after = end ? (size_t)(rs + rn - end) - cl : 0; /* the close token's own text after it */
        if (after) {
            bad |= api_buf_add(&joined, end + cl, after) || (blen && api_buf_add(&joined, body, blen));
            body = joined.p ? joined.p : "";
            blen = joined.n;
        }
        while (blen && (*body == '\n' || *body == ' ')) body++, blen--;
    }
    /* tool calls: the content before them, the calls parsed out */
    size_t clen = blen;
    if (!bad && !harmony && r->kind == SRV_CHAT && r->tool_mode)
        calls = tools_split(r->tool_fmt, body, blen, r->id, r->tool_strs, &clen);
    if (calls) finish = "tool_calls";
    json_t *txt = bad ? NULL : calls && !clen ? json_null() : api_jstr_bytes(body, clen);
    api_buf_free(&text);
    api_buf_free(&think);
    api_buf_free(&joined);
    if (r->kind == SRV_CHAT) {
        json_t *m = json_object();
        if (!m || api_jset(m, "role", json_string("assistant")) || json_object_set_new(m, "content", txt) ||
            (reasoning && json_object_set(m, "reasoning_content", reasoning)) ||
            (calls && json_object_set(m, "tool_calls", calls))) {
            json_decref(m);
            m = NULL;
        }
        json_decref(calls);
        json_decref(reasoning);
        reasoning = NULL;
        txt = NULL;
        bad |= !c || api_jset(c, "index", json_integer(0)) || api_jset(c, "message", m);
    } else {
        bad |= !c || api_jset(c, "index", json_integer(0)) || api_jset(c, "text", txt);
        txt = NULL;
    }
    json_decref(txt);
    json_decref(reasoning);
    if (bad || api_jset(c, "logprobs", lp ? lp : json_null()) ||
        api_jset(c, "finish_reason", json_string(finish))) {
        json_decref(c);
        return NULL;
    }
    return c;
}

json_t *api_reply_obj(const api_ctx *a, const srv_req *r) {
    json_t *o = reply_head(a, r, r->kind == SRV_CHAT ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    if (!o || !choices || api_jpush(choices, reply_choice(a, r)) ||
        json_object_set_new(o, "choices", choices) || api_jset(o, "usage", usage_json(r))) {
        json_decref(o);
        if (!o) json_decref(choices);
        return NULL;
    }
    return o;
}

char *api_reply_json(const api_ctx *a, const srv_req *r, size_t *len) {
    json_t *o = api_reply_obj(a, r);
    if (!o) return NULL;
    if (r->wire) return r->wire->reply(a, r, o, len);
    return api_dump(o, len);
}

void api_stream_free(api_stream *st) {
    api_buf_free(&st->tools.hold);
    api_buf_free(&st->think_hold);
    if (st->ds) ((dialect_stream *)st->ds)->free(st->ds);
    st->ds = NULL;
    tl_harmony_free(st->harmony);
    st->harmony = NULL;
}

/* ---- streams ----------------------------------------------------------------- */

/* One chunk (taken) out: as an SSE data line, or through the request's
 * dialect, which turns chat chunks into its own events. */
static int frame(const api_ctx *a, const srv_req *r, api_stream *st, api_buf *out, json_t *j) {
    if (r->wire) return r->wire->stream_chunk(a, r, &st->ds, j, out);
    char *s = api_dump(j, NULL);
    if (!s) return -1;
    int rc = api_buf_add(out, "data: ", 6) || api_buf_add(out, s, strlen(s)) ||
             api_buf_add(out, "\n\n", 2);
    free(s);
    return rc ? -1 : 0;
}

/* One chunk with a single choice; text/role/lp/finish may be NULL (lp taken). */
static int chunk(const api_ctx *a, const srv_req *r, api_stream *st, api_buf *out, const char *role,
                 const char *text, size_t tlen, json_t *lp, const char *finish) {
    int chat = r->kind == SRV_CHAT;
    json_t *o = reply_head(a, r, chat ? "chat.completion.chunk" : "text_completion");
    json_t *c = json_object(), *choices = json_array(), *delta = chat ? json_object() : NULL;
    int bad = !o || !c || !choices || (chat && !delta);
    if (!bad && chat) {
        if (role) bad |= api_jset(delta, "role", json_string(role));
        if (text) bad |= api_jset(delta, "content", api_jstr_bytes(text, tlen));
        bad |= json_object_set_new(c, "delta", delta);
        delta = NULL;
    } else if (!bad) {
        bad |= api_jset(c, "text", api_jstr_bytes(text ? text : "", text ? tlen : 0));
    }
    bad = bad || api_jset(c, "index", json_integer(0)) || api_jset(c, "logprobs", lp ? lp : json_null());
    lp = NULL;
    bad = bad || api_jset(c, "finish_reason", finish ? json_string(finish) : json_null()) ||
          json_array_append(choices, c) || json_object_set(o, "choices", choices) ||
          (r->include_usage && api_jset(o, "usage", json_null()));
    json_decref(lp);
    json_decref(delta);
    json_decref(c);
    json_decref(choices);
    if (bad) {
        json_decref(o);
        return -1;
    }
    return frame(a, r, st, out, o);
}

static int usage_chunk(const api_ctx *a, const srv_req *r, api_stream *st, api_buf *out) {
    json_t *o = reply_head(a, r, r->kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    if (!o || api_jset(o, "choices", json_array()) || api_jset(o, "usage", usage_json(r))) {
        json_decref(o);
        return -1;
    }
    return frame(a, r, st, out, o);
}

static int stream_error(const srv_event *ev, api_buf *out) {
    api_err e;
    const char *m = ev->text && ev->text[0] ? ev->text : "the request failed";
    api_fail(&e, 503, "server_error", NULL, NULL, "%s", m);
    size_t n;
    char *s = api_error_json(&e, &n);
    if (!s) return -1;
    int rc = api_buf_add(out, "data: ", 6) || api_buf_add(out, s, n) || api_buf_add(out, "\n\n", 2);
    free(s);
    return rc ? -1 : 0;
}

/* The logprobs of one event in the shape of a chunk (NULL if not wanted). */
static json_t *event_lp(const api_ctx *a, const srv_req *r, api_stream *st, const srv_event *ev,
                        int *bad) {
    if (!r->logprobs || skip_lp(a, ev)) return NULL;
    if (r->kind == SRV_CHAT) {
        json_t *o = json_object(), *arr = json_array();
        if (!o || !arr || api_jpush(arr, chat_lp_entry(a, r, ev)) ||
            json_object_set_new(o, "content", arr) || api_jset(o, "refusal", json_null())) {
            json_decref(o);
            *bad = 1;
            return NULL;
        }
        return o;
    }
    legacy_lp l;
    if (legacy_init(&l, st->text_off) || legacy_add(a, r, &l, ev)) {
        legacy_drop(&l);
        *bad = 1;
        return NULL;
    }
    st->text_off = l.offset;
    json_t *o = legacy_obj(&l);
    if (!o) *bad = 1;
    return o;
}

static int stream_start(const api_ctx *a, const srv_req *r, api_stream *st, api_buf *out) {
    st->started = 1;
    if (r->kind == SRV_CHAT) return chunk(a, r, st, out, "assistant", "", 0, NULL, NULL);
    if (!r->echo) return 0;
    api_buf t = {0};
    int rc = echo_text(a, r, &t) || chunk(a, r, st, out, NULL, t.p, t.n, NULL, NULL);
    api_buf_free(&t);
    return rc ? -1 : 0;
}

/* A chat chunk whose delta is {key: value} (value taken): tool calls, reasoning. */
static int chunk_delta(const api_ctx *a, const srv_req *r, api_stream *st, api_buf *out, const char *key,
                       json_t *value) {
    json_t *o = reply_head(a, r, "chat.completion.chunk");
    json_t *c = value ? json_pack("{s:i, s:{s:o}, s:n, s:n}", "index", 0, "delta", key, value, "logprobs",
                                  "finish_reason")
                      : NULL;
    json_t *choices = c ? json_pack("[o]", c) : NULL;
    if (!o || !choices || json_object_set_new(o, "choices", choices) ||
        (r->include_usage && api_jset(o, "usage", json_null()))) {
        json_decref(o);
        return -1;
    }
    return frame(a, r, st, out, o);
}

/* Text of a tool-calling reply: content while it cannot be a tag, each call
 * when its block closes; at the end (last), what is still held goes out as
 * content. */
static int stream_tools(const api_ctx *a, const srv_req *r, api_stream *st, const char *t, size_t n, json_t *lp,
                        int last, api_buf *out) {
    api_buf content = {0};
    json_t *calls = json_array();
    int rc = !calls || tools_stream(&st->tools, r->tool_fmt, t, n, r->id, r->tool_strs, &content, calls);
    const char *lost = tools_lost_open(r->tool_fmt);
    /* the end, as the whole reply has it: text after the calls is dropped;
     * an unterminated call with none before it is content, tag included */
    if (!rc && last && st->tools.hold.n) {
        if (!st->tools.in_call && !st->tools.seen_call)
            rc = api_buf_add(&content, st->tools.hold.p, st->tools.hold.n);
        else if (st->tools.in_call && !st->tools.n_calls)
            rc = api_buf_add(&content, lost, strlen(lost)) || api_buf_add(&content, st->tools.hold.p, st->tools.hold.n);
        st->tools.hold.n = 0;
    } else if (!rc && last && st->tools.in_call && !st->tools.n_calls) {
        rc = api_buf_add(&content, lost, strlen(lost));
    }
    if (!rc && (content.n || lp)) rc = chunk(a, r, st, out, NULL, content.p ? content.p : "", content.n, lp, NULL);
    else json_decref(lp);
    if (!rc && json_array_size(calls)) rc = chunk_delta(a, r, st, out, "tool_calls", json_incref(calls));
    api_buf_free(&content);
    json_decref(calls);
    return rc ? -1 : 0;
}

/* Content of a reply (after any reasoning): through the tool-call splitter
 * when tools are on, else as is. */
static int stream_content(const api_ctx *a, const srv_req *r, api_stream *st, const char *t, size_t n, json_t *lp,
                          int last, api_buf *out) {
    if (r->kind == SRV_CHAT && r->tool_mode) return stream_tools(a, r, st, t, n, lp, last, out);
    if (!n && !lp) return 0;
    return chunk(a, r, st, out, NULL, t, n, lp, NULL);
}

/* A reply that may reason: the loop marks each token as reasoning or not
 * (ev->reasoning); reasoning goes out as reasoning_content deltas without
 * its markers (the close held back while the text may be its start), then
 * content without its leading blank lines. Blanks before the reasoning are
 * held until it is clear whether any comes. */
static int stream_think(const api_ctx *a, const srv_req *r, api_stream *st, const char *t, size_t n, json_t *lp,
                        int reasoning, int last, api_buf *out) {
    if (lp && chunk(a, r, st, out, NULL, "", 0, lp, NULL)) return -1; /* logprobs travel on their own */
    const char *open, *close;
    think_markers(r, &open, &close);
    const size_t ol = strlen(open), cl = strlen(close);
    if (reasoning && st->think == 0) { /* it starts: what is held is its open marker's start */
        st->think = 1;
        st->think_opening = !r->think_started; /* the reply writes its open marker */
        st->think_lead = 1;
    }
    if (!reasoning && st->think == 1) { /* it ended without a close marker seen (held text) */
        if (st->think_hold.n &&
            chunk_delta(a, r, st, out, "reasoning_content", api_jstr_bytes(st->think_hold.p, st->think_hold.n)))
            return -1;
        st->think_hold.n = 0;
        st->think = 2;
    }
    if (n && api_buf_add(&st->think_hold, t, n)) return -1;
    char *h = st->think_hold.p;
    size_t hn = st->think_hold.n;
    if (st->think == 0) { /* no reasoning yet: what may still open it waits, anything else is content */
        size_t k = 0;
        while (k < hn && (h[k] == ' ' || h[k] == '\n')) k++;
        if (!last && (!hn || (hn - k < ol && !memcmp(h + k, open, hn - k)))) return 0;
        st->think = 2;
        st->content_on = 1;
    }
    if (st->think == 1) {
        if (st->think_opening) {
            size_t k = 0;
            while (k < hn && (h[k] == ' ' || h[k] == '\n')) k++;
            if (!last && (!hn || (hn - k < ol && !memcmp(h + k, open, hn - k)))) return 0; /* too early to say */
            st->think_opening = 0;
            if (hn - k >= ol && !memcmp(h + k, open, ol)) {
                memmove(h, h + k + ol, hn - k - ol);
                hn = st->think_hold.n = hn - k - ol;
            }
        }
        if (st->think_lead) { /* the blanks that end a channel's header are not reasoning */
            const size_t k = header_blanks(open, h, hn);
            memmove(h, h + k, hn - k);
            hn = st->think_hold.n = hn - k;
            st->think_lead = hn == 0;
        }
        const char *end = hn ? memmem(h, hn, close, cl) : NULL;
        /* without the marker: all but a tail that may be its start (whole
         * characters either way: the marker is ASCII) */
        size_t emit = end ? (size_t)(end - h) : hn;
        if (!end && !last)
            for (size_t k = cl - 1; k > 0; k--)
                if (hn >= k && !memcmp(h + hn - k, close, k)) {
                    emit = hn - k;
                    break;
                }
        if (emit && chunk_delta(a, r, st, out, "reasoning_content", api_jstr_bytes(h, emit))) return -1;
        if (!end) {
            memmove(h, h + emit, hn - emit);
            st->think_hold.n = hn - emit;
            return 0;
        }
        memmove(h, end + cl, hn - emit - cl);
        hn = st->think_hold.n = hn - emit - cl;
        st->think = 2;
    }
    size_t k = 0;
    if (!st->content_on) {
        while (k < hn && (h[k] == ' ' || h[k] == '\n')) k++;
        if (k < hn) st->content_on = 1;
    }
    int rc = stream_content(a, r, st, h + k, hn - k, NULL, last, out);
    st->think_hold.n = 0;
    return rc;
}

/* A harmony reply streamed: reasoning_content and content deltas as the
 * parser lets them go, each call whole as its message ends. */
typedef struct hm_stream {
    const api_ctx *a;
    const srv_req *r;
    api_stream *st;
    api_buf *out;
} hm_stream;

static int hm_stream_piece(void *user, int kind, const char *name, const char *text, size_t n) {
    hm_stream *s = user;
    if (kind == TL_HARMONY_REASONING)
        return chunk_delta(s->a, s->r, s->st, s->out, "reasoning_content", api_jstr_bytes(text, n));
    if (kind == TL_HARMONY_CONTENT) return chunk(s->a, s->r, s->st, s->out, NULL, text, n, NULL, NULL);
    if (!s->r->tool_mode) return 0;
    const int k = s->st->harmony_calls++;
    json_t *c = tools_harmony_call(name, text, n, k, k, s->r->id);
    return chunk_delta(s->a, s->r, s->st, s->out, "tool_calls", c ? json_pack("[o]", c) : NULL);
}

static int stream_harmony(const api_ctx *a, const srv_req *r, api_stream *st, const char *t, size_t n, json_t *lp,
                          int last, api_buf *out) {
    if (lp && chunk(a, r, st, out, NULL, "", 0, lp, NULL)) return -1; /* logprobs travel on their own */
    tl_error err = {0};
    if (!st->harmony && tl_harmony_new(&st->harmony, &err)) return -1;
    hm_stream s = {a, r, st, out};
    return tl_harmony_feed(st->harmony, t, n, last, hm_stream_piece, &s) ? -1 : 0;
}

int api_stream_event(const api_ctx *a, const srv_req *r, api_stream *st, const srv_event *ev,
                     api_buf *out) {
    if (st->ended) return 0;
    if (!st->started && ev->kind != SRV_EV_ERROR && stream_start(a, r, st, out)) return -1;
    int bad = 0;
    const int tools = r->kind == SRV_CHAT && r->tool_mode;
    switch (ev->kind) {
    case SRV_EV_PROMPT:
    case SRV_EV_TOKEN: {
        json_t *lp = event_lp(a, r, st, ev, &bad);
        if (bad) return -1;
        if (ev->kind == SRV_EV_PROMPT && !lp) return 0;
        const char *t = ev->kind == SRV_EV_TOKEN ? ev->text : "";
        size_t n = ev->kind == SRV_EV_TOKEN ? ev->text_len : 0;
        if (!n && !lp) return 0;
        if (r->kind == SRV_CHAT && r->harmony) return stream_harmony(a, r, st, t ? t : "", t ? n : 0, lp, 0, out);
        if (r->kind == SRV_CHAT && r->think)
            return stream_think(a, r, st, t ? t : "", t ? n : 0, lp, ev->kind == SRV_EV_TOKEN && ev->reasoning, 0, out);
        if (tools) return stream_tools(a, r, st, t ? t : "", t ? n : 0, lp, 0, out);
        return chunk(a, r, st, out, NULL, t ? t : "", t ? n : 0, lp, NULL);
    }
    case SRV_EV_DONE:
        if (r->kind == SRV_CHAT && r->harmony) {
            if (stream_harmony(a, r, st, ev->text ? ev->text : "", ev->text_len, NULL, 1, out)) return -1;
        } else if (r->kind == SRV_CHAT && r->think) {
            /* the text held back to the end belongs with the last token */
            if (stream_think(a, r, st, ev->text ? ev->text : "", ev->text_len, NULL, st->think == 1, 1, out)) return -1;
        } else if (tools) {
            if (stream_tools(a, r, st, ev->text ? ev->text : "", ev->text_len, NULL, 1, out)) return -1;
        } else if (ev->text_len && chunk(a, r, st, out, NULL, ev->text, ev->text_len, NULL, NULL)) {
            return -1;
        }
        if (chunk(a, r, st, out, NULL, NULL, 0, NULL,
                  (tools && st->tools.n_calls) || st->harmony_calls ? "tool_calls"
                  : ev->finish_reason                            ? ev->finish_reason
                                                                 : "stop"))
            return -1;
        if ((r->include_usage || r->dialect) && usage_chunk(a, r, st, out)) return -1;
        break;
    case SRV_EV_ERROR: {
        const char *m = ev->text && ev->text[0] ? ev->text : "the request failed";
        st->ended = 1;
        if (r->wire) return r->wire->stream_error(a, r, &st->ds, m, out);
        if (stream_error(ev, out)) return -1;
        break;
    }
    }
    st->ended = 1;
    if (r->dialect) return 0; /* the dialect's last event was its end */
    return api_buf_add(out, "data: [DONE]\n\n", 14);
}
