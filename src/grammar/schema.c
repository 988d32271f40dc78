/* schema: JSON Schema to a GBNF grammar whose outputs are exactly JSON texts
 * valid for the schema (for the keywords below), so constrained decoding
 * gives replies that parse and validate.
 *
 * Supported: type (one or a list), properties / required /
 * additionalProperties (absent or false: only the listed properties; true or
 * a schema: others too), items / prefixItems / minItems / maxItems, enum,
 * const, string minLength / maxLength / pattern (a regex subset, anchored at
 * both ends) / format (date, time, date-time, uuid, email), integer (with
 * minimum / maximum / exclusiveMinimum / exclusiveMaximum), number,
 * boolean, null, anyOf / oneOf (as alternatives), $ref to #/$defs/... or
 * #/definitions/... (recursion allowed), and the annotations (title,
 * description, default, examples, ...), which constrain nothing. Anything
 * else is refused with its name and where it is: a keyword quietly ignored
 * would let through replies that do not validate.
 *
 * Properties come in the schema's order, optional ones may be left out.
 * Whitespace between tokens is bounded (llama.cpp's convention), so a model
 * cannot spend its budget on blank lines. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "base/util.h"

typedef struct sb {
    char *s;
    size_t n, cap;
    int oom;
} sb;

static void sb_put(sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap * 2 : 256;
        while (c < b->n + n + 1) c *= 2;
        char *x = realloc(b->s, c);
        if (!x) {
            b->oom = 1;
            return;
        }
        b->s = x;
        b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_str(sb *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(sb *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    sb_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* Shared rules, emitted once each when used. */
enum { P_WS, P_CHAR, P_STRING, P_INT, P_NUMBER, P_BOOL, P_NULL, P_VALUE, P_OBJECT, P_ARRAY, P_COUNT };
static const char *const PRIM_NAME[P_COUNT] = {"ws",  "char", "string", "integer", "number",
                                               "boolean", "null", "value", "object", "array"};
static const char *const PRIM_BODY[P_COUNT] = {
    "| \" \" | \"\\n\" [ \\t]{0,20}",
    "[^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})",
    "\"\\\"\" char* \"\\\"\"",
    "\"-\"? ([0-9] | [1-9] [0-9]{0,15})",
    "\"-\"? ([0-9] | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?",
    "\"true\" | \"false\"",
    "\"null\"",
    "object | array | string | number | boolean | null",
    "\"{\" ws (string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)*)? \"}\"",
    "\"[\" ws (value ws (\",\" ws value ws)*)? \"]\"",
};
/* what each shared rule refers to */
static const int PRIM_DEPS[P_COUNT][4] = {
    {-1}, {-1}, {P_CHAR, -1}, {-1}, {-1}, {-1}, {-1},
    {P_OBJECT, P_ARRAY, P_STRING, -1}, {P_WS, P_STRING, P_VALUE, -1}, {P_WS, P_VALUE, -1},
};

typedef struct conv {
    json_t *root;
    sb out;
    int n_rule;
    int used[P_COUNT];
    struct {
        char *ref;
        int rule;
    } refs[256];
    int n_refs;
    int depth;
    int multi; /* inside a list of types */
    tl_error *err; /* may be NULL: the status is kept here too */
    int failed, status;
} conv;

static int refuse(conv *c, const char *path, const char *fmt, ...) {
    if (!c->failed) {
        char msg[300];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        c->status = tl_fail(c->err, TL_ERR_ARG, "json_schema%s%s: %s", *path ? " at " : "", path, msg);
    }
    c->failed = 1;
    return -1;
}

static void use(conv *c, int p) {
    if (c->used[p]) return;
    c->used[p] = 1;
    for (int i = 0; PRIM_DEPS[p][i] >= 0 && i < 4; i++) use(c, PRIM_DEPS[p][i]);
    if (p == P_STRING || p == P_NUMBER) use(c, p == P_STRING ? P_CHAR : P_INT);
    if (p == P_VALUE) use(c, P_NUMBER), use(c, P_BOOL), use(c, P_NULL);
}

/* A GBNF literal for raw bytes s (JSON text to emit as is). */
static void lit(sb *b, const char *s, size_t n) {
    sb_str(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') sb_fmt(b, "\\%c", ch);
        else if (ch == '\n') sb_str(b, "\\n");
        else if (ch < 0x20 || ch == 0x7F) sb_fmt(b, "\\x%02X", ch);
        else sb_put(b, (const char *)&ch, 1);
    }
    sb_str(b, "\"");
}

/* The literal of a JSON value in compact form (enum, const). */
static int lit_json(conv *c, sb *b, const json_t *v, const char *path) {
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!s) return refuse(c, path, "out of memory");
    lit(b, s, strlen(s));
    free(s);
    return 0;
}

static int visit(conv *c, json_t *s, const char *path);

/* Adds `name ::= body` for a new rule; returns its number. */
static int emit(conv *c, const sb *body) {
    const int r = c->n_rule++;
    sb_fmt(&c->out, "r%d ::= ", r);
    sb_put(&c->out, body->s ? body->s : "", body->n);
    sb_str(&c->out, "\n");
    return r;
}

/* ---- regular expressions (pattern) ---- */

