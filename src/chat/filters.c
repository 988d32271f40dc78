/* filters.c: the names a template can call that are not its own: string and
 * dict methods (' x '.strip(), d.items()), the builtins (range, namespace,
 * dict, raise_exception, strftime_now), tests (x is defined) and filters
 * (x | tojson). Each follows what Python or jinja2 returns for the same
 * call, down to the corners templates hit (split() without a separator, title
 * after punctuation, replace with an empty needle). A name outside this set
 * fails as an unsupported construct rather than rendering something else. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat/jinja.h"
#include "base/util.h"

static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "startswith", "endswith",
                                          "split", "upper", "lower", "title", "capitalize",
                                          "replace", "join", "count", "find", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};

static int in_set(const char *const *set, const char *name) {
    for (int i = 0; set[i]; i++)
        if (!strcmp(set[i], name)) return 1;
    return 0;
}

/* Whether self.name is a method the sandbox lets templates call. */
int jj_is_method(val self, const char *name) {
    if (self.t == T_DICT) return in_set(DICT_METHODS, name);
    if (self.t == T_STR) return in_set(STR_METHODS, name);
    return 0;
}

static val need_str(R *r, int pos, val v, const char *what) {
    if (v.t == T_UNDEF) jj_undef_err(r, pos, v);
    if (v.t != T_STR) jj_die(r, TL_ERR_ARG, pos, "%s expects a string, got %s", what, jj_type_name(v));
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
    char *d = jj_strdup(r, s.u.s.s, s.u.s.n);
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
        size_t n, *off = jj_cp_offsets(r, s, &n);
        for (size_t k = 0; k <= n; k++) {
            if (count < 0 || done < count) {
                jj_sb_add(r, &b, new_.u.s.s, new_.u.s.n);
                done++;
            }
            if (k < n) jj_sb_add(r, &b, s.u.s.s + off[k], off[k + 1] - off[k]);
        }
        return b.s ? sb_val(&b) : v_str("", 0);
    }
    while (i < s.u.s.n) {
        if ((count < 0 || done < count) && i + old.u.s.n <= s.u.s.n &&
            !memcmp(s.u.s.s + i, old.u.s.s, old.u.s.n)) {
            jj_sb_add(r, &b, new_.u.s.s, new_.u.s.n);
            i += old.u.s.n;
            done++;
        } else {
            jj_sb_putc(r, &b, s.u.s.s[i++]);
        }
    }
    return b.s ? sb_val(&b) : v_str("", 0);
}

static val str_split(R *r, val s, val sep, long long maxsplit) {
    vlist *l = jj_list_new(r);
    const char *p = s.u.s.s, *e = p + s.u.s.n;
    if (sep.t != T_STR) {
        for (;;) {
            while (p < e && is_ws(*p)) p++;
            if (p == e) break;
            if (maxsplit >= 0 && (long long)l->n == maxsplit) {
                const char *q = e;
                while (q > p && is_ws(q[-1])) q--;
                jj_list_push(r, l, v_str(p, (size_t)(q - p)));
                break;
            }
            const char *q = p;
            while (q < e && !is_ws(*q)) q++;
            jj_list_push(r, l, v_str(p, (size_t)(q - p)));
            p = q;
        }
        return v_list(l);
    }
    if (!sep.u.s.n) jj_die(r, TL_ERR_ARG, -1, "split: empty separator");
    for (;;) {
        const char *q = NULL;
        if (maxsplit < 0 || (long long)l->n < maxsplit)
            for (const char *x = p; x + sep.u.s.n <= e; x++)
                if (!memcmp(x, sep.u.s.s, sep.u.s.n)) { q = x; break; }
        if (!q) {
            jj_list_push(r, l, v_str(p, (size_t)(e - p)));
            break;
        }
        jj_list_push(r, l, v_str(p, (size_t)(q - p)));
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
    vlist *l = jj_iter_list(r, pos, seq);
    sb b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i && sep.t == T_STR) jj_sb_add(r, &b, sep.u.s.s, sep.u.s.n);
        val x = attr ? jj_get_item(r, pos, l->v[i], v_cstr(attr)) : l->v[i];
        jj_to_str(r, &b, x);
    }
    return b.s ? sb_val(&b) : v_str("", 0);
}

