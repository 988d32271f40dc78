/* eval.c: the tree run against scopes. Expressions give values; statements
 * append to the output and report break/continue upward. Scoping copies
 * jinja2's: a loop body and a macro call get their own scope, so `set` inside
 * a loop does not leak out (namespace() objects are how templates carry
 * state across iterations); attribute access tries the Python attribute
 * first, then the item, and refuses the list methods the sandbox refuses.
 * Arithmetic is Python's: floor division and modulo round toward minus
 * infinity, integers do not overflow silently. Evaluation depth is capped so
 * a recursive macro fails instead of exhausting the C stack. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "chat/jinja.h"

scope *jj_scope_new(R *r, scope *parent) {
    scope *s = jj_alloc(r, sizeof *s);
    s->parent = parent;
    return s;
}
void jj_scope_set(R *r, scope *s, const char *name, val v) { jj_dict_set(r, &s->vars, name, strlen(name), v); }
static val lookup(R *r, scope *s, const char *name) {
    for (; s; s = s->parent) {
        val *p = jj_dict_find(&s->vars, name, strlen(name));
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

static val method(R *r, val self, const char *name) {
    val m = {.t = T_METHOD};
    m.u.m.self = jj_alloc(r, sizeof(val));
    *m.u.m.self = self;
    m.u.m.name = name;
    return m;
}

/* obj.name: jinja tries the Python attribute first, then the item. */
static val get_attr(R *r, int pos, val obj, const char *name) {
    if (obj.t == T_UNDEF) jj_undef_err(r, pos, obj);
    if (obj.t == T_DICT) {
        if (jj_is_method(obj, name)) return method(r, obj, name);
        val *p = jj_dict_find(obj.u.d, name, strlen(name));
        return p ? *p : v_undef(name);
    }
    if (obj.t == T_NS) {
        val *p = jj_dict_find(obj.u.d, name, strlen(name));
        return p ? *p : v_undef(name);
    }
    if (obj.t == T_STR && jj_is_method(obj, name)) return method(r, obj, name);
    if (obj.t == T_LIST && (!strcmp(name, "append") || !strcmp(name, "pop") ||
                            !strcmp(name, "insert") || !strcmp(name, "extend") ||
                            !strcmp(name, "remove") || !strcmp(name, "clear") ||
                            !strcmp(name, "sort") || !strcmp(name, "reverse")))
        jj_die(r, TL_ERR_ARG, pos, "access to attribute '%s' of 'list' object is unsafe (sandboxed)", name);
    return v_undef(name);
}

static long long norm_index(long long i, size_t n) { return i < 0 ? i + (long long)n : i; }

val jj_get_item(R *r, int pos, val obj, val key) {
    if (obj.t == T_UNDEF) jj_undef_err(r, pos, obj);
    if ((obj.t == T_DICT || obj.t == T_NS) && key.t == T_STR) {
        val *p = jj_dict_find(obj.u.d, key.u.s.s, key.u.s.n);
        if (p) return *p;
        return get_attr(r, pos, obj, jj_strdup(r, key.u.s.s, key.u.s.n));
    }
    if ((obj.t == T_LIST || obj.t == T_STR) && (key.t == T_INT || key.t == T_BOOL)) {
        if (obj.t == T_LIST) {
            long long i = norm_index(num_i(key), obj.u.l->n);
            return i >= 0 && i < (long long)obj.u.l->n ? obj.u.l->v[i] : v_undef("item");
        }
        size_t n, *off = jj_cp_offsets(r, obj, &n);
        long long i = norm_index(num_i(key), n);
        if (i < 0 || i >= (long long)n) return v_undef("item");
        return v_str(obj.u.s.s + off[i], off[i + 1] - off[i]);
    }
    if (key.t == T_STR) return get_attr(r, pos, obj, jj_strdup(r, key.u.s.s, key.u.s.n));
    return v_undef("item");
}

/* Python slice semantics: obj[start:stop:step] on lists and strings. */
val jj_get_slice(R *r, int pos, val obj, val vs, val ve, val vst) {
    if (obj.t == T_UNDEF) jj_undef_err(r, pos, obj);
    long long step = vst.t == T_NONE || vst.t == T_UNDEF ? 1 : num_i(vst);
    if (step == 0) jj_die(r, TL_ERR_ARG, pos, "slice step cannot be zero");
    size_t ncp = 0, *off = NULL;
    if (obj.t == T_STR) off = jj_cp_offsets(r, obj, &ncp);
    else if (obj.t == T_LIST) ncp = obj.u.l->n;
    else jj_die(r, TL_ERR_ARG, pos, "'%s' object is not subscriptable", jj_type_name(obj));
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
    vlist *l = jj_list_new(r);
    sb b = {0};
    for (long long i = s; step > 0 ? i < e : i > e; i += step) {
        if (obj.t == T_LIST) jj_list_push(r, l, obj.u.l->v[i]);
        else jj_sb_add(r, &b, obj.u.s.s + off[i], off[i + 1] - off[i]);
    }
    if (obj.t == T_STR) return b.s ? sb_val(&b) : v_str("", 0);
    return v_list(l);
}