typedef struct rx {
    const char *p, *end;
    conv *c;
    const char *path;
    int depth; /* groups open (a client's pattern: bounded before it overflows the stack) */
} rx;

static int rx_alt(rx *x, sb *b);

/* One character of a JSON string's content: as itself, or escaped. */
static void rx_char(sb *b, uint32_t cp) {
    if (cp == '"' || cp == '\\') {
        sb_fmt(b, "\"\\\\\\%c\"", (char)cp);
    } else if (cp < 0x20) {
        sb_fmt(b, "\"\\\\u%04X\"", cp);
    } else {
        char u[8];
        int n = 0;
        if (cp < 0x80) u[n++] = (char)cp;
        else if (cp < 0x800) u[n++] = (char)(0xC0 | cp >> 6), u[n++] = (char)(0x80 | (cp & 0x3F));
        else if (cp < 0x10000)
            u[n++] = (char)(0xE0 | cp >> 12), u[n++] = (char)(0x80 | (cp >> 6 & 0x3F)), u[n++] = (char)(0x80 | (cp & 0x3F));
        else
            u[n++] = (char)(0xF0 | cp >> 18), u[n++] = (char)(0x80 | (cp >> 12 & 0x3F)),
            u[n++] = (char)(0x80 | (cp >> 6 & 0x3F)), u[n++] = (char)(0x80 | (cp & 0x3F));
        lit(b, u, (size_t)n);
    }
}

static int rx_utf8(rx *x, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)x->p;
    int n = u[0] < 0x80 ? 1 : (u[0] & 0xE0) == 0xC0 ? 2 : (u[0] & 0xF0) == 0xE0 ? 3 : 4;
    if (x->end - x->p < n) return refuse(x->c, x->path, "pattern: invalid UTF-8");
    uint32_t v = n == 1 ? u[0] : u[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) v = v << 6 | (u[i] & 0x3F);
    x->p += n;
    *cp = v;
    return 0;
}

/* A class's ranges (inside [...], or \d \w \s), as code points. */
typedef struct cls_t {
    uint32_t lo[64], hi[64];
    int n;
} cls_t;

static void cls_range(cls_t *c, uint32_t lo, uint32_t hi) {
    if (c->n < 64) c->lo[c->n] = lo, c->hi[c->n] = hi;
    c->n++; /* past 64: refused by the caller */
}

static int rx_shorthand(rx *x, char k, cls_t *cls, int *neg) {
    *neg = k == 'D' || k == 'W' || k == 'S';
    switch (k | 0x20) {
    case 'd': cls_range(cls, '0', '9'); return 0;
    case 'w': cls_range(cls, '0', '9'), cls_range(cls, 'A', 'Z'), cls_range(cls, 'a', 'z'), cls_range(cls, '_', '_'); return 0;
    case 's': cls_range(cls, ' ', ' '), cls_range(cls, '\t', '\r'); return 0;
    default: return refuse(x->c, x->path, "pattern: unsupported escape \\%c", k);
    }
}

/* A class inside a JSON string. Listed: its characters that need no escape,
 * and the escaped forms of " and \ if listed (control characters are left
 * out: a sound subset). Negated: any character needing no escape that is not
 * listed. */
static void class_out(sb *b, const cls_t *c, int neg) {
    sb body = {0};
    int extra_q = 0, extra_b = 0;
    for (int i = 0; i < c->n; i++) {
        uint32_t lo = c->lo[i], hi = c->hi[i];
        if (!neg) {
            if (lo <= '"' && hi >= '"') extra_q = 1;
            if (lo <= '\\' && hi >= '\\') extra_b = 1;
        }
        sb_fmt(&body, lo == hi ? "\\U%08X" : "\\U%08X-\\U%08X", lo, hi);
    }
    if (neg) {
        sb_str(b, "[^\"\\\\\\x00-\\x1F\\x7F");
        sb_put(b, body.s ? body.s : "", body.n);
        sb_str(b, "]");
    } else {
        /* the listed set minus what JSON escapes, as alternatives of ranges */
        sb_str(b, "(");
        int first = 1;
        for (int i = 0; i < c->n; i++) {
            uint32_t lo = c->lo[i] < 0x20 ? 0x20 : c->lo[i], hi = c->hi[i];
            /* cut out " (0x22), \ (0x5C) and DEL (0x7F) */
            static const uint32_t cut[3] = {0x22, 0x5C, 0x7F};
            for (int k = 0; k < 3; k++)
                if (cut[k] >= lo && cut[k] <= hi) {
                    if (cut[k] > lo) sb_fmt(b, "%s[\\U%08X-\\U%08X]", first ? "" : " | ", lo, cut[k] - 1), first = 0;
                    lo = cut[k] + 1;
                }
            if (lo <= hi) sb_fmt(b, "%s[\\U%08X-\\U%08X]", first ? "" : " | ", lo, hi), first = 0;
        }
        if (extra_q) sb_fmt(b, "%s\"\\\\\\\"\"", first ? "" : " | "), first = 0;
        if (extra_b) sb_fmt(b, "%s\"\\\\\\\\\"", first ? "" : " | "), first = 0;
        if (first) sb_str(b, "[^\\x00-\\U0010FFFF]"); /* nothing: an empty class matches nothing */
        sb_str(b, ")");
    }
    free(body.s);
}

static uint32_t rx_escaped(char k);

