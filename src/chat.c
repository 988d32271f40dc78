/* chat: a hand-written Jinja-subset interpreter for chat templates, matching
 * Python jinja2 as Hugging Face transformers configures it (trim_blocks,
 * lstrip_blocks, loopcontrols, immutable sandbox, json.dumps-style tojson).
 * Owns the lexer, parser, evaluator and the small JSON reader for messages.
 * Every allocation of one render lives in one arena freed at the end; errors
 * unwind with longjmp to the entry point, so nothing leaks on failure. */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat.h"
#include "util.h"

#define ARENA_LIMIT ((size_t)256 << 20) /* a template cannot eat the machine */
#define MAX_DEPTH 200                   /* parser and macro recursion */

/* ---- arena, error unwinding ---------------------------------------------- */

typedef struct ablock {
    struct ablock *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} ablock;

typedef struct R R;
typedef struct scope scope;
typedef struct node node;

struct R {
    jmp_buf jb;
    tl_error *err;
    int status;
    ablock *blocks;
    size_t total;
    const char *src; /* normalized template source, for line:col */
    int depth;
    scope *root;
};

static void pos_linecol(const R *r, int pos, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (int i = 0; r->src && i < pos && r->src[i]; i++) {
        if (r->src[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

/* Fails the render: message prefixed with the template position if pos >= 0. */
static _Noreturn __attribute__((format(printf, 4, 5))) void die(R *r, int status, int pos,
                                                                 const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos >= 0) {
        int line, col;
        pos_linecol(r, pos, &line, &col);
        tl_fail(r->err, status, "chat template, line %d column %d: %s", line, col, msg);
    } else {
        tl_fail(r->err, status, "chat template: %s", msg);
    }
    r->status = status;
    longjmp(r->jb, 1);
}

static void *aalloc(R *r, size_t n) {
    n = (n + 15) & ~(size_t)15;
    ablock *b = r->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        if (r->total + cap > ARENA_LIMIT) die(r, TL_ERR_NOMEM, -1, "render needs too much memory");
        b = malloc(sizeof *b + cap);
        if (!b) die(r, TL_ERR_NOMEM, -1, "out of memory");
        b->next = r->blocks;
        b->used = 0;
        b->cap = cap;
        r->blocks = b;
        r->total += cap;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

static void arena_free(R *r) {
    while (r->blocks) {
        ablock *n = r->blocks->next;
        free(r->blocks);
        r->blocks = n;
    }
}

static char *astrdup(R *r, const char *s, size_t n) {
    char *d = aalloc(r, n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* ---- values ---------------------------------------------------------------- */

typedef enum vt { T_UNDEF, T_NONE, T_BOOL, T_INT, T_FLOAT, T_STR, T_LIST, T_DICT, T_NS,
                  T_FUNC, T_METHOD, T_MACRO } vt;

typedef struct val val;
typedef struct vlist vlist;
typedef struct vdict vdict;

struct val {
    vt t;
    union {
        int b;
        long long i;
        double f;
        struct {
            const char *s;
            size_t n;
        } s;
        vlist *l;
        vdict *d; /* T_DICT, T_NS */
        int fn;   /* T_FUNC */
        struct {
            val *self;
            const char *name;
        } m;
        struct {
            const node *n;
            scope *sc;
        } mac;
    } u;
    const char *undef_name; /* T_UNDEF: what was missing, for error messages */
};

struct vlist {
    val *v;
    size_t n, cap;
    int tuple;
};

struct vdict {
    const char **k;
    size_t *kn;
    val *v;
    size_t n, cap;
};

static val v_undef(const char *name) { val v = {.t = T_UNDEF}; v.undef_name = name; return v; }
static val v_none(void) { val v = {.t = T_NONE}; return v; }
static val v_bool(int b) { val v = {.t = T_BOOL}; v.u.b = !!b; return v; }
static val v_int(long long i) { val v = {.t = T_INT}; v.u.i = i; return v; }
static val v_float(double f) { val v = {.t = T_FLOAT}; v.u.f = f; return v; }
static val v_str(const char *s, size_t n) { val v = {.t = T_STR}; v.u.s.s = s; v.u.s.n = n; return v; }
static val v_cstr(const char *s) { return v_str(s, strlen(s)); }

static vlist *list_new(R *r) { return aalloc(r, sizeof(vlist)); }
static void list_push(R *r, vlist *l, val x) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 8;
        val *nv = aalloc(r, nc * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}
static val v_list(vlist *l) { val v = {.t = T_LIST}; v.u.l = l; return v; }

static vdict *dict_new(R *r) { return aalloc(r, sizeof(vdict)); }
static val *dict_find(const vdict *d, const char *k, size_t kn) {
    for (size_t i = 0; i < d->n; i++)
        if (d->kn[i] == kn && !memcmp(d->k[i], k, kn)) return &d->v[i];
    return NULL;
}
static void dict_set(R *r, vdict *d, const char *k, size_t kn, val x) {
    val *p = dict_find(d, k, kn);
    if (p) {
        *p = x;
        return;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        const char **nk = aalloc(r, nc * sizeof *nk);
        size_t *nkn = aalloc(r, nc * sizeof *nkn);
        val *nv = aalloc(r, nc * sizeof *nv);
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nkn, d->kn, d->n * sizeof *nkn);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->kn = nkn;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->kn[d->n] = kn;
    d->v[d->n++] = x;
}
static val v_dict(vdict *d) { val v = {.t = T_DICT}; v.u.d = d; return v; }

/* A growable string in the arena (old buffers are simply abandoned). */
typedef struct sb {
    char *s;
    size_t n, cap;
} sb;

static void sb_add(R *r, sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        if (nc < 64) nc = 64;
        char *ns = aalloc(r, nc);
        if (b->n) memcpy(ns, b->s, b->n);
        b->s = ns;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void sb_puts(R *r, sb *b, const char *s) { sb_add(r, b, s, strlen(s)); }
static void sb_putc(R *r, sb *b, char c) { sb_add(r, b, &c, 1); }
static val sb_val(sb *b) { return v_str(b->s ? b->s : "", b->n); }

static int truthy(val v) {
    switch (v.t) {
    case T_UNDEF: case T_NONE: return 0;
    case T_BOOL: return v.u.b;
    case T_INT: return v.u.i != 0;
    case T_FLOAT: return v.u.f != 0;
    case T_STR: return v.u.s.n != 0;
    case T_LIST: return v.u.l->n != 0;
    case T_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int is_num(val v) { return v.t == T_INT || v.t == T_FLOAT || v.t == T_BOOL; }
static double num_f(val v) {
    return v.t == T_FLOAT ? v.u.f : v.t == T_INT ? (double)v.u.i : (double)v.u.b;
}
static long long num_i(val v) { return v.t == T_INT ? v.u.i : v.t == T_BOOL ? v.u.b : (long long)v.u.f; }

/* Python's repr of a float: the shortest text that reads back the same. */
static void fmt_float(R *r, sb *b, double f) {
    char buf[64];
    if (isnan(f)) { sb_puts(r, b, "nan"); return; }
    if (isinf(f)) { sb_puts(r, b, f < 0 ? "-inf" : "inf"); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, f);
        if (strtod(buf, NULL) == f) break;
    }
    /* Python's repr uses exponent form only below 1e-4 and from 1e16 on;
     * %g switches earlier (at the precision), so undo that in between. */
    char *e = strchr(buf, 'e');
    if (e) {
        int ex = atoi(e + 1);
        if (ex < -4 || ex >= 16) {
            sb_puts(r, b, buf);
            return;
        }
        int prec = (int)(e - buf) - (buf[0] == '-') - (strchr(buf, '.') ? 1 : 0);
        int dec = prec - 1 - ex;
        snprintf(buf, sizeof buf, "%.*f", dec > 0 ? dec : 0, f);
    }
    sb_puts(r, b, buf);
    if (!strchr(buf, '.') && !strchr(buf, 'n')) sb_puts(r, b, ".0");
}

static void to_str(R *r, sb *b, val v);

static void repr_str(R *r, sb *b, const char *s, size_t n) {
    char q = (memchr(s, '\'', n) && !memchr(s, '"', n)) ? '"' : '\'';
    sb_putc(r, b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '\\' || c == (unsigned char)q) {
            sb_putc(r, b, '\\');
            sb_putc(r, b, (char)c);
        } else if (c == '\n') sb_puts(r, b, "\\n");
        else if (c == '\r') sb_puts(r, b, "\\r");
        else if (c == '\t') sb_puts(r, b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", c);
            sb_puts(r, b, e);
        } else sb_putc(r, b, (char)c);
    }
    sb_putc(r, b, q);
}

static void repr(R *r, sb *b, val v) {
    if (v.t == T_STR) repr_str(r, b, v.u.s.s, v.u.s.n);
    else to_str(r, b, v);
}

/* Python's str() of a value, as {{ }} prints it. */
static void to_str(R *r, sb *b, val v) {
    char buf[32];
    switch (v.t) {
    case T_UNDEF: return;
    case T_NONE: sb_puts(r, b, "None"); return;
    case T_BOOL: sb_puts(r, b, v.u.b ? "True" : "False"); return;
    case T_INT: snprintf(buf, sizeof buf, "%lld", v.u.i); sb_puts(r, b, buf); return;
    case T_FLOAT: fmt_float(r, b, v.u.f); return;
    case T_STR: sb_add(r, b, v.u.s.s, v.u.s.n); return;
    case T_LIST:
        sb_putc(r, b, v.u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) sb_puts(r, b, ", ");
            repr(r, b, v.u.l->v[i]);
        }
        if (v.u.l->tuple && v.u.l->n == 1) sb_putc(r, b, ',');
        sb_putc(r, b, v.u.l->tuple ? ')' : ']');
        return;
    case T_DICT: case T_NS:
        sb_puts(r, b, v.t == T_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) sb_puts(r, b, ", ");
            repr_str(r, b, v.u.d->k[i], v.u.d->kn[i]);
            sb_puts(r, b, ": ");
            repr(r, b, v.u.d->v[i]);
        }
        sb_puts(r, b, v.t == T_NS ? "}>" : "}");
        return;
    default: sb_puts(r, b, "<function>"); return;
    }
}

static val str_of(R *r, val v) {
    if (v.t == T_STR) return v;
    sb b = {0};
    to_str(r, &b, v);
    return sb_val(&b);
}

/* json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort) as
 * transformers' tojson filter calls it. */
static void tojson(R *r, sb *b, val v, int indent, int level, int sort, int pos) {
    char buf[32];
    switch (v.t) {
    case T_NONE: sb_puts(r, b, "null"); return;
    case T_BOOL: sb_puts(r, b, v.u.b ? "true" : "false"); return;
    case T_INT: snprintf(buf, sizeof buf, "%lld", v.u.i); sb_puts(r, b, buf); return;
    case T_FLOAT:
        if (isnan(v.u.f)) sb_puts(r, b, "NaN");
        else if (isinf(v.u.f)) sb_puts(r, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else fmt_float(r, b, v.u.f);
        return;
    case T_STR:
        sb_putc(r, b, '"');
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char c = (unsigned char)v.u.s.s[i];
            if (c == '"') sb_puts(r, b, "\\\"");
            else if (c == '\\') sb_puts(r, b, "\\\\");
            else if (c == '\n') sb_puts(r, b, "\\n");
            else if (c == '\r') sb_puts(r, b, "\\r");
            else if (c == '\t') sb_puts(r, b, "\\t");
            else if (c == '\b') sb_puts(r, b, "\\b");
            else if (c == '\f') sb_puts(r, b, "\\f");
            else if (c < 0x20) {
                snprintf(buf, sizeof buf, "\\u%04x", c);
                sb_puts(r, b, buf);
            } else sb_putc(r, b, (char)c);
        }
        sb_putc(r, b, '"');
        return;
    case T_LIST: case T_DICT: case T_NS: {
        int is_list = v.t == T_LIST;
        size_t n = is_list ? v.u.l->n : v.u.d->n;
        sb_putc(r, b, is_list ? '[' : '{');
        if (n == 0) {
            sb_putc(r, b, is_list ? ']' : '}');
            return;
        }
        size_t *order = aalloc(r, n * sizeof *order);
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (!is_list && sort) /* insertion sort: dicts in templates are small */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0; j--) {
                    const vdict *d = v.u.d;
                    size_t a = order[j - 1], c = order[j];
                    size_t m = d->kn[a] < d->kn[c] ? d->kn[a] : d->kn[c];
                    int cmp = memcmp(d->k[a], d->k[c], m);
                    if (cmp < 0 || (cmp == 0 && d->kn[a] <= d->kn[c])) break;
                    order[j - 1] = c;
                    order[j] = a;
                }
        for (size_t i = 0; i < n; i++) {
            if (i) sb_putc(r, b, ',');
            if (indent >= 0) {
                sb_putc(r, b, '\n');
                for (int k = 0; k < indent * (level + 1); k++) sb_putc(r, b, ' ');
            } else if (i) {
                sb_putc(r, b, ' ');
            }
            if (is_list) {
                tojson(r, b, v.u.l->v[i], indent, level + 1, sort, pos);
            } else {
                tojson(r, b, v_str(v.u.d->k[order[i]], v.u.d->kn[order[i]]), -1, 0, 0, pos);
                sb_puts(r, b, ": ");
                tojson(r, b, v.u.d->v[order[i]], indent, level + 1, sort, pos);
            }
        }
        if (indent >= 0) {
            sb_putc(r, b, '\n');
            for (int k = 0; k < indent * level; k++) sb_putc(r, b, ' ');
        }
        sb_putc(r, b, is_list ? ']' : '}');
        return;
    }
    default:
        die(r, TL_ERR_ARG, pos, "tojson: a value of this type (%s) is not JSON serializable",
            v.t == T_UNDEF ? "Undefined" : "function");
    }
}

/* ---- JSON input ------------------------------------------------------------ */

typedef struct jp {
    R *r;
    const char *b, *s, *e;
    int depth;
} jp;

static _Noreturn void jfail(jp *j, const char *what) {
    die(j->r, TL_ERR_FORMAT, -1, "messages JSON, byte %ld: %s", (long)(j->s - j->b), what);
}

static void jws(jp *j) {
    while (j->s < j->e && (*j->s == ' ' || *j->s == '\t' || *j->s == '\n' || *j->s == '\r')) j->s++;
}

static void put_utf8(R *r, sb *b, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) { u[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { u[0] = (char)(0xc0 | cp >> 6); u[1] = (char)(0x80 | (cp & 63)); n = 2; }
    else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | cp >> 12); u[1] = (char)(0x80 | ((cp >> 6) & 63));
        u[2] = (char)(0x80 | (cp & 63)); n = 3;
    } else {
        u[0] = (char)(0xf0 | cp >> 18); u[1] = (char)(0x80 | ((cp >> 12) & 63));
        u[2] = (char)(0x80 | ((cp >> 6) & 63)); u[3] = (char)(0x80 | (cp & 63)); n = 4;
    }
    sb_add(r, b, u, n);
}

static int hex4(const char *s, const char *e, unsigned *out) {
    if (e - s < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static val jstring(jp *j) {
    sb b = {0};
    j->s++; /* opening quote */
    for (;;) {
        if (j->s >= j->e) jfail(j, "unterminated string");
        char c = *j->s++;
        if (c == '"') break;
        if ((unsigned char)c < 0x20) jfail(j, "control character in string");
        if (c != '\\') {
            sb_putc(j->r, &b, c);
            continue;
        }
        if (j->s >= j->e) jfail(j, "unterminated string");
        c = *j->s++;
        const char *m = strchr("\"\\/bfnrt", c);
        if (m && c) {
            sb_putc(j->r, &b, "\"\\/\b\f\n\r\t"[m - "\"\\/bfnrt"]);
        } else if (c == 'u') {
            unsigned cp, lo;
            if (hex4(j->s, j->e, &cp)) jfail(j, "bad \\u escape");
            j->s += 4;
            if (cp >= 0xd800 && cp < 0xdc00 && j->e - j->s >= 6 && j->s[0] == '\\' &&
                j->s[1] == 'u' && !hex4(j->s + 2, j->e, &lo) && lo >= 0xdc00 && lo < 0xe000) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                j->s += 6;
            }
            put_utf8(j->r, &b, cp);
        } else {
            jfail(j, "bad escape");
        }
    }
    if (!b.s) return v_str("", 0);
    return sb_val(&b);
}

static val jvalue(jp *j) {
    jws(j);
    if (j->s >= j->e) jfail(j, "unexpected end");
    if (++j->depth > MAX_DEPTH) jfail(j, "nested too deeply");
    val out;
    char c = *j->s;
    if (c == '"') {
        out = jstring(j);
    } else if (c == '[') {
        vlist *l = list_new(j->r);
        j->s++;
        jws(j);
        if (j->s < j->e && *j->s == ']') j->s++;
        else for (;;) {
            list_push(j->r, l, jvalue(j));
            jws(j);
            if (j->s < j->e && *j->s == ',') { j->s++; continue; }
            if (j->s < j->e && *j->s == ']') { j->s++; break; }
            jfail(j, "expected , or ]");
        }
        out = v_list(l);
    } else if (c == '{') {
        vdict *d = dict_new(j->r);
        j->s++;
        jws(j);
        if (j->s < j->e && *j->s == '}') j->s++;
        else for (;;) {
            jws(j);
            if (j->s >= j->e || *j->s != '"') jfail(j, "expected a key");
            val k = jstring(j);
            jws(j);
            if (j->s >= j->e || *j->s != ':') jfail(j, "expected :");
            j->s++;
            dict_set(j->r, d, k.u.s.s, k.u.s.n, jvalue(j));
            jws(j);
            if (j->s < j->e && *j->s == ',') { j->s++; continue; }
            if (j->s < j->e && *j->s == '}') { j->s++; break; }
            jfail(j, "expected , or }");
        }
        out = v_dict(d);
    } else if (!strncmp(j->s, "true", 4) && j->e - j->s >= 4) { j->s += 4; out = v_bool(1); }
    else if (!strncmp(j->s, "false", 5) && j->e - j->s >= 5) { j->s += 5; out = v_bool(0); }
    else if (!strncmp(j->s, "null", 4) && j->e - j->s >= 4) { j->s += 4; out = v_none(); }
    else if (c == '-' || (c >= '0' && c <= '9')) {
        const char *p = j->s;
        int is_f = 0;
        while (p < j->e && strchr("+-0123456789.eE", *p) && *p) {
            if (*p == '.' || *p == 'e' || *p == 'E') is_f = 1;
            p++;
        }
        char *tmp = astrdup(j->r, j->s, (size_t)(p - j->s)), *end;
        if (is_f) out = v_float(strtod(tmp, &end));
        else out = v_int(strtoll(tmp, &end, 10));
        if (*end) jfail(j, "bad number");
        j->s = p;
    } else {
        jfail(j, "unexpected character");
    }
    j->depth--;
    return out;
}

/* ---- lexer: text, tags and the tokens inside tags ----------------------------- */

enum { K_TEXT, K_VAR_BEGIN, K_VAR_END, K_BLOCK_BEGIN, K_BLOCK_END, K_NAME, K_STR, K_INT,
       K_FLOAT, K_OP, K_EOF };

typedef struct tok {
    int k, pos;
    const char *s; /* text, name, string value or operator */
    size_t n;
    long long i;
    double f;
} tok;

typedef struct lexer {
    R *r;
    const char *src;
    size_t len, pos;
    tok *t;
    size_t n, cap;
    int line_starting;
} lexer;

static void lex_push(lexer *L, tok t) {
    if (L->n == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 256;
        tok *nt = aalloc(L->r, nc * sizeof *nt);
        if (L->n) memcpy(nt, L->t, L->n * sizeof *nt);
        L->t = nt;
        L->cap = nc;
    }
    L->t[L->n++] = t;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static int is_ident0(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Emits the text before a tag, applying '-' and lstrip_blocks the way
 * jinja2's lexer does. */
static void lex_text(lexer *L, size_t start, size_t end, char sign, int is_var) {
    const char *s = L->src + start;
    size_t n = end - start;
    if (sign == '-') {
        while (n && is_ws(s[n - 1])) n--;
    } else if (sign != '+' && !is_var) {
        size_t l = n;
        while (l && s[l - 1] != '\n') l--;
        if (l > 0 || L->line_starting) {
            size_t k = l;
            while (k < n && is_ws(s[k])) k++;
            if (k == n && n > l) n = l;
        }
    }
    if (n) {
        tok t = {.k = K_TEXT, .pos = (int)start, .s = s, .n = n};
        lex_push(L, t);
    }
}

static void lex_string(lexer *L, tok *t) {
    char q = L->src[L->pos];
    size_t p = L->pos + 1;
    sb b = {0};
    for (;;) {
        if (p >= L->len) die(L->r, TL_ERR_FORMAT, t->pos, "unterminated string literal");
        char c = L->src[p++];
        if (c == q) break;
        if (c != '\\' || p >= L->len) {
            sb_putc(L->r, &b, c);
            continue;
        }
        c = L->src[p++];
        switch (c) {
        case 'n': sb_putc(L->r, &b, '\n'); break;
        case 't': sb_putc(L->r, &b, '\t'); break;
        case 'r': sb_putc(L->r, &b, '\r'); break;
        case '\\': case '\'': case '"': sb_putc(L->r, &b, c); break;
        case '\n': break;
        case 'u': {
            unsigned cp;
            if (hex4(L->src + p, L->src + L->len, &cp))
                die(L->r, TL_ERR_FORMAT, t->pos, "bad \\u escape in string literal");
            p += 4;
            put_utf8(L->r, &b, cp);
            break;
        }
        default: /* Python keeps unknown escapes as written */
            sb_putc(L->r, &b, '\\');
            sb_putc(L->r, &b, c);
        }
    }
    t->k = K_STR;
    t->s = b.s ? b.s : "";
    t->n = b.n;
    L->pos = p;
}

/* Lexes the inside of a tag up to its end; returns after pushing the end. */
static void lex_tag(lexer *L, int is_var) {
    int depth = 0;
    for (;;) {
        while (L->pos < L->len && is_ws(L->src[L->pos])) L->pos++;
        if (L->pos >= L->len) die(L->r, TL_ERR_FORMAT, (int)L->pos, "unclosed tag at end of template");
        const char *p = L->src + L->pos;
        size_t left = L->len - L->pos;
        tok t = {.pos = (int)L->pos};
        if (depth == 0) {
            const char *end = is_var ? "}}" : "%}";
            int sign = (left >= 3 && (p[0] == '-' || (p[0] == '+' && !is_var)) && !memcmp(p + 1, end, 2))
                           ? p[0] : 0;
            if (sign || (left >= 2 && !memcmp(p, end, 2))) {
                L->pos += sign ? 3 : 2;
                if (sign == '-') {
                    while (L->pos < L->len && is_ws(L->src[L->pos])) L->pos++;
                } else if (!sign && !is_var && L->pos < L->len && L->src[L->pos] == '\n') {
                    L->pos++; /* trim_blocks */
                }
                L->line_starting = L->src[L->pos - 1] == '\n';
                t.k = is_var ? K_VAR_END : K_BLOCK_END;
                lex_push(L, t);
                return;
            }
        }
        if (is_ident0(*p)) {
            size_t n = 1;
            while (n < left && (is_ident0(p[n]) || is_digit(p[n]))) n++;
            t.k = K_NAME;
            t.s = p;
            t.n = n;
            L->pos += n;
        } else if (is_digit(*p)) {
            size_t n = 0;
            int is_f = 0;
            while (n < left && (is_digit(p[n]) || p[n] == '_')) n++;
            if (n + 1 < left && p[n] == '.' && is_digit(p[n + 1])) {
                is_f = 1;
                n++;
                while (n < left && is_digit(p[n])) n++;
            }
            if (n < left && (p[n] == 'e' || p[n] == 'E')) {
                size_t m = n + 1;
                if (m < left && (p[m] == '+' || p[m] == '-')) m++;
                if (m < left && is_digit(p[m])) {
                    is_f = 1;
                    n = m;
                    while (n < left && is_digit(p[n])) n++;
                }
            }
            char *tmp = aalloc(L->r, n + 1);
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (p[i] != '_') tmp[k++] = p[i];
            t.k = is_f ? K_FLOAT : K_INT;
            if (is_f) t.f = strtod(tmp, NULL);
            else t.i = strtoll(tmp, NULL, 10);
            L->pos += n;
        } else if (*p == '\'' || *p == '"') {
            lex_string(L, &t);
        } else {
            static const char *ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/",
                                        "%", "~", "(", ")", "[", "]", "{", "}", ",", ".",
                                        ":", "|", "=", "<", ">"};
            size_t i;
            for (i = 0; i < sizeof ops / sizeof ops[0]; i++)
                if (left >= strlen(ops[i]) && !memcmp(p, ops[i], strlen(ops[i]))) break;
            if (i == sizeof ops / sizeof ops[0])
                die(L->r, TL_ERR_FORMAT, t.pos, "unexpected character '%c' in tag", *p);
            t.k = K_OP;
            t.s = ops[i];
            t.n = strlen(ops[i]);
            if (*p == '(' || *p == '[' || *p == '{') depth++;
            if ((*p == ')' || *p == ']' || *p == '}') && depth > 0) depth--;
            L->pos += t.n;
        }
        lex_push(L, t);
    }
}

static void lex_comment(lexer *L) {
    const char *q = strstr(L->src + L->pos, "#}");
    if (!q) die(L->r, TL_ERR_FORMAT, (int)L->pos, "unclosed comment");
    size_t at = (size_t)(q - L->src);
    char sign = at > L->pos ? L->src[at - 1] : 0;
    L->pos = at + 2;
    if (sign == '-') {
        while (L->pos < L->len && is_ws(L->src[L->pos])) L->pos++;
    } else if (sign != '+' && L->pos < L->len && L->src[L->pos] == '\n') {
        L->pos++;
    }
    L->line_starting = L->src[L->pos - 1] == '\n';
}

static void lex_all(lexer *L) {
    L->line_starting = 1;
    while (L->pos < L->len) {
        const char *p = L->src + L->pos, *tag = NULL;
        for (const char *q = p; (q = strchr(q, '{')) != NULL; q++)
            if (q[1] == '{' || q[1] == '%' || q[1] == '#') {
                tag = q;
                break;
            }
        if (!tag) {
            lex_text(L, L->pos, L->len, '+', 1);
            break;
        }
        size_t at = (size_t)(tag - L->src);
        char kind = tag[1], sign = (tag[2] == '-' || tag[2] == '+') ? tag[2] : 0;
        lex_text(L, L->pos, at, sign, kind == '{');
        L->pos = at + 2 + (sign ? 1 : 0);
        L->line_starting = 0;
        if (kind == '#') {
            lex_comment(L);
            continue;
        }
        tok t = {.k = kind == '{' ? K_VAR_BEGIN : K_BLOCK_BEGIN, .pos = (int)at};
        lex_push(L, t);
        lex_tag(L, kind == '{');
    }
    tok e = {.k = K_EOF, .pos = (int)L->len};
    lex_push(L, e);
}

/* ---- parser: tokens to a tree ------------------------------------------------- */

enum {
    /* statements */
    N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE,
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_INDEX, N_SLICE, N_CALL, N_FILTER, N_TEST, N_BIN, N_CMP, N_NOT,
    N_NEG, N_AND, N_OR, N_COND, N_LIST, N_TUPLE, N_DICT
};

struct node {
    int k, pos;
    int op;            /* N_BIN/N_CMP operator; N_TEST: negated */
    const char *name;  /* names, attributes, filters, tests */
    const char *attr;  /* N_SET on a namespace attribute */
    node *a, *b, *c, *d;
    node **list;       /* body, arguments, items, keys */
    node **list2;      /* dict values, macro defaults */
    const char **names; /* kwarg names, for-targets, macro parameters */
    int n, nkw, nnames; /* list length (positional), kwargs after them, names */
    val v;
};

typedef struct parser {
    R *r;
    tok *t;
    size_t i;
    int depth;
} parser;

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

static tok *cur(parser *P) { return &P->t[P->i]; }
static node *mk(parser *P, int k, int pos) {
    node *n = aalloc(P->r, sizeof *n);
    n->k = k;
    n->pos = pos;
    return n;
}
static int is_op(parser *P, const char *op) {
    tok *t = cur(P);
    return t->k == K_OP && t->n == strlen(op) && !memcmp(t->s, op, t->n);
}
static int is_name(parser *P, const char *nm) {
    tok *t = cur(P);
    return t->k == K_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n);
}
static int peek_name(parser *P, size_t ahead, const char *nm) {
    tok *t = &P->t[P->i + ahead];
    if (t->k == K_EOF) return 0;
    return t->k == K_NAME && t->n == strlen(nm) && !memcmp(t->s, nm, t->n);
}
static _Noreturn void perr(parser *P, const char *what) {
    tok *t = cur(P);
    const char *got = t->k == K_EOF ? "end of template" : t->k == K_BLOCK_END ? "%}" :
                      t->k == K_VAR_END ? "}}" : NULL;
    if (got) die(P->r, TL_ERR_FORMAT, t->pos, "%s (found %s)", what, got);
    die(P->r, TL_ERR_FORMAT, t->pos, "%s (found '%.*s')", what, (int)(t->n > 40 ? 40 : t->n),
        t->k == K_STR || t->k == K_INT || t->k == K_FLOAT ? "literal" : t->s);
}
static void expect_op(parser *P, const char *op) {
    if (!is_op(P, op)) {
        char m[64];
        snprintf(m, sizeof m, "expected '%s'", op);
        perr(P, m);
    }
    P->i++;
}
static const char *take_name(parser *P) {
    tok *t = cur(P);
    if (t->k != K_NAME) perr(P, "expected a name");
    P->i++;
    return astrdup(P->r, t->s, t->n);
}

/* Nodes collected in a growable array, then frozen into node fields. */
typedef struct nvec {
    node **v;
    const char **nm;
    size_t n, cap;
} nvec;
static void nv_push(R *r, nvec *a, node *x, const char *nm) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 8;
        node **nv = aalloc(r, nc * sizeof *nv);
        const char **nn = aalloc(r, nc * sizeof *nn);
        if (a->n) {
            memcpy(nv, a->v, a->n * sizeof *nv);
            memcpy(nn, a->nm, a->n * sizeof *nn);
        }
        a->v = nv;
        a->nm = nn;
        a->cap = nc;
    }
    a->v[a->n] = x;
    a->nm[a->n++] = nm;
}

static node *p_expr(parser *P);
static node *p_unary(parser *P, int with_filter);

/* (args, name=kwargs): positional first, then kwargs, in node->list. */
static void p_args(parser *P, node *n) {
    nvec pos = {0}, kw = {0};
    expect_op(P, "(");
    while (!is_op(P, ")")) {
        if (pos.n + kw.n) expect_op(P, ",");
        if (is_op(P, ")")) break;
        tok *t = cur(P);
        if (t->k == K_NAME && P->t[P->i + 1].k == K_OP && P->t[P->i + 1].n == 1 &&
            P->t[P->i + 1].s[0] == '=') {
            const char *nm = take_name(P);
            P->i++;
            nv_push(P->r, &kw, p_expr(P), nm);
        } else {
            if (kw.n) perr(P, "positional argument after keyword argument");
            nv_push(P->r, &pos, p_expr(P), NULL);
        }
    }
    P->i++;
    n->n = (int)pos.n;
    n->nkw = (int)kw.n;
    n->list = aalloc(P->r, (pos.n + kw.n + 1) * sizeof(node *));
    n->names = aalloc(P->r, (pos.n + kw.n + 1) * sizeof(char *));
    for (size_t i = 0; i < pos.n; i++) n->list[i] = pos.v[i];
    for (size_t i = 0; i < kw.n; i++) {
        n->list[pos.n + i] = kw.v[i];
        n->names[pos.n + i] = kw.nm[i];
    }
}

static void freeze(parser *P, node *n, nvec *a) {
    n->n = (int)a->n;
    n->list = aalloc(P->r, (a->n + 1) * sizeof(node *));
    if (a->n) memcpy(n->list, a->v, a->n * sizeof(node *));
}

static node *p_primary(parser *P) {
    tok *t = cur(P);
    node *n;
    if (t->k == K_STR) {
        n = mk(P, N_LIT, t->pos);
        sb b = {0};
        sb_add(P->r, &b, t->s, t->n);
        P->i++;
        while (cur(P)->k == K_STR) { /* adjacent literals join, as in Python */
            sb_add(P->r, &b, cur(P)->s, cur(P)->n);
            P->i++;
        }
        n->v = v_str(b.s ? b.s : "", b.n);
    } else if (t->k == K_INT || t->k == K_FLOAT) {
        n = mk(P, N_LIT, t->pos);
        n->v = t->k == K_INT ? v_int(t->i) : v_float(t->f);
        P->i++;
    } else if (t->k == K_NAME) {
        n = mk(P, N_LIT, t->pos);
        if (is_name(P, "true") || is_name(P, "True")) n->v = v_bool(1);
        else if (is_name(P, "false") || is_name(P, "False")) n->v = v_bool(0);
        else if (is_name(P, "none") || is_name(P, "None")) n->v = v_none();
        else {
            n->k = N_NAME;
            n->name = astrdup(P->r, t->s, t->n);
        }
        P->i++;
    } else if (is_op(P, "(")) {
        int pos = t->pos;
        P->i++;
        if (is_op(P, ")")) {
            P->i++;
            n = mk(P, N_TUPLE, pos);
            return n;
        }
        node *first = p_expr(P);
        if (!is_op(P, ",")) {
            expect_op(P, ")");
            return first;
        }
        nvec items = {0};
        nv_push(P->r, &items, first, NULL);
        while (is_op(P, ",")) {
            P->i++;
            if (is_op(P, ")")) break;
            nv_push(P->r, &items, p_expr(P), NULL);
        }
        expect_op(P, ")");
        n = mk(P, N_TUPLE, pos);
        freeze(P, n, &items);
    } else if (is_op(P, "[")) {
        n = mk(P, N_LIST, t->pos);
        P->i++;
        nvec items = {0};
        while (!is_op(P, "]")) {
            if (items.n) expect_op(P, ",");
            if (is_op(P, "]")) break;
            nv_push(P->r, &items, p_expr(P), NULL);
        }
        P->i++;
        freeze(P, n, &items);
    } else if (is_op(P, "{")) {
        n = mk(P, N_DICT, t->pos);
        P->i++;
        nvec keys = {0}, vals = {0};
        while (!is_op(P, "}")) {
            if (keys.n) expect_op(P, ",");
            if (is_op(P, "}")) break;
            nv_push(P->r, &keys, p_expr(P), NULL);
            expect_op(P, ":");
            nv_push(P->r, &vals, p_expr(P), NULL);
        }
        P->i++;
        freeze(P, n, &keys);
        n->list2 = vals.v;
    } else {
        perr(P, "expected an expression");
    }
    return n;
}

static node *p_postfix(parser *P, node *n) {
    for (;;) {
        int pos = cur(P)->pos;
        if (is_op(P, ".")) {
            P->i++;
            node *a = mk(P, N_ATTR, pos);
            a->a = n;
            if (cur(P)->k == K_INT) { /* foo.0 is foo[0] */
                a->k = N_INDEX;
                a->b = mk(P, N_LIT, pos);
                a->b->v = v_int(cur(P)->i);
                P->i++;
            } else {
                a->name = take_name(P);
            }
            n = a;
        } else if (is_op(P, "[")) {
            P->i++;
            node *parts[3] = {NULL, NULL, NULL};
            int k = 0, slice = 0;
            for (;;) {
                if (!is_op(P, ":") && !is_op(P, "]")) parts[k] = p_expr(P);
                if (is_op(P, ":") && k < 2) {
                    slice = 1;
                    k++;
                    P->i++;
                    continue;
                }
                break;
            }
            expect_op(P, "]");
            node *x = mk(P, slice ? N_SLICE : N_INDEX, pos);
            x->a = n;
            if (!slice && !parts[0]) perr(P, "empty subscript");
            x->b = parts[0];
            x->c = parts[1];
            x->d = parts[2];
            n = x;
        } else if (is_op(P, "(")) {
            node *c = mk(P, N_CALL, pos);
            c->a = n;
            p_args(P, c);
            n = c;
        } else {
            return n;
        }
    }
}

static node *p_filters(parser *P, node *n) {
    for (;;) {
        int pos = cur(P)->pos;
        if (is_op(P, "|")) {
            P->i++;
            node *f = mk(P, N_FILTER, pos);
            f->name = take_name(P);
            f->a = n;
            if (is_op(P, "(")) p_args(P, f);
            n = f;
        } else if (is_name(P, "is")) {
            P->i++;
            node *t = mk(P, N_TEST, pos);
            if (is_name(P, "not")) {
                t->op = 1;
                P->i++;
            }
            t->name = take_name(P);
            t->a = n;
            tok *x = cur(P);
            if (is_op(P, "(")) {
                p_args(P, t);
            } else if (x->k == K_STR || x->k == K_INT || x->k == K_FLOAT ||
                       (x->k == K_NAME && !is_name(P, "and") && !is_name(P, "or") &&
                        !is_name(P, "else") && !is_name(P, "if") && !is_name(P, "in") &&
                        !is_name(P, "not") && !is_name(P, "is"))) {
                t->n = 1; /* `is divisibleby 3`: one argument without parentheses */
                t->list = aalloc(P->r, 2 * sizeof(node *));
                t->names = aalloc(P->r, 2 * sizeof(char *));
                t->list[0] = p_postfix(P, p_primary(P));
            }
            n = t;
        } else {
            return n;
        }
    }
}

static node *p_unary(parser *P, int with_filter) {
    int pos = cur(P)->pos;
    node *n;
    if (++P->depth > MAX_DEPTH) die(P->r, TL_ERR_FORMAT, pos, "expression nested too deeply");
    if (is_op(P, "-") || is_op(P, "+")) {
        int neg = is_op(P, "-");
        P->i++;
        node *x = p_unary(P, 0);
        if (neg) {
            n = mk(P, N_NEG, pos);
            n->a = x;
        } else {
            n = x;
        }
    } else {
        n = p_postfix(P, p_primary(P));
    }
    if (with_filter) n = p_filters(P, n);
    P->depth--;
    return n;
}

static node *bin(parser *P, int k, int op, int pos, node *a, node *b) {
    node *n = mk(P, k, pos);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static node *p_pow(parser *P) {
    node *n = p_unary(P, 1);
    while (is_op(P, "**")) {
        int pos = cur(P)->pos;
        P->i++;
        n = bin(P, N_BIN, OP_POW, pos, n, p_unary(P, 1));
    }
    return n;
}
static node *p_math2(parser *P) {
    node *n = p_pow(P);
    for (;;) {
        int pos = cur(P)->pos, op;
        if (is_op(P, "*")) op = OP_MUL;
        else if (is_op(P, "/")) op = OP_DIV;
        else if (is_op(P, "//")) op = OP_FLOORDIV;
        else if (is_op(P, "%")) op = OP_MOD;
        else return n;
        P->i++;
        n = bin(P, N_BIN, op, pos, n, p_pow(P));
    }
}
static node *p_concat(parser *P) {
    node *n = p_math2(P);
    while (is_op(P, "~")) {
        int pos = cur(P)->pos;
        P->i++;
        n = bin(P, N_BIN, OP_CONCAT, pos, n, p_math2(P));
    }
    return n;
}
static node *p_math1(parser *P) {
    node *n = p_concat(P);
    for (;;) {
        int pos = cur(P)->pos, op;
        if (is_op(P, "+")) op = OP_ADD;
        else if (is_op(P, "-")) op = OP_SUB;
        else return n;
        P->i++;
        n = bin(P, N_BIN, op, pos, n, p_concat(P));
    }
}
static node *p_compare(parser *P) {
    node *n = p_math1(P), *prev = n, *all = NULL;
    for (;;) {
        int pos = cur(P)->pos, op;
        if (is_op(P, "==")) op = OP_EQ;
        else if (is_op(P, "!=")) op = OP_NE;
        else if (is_op(P, "<")) op = OP_LT;
        else if (is_op(P, "<=")) op = OP_LE;
        else if (is_op(P, ">")) op = OP_GT;
        else if (is_op(P, ">=")) op = OP_GE;
        else if (is_name(P, "in")) op = OP_IN;
        else if (is_name(P, "not") && peek_name(P, 1, "in")) {
            op = OP_NOTIN;
            P->i++;
        } else break;
        P->i++;
        node *rhs = p_math1(P);
        node *c = bin(P, N_CMP, op, pos, prev, rhs);
        all = all ? bin(P, N_AND, 0, pos, all, c) : c; /* a < b < c: (a<b) and (b<c) */
        prev = rhs;
    }
    return all ? all : n;
}
static node *p_not(parser *P) {
    if (is_name(P, "not")) {
        node *n = mk(P, N_NOT, cur(P)->pos);
        P->i++;
        if (++P->depth > MAX_DEPTH) die(P->r, TL_ERR_FORMAT, n->pos, "expression nested too deeply");
        n->a = p_not(P);
        P->depth--;
        return n;
    }
    return p_compare(P);
}
static node *p_and(parser *P) {
    node *n = p_not(P);
    while (is_name(P, "and")) {
        int pos = cur(P)->pos;
        P->i++;
        n = bin(P, N_AND, 0, pos, n, p_not(P));
    }
    return n;
}
static node *p_or(parser *P) {
    node *n = p_and(P);
    while (is_name(P, "or")) {
        int pos = cur(P)->pos;
        P->i++;
        n = bin(P, N_OR, 0, pos, n, p_and(P));
    }
    return n;
}
static node *p_expr(parser *P) {
    if (++P->depth > MAX_DEPTH) die(P->r, TL_ERR_FORMAT, cur(P)->pos, "expression nested too deeply");
    node *n = p_or(P);
    while (is_name(P, "if")) {
        node *c = mk(P, N_COND, cur(P)->pos);
        P->i++;
        c->a = p_or(P);
        c->b = n;
        if (is_name(P, "else")) {
            P->i++;
            c->c = p_expr(P);
        }
        n = c;
    }
    P->depth--;
    return n;
}

/* ---- statements ---------------------------------------------------------------- */

static void expect_end(parser *P) {
    if (cur(P)->k != K_BLOCK_END) perr(P, "expected end of tag '%}'");
    P->i++;
}

/* Parses statements until a block tag whose keyword is one of `ends`
 * (NULL-terminated); leaves the parser on that keyword. */
static node *p_body(parser *P, const char *const *ends);

static int at_end_kw(parser *P, const char *const *ends) {
    if (cur(P)->k != K_BLOCK_BEGIN) return 0;
    for (int i = 0; ends && ends[i]; i++)
        if (peek_name(P, 1, ends[i])) return 1;
    return 0;
}

static node *p_if(parser *P, int pos) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    node *n = mk(P, N_IF, pos);
    n->a = p_expr(P);
    expect_end(P);
    n->b = p_body(P, ends);
    P->i++; /* BLOCK_BEGIN */
    if (is_name(P, "elif")) {
        int p2 = cur(P)->pos;
        P->i++;
        n->c = p_if(P, p2);
        return n;
    }
    if (is_name(P, "else")) {
        static const char *const e2[] = {"endif", NULL};
        P->i++;
        expect_end(P);
        n->c = p_body(P, e2);
        P->i++;
    }
    P->i++; /* endif */
    expect_end(P);
    return n;
}

static node *p_for(parser *P, int pos) {
    static const char *const ends[] = {"else", "endfor", NULL};
    node *n = mk(P, N_FOR, pos);
    nvec names = {0};
    int paren = is_op(P, "(");
    if (paren) P->i++;
    do {
        if (names.n) P->i++;
        nv_push(P->r, &names, NULL, take_name(P));
    } while (is_op(P, ","));
    if (paren) expect_op(P, ")");
    n->names = names.nm;
    n->nnames = (int)names.n;
    if (!is_name(P, "in")) perr(P, "expected 'in' in for");
    P->i++;
    n->a = p_or(P); /* not p_expr: a trailing `if` filters the loop */
    n->a = p_filters(P, n->a);
    if (is_name(P, "if")) {
        P->i++;
        n->d = p_expr(P);
    }
    if (is_name(P, "recursive")) die(P->r, TL_ERR_UNSUPPORTED, cur(P)->pos, "unsupported construct: recursive for loops");
    expect_end(P);
    n->b = p_body(P, ends);
    P->i++;
    if (is_name(P, "else")) {
        static const char *const e2[] = {"endfor", NULL};
        P->i++;
        expect_end(P);
        n->c = p_body(P, e2);
        P->i++;
    }
    P->i++;
    expect_end(P);
    return n;
}

static node *p_set(parser *P, int pos) {
    node *n = mk(P, N_SET, pos);
    n->name = take_name(P);
    if (is_op(P, ".")) {
        P->i++;
        n->attr = take_name(P);
    } else if (is_op(P, ",")) {
        die(P->r, TL_ERR_UNSUPPORTED, cur(P)->pos, "unsupported construct: set with several targets");
    }
    if (cur(P)->k == K_BLOCK_END && !n->attr) { /* {% set x %}...{% endset %} */
        static const char *const ends[] = {"endset", NULL};
        P->i++;
        n->k = N_SETBLOCK;
        n->b = p_body(P, ends);
        P->i += 2;
        expect_end(P);
        return n;
    }
    expect_op(P, "=");
    n->a = p_expr(P);
    expect_end(P);
    return n;
}

static node *p_macro(parser *P, int pos) {
    static const char *const ends[] = {"endmacro", NULL};
    node *n = mk(P, N_MACRO, pos);
    n->name = take_name(P);
    nvec params = {0};
    expect_op(P, "(");
    while (!is_op(P, ")")) {
        if (params.n) expect_op(P, ",");
        const char *nm = take_name(P);
        node *def = NULL;
        if (is_op(P, "=")) {
            P->i++;
            def = p_expr(P);
        }
        nv_push(P->r, &params, def, nm);
    }
    P->i++;
    expect_end(P);
    n->names = params.nm;
    n->list2 = params.v;
    n->nnames = (int)params.n;
    n->b = p_body(P, ends);
    P->i += 2;
    expect_end(P);
    return n;
}

static node *p_stmt(parser *P) {
    int pos = cur(P)->pos;
    P->i++; /* BLOCK_BEGIN */
    tok *t = cur(P);
    if (t->k != K_NAME) perr(P, "expected a statement keyword");
    const char *kw = astrdup(P->r, t->s, t->n);
    int kpos = t->pos;
    P->i++;
    node *n;
    if (!strcmp(kw, "if")) return p_if(P, pos);
    if (!strcmp(kw, "for")) return p_for(P, pos);
    if (!strcmp(kw, "set")) return p_set(P, pos);
    if (!strcmp(kw, "macro")) return p_macro(P, pos);
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        n = mk(P, kw[0] == 'b' ? N_BREAK : N_CONTINUE, pos);
        expect_end(P);
        return n;
    }
    if (!strcmp(kw, "generation")) { /* transformers' assistant-mask marker: renders its body */
        static const char *const ends[] = {"endgeneration", NULL};
        expect_end(P);
        n = p_body(P, ends);
        P->i += 2;
        expect_end(P);
        return n;
    }
    die(P->r, TL_ERR_UNSUPPORTED, kpos, "unsupported construct: {%% %s %%}", kw);
}

static node *p_body(parser *P, const char *const *ends) {
    node *body = mk(P, N_BODY, cur(P)->pos);
    nvec items = {0};
    if (++P->depth > MAX_DEPTH) die(P->r, TL_ERR_FORMAT, cur(P)->pos, "blocks nested too deeply");
    for (;;) {
        tok *t = cur(P);
        if (t->k == K_EOF) {
            if (ends) {
                char m[80];
                int last = 0;
                while (ends[last + 1]) last++;
                snprintf(m, sizeof m, "missing {%% %s %%}", ends[last]);
                perr(P, m);
            }
            break;
        }
        if (t->k == K_TEXT) {
            node *x = mk(P, N_TEXT, t->pos);
            x->v = v_str(t->s, t->n);
            nv_push(P->r, &items, x, NULL);
            P->i++;
        } else if (t->k == K_VAR_BEGIN) {
            node *x = mk(P, N_OUT, t->pos);
            P->i++;
            x->a = p_expr(P);
            if (cur(P)->k != K_VAR_END) perr(P, "expected '}}'");
            P->i++;
            nv_push(P->r, &items, x, NULL);
        } else if (t->k == K_BLOCK_BEGIN) {
            if (at_end_kw(P, ends)) break;
            tok *kw = &P->t[P->i + 1];
            if (kw->k == K_NAME && (kw->n > 3 && (!memcmp(kw->s, "end", 3) || !strncmp(kw->s, "elif", kw->n) ||
                                                  !strncmp(kw->s, "else", kw->n))))
                die(P->r, TL_ERR_FORMAT, kw->pos, "unexpected {%% %.*s %%}", (int)kw->n, kw->s);
            nv_push(P->r, &items, p_stmt(P), NULL);
        } else {
            perr(P, "unexpected token");
        }
    }
    P->depth--;
    freeze(P, body, &items);
    return body;
}

/* ---- evaluation ------------------------------------------------------------------ */

struct scope {
    scope *parent;
    vdict vars;
};

enum { F_RANGE, F_NAMESPACE, F_RAISE, F_STRFTIME, F_DICT };

static scope *scope_new(R *r, scope *parent) {
    scope *s = aalloc(r, sizeof *s);
    s->parent = parent;
    return s;
}
static void scope_set(R *r, scope *s, const char *name, val v) { dict_set(r, &s->vars, name, strlen(name), v); }
static val lookup(R *r, scope *s, const char *name) {
    for (; s; s = s->parent) {
        val *p = dict_find(&s->vars, name, strlen(name));
        if (p) return *p;
    }
    static const struct { const char *n; int f; } builtins[] = {
        {"range", F_RANGE}, {"namespace", F_NAMESPACE}, {"raise_exception", F_RAISE},
        {"strftime_now", F_STRFTIME}, {"dict", F_DICT}};
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (!strcmp(name, builtins[i].n)) {
            val f = {.t = T_FUNC};
            f.u.fn = builtins[i].f;
            return f;
        }
    return v_undef(name);
}

static _Noreturn void undef_err(R *r, int pos, val v) {
    die(r, TL_ERR_ARG, pos, "'%s' is undefined", v.undef_name ? v.undef_name : "value");
}

static const char *type_name(val v) {
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list",
                                  "dict", "Namespace", "function", "method", "macro"};
    if (v.t == T_LIST && v.u.l->tuple) return "tuple";
    return names[v.t];
}

