/* value.c: what a template value is and how Python treats it. Templates are
 * Python code in disguise, so every operation here copies a Python rule the
 * rendered text depends on: truthiness, ==, <, len, iteration and `in`, str()
 * and repr() (True, None, 'quotes', the shortest float that reads back), and
 * transformers' tojson (json.dumps with ensure_ascii=False). Strings are
 * (pointer, length) so that a NUL inside one survives, and lengths, indices
 * and slices count code points, not bytes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja.h"

vlist *jj_list_new(R *r) { return jj_alloc(r, sizeof(vlist)); }
void jj_list_push(R *r, vlist *l, val x) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 8;
        val *nv = jj_alloc(r, nc * sizeof *nv);
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}

vdict *jj_dict_new(R *r) { return jj_alloc(r, sizeof(vdict)); }
val *jj_dict_find(const vdict *d, const char *k, size_t kn) {
    for (size_t i = 0; i < d->n; i++)
        if (d->kn[i] == kn && !memcmp(d->k[i], k, kn)) return &d->v[i];
    return NULL;
}
void jj_dict_set(R *r, vdict *d, const char *k, size_t kn, val x) {
    val *p = jj_dict_find(d, k, kn);
    if (p) {
        *p = x;
        return;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 8;
        const char **nk = jj_alloc(r, nc * sizeof *nk);
        size_t *nkn = jj_alloc(r, nc * sizeof *nkn);
        val *nv = jj_alloc(r, nc * sizeof *nv);
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

void jj_sb_add(R *r, sb *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = (b->n + n + 1) * 2;
        if (nc < 64) nc = 64;
        char *ns = jj_alloc(r, nc);
        if (b->n) memcpy(ns, b->s, b->n);
        b->s = ns;
        b->cap = nc;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
void jj_sb_puts(R *r, sb *b, const char *s) { jj_sb_add(r, b, s, strlen(s)); }
void jj_sb_putc(R *r, sb *b, char c) { jj_sb_add(r, b, &c, 1); }

int jj_truthy(val v) {
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

/* Python's repr of a float: the shortest text that reads back the same. */
static void fmt_float(R *r, sb *b, double f) {
    char buf[64];
    if (isnan(f)) { jj_sb_puts(r, b, "nan"); return; }
    if (isinf(f)) { jj_sb_puts(r, b, f < 0 ? "-inf" : "inf"); return; }
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
            jj_sb_puts(r, b, buf);
            return;
        }
        int prec = (int)(e - buf) - (buf[0] == '-') - (strchr(buf, '.') ? 1 : 0);
        int dec = prec - 1 - ex;
        snprintf(buf, sizeof buf, "%.*f", dec > 0 ? dec : 0, f);
    }
    jj_sb_puts(r, b, buf);
    if (!strchr(buf, '.') && !strchr(buf, 'n')) jj_sb_puts(r, b, ".0");
}


static void repr_str(R *r, sb *b, const char *s, size_t n) {
    char q = (memchr(s, '\'', n) && !memchr(s, '"', n)) ? '"' : '\'';
    jj_sb_putc(r, b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '\\' || c == (unsigned char)q) {
            jj_sb_putc(r, b, '\\');
            jj_sb_putc(r, b, (char)c);
        } else if (c == '\n') jj_sb_puts(r, b, "\\n");
        else if (c == '\r') jj_sb_puts(r, b, "\\r");
        else if (c == '\t') jj_sb_puts(r, b, "\\t");
        else if (c < 0x20 || c == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", c);
            jj_sb_puts(r, b, e);
        } else jj_sb_putc(r, b, (char)c);
    }
    jj_sb_putc(r, b, q);
}

static void repr(R *r, sb *b, val v) {
    if (v.t == T_STR) repr_str(r, b, v.u.s.s, v.u.s.n);
    else jj_to_str(r, b, v);
}

/* Python's str() of a value, as {{ }} prints it. */
void jj_to_str(R *r, sb *b, val v) {
    char buf[32];
    switch (v.t) {
    case T_UNDEF: return;
    case T_NONE: jj_sb_puts(r, b, "None"); return;
    case T_BOOL: jj_sb_puts(r, b, v.u.b ? "True" : "False"); return;
    case T_INT: snprintf(buf, sizeof buf, "%lld", v.u.i); jj_sb_puts(r, b, buf); return;
    case T_FLOAT: fmt_float(r, b, v.u.f); return;
    case T_STR: jj_sb_add(r, b, v.u.s.s, v.u.s.n); return;
    case T_LIST:
        if (++r->vdepth > JJ_MAX_NEST) jj_die(r, TL_ERR_ARG, -1, "a value nested more than %d deep, or containing itself, cannot be printed", JJ_MAX_NEST);
        jj_sb_putc(r, b, v.u.l->tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jj_sb_puts(r, b, ", ");
            repr(r, b, v.u.l->v[i]);
        }
        if (v.u.l->tuple && v.u.l->n == 1) jj_sb_putc(r, b, ',');
        jj_sb_putc(r, b, v.u.l->tuple ? ')' : ']');
        r->vdepth--;
        return;
    case T_DICT: case T_NS:
        if (++r->vdepth > JJ_MAX_NEST) jj_die(r, TL_ERR_ARG, -1, "a value nested more than %d deep, or containing itself, cannot be printed", JJ_MAX_NEST);
        jj_sb_puts(r, b, v.t == T_NS ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) jj_sb_puts(r, b, ", ");
            repr_str(r, b, v.u.d->k[i], v.u.d->kn[i]);
            jj_sb_puts(r, b, ": ");
            repr(r, b, v.u.d->v[i]);
        }
        jj_sb_puts(r, b, v.t == T_NS ? "}>" : "}");
        r->vdepth--;
        return;
    default: jj_sb_puts(r, b, "<function>"); return;
    }
}

