/* server/tools: OpenAI tool calls in one format, Hermes-style tags around a
 * JSON object:
 *
 *   <tool_call>
 *   {"name": "get_weather", "arguments": {"city": "Paris"}}
 *   </tool_call>
 *
 * Templates that render tools themselves (a `tools` variable, as Qwen 2.5's
 * does) get the definitions that way; the others (SmolLM2, Gemma 3) get a
 * system message that lists them and states the format (docs/SERVER.md). The
 * calls' grammar makes every call parse and its arguments validate against
 * the function's parameters: from the first token under `required` or a
 * named function, from the opening tag on under `auto`. The reply's text is
 * split into content and tool_calls here, whole or streamed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "tools.h"
#include "util.h"

#define OPEN "<tool_call>"
#define CLOSE "</tool_call>"

const char *tools_trigger(void) { return OPEN; }

static int bad(api_err *e, const char *param, const char *msg) {
    return api_fail(e, 400, "invalid_request_error", param, NULL, "%s", msg);
}

int tools_parse(json_t *root, tools_req *t, api_err *e) {
    memset(t, 0, sizeof *t);
    json_t *tools = json_object_get(root, "tools"), *choice = json_object_get(root, "tool_choice"),
           *par = json_object_get(root, "parallel_tool_calls");
    t->parallel = 1;
    if (par && !json_is_null(par)) {
        if (!json_is_boolean(par)) return bad(e, "parallel_tool_calls", "'parallel_tool_calls' must be true or false");
        t->parallel = json_is_true(par);
    }
    if (!tools || json_is_null(tools)) {
        if (choice && !json_is_null(choice) && !(json_is_string(choice) && !strcmp(json_string_value(choice), "none")))
            return bad(e, "tool_choice", "'tool_choice' needs 'tools'");
        return 0;
    }
    if (!json_is_array(tools)) return bad(e, "tools", "'tools' must be an array");
    if (json_array_size(tools) > 128) return bad(e, "tools", "at most 128 tools");
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        json_t *ty = json_object_get(tool, "type"), *fn = json_object_get(tool, "function");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_object(fn))
            return bad(e, "tools", "each tool must be {\"type\": \"function\", \"function\": {...}}");
        json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters");
        if (!json_is_string(name) || !json_string_length(name) || json_string_length(name) > 64)
            return bad(e, "tools", "a function's 'name' must be a string of 1 to 64 characters");
        for (const char *c = json_string_value(name); *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
                  *c == '-' || *c == '.'))
                return bad(e, "tools", "a function's 'name' may hold only letters, digits, '_', '-' and '.'");
        if (params && !json_is_null(params) && !json_is_object(params))
            return bad(e, "tools", "a function's 'parameters' must be a JSON Schema object");
    }
    t->tools = tools;
    t->mode = TOOLS_AUTO;
    if (choice && !json_is_null(choice)) {
        if (json_is_string(choice)) {
            const char *c = json_string_value(choice);
            if (!strcmp(c, "none")) t->mode = TOOLS_NONE;
            else if (!strcmp(c, "required")) t->mode = TOOLS_REQUIRED;
            else if (strcmp(c, "auto")) return bad(e, "tool_choice", "'tool_choice' must be none, auto, required or a function");
        } else {
            json_t *fn = json_object_get(choice, "function"), *name = json_object_get(fn, "name");
            if (!json_is_string(name)) return bad(e, "tool_choice", "'tool_choice' names a function as {\"type\": \"function\", \"function\": {\"name\": ...}}");
            t->only = json_string_value(name);
            int found = 0;
            json_array_foreach(tools, i, tool)
                found |= !strcmp(json_string_value(json_object_get(json_object_get(tool, "function"), "name")), t->only);
            if (!found) return bad(e, "tool_choice", "'tool_choice' names a function that is not in 'tools'");
            t->mode = TOOLS_REQUIRED;
        }
    }
    return 0;
}

char *tools_system_text(json_t *tools) {
    json_t *list = json_array();
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) json_array_append(list, json_object_get(tool, "function"));
    char *defs = json_dumps(list, JSON_INDENT(1));
    json_decref(list);
    if (!defs) return NULL;
    static const char HEAD[] =
        "You can call functions. Their definitions (JSON Schema parameters):\n";
    static const char TAIL[] =
        "\n\nTo call a function, reply with one block per call and nothing else:\n"
        OPEN "\n{\"name\": \"<function name>\", \"arguments\": {<the arguments as JSON>}}\n" CLOSE
        "\nResults come back as <tool_response> blocks. Answer in plain text when no call is needed.";
    size_t n = strlen(HEAD) + strlen(defs) + strlen(TAIL) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s%s", HEAD, defs, TAIL);
    free(defs);
    return s;
}

int tools_grammar(const tools_req *t, tl_grammar **out, tl_error *err) {
    *out = NULL;
    json_t *alts = json_array(), *schema = json_object();
    size_t i;
    json_t *tool;
    json_array_foreach(t->tools, i, tool) {
        json_t *fn = json_object_get(tool, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (t->only && strcmp(name, t->only)) continue;
        json_t *params = json_object_get(fn, "parameters");
        /* no parameters: an empty object */
        json_t *p = params && json_is_object(params) ? json_incref(params) : json_pack("{s:s}", "type", "object");
        json_t *one = p ? json_pack("{s:s, s:{s:{s:s}, s:o}, s:[s,s], s:b}", "type", "object", "properties", "name",
                                    "const", name, "arguments", p, "required", "name", "arguments",
                                    "additionalProperties", 0)
                        : NULL;
        if (!one || json_array_append_new(alts, one)) {
            json_decref(alts);
            json_decref(schema);
            return tl_fail(err, TL_ERR_NOMEM, "out of memory");
        }
    }
    json_object_set_new(schema, "anyOf", alts);
    char *text = json_dumps(schema, JSON_COMPACT);
    json_decref(schema);
    char *gbnf = NULL;
    int rc = text ? tl_json_schema_to_gbnf(text, strlen(text), &gbnf, err) : tl_fail(err, TL_ERR_NOMEM, "out of memory");
    free(text);
    if (rc) return rc;
    /* the calls' JSON grammar becomes rule `tcall`, inside the tags */
    char *root = strstr(gbnf, "\nroot ::= ");
    if (!root && !strncmp(gbnf, "root ::= ", 9)) root = gbnf - 1;
    if (!root) {
        tl_free(gbnf);
        return tl_fail(err, TL_ERR_ARG, "tool grammar: no root rule");
    }
    memcpy(root + 1, "tcal", 4); /* "root" -> "tcal" */
    static const char HEAD_ONE[] = "root ::= \"" OPEN "\" tcnl tcal tcnl \"" CLOSE "\"\n";
    static const char HEAD_MANY[] =
        "root ::= \"" OPEN "\" tcnl tcal tcnl \"" CLOSE "\" (tcnl \"" OPEN "\" tcnl tcal tcnl \"" CLOSE "\")*\n";
    static const char NL[] = "tcnl ::= \"\\n\"?\n";
    const char *head = t->parallel ? HEAD_MANY : HEAD_ONE;
    size_t n = strlen(head) + strlen(NL) + strlen(gbnf) + 1;
    char *all = malloc(n);
    if (!all) {
        tl_free(gbnf);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    snprintf(all, n, "%s%s%s", head, NL, gbnf);
    tl_free(gbnf);
    rc = tl_grammar_parse(all, strlen(all), out, err);
    free(all);
    return rc;
}