static int val_eq(val a, val b) {
    if (is_num(a) && is_num(b)) {
        if (a.t == T_FLOAT || b.t == T_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case T_UNDEF: case T_NONE: return 1;
    case T_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.s, b.u.s.s, a.u.s.n);
    case T_LIST:
        if (a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!val_eq(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case T_DICT: case T_NS:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            val *o = dict_find(b.u.d, a.u.d->k[i], a.u.d->kn[i]);
            if (!o || !val_eq(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    default: return a.u.d == b.u.d;
    }
}

/* -1, 0, 1 for numbers and strings; anything else is a TypeError in Python. */
static int val_cmp(R *r, int pos, val a, val b) {
    if (is_num(a) && is_num(b)) {
        double x = num_f(a), y = num_f(b);
        if (a.t != T_FLOAT && b.t != T_FLOAT) {
            long long i = num_i(a), j = num_i(b);
            return i < j ? -1 : i > j;
        }
        return x < y ? -1 : x > y;
    }
    if (a.t == T_STR && b.t == T_STR) {
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.s, b.u.s.s, m);
        if (c) return c < 0 ? -1 : 1;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.t == T_UNDEF) undef_err(r, pos, a);
    if (b.t == T_UNDEF) undef_err(r, pos, b);
    die(r, TL_ERR_ARG, pos, "cannot compare %s with %s", type_name(a), type_name(b));
}

/* UTF-8 code point boundaries of a string: Python indexes by code point. */
static size_t *cp_offsets(R *r, val s, size_t *ncp) {
    size_t n = 0;
    for (size_t i = 0; i < s.u.s.n; i++)
        if (((unsigned char)s.u.s.s[i] & 0xc0) != 0x80) n++;
    size_t *off = aalloc(r, (n + 1) * sizeof *off);
    size_t k = 0;
    for (size_t i = 0; i < s.u.s.n; i++)
        if (((unsigned char)s.u.s.s[i] & 0xc0) != 0x80) off[k++] = i;
    off[n] = s.u.s.n;
    *ncp = n;
    return off;
}

static size_t val_len(R *r, int pos, val v) {
    size_t n;
    switch (v.t) {
    case T_STR: cp_offsets(r, v, &n); return n;
    case T_LIST: return v.u.l->n;
    case T_DICT: return v.u.d->n;
    case T_UNDEF: return 0;
    default: die(r, TL_ERR_ARG, pos, "object of type '%s' has no len()", type_name(v));
    }
}

/* The items a for loop or a filter walks over. */
static vlist *iter_list(R *r, int pos, val v) {
    vlist *l = list_new(r);
    if (v.t == T_LIST) return v.u.l;
    if (v.t == T_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++) list_push(r, l, v_str(v.u.d->k[i], v.u.d->kn[i]));
    } else if (v.t == T_STR) {
        size_t n, *off = cp_offsets(r, v, &n);
        for (size_t i = 0; i < n; i++) list_push(r, l, v_str(v.u.s.s + off[i], off[i + 1] - off[i]));
    } else if (v.t != T_UNDEF) {
        die(r, TL_ERR_ARG, pos, "'%s' object is not iterable", type_name(v));
    }
    return l;
}

static int contains(R *r, int pos, val hay, val needle) {
    if (hay.t == T_STR) {
        if (needle.t != T_STR) die(r, TL_ERR_ARG, pos, "'in <string>' requires string as left operand");
        if (!needle.u.s.n) return 1;
        if (needle.u.s.n > hay.u.s.n) return 0;
        for (size_t i = 0; i + needle.u.s.n <= hay.u.s.n; i++)
            if (!memcmp(hay.u.s.s + i, needle.u.s.s, needle.u.s.n)) return 1;
        return 0;
    }
    if (hay.t == T_DICT || hay.t == T_NS)
        return needle.t == T_STR && dict_find(hay.u.d, needle.u.s.s, needle.u.s.n) != NULL;
    vlist *l = iter_list(r, pos, hay);
    for (size_t i = 0; i < l->n; i++)
        if (val_eq(l->v[i], needle)) return 1;
    return 0;
}

static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "startswith", "endswith",
                                          "split", "upper", "lower", "title", "capitalize",
                                          "replace", "join", "count", "find", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};

static int in_set(const char *const *set, const char *name) {
    for (int i = 0; set[i]; i++)
        if (!strcmp(set[i], name)) return 1;
    return 0;
}

static val method(R *r, val self, const char *name) {
    val m = {.t = T_METHOD};
    m.u.m.self = aalloc(r, sizeof(val));
    *m.u.m.self = self;
    m.u.m.name = name;
    return m;
}

/* obj.name: jinja tries the Python attribute first, then the item. */
static val get_attr(R *r, int pos, val obj, const char *name) {
    if (obj.t == T_UNDEF) undef_err(r, pos, obj);
    if (obj.t == T_DICT) {
        if (in_set(DICT_METHODS, name)) return method(r, obj, name);
        val *p = dict_find(obj.u.d, name, strlen(name));
        return p ? *p : v_undef(name);
    }
    if (obj.t == T_NS) {
        val *p = dict_find(obj.u.d, name, strlen(name));
        return p ? *p : v_undef(name);
    }
    if (obj.t == T_STR && in_set(STR_METHODS, name)) return method(r, obj, name);
    if (obj.t == T_LIST && (!strcmp(name, "append") || !strcmp(name, "pop") ||
                            !strcmp(name, "insert") || !strcmp(name, "extend") ||
                            !strcmp(name, "remove") || !strcmp(name, "clear") ||
                            !strcmp(name, "sort") || !strcmp(name, "reverse")))
        die(r, TL_ERR_ARG, pos, "access to attribute '%s' of 'list' object is unsafe (sandboxed)", name);
    return v_undef(name);
}

static long long norm_index(long long i, size_t n) { return i < 0 ? i + (long long)n : i; }

static val get_item(R *r, int pos, val obj, val key) {
    if (obj.t == T_UNDEF) undef_err(r, pos, obj);
    if ((obj.t == T_DICT || obj.t == T_NS) && key.t == T_STR) {
        val *p = dict_find(obj.u.d, key.u.s.s, key.u.s.n);
        if (p) return *p;
        return get_attr(r, pos, obj, astrdup(r, key.u.s.s, key.u.s.n));
    }
    if ((obj.t == T_LIST || obj.t == T_STR) && (key.t == T_INT || key.t == T_BOOL)) {
        if (obj.t == T_LIST) {
            long long i = norm_index(num_i(key), obj.u.l->n);
            return i >= 0 && i < (long long)obj.u.l->n ? obj.u.l->v[i] : v_undef("item");
        }
        size_t n, *off = cp_offsets(r, obj, &n);
        long long i = norm_index(num_i(key), n);
        if (i < 0 || i >= (long long)n) return v_undef("item");
        return v_str(obj.u.s.s + off[i], off[i + 1] - off[i]);
    }
    if (key.t == T_STR) return get_attr(r, pos, obj, astrdup(r, key.u.s.s, key.u.s.n));
    return v_undef("item");
}

/* Python slice semantics: obj[start:stop:step] on lists and strings. */
static val get_slice(R *r, int pos, val obj, val vs, val ve, val vst) {
    if (obj.t == T_UNDEF) undef_err(r, pos, obj);
    long long step = vst.t == T_NONE || vst.t == T_UNDEF ? 1 : num_i(vst);
    if (step == 0) die(r, TL_ERR_ARG, pos, "slice step cannot be zero");
    size_t ncp = 0, *off = NULL;
    if (obj.t == T_STR) off = cp_offsets(r, obj, &ncp);
    else if (obj.t == T_LIST) ncp = obj.u.l->n;
    else die(r, TL_ERR_ARG, pos, "'%s' object is not subscriptable", type_name(obj));
    long long n = (long long)ncp, s, e;
    int has_s = vs.t != T_NONE && vs.t != T_UNDEF, has_e = ve.t != T_NONE && ve.t != T_UNDEF;
    if (step > 0) {
        s = has_s ? norm_index(num_i(vs), ncp) : 0;
        e = has_e ? norm_index(num_i(ve), ncp) : n;
        if (s < 0) s = 0;
        if (s > n) s = n;
        if (e < 0) e = 0;
        if (e > n) e = n;
    } else {
        s = has_s ? norm_index(num_i(vs), ncp) : n - 1;
        e = has_e ? norm_index(num_i(ve), ncp) : -1;
        if (s >= n) s = n - 1;
        if (s < -1) s = -1;
        if (e < -1) e = -1;
        if (e >= n) e = n - 1;
    }
    vlist *l = list_new(r);
    sb b = {0};
    for (long long i = s; step > 0 ? i < e : i > e; i += step) {
        if (obj.t == T_LIST) list_push(r, l, obj.u.l->v[i]);
        else sb_add(r, &b, obj.u.s.s + off[i], off[i + 1] - off[i]);
    }
    if (obj.t == T_STR) return b.s ? sb_val(&b) : v_str("", 0);
    return v_list(l);
}

static val eval(R *r, scope *s, const node *n);
static int exec(R *r, scope *s, const node *n, sb *out);

typedef struct args {
    val *v;
    const char **kw; /* kw[i] NULL for positional */
    int n, npos;
} args;

static args eval_args(R *r, scope *s, const node *n) {
    args a = {0};
    a.n = n->n + n->nkw;
    a.npos = n->n;
    a.v = aalloc(r, ((size_t)a.n + 1) * sizeof(val));
    a.kw = aalloc(r, ((size_t)a.n + 1) * sizeof(char *));
    for (int i = 0; i < a.n; i++) {
        a.v[i] = eval(r, s, n->list[i]);
        a.kw[i] = i >= n->n ? n->names[i] : NULL;
    }
    return a;
}

/* Argument i by position or by keyword name; def if absent. */
static val arg(const args *a, int i, const char *name, val def) {
    if (i >= 0 && i < a->npos) return a->v[i];
    for (int k = a->npos; k < a->n; k++)
        if (name && !strcmp(a->kw[k], name)) return a->v[k];
    return def;
}

static val need_str(R *r, int pos, val v, const char *what) {
    if (v.t == T_UNDEF) undef_err(r, pos, v);
    if (v.t != T_STR) die(r, TL_ERR_ARG, pos, "%s expects a string, got %s", what, type_name(v));
    return v;
}

static int in_chars(char c, val chars) {
    if (chars.t != T_STR) return is_ws(c);
    return memchr(chars.u.s.s, c, chars.u.s.n) != NULL;
}

static val str_strip(val s, val chars, int left, int right) {
    const char *p = s.u.s.s;
    size_t n = s.u.s.n;
    while (left && n && in_chars(*p, chars)) { p++; n--; }
    while (right && n && in_chars(p[n - 1], chars)) n--;
    return v_str(p, n);
}

static val str_case(R *r, val s, int mode) { /* 0 lower, 1 upper, 2 capitalize, 3 title (str) */
    char *d = astrdup(r, s.u.s.s, s.u.s.n);
    int prev_cased = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = d[i];
        int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
        int up;
        if (mode == 0) up = 0;
        else if (mode == 1) up = 1;
        else if (mode == 2) up = i == 0;
        else up = !prev_cased;
        if (alpha) d[i] = up ? (char)(c & ~0x20) : (char)(c | 0x20);
        prev_cased = alpha;
    }
    return v_str(d, s.u.s.n);
}

