/* parser.c: tokens to a tree, by recursive descent with jinja2's operator
 * precedence, loosest first: x if c else y, or, and, not, comparisons, + -,
 * ~, * / // %, **, unary, then postfix and filters. Everything outside the
 * subset chat templates use fails here with "unsupported construct" and its
 * line, so a template either compiles into something the evaluator fully
 * understands or not at all. Nesting is capped (MAX_DEPTH) because the
 * parser recurses on the C stack. */
#include <stdio.h>
#include <string.h>

#include "chat/jinja.h"

typedef struct parser {
    R *r;
    tok *t;
    size_t i;
    int depth;
} parser;

static tok *cur(parser *P) { return &P->t[P->i]; }
static node *mk(parser *P, int k, int pos) {
    node *n = jj_alloc(P->r, sizeof *n);
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
    if (got) jj_die(P->r, TL_ERR_FORMAT, t->pos, "%s (found %s)", what, got);
    jj_die(P->r, TL_ERR_FORMAT, t->pos, "%s (found '%.*s')", what, (int)(t->n > 40 ? 40 : t->n),
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
    return jj_strdup(P->r, t->s, t->n);
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
        node **nv = jj_alloc(r, nc * sizeof *nv);
        const char **nn = jj_alloc(r, nc * sizeof *nn);
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
    n->list = jj_alloc(P->r, (pos.n + kw.n + 1) * sizeof(node *));
    n->names = jj_alloc(P->r, (pos.n + kw.n + 1) * sizeof(char *));
    for (size_t i = 0; i < pos.n; i++) n->list[i] = pos.v[i];
    for (size_t i = 0; i < kw.n; i++) {
        n->list[pos.n + i] = kw.v[i];
        n->names[pos.n + i] = kw.nm[i];
    }
}

static void freeze(parser *P, node *n, nvec *a) {
    n->n = (int)a->n;
    n->list = jj_alloc(P->r, (a->n + 1) * sizeof(node *));
    if (a->n) memcpy(n->list, a->v, a->n * sizeof(node *));
}

static node *p_primary(parser *P) {
    tok *t = cur(P);
    node *n;
    if (t->k == K_STR) {
        n = mk(P, N_LIT, t->pos);
        sb b = {0};
        jj_sb_add(P->r, &b, t->s, t->n);
        P->i++;
        while (cur(P)->k == K_STR) { /* adjacent literals join, as in Python */
            jj_sb_add(P->r, &b, cur(P)->s, cur(P)->n);
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
            n->name = jj_strdup(P->r, t->s, t->n);
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
                t->list = jj_alloc(P->r, 2 * sizeof(node *));
                t->names = jj_alloc(P->r, 2 * sizeof(char *));
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
    if (++P->depth > MAX_DEPTH) jj_die(P->r, TL_ERR_FORMAT, pos, "expression nested too deeply");
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
        if (++P->depth > MAX_DEPTH) jj_die(P->r, TL_ERR_FORMAT, n->pos, "expression nested too deeply");
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
    if (++P->depth > MAX_DEPTH) jj_die(P->r, TL_ERR_FORMAT, cur(P)->pos, "expression nested too deeply");
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
    if (is_name(P, "recursive")) jj_die(P->r, TL_ERR_UNSUPPORTED, cur(P)->pos, "unsupported construct: recursive for loops");
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
        jj_die(P->r, TL_ERR_UNSUPPORTED, cur(P)->pos, "unsupported construct: set with several targets");
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
    const char *kw = jj_strdup(P->r, t->s, t->n);
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
    jj_die(P->r, TL_ERR_UNSUPPORTED, kpos, "unsupported construct: {%% %s %%}", kw);
}

static node *p_body(parser *P, const char *const *ends) {
    node *body = mk(P, N_BODY, cur(P)->pos);
    nvec items = {0};
    if (++P->depth > MAX_DEPTH) jj_die(P->r, TL_ERR_FORMAT, cur(P)->pos, "blocks nested too deeply");
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
                jj_die(P->r, TL_ERR_FORMAT, kw->pos, "unexpected {%% %.*s %%}", (int)kw->n, kw->s);
            nv_push(P->r, &items, p_stmt(P), NULL);
        } else {
            perr(P, "unexpected token");
        }
    }
    P->depth--;
    freeze(P, body, &items);
    return body;
}

node *jj_parse(R *r, tok *t) {
    parser P = {.r = r, .t = t};
    return p_body(&P, NULL);
}