val jj_str_of(R *r, val v) {
    if (v.t == T_STR) return v;
    sb b = {0};
    jj_to_str(r, &b, v);
    return sb_val(&b);
}

/* json.dumps(x, ensure_ascii=False, indent=indent, sort_keys=sort) as
 * transformers' tojson filter calls it. */
void jj_tojson(R *r, sb *b, val v, int indent, int level, int sort, int pos) {
    char buf[32];
    switch (v.t) {
    case T_NONE: jj_sb_puts(r, b, "null"); return;
    case T_BOOL: jj_sb_puts(r, b, v.u.b ? "true" : "false"); return;
    case T_INT: snprintf(buf, sizeof buf, "%lld", v.u.i); jj_sb_puts(r, b, buf); return;
    case T_FLOAT:
        if (isnan(v.u.f)) jj_sb_puts(r, b, "NaN");
        else if (isinf(v.u.f)) jj_sb_puts(r, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else fmt_float(r, b, v.u.f);
        return;
    case T_STR:
        jj_sb_putc(r, b, '"');
        for (size_t i = 0; i < v.u.s.n; i++) {
            unsigned char c = (unsigned char)v.u.s.s[i];
            if (c == '"') jj_sb_puts(r, b, "\\\"");
            else if (c == '\\') jj_sb_puts(r, b, "\\\\");
            else if (c == '\n') jj_sb_puts(r, b, "\\n");
            else if (c == '\r') jj_sb_puts(r, b, "\\r");
            else if (c == '\t') jj_sb_puts(r, b, "\\t");
            else if (c == '\b') jj_sb_puts(r, b, "\\b");
            else if (c == '\f') jj_sb_puts(r, b, "\\f");
            else if (c < 0x20) {
                snprintf(buf, sizeof buf, "\\u%04x", c);
                jj_sb_puts(r, b, buf);
            } else jj_sb_putc(r, b, (char)c);
        }
        jj_sb_putc(r, b, '"');
        return;
    case T_LIST: case T_DICT: case T_NS: {
        if (level >= JJ_MAX_NEST)
            jj_die(r, TL_ERR_ARG, pos, "tojson: a value nested more than %d deep, or containing itself", JJ_MAX_NEST);
        int is_list = v.t == T_LIST;
        size_t n = is_list ? v.u.l->n : v.u.d->n;
        jj_sb_putc(r, b, is_list ? '[' : '{');
        if (n == 0) {
            jj_sb_putc(r, b, is_list ? ']' : '}');
            return;
        }
        size_t *order = jj_alloc(r, n * sizeof *order);
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
            if (i) jj_sb_putc(r, b, ',');
            if (indent >= 0) {
                jj_sb_putc(r, b, '\n');
                for (int k = 0; k < indent * (level + 1); k++) jj_sb_putc(r, b, ' ');
            } else if (i) {
                jj_sb_putc(r, b, ' ');
            }
            if (is_list) {
                jj_tojson(r, b, v.u.l->v[i], indent, level + 1, sort, pos);
            } else {
                jj_tojson(r, b, v_str(v.u.d->k[order[i]], v.u.d->kn[order[i]]), -1, 0, 0, pos);
                jj_sb_puts(r, b, ": ");
                jj_tojson(r, b, v.u.d->v[order[i]], indent, level + 1, sort, pos);
            }
        }
        if (indent >= 0) {
            jj_sb_putc(r, b, '\n');
            for (int k = 0; k < indent * level; k++) jj_sb_putc(r, b, ' ');
        }
        jj_sb_putc(r, b, is_list ? ']' : '}');
        return;
    }
    default:
        jj_die(r, TL_ERR_ARG, pos, "tojson: a value of this type (%s) is not JSON serializable",
            v.t == T_UNDEF ? "Undefined" : "function");
    }
}

_Noreturn void jj_undef_err(R *r, int pos, val v) {
    jj_die(r, TL_ERR_ARG, pos, "'%s' is undefined", v.undef_name ? v.undef_name : "value");
}