static val str_replace(R *r, val s, val old, val new_, long long count) {
    sb b = {0};
    size_t i = 0;
    long long done = 0;
    if (!old.u.s.n) { /* Python inserts between every character */
        size_t n, *off = cp_offsets(r, s, &n);
        for (size_t k = 0; k <= n; k++) {
            if (count < 0 || done < count) {
                sb_add(r, &b, new_.u.s.s, new_.u.s.n);
                done++;
            }
            if (k < n) sb_add(r, &b, s.u.s.s + off[k], off[k + 1] - off[k]);
        }
        return b.s ? sb_val(&b) : v_str("", 0);
    }
    while (i < s.u.s.n) {
        if ((count < 0 || done < count) && i + old.u.s.n <= s.u.s.n &&
            !memcmp(s.u.s.s + i, old.u.s.s, old.u.s.n)) {
            sb_add(r, &b, new_.u.s.s, new_.u.s.n);
            i += old.u.s.n;
            done++;
        } else {
            sb_putc(r, &b, s.u.s.s[i++]);
        }
    }
    return b.s ? sb_val(&b) : v_str("", 0);
}

static val str_split(R *r, val s, val sep, long long maxsplit) {
    vlist *l = list_new(r);
    const char *p = s.u.s.s, *e = p + s.u.s.n;
    if (sep.t != T_STR) {
        for (;;) {
            while (p < e && is_ws(*p)) p++;
            if (p == e) break;
            if (maxsplit >= 0 && (long long)l->n == maxsplit) {
                const char *q = e;
                while (q > p && is_ws(q[-1])) q--;
                list_push(r, l, v_str(p, (size_t)(q - p)));
                break;
            }
            const char *q = p;
            while (q < e && !is_ws(*q)) q++;
            list_push(r, l, v_str(p, (size_t)(q - p)));
            p = q;
        }
        return v_list(l);
    }
    if (!sep.u.s.n) die(r, TL_ERR_ARG, -1, "split: empty separator");
    for (;;) {
        const char *q = NULL;
        if (maxsplit < 0 || (long long)l->n < maxsplit)
            for (const char *x = p; x + sep.u.s.n <= e; x++)
                if (!memcmp(x, sep.u.s.s, sep.u.s.n)) { q = x; break; }
        if (!q) {
            list_push(r, l, v_str(p, (size_t)(e - p)));
            break;
        }
        list_push(r, l, v_str(p, (size_t)(q - p)));
        p = q + sep.u.s.n;
    }
    return v_list(l);
}