/* The character escape \k (k read; \xHH and \uHHHH read their digits):
 * the code point, or -1 for a letter escape that is not a character. */
static int rx_hex_escape(rx *x, char k, uint32_t *cp) {
    const int digits = k == 'x' ? 2 : k == 'u' ? 4 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            char h = x->p < x->end ? *x->p : 0;
            int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
            if (d < 0) return refuse(x->c, x->path, "pattern: \\%c needs %d hex digits", k, digits);
            v = v << 4 | (uint32_t)d;
            x->p++;
        }
        *cp = v;
        return 0;
    }
    if ((k >= 'a' && k <= 'z') || (k >= 'A' && k <= 'Z')) {
        *cp = strchr("ntrfv", k) ? rx_escaped(k) : (uint32_t)-1;
        return 0;
    }
    *cp = (uint32_t)(unsigned char)k; /* punctuation stands for itself */
    return 0;
}

static uint32_t rx_escaped(char k) {
    switch (k) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    default: return (uint32_t)(unsigned char)k;
    }
}

static int rx_atom(rx *x, sb *b) {
    char ch = *x->p;
    if (ch == '(') {
        x->p++;
        if (x->end - x->p >= 2 && x->p[0] == '?') {
            if (x->p[1] != ':') return refuse(x->c, x->path, "pattern: lookaround and named groups are not supported");
            x->p += 2;
        }
        /* each group is about three of the grammar's (gbnf.c's limit: 256) */
        if (x->depth >= 64) return refuse(x->c, x->path, "pattern: groups nested more than 64 deep");
        sb_str(b, "(");
        x->depth++;
        if (rx_alt(x, b)) return -1;
        x->depth--;
        if (x->p >= x->end || *x->p != ')') return refuse(x->c, x->path, "pattern: missing ')'");
        x->p++;
        sb_str(b, ")");
        return 0;
    }
    if (ch == '[') {
        x->p++;
        int neg = 0;
        if (x->p < x->end && *x->p == '^') neg = 1, x->p++;
        cls_t cls = {0};
        int first = 1;
        while (x->p < x->end && (*x->p != ']' || first)) {
            first = 0;
            uint32_t lo;
            if (*x->p == '\\' && x->end - x->p >= 2) {
                char k = x->p[1];
                x->p += 2;
                if (strchr("dwsDWS", k)) {
                    int sneg;
                    if (rx_shorthand(x, k, &cls, &sneg)) return -1;
                    if (sneg) return refuse(x->c, x->path, "pattern: \\%c inside a class", k);
                    continue;
                }
                if (rx_hex_escape(x, k, &lo)) return -1;
                if (lo == (uint32_t)-1) return refuse(x->c, x->path, "pattern: \\%c is not supported in a class", k);
            } else if (rx_utf8(x, &lo)) {
                return -1;
            }
            uint32_t hi = lo;
            if (x->end - x->p >= 2 && x->p[0] == '-' && x->p[1] != ']') {
                x->p++;
                if (*x->p == '\\' && x->end - x->p >= 2) {
                    const char k2 = x->p[1];
                    x->p += 2;
                    if (rx_hex_escape(x, k2, &hi)) return -1;
                    if (hi == (uint32_t)-1) return refuse(x->c, x->path, "pattern: \\%c is not supported in a class", k2);
                } else if (rx_utf8(x, &hi)) {
                    return -1;
                }
                if (hi < lo) return refuse(x->c, x->path, "pattern: class range out of order");
            }
            cls_range(&cls, lo, hi);
        }
        if (x->p >= x->end) return refuse(x->c, x->path, "pattern: missing ']'");
        x->p++;
        if (cls.n > 64) return refuse(x->c, x->path, "pattern: a class of more than 64 ranges");
        class_out(b, &cls, neg);
        return 0;
    }
    if (ch == '.') { /* any character but a newline: unescaped ones, \" \\ and \/ */
        x->p++;
        sb_str(b, "([^\"\\\\\\x00-\\x1F\\x7F] | \"\\\\\" [\"\\\\/])");
        return 0;
    }
    if (ch == '\\') {
        if (x->end - x->p < 2) return refuse(x->c, x->path, "pattern: trailing '\\'");
        char k = x->p[1];
        x->p += 2;
        if (strchr("dwsDWS", k)) {
            cls_t cls = {0};
            int neg;
            if (rx_shorthand(x, k, &cls, &neg)) return -1;
            class_out(b, &cls, neg);
            return 0;
        }
        if (k >= '1' && k <= '9') return refuse(x->c, x->path, "pattern: backreferences are not supported");
        uint32_t cp;
        if (rx_hex_escape(x, k, &cp)) return -1;
        if (cp == (uint32_t)-1) return refuse(x->c, x->path, "pattern: \\%c is not supported", k);
        rx_char(b, cp);
        return 0;
    }
    if (strchr("*+?{", ch)) return refuse(x->c, x->path, "pattern: a quantifier with nothing before it");
    uint32_t cp;
    if (rx_utf8(x, &cp)) return -1;
    rx_char(b, cp);
    return 0;
}