val jj_eval(R *r, scope *s, const node *n);

static args eval_args(R *r, scope *s, const node *n) {
    args a = {0};
    a.n = n->n + n->nkw;
    a.npos = n->n;
    a.v = jj_alloc(r, ((size_t)a.n + 1) * sizeof(val));
    a.kw = jj_alloc(r, ((size_t)a.n + 1) * sizeof(char *));
    for (int i = 0; i < a.n; i++) {
        a.v[i] = jj_eval(r, s, n->list[i]);
        a.kw[i] = i >= n->n ? n->names[i] : NULL;
    }
    return a;
}

/* Argument i by position or by keyword name; def if absent. */
val jj_arg(const args *a, int i, const char *name, val def) {
    if (i >= 0 && i < a->npos) return a->v[i];
    for (int k = a->npos; k < a->n; k++)
        if (name && !strcmp(a->kw[k], name)) return a->v[k];
    return def;
}

static val call_macro(R *r, int pos, val m, const args *a) {
    const node *mac = m.u.mac.n;
    if (++r->depth > MAX_DEPTH) jj_die(r, TL_ERR_ARG, pos, "macro recursion too deep");
    scope *s = jj_scope_new(r, m.u.mac.sc);
    if (a->npos > mac->nnames) jj_die(r, TL_ERR_ARG, pos, "macro '%s' takes %d arguments", mac->name, mac->nnames);
    for (int i = 0; i < mac->nnames; i++) {
        val v = jj_arg(a, i, mac->names[i], v_undef(mac->names[i]));
        if (v.t == T_UNDEF && mac->list2[i]) v = jj_eval(r, s, mac->list2[i]);
        jj_scope_set(r, s, mac->names[i], v);
    }
    for (int i = a->npos; i < a->n; i++) {
        int ok = 0;
        for (int k = 0; k < mac->nnames; k++) ok |= !strcmp(mac->names[k], a->kw[i]);
        if (!ok) jj_die(r, TL_ERR_ARG, pos, "macro '%s' has no argument '%s'", mac->name, a->kw[i]);
    }
    sb out = {0};
    jj_exec(r, s, mac->b, &out);
    r->depth--;
    return out.s ? sb_val(&out) : v_str("", 0);
}

static val call(R *r, scope *s, const node *n) {
    val f = jj_eval(r, s, n->a);
    args a = eval_args(r, s, n);
    switch (f.t) {
    case T_FUNC: return jj_call_builtin(r, n->pos, f.u.fn, &a);
    case T_METHOD: return jj_call_method(r, n->pos, *f.u.m.self, f.u.m.name, &a);
    case T_MACRO: return call_macro(r, n->pos, f, &a);
    case T_UNDEF: jj_undef_err(r, n->pos, f);
    default: jj_die(r, TL_ERR_ARG, n->pos, "'%s' object is not callable", jj_type_name(f));
    }
}

/* ---- expressions and statements --------------------------------------------------- */

static val arith(R *r, int pos, int op, val a, val b) {
    if (a.t == T_UNDEF) jj_undef_err(r, pos, a);
    if (b.t == T_UNDEF) jj_undef_err(r, pos, b);
    if (op == OP_ADD && a.t == T_STR && b.t == T_STR) {
        char *d = jj_alloc(r, a.u.s.n + b.u.s.n + 1);
        memcpy(d, a.u.s.s, a.u.s.n);
        memcpy(d + a.u.s.n, b.u.s.s, b.u.s.n);
        return v_str(d, a.u.s.n + b.u.s.n);
    }
    if (op == OP_ADD && a.t == T_LIST && b.t == T_LIST) {
        vlist *l = jj_list_new(r);
        for (size_t i = 0; i < a.u.l->n; i++) jj_list_push(r, l, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) jj_list_push(r, l, b.u.l->v[i]);
        return v_list(l);
    }
    if (op == OP_MUL && (a.t == T_STR || a.t == T_LIST) && (b.t == T_INT || b.t == T_BOOL)) {
        val src = a;
        long long times = num_i(b);
        sb bs = {0};
        vlist *l = jj_list_new(r);
        for (long long i = 0; i < times; i++) {
            if (bs.n > ((size_t)16 << 20)) jj_die(r, TL_ERR_ARG, pos, "repeated string too long");
            if (src.t == T_STR) jj_sb_add(r, &bs, src.u.s.s, src.u.s.n);
            else for (size_t k = 0; k < src.u.l->n; k++) jj_list_push(r, l, src.u.l->v[k]);
        }
        if (src.t == T_LIST) return v_list(l);
        return bs.s ? sb_val(&bs) : v_str("", 0);
    }
    if (!is_num(a) || !is_num(b)) {
        static const char *const ops[] = {"+", "-", "*", "/", "//", "%", "**"};
        jj_die(r, TL_ERR_ARG, pos, "unsupported operand type(s) for %s: '%s' and '%s'", ops[op],
            jj_type_name(a), jj_type_name(b));
    }
    int fl = a.t == T_FLOAT || b.t == T_FLOAT;
    if (op == OP_DIV || (fl && op != OP_POW)) {
        double x = num_f(a), y = num_f(b), q;
        if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && y == 0)
            jj_die(r, TL_ERR_ARG, pos, "division by zero");
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
        if (y == 0) jj_die(r, TL_ERR_ARG, pos, "division by zero");
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
    if (ovf) jj_die(r, TL_ERR_ARG, pos, "integer overflow");
    return v_int(z);
}