static int str_affix(R *r, int pos, val s, val x, int end) {
    if (x.t == T_LIST) {
        for (size_t i = 0; i < x.u.l->n; i++)
            if (str_affix(r, pos, s, x.u.l->v[i], end)) return 1;
        return 0;
    }
    need_str(r, pos, x, end ? "endswith" : "startswith");
    if (x.u.s.n > s.u.s.n) return 0;
    return !memcmp(s.u.s.s + (end ? s.u.s.n - x.u.s.n : 0), x.u.s.s, x.u.s.n);
}

static val join(R *r, int pos, val seq, val sep, const char *attr) {
    vlist *l = iter_list(r, pos, seq);
    sb b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i && sep.t == T_STR) sb_add(r, &b, sep.u.s.s, sep.u.s.n);
        val x = attr ? get_item(r, pos, l->v[i], v_cstr(attr)) : l->v[i];
        to_str(r, &b, x);
    }
    return b.s ? sb_val(&b) : v_str("", 0);
}

static val call_method(R *r, int pos, val self, const char *name, const args *a) {
    if (self.t == T_DICT) {
        vlist *l = list_new(r);
        if (!strcmp(name, "get")) {
            val k = arg(a, 0, NULL, v_undef("key"));
            val *p = k.t == T_STR ? dict_find(self.u.d, k.u.s.s, k.u.s.n) : NULL;
            return p ? *p : arg(a, 1, NULL, v_none());
        }
        for (size_t i = 0; i < self.u.d->n; i++) {
            val k = v_str(self.u.d->k[i], self.u.d->kn[i]);
            if (!strcmp(name, "keys")) list_push(r, l, k);
            else if (!strcmp(name, "values")) list_push(r, l, self.u.d->v[i]);
            else {
                vlist *pair = list_new(r);
                pair->tuple = 1;
                list_push(r, pair, k);
                list_push(r, pair, self.u.d->v[i]);
                list_push(r, l, v_list(pair));
            }
        }
        return v_list(l);
    }
    /* string methods */
    val x = arg(a, 0, NULL, v_none());
    if (!strcmp(name, "strip")) return str_strip(self, x, 1, 1);
    if (!strcmp(name, "lstrip")) return str_strip(self, x, 1, 0);
    if (!strcmp(name, "rstrip")) return str_strip(self, x, 0, 1);
    if (!strcmp(name, "startswith")) return v_bool(str_affix(r, pos, self, x, 0));
    if (!strcmp(name, "endswith")) return v_bool(str_affix(r, pos, self, x, 1));
    if (!strcmp(name, "upper")) return str_case(r, self, 1);
    if (!strcmp(name, "lower")) return str_case(r, self, 0);
    if (!strcmp(name, "capitalize")) return str_case(r, self, 2);
    if (!strcmp(name, "title")) return str_case(r, self, 3);
    if (!strcmp(name, "split")) {
        val sep = arg(a, 0, "sep", v_none());
        val mx = arg(a, 1, "maxsplit", v_int(-1));
        return str_split(r, self, sep, num_i(mx));
    }
    if (!strcmp(name, "replace")) {
        val o = need_str(r, pos, x, "replace"), nw = need_str(r, pos, arg(a, 1, NULL, v_undef("new")), "replace");
        return str_replace(r, self, o, nw, num_i(arg(a, 2, "count", v_int(-1))));
    }
    if (!strcmp(name, "join")) return join(r, pos, x, self, NULL);
    if (!strcmp(name, "count") || !strcmp(name, "find")) {
        need_str(r, pos, x, name);
        long long cnt = 0;
        for (size_t i = 0; x.u.s.n <= self.u.s.n && i + x.u.s.n <= self.u.s.n;) {
            if (!memcmp(self.u.s.s + i, x.u.s.s, x.u.s.n)) {
                if (name[0] == 'f') {
                    size_t ncp, *off = cp_offsets(r, v_str(self.u.s.s, i), &ncp);
                    (void)off;
                    return v_int((long long)ncp);
                }
                cnt++;
                i += x.u.s.n ? x.u.s.n : 1;
            } else {
                i++;
            }
        }
        return v_int(name[0] == 'f' ? -1 : cnt);
    }
    die(r, TL_ERR_UNSUPPORTED, pos, "unsupported construct: method %s.%s()", type_name(self), name);
}