static int rx_seq(rx *x, sb *b) {
    while (x->p < x->end && *x->p != '|' && *x->p != ')') {
        if (*x->p == '$' && x->p + 1 == x->end) break;
        sb atom = {0};
        if (rx_atom(x, &atom)) return free(atom.s), -1;
        sb_str(b, " (");
        sb_put(b, atom.s ? atom.s : "", atom.n);
        sb_str(b, ")");
        free(atom.s);
        if (x->p < x->end && strchr("*+?{", *x->p)) {
            if (*x->p == '{') {
                const char *q = x->p + 1;
                while (q < x->end && (*q == ',' || (*q >= '0' && *q <= '9'))) q++;
                if (q >= x->end || *q != '}') return refuse(x->c, x->path, "pattern: malformed {m,n}");
                sb_put(b, x->p, (size_t)(q + 1 - x->p));
                x->p = q + 1;
            } else {
                sb_put(b, x->p, 1);
                x->p++;
            }
            if (x->p < x->end && (*x->p == '?' || *x->p == '+')) x->p++; /* lazy/possessive: same language */
        }
    }
    return 0;
}

static int rx_alt(rx *x, sb *b) {
    for (;;) {
        sb_str(b, "(");
        if (rx_seq(x, b)) return -1;
        sb_str(b, " )");
        if (x->p < x->end && *x->p == '|') {
            x->p++;
            sb_str(b, " | ");
            continue;
        }
        return 0;
    }
}

/* ---- schemas ---- */

static const char *const ANNOTATIONS[] = {"title", "description", "$schema", "$id", "$comment", "default",
                                          "examples", "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions", "strict", "name", NULL};

static int known(const char *k, const char *const *list) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(k, list[i])) return 1;
    for (int i = 0; ANNOTATIONS[i]; i++)
        if (!strcmp(k, ANNOTATIONS[i])) return 1;
    return 0;
}

/* Under a list of types, each type's keywords are every listed type's. */
static const char *const ANY_TYPE[] = {"type", "minLength", "maxLength", "pattern", "format", "items", "prefixItems",
                                       "minItems", "maxItems", "properties", "required", "additionalProperties",
                                       "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};

static int check_keys(conv *c, json_t *s, const char *const *allowed, const char *path) {
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) if (!known(k, c->multi ? ANY_TYPE : allowed))
        return refuse(c, path, "unsupported keyword '%s'", k);
    return 0;
}

static int get_count(conv *c, json_t *s, const char *key, int def, const char *path) {
    json_t *v = json_object_get(s, key);
    if (!v) return def;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000)
        return refuse(c, path, "'%s' must be an integer from 0 to 1000 (a bound the grammar can hold)", key), -2;
    return (int)json_integer_value(v);
}

static void repeat_suffix(sb *b, int lo, int hi) {
    if (hi < 0) sb_fmt(b, "{%d,}", lo);
    else sb_fmt(b, "{%d,%d}", lo, hi);
}

static int visit_string(conv *c, json_t *s, const char *path, sb *b) {
    static const char *const keys[] = {"type", "minLength", "maxLength", "pattern", "format", NULL};
    if (check_keys(c, s, keys, path)) return -1;
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    int lo = get_count(c, s, "minLength", 0, path), hi = get_count(c, s, "maxLength", -1, path);
    if (lo < -1 || hi < -1) return -1;
    if (hi >= 0 && hi < lo) return refuse(c, path, "maxLength is below minLength");
    if (pat && (fmt || lo || hi >= 0)) return refuse(c, path, "'pattern' together with format or length limits is not supported");
    if (fmt && (lo || hi >= 0)) return refuse(c, path, "'format' together with length limits is not supported");
    if (pat) {
        if (!json_is_string(pat)) return refuse(c, path, "'pattern' must be a string");
        const char *p = json_string_value(pat);
        size_t n = strlen(p);
        if (n && p[0] == '^') p++, n--;
        rx x = {p, p + n, c, path, 0};
        sb body = {0};
        int rc = rx_alt(&x, &body);
        if (!rc && x.p < x.end && !(*x.p == '$' && x.p + 1 == x.end)) rc = refuse(c, path, "pattern: unexpected ')'");
        if (!rc) {
            sb_str(b, "\"\\\"\" (");
            sb_put(b, body.s ? body.s : "", body.n);
            sb_str(b, ") \"\\\"\"");
        }
        free(body.s);
        return rc;
    }
    if (fmt) {
        if (!json_is_string(fmt)) return refuse(c, path, "'format' must be a string");
        const char *f = json_string_value(fmt);
        static const char DATE[] = "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1])";
        static const char TIME[] = "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
                                   "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
        sb_str(b, "\"\\\"\" ");
        if (!strcmp(f, "date")) sb_str(b, DATE);
        else if (!strcmp(f, "time")) sb_str(b, TIME);
        else if (!strcmp(f, "date-time")) sb_fmt(b, "%s \"T\" %s", DATE, TIME);
        else if (!strcmp(f, "uuid"))
            sb_str(b, "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}");
        else if (!strcmp(f, "email"))
            sb_str(b, "[a-zA-Z0-9._%+-]{1,40} \"@\" ([a-zA-Z0-9-]{1,30} \".\"){1,4} [a-zA-Z]{2,12}");
        else
            return refuse(c, path, "unsupported format '%s' (date, time, date-time, uuid, email are)", f);
        sb_str(b, " \"\\\"\"");
        return 0;
    }
    use(c, P_CHAR);
    sb_str(b, "\"\\\"\" char");
    if (lo == 0 && hi < 0) sb_str(b, "*");
    else repeat_suffix(b, lo, hi);
    sb_str(b, " \"\\\"\"");
    return 0;
}

