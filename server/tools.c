/* server/tools: OpenAI tool calls in each model family's format:
 *
 *   Hermes (Qwen 2.5/3, and the generic format for templates without tool
 *   support):      <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 *   Llama 3.1/3.2: {"name": "f", "parameters": {...}}   (the whole reply)
 *   Mistral v3:    [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]
 *   Qwen3.5/3.6, Qwen3-Coder (XML):
 *                  <tool_call>\n<function=f>\n<parameter=k>\nvalue\n</parameter>\n</function>\n</tool_call>
 *                  (a string parameter's value as raw text, the others as JSON)
 *   Gemma 4:       <|tool_call>call:f{k:<|"|>text<|"|>,n:3,o:{a:[1,true]}}<tool_call|>
 *                  (keys bare, strings between <|"|> markers, the rest as JSON)
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
#include <strings.h>

#include "tools.h"
#include "wire.h"
#include "base/util.h"

#define OPEN "<tool_call>"
#define CLOSE "</tool_call>"
#define G4_OPEN "<|tool_call>"
#define G4_CLOSE "<tool_call|>"
#define G4_STR "<|\"|>" /* Gemma 4's string quote */

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
    /* Gemma's own syntax between the tags (g4_call); its markers are tokens
     * that llama.cpp keeps in the text, whatever their type in a vocabulary */
    [TOOLS_GEMMA4] = {G4_OPEN, 0, G4_CLOSE, 0, "arguments", 1, 0},
};

int tools_gemma4(const char *tmpl) { return tmpl && strstr(tmpl, G4_OPEN "call:"); }
/* the newer template scans a call's role "tool" results itself (it says so) */
int tools_gemma4_legacy(const char *tmpl) {
    return tools_gemma4(tmpl) && !strstr(tmpl, "OpenAI Chat Completions");
}

int tools_format(const char *tmpl, int native) {
    if (!native || !tmpl) return TOOLS_HERMES;
    if (tl_chat_harmony(tmpl)) return TOOLS_HARMONY;
    if (tools_gemma4(tmpl)) return TOOLS_GEMMA4;
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

/* An object's keys in the order Gemma 4's template writes them (jinja's
 * dictsort: by name, case-folded, ties in the object's order): at most cap
 * of them; returns how many it has (more than cap: not all listed). */
static size_t g4_sorted_keys(json_t *o, const char **keys, size_t cap) {
    size_t n = 0;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (n < cap) keys[n] = k;
        n++;
    }
    for (size_t i = 1; i < n && n <= cap; i++) { /* insertion sort: stable */
        const char *x = keys[i];
        size_t j = i;
        for (; j > 0 && strcasecmp(keys[j - 1], x) > 0; j--) keys[j] = keys[j - 1];
        keys[j] = x;
    }
    return n;
}

/* ---- Gemma 4's calls: the grammar ---- */

/* Gemma's values without a schema, and its strings: raw text between the
 * <|"|> markers, without a '<' that could start one (nor a last '<'). */
static const char G4_GENERIC[] =
    "g4-value ::= g4-str | g4-num | \"true\" | \"false\" | \"null\" | g4-dict | g4-list\n"
    "g4-str ::= \"<|\\\"|>\" g4-chars \"<|\\\"|>\"\n"
    "g4-chars ::= ([^<] | \"<\" [^|<])*\n"
    "g4-num ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n"
    "g4-dict ::= \"{\" (g4-kv (\",\" g4-kv)*)? \"}\"\n"
    "g4-kv ::= [A-Za-z_] [A-Za-z0-9_.$-]* \":\" g4-value\n"
    "g4-list ::= \"[\" (g4-value (\",\" g4-value)*)? \"]\"\n";

typedef struct g4gen {
    api_buf b;    /* the rules so far */
    int n;        /* schema rules made (g4s-N), JSON sub-grammars (g4jN-) */
    int bad;      /* out of memory */
    int rc;       /* a schema the JSON converter refused (err says why) */
    tl_error *err;
} g4gen;

/* A JSON value in Gemma's syntax, as a GBNF literal's text (an enum's or
 * const's value): keys bare in the template's order, strings quoted. */