/* ---- the reply ---- */

/* One call block's JSON -> {id, type, function: {name, arguments}} with the
 * arguments as a JSON string, as OpenAI sends them. */
static json_t *call_json(const char *s, size_t n, int index, const char *req_id) {
    json_t *o = json_loadb(s, n, 0, NULL);
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, "arguments");
    if (!json_is_string(name) || !args) {
        json_decref(o);
        return NULL;
    }
    char *a = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
    char id[96];
    snprintf(id, sizeof id, "call_%.60s_%d", req_id + (strncmp(req_id, "chatcmpl-", 9) ? 0 : 9), index);
    json_t *c = a ? json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name", name,
                              "arguments", a)
                  : NULL;
    free(a);
    json_decref(o);
    return c;
}

json_t *tools_split(const char *text, size_t n, const char *req_id, size_t *content_len) {
    const char *open = memmem(text, n, OPEN, sizeof OPEN - 1);
    *content_len = open ? (size_t)(open - text) : n;
    if (!open) return NULL;
    while (*content_len && (text[*content_len - 1] == '\n' || text[*content_len - 1] == ' ')) (*content_len)--;
    json_t *calls = json_array();
    const char *p = open, *end = text + n;
    while (calls && p && p < end) {
        const char *b = p + sizeof OPEN - 1;
        const char *c = memmem(b, (size_t)(end - b), CLOSE, sizeof CLOSE - 1);
        if (!c) break;
        json_t *call = call_json(b, (size_t)(c - b), (int)json_array_size(calls), req_id);
        if (call) json_array_append_new(calls, call);
        p = c + sizeof CLOSE - 1;
        p = memmem(p, (size_t)(end - p), OPEN, sizeof OPEN - 1);
    }
    if (calls && !json_array_size(calls)) {
        json_decref(calls);
        *content_len = n;
        return NULL;
    }
    return calls;
}

int tools_stream(tools_stream_st *s, const char *text, size_t n, const char *req_id, api_buf *content,
                 json_t *calls) {
    if (n && api_buf_add(&s->hold, text, n)) return -1;
    for (;;) {
        char *h = s->hold.p;
        size_t hn = s->hold.n;
        if (!s->in_call) {
            const char *open = hn ? memmem(h, hn, OPEN, sizeof OPEN - 1) : NULL;
            /* content up to the tag, or up to what could still become one */
            size_t safe = open ? (size_t)(open - h) : hn;
            if (!open)
                for (size_t k = sizeof OPEN - 1; k > 0; k--)
                    if (hn >= k && !memcmp(h + hn - k, OPEN, k)) {
                        safe = hn - k;
                        break;
                    }
            if (!s->seen_call && safe && api_buf_add(content, h, safe)) return -1;
            if (!open) {
                memmove(h, h + safe, hn - safe);
                s->hold.n = hn - safe;
                return 0;
            }
            s->in_call = 1;
            s->seen_call = 1;
            memmove(h, open + sizeof OPEN - 1, hn - (size_t)(open - h) - (sizeof OPEN - 1));
            s->hold.n = hn - (size_t)(open - h) - (sizeof OPEN - 1);
            continue;
        }
        const char *close = hn ? memmem(h, hn, CLOSE, sizeof CLOSE - 1) : NULL;
        if (!close) return 0;
        json_t *call = call_json(h, (size_t)(close - h), s->n_calls, req_id);
        if (call) {
            json_object_set_new(call, "index", json_integer(s->n_calls++));
            if (json_array_append_new(calls, call)) return -1;
        }
        size_t used = (size_t)(close - h) + sizeof CLOSE - 1;
        memmove(h, h + used, hn - used);
        s->hold.n = hn - used;
        s->in_call = 0;
    }
}