static int visit_array(conv *c, json_t *s, const char *path, sb *b) {
    static const char *const keys[] = {"type", "items", "prefixItems", "minItems", "maxItems", NULL};
    if (check_keys(c, s, keys, path)) return -1;
    json_t *items = json_object_get(s, "items"), *prefix = json_object_get(s, "prefixItems");
    int lo = get_count(c, s, "minItems", 0, path), hi = get_count(c, s, "maxItems", -1, path);
    if (lo < -1 || hi < -1) return -1;
    if (hi >= 0 && hi < lo) return refuse(c, path, "maxItems is below minItems");
    use(c, P_WS);
    char sub[300];
    if (prefix) {
        if (!json_is_array(prefix)) return refuse(c, path, "'prefixItems' must be an array");
        if (items && !json_is_false(items)) return refuse(c, path, "'items' beside 'prefixItems' must be false");
        sb_str(b, "\"[\" ws");
        for (size_t i = 0; i < json_array_size(prefix); i++) {
            snprintf(sub, sizeof sub, "%s/prefixItems/%zu", path, i);
            int r = visit(c, json_array_get(prefix, i), sub);
            if (r < 0) return -1;
            sb_fmt(b, "%s r%d ws", i ? " \",\" ws" : "", r);
        }
        sb_str(b, " \"]\"");
        return 0;
    }
    int r;
    snprintf(sub, sizeof sub, "%s/items", path);
    if (items) {
        r = visit(c, items, sub);
        if (r < 0) return -1;
    } else {
        use(c, P_VALUE);
        r = -1;
    }
    char item[32];
    if (r >= 0) snprintf(item, sizeof item, "r%d", r);
    else snprintf(item, sizeof item, "value");
    /* "[" ( item ("," item){lo-1, hi-1} )? "]" with the counts respected */
    sb_str(b, "\"[\" ws ");
    if (hi == 0) {
        sb_str(b, "\"]\"");
        return 0;
    }
    sb_fmt(b, "(%s ws (\",\" ws %s ws)", item, item);
    repeat_suffix(b, lo > 0 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1);
    sb_str(b, ")");
    if (lo == 0) sb_str(b, "?");
    sb_str(b, " \"]\"");
    return 0;
}

static int visit_object(conv *c, json_t *s, const char *path, sb *b) {
    static const char *const keys[] = {"type", "properties", "required", "additionalProperties", NULL};
    if (check_keys(c, s, keys, path)) return -1;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
           *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props)) return refuse(c, path, "'properties' must be an object");
    if (req && !json_is_array(req)) return refuse(c, path, "'required' must be an array");
    size_t np = props ? json_object_size(props) : 0;
    /* the rule after each property: R_i (something before: a comma first) and S_i (nothing yet) */
    int *kv = calloc(np + 1, sizeof *kv), *opt = calloc(np + 1, sizeof *opt);
    if (!kv || !opt) {
        free(kv);
        free(opt);
        return refuse(c, path, "out of memory");
    }
    use(c, P_WS);
    const char *k;
    json_t *v;
    size_t i = 0;
    int rc = 0;
    json_object_foreach(props, k, v) {
        char sub[300];
        snprintf(sub, sizeof sub, "%s/properties/%s", path, k);
        int r = visit(c, v, sub);
        if (r < 0) {
            rc = -1;
            break;
        }
        sb kb = {0};
        json_t *name = json_string(k);
        if (!name || lit_json(c, &kb, name, path)) rc = -1;
        json_decref(name);
        sb_fmt(&kb, " ws \":\" ws r%d", r);
        kv[i] = rc ? -1 : emit(c, &kb);
        free(kb.s);
        if (rc) break;
        opt[i] = 1;
        for (size_t j = 0; j < json_array_size(req); j++)
            if (json_is_string(json_array_get(req, j)) && !strcmp(json_string_value(json_array_get(req, j)), k)) opt[i] = 0;
        i++;
    }
    for (size_t j = 0; !rc && j < json_array_size(req); j++) {
        json_t *rq = json_array_get(req, j);
        if (!json_is_string(rq) || !json_object_get(props, json_string_value(rq)))
            rc = refuse(c, path, "'required' names '%s', which is not in 'properties'",
                        json_is_string(rq) ? json_string_value(rq) : "?");
    }
    if (rc) {
        free(kv);
        free(opt);
        return -1;
    }
    /* the tail after the listed properties: other keys, if allowed (beside
     * listed ones the grammar could not keep a listed name out of it) */
    char tail_r[64] = "", tail_s[64] = "";
    if (add && !json_is_false(add) && np) {
        free(kv);
        free(opt);
        return refuse(c, path, "'additionalProperties' other than false beside 'properties' is not supported");
    }
    if (add && !json_is_false(add)) {
        int ar;
        if (json_is_true(add)) {
            use(c, P_VALUE);
            sb vb = {0};
            use(c, P_STRING);
            sb_str(&vb, "string ws \":\" ws value");
            ar = emit(c, &vb);
            free(vb.s);
        } else {
            char sub[300];
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            int r = visit(c, add, sub);
            if (r < 0) {
                free(kv);
                free(opt);
                return -1;
            }
            use(c, P_STRING);
            sb vb = {0};
            sb_fmt(&vb, "string ws \":\" ws r%d", r);
            ar = emit(c, &vb);
            free(vb.s);
        }
        sb tb = {0};
        sb_fmt(&tb, "(\",\" ws r%d ws)*", ar);
        snprintf(tail_r, sizeof tail_r, "r%d", emit(c, &tb));
        free(tb.s);
        sb ts = {0};
        sb_fmt(&ts, "(r%d ws %s)?", ar, tail_r);
        snprintf(tail_s, sizeof tail_s, "r%d", emit(c, &ts));
        free(ts.s);
    }
    /* from the last property back: R_i and S_i */
    char next_r[64], next_s[64];
    snprintf(next_r, sizeof next_r, "%s", tail_r);
    snprintf(next_s, sizeof next_s, "%s", tail_s);
    for (size_t j = np; j-- > 0;) {
        sb rb = {0}, sbb = {0};
        sb_fmt(&rb, "\",\" ws r%d ws %s", kv[j], next_r);
        if (opt[j]) sb_fmt(&rb, " | %s", *next_r ? next_r : "\"\"");
        sb_fmt(&sbb, "r%d ws %s", kv[j], next_r);
        if (opt[j]) sb_fmt(&sbb, " | %s", *next_s ? next_s : "\"\"");
        snprintf(next_r, sizeof next_r, "r%d", emit(c, &rb));
        snprintf(next_s, sizeof next_s, "r%d", emit(c, &sbb));
        free(rb.s);
        free(sbb.s);
    }
    sb_fmt(b, "\"{\" ws %s \"}\"", next_s);
    free(kv);
    free(opt);
    return 0;
}