val jj_call_method(R *r, int pos, val self, const char *name, const args *a) {
    if (self.t == T_DICT) {
        vlist *l = jj_list_new(r);
        if (!strcmp(name, "get")) {
            val k = jj_arg(a, 0, NULL, v_undef("key"));
            val *p = k.t == T_STR ? jj_dict_find(self.u.d, k.u.s.s, k.u.s.n) : NULL;
            return p ? *p : jj_arg(a, 1, NULL, v_none());
        }
        for (size_t i = 0; i < self.u.d->n; i++) {
            val k = v_str(self.u.d->k[i], self.u.d->kn[i]);
            if (!strcmp(name, "keys")) jj_list_push(r, l, k);
            else if (!strcmp(name, "values")) jj_list_push(r, l, self.u.d->v[i]);
            else {
                vlist *pair = jj_list_new(r);
                pair->tuple = 1;
                jj_list_push(r, pair, k);
                jj_list_push(r, pair, self.u.d->v[i]);
                jj_list_push(r, l, v_list(pair));
            }
        }
        return v_list(l);
    }
    /* string methods */
    val x = jj_arg(a, 0, NULL, v_none());
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
        val sep = jj_arg(a, 0, "sep", v_none());
        val mx = jj_arg(a, 1, "maxsplit", v_int(-1));
        return str_split(r, self, sep, num_i(mx));
    }
    if (!strcmp(name, "replace")) {
        val o = need_str(r, pos, x, "replace"), nw = need_str(r, pos, jj_arg(a, 1, NULL, v_undef("new")), "replace");
        return str_replace(r, self, o, nw, num_i(jj_arg(a, 2, "count", v_int(-1))));
    }
    if (!strcmp(name, "join")) return join(r, pos, x, self, NULL);
    if (!strcmp(name, "count") || !strcmp(name, "find")) {
        need_str(r, pos, x, name);
        long long cnt = 0;
        for (size_t i = 0; x.u.s.n <= self.u.s.n && i + x.u.s.n <= self.u.s.n;) {
            if (!memcmp(self.u.s.s + i, x.u.s.s, x.u.s.n)) {
                if (name[0] == 'f') {
                    size_t ncp, *off = jj_cp_offsets(r, v_str(self.u.s.s, i), &ncp);
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
    jj_die(r, TL_ERR_UNSUPPORTED, pos, "unsupported construct: method %s.%s()", jj_type_name(self), name);
}

static void fmt_time(R *r, sb *b, const char *fmt) {
    time_t now = time(NULL);
    struct tm tmv;
    char buf[256];
    if (!localtime_r(&now, &tmv)) jj_die(r, TL_ERR_ARG, -1, "strftime_now: no local time");
    size_t n = strftime(buf, sizeof buf, fmt, &tmv);
    jj_sb_add(r, b, buf, n);
}

val jj_call_builtin(R *r, int pos, int fn, const args *a) {
    switch (fn) {
    case F_RANGE: {
        long long st = 0, en, step = 1;
        if (a->npos == 1) en = num_i(a->v[0]);
        else if (a->npos >= 2) {
            st = num_i(a->v[0]);
            en = num_i(a->v[1]);
            if (a->npos >= 3) step = num_i(a->v[2]);
        } else jj_die(r, TL_ERR_ARG, pos, "range expects 1 to 3 arguments");
        if (step == 0) jj_die(r, TL_ERR_ARG, pos, "range() arg 3 must not be zero");
        vlist *l = jj_list_new(r);
        for (long long i = st; step > 0 ? i < en : i > en; i += step) {
            if (l->n >= 100000) jj_die(r, TL_ERR_ARG, pos, "range too big (sandboxed)");
            jj_list_push(r, l, v_int(i));
        }
        return v_list(l);
    }
    case F_NAMESPACE: case F_DICT: {
        vdict *d = jj_dict_new(r);
        for (int i = 0; i < a->npos; i++) { /* namespace(some_dict) */
            val x = a->v[i];
            if (x.t != T_DICT) jj_die(r, TL_ERR_ARG, pos, "positional argument must be a dict");
            for (size_t k = 0; k < x.u.d->n; k++) jj_dict_set(r, d, x.u.d->k[k], x.u.d->kn[k], x.u.d->v[k]);
        }
        for (int i = a->npos; i < a->n; i++) jj_dict_set(r, d, a->kw[i], strlen(a->kw[i]), a->v[i]);
        val v = v_dict(d);
        if (fn == F_NAMESPACE) v.t = T_NS;
        return v;
    }
    case F_RAISE: {
        sb b = {0};
        jj_to_str(r, &b, jj_arg(a, 0, NULL, v_str("", 0)));
        tl_fail(r->err, TL_ERR_ARG, "chat template raised an exception: %s", b.s ? b.s : "");
        r->status = TL_ERR_ARG;
        longjmp(r->jb, 1);
    }
    case F_STRFTIME: {
        sb b = {0};
        val f = need_str(r, pos, jj_arg(a, 0, NULL, v_undef("format")), "strftime_now");
        fmt_time(r, &b, jj_strdup(r, f.u.s.s, f.u.s.n));
        return b.s ? sb_val(&b) : v_str("", 0);
    }
    }
    jj_die(r, TL_ERR_ARG, pos, "bad builtin");
}

/* ---- tests (`x is name`) and filters (`x | name`) ---------------------------------- */

int jj_apply_test(R *r, int pos, const char *name, val x, const args *a) {
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
    if (!strcmp(name, "sameas")) return jj_val_eq(x, y) && x.t == y.t && (x.t <= T_BOOL || x.t == T_LIST || x.t == T_DICT);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return jj_val_eq(x, y);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jj_val_eq(x, y);
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan")) return jj_val_cmp(r, pos, x, y) < 0;
    if (!strcmp(name, "le")) return jj_val_cmp(r, pos, x, y) <= 0;
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan")) return jj_val_cmp(r, pos, x, y) > 0;
    if (!strcmp(name, "ge")) return jj_val_cmp(r, pos, x, y) >= 0;
    if (!strcmp(name, "in")) return jj_contains(r, pos, y, x);
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (x.t != T_INT) jj_die(r, TL_ERR_ARG, pos, "test '%s' needs an integer", name);
        long long m = name[0] == 'd' ? num_i(y) : 2;
        if (m == 0) jj_die(r, TL_ERR_ARG, pos, "division by zero");
        long long rem = x.u.i % m;
        return name[0] == 'o' ? rem != 0 : rem == 0;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        val s = jj_str_of(r, x);
        return jj_val_eq(s, str_case(r, s, name[0] == 'u'));
    }
    jj_die(r, TL_ERR_UNSUPPORTED, pos, "unsupported construct: test '%s'", name);
}

static val jinja_title(R *r, val s) {
    char *d = jj_strdup(r, s.u.s.s, s.u.s.n);
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
    vlist *in = jj_iter_list(r, pos, x), *l = jj_list_new(r);
    int is_attr = strstr(name, "attr") != NULL, keep = name[0] == 's';
    if (!strcmp(name, "map")) {
        val at = jj_arg(a, -1, "attribute", v_none());
        val def = jj_arg(a, -1, "default", v_undef("default"));
        for (size_t i = 0; i < in->n; i++) {
            val v;
            if (at.t == T_STR) {
                v = jj_get_item(r, pos, in->v[i], at);
                if (v.t == T_UNDEF && def.t != T_UNDEF) v = def;
            } else if (a->npos && a->v[0].t == T_STR) { /* map('upper'): a filter, with the rest as its arguments */
                args rest = {a->v + 1, a->kw + 1, a->n - 1, a->npos - 1};
                v = jj_apply_filter(r, pos, jj_strdup(r, a->v[0].u.s.s, a->v[0].u.s.n), in->v[i], &rest);
            } else {
                jj_die(r, TL_ERR_UNSUPPORTED, pos, "unsupported construct: map without a filter or attribute=");
            }
            jj_list_push(r, l, v);
        }
        return v_list(l);
    }
    int first = is_attr ? 1 : 0;
    val tname = a->npos > first ? a->v[first] : v_none();
    args rest = {a->v + first + 1, a->kw + first + 1, 0, 0};
    if (a->npos > first + 1) rest.n = rest.npos = a->npos - first - 1;
    for (size_t i = 0; i < in->n; i++) {
        val v = in->v[i];
        if (is_attr) v = jj_get_item(r, pos, v, need_str(r, pos, a->npos ? a->v[0] : v_undef("attribute"), name));
        int t = tname.t == T_STR ? jj_apply_test(r, pos, jj_strdup(r, tname.u.s.s, tname.u.s.n), v, &rest)
                                 : jj_truthy(v);
        if (t == keep) jj_list_push(r, l, in->v[i]);
    }
    return v_list(l);
}

/* dictsort's key: the key or the value, lowercased unless case_sensitive
 * (jinja2's ignore_case lowercases strings only). */
static val sort_key(R *r, val pair, int by_value, int case_sensitive) {
    val k = pair.u.l->v[by_value];
    return k.t == T_STR && !case_sensitive ? str_case(r, k, 0) : k;
}

/* v[0..n) ordered by their keys k (both permuted), stably: a bottom-up
 * merge sort that takes from the right run only what comes strictly first,
 * so equal keys keep their order, reversed or not (as Python's sorted). */
static void sort_by_keys(R *r, int pos, val *v, val *k, size_t n, int rev) {
    val *tv = jj_alloc(r, (n ? n : 1) * sizeof *tv), *tk = jj_alloc(r, (n ? n : 1) * sizeof *tk);
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            const size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t i = lo, j = mid, o = lo;
            while (i < mid || j < hi) {
                int right = i == mid;
                if (i < mid && j < hi) {
                    const int c = jj_val_cmp(r, pos, k[j], k[i]);
                    right = rev ? c > 0 : c < 0;
                }
                const size_t from = right ? j++ : i++;
                tv[o] = v[from];
                tk[o++] = k[from];
            }
        }
        memcpy(v, tv, n * sizeof *v);
        memcpy(k, tk, n * sizeof *k);
    }
}