static int g4_text(api_buf *b, json_t *v, int depth) {
    if (depth > 32) return -1;
    if (json_is_string(v))
        return api_buf_add(b, G4_STR, sizeof G4_STR - 1) || api_buf_add(b, json_string_value(v), json_string_length(v)) ||
               api_buf_add(b, G4_STR, sizeof G4_STR - 1);
    if (json_is_array(v)) {
        int bad = api_buf_add(b, "[", 1);
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) bad = bad || (i && api_buf_add(b, ",", 1)) || g4_text(b, x, depth + 1);
        return bad || api_buf_add(b, "]", 1);
    }
    if (json_is_object(v)) {
        const char *keys[64];
        size_t n = g4_sorted_keys(v, keys, 64);
        int bad = n > 64 || api_buf_add(b, "{", 1);
        for (size_t i = 0; !bad && i < n; i++)
            bad = (i && api_buf_add(b, ",", 1)) || api_buf_add(b, keys[i], strlen(keys[i])) || api_buf_add(b, ":", 1) ||
                  g4_text(b, json_object_get(v, keys[i]), depth + 1);
        return bad || api_buf_add(b, "}", 1);
    }
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    int bad = !t || api_buf_add(b, t, strlen(t));
    free(t);
    return bad;
}

/* A literal (g4_text of v) into the rule r. */
static int g4_lit(api_buf *r, json_t *v) {
    api_buf t = {0};
    int bad = g4_text(&t, v, 0) || api_buf_add(&t, "", 1) || gbnf_lit(r, t.p);
    api_buf_free(&t);
    return bad;
}

static void g4_schema(g4gen *g, json_t *s, int depth, char *name);

/* The schema's one type, or NULL; *many: its "type" is a list. */
static const char *g4_type(json_t *s, int *many) {
    json_t *ty = json_object_get(s, "type");
    *many = json_is_array(ty);
    if (json_is_string(ty)) return json_string_value(ty);
    if (json_object_get(s, "properties")) return "object";
    if (json_object_get(s, "items")) return "array";
    return NULL;
}

/* An object's keys in the order the template writes them (dictsort),
 * optional ones optional, each value by its schema. */
static void g4_object(g4gen *g, json_t *s, int depth, api_buf *r) {
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    const char *keys[64];
    size_t n = json_is_object(props) ? g4_sorted_keys(props, keys, 64) : 0;
    if (!n || n > 64) { /* no properties (or too many to list): any object */
        g->bad |= api_buf_add(r, "g4-dict", 7);
        return;
    }
    int must[64], first_req = -1;
    api_buf lits[64]; /* each key's item: "key:" value-rule, as GBNF (NUL-terminated) */
    memset(lits, 0, sizeof lits);
    for (size_t i = 0; i < n; i++) {
        char sub[32];
        g4_schema(g, json_object_get(props, keys[i]), depth + 1, sub);
        g->bad |= gbnf_lit(&lits[i], keys[i]) || api_buf_add(&lits[i], " \":\" ", 5) ||
                  api_buf_add(&lits[i], sub, strlen(sub)) || api_buf_add(&lits[i], "", 1);
        must[i] = 0;
        size_t q;
        json_t *rv;
        json_array_foreach(req, q, rv) must[i] |= json_is_string(rv) && !strcmp(json_string_value(rv), keys[i]);
        if (must[i] && first_req < 0) first_req = (int)i;
    }
    for (size_t i = 0; i < n; i++) g->bad |= !lits[i].p;
    if (g->bad) {
        for (size_t i = 0; i < n; i++) api_buf_free(&lits[i]);
        return;
    }
    g->bad |= api_buf_add(r, "\"{\" ", 4);
    if (first_req >= 0) { /* optional keys before the first required one bring their comma */
        for (int i = 0; i < first_req; i++)
            g->bad |= api_buf_add(r, "(", 1) || api_buf_add(r, lits[i].p, strlen(lits[i].p)) ||
                      api_buf_add(r, " \",\")? ", 7);
        g->bad |= api_buf_add(r, lits[first_req].p, strlen(lits[first_req].p));
        for (size_t i = (size_t)first_req + 1; i < n; i++)
            g->bad |= api_buf_add(r, must[i] ? " \",\" " : " (\",\" ", must[i] ? 5 : 6) ||
                      api_buf_add(r, lits[i].p, strlen(lits[i].p)) || (!must[i] && api_buf_add(r, ")?", 2));
    } else { /* all optional: the first present one, then any of those after it */
        g->bad |= api_buf_add(r, "(", 1);
        for (size_t i = 0; i < n; i++) {
            g->bad |= (i && api_buf_add(r, " | ", 3)) || api_buf_add(r, lits[i].p, strlen(lits[i].p));
            for (size_t j = i + 1; j < n; j++)
                g->bad |= api_buf_add(r, " (\",\" ", 6) || api_buf_add(r, lits[j].p, strlen(lits[j].p)) ||
                          api_buf_add(r, ")?", 2);
        }
        g->bad |= api_buf_add(r, ")?", 2);
    }
    g->bad |= api_buf_add(r, " \"}\"", 4);
    for (size_t i = 0; i < n; i++) api_buf_free(&lits[i]);
}