/* ---- integer ranges (minimum / maximum) ---- */

#define INT_DIGITS 16 /* the integer rule's longest: [1-9] [0-9]{0,15} */

/* Digit strings of one length n from lo to hi (both n digits, lo <= hi), as
 * alternatives: a shared first digit recurses; different first digits give
 * lo's tail up to all nines, the digits between with any tail, hi's first
 * digit with tails from all zeros. */
static void digits_range(sb *b, const char *lo, const char *hi, int n) {
    if (n == 0) {
        sb_str(b, "\"\"");
        return;
    }
    int z = 1, nine = 1;
    for (int i = 1; i < n; i++) z &= lo[i] == '0', nine &= hi[i] == '9';
    if (z && nine) { /* [a-b] [0-9]{n-1} */
        if (lo[0] == hi[0]) sb_fmt(b, "\"%c\"", lo[0]);
        else sb_fmt(b, "[%c-%c]", lo[0], hi[0]);
        if (n > 1) sb_fmt(b, " [0-9]{%d}", n - 1);
        return;
    }
    if (lo[0] == hi[0]) {
        sb_fmt(b, "\"%c\" (", lo[0]);
        digits_range(b, lo + 1, hi + 1, n - 1);
        sb_str(b, ")");
        return;
    }
    char all9[INT_DIGITS + 1], all0[INT_DIGITS + 1];
    memset(all9, '9', (size_t)n);
    memset(all0, '0', (size_t)n);
    sb_fmt(b, "\"%c\" (", lo[0]);
    digits_range(b, lo + 1, all9, n - 1);
    sb_str(b, ")");
    if (lo[0] + 1 <= hi[0] - 1) {
        if (lo[0] + 1 == hi[0] - 1) sb_fmt(b, " | \"%c\"", lo[0] + 1);
        else sb_fmt(b, " | [%c-%c]", lo[0] + 1, hi[0] - 1);
        if (n > 1) sb_fmt(b, " [0-9]{%d}", n - 1);
    }
    sb_fmt(b, " | \"%c\" (", hi[0]);
    digits_range(b, all0, hi + 1, n - 1);
    sb_str(b, ")");
}

/* The decimal numerals (no sign, no leading zero) from lo to hi, 0 <= lo <= hi. */
static void nonneg_range(sb *b, long long lo, long long hi) {
    char l[32], h[32];
    int first = 1;
    for (int n = snprintf(l, sizeof l, "%lld", lo); n <= INT_DIGITS; n++) {
        long long top = 1;
        for (int i = 0; i < n; i++) top *= 10;
        long long a = lo, z = hi < top - 1 ? hi : top - 1;
        if (n > (int)strlen(l)) a = top / 10;
        if (a > z) break;
        snprintf(l, sizeof l, "%lld", a);
        snprintf(h, sizeof h, "%lld", z);
        sb_str(b, first ? "(" : " | (");
        digits_range(b, l, h, n);
        sb_str(b, ")");
        first = 0;
        if (z == hi) break;
    }
}