static void fmt_time(R *r, sb *b, const char *fmt) {
    time_t now = time(NULL);
    struct tm tmv;
    char buf[256];
    if (!localtime_r(&now, &tmv)) die(r, TL_ERR_ARG, -1, "strftime_now: no local time");
    size_t n = strftime(buf, sizeof buf, fmt, &tmv);
    sb_add(r, b, buf, n);
}

static val call_builtin(R *r, int pos, int fn, const args *a) {
    switch (fn) {
    case F_RANGE: {
        long long st = 0, en, step = 1;
        if (a->npos == 1) en = num_i(a->v[0]);
        else if (a->npos >= 2) {
            st = num_i(a->v[0]);
            en = num_i(a->v[1]);
            if (a->npos >= 3) step = num_i(a->v[2]);
        } else die(r, TL_ERR_ARG, pos, "range expects 1 to 3 arguments");
        if (step == 0) die(r, TL_ERR_ARG, pos, "range() arg 3 must not be zero");
        vlist *l = list_new(r);
        for (long long i = st; step > 0 ? i < en : i > en; i += step) {
            if (l->n >= 100000) die(r, TL_ERR_ARG, pos, "range too big (sandboxed)");
            list_push(r, l, v_int(i));
        }
        return v_list(l);
    }
    case F_NAMESPACE: case F_DICT: {
        vdict *d = dict_new(r);
        for (int i = 0; i < a->npos; i++) { /* namespace(some_dict) */
            val x = a->v[i];
            if (x.t != T_DICT) die(r, TL_ERR_ARG, pos, "positional argument must be a dict");
            for (size_t k = 0; k < x.u.d->n; k++) dict_set(r, d, x.u.d->k[k], x.u.d->kn[k], x.u.d->v[k]);
        }
        for (int i = a->npos; i < a->n; i++) dict_set(r, d, a->kw[i], strlen(a->kw[i]), a->v[i]);
        val v = v_dict(d);
        if (fn == F_NAMESPACE) v.t = T_NS;
        return v;
    }
    case F_RAISE: {
        sb b = {0};
        to_str(r, &b, arg(a, 0, NULL, v_str("", 0)));
        tl_fail(r->err, TL_ERR_ARG, "chat template raised an exception: %s", b.s ? b.s : "");
        r->status = TL_ERR_ARG;
        longjmp(r->jb, 1);
    }
    case F_STRFTIME: {
        sb b = {0};
        val f = need_str(r, pos, arg(a, 0, NULL, v_undef("format")), "strftime_now");
        fmt_time(r, &b, astrdup(r, f.u.s.s, f.u.s.n));
        return b.s ? sb_val(&b) : v_str("", 0);
    }
    }
    die(r, TL_ERR_ARG, pos, "bad builtin");
}