/* An array: its items by their schema, within minItems and maxItems. */
static void g4_array(g4gen *g, json_t *s, int depth, api_buf *r) {
    json_t *mi = json_object_get(s, "minItems"), *ma = json_object_get(s, "maxItems");
    const long long lo = json_is_integer(mi) ? json_integer_value(mi) : 0,
                    hi = json_is_integer(ma) ? json_integer_value(ma) : -1;
    char it[32], t[160];
    json_t *items = json_object_get(s, "items");
    if (json_is_object(items)) g4_schema(g, items, depth + 1, it);
    else snprintf(it, sizeof it, "g4-value");
    if (hi == 0 || (hi > 0 && hi < lo)) {
        snprintf(t, sizeof t, "\"[\" \"]\"");
    } else {
        const long long a = lo > 0 ? lo - 1 : 0, b = hi > 0 ? hi - 1 : -1;
        char rep[48];
        if (a > 1000 || b > 1000) snprintf(rep, sizeof rep, "*");
        else if (b < 0) snprintf(rep, sizeof rep, a ? "{%lld,}" : "*", a);
        else snprintf(rep, sizeof rep, "{%lld,%lld}", a, b);
        snprintf(t, sizeof t, "\"[\" %s%s (\",\" %s)%s%s \"]\"", lo > 0 ? "" : "(", it, it, rep, lo > 0 ? "" : ")?");
    }
    g->bad |= api_buf_add(r, t, strlen(t));
}

/* A scalar that Gemma writes as JSON (numbers, booleans, null): the JSON
 * Schema converter's grammar, its rules prefixed. */
static void g4_json(g4gen *g, json_t *s, api_buf *r) {
    char *text = json_dumps(s, JSON_COMPACT), *gbnf = NULL, pre[32];
    if (!text) {
        g->bad = 1;
        return;
    }
    if (!g->rc) g->rc = tl_json_schema_to_gbnf(text, strlen(text), &gbnf, g->err);
    snprintf(pre, sizeof pre, "g4j%d-", g->n++);
    if (!g->rc) g->bad |= gbnf_prefixed(&g->b, gbnf, pre) || api_buf_add(r, pre, strlen(pre)) || api_buf_add(r, "root", 4);
    free(text);
    tl_free(gbnf);
}

/* A rule for the values schema s allows, in Gemma's syntax; its name into
 * name[32]. */