/* A bound of an integer: minimum/maximum, or exclusive ones moved inwards. */
static int int_bound(conv *c, json_t *s, const char *key, const char *xkey, int upper, long long *out,
                     const char *path) {
    /* INT_DIGITS nines; a double holds 1e16 (one past it) exactly, not it */
    const long long LIM = 9999999999999999LL;
    const double TOO_FAR = 1e16;
    json_t *v = json_object_get(s, key), *x = json_object_get(s, xkey);
    if ((v && !json_is_number(v)) || (x && !json_is_number(x)))
        return refuse(c, path, "'%s' must be a number", v && !json_is_number(v) ? key : xkey);
    int have = 0;
    double best = upper ? TOO_FAR : -TOO_FAR;
    if (v) {
        double d = json_number_value(v);
        d = upper ? floor(d) : ceil(d);
        best = upper ? (d < best ? d : best) : (d > best ? d : best);
        have = 1;
    }
    if (x) {
        double d = json_number_value(x);
        d = upper ? ceil(d) - 1 : floor(d) + 1;
        best = upper ? (d < best ? d : best) : (d > best ? d : best);
        have = 1;
    }
    if (have && (upper ? best <= -TOO_FAR : best >= TOO_FAR))
        return refuse(c, path, "'%s' leaves no integer of at most %d digits", v ? key : xkey, INT_DIGITS);
    *out = best >= TOO_FAR ? LIM : best <= -TOO_FAR ? -LIM : (long long)best;
    return have;
}

/* An integer within [minimum, maximum] (exclusive bounds taken inwards). */
static int visit_integer(conv *c, json_t *s, const char *path, sb *b) {
    static const char *const keys[] = {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL};
    if (check_keys(c, s, keys, path)) return -1;
    long long lo, hi;
    int hl = int_bound(c, s, "minimum", "exclusiveMinimum", 0, &lo, path);
    int hh = int_bound(c, s, "maximum", "exclusiveMaximum", 1, &hi, path);
    if (hl < 0 || hh < 0) return -1;
    if (!hl && !hh) {
        use(c, P_INT);
        sb_str(b, PRIM_NAME[P_INT]);
        return 0;
    }
    if (lo > hi) return refuse(c, path, "no integer lies between the bounds");
    int alt = 0;
    if (lo < 0) { /* the negatives: a minus sign and their magnitudes */
        sb_str(b, "\"-\" (");
        nonneg_range(b, hi < 0 ? -hi : 1, -lo);
        sb_str(b, ")");
        alt = 1;
    }
    if (hi >= 0) {
        if (alt) sb_str(b, " | ");
        nonneg_range(b, lo > 0 ? lo : 0, hi);
    }
    return 0;
}

/* One type's rule body for schema s. */
static int visit_type(conv *c, json_t *s, const char *type, const char *path, sb *b) {
    static const char *const scalar[] = {"type", NULL};
    if (!strcmp(type, "string")) return visit_string(c, s, path, b);
    if (!strcmp(type, "array")) return visit_array(c, s, path, b);
    if (!strcmp(type, "object")) return visit_object(c, s, path, b);
    if (!strcmp(type, "integer")) return visit_integer(c, s, path, b);
    int p = !strcmp(type, "number") ? P_NUMBER
          : !strcmp(type, "boolean") ? P_BOOL : !strcmp(type, "null") ? P_NULL : -1;
    if (p < 0) return refuse(c, path, "unknown type '%s'", type);
    if (check_keys(c, s, scalar, path)) return -1;
    static const char *const BOUNDS[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int i = 0; p == P_NUMBER && i < 4; i++) /* beside "integer" in a list of types */
        if (json_object_get(s, BOUNDS[i]))
            return refuse(c, path, "unsupported keyword '%s' for a number (integers take it)", BOUNDS[i]);
    use(c, p);
    sb_str(b, PRIM_NAME[p]);
    return 0;
}

static int visit_ref(conv *c, const char *ref, const char *path) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) return c->refs[i].rule;
    const char *name = NULL;
    json_t *defs = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) defs = json_object_get(c->root, "$defs"), name = ref + 8;
    else if (!strncmp(ref, "#/definitions/", 14)) defs = json_object_get(c->root, "definitions"), name = ref + 14;
    else if (!strcmp(ref, "#")) name = "";
    else return refuse(c, path, "$ref '%s': only local references to #/$defs/... are supported", ref);
    json_t *target = *name ? json_object_get(defs, name) : c->root;
    if (!target) return refuse(c, path, "$ref '%s' names nothing", ref);
    if (c->n_refs == (int)(sizeof c->refs / sizeof *c->refs)) return refuse(c, path, "too many $ref targets");
    /* the rule number is taken first, so a recursive reference finds it */
    const int r = c->n_rule++;
    c->refs[c->n_refs].ref = strdup(ref);
    if (!c->refs[c->n_refs].ref) return refuse(c, path, "out of memory");
    c->refs[c->n_refs++].rule = r;
    int t = visit(c, target, ref + 1);
    if (t < 0) return -1;
    sb_fmt(&c->out, "r%d ::= r%d\n", r, t);
    return r;
}