const char *jj_type_name(val v) {
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list",
                                  "dict", "Namespace", "function", "method", "macro"};
    if (v.t == T_LIST && v.u.l->tuple) return "tuple";
    return names[v.t];
}

/* Past JJ_MAX_NEST levels (a value that contains itself) containers compare
 * by identity, as Python's own comparison does for an element that is the
 * other's. */
static int val_eq(val a, val b, int depth) {
    if (is_num(a) && is_num(b)) {
        if (a.t == T_FLOAT || b.t == T_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case T_UNDEF: case T_NONE: return 1;
    case T_STR: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.s, b.u.s.s, a.u.s.n);
    case T_LIST:
        if (a.u.l == b.u.l) return 1;
        if (a.u.l->n != b.u.l->n || depth >= JJ_MAX_NEST) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!val_eq(a.u.l->v[i], b.u.l->v[i], depth + 1)) return 0;
        return 1;
    case T_DICT: case T_NS:
        if (a.u.d == b.u.d) return 1;
        if (a.u.d->n != b.u.d->n || depth >= JJ_MAX_NEST) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            val *o = jj_dict_find(b.u.d, a.u.d->k[i], a.u.d->kn[i]);
            if (!o || !val_eq(a.u.d->v[i], *o, depth + 1)) return 0;
        }
        return 1;
    default: return a.u.d == b.u.d;
    }
}

int jj_val_eq(val a, val b) { return val_eq(a, b, 0); }

/* -1, 0, 1 for numbers and strings; anything else is a TypeError in Python. */
int jj_val_cmp(R *r, int pos, val a, val b) {
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
    if (a.t == T_UNDEF) jj_undef_err(r, pos, a);
    if (b.t == T_UNDEF) jj_undef_err(r, pos, b);
    jj_die(r, TL_ERR_ARG, pos, "cannot compare %s with %s", jj_type_name(a), jj_type_name(b));
}

/* UTF-8 code point boundaries of a string: Python indexes by code point. */
size_t *jj_cp_offsets(R *r, val s, size_t *ncp) {
    size_t n = 0;
    for (size_t i = 0; i < s.u.s.n; i++)
        if (((unsigned char)s.u.s.s[i] & 0xc0) != 0x80) n++;
    size_t *off = jj_alloc(r, (n + 1) * sizeof *off);
    size_t k = 0;
    for (size_t i = 0; i < s.u.s.n; i++)
        if (((unsigned char)s.u.s.s[i] & 0xc0) != 0x80) off[k++] = i;
    off[n] = s.u.s.n;
    *ncp = n;
    return off;
}

size_t jj_val_len(R *r, int pos, val v) {
    size_t n;
    switch (v.t) {
    case T_STR: jj_cp_offsets(r, v, &n); return n;
    case T_LIST: return v.u.l->n;
    case T_DICT: return v.u.d->n;
    case T_UNDEF: return 0;
    default: jj_die(r, TL_ERR_ARG, pos, "object of type '%s' has no len()", jj_type_name(v));
    }
}

/* The items a for loop or a filter walks over. */
vlist *jj_iter_list(R *r, int pos, val v) {
    vlist *l = jj_list_new(r);
    if (v.t == T_LIST) return v.u.l;
    if (v.t == T_DICT) {
        for (size_t i = 0; i < v.u.d->n; i++) jj_list_push(r, l, v_str(v.u.d->k[i], v.u.d->kn[i]));
    } else if (v.t == T_STR) {
        size_t n, *off = jj_cp_offsets(r, v, &n);
        for (size_t i = 0; i < n; i++) jj_list_push(r, l, v_str(v.u.s.s + off[i], off[i + 1] - off[i]));
    } else if (v.t != T_UNDEF) {
        jj_die(r, TL_ERR_ARG, pos, "'%s' object is not iterable", jj_type_name(v));
    }
    return l;
}

int jj_contains(R *r, int pos, val hay, val needle) {
    if (hay.t == T_STR) {
        if (needle.t != T_STR) jj_die(r, TL_ERR_ARG, pos, "'in <string>' requires string as left operand");
        if (!needle.u.s.n) return 1;
        if (needle.u.s.n > hay.u.s.n) return 0;
        for (size_t i = 0; i + needle.u.s.n <= hay.u.s.n; i++)
            if (!memcmp(hay.u.s.s + i, needle.u.s.s, needle.u.s.n)) return 1;
        return 0;
    }
    if (hay.t == T_DICT || hay.t == T_NS)
        return needle.t == T_STR && jj_dict_find(hay.u.d, needle.u.s.s, needle.u.s.n) != NULL;
    vlist *l = jj_iter_list(r, pos, hay);
    for (size_t i = 0; i < l->n; i++)
        if (jj_val_eq(l->v[i], needle)) return 1;
    return 0;
}