static void g4_schema(g4gen *g, json_t *s, int depth, char *name) {
    if (!json_is_object(s) || depth > 16) {
        snprintf(name, 32, "g4-value");
        return;
    }
    snprintf(name, 32, "g4s-%d", g->n++);
    api_buf r = {0};
    json_t *nu = json_object_get(s, "nullable");
    if (nu) { /* OpenAPI's nullable, which Gemma's template writes: the value, or null if true */
        json_t *rest = json_copy(s);
        char sub[32] = "g4-value";
        g->bad |= !rest || json_object_del(rest, "nullable");
        if (!g->bad) g4_schema(g, rest, depth + 1, sub);
        json_decref(rest);
        g->bad |= api_buf_add(&r, name, strlen(name)) || api_buf_add(&r, " ::= ", 5) ||
                  api_buf_add(&r, sub, strlen(sub)) || (json_is_true(nu) && api_buf_add(&r, " | \"null\"", 9)) ||
                  api_buf_add(&r, "\n", 1) || api_buf_add(&g->b, r.p, r.n);
        api_buf_free(&r);
        return;
    }
    int many = 0;
    const char *ty = g4_type(s, &many);
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const"),
           *any = json_object_get(s, "anyOf") ? json_object_get(s, "anyOf") : json_object_get(s, "oneOf");
    g->bad |= api_buf_add(&r, name, strlen(name)) || api_buf_add(&r, " ::= ", 5);
    if (json_is_array(en) && json_array_size(en)) {
        size_t i;
        json_t *v;
        json_array_foreach(en, i, v) g->bad |= (i && api_buf_add(&r, " | ", 3)) || g4_lit(&r, v);
    } else if (cn) {
        g->bad |= g4_lit(&r, cn);
    } else if (json_is_array(any) && json_array_size(any)) {
        size_t i;
        json_t *v;
        json_array_foreach(any, i, v) {
            char sub[32];
            g4_schema(g, v, depth + 1, sub);
            g->bad |= (i && api_buf_add(&r, " | ", 3)) || api_buf_add(&r, sub, strlen(sub));
        }
    } else if (many) { /* "type": [...]: one alternative per type */
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(s, "type"), i, v) {
            json_t *one = json_copy(s);
            char sub[32];
            g->bad |= !one || json_object_set(one, "type", v);
            if (one) g4_schema(g, one, depth + 1, sub);
            else snprintf(sub, sizeof sub, "g4-value");
            json_decref(one);
            g->bad |= (i && api_buf_add(&r, " | ", 3)) || api_buf_add(&r, sub, strlen(sub));
        }
    } else if (ty && !strcmp(ty, "string")) {
        json_t *ml = json_object_get(s, "maxLength"), *nl = json_object_get(s, "minLength");
        const long long hi = json_is_integer(ml) ? json_integer_value(ml) : -1,
                        lo = json_is_integer(nl) ? json_integer_value(nl) : 0;
        char t[96];
        if ((hi >= 0 && hi <= 1000) || (lo > 0 && lo <= 1000)) /* counted: text without '<' */
            snprintf(t, sizeof t, hi >= 0 && hi <= 1000 ? "\"<|\\\"|>\" [^<]{%lld,%lld} \"<|\\\"|>\""
                                                        : "\"<|\\\"|>\" [^<]{%lld,} \"<|\\\"|>\"",
                     lo, hi);
        else
            snprintf(t, sizeof t, "g4-str");
        g->bad |= api_buf_add(&r, t, strlen(t));
    } else if (ty && !strcmp(ty, "object")) {
        g4_object(g, s, depth, &r);
    } else if (ty && !strcmp(ty, "array")) {
        g4_array(g, s, depth, &r);
    } else if (ty && (!strcmp(ty, "integer") || !strcmp(ty, "number") || !strcmp(ty, "boolean") || !strcmp(ty, "null"))) {
        g4_json(g, s, &r);
    } else {
        g->bad |= api_buf_add(&r, "g4-value", 8);
    }
    g->bad |= api_buf_add(&r, "\n", 1) || api_buf_add(&g->b, r.p, r.n);
    api_buf_free(&r);
}

/* Gemma 4's calls: <|tool_call>call:NAME{...}<tool_call|>, one after
 * another when parallel; a function's arguments by its parameters. */