static val call_macro(R *r, int pos, val m, const args *a) {
    const node *mac = m.u.mac.n;
    if (++r->depth > MAX_DEPTH) die(r, TL_ERR_ARG, pos, "macro recursion too deep");
    scope *s = scope_new(r, m.u.mac.sc);
    if (a->npos > mac->nnames) die(r, TL_ERR_ARG, pos, "macro '%s' takes %d arguments", mac->name, mac->nnames);
    for (int i = 0; i < mac->nnames; i++) {
        val v = arg(a, i, mac->names[i], v_undef(mac->names[i]));
        if (v.t == T_UNDEF && mac->list2[i]) v = eval(r, s, mac->list2[i]);
        scope_set(r, s, mac->names[i], v);
    }
    for (int i = a->npos; i < a->n; i++) {
        int ok = 0;
        for (int k = 0; k < mac->nnames; k++) ok |= !strcmp(mac->names[k], a->kw[i]);
        if (!ok) die(r, TL_ERR_ARG, pos, "macro '%s' has no argument '%s'", mac->name, a->kw[i]);
    }
    sb out = {0};
    exec(r, s, mac->b, &out);
    r->depth--;
    return out.s ? sb_val(&out) : v_str("", 0);
}

static val call(R *r, scope *s, const node *n) {
    val f = eval(r, s, n->a);
    args a = eval_args(r, s, n);
    switch (f.t) {
    case T_FUNC: return call_builtin(r, n->pos, f.u.fn, &a);
    case T_METHOD: return call_method(r, n->pos, *f.u.m.self, f.u.m.name, &a);
    case T_MACRO: return call_macro(r, n->pos, f, &a);
    case T_UNDEF: undef_err(r, n->pos, f);
    default: die(r, TL_ERR_ARG, n->pos, "'%s' object is not callable", type_name(f));
    }
}

/* ---- tests (`x is name`) and filters (`x | name`) ---------------------------------- */

static int apply_test(R *r, int pos, const char *name, val x, const args *a) {
    val y = a && a->n ? a->v[0] : v_undef("argument");
    if (!strcmp(name, "defined")) return x.t != T_UNDEF;
    if (!strcmp(name, "undefined")) return x.t == T_UNDEF;
    if (!strcmp(name, "none")) return x.t == T_NONE;
    if (!strcmp(name, "string")) return x.t == T_STR;
    if (!strcmp(name, "number")) return is_num(x);
    if (!strcmp(name, "integer")) return x.t == T_INT;
    if (!strcmp(name, "float")) return x.t == T_FLOAT;
    if (!strcmp(name, "boolean")) return x.t == T_BOOL;
    if (!strcmp(name, "true")) return x.t == T_BOOL && x.u.b;
    if (!strcmp(name, "false")) return x.t == T_BOOL && !x.u.b;
    if (!strcmp(name, "mapping")) return x.t == T_DICT;
    if (!strcmp(name, "iterable")) return x.t == T_STR || x.t == T_LIST || x.t == T_DICT || x.t == T_UNDEF;
    if (!strcmp(name, "sequence")) return x.t == T_STR || x.t == T_LIST || x.t == T_DICT;
    if (!strcmp(name, "callable")) return x.t == T_FUNC || x.t == T_METHOD || x.t == T_MACRO;
    if (!strcmp(name, "sameas")) return val_eq(x, y) && x.t == y.t && (x.t <= T_BOOL || x.t == T_LIST || x.t == T_DICT);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return val_eq(x, y);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !val_eq(x, y);
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan")) return val_cmp(r, pos, x, y) < 0;
    if (!strcmp(name, "le")) return val_cmp(r, pos, x, y) <= 0;
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan")) return val_cmp(r, pos, x, y) > 0;
    if (!strcmp(name, "ge")) return val_cmp(r, pos, x, y) >= 0;
    if (!strcmp(name, "in")) return contains(r, pos, y, x);
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (x.t != T_INT) die(r, TL_ERR_ARG, pos, "test '%s' needs an integer", name);
        long long m = name[0] == 'd' ? num_i(y) : 2;
        if (m == 0) die(r, TL_ERR_ARG, pos, "division by zero");
        long long rem = x.u.i % m;
        return name[0] == 'o' ? rem != 0 : rem == 0;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        val s = str_of(r, x);
        return val_eq(s, str_case(r, s, name[0] == 'u'));
    }
    die(r, TL_ERR_UNSUPPORTED, pos, "unsupported construct: test '%s'", name);
}

static val jinja_title(R *r, val s) {
    char *d = astrdup(r, s.u.s.s, s.u.s.n);
    int start = 1;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = d[i];
        if (is_ws(c) || strchr("-({[<", c)) {
            start = 1;
            continue;
        }
        if (c >= 'A' && c <= 'Z' && !start) d[i] = (char)(c | 0x20);
        if (c >= 'a' && c <= 'z' && start) d[i] = (char)(c & ~0x20);
        start = 0;
    }
    return v_str(d, s.u.s.n);
}

/* select/reject/selectattr/rejectattr/map over a sequence. */
static val filter_seq(R *r, int pos, const char *name, val x, const args *a) {
    vlist *in = iter_list(r, pos, x), *l = list_new(r);
    int is_attr = strstr(name, "attr") != NULL, keep = name[0] == 's';
    if (!strcmp(name, "map")) {
        val at = arg(a, -1, "attribute", v_none());
        val def = arg(a, -1, "default", v_undef("default"));
        for (size_t i = 0; i < in->n; i++) {
            val v;
            if (at.t == T_STR) {
                v = get_item(r, pos, in->v[i], at);
                if (v.t == T_UNDEF && def.t != T_UNDEF) v = def;
            } else {
                die(r, TL_ERR_UNSUPPORTED, pos, "unsupported construct: map without attribute=");
            }
            list_push(r, l, v);
        }
        return v_list(l);
    }
    int first = is_attr ? 1 : 0;
    val tname = a->npos > first ? a->v[first] : v_none();
    args rest = {a->v + first + 1, a->kw + first + 1, 0, 0};
    if (a->npos > first + 1) rest.n = rest.npos = a->npos - first - 1;
    for (size_t i = 0; i < in->n; i++) {
        val v = in->v[i];
        if (is_attr) v = get_item(r, pos, v, need_str(r, pos, a->npos ? a->v[0] : v_undef("attribute"), name));
        int t = tname.t == T_STR ? apply_test(r, pos, astrdup(r, tname.u.s.s, tname.u.s.n), v, &rest)
                                 : truthy(v);
        if (t == keep) list_push(r, l, in->v[i]);
    }
    return v_list(l);
}

