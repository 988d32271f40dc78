/* server/tools: OpenAI tool calls in each model family's format:
 *
 *   Hermes (Qwen 2.5/3, and the generic format for templates without tool
 *   support):      <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 *   Llama 3.1/3.2: {"name": "f", "parameters": {...}}   (the whole reply)
 *   Mistral v3:    [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]
 *   Qwen3.5/3.6, Qwen3-Coder (XML):
 *                  <tool_call>\n<function=f>\n<parameter=k>\nvalue\n</parameter>\n</function>\n</tool_call>
 *                  (a string parameter's value as raw text, the others as JSON)
 *
 * The format follows from the chat template. Templates that render tools
 * themselves (a `tools` variable) get the definitions that way; the others
 * (SmolLM2, Gemma 3) get a system message that lists them and states the
 * Hermes format (docs/SERVER.md). The calls' grammar makes every call parse
 * and its arguments validate against the function's parameters: from the
 * first token under `required` or a named function, from the opening text
 * on under `auto`. The reply's text is split into content and tool_calls
 * here, whole or streamed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools.h"
#include "wire.h"
#include "base/util.h"

#define OPEN "<tool_call>"
#define CLOSE "</tool_call>"

typedef struct fmt_def {
    const char *open;  /* the text that opens the calls: the lazy grammar's trigger */
    int keep_open;     /* the open text is the call's own first bytes (Llama 3's JSON) */
    const char *close; /* closes each call (Hermes); NULL: the JSON value's end does */
    int array;         /* one JSON array of calls after the open text (Mistral) */
    const char *args;  /* the arguments' key */
    int special;       /* the open text is a control token whose text must show */
    int at_start;      /* calls only open the reply (after blanks, or Llama 3's <|python_tag|>) */
} fmt_def;

static const fmt_def FMT[] = {
    [TOOLS_HERMES] = {OPEN, 0, CLOSE, 0, "arguments", 0, 0},
    /* a JSON object may well appear in an answer: a call is the whole reply */
    [TOOLS_LLAMA3] = {"{\"name\"", 1, NULL, 0, "parameters", 0, 1},
    [TOOLS_MISTRAL] = {"[TOOL_CALLS]", 0, NULL, 1, "arguments", 1, 0},
    /* harmony's calls are messages (src/chat/harmony.c); the trigger is the recipient's */
    [TOOLS_HARMONY] = {" to=functions.", 0, NULL, 0, "arguments", 0, 0},
    /* the call between the tags is XML, not JSON (take_calls' xml_call) */
    [TOOLS_QWEN_XML] = {OPEN, 0, CLOSE, 0, "arguments", 0, 0},
};

int tools_format(const char *tmpl, int native) {
    if (!native || !tmpl) return TOOLS_HERMES;
    if (tl_chat_harmony(tmpl)) return TOOLS_HARMONY;
    if (strstr(tmpl, "[TOOL_CALLS]")) return TOOLS_MISTRAL;
    if (strstr(tmpl, "<function=")) return TOOLS_QWEN_XML;
    if (strstr(tmpl, "<|python_tag|>") || strstr(tmpl, "\"parameters\": dictionary")) return TOOLS_LLAMA3;
    return TOOLS_HERMES;
}

const char *tools_trigger(int fmt) { return FMT[fmt].open; }
int tools_special_text(int fmt) { return FMT[fmt].special; }
int tools_at_start(int fmt) { return FMT[fmt].at_start; }

/* Whether text[0..n) is blanks, after Llama 3's <|python_tag|> if there. */
static int blank_lead(const char *text, size_t n) { return tl_chat_call_lead(text, n, NULL) == n; }

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

/* GBNF text g with every rule name prefixed (p: "h3-"), appended to b: one
 * grammar per function beside the others. Strings, classes and comments are
 * copied as they are. */
static int gbnf_prefixed(api_buf *b, const char *g, const char *p) {
    const size_t pl = strlen(p);
    for (const char *c = g; *c;) {
        const char *s = c;
        if (*c == '"' || *c == '[') {
            const char close = *c == '"' ? '"' : ']';
            for (c++; *c && *c != close; c++)
                if (*c == '\\' && c[1]) c++;
            if (*c) c++;
        } else if (*c == '#') {
            while (*c && *c != '\n') c++;
        } else if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_') {
            while ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
                   *c == '-')
                c++;
            if (api_buf_add(b, p, pl)) return -1;
        } else {
            c++;
        }
        if (api_buf_add(b, s, (size_t)(c - s))) return -1;
    }
    return api_buf_add(b, "\n", 1);
}