static int g4_grammar(const tools_req *t, tl_grammar **out, tl_error *err) {
    g4gen g = {{0}, 0, 0, 0, err};
    api_buf root = {0};
    g.bad |= api_buf_add(&root, "root ::= g4-call", 16) || (t->parallel && api_buf_add(&root, "+", 1)) ||
             api_buf_add(&root, "\ng4-call ::= \"" G4_OPEN "call:\" (", strlen("\ng4-call ::= \"" G4_OPEN "call:\" (")) ||
             api_buf_add(&g.b, G4_GENERIC, sizeof G4_GENERIC - 1);
    size_t i;
    json_t *tool;
    int k = 0;
    json_array_foreach(t->tools, i, tool) {
        json_t *fn = json_object_get(tool, "function"), *params = json_object_get(fn, "parameters");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (t->only && strcmp(name, t->only)) continue;
        char sub[32];
        if (json_is_object(params)) {
            g4_schema(&g, params, 0, sub);
        } else {
            snprintf(sub, sizeof sub, "g4-dict");
        }
        g.bad |= (k++ && api_buf_add(&root, " | ", 3)) || gbnf_lit(&root, name) || api_buf_add(&root, " ", 1) ||
                 api_buf_add(&root, sub, strlen(sub));
    }
    g.bad |= api_buf_add(&root, ") \"" G4_CLOSE "\"\n", strlen(") \"" G4_CLOSE "\"\n")) || api_buf_add(&root, g.b.p, g.b.n);
    int rc = g.rc;
    if (!rc && g.bad) rc = tl_fail(err, TL_ERR_NOMEM, "out of memory");
    if (!rc) rc = tl_grammar_parse(root.p, root.n, out, err);
    api_buf_free(&root);
    api_buf_free(&g.b);
    return rc;
}