/* jinja2's dictsort: sorted(d.items(), key=..., reverse=...), a stable sort
 * (equal keys keep the dict's order, reversed or not). */
static val dictsort(R *r, int pos, val x, const args *a) {
    if (x.t == T_UNDEF) jj_undef_err(r, pos, x);
    if (x.t != T_DICT) jj_die(r, TL_ERR_ARG, pos, "dictsort: expected a mapping, got %s", jj_type_name(x));
    const int cs = jj_truthy(jj_arg(a, 0, "case_sensitive", v_bool(0)));
    val by = jj_arg(a, 1, "by", v_cstr("key"));
    const int rev = jj_truthy(jj_arg(a, 2, "reverse", v_bool(0)));
    if (by.t != T_STR || !((by.u.s.n == 3 && !memcmp(by.u.s.s, "key", 3)) || (by.u.s.n == 5 && !memcmp(by.u.s.s, "value", 5))))
        jj_die(r, TL_ERR_ARG, pos, "dictsort: you can only sort by either 'key' or 'value'");
    const int bv = by.u.s.n == 5;
    args none = {0};
    val items = jj_call_method(r, pos, x, "items", &none);
    vlist *l = items.u.l;
    val *keys = jj_alloc(r, (l->n ? l->n : 1) * sizeof *keys);
    for (size_t i = 0; i < l->n; i++) keys[i] = sort_key(r, l->v[i], bv, cs);
    sort_by_keys(r, pos, l->v, keys, l->n, rev);
    return items;
}