static val eval_inner(R *r, scope *s, const node *n) {
    switch (n->k) {
    case N_LIT: return n->v;
    case N_NAME: return lookup(r, s, n->name);
    case N_ATTR: return get_attr(r, n->pos, jj_eval(r, s, n->a), n->name);
    case N_INDEX: {
        val o = jj_eval(r, s, n->a);
        return jj_get_item(r, n->pos, o, jj_eval(r, s, n->b));
    }
    case N_SLICE: {
        val o = jj_eval(r, s, n->a);
        return jj_get_slice(r, n->pos, o, n->b ? jj_eval(r, s, n->b) : v_none(),
                         n->c ? jj_eval(r, s, n->c) : v_none(), n->d ? jj_eval(r, s, n->d) : v_none());
    }
    case N_CALL: return call(r, s, n);
    case N_FILTER: {
        val x = jj_eval(r, s, n->a);
        args a = eval_args(r, s, n);
        return jj_apply_filter(r, n->pos, n->name, x, &a);
    }
    case N_TEST: {
        val x = jj_eval(r, s, n->a);
        args a = eval_args(r, s, n);
        return v_bool(jj_apply_test(r, n->pos, n->name, x, &a) != n->op);
    }
    case N_BIN: {
        val a = jj_eval(r, s, n->a), b = jj_eval(r, s, n->b);
        if (n->op == OP_CONCAT) {
            sb o = {0};
            jj_to_str(r, &o, a);
            jj_to_str(r, &o, b);
            return o.s ? sb_val(&o) : v_str("", 0);
        }
        return arith(r, n->pos, n->op, a, b);
    }
    case N_CMP: {
        val a = jj_eval(r, s, n->a), b = jj_eval(r, s, n->b);
        switch (n->op) {
        case OP_EQ: return v_bool(jj_val_eq(a, b));
        case OP_NE: return v_bool(!jj_val_eq(a, b));
        case OP_LT: return v_bool(jj_val_cmp(r, n->pos, a, b) < 0);
        case OP_LE: return v_bool(jj_val_cmp(r, n->pos, a, b) <= 0);
        case OP_GT: return v_bool(jj_val_cmp(r, n->pos, a, b) > 0);
        case OP_GE: return v_bool(jj_val_cmp(r, n->pos, a, b) >= 0);
        case OP_IN: return v_bool(jj_contains(r, n->pos, b, a));
        default: return v_bool(!jj_contains(r, n->pos, b, a));
        }
    }
    case N_NOT: return v_bool(!jj_truthy(jj_eval(r, s, n->a)));
    case N_NEG: {
        val x = jj_eval(r, s, n->a);
        if (x.t == T_FLOAT) return v_float(-x.u.f);
        if (x.t == T_INT || x.t == T_BOOL) return arith(r, n->pos, OP_SUB, v_int(0), x);
        if (x.t == T_UNDEF) jj_undef_err(r, n->pos, x);
        jj_die(r, TL_ERR_ARG, n->pos, "bad operand type for unary -: '%s'", jj_type_name(x));
    }
    case N_AND: { val a = jj_eval(r, s, n->a); return jj_truthy(a) ? jj_eval(r, s, n->b) : a; }
    case N_OR: { val a = jj_eval(r, s, n->a); return jj_truthy(a) ? a : jj_eval(r, s, n->b); }
    case N_COND:
        if (jj_truthy(jj_eval(r, s, n->a))) return jj_eval(r, s, n->b);
        return n->c ? jj_eval(r, s, n->c) : v_undef("else");
    case N_LIST: case N_TUPLE: {
        vlist *l = jj_list_new(r);
        l->tuple = n->k == N_TUPLE;
        for (int i = 0; i < n->n; i++) jj_list_push(r, l, jj_eval(r, s, n->list[i]));
        return v_list(l);
    }
    case N_DICT: {
        vdict *d = jj_dict_new(r);
        for (int i = 0; i < n->n; i++) {
            val k = jj_eval(r, s, n->list[i]);
            if (k.t != T_STR) jj_die(r, TL_ERR_UNSUPPORTED, n->list[i]->pos, "unsupported construct: non-string dict key");
            jj_dict_set(r, d, k.u.s.s, k.u.s.n, jj_eval(r, s, n->list2[i]));
        }
        return v_dict(d);
    }
    }
    jj_die(r, TL_ERR_ARG, n->pos, "bad expression");
}

