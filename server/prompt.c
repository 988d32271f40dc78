/* server/prompt: the prompt of a request: chat messages checked and
 * rendered through the model's template (system messages folded, tools
 * offered, reasoning opened), or a completion's text or token ids, then
 * tokenized. */
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

#define BAD(param, ...) api_fail(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

/* ---- prompts --------------------------------------------------------------- */

int api_tokenize_text(const tl_model *m, const char *s, size_t n, int flags, int32_t **ids,
                    int *n_ids, api_err *e) {
    tl_error err = {0};
    size_t nt = 0;
    if (tl_tokenize(m, s, n, flags, ids, &nt, &err))
        return api_fail(e, 400, "invalid_request_error", NULL, NULL, "cannot tokenize: %s", err.msg);
    if (nt > (size_t)1 << 30) return BAD(NULL, "prompt too long");
    *n_ids = (int)nt;
    return 0;
}

/* One message's content: a string, or text parts joined with "\n". */
static int msg_content(json_t *c, int i, const char *role, api_buf *b, api_err *e) {
    char p[48];
    snprintf(p, sizeof p, "messages[%d].content", i);
    if (!c) {
        if (strcmp(role, "assistant")) return BAD(p, "'%s' is missing", p);
        return api_buf_add(b, "", 0) ? api_fail(e, 500, "server_error", NULL, NULL, "out of memory") : 0;
    }
    if (json_is_string(c))
        return api_buf_add(b, json_string_value(c), json_string_length(c))
                   ? api_fail(e, 500, "server_error", NULL, NULL, "out of memory") : 0;
    if (!json_is_array(c)) return BAD(p, "'%s' must be a string or an array of parts", p);
    size_t j;
    json_t *part;
    json_array_foreach(c, j, part) {
        json_t *t = json_is_object(part) ? json_object_get(part, "type") : NULL;
        if (!json_is_string(t)) return BAD(p, "each part of '%s' needs a string 'type'", p);
        const char *ty = json_string_value(t);
        if (strcmp(ty, "text")) {
            if (!strcmp(ty, "image_url") || !strcmp(ty, "input_audio") || !strcmp(ty, "file") ||
                !strcmp(ty, "image"))
                return BAD(p, "'%s' parts are not supported (text only)", ty);
            return BAD(p, "unknown content part type '%.40s'", ty);
        }
        json_t *tx = json_object_get(part, "text");
        if (!json_is_string(tx) || json_object_size(part) != 2)
            return BAD(p, "a text part is {\"type\":\"text\",\"text\":STRING}");
        if ((j && api_buf_add(b, "\n", 1)) ||
            api_buf_add(b, json_string_value(tx), json_string_length(tx)))
            return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (!b->p && api_buf_add(b, "", 0)) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

/* Prefixes of lines that change on every request and tell the model nothing.
 * Claude Code's billing line carries a per-request hash (cch=...) at the very
 * top of its system prompt: kept, it would end every turn's cached prefix
 * there. Anthropic's own API does not show it to the model either. */
static const char *const VOLATILE[] = {"x-anthropic-billing-header:", NULL};

size_t api_volatile_strip(char *s, size_t n) {
    size_t w = 0, i = 0;
    while (i < n) {
        size_t e = i;
        while (e < n && s[e] != '\n') e++;
        size_t end = e < n ? e + 1 : e; /* the line with its newline */
        int drop = 0;
        for (int k = 0; VOLATILE[k]; k++) {
            size_t kl = strlen(VOLATILE[k]);
            if (e - i >= kl && !strncasecmp(s + i, VOLATILE[k], kl)) drop = 1;
        }
        if (!drop) {
            memmove(s + w, s + i, end - i);
            w += end - i;
        }
        i = end;
    }
    /* a stripped first line leaves the blank line that followed it */
    size_t lead = 0;
    if (w < n) {
        while (lead < w && s[lead] == '\n') lead++;
        memmove(s, s + lead, w - lead);
        w -= lead;
    }
    s[w] = 0;
    return w;
}

/* One {role, content} for the template, from a request message. */
static json_t *chat_message(json_t *msg, int i, int tools_native, api_err *e) {
    char p[32];
    snprintf(p, sizeof p, "messages[%d]", i);
    if (!json_is_object(msg)) return BAD(p, "'%s' must be an object", p), NULL;
    const char *k;
    json_t *v;
    json_object_foreach(msg, k, v) {
        if (!strcmp(k, "role") || !strcmp(k, "content") || !strcmp(k, "name") || !strcmp(k, "tool_calls") ||
            !strcmp(k, "tool_call_id") || !strcmp(k, "reasoning_content"))
            continue;
        if (!strcmp(k, "function_call") || !strcmp(k, "refusal") || !strcmp(k, "audio")) {
            if (json_is_null(v)) continue;
            return BAD(p, "'%s.%s' is not supported by this server", p, k), NULL;
        }
        return BAD(p, "unknown field '%s.%.40s'", p, k), NULL;
    }
    json_t *role = json_object_get(msg, "role");
    if (!json_is_string(role)) return BAD(p, "'%s.role' must be a string", p), NULL;
    const char *ro = json_string_value(role);
    if (!strcmp(ro, "developer")) ro = "system";
    else if (strcmp(ro, "system") && strcmp(ro, "user") && strcmp(ro, "assistant") && strcmp(ro, "tool"))
        return BAD(p, "role '%.40s' is not supported (system, developer, user, assistant, tool)", ro), NULL;
    json_t *name = api_field(msg, "name");
    if (name && !json_is_string(name)) return BAD(p, "'%s.name' must be a string", p), NULL;
    api_buf b = {0};
    if (msg_content(api_field(msg, "content"), i, ro, &b, e)) {
        api_buf_free(&b);
        return NULL;
    }
    /* here, where every dialect's system messages pass, so the rule is one */
    if (!strcmp(ro, "system") && b.p) b.n = api_volatile_strip(b.p, b.n);
    /* tool calls the assistant made: the template renders them (arguments as
     * objects, as Hugging Face templates expect), or, without tool support,
     * they become the tagged blocks the model was asked to write */
    json_t *tc = api_field(msg, "tool_calls"), *calls = NULL;
    if (tc) {
        if (strcmp(ro, "assistant") || !json_is_array(tc)) {
            api_buf_free(&b);
            return BAD(p, "'%s.tool_calls' must be an array on an assistant message", p), NULL;
        }
        calls = json_array();
        size_t j;
        json_t *c;
        json_array_foreach(tc, j, c) {
            json_t *fn = json_object_get(c, "function"), *nm = json_object_get(fn, "name"),
                   *args = json_object_get(fn, "arguments");
            json_t *av = json_is_string(args) ? json_loads(json_string_value(args), JSON_DECODE_ANY, NULL)
                                              : json_incref(args);
            if (!json_is_string(nm) || !av) {
                json_decref(av);
                json_decref(calls);
                api_buf_free(&b);
                return BAD(p, "'%s.tool_calls' entries need function.name and JSON function.arguments", p), NULL;
            }
            json_t *id = json_object_get(c, "id");
            json_array_append_new(calls, json_pack("{s:O?, s:s, s:{s:O, s:o}}", "id", id, "type", "function",
                                                   "function", "name", nm, "arguments", av));
            if (!tools_native) {
                json_t *blk = json_pack("{s:O, s:O}", "name", nm, "arguments", av);
                char *t = blk ? json_dumps(blk, JSON_COMPACT) : NULL;
                json_decref(blk);
                if (!t || (b.n && api_buf_add(&b, "\n", 1)) || api_buf_add(&b, "<tool_call>\n", 12) ||
                    api_buf_add(&b, t, strlen(t)) || api_buf_add(&b, "\n</tool_call>", 13)) {
                    free(t);
                    json_decref(calls);
                    api_buf_free(&b);
                    return api_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
                }
                free(t);
            }
        }
    }
    /* an earlier turn's reasoning, as this server returned it: the
     * template decides whether it renders (Qwen 3's keeps it after the last
     * user turn, within a tool-calling loop) */
    json_t *reas = api_field(msg, "reasoning_content");
    if (reas && (!json_is_string(reas) || strcmp(ro, "assistant"))) {
        json_decref(calls);
        api_buf_free(&b);
        return BAD(p, "'%s.reasoning_content' must be a string on an assistant message", p), NULL;
    }
    json_t *tid = api_field(msg, "tool_call_id");
    if (tid && !json_is_string(tid)) {
        json_decref(calls);
        api_buf_free(&b);
        return BAD(p, "'%s.tool_call_id' must be a string", p), NULL;
    }
    const char *role_out = ro;
    if (!strcmp(ro, "tool") && !tools_native) { /* a result, as a user turn in the tagged form */
        api_buf w = {0};
        if (api_buf_add(&w, "<tool_response>\n", 16) || (b.n && api_buf_add(&w, b.p, b.n)) ||
            api_buf_add(&w, "\n</tool_response>", 17)) {
            api_buf_free(&w);
            json_decref(calls);
            api_buf_free(&b);
            return api_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
        }
        api_buf_free(&b);
        b = w;
        role_out = "user";
    }
    json_t *o = json_object();
    json_t *c = json_stringn(b.p ? b.p : "", b.n);
    api_buf_free(&b);
    if (!o || !c || json_object_set_new(o, "role", json_string(role_out)) ||
        json_object_set_new(o, "content", c) || (calls && tools_native && json_object_set(o, "tool_calls", calls)) ||
        (tid && tools_native && json_object_set(o, "tool_call_id", tid)) ||
        (reas && json_object_set(o, "reasoning_content", reas))) {
        json_decref(o);
        json_decref(calls);
        return api_fail(e, 500, "server_error", NULL, NULL, "out of memory"), NULL;
    }
    json_decref(calls);
    return o;
}

/* messages -> the model's template -> tokens. */
/* Renders messages (not taken) with the template's variables beside them. */
static int render_msgs(const api_ctx *a, json_t *arr, json_t *tools, json_t *kwargs, int add_gen, char **out,
                       size_t *ol, tl_error *err) {
    json_t *top = json_incref(arr);
    if (tools || kwargs) { /* template variables beside the messages */
        top = json_pack("{s:o}", "messages", top); /* takes it, even failing */
        if (top && ((tools && json_object_set(top, "tools", tools)) || (kwargs && json_object_update_missing(top, kwargs)))) {
            json_decref(top);
            top = NULL;
        }
        if (!top) return TL_ERR_NOMEM;
    }
    tl_chat_template *own = NULL;
    int rc = a->tmpl ? TL_OK : tl_chat_template_new(a->m, NULL, &own, err);
    if (!rc) rc = tl_chat_template_render_json(a->tmpl ? a->tmpl : own, top, add_gen, out, ol, err);
    tl_chat_template_free(own);
    json_decref(top);
    return rc;
}

static const char *sval(json_t *v) { return json_is_string(v) ? json_string_value(v) : ""; }

/* The messages with each system message after the first folded into the
 * next user message (or a user message of its own at the end); NULL if there
 * is none such (or no memory). */
static json_t *fold_system(json_t *arr) {
    size_t n = json_array_size(arr), mid = 0;
    for (size_t i = 1; i < n; i++)
        if (!strcmp(sval(json_object_get(json_array_get(arr, i), "role")), "system")) mid++;
    json_t *out = mid ? json_array() : NULL;
    char *pend = NULL;
    int bad = !out;
    for (size_t i = 0; !bad && i < n; i++) {
        json_t *m = json_array_get(arr, i);
        const char *role = sval(json_object_get(m, "role")), *c = sval(json_object_get(m, "content"));
        if (i && !strcmp(role, "system")) {
            size_t l = (pend ? strlen(pend) + 2 : 0) + strlen(c) + 1;
            char *p = malloc(l);
            if (p) snprintf(p, l, "%s%s%s", pend ? pend : "", pend ? "\n\n" : "", c);
            free(pend);
            pend = p;
            bad = !p;
        } else if (pend && !strcmp(role, "user")) {
            size_t l = strlen(pend) + strlen(c) + 3;
            char *p = malloc(l);
            json_t *u = p ? json_deep_copy(m) : NULL;
            if (p) snprintf(p, l, "%s\n\n%s", pend, c);
            bad = !u || json_object_set_new(u, "content", json_string(p)) || json_array_append_new(out, u);
            free(p);
            free(pend);
            pend = NULL;
        } else {
            bad = json_array_append(out, m);
        }
    }
    if (!bad && pend) bad = json_array_append_new(out, json_pack("{s:s, s:s}", "role", "user", "content", pend));
    free(pend);
    if (bad) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* The older Gemma 4 template renders tool results only from the calling
 * message's `tool_responses`: each assistant message with tool calls takes
 * the role "tool" messages after it (named by its calls, in order; the
 * content as JSON where it parses) and the answer right after them, as
 * llama.cpp rewrites the history for it. NULL: no memory. */
static json_t *g4_legacy_history(json_t *arr) {
    json_t *out = json_array();
    size_t n = json_array_size(arr), i = 0;
    int bad = !out;
    while (!bad && i < n) {
        json_t *m = json_array_get(arr, i), *calls = json_object_get(m, "tool_calls");
        if (strcmp(sval(json_object_get(m, "role")), "assistant") || !json_array_size(calls)) {
            bad = json_array_append(out, m);
            i++;
            continue;
        }
        json_t *msg = json_pack("{s:s, s:O}", "role", "assistant", "tool_calls", calls), *resp = json_array();
        json_t *reas = json_object_get(m, "reasoning_content");
        bad = !msg || !resp || (json_is_string(reas) && json_object_set(msg, "reasoning_content", reas));
        for (i++; !bad && i < n && !strcmp(sval(json_object_get(json_array_get(arr, i), "role")), "tool"); i++) {
            json_t *tm = json_array_get(arr, i), *c = json_object_get(tm, "content");
            json_t *v = json_is_string(c) ? json_loads(json_string_value(c), JSON_DECODE_ANY, NULL) : NULL;
            const char *name = sval(json_object_get(json_object_get(json_array_get(calls, json_array_size(resp)),
                                                                    "function"), "name"));
            if (!*name) name = sval(json_object_get(tm, "tool_call_id"));
            bad = json_array_append_new(resp, json_pack("{s:s, s:o}", "name", name, "response",
                                                        v ? v : c ? json_incref(c) : json_null()));
        }
        json_t *next = i < n ? json_array_get(arr, i) : NULL, *nc = json_object_get(next, "content");
        if (!bad && next && !strcmp(sval(json_object_get(next, "role")), "assistant") &&
            !json_array_size(json_object_get(next, "tool_calls")) && json_is_string(nc) && json_string_length(nc)) {
            bad = json_object_set(msg, "content", nc);
            i++;
        }
        bad = bad || (json_array_size(resp) && json_object_set(msg, "tool_responses", resp)) ||
              json_array_append(out, msg);
        json_decref(msg);
        json_decref(resp);
    }
    if (bad) {
        json_decref(out);
        return NULL;
    }
    return out;
}

/* Appends s to a rendered prompt (malloc'ed). 0 or -1 (no memory). */
static int prompt_add(char **out, size_t *ol, const char *s) {
    const size_t k = strlen(s);
    char *o2 = realloc(*out, *ol + k + 1);
    if (!o2) return -1;
    memcpy(o2 + *ol, s, k + 1);
    *out = o2;
    *ol += k;
    return 0;
}

static int ends_with(const char *s, size_t n, const char *m) {
    const size_t k = strlen(m);
    return n >= k && !memcmp(s + n - k, m, k);
}

/* Python's truth of a template variable given as JSON. */
static int json_truthy(json_t *v) {
    if (json_is_boolean(v)) return json_is_true(v);
    if (json_is_number(v)) return json_number_value(v) != 0;
    if (json_is_string(v)) return json_string_length(v) != 0;
    if (json_is_array(v)) return json_array_size(v) != 0;
    if (json_is_object(v)) return json_object_size(v) != 0;
    return 0;
}

/* Gemma 4's template thinks only when enable_thinking is set; llama.cpp
 * sets it unless reasoning is off (or, per request, none). The caller's
 * chat_template_kwargs win. Returns kwargs, with a reference of its own
 * (maybe a new object), or NULL with *oom set. */
static json_t *g4_kwargs(const api_ctx *a, json_t *kwargs, const api_think *th, int *on, int *oom) {
    json_t *et = json_object_get(kwargs, "enable_thinking");
    *oom = 0;
    if (et) {
        *on = json_truthy(et);
        return json_incref(kwargs);
    }
    *on = a->reasoning != 0 && (!th || th->budget != 0);
    json_t *kw = kwargs ? json_copy(kwargs) : json_object();
    if (!kw || json_object_set_new(kw, "enable_thinking", json_boolean(*on))) {
        json_decref(kw);
        *oom = 1;
        return NULL;
    }
    return kw;
}

/* The rendered prompt's end: Gemma 4's turn opened where the template
 * left it closed, and the reasoning opened where the reply must reason
 * first (th->started says whether the prompt opened it). thinks: Gemma 4's
 * enable_thinking. 0 or -1 (no memory). */
static int prompt_finish(const api_ctx *a, const char *tmpl, int add_gen, int thinks, api_think *th, char **out,
                         size_t *ol) {
    const int gemma4 = tools_gemma4(tmpl);
    /* an answer after tool results closes the turn, and the template opens
     * no other (llama.cpp opens it) */
    if (gemma4 && add_gen && ends_with(*out, *ol, "<turn|>\n") && prompt_add(out, ol, "<|turn>model\n")) return -1;
    if (!th || !a->reasoning || tl_chat_harmony(tmpl)) return 0;
    /* the reasoning starts in the prompt when the generation prompt ends
     * with the open marker; with --reasoning on the server writes it there,
     * and for Gemma 4, which opens it itself, when a grammar would hold the
     * reply from its first token (the reasoning first, then the grammar, as
     * for a template that opens it) */
    const char *open, *close;
    tl_chat_think_markers(tmpl, &open, &close);
    th->started = tl_chat_think_started(*out, *ol);
    const int open_it = a->reasoning == 2 || (gemma4 && thinks && th->eager && ends_with(*out, *ol, "<|turn>model\n"));
    if (th->started || !open_it || !add_gen) return 0;
    if (prompt_add(out, ol, open) || prompt_add(out, ol, "\n")) return -1;
    th->started = 1;
    return 0;
}

/* The prompt tokens before the content of arr's first message that is not a
 * system one: the same messages rendered with that content replaced part
 * from the prompt there (out, ids[0..n)), and the text before tokenizes as
 * the prompt does, bar its last token (which may merge across). 0 when
 * there is no such message or anything fails. */
static int shared_prefix(const api_ctx *a, json_t *arr, json_t *tools, json_t *kw, int add_gen, int flags,
                         const char *out, size_t ol, const int32_t *ids, int n) {
    size_t k = 0;
    for (; k < json_array_size(arr); k++) {
        const char *role = sval(json_object_get(json_array_get(arr, k), "role"));
        if (strcmp(role, "system") && strcmp(role, "developer")) break;
    }
    if (k == 0 || k == json_array_size(arr)) return 0;
    json_t *alt = json_deep_copy(arr);
    char *o2 = NULL;
    size_t l2 = 0, at = 0;
    tl_error err = {0};
    int rc = !alt || json_object_set_new(json_array_get(alt, k), "content", json_string("\x01"));
    if (!rc) rc = render_msgs(a, alt, tools, kw, add_gen, &o2, &l2, &err);
    json_decref(alt);
    if (!rc)
        while (at < ol && at < l2 && out[at] == o2[at]) at++;
    tl_free(o2);
    if (rc || at == 0) return 0;
    tl_error e2 = {0};
    int32_t *pre = NULL;
    size_t np = 0;
    if (tl_tokenize(a->m, out, at, flags, &pre, &np, &e2)) return 0;
    int m = 0;
    while (m < n && (size_t)m < np && pre[m] == ids[m]) m++;
    tl_free(pre);
    return m > 0 ? m - 1 : 0;
}

int api_chat_prompt(const api_ctx *a, json_t *msgs, const tools_req *t, json_t *kwargs, int add_gen, api_think *th,
                    int32_t **ids, int *n, int *n_shared, api_err *e) {
    if (n_shared) *n_shared = 0;
    if (!msgs) return BAD("messages", "'messages' is required");
    if (!json_is_array(msgs)) return BAD("messages", "'messages' must be an array");
    if (kwargs && !json_is_object(kwargs))
        return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    static const char *const RESERVED[] = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", NULL};
    for (int i = 0; kwargs && RESERVED[i]; i++)
        if (json_object_get(kwargs, RESERVED[i]))
            return BAD("chat_template_kwargs", "'chat_template_kwargs' may not set '%s'", RESERVED[i]);
    size_t nm = json_array_size(msgs);
    if (!nm) return BAD("messages", "'messages' must not be empty");
    if (nm > (size_t)a->max_messages) return BAD("messages", "at most %d messages", a->max_messages);
    const char *tmpl = tl_model_chat_template(a->m);
    if (!tmpl) return BAD("messages", "this model has no chat template; use /v1/completions");
    /* tools: through the template's own `tools` variable where it has one,
     * else listed in a system message (server/tools.c) */
    const int with_tools = t && t->tools && t->mode != TOOLS_NONE;
    /* history with tool calls renders the template's way if it has one,
     * else as the tagged blocks, whether or not this request offers tools */
    const int tmpl_tools = strstr(tmpl, "tools") != NULL;
    const int native = with_tools && tmpl_tools;
    const int harmony = tl_chat_harmony(tmpl), gemma4 = tools_gemma4(tmpl);
    json_t *arr = json_array();
    if (!arr) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < nm; i++) {
        json_t *o = chat_message(json_array_get(msgs, i), (int)i, tmpl_tools, e);
        if (!o || json_array_append_new(arr, o)) {
            json_decref(arr);
            return -1;
        }
        /* gpt-oss's template reads an earlier turn's reasoning as `thinking`,
         * and refuses it beside content on a call (llama.cpp drops the content) */
        json_t *reas = json_object_get(o, "reasoning_content");
        if (harmony && reas && (json_object_set(o, "thinking", reas) ||
                                (json_object_get(o, "tool_calls") && json_object_del(o, "content")))) {
            json_decref(arr);
            return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    if (gemma4 && tools_gemma4_legacy(tmpl)) {
        json_t *h = g4_legacy_history(arr);
        json_decref(arr);
        if (!h) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        arr = h;
    }
    if (with_tools && !native) {
        char *sys = tools_system_text(t->tools);
        json_t *first = json_array_get(arr, 0);
        const char *r0 = json_string_value(json_object_get(first, "role"));
        int bad = !sys;
        if (sys && r0 && !strcmp(r0, "system")) { /* joined to the caller's system message */
            const char *c0 = json_string_value(json_object_get(first, "content"));
            size_t l = strlen(c0) + strlen(sys) + 3;
            char *j = malloc(l);
            if (j) snprintf(j, l, "%s\n\n%s", c0, sys);
            bad = !j || json_object_set_new(first, "content", json_string(j));
            free(j);
        } else if (sys) {
            bad = json_array_insert_new(arr, 0, json_pack("{s:s, s:s}", "role", "system", "content", sys));
        }
        free(sys);
        if (bad) {
            json_decref(arr);
            return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    /* Gemma 4 thinks when asked: enable_thinking from the request's reasoning */
    int thinks = 0, oom = 0;
    json_t *kw = gemma4 ? g4_kwargs(a, kwargs, th, &thinks, &oom) : json_incref(kwargs);
    if (oom) {
        json_decref(arr);
        return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    char *out = NULL;
    size_t ol = 0;
    tl_error err = {0};
    json_t *tools_v = native ? t->tools : NULL;
    int rc = render_msgs(a, arr, tools_v, kw, add_gen, &out, &ol, &err);
    if (rc && rc != TL_ERR_NOMEM) {
        /* a template that refuses a system message after the first (Gemma's
         * alternation check) gets it folded into the next user turn */
        json_t *folded = fold_system(arr);
        if (folded) {
            tl_free(out);
            out = NULL;
            tl_error err2 = {0};
            if (!render_msgs(a, folded, tools_v, kw, add_gen, &out, &ol, &err2)) {
                rc = TL_OK;
                json_decref(arr);
                arr = json_incref(folded); /* what was rendered */
            }
            json_decref(folded);
        }
    }
    if (rc) {
        json_decref(arr);
        json_decref(kw);
        tl_free(out);
        if (rc == TL_ERR_NOMEM) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return BAD("messages", "chat template: %s", err.msg);
    }
    if (prompt_finish(a, tmpl, add_gen, thinks, th, &out, &ol)) {
        json_decref(arr);
        json_decref(kw);
        tl_free(out);
        return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    int flags = TL_TOK_PARSE_SPECIAL | (tl_chat_add_bos(a->m, out) ? TL_TOK_ADD_BOS : 0);
    rc = api_tokenize_text(a->m, out, ol, flags, ids, n, e);
    /* only a model whose cached prefixes resume at kept states needs it */
    if (!rc && n_shared && (tl_model_state_bytes(a->m, NULL) || tl_model_kv_window_bytes(a->m, 0, 0, NULL)))
        *n_shared = shared_prefix(a, arr, tools_v, kw, add_gen, flags, out, ol, *ids, *n);
    json_decref(arr);
    json_decref(kw);
    tl_free(out);
    return rc;
}

/* An array of token ids, each < n_vocab. */
int api_token_array(const api_ctx *a, json_t *arr, const char *param, int32_t **ids, int *n,
                       api_err *e) {
    size_t na = json_array_size(arr), i;
    int nv = tl_model_n_vocab(a->m);
    if (na > (size_t)1 << 24) return BAD(param, "too many tokens");
    *ids = malloc((na ? na : 1) * sizeof **ids);
    if (!*ids) return api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    json_t *v;
    json_array_foreach(arr, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv)
            return BAD(param, "'%s' token ids must be integers in 0..%d", param, nv - 1);
        (*ids)[i] = (int32_t)json_integer_value(v);
    }
    *n = (int)na;
    return 0;
}

/* prompt: a string, token ids, or a one-element array of either. */
int api_completion_prompt(const api_ctx *a, json_t *p, int32_t **ids, int *n, api_err *e) {
    if (!p) return BAD("prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) >= 1 && !json_is_integer(json_array_get(p, 0))) {
        if (json_array_size(p) > 1) return BAD("prompt", "only one prompt per request is supported");
        p = json_array_get(p, 0);
        if (json_is_array(p) && json_array_size(p) && !json_is_integer(json_array_get(p, 0)))
            return BAD("prompt", "'prompt' must be a string or an array of token ids");
    }
    if (json_is_string(p)) {
        int flags = TL_TOK_PARSE_SPECIAL | (tl_model_add_bos(a->m) ? TL_TOK_ADD_BOS : 0);
        return api_tokenize_text(a->m, json_string_value(p), json_string_length(p), flags, ids, n, e);
    }
    if (json_is_array(p)) return api_token_array(a, p, "prompt", ids, n, e);
    return BAD("prompt", "'prompt' must be a string or an array of token ids");
}