static int visit(conv *c, json_t *s, const char *path) {
    if (c->failed) return -1;
    if (++c->depth > 64) return refuse(c, path, "nested too deeply");
    const int multi = c->multi; /* a nested schema has its own type */
    c->multi = 0;
    sb b = {0};
    int rc = 0;
    if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
        use(c, P_VALUE);
        sb_str(&b, "value");
    } else if (!json_is_object(s)) {
        rc = refuse(c, path, "a schema must be an object or true");
    } else if (json_object_get(s, "$ref")) {
        json_t *ref = json_object_get(s, "$ref");
        static const char *const keys[] = {"$ref", NULL};
        rc = check_keys(c, s, keys, path);
        int r = rc ? -1 : json_is_string(ref) ? visit_ref(c, json_string_value(ref), path) : refuse(c, path, "$ref must be a string");
        if (r < 0) rc = -1;
        else sb_fmt(&b, "r%d", r);
    } else if (json_object_get(s, "const") || json_object_get(s, "enum")) {
        static const char *const keys[] = {"const", "enum", "type", NULL};
        json_t *cv = json_object_get(s, "const"), *ev = json_object_get(s, "enum");
        rc = check_keys(c, s, keys, path);
        if (!rc && cv) rc = lit_json(c, &b, cv, path);
        else if (!rc && (!json_is_array(ev) || !json_array_size(ev))) rc = refuse(c, path, "'enum' must be a non-empty array");
        for (size_t i = 0; !rc && !cv && i < json_array_size(ev); i++) {
            if (i) sb_str(&b, " | ");
            rc = lit_json(c, &b, json_array_get(ev, i), path);
        }
    } else if (json_object_get(s, "anyOf") || json_object_get(s, "oneOf")) {
        static const char *const keys[] = {"anyOf", "oneOf", NULL};
        const char *kw = json_object_get(s, "anyOf") ? "anyOf" : "oneOf";
        json_t *alts = json_object_get(s, kw);
        rc = check_keys(c, s, keys, path);
        if (!rc && (json_object_get(s, "anyOf") && json_object_get(s, "oneOf"))) rc = refuse(c, path, "both anyOf and oneOf");
        if (!rc && (!json_is_array(alts) || !json_array_size(alts))) rc = refuse(c, path, "'%s' must be a non-empty array", kw);
        for (size_t i = 0; !rc && i < json_array_size(alts); i++) {
            char sub[300];
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, kw, i);
            int r = visit(c, json_array_get(alts, i), sub);
            if (r < 0) rc = -1;
            else sb_fmt(&b, "%sr%d", i ? " | " : "", r);
        }
    } else {
        json_t *type = json_object_get(s, "type");
        if (!type) {
            /* no type: inferred from the keywords, as validators do for what they constrain */
            const char *t = json_object_get(s, "properties") || json_object_get(s, "required") ||
                                    json_object_get(s, "additionalProperties") ? "object"
                            : json_object_get(s, "items") || json_object_get(s, "prefixItems") ? "array"
                            : json_object_get(s, "pattern") || json_object_get(s, "format") ||
                                    json_object_get(s, "minLength") || json_object_get(s, "maxLength") ? "string"
                                                                                                      : NULL;
            if (t) rc = visit_type(c, s, t, path, &b);
            else {
                static const char *const keys[] = {NULL};
                rc = check_keys(c, s, keys, path);
                use(c, P_VALUE);
                sb_str(&b, "value");
            }
        } else if (json_is_string(type)) {
            rc = visit_type(c, s, json_string_value(type), path, &b);
        } else if (json_is_array(type) && json_array_size(type)) {
            for (size_t i = 0; !rc && i < json_array_size(type); i++) {
                json_t *t = json_array_get(type, i);
                if (!json_is_string(t)) rc = refuse(c, path, "'type' entries must be strings");
                else {
                    sb tb = {0};
                    c->multi = 1;
                    rc = visit_type(c, s, json_string_value(t), path, &tb);
                    c->multi = 0;
                    if (!rc) sb_fmt(&b, "%s(", i ? " | " : "");
                    sb_put(&b, tb.s ? tb.s : "", tb.n);
                    if (!rc) sb_str(&b, ")");
                    free(tb.s);
                }
            }
        } else {
            rc = refuse(c, path, "'type' must be a string or a non-empty array");
        }
    }
    int r = -1;
    if (!rc && !c->failed) r = emit(c, &b);
    if (b.oom || c->out.oom) r = refuse(c, path, "out of memory");
    free(b.s);
    c->depth--;
    c->multi = multi;
    return r;
}

int tl_json_schema_to_gbnf(const char *schema, size_t len, char **gbnf, tl_error *err) {
    *gbnf = NULL;
    json_error_t je;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY, &je);
    if (!root) return tl_fail(err, TL_ERR_ARG, "json_schema: not JSON: %s (line %d)", je.text, je.line);
    conv c = {.root = root, .err = err};
    int r = visit(&c, root, "");
    if (r >= 0) {
        sb_fmt(&c.out, "root ::= r%d\n", r);
        for (int p = 0; p < P_COUNT; p++)
            if (c.used[p]) sb_fmt(&c.out, "%s ::= %s\n", PRIM_NAME[p], PRIM_BODY[p]);
        if (c.out.oom) r = refuse(&c, "", "out of memory");
    }
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i].ref);
    json_decref(root);
    if (r < 0) {
        free(c.out.s);
        return c.status ? c.status : TL_ERR_ARG;
    }
    *gbnf = c.out.s;
    return TL_OK;
}

int tl_grammar_from_json_schema(const char *schema, size_t len, tl_grammar **out, tl_error *err) {
    *out = NULL;
    char *gbnf = NULL;
    int rc = tl_json_schema_to_gbnf(schema, len, &gbnf, err);
    if (!rc) {
        rc = tl_grammar_parse(gbnf, strlen(gbnf), out, err);
        free(gbnf);
    }
    return rc;
}