val jj_eval(R *r, scope *s, const node *n) {
    if (++r->depth > MAX_DEPTH * 2) jj_die(r, TL_ERR_ARG, n->pos, "evaluation too deep");
    val v = eval_inner(r, s, n);
    r->depth--;
    return v;
}

static val loop_info(R *r, const vlist *items, size_t i) {
    vdict *d = jj_dict_new(r);
    size_t n = items->n;
#define SET(k, v) jj_dict_set(r, d, k, strlen(k), v)
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
        jj_scope_set(r, s, n->names[0], item);
        return;
    }
    vlist *l = jj_iter_list(r, n->pos, item);
    if ((int)l->n != n->nnames)
        jj_die(r, TL_ERR_ARG, n->pos, "cannot unpack %zu values into %d names", l->n, n->nnames);
    for (int k = 0; k < n->nnames; k++) jj_scope_set(r, s, n->names[k], l->v[k]);
}

static int exec_for(R *r, scope *s, const node *n, sb *out) {
    vlist *all = jj_iter_list(r, n->pos, jj_eval(r, s, n->a)), *items = all;
    if (n->d) { /* for x in xs if cond: the loop only sees the kept items */
        items = jj_list_new(r);
        for (size_t i = 0; i < all->n; i++) {
            scope *fs = jj_scope_new(r, s);
            bind_targets(r, fs, n, all->v[i]);
            if (jj_truthy(jj_eval(r, fs, n->d))) jj_list_push(r, items, all->v[i]);
        }
    }
    for (size_t i = 0; i < items->n; i++) {
        scope *ls = jj_scope_new(r, s);
        bind_targets(r, ls, n, items->v[i]);
        jj_scope_set(r, ls, "loop", loop_info(r, items, i));
        if (jj_exec(r, ls, n->b, out) == 1) break;
    }
    if (!items->n && n->c) return jj_exec(r, s, n->c, out);
    return 0;
}

/* Returns 1 on break, 2 on continue, 0 otherwise. */
int jj_exec(R *r, scope *s, const node *n, sb *out) {
    switch (n->k) {
    case N_BODY:
        for (int i = 0; i < n->n; i++) {
            int c = jj_exec(r, s, n->list[i], out);
            if (c) return c;
        }
        return 0;
    case N_TEXT: jj_sb_add(r, out, n->v.u.s.s, n->v.u.s.n); return 0;
    case N_OUT: jj_to_str(r, out, jj_eval(r, s, n->a)); return 0;
    case N_IF:
        if (jj_truthy(jj_eval(r, s, n->a))) return jj_exec(r, s, n->b, out);
        return n->c ? jj_exec(r, s, n->c, out) : 0;
    case N_FOR: return exec_for(r, s, n, out);
    case N_SET:
        if (n->attr) {
            val ns = lookup(r, s, n->name);
            if (ns.t != T_NS) jj_die(r, TL_ERR_ARG, n->pos, "cannot assign attribute on non-namespace object");
            jj_dict_set(r, ns.u.d, n->attr, strlen(n->attr), jj_eval(r, s, n->a));
        } else {
            jj_scope_set(r, s, n->name, jj_eval(r, s, n->a));
        }
        return 0;
    case N_SETBLOCK: {
        sb cap = {0};
        jj_exec(r, s, n->b, &cap);
        jj_scope_set(r, s, n->name, cap.s ? sb_val(&cap) : v_str("", 0));
        return 0;
    }
    case N_MACRO: {
        val m = {.t = T_MACRO};
        m.u.mac.n = n;
        m.u.mac.sc = s;
        jj_scope_set(r, s, n->name, m);
        return 0;
    }
    case N_BREAK: return 1;
    case N_CONTINUE: return 2;
    }
    jj_die(r, TL_ERR_ARG, n->pos, "bad statement");
}