val jj_apply_filter(R *r, int pos, const char *name, val x, const args *a) {
#define IS(s) (!strcmp(name, s))
    if (IS("dictsort")) return dictsort(r, pos, x, a);
    if (IS("default") || IS("d")) {
        val def = jj_arg(a, 0, "default_value", v_str("", 0));
        int boolean = jj_truthy(jj_arg(a, 1, "boolean", v_bool(0)));
        return x.t == T_UNDEF || (boolean && !jj_truthy(x)) ? def : x;
    }
    if (IS("length") || IS("count")) return v_int((long long)jj_val_len(r, pos, x));
    if (IS("string")) return jj_str_of(r, x);
    if (IS("safe")) return x;
    if (IS("list")) return v_list(jj_iter_list(r, pos, x));
    if (IS("tojson")) {
        sb b = {0};
        val ind = jj_arg(a, 0, "indent", v_none());
        if (a->n > 0 && jj_arg(a, -1, "separators", v_none()).t != T_NONE)
            jj_die(r, TL_ERR_UNSUPPORTED, pos, "unsupported construct: tojson(separators=...)");
        jj_tojson(r, &b, x, ind.t == T_NONE ? -1 : (int)num_i(ind), 0,
               jj_truthy(jj_arg(a, -1, "sort_keys", v_bool(0))), pos);
        return sb_val(&b);
    }
    if (IS("first") || IS("last")) {
        vlist *l = jj_iter_list(r, pos, x);
        if (!l->n) return v_undef(name);
        return l->v[IS("first") ? 0 : l->n - 1];
    }
    if (IS("items")) {
        if (x.t == T_UNDEF) return v_list(jj_list_new(r));
        if (x.t != T_DICT) jj_die(r, TL_ERR_ARG, pos, "items: expected a mapping");
        args none = {0};
        return jj_call_method(r, pos, x, "items", &none);
    }
    if (IS("join")) return join(r, pos, x, jj_arg(a, 0, "d", v_str("", 0)),
                                jj_arg(a, 1, "attribute", v_none()).t == T_STR
                                    ? jj_strdup(r, jj_arg(a, 1, "attribute", v_none()).u.s.s,
                                              jj_arg(a, 1, "attribute", v_none()).u.s.n) : NULL);
    if (IS("int")) {
        if (x.t == T_STR) {
            char *t = jj_strdup(r, x.u.s.s, x.u.s.n), *e;
            long long v = strtoll(t, &e, 10);
            return v_int(*e && !is_ws(*e) ? 0 : v);
        }
        return is_num(x) ? v_int(num_i(x)) : jj_arg(a, 0, "default", v_int(0));
    }
    if (IS("float")) {
        if (x.t == T_STR) {
            char *t = jj_strdup(r, x.u.s.s, x.u.s.n), *e;
            double v = strtod(t, &e);
            return v_float(*e ? 0.0 : v);
        }
        return is_num(x) ? v_float(num_f(x)) : v_float(0);
    }
    if (IS("abs")) return x.t == T_FLOAT ? v_float(fabs(x.u.f)) : v_int(llabs(num_i(x)));
    if (IS("reverse")) {
        if (x.t == T_STR) return jj_get_slice(r, pos, x, v_none(), v_none(), v_int(-1));
        vlist *in = jj_iter_list(r, pos, x), *l = jj_list_new(r);
        for (size_t i = in->n; i-- > 0;) jj_list_push(r, l, in->v[i]);
        return v_list(l);
    }
    if (IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr") || IS("map"))
        return filter_seq(r, pos, name, x, a);
    /* string filters: jinja converts the value with str() first */
    val s = jj_str_of(r, x);
    if (IS("trim")) return str_strip(s, jj_arg(a, 0, "chars", v_none()), 1, 1);
    if (IS("upper")) return str_case(r, s, 1);
    if (IS("lower")) return str_case(r, s, 0);
    if (IS("capitalize")) return str_case(r, s, 2);
    if (IS("title")) return jinja_title(r, s);
    if (IS("replace")) {
        val o = jj_str_of(r, jj_arg(a, 0, "old", v_undef("old"))), nw = jj_str_of(r, jj_arg(a, 1, "new", v_undef("new")));
        val c = jj_arg(a, 2, "count", v_none());
        return str_replace(r, s, o, nw, c.t == T_NONE ? -1 : num_i(c));
    }
#undef IS
    jj_die(r, TL_ERR_UNSUPPORTED, pos, "unsupported construct: filter '%s'", name);
}