static val apply_filter(R *r, int pos, const char *name, val x, const args *a) {
#define IS(s) (!strcmp(name, s))
    if (IS("default") || IS("d")) {
        val def = arg(a, 0, "default_value", v_str("", 0));
        int boolean = truthy(arg(a, 1, "boolean", v_bool(0)));
        return x.t == T_UNDEF || (boolean && !truthy(x)) ? def : x;
    }
    if (IS("length") || IS("count")) return v_int((long long)val_len(r, pos, x));
    if (IS("string")) return str_of(r, x);
    if (IS("safe")) return x;
    if (IS("list")) return v_list(iter_list(r, pos, x));
    if (IS("tojson")) {
        sb b = {0};
        val ind = arg(a, 0, "indent", v_none());
        if (a->n > 0 && arg(a, -1, "separators", v_none()).t != T_NONE)
            die(r, TL_ERR_UNSUPPORTED, pos, "unsupported construct: tojson(separators=...)");
        tojson(r, &b, x, ind.t == T_NONE ? -1 : (int)num_i(ind), 0,
               truthy(arg(a, -1, "sort_keys", v_bool(0))), pos);
        return sb_val(&b);
    }
    if (IS("first") || IS("last")) {
        vlist *l = iter_list(r, pos, x);
        if (!l->n) return v_undef(name);
        return l->v[IS("first") ? 0 : l->n - 1];
    }
    if (IS("items")) {
        if (x.t == T_UNDEF) return v_list(list_new(r));
        if (x.t != T_DICT) die(r, TL_ERR_ARG, pos, "items: expected a mapping");
        args none = {0};
        return call_method(r, pos, x, "items", &none);
    }
    if (IS("join")) return join(r, pos, x, arg(a, 0, "d", v_str("", 0)),
                                arg(a, 1, "attribute", v_none()).t == T_STR
                                    ? astrdup(r, arg(a, 1, "attribute", v_none()).u.s.s,
                                              arg(a, 1, "attribute", v_none()).u.s.n) : NULL);
    if (IS("int")) {
        if (x.t == T_STR) {
            char *t = astrdup(r, x.u.s.s, x.u.s.n), *e;
            long long v = strtoll(t, &e, 10);
            return v_int(*e && !is_ws(*e) ? 0 : v);
        }
        return is_num(x) ? v_int(num_i(x)) : arg(a, 0, "default", v_int(0));
    }
    if (IS("float")) {
        if (x.t == T_STR) {
            char *t = astrdup(r, x.u.s.s, x.u.s.n), *e;
            double v = strtod(t, &e);
            return v_float(*e ? 0.0 : v);
        }
        return is_num(x) ? v_float(num_f(x)) : v_float(0);
    }
    if (IS("abs")) return x.t == T_FLOAT ? v_float(fabs(x.u.f)) : v_int(llabs(num_i(x)));
    if (IS("reverse")) {
        if (x.t == T_STR) return get_slice(r, pos, x, v_none(), v_none(), v_int(-1));
        vlist *in = iter_list(r, pos, x), *l = list_new(r);
        for (size_t i = in->n; i-- > 0;) list_push(r, l, in->v[i]);
        return v_list(l);
    }
    if (IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr") || IS("map"))
        return filter_seq(r, pos, name, x, a);
    /* string filters: jinja converts the value with str() first */
    val s = str_of(r, x);
    if (IS("trim")) return str_strip(s, arg(a, 0, "chars", v_none()), 1, 1);
    if (IS("upper")) return str_case(r, s, 1);
    if (IS("lower")) return str_case(r, s, 0);
    if (IS("capitalize")) return str_case(r, s, 2);
    if (IS("title")) return jinja_title(r, s);
    if (IS("replace")) {
        val o = str_of(r, arg(a, 0, "old", v_undef("old"))), nw = str_of(r, arg(a, 1, "new", v_undef("new")));
        val c = arg(a, 2, "count", v_none());
        return str_replace(r, s, o, nw, c.t == T_NONE ? -1 : num_i(c));
    }
#undef IS
    die(r, TL_ERR_UNSUPPORTED, pos, "unsupported construct: filter '%s'", name);
}

/* ---- expressions and statements --------------------------------------------------- */

static val arith(R *r, int pos, int op, val a, val b) {
    if (a.t == T_UNDEF) undef_err(r, pos, a);
    if (b.t == T_UNDEF) undef_err(r, pos, b);
    if (op == OP_ADD && a.t == T_STR && b.t == T_STR) {
        char *d = aalloc(r, a.u.s.n + b.u.s.n + 1);
        memcpy(d, a.u.s.s, a.u.s.n);
        memcpy(d + a.u.s.n, b.u.s.s, b.u.s.n);
        return v_str(d, a.u.s.n + b.u.s.n);
    }
    if (op == OP_ADD && a.t == T_LIST && b.t == T_LIST) {
        vlist *l = list_new(r);
        for (size_t i = 0; i < a.u.l->n; i++) list_push(r, l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) list_push(r, l, b.u.l->v[i]);
        return v_list(l);
    }
    if (op == OP_MUL && (a.t == T_STR || a.t == T_LIST) && (b.t == T_INT || b.t == T_BOOL)) {
        val src = a;
        long long times = num_i(b);
        sb bs = {0};
        vlist *l = list_new(r);
        for (long long i = 0; i < times; i++) {
            if (bs.n > ((size_t)16 << 20)) die(r, TL_ERR_ARG, pos, "repeated string too long");
            if (src.t == T_STR) sb_add(r, &bs, src.u.s.s, src.u.s.n);
            else for (size_t k = 0; k < src.u.l->n; k++) list_push(r, l, src.u.l->v[k]);
        }
        if (src.t == T_LIST) return v_list(l);
        return bs.s ? sb_val(&bs) : v_str("", 0);
    }
    if (!is_num(a) || !is_num(b)) {
        static const char *ops[] = {"+", "-", "*", "/", "//", "%", "**"};
        die(r, TL_ERR_ARG, pos, "unsupported operand type(s) for %s: '%s' and '%s'", ops[op],
            type_name(a), type_name(b));
    }
    int fl = a.t == T_FLOAT || b.t == T_FLOAT;
    if (op == OP_DIV || (fl && op != OP_POW)) {
        double x = num_f(a), y = num_f(b), q;
        if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && y == 0)
            die(r, TL_ERR_ARG, pos, "division by zero");
        switch (op) {
        case OP_ADD: return v_float(x + y);
        case OP_SUB: return v_float(x - y);
        case OP_MUL: return v_float(x * y);
        case OP_DIV: return v_float(x / y);
        case OP_FLOORDIV: return v_float(floor(x / y));
        default: q = fmod(x, y); if (q != 0 && ((q < 0) != (y < 0))) q += y; return v_float(q);
        }
    }
    long long x = num_i(a), y = num_i(b), z = 0;
    int ovf = 0;
    switch (op) {
    case OP_ADD: ovf = __builtin_add_overflow(x, y, &z); break;
    case OP_SUB: ovf = __builtin_sub_overflow(x, y, &z); break;
    case OP_MUL: ovf = __builtin_mul_overflow(x, y, &z); break;
    case OP_FLOORDIV: case OP_MOD:
        if (y == 0) die(r, TL_ERR_ARG, pos, "division by zero");
        if (x == LLONG_MIN && y == -1) { ovf = 1; break; }
        z = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) z--;
        if (op == OP_MOD) z = x - z * y;
        break;
    case OP_POW:
        if (fl || y < 0) return v_float(pow(num_f(a), num_f(b)));
        z = 1;
        for (long long i = 0; i < y && !ovf; i++) ovf = __builtin_mul_overflow(z, x, &z);
        break;
    }
    if (ovf) die(r, TL_ERR_ARG, pos, "integer overflow");
    return v_int(z);
}

static val eval_inner(R *r, scope *s, const node *n) {
    switch (n->k) {
    case N_LIT: return n->v;
    case N_NAME: return lookup(r, s, n->name);
    case N_ATTR: return get_attr(r, n->pos, eval(r, s, n->a), n->name);
    case N_INDEX: {
        val o = eval(r, s, n->a);
        return get_item(r, n->pos, o, eval(r, s, n->b));
    }
    case N_SLICE: {
        val o = eval(r, s, n->a);
        return get_slice(r, n->pos, o, n->b ? eval(r, s, n->b) : v_none(),
                         n->c ? eval(r, s, n->c) : v_none(), n->d ? eval(r, s, n->d) : v_none());
    }
    case N_CALL: return call(r, s, n);
    case N_FILTER: {
        val x = eval(r, s, n->a);
        args a = eval_args(r, s, n);
        return apply_filter(r, n->pos, n->name, x, &a);
    }
    case N_TEST: {
        val x = eval(r, s, n->a);
        args a = eval_args(r, s, n);
        return v_bool(apply_test(r, n->pos, n->name, x, &a) != n->op);
    }
    case N_BIN: {
        val a = eval(r, s, n->a), b = eval(r, s, n->b);
        if (n->op == OP_CONCAT) {
            sb o = {0};
            to_str(r, &o, a);
            to_str(r, &o, b);
            return o.s ? sb_val(&o) : v_str("", 0);
        }
        return arith(r, n->pos, n->op, a, b);
    }
    case N_CMP: {
        val a = eval(r, s, n->a), b = eval(r, s, n->b);
        switch (n->op) {
        case OP_EQ: return v_bool(val_eq(a, b));
        case OP_NE: return v_bool(!val_eq(a, b));
        case OP_LT: return v_bool(val_cmp(r, n->pos, a, b) < 0);
        case OP_LE: return v_bool(val_cmp(r, n->pos, a, b) <= 0);
        case OP_GT: return v_bool(val_cmp(r, n->pos, a, b) > 0);
        case OP_GE: return v_bool(val_cmp(r, n->pos, a, b) >= 0);
        case OP_IN: return v_bool(contains(r, n->pos, b, a));
        default: return v_bool(!contains(r, n->pos, b, a));
        }
    }
    case N_NOT: return v_bool(!truthy(eval(r, s, n->a)));
    case N_NEG: {
        val x = eval(r, s, n->a);
        if (x.t == T_FLOAT) return v_float(-x.u.f);
        if (x.t == T_INT || x.t == T_BOOL) return arith(r, n->pos, OP_SUB, v_int(0), x);
        if (x.t == T_UNDEF) undef_err(r, n->pos, x);
        die(r, TL_ERR_ARG, n->pos, "bad operand type for unary -: '%s'", type_name(x));
    }
    case N_AND: { val a = eval(r, s, n->a); return truthy(a) ? eval(r, s, n->b) : a; }
    case N_OR: { val a = eval(r, s, n->a); return truthy(a) ? a : eval(r, s, n->b); }
    case N_COND:
        if (truthy(eval(r, s, n->a))) return eval(r, s, n->b);
        return n->c ? eval(r, s, n->c) : v_undef("else");
    case N_LIST: case N_TUPLE: {
        vlist *l = list_new(r);
        l->tuple = n->k == N_TUPLE;
        for (int i = 0; i < n->n; i++) list_push(r, l, eval(r, s, n->list[i]));
        return v_list(l);
    }
    case N_DICT: {
        vdict *d = dict_new(r);
        for (int i = 0; i < n->n; i++) {
            val k = eval(r, s, n->list[i]);
            if (k.t != T_STR) die(r, TL_ERR_UNSUPPORTED, n->list[i]->pos, "unsupported construct: non-string dict key");
            dict_set(r, d, k.u.s.s, k.u.s.n, eval(r, s, n->list2[i]));
        }
        return v_dict(d);
    }
    }
    die(r, TL_ERR_ARG, n->pos, "bad expression");
}

static val eval(R *r, scope *s, const node *n) {
    if (++r->depth > MAX_DEPTH * 2) die(r, TL_ERR_ARG, n->pos, "evaluation too deep");
    val v = eval_inner(r, s, n);
    r->depth--;
    return v;
}

static val loop_info(R *r, const vlist *items, size_t i) {
    vdict *d = dict_new(r);
    size_t n = items->n;
#define SET(k, v) dict_set(r, d, k, strlen(k), v)
    SET("index", v_int((long long)i + 1));
    SET("index0", v_int((long long)i));
    SET("revindex", v_int((long long)(n - i)));
    SET("revindex0", v_int((long long)(n - i - 1)));
    SET("first", v_bool(i == 0));
    SET("last", v_bool(i + 1 == n));
    SET("length", v_int((long long)n));
    SET("previtem", i > 0 ? items->v[i - 1] : v_undef("previtem"));
    SET("nextitem", i + 1 < n ? items->v[i + 1] : v_undef("nextitem"));
#undef SET
    return v_dict(d);
}

static void bind_targets(R *r, scope *s, const node *n, val item) {
    if (n->nnames == 1) {
        scope_set(r, s, n->names[0], item);
        return;
    }
    vlist *l = iter_list(r, n->pos, item);
    if ((int)l->n != n->nnames)
        die(r, TL_ERR_ARG, n->pos, "cannot unpack %zu values into %d names", l->n, n->nnames);
    for (int k = 0; k < n->nnames; k++) scope_set(r, s, n->names[k], l->v[k]);
}

static int exec_for(R *r, scope *s, const node *n, sb *out) {
    vlist *all = iter_list(r, n->pos, eval(r, s, n->a)), *items = all;
    if (n->d) { /* for x in xs if cond: the loop only sees the kept items */
        items = list_new(r);
        for (size_t i = 0; i < all->n; i++) {
            scope *fs = scope_new(r, s);
            bind_targets(r, fs, n, all->v[i]);
            if (truthy(eval(r, fs, n->d))) list_push(r, items, all->v[i]);
        }
    }
    for (size_t i = 0; i < items->n; i++) {
        scope *ls = scope_new(r, s);
        bind_targets(r, ls, n, items->v[i]);
        scope_set(r, ls, "loop", loop_info(r, items, i));
        if (exec(r, ls, n->b, out) == 1) break;
    }
    if (!items->n && n->c) return exec(r, s, n->c, out);
    return 0;
}