/* Harmony's calls: a message to=functions.NAME whose body is the arguments,
 * the recipient before or after the channel. Under auto the grammar starts
 * at the recipient (the trigger); otherwise an analysis message may come
 * first. The control tokens it names (<|channel|>, <|message|>, <|start|>,
 * <|constrain|>, <|end|>) render as text (src/tokenize), so the grammar
 * matches the tokens themselves; <|call|> ends generation, as a grammar's end
 * allows. */
static int harmony_grammar(const tools_req *t, tl_grammar **out, tl_error *err) {
    static const char LAZY[] = "root ::= hcall\n",
                      EAGER[] = "root ::= (\"<|channel|>analysis<|message|>\" hthink \"<|end|><|start|>assistant\")? "
                                "\"<|channel|>commentary\"? hcall\n"
                                "hthink ::= ([^<] | \"<\" [^|])*\n",
                      HDR[] = "hhdr ::= \"<|channel|>commentary\"? (\" \" \"<|constrain|>\"? \"json\")? \"<|message|>\"\n"
                              "hcall ::= \" to=functions.\" (";
    api_buf b = {0};
    const char *root = t->mode == TOOLS_AUTO ? LAZY : EAGER;
    int bad = api_buf_add(&b, root, strlen(root)) || api_buf_add(&b, HDR, sizeof HDR - 1);
    size_t i;
    json_t *tool;
    int k = 0, rc = 0;
    json_array_foreach(t->tools, i, tool) {
        json_t *fn = json_object_get(tool, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (bad || rc || (t->only && strcmp(name, t->only))) continue;
        char head[128];
        snprintf(head, sizeof head, "%s\"%s\" hhdr h%d-root", k ? " | " : "", name, k);
        bad = api_buf_add(&b, head, strlen(head));
        k++;
    }
    bad = bad || api_buf_add(&b, ")\n", 2);
    k = 0;
    json_array_foreach(t->tools, i, tool) {
        json_t *fn = json_object_get(tool, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (bad || rc || (t->only && strcmp(name, t->only))) continue;
        json_t *params = json_object_get(fn, "parameters");
        char *text = params && json_is_object(params) ? json_dumps(params, JSON_COMPACT) : NULL;
        char *gbnf = NULL, pre[16];
        rc = tl_json_schema_to_gbnf(text ? text : "{\"type\":\"object\"}", text ? strlen(text) : 17, &gbnf, err);
        snprintf(pre, sizeof pre, "h%d-", k++);
        if (!rc) bad = gbnf_prefixed(&b, gbnf, pre);
        free(text);
        tl_free(gbnf);
    }
    if (!rc && bad) rc = tl_fail(err, TL_ERR_NOMEM, "out of memory");
    if (!rc) rc = tl_grammar_parse(b.p, b.n, out, err);
    api_buf_free(&b);
    return rc;
}

/* Whether a parameter's schema is a string, written as raw text in XML. */
static int string_param(json_t *ps) {
    json_t *ty = json_object_get(ps, "type"), *en = json_object_get(ps, "enum");
    if (json_is_string(ty)) return !strcmp(json_string_value(ty), "string");
    if (ty || !json_is_array(en) || !json_array_size(en)) return 0;
    size_t i;
    json_t *v;
    json_array_foreach(en, i, v) if (!json_is_string(v)) return 0;
    return 1;
}

json_t *tools_string_params(json_t *tools) {
    json_t *out = json_object();
    size_t i;
    json_t *tool;
    json_array_foreach(tools, i, tool) {
        json_t *fn = json_object_get(tool, "function"), *list = json_array();
        json_t *props = json_object_get(json_object_get(fn, "parameters"), "properties");
        const char *k;
        json_t *ps;
        json_object_foreach(props, k, ps) if (string_param(ps)) json_array_append_new(list, json_string(k));
        if (!out || !list || json_object_set_new(out, json_string_value(json_object_get(fn, "name")), list)) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* GBNF for a literal (quoted, escaped) into b. */
static int gbnf_lit(api_buf *b, const char *s) {
    int bad = api_buf_add(b, "\"", 1);
    for (; *s && !bad; s++) {
        char e[8];
        if (*s == '"' || *s == '\\') snprintf(e, sizeof e, "\\%c", *s);
        else if (*s == '\n') snprintf(e, sizeof e, "\\n");
        else snprintf(e, sizeof e, "%c", *s);
        bad = api_buf_add(b, e, strlen(e));
    }
    return bad || api_buf_add(b, "\"", 1);
}

/* Qwen3.5's XML calls: per function its parameters in the schema's order,
 * the required ones always there; a string's value raw text (no newline
 * before a '<'; its enum's values, or up to maxLength characters), any other
 * value JSON by its schema. */
static int xml_grammar(const tools_req *t, tl_grammar **out, tl_error *err) {
    api_buf b = {0};
    int bad = 0, rc = 0, k = 0;
    bad |= api_buf_add(&b, "root ::= \"" OPEN "\\n\" xcall \"" CLOSE "\"", strlen("root ::= \"" OPEN "\\n\" xcall \"" CLOSE "\""));
    if (t->parallel) {
        static const char MORE[] = " (\"\\n" OPEN "\\n\" xcall \"" CLOSE "\")*";
        bad |= api_buf_add(&b, MORE, sizeof MORE - 1);
    }
    static const char TEXT[] = "\nxtext ::= ([^\\n<] | \"<\" [^/] | \"\\n\" [^<])*\nxcall ::= ";
    bad |= api_buf_add(&b, TEXT, sizeof TEXT - 1);
    size_t i;
    json_t *tool;
    json_array_foreach(t->tools, i, tool) {
        const char *name = json_string_value(json_object_get(json_object_get(tool, "function"), "name"));
        if (t->only && strcmp(name, t->only)) continue;
        char r[32];
        snprintf(r, sizeof r, "%sx%d", k ? " | " : "", k);
        bad |= api_buf_add(&b, r, strlen(r));
        k++;
    }
    bad |= api_buf_add(&b, "\n", 1);
    k = 0;
    json_array_foreach(t->tools, i, tool) {
        json_t *fn = json_object_get(tool, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (t->only && strcmp(name, t->only)) continue;
        json_t *params = json_object_get(fn, "parameters"), *props = json_object_get(params, "properties"),
               *req = json_object_get(params, "required");
        char r[64];
        snprintf(r, sizeof r, "x%d ::= ", k);
        api_buf head = {0};
        bad |= api_buf_add(&b, r, strlen(r));
        char open_fn[160];
        snprintf(open_fn, sizeof open_fn, "<function=%s>\n", name);
        bad |= gbnf_lit(&b, open_fn);
        const char *pk;
        json_t *ps;
        int j = 0;
        json_object_foreach(props, pk, ps) {
            int required = 0;
            size_t q;
            json_t *rv;
            json_array_foreach(req, q, rv) required |= json_is_string(rv) && !strcmp(json_string_value(rv), pk);
            char open_p[160];
            snprintf(open_p, sizeof open_p, "<parameter=%s>\n", pk);
            bad |= api_buf_add(&b, " (", 2) || gbnf_lit(&b, open_p);
            snprintf(r, sizeof r, " x%d-%d \"\\n</parameter>\\n\")%s", k, j, required ? "" : "?");
            bad |= api_buf_add(&b, r, strlen(r));
            /* the value's rule */
            snprintf(r, sizeof r, "x%d-%d ::= ", k, j);
            bad |= api_buf_add(&head, r, strlen(r));
            json_t *en = json_object_get(ps, "enum"), *ml = json_object_get(ps, "maxLength");
            if (string_param(ps) && json_is_array(en)) {
                size_t e;
                json_t *ev;
                json_array_foreach(en, e, ev) bad |= (e && api_buf_add(&head, " | ", 3)) || gbnf_lit(&head, json_string_value(ev));
                bad |= api_buf_add(&head, "\n", 1);
            } else if (string_param(ps)) {
                if (json_is_integer(ml) && json_integer_value(ml) >= 0 && json_integer_value(ml) < 4096)
                    snprintf(r, sizeof r, "[^\\n<]{0,%d}\n", (int)json_integer_value(ml));
                else
                    snprintf(r, sizeof r, "xtext\n");
                bad |= api_buf_add(&head, r, strlen(r));
            } else {
                char *text = json_dumps(ps, JSON_COMPACT), *gbnf = NULL, pre[32];
                if (!rc) rc = tl_json_schema_to_gbnf(text ? text : "{}", text ? strlen(text) : 2, &gbnf, err);
                snprintf(pre, sizeof pre, "x%d-%d-", k, j);
                snprintf(r, sizeof r, "x%d-%d-root\n", k, j);
                bad |= api_buf_add(&head, r, strlen(r));
                if (!rc) bad |= gbnf_prefixed(&head, gbnf, pre);
                free(text);
                tl_free(gbnf);
            }
            j++;
        }
        bad |= api_buf_add(&b, " \"</function>\\n\"\n", strlen(" \"</function>\\n\"\n"));
        bad |= head.n && api_buf_add(&b, head.p, head.n);
        api_buf_free(&head);
        k++;
    }
    if (!rc && bad) rc = tl_fail(err, TL_ERR_NOMEM, "out of memory");
    if (!rc) rc = tl_grammar_parse(b.p, b.n, out, err);
    api_buf_free(&b);
    return rc;
}

int tools_grammar(const tools_req *t, int fmt, tl_grammar **out, tl_error *err) {
    *out = NULL;
    if (fmt == TOOLS_HARMONY) return harmony_grammar(t, out, err);
    if (fmt == TOOLS_QWEN_XML) return xml_grammar(t, out, err);
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
        const char *ak = FMT[fmt].args;
        json_t *one = p ? json_pack("{s:s, s:{s:{s:s}, s:o}, s:[s,s], s:b}", "type", "object", "properties", "name",
                                    "const", name, ak, p, "required", "name", ak, "additionalProperties", 0)
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
    static const char *const HEAD[][2] = {
        [TOOLS_HERMES] = {"root ::= \"" OPEN "\" tcnl tcal tcnl \"" CLOSE "\"\n",
                          "root ::= \"" OPEN "\" tcnl tcal tcnl \"" CLOSE "\" (tcnl \"" OPEN "\" tcnl tcal tcnl \""
                          CLOSE "\")*\n"},
        /* Llama 3.1's template renders one call per message: one it is */
        [TOOLS_LLAMA3] = {"root ::= tcal\n", "root ::= tcal\n"},
        [TOOLS_MISTRAL] = {"root ::= \"[TOOL_CALLS]\" \" \"? \"[\" tcal \"]\"\n",
                           "root ::= \"[TOOL_CALLS]\" \" \"? \"[\" tcal (\",\" \" \"? tcal)* \"]\"\n"},
    };
    static const char NL[] = "tcnl ::= \"\\n\"?\n";
    const char *head = HEAD[fmt][t->parallel];
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

/* One call's JSON value -> {id, type, function: {name, arguments}} with the
 * arguments as a JSON string, as OpenAI sends them. Mistral's template wants
 * ids of nine letters and digits back. */
static json_t *call_of(int fmt, json_t *o, int index, const char *req_id) {
    json_t *name = json_object_get(o, "name"), *args = json_object_get(o, FMT[fmt].args);
    if (!json_is_string(name) || !args) return NULL;
    char *a = json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY);
    const char *rid = req_id + (strncmp(req_id, "chatcmpl-", 9) ? 0 : 9);
    char id[96];
    if (fmt == TOOLS_MISTRAL) {
        unsigned long long h = 1469598103934665603ull; /* FNV-1a of the request id and index */
        for (const char *c = rid; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
        h = (h ^ (unsigned)index) * 1099511628211ull;
        static const char AL[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        for (int i = 0; i < 9; i++, h /= 62) id[i] = AL[h % 62];
        id[9] = 0;
    } else {
        snprintf(id, sizeof id, "call_%.60s_%d", rid, index);
    }
    json_t *c = a ? json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function", "name", name,
                              "arguments", a)
                  : NULL;
    free(a);
    return c;
}

/* One XML call, s[0..n) between the tags, as {"name", "arguments"}: a
 * string parameter (strs) keeps its text, another is parsed as JSON (its
 * text if it does not parse); NULL if it is not a call. */
static json_t *xml_call(const char *s, size_t n, json_t *strs) {
    while (n && (*s == '\n' || *s == ' ')) s++, n--;
    static const char FN[] = "<function=", PA[] = "<parameter=", PE[] = "</parameter>";
    if (n < sizeof FN - 1 || memcmp(s, FN, sizeof FN - 1)) return NULL;
    const char *p = s + sizeof FN - 1, *end = s + n, *gt = memchr(p, '>', (size_t)(end - p));
    if (!gt || gt == p) return NULL;
    json_t *name = json_stringn(p, (size_t)(gt - p)), *args = json_object();
    json_t *str_list = name ? json_object_get(strs, json_string_value(name)) : NULL;
    for (p = gt + 1; name && args;) {
        const char *a = memmem(p, (size_t)(end - p), PA, sizeof PA - 1);
        if (!a) break;
        const char *kb = a + sizeof PA - 1, *ke = memchr(kb, '>', (size_t)(end - kb));
        if (!ke) break;
        const char *vb = ke + 1, *ve = memmem(vb, (size_t)(end - vb), PE, sizeof PE - 1);
        if (!ve) break;
        p = ve + sizeof PE - 1;
        if (vb < ve && *vb == '\n') vb++; /* the value sits between newlines */
        if (ve > vb && ve[-1] == '\n') ve--;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(ke - kb < 255 ? ke - kb : 255), kb);
        int is_str = 0;
        size_t q;
        json_t *sv;
        json_array_foreach(str_list, q, sv) is_str |= !strcmp(json_string_value(sv), key);
        json_t *v = is_str ? NULL : json_loadb(vb, (size_t)(ve - vb), JSON_DECODE_ANY, NULL);
        if (!v) v = json_stringn(vb, (size_t)(ve - vb));
        if (!v || json_object_set_new(args, key, v)) {
            json_decref(args);
            args = NULL;
        }
    }
    json_t *o = name && args ? json_pack("{s:o, s:o}", "name", name, "arguments", args) : NULL;
    if (!o) {
        json_decref(name);
        json_decref(args);
    }
    return o;
}

/* The calls in s[0..n), which starts just after the open text (at it, for
 * Llama 3): appended to calls (with "index" if indexed), *n_calls counting
 * the reply's calls so far. Returns the bytes they took, 0 while they are
 * incomplete, -1 if they cannot parse, -2 out of memory. */
static long take_calls(int fmt, const char *s, size_t n, const char *req_id, json_t *strs, json_t *calls,
                       int *n_calls, int indexed) {
    const fmt_def *f = &FMT[fmt];
    json_t *v = NULL;
    size_t used;
    if (fmt == TOOLS_QWEN_XML) {
        const char *c = memmem(s, n, f->close, strlen(f->close));
        if (!c) return 0;
        v = xml_call(s, (size_t)(c - s), strs);
        used = (size_t)(c - s) + strlen(f->close);
    } else if (f->close) {
        const char *c = memmem(s, n, f->close, strlen(f->close));
        if (!c) return 0;
        v = json_loadb(s, (size_t)(c - s), 0, NULL);
        used = (size_t)(c - s) + strlen(f->close);
    } else {
        json_error_t je;
        v = json_loadb(s, n, JSON_DISABLE_EOF_CHECK, &je);
        if (!v) return je.position >= (int)n || strstr(je.text, "end of file") ? 0 : -1;
        used = (size_t)je.position;
    }
    json_t *list = f->array ? v : NULL;
    if (f->array && !json_is_array(v)) list = NULL;
    size_t nv = f->array ? json_array_size(list) : 1;
    int ok = v != NULL && (!f->array || list);
    for (size_t i = 0; ok && i < nv; i++) {
        const int k = *n_calls;
        json_t *c = call_of(fmt, f->array ? json_array_get(list, i) : v, k, req_id);
        if (!c) continue; /* not a call: skipped */
        if ((indexed && json_object_set_new(c, "index", json_integer(k))) || json_array_append_new(calls, c)) {
            json_decref(v);
            return -2;
        }
        (*n_calls)++;
    }
    json_decref(v);
    return (long)used;
}

json_t *tools_split(int fmt, const char *text, size_t n, const char *req_id, json_t *strs, size_t *content_len) {
    const fmt_def *f = &FMT[fmt];
    const size_t ol = strlen(f->open);
    const char *open = memmem(text, n, f->open, ol);
    if (open && f->at_start && !blank_lead(text, (size_t)(open - text))) open = NULL;
    *content_len = open ? (size_t)(open - text) : n;
    if (!open) return NULL;
    while (*content_len && (text[*content_len - 1] == '\n' || text[*content_len - 1] == ' ')) (*content_len)--;
    json_t *calls = json_array();
    const char *p = open, *end = text + n;
    int k = 0;
    while (calls && p && p < end) {
        const char *b = f->keep_open ? p : p + ol;
        long used = take_calls(fmt, b, (size_t)(end - b), req_id, strs, calls, &k, 0);
        if (used == -2) {
            json_decref(calls);
            return NULL;
        }
        if (used <= 0) break;
        p = b + used;
        p = memmem(p, (size_t)(end - p), f->open, ol);
    }
    if (calls && !json_array_size(calls)) {
        json_decref(calls);
        *content_len = n;
        return NULL;
    }
    return calls;
}

json_t *tools_harmony_call(const char *name, const char *args, size_t n, int k, int index, const char *req_id) {
    while (n && (*args == ' ' || *args == '\n')) args++, n--;
    while (n && (args[n - 1] == ' ' || args[n - 1] == '\n')) n--;
    json_t *v = n ? json_loadb(args, n, JSON_DECODE_ANY, NULL) : json_object();
    char *a = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_decref(v);
    const char *rid = req_id + (strncmp(req_id, "chatcmpl-", 9) ? 0 : 9);
    char id[96];
    snprintf(id, sizeof id, "call_%.60s_%d", rid, k);
    json_t *c = json_pack("{s:s, s:s, s:{s:s, s:s%}}", "id", id, "type", "function", "function", "name", name,
                          "arguments", a ? a : args, a ? strlen(a) : n);
    free(a);
    if (c && index >= 0 && json_object_set_new(c, "index", json_integer(index))) {
        json_decref(c);
        return NULL;
    }
    return c;
}

const char *tools_lost_open(int fmt) { return FMT[fmt].keep_open ? "" : FMT[fmt].open; }

int tools_stream(tools_stream_st *s, int fmt, const char *text, size_t n, const char *req_id, json_t *strs,
                 api_buf *content, json_t *calls) {
    const fmt_def *f = &FMT[fmt];
    const size_t ol = strlen(f->open);
    if (n && api_buf_add(&s->hold, text, n)) return -1;
    for (;;) {
        char *h = s->hold.p;
        size_t hn = s->hold.n;
        if (!hn) return 0; /* nothing held (h may be NULL) */
        if (!s->in_call && s->plain) { /* decided: no calls in this reply */
            if (hn && api_buf_add(content, h, hn)) return -1;
            s->hold.n = 0;
            return 0;
        }
        if (!s->in_call) {
            const char *open = hn ? memmem(h, hn, f->open, ol) : NULL;
            if (f->at_start && !s->seen_call) {
                /* held while it may still be blanks (after a <|python_tag|>)
                 * and the open text; anything else: no call comes */
                int partial = 0;
                const size_t lead = tl_chat_call_lead(h, hn, &partial);
                if (partial) return 0;
                const size_t rest = hn - lead;
                if (memcmp(h + lead, f->open, rest < ol ? rest : ol)) {
                    s->plain = 1;
                    continue;
                }
                if (rest < ol) return 0;
            }
            /* content up to the open text, or up to what could still become it */
            size_t safe = open ? (size_t)(open - h) : hn;
            if (!open)
                for (size_t k = ol; k > 0; k--)
                    if (hn >= k && !memcmp(h + hn - k, f->open, k)) {
                        safe = hn - k;
                        break;
                    }
            /* blanks before a call are not content (a whole reply trims them) */
            while (safe && (h[safe - 1] == '\n' || h[safe - 1] == ' ')) safe--;
            if (!s->seen_call && safe && api_buf_add(content, h, safe)) return -1;
            if (!open) {
                memmove(h, h + safe, hn - safe);
                s->hold.n = hn - safe;
                return 0;
            }
            s->in_call = 1;
            s->seen_call = 1;
            const size_t skip = (size_t)(open - h) + (f->keep_open ? 0 : ol);
            memmove(h, h + skip, hn - skip);
            s->hold.n = hn - skip;
            continue;
        }
        long used = take_calls(fmt, h, hn, req_id, strs, calls, &s->n_calls, 1);
        if (used == -2) return -1;
        /* incomplete: wait for more; cannot parse: held to the end, which
         * treats it as a whole reply does */
        if (used <= 0) return 0;
        memmove(h, h + used, hn - (size_t)used);
        s->hold.n = hn - (size_t)used;
        s->in_call = 0;
    }
}