int tools_grammar(const tools_req *t, int fmt, tl_grammar **out, tl_error *err) {
    *out = NULL;
    if (fmt == TOOLS_HARMONY) return harmony_grammar(t, out, err);
    if (fmt == TOOLS_QWEN_XML) return xml_grammar(t, out, err);
    if (fmt == TOOLS_GEMMA4) return g4_grammar(t, out, err);
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

/* ---- Gemma 4's calls: the reply ---- */

enum { G4_OK = 0, G4_MORE = 1, G4_BAD = -1, G4_NOMEM = -2 };

static void g4_blanks(const char **p, const char *e) {
    while (*p < e && (**p == ' ' || **p == '\n' || **p == '\t' || **p == '\r')) (*p)++;
}

/* Whether s[0..n) is lit, or (G4_MORE) could still become it. */
static int g4_expect(const char *s, size_t n, const char *lit) {
    const size_t l = strlen(lit);
    if (n < l) return memcmp(s, lit, n) ? G4_BAD : G4_MORE;
    return memcmp(s, lit, l) ? G4_BAD : G4_OK;
}

static int g4_value(const char **p, const char *e, int depth, json_t **out);

/* A key (bare, or between the string markers) and its ':'. */
static int g4_key(const char **p, const char *e, char *key, size_t cap) {
    const char *s = *p;
    if (s < e && *s == '<') {
        int rc = g4_expect(s, (size_t)(e - s), G4_STR);
        if (rc) return rc;
        s += sizeof G4_STR - 1;
        const char *q = memmem(s, (size_t)(e - s), G4_STR, sizeof G4_STR - 1);
        if (!q) return G4_MORE;
        if ((size_t)(q - s) >= cap) return G4_BAD;
        memcpy(key, s, (size_t)(q - s));
        key[q - s] = 0;
        s = q + sizeof G4_STR - 1;
    } else {
        const char *q = s;
        while (q < e && *q != ':' && !memchr(",{}[]<\n", *q, 7)) q++;
        if (q == e) return G4_MORE;
        if (*q != ':') return G4_BAD;
        const char *ke = q;
        while (ke > s && (ke[-1] == ' ' || ke[-1] == '\t')) ke--;
        if (ke == s || (size_t)(ke - s) >= cap) return G4_BAD;
        memcpy(key, s, (size_t)(ke - s));
        key[ke - s] = 0;
        s = q;
    }
    g4_blanks(&s, e);
    if (s == e) return G4_MORE;
    if (*s != ':') return G4_BAD;
    *p = s + 1;
    return G4_OK;
}

/* A dict or a list, at its bracket. */
static int g4_compound(const char **p, const char *e, int depth, json_t **out) {
    const int obj = **p == '{';
    const char close = obj ? '}' : ']';
    json_t *v = obj ? json_object() : json_array();
    if (!v) return G4_NOMEM;
    (*p)++;
    for (int first = 1;; first = 0) {
        g4_blanks(p, e);
        int rc = *p < e ? G4_OK : G4_MORE;
        if (!rc && **p == close && first) {
            (*p)++;
            *out = v;
            return G4_OK;
        }
        char key[256];
        json_t *item = NULL;
        if (!rc && obj) rc = g4_key(p, e, key, sizeof key);
        if (!rc) rc = g4_value(p, e, depth + 1, &item);
        if (!rc && (obj ? json_object_set_new(v, key, item) : json_array_append_new(v, item))) rc = G4_NOMEM;
        if (!rc) g4_blanks(p, e);
        if (!rc && *p == e) rc = G4_MORE;
        if (!rc && **p != ',' && **p != close) rc = G4_BAD;
        if (rc) {
            json_decref(v);
            return rc;
        }
        if (*(*p)++ == close) {
            *out = v;
            return G4_OK;
        }
    }
}

/* One value in Gemma's syntax at *p: a string between <|"|> markers, a
 * dict with bare keys, a list, or a JSON number, true, false or null
 * (Python's None, True and False too, which the template writes back). */
static int g4_value(const char **p, const char *e, int depth, json_t **out) {
    *out = NULL;
    if (depth > 64) return G4_BAD;
    g4_blanks(p, e);
    if (*p >= e) return G4_MORE;
    const char *s = *p;
    if (*s == '<') {
        int rc = g4_expect(s, (size_t)(e - s), G4_STR);
        if (rc) return rc;
        s += sizeof G4_STR - 1;
        const char *q = memmem(s, (size_t)(e - s), G4_STR, sizeof G4_STR - 1);
        if (!q) return G4_MORE;
        *out = api_jstr_bytes(s, (size_t)(q - s));
        *p = q + sizeof G4_STR - 1;
        return *out ? G4_OK : G4_NOMEM;
    }
    if (*s == '{' || *s == '[') return g4_compound(p, e, depth, out);
    const char *q = s;
    while (q < e && !memchr(",}] \n\t\r<", *q, 9)) q++;
    if (q == e) return G4_MORE; /* a number may go on */
    static const struct { const char *py; int kind; } PY[] = {{"None", 0}, {"True", 1}, {"False", 2}};
    for (size_t i = 0; i < sizeof PY / sizeof *PY; i++)
        if ((size_t)(q - s) == strlen(PY[i].py) && !memcmp(s, PY[i].py, (size_t)(q - s)))
            *out = PY[i].kind ? json_boolean(PY[i].kind == 1) : json_null();
    if (!*out) *out = q > s ? json_loadb(s, (size_t)(q - s), JSON_DECODE_ANY, NULL) : NULL;
    if (!*out || json_is_string(*out)) {
        json_decref(*out);
        *out = NULL;
        return G4_BAD;
    }
    *p = q;
    return G4_OK;
}

/* One call after its open text: call:NAME{...} and the close text, as
 * {"name", "arguments"}; *used: the bytes it took. */
static int g4_call(const char *s, size_t n, json_t **out, size_t *used) {
    const char *p = s, *e = s + n;
    *out = NULL;
    g4_blanks(&p, e);
    int rc = g4_expect(p, (size_t)(e - p), "call:");
    if (rc) return rc;
    p += 5;
    const char *name = p;
    while (p < e && *p != '{') {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
              *p == '-' || *p == '.'))
            return G4_BAD;
        p++;
    }
    if (p == e) return G4_MORE;
    if (p == name || p - name > 64) return G4_BAD;
    const char *name_end = p;
    json_t *args = NULL;
    rc = g4_value(&p, e, 0, &args);
    if (!rc) {
        g4_blanks(&p, e);
        rc = g4_expect(p, (size_t)(e - p), G4_CLOSE);
    }
    if (rc) {
        json_decref(args);
        return rc;
    }
    *out = json_pack("{s:s%, s:o}", "name", name, (size_t)(name_end - name), "arguments", args);
    *used = (size_t)(p - s) + sizeof G4_CLOSE - 1;
    return *out ? G4_OK : G4_NOMEM;
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
    if (fmt == TOOLS_GEMMA4) { /* the close text may sit in a string: the parser finds it */
        const int rc = g4_call(s, n, &v, &used);
        if (rc) return rc == G4_MORE ? 0 : rc == G4_NOMEM ? -2 : -1;
    } else if (fmt == TOOLS_QWEN_XML) {
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