/* Returns 1 on break, 2 on continue, 0 otherwise. */
static int exec(R *r, scope *s, const node *n, sb *out) {
    switch (n->k) {
    case N_BODY:
        for (int i = 0; i < n->n; i++) {
            int c = exec(r, s, n->list[i], out);
            if (c) return c;
        }
        return 0;
    case N_TEXT: sb_add(r, out, n->v.u.s.s, n->v.u.s.n); return 0;
    case N_OUT: to_str(r, out, eval(r, s, n->a)); return 0;
    case N_IF:
        if (truthy(eval(r, s, n->a))) return exec(r, s, n->b, out);
        return n->c ? exec(r, s, n->c, out) : 0;
    case N_FOR: return exec_for(r, s, n, out);
    case N_SET:
        if (n->attr) {
            val ns = lookup(r, s, n->name);
            if (ns.t != T_NS) die(r, TL_ERR_ARG, n->pos, "cannot assign attribute on non-namespace object");
            dict_set(r, ns.u.d, n->attr, strlen(n->attr), eval(r, s, n->a));
        } else {
            scope_set(r, s, n->name, eval(r, s, n->a));
        }
        return 0;
    case N_SETBLOCK: {
        sb cap = {0};
        exec(r, s, n->b, &cap);
        scope_set(r, s, n->name, cap.s ? sb_val(&cap) : v_str("", 0));
        return 0;
    }
    case N_MACRO: {
        val m = {.t = T_MACRO};
        m.u.mac.n = n;
        m.u.mac.sc = s;
        scope_set(r, s, n->name, m);
        return 0;
    }
    case N_BREAK: return 1;
    case N_CONTINUE: return 2;
    }
    die(r, TL_ERR_ARG, n->pos, "bad statement");
}

/* ---- entry points ---------------------------------------------------------------------- */

/* jinja2 reads templates with universal newlines and drops one trailing newline. */
static char *normalize(R *r, const char *tmpl, size_t *len) {
    size_t n = strlen(tmpl), k = 0;
    char *d = aalloc(r, n + 1);
    for (size_t i = 0; i < n; i++) {
        if (tmpl[i] == '\r') {
            d[k++] = '\n';
            if (i + 1 < n && tmpl[i + 1] == '\n') i++;
        } else {
            d[k++] = tmpl[i];
        }
    }
    if (k && d[k - 1] == '\n') k--;
    d[k] = 0;
    *len = k;
    return d;
}

/* A compiled template: its source and tree live in their own arena, read
 * only while rendering, so one template serves every request and thread. */
struct tl_chat_template {
    R *r;
    node *root;
    char *bos, *eos; /* the model's special-token text, or NULL */
};

void tl_chat_template_free(tl_chat_template *t) {
    if (!t) return;
    if (t->r) arena_free(t->r);
    free(t->r);
    free(t->bos);
    free(t->eos);
    free(t);
}

/* The text of a special token (BOS/EOS) as transformers passes it. */
static char *token_text(const tl_model *m, int32_t id) {
    if (id < 0) return NULL;
    size_t n = tl_token_piece(m, id, 1, NULL, 0);
    char *s = malloc(n + 1);
    if (!s) return NULL;
    tl_token_piece(m, id, 1, s, n + 1);
    s[n] = 0;
    return s;
}

static void compile_body(R *r, tl_chat_template *t, const char *text) {
    size_t n;
    r->src = normalize(r, text, &n);
    lexer L = {.r = r, .src = r->src, .len = n};
    lex_all(&L);
    parser P = {.r = r, .t = L.t};
    t->root = p_body(&P, NULL);
}

/* Compiles into t's arena; a syntax error unwinds to here. */
static int compile(R *r, tl_chat_template *t, const char *text, tl_error *err) {
    r->err = err;
    if (setjmp(r->jb)) return r->status;
    compile_body(r, t, text);
    r->err = NULL;
    return TL_OK;
}

int tl_chat_template_new(const tl_model *model, const char *tmpl, tl_chat_template **out, tl_error *err) {
    if (!out) return tl_fail(err, TL_ERR_ARG, "tl_chat_template_new: no output");
    *out = NULL;
    const char *text = tmpl ? tmpl : model ? tl_model_chat_template(model) : NULL;
    if (!text) return tl_fail(err, TL_ERR_UNSUPPORTED, "the model has no chat template");
    tl_chat_template *t = calloc(1, sizeof *t);
    R *r = calloc(1, sizeof *r);
    if (!t || !r) {
        free(t);
        free(r);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    t->r = r;
    if (model) {
        const int32_t bos = tl_token_bos(model), eos = tl_token_eos(model);
        t->bos = token_text(model, bos);
        t->eos = token_text(model, eos);
        if ((bos >= 0 && !t->bos) || (eos >= 0 && !t->eos)) {
            tl_chat_template_free(t);
            return tl_fail(err, TL_ERR_NOMEM, "out of memory");
        }
    }
    int st = compile(r, t, text, err);
    if (st) {
        tl_chat_template_free(t);
        return st;
    }
    *out = t;
    return TL_OK;
}

/* Where a render's variables come from: JSON text, jansson values, or plain
 * messages. */
typedef struct vars_src {
    const char *json;
    size_t json_len;
    const json_t *jv;
    const tl_chat_msg *msgs;
    size_t n_msgs;
    int plain; /* msgs given (perhaps none) */
} vars_src;

/* A jansson value as a template value; strings point into the jansson
 * value, which outlives the render. */
static val from_jansson(R *r, const json_t *j, int depth) {
    if (depth > MAX_DEPTH) die(r, TL_ERR_FORMAT, -1, "messages nested too deeply");
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        vdict *d = dict_new(r);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) dict_set(r, d, k, strlen(k), from_jansson(r, v, depth + 1));
        return v_dict(d);
    }
    case JSON_ARRAY: {
        vlist *l = list_new(r);
        for (size_t i = 0; i < json_array_size(j); i++) list_push(r, l, from_jansson(r, json_array_get(j, i), depth + 1));
        return v_list(l);
    }
    case JSON_STRING: return v_str(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return v_int((long long)json_integer_value(j));
    case JSON_REAL: return v_float(json_real_value(j));
    case JSON_TRUE: return v_bool(1);
    case JSON_FALSE: return v_bool(0);
    default: return v_none();
    }
}

static void render(R *r, const tl_chat_template *t, const vars_src *vs, int add_gen, sb *out) {
    scope *g = scope_new(r, NULL);
    r->root = g;
    if (t->bos) scope_set(r, g, "bos_token", v_cstr(t->bos));
    if (t->eos) scope_set(r, g, "eos_token", v_cstr(t->eos));
    scope_set(r, g, "add_generation_prompt", v_bool(add_gen));
    val v = {.t = T_UNDEF};
    if (vs->json) {
        jp j = {.r = r, .b = vs->json, .s = vs->json, .e = vs->json + vs->json_len};
        v = jvalue(&j);
        jws(&j);
        if (j.s != j.e) jfail(&j, "trailing characters");
    } else if (vs->jv) {
        v = from_jansson(r, vs->jv, 0);
    } else if (vs->plain) {
        vlist *l = list_new(r);
        for (size_t i = 0; i < vs->n_msgs; i++) {
            vdict *d = dict_new(r);
            dict_set(r, d, "role", 4, v_cstr(vs->msgs[i].role ? vs->msgs[i].role : ""));
            dict_set(r, d, "content", 7, v_cstr(vs->msgs[i].content ? vs->msgs[i].content : ""));
            list_push(r, l, v_dict(d));
        }
        v = v_list(l);
    }
    if (v.t == T_LIST) {
        scope_set(r, g, "messages", v);
    } else if (v.t == T_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++) dict_set(r, &g->vars, v.u.d->k[i], v.u.d->kn[i], v.u.d->v[i]);
    } else if (v.t != T_UNDEF) {
        die(r, TL_ERR_FORMAT, -1, "messages JSON must be a list or an object");
    }
    exec(r, g, t->root, out);
}

static int render_entry(const tl_chat_template *t, const vars_src *vs, int add_generation_prompt, char **out,
                        size_t *out_len, tl_error *err) {
    if (!t || !out) return tl_fail(err, TL_ERR_ARG, "chat template: no template");
    *out = NULL;
    if (out_len) *out_len = 0;
    R *r = calloc(1, sizeof *r);
    if (!r) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    r->err = err;
    r->src = t->r->src; /* positions in errors */
    if (setjmp(r->jb)) {
        int st = r->status;
        arena_free(r);
        free(r);
        return st;
    }
    sb *res = aalloc(r, sizeof *res);
    render(r, t, vs, add_generation_prompt, res);
    char *o = malloc(res->n + 1);
    if (!o) die(r, TL_ERR_NOMEM, -1, "out of memory");
    if (res->n) memcpy(o, res->s, res->n);
    o[res->n] = 0;
    *out = o;
    if (out_len) *out_len = res->n;
    arena_free(r);
    free(r);
    return TL_OK;
}

int tl_chat_template_render(const tl_chat_template *t, const char *vars_json, size_t len, int add_generation_prompt,
                            char **out, size_t *out_len, tl_error *err) {
    vars_src vs = {.json = vars_json, .json_len = len};
    return render_entry(t, &vs, add_generation_prompt, out, out_len, err);
}

int tl_chat_template_render_msgs(const tl_chat_template *t, const tl_chat_msg *msgs, size_t n_msgs,
                                 int add_generation_prompt, char **out, size_t *out_len, tl_error *err) {
    if (n_msgs && !msgs) return tl_fail(err, TL_ERR_ARG, "chat template: no messages");
    vars_src vs = {.msgs = msgs, .n_msgs = n_msgs, .plain = 1};
    return render_entry(t, &vs, add_generation_prompt, out, out_len, err);
}

int tl_chat_template_render_json(const tl_chat_template *t, const json_t *vars, int add_generation_prompt,
                                 char **out, size_t *out_len, tl_error *err) {
    if (!vars) return tl_fail(err, TL_ERR_ARG, "chat template: no messages");
    vars_src vs = {.jv = vars};
    return render_entry(t, &vs, add_generation_prompt, out, out_len, err);
}

int tl_chat_render_vars(const char *tmpl, const char *json, size_t json_len, const char *bos,
                        const char *eos, int add_generation_prompt, char **out, size_t *out_len,
                        tl_error *err) {
    if (out) *out = NULL;
    if (out_len) *out_len = 0;
    if (!tmpl) return tl_fail(err, TL_ERR_ARG, "chat template: no template");
    tl_chat_template *t;
    int st = tl_chat_template_new(NULL, tmpl, &t, err);
    if (st) return st;
    if ((bos && !(t->bos = strdup(bos))) || (eos && !(t->eos = strdup(eos)))) {
        tl_chat_template_free(t);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    st = tl_chat_template_render(t, json, json_len, add_generation_prompt, out, out_len, err);
    tl_chat_template_free(t);
    return st;
}

int tl_chat_apply(const tl_model *model, const char *tmpl, const char *messages_json, size_t len,
                  int add_generation_prompt, char **out, size_t *out_len, tl_error *err) {
    if (out) *out = NULL;
    tl_chat_template *t;
    int st = tl_chat_template_new(model, tmpl, &t, err);
    if (st) return st;
    st = tl_chat_template_render(t, messages_json, len, add_generation_prompt, out, out_len, err);
    tl_chat_template_free(t);
    return st;
}

int tl_chat_apply_msgs(const tl_model *model, const char *tmpl, const tl_chat_msg *msgs,
                       size_t n_msgs, int add_generation_prompt, char **out, size_t *out_len,
                       tl_error *err) {
    if (out) *out = NULL;
    tl_chat_template *t;
    int st = tl_chat_template_new(model, tmpl, &t, err);
    if (st) return st;
    st = tl_chat_template_render_msgs(t, msgs, n_msgs, add_generation_prompt, out, out_len, err);
    tl_chat_template_free(t);
    return st;
}

/* The markers DeepSeek-R1, Qwen 3 and SmolLM3 templates write; the one
 * place they are spelled. */
static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char PYTHON_TAG[] = "<|python_tag|>";

int tl_chat_think_markers(const char *tmpl, const char **open, const char **close) {
    *open = THINK_OPEN;
    *close = THINK_CLOSE;
    return tmpl && strstr(tmpl, THINK_OPEN) != NULL;
}

int tl_chat_think_started(const char *rendered, size_t len) {
    const size_t ol = sizeof THINK_OPEN - 1;
    while (len && (rendered[len - 1] == '\n' || rendered[len - 1] == ' ')) len--;
    return len >= ol && !memcmp(rendered + len - ol, THINK_OPEN, ol);
}

size_t tl_chat_call_lead(const char *text, size_t n, int *partial) {
    const size_t tl = sizeof PYTHON_TAG - 1;
    size_t k = n >= tl && !memcmp(text, PYTHON_TAG, tl) ? tl : 0;
    if (partial) *partial = n < tl && !memcmp(text, PYTHON_TAG, n);
    while (k < n && (text[k] == ' ' || text[k] == '\n' || text[k] == '\t' || text[k] == '\r')) k++;
    return k;
}

int tl_chat_add_bos(const tl_model *m, const char *rendered) {
    if (!tl_model_add_bos(m) || tl_token_bos(m) < 0) return 0;
    char bos[256];
    const size_t n = tl_token_piece(m, tl_token_bos(m), 1, bos, sizeof bos);
    const char *tmpl = tl_model_chat_template(m);
    return !(n > 0 && n < sizeof bos && rendered && !strncmp(rendered, bos, n) && tmpl && strstr(tmpl, "bos_token"));
}
