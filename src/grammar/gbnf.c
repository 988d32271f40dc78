/* gbnf: parses llama.cpp's GBNF notation into tl_grammar's flat rules.
 *
 * Notation: `name ::= alternatives`, one rule per line (newlines are spaces
 * only inside parentheses or after `|`); literals "...", classes [...] and
 * [^...] with ranges, `.` for any character, rule names, ( ... ) groups, and
 * the postfixes * + ? {m} {m,} {m,n}; # comments. Escapes: \n \r \t \\ \"
 * \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH. Repetitions and groups become
 * synthesized rules (right-recursive, so matching never needs more stack
 * than the output's nesting). Left recursion is refused at compile time: a
 * pushdown matcher would expand it forever. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "base/util.h"

#define MAX_REPEAT 1000 /* {m,n} bounds beyond this are refused */
#define MAX_ELEMS (1 << 22)

typedef struct pseq {
    tl_gelem *e;
    int n, cap;
} pseq;

typedef struct prule {
    char *name;
    pseq *alt;
    int n_alt, cap_alt;
    int defined;
    int line;  /* where it was first referenced or defined */
    int owner; /* a group's or repetition's rule: the written rule it is in, + 1 (0: written) */
} prule;

typedef struct parser {
    const char *s, *end;
    int line;
    prule *r;
    int n_r, cap_r;
    tl_grange *rg;
    int n_rg, cap_rg;
    int n_elems;
    tl_error *err;
    int failed;
    int depth; /* groups open: each is a level of recursion of the parser */
} parser;

/* Deeper groups than any grammar needs would overflow the stack (a request's
 * grammar is a client's text). */
#define GBNF_MAX_DEPTH 256

static int fail(parser *p, const char *what) {
    if (!p->failed) tl_fail(p->err, TL_ERR_ARG, "grammar line %d: %s", p->line, what);
    p->failed = 1;
    return -1;
}

static int grow(void **a, int *cap, int need, size_t sz) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *n = realloc(*a, (size_t)c * sz);
    if (!n) return -1;
    *a = n;
    *cap = c;
    return 0;
}

static int seq_push(parser *p, pseq *q, tl_gelem e) {
    if (++p->n_elems > MAX_ELEMS) return fail(p, "grammar too large");
    if (grow((void **)&q->e, &q->cap, q->n + 1, sizeof *q->e)) return fail(p, "out of memory");
    q->e[q->n++] = e;
    return 0;
}

static int seq_append(parser *p, pseq *q, const pseq *x) {
    for (int i = 0; i < x->n; i++)
        if (seq_push(p, q, x->e[i])) return -1;
    return 0;
}

static int rule_find(parser *p, const char *name, size_t len) {
    for (int i = 0; i < p->n_r; i++)
        if (strlen(p->r[i].name) == len && !memcmp(p->r[i].name, name, len)) return i;
    return -1;
}

static int rule_add(parser *p, const char *name, size_t len) {
    if (grow((void **)&p->r, &p->cap_r, p->n_r + 1, sizeof *p->r)) return fail(p, "out of memory");
    prule *r = &p->r[p->n_r];
    memset(r, 0, sizeof *r);
    r->name = malloc(len + 1);
    if (!r->name) return fail(p, "out of memory");
    memcpy(r->name, name, len);
    r->name[len] = 0;
    r->line = p->line;
    return p->n_r++;
}

static int rule_ref(parser *p, const char *name, size_t len) {
    int i = rule_find(p, name, len);
    return i >= 0 ? i : rule_add(p, name, len);
}

/* A rule made for a group or a repetition inside rule `owner`. */
static int rule_synth(parser *p, int owner) {
    char buf[96];
    int k = snprintf(buf, sizeof buf, "%.60s_%d", p->r[owner].name, p->n_r);
    int i = rule_add(p, buf, (size_t)k);
    if (i >= 0) {
        p->r[i].defined = 1;
        p->r[i].owner = p->r[owner].owner ? p->r[owner].owner : owner + 1;
    }
    return i;
}

static pseq *alt_new(parser *p, int rule) {
    prule *r = &p->r[rule];
    if (grow((void **)&r->alt, &r->cap_alt, r->n_alt + 1, sizeof *r->alt)) {
        fail(p, "out of memory");
        return NULL;
    }
    pseq *q = &r->alt[r->n_alt++];
    memset(q, 0, sizeof *q);
    return q;
}

static tl_gelem el_rule(int r) { return (tl_gelem){.kind = GE_RULE, .a = (uint32_t)r}; }

static int el_range(parser *p, tl_gelem *e, uint32_t lo, uint32_t hi) {
    if (grow((void **)&p->rg, &p->cap_rg, p->n_rg + 1, sizeof *p->rg)) return fail(p, "out of memory");
    if (e->n == 0) e->a = (uint32_t)p->n_rg;
    p->rg[p->n_rg++] = (tl_grange){lo, hi};
    e->n++;
    return 0;
}

/* ---- lexing ---- */

static void skip_space(parser *p, int newlines) {
    while (p->s < p->end) {
        char c = *p->s;
        if (c == '#') {
            while (p->s < p->end && *p->s != '\n') p->s++;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            p->s++;
        } else if (c == '\n' && newlines) {
            p->line++;
            p->s++;
        } else {
            break;
        }
    }
}

static int is_name(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_'; }

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* One UTF-8 code point of the grammar text. */
static int read_utf8(parser *p, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)p->s;
    size_t left = (size_t)(p->end - p->s);
    int n = u[0] < 0x80 ? 1 : (u[0] & 0xE0) == 0xC0 ? 2 : (u[0] & 0xF0) == 0xE0 ? 3 : (u[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (!n || (size_t)n > left) return fail(p, "invalid UTF-8 in the grammar");
    uint32_t c = n == 1 ? u[0] : u[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return fail(p, "invalid UTF-8 in the grammar");
        c = c << 6 | (u[i] & 0x3F);
    }
    p->s += n;
    *cp = c;
    return 0;
}

/* A character of a literal or class, escapes decoded. */
static int read_char(parser *p, uint32_t *cp) {
    if (p->s >= p->end) return fail(p, "unexpected end of the grammar");
    if (*p->s == '\n') return fail(p, "newline inside a literal or class");
    if (*p->s != '\\') return read_utf8(p, cp);
    if (p->end - p->s < 2) return fail(p, "unexpected end after '\\'");
    char c = p->s[1];
    p->s += 2;
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = p->s < p->end ? hexval(*p->s) : -1;
            if (h < 0) return fail(p, "bad hex escape");
            v = v << 4 | (uint32_t)h;
            p->s++;
        }
        if (v > 0x10FFFF) return fail(p, "code point out of range");
        *cp = v;
        return 0;
    }
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '0': *cp = 0; return 0;
    case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '\'':
        *cp = (uint32_t)c;
        return 0;
    default: return fail(p, "unknown escape");
    }
}

/* ---- parsing ---- */

static int parse_alternatives(parser *p, int rule, int nested);

/* One atom into u (a literal may give several elements). */
static int parse_atom(parser *p, int owner, pseq *u) {
    char c = *p->s;
    if (c == '"') {
        p->s++;
        while (p->s < p->end && *p->s != '"') {
            uint32_t cp;
            if (read_char(p, &cp)) return -1;
            tl_gelem e = {.kind = GE_CHARS};
            if (el_range(p, &e, cp, cp) || seq_push(p, u, e)) return -1;
        }
        if (p->s >= p->end) return fail(p, "unterminated literal");
        p->s++;
        return 0;
    }
    if (c == '[') {
        p->s++;
        tl_gelem e = {.kind = GE_CHARS};
        if (p->s < p->end && *p->s == '^') {
            e.neg = 1;
            p->s++;
        }
        while (p->s < p->end && *p->s != ']') {
            uint32_t lo, hi;
            if (read_char(p, &lo)) return -1;
            hi = lo;
            if (p->end - p->s >= 2 && p->s[0] == '-' && p->s[1] != ']') {
                p->s++;
                if (read_char(p, &hi)) return -1;
                if (hi < lo) return fail(p, "class range out of order");
            }
            if (el_range(p, &e, lo, hi)) return -1;
        }
        if (p->s >= p->end) return fail(p, "unterminated class");
        p->s++;
        if (!e.neg && e.n == 0) return fail(p, "empty class");
        return seq_push(p, u, e);
    }
    if (c == '.') {
        p->s++;
        return seq_push(p, u, (tl_gelem){.kind = GE_CHARS, .neg = 1});
    }
    if (c == '(') {
        p->s++;
        if (p->depth >= GBNF_MAX_DEPTH) return fail(p, "groups nested more than 256 deep");
        int r = rule_synth(p, owner);
        p->depth++;
        if (r < 0 || parse_alternatives(p, r, 1)) return -1;
        p->depth--;
        skip_space(p, 1);
        if (p->s >= p->end || *p->s != ')') return fail(p, "expected ')'");
        p->s++;
        return seq_push(p, u, el_rule(r));
    }
    if (is_name(c)) {
        const char *b = p->s;
        while (p->s < p->end && is_name(*p->s)) p->s++;
        int r = rule_ref(p, b, (size_t)(p->s - b));
        return r < 0 ? -1 : seq_push(p, u, el_rule(r));
    }
    return fail(p, "expected a literal, a class, '.', '(' or a rule name");
}

static int read_int(parser *p, int *v) {
    if (p->s >= p->end || !isdigit((unsigned char)*p->s)) return fail(p, "expected a number");
    long x = 0;
    while (p->s < p->end && isdigit((unsigned char)*p->s)) {
        x = x * 10 + (*p->s++ - '0');
        if (x > MAX_REPEAT) return fail(p, "repetition count too large (1000 at most)");
    }
    *v = (int)x;
    return 0;
}

/* u becomes u{lo,hi} (hi -1: unbounded). u must be one element. */
static int repeat(parser *p, int owner, pseq *u, int lo, int hi) {
    const tl_gelem x = u->e[0];
    u->n = 0;
    for (int i = 0; i < lo; i++)
        if (seq_push(p, u, x)) return -1;
    if (hi < 0) { /* R ::= x R | () */
        int r = rule_synth(p, owner);
        if (r < 0) return -1;
        pseq *a = alt_new(p, r);
        if (!a || seq_push(p, a, x) || seq_push(p, a, el_rule(r)) || !alt_new(p, r)) return -1;
        return seq_push(p, u, el_rule(r));
    }
    /* at most hi - lo more: R_1 ::= x | (); R_k ::= x R_{k-1} | () */
    int prev = -1;
    for (int k = 1; k <= hi - lo; k++) {
        int r = rule_synth(p, owner);
        if (r < 0) return -1;
        pseq *a = alt_new(p, r);
        if (!a || seq_push(p, a, x) || (prev >= 0 && seq_push(p, a, el_rule(prev))) || !alt_new(p, r)) return -1;
        prev = r;
    }
    return prev >= 0 ? seq_push(p, u, el_rule(prev)) : 0;
}

static int parse_sequence(parser *p, int owner, pseq *q, int nested) {
    for (;;) {
        skip_space(p, nested);
        if (p->s >= p->end) return 0;
        char c = *p->s;
        if (!(c == '"' || c == '[' || c == '.' || c == '(' || is_name(c))) return 0;
        /* a name followed by ::= starts the next rule (after a newline only,
         * which ends the sequence before we get here at the top level) */
        pseq u = {0};
        if (parse_atom(p, owner, &u)) {
            free(u.e);
            return -1;
        }
        for (;;) {
            if (p->s >= p->end) break;
            char o = *p->s;
            int lo, hi;
            if (o == '*') lo = 0, hi = -1;
            else if (o == '+') lo = 1, hi = -1;
            else if (o == '?') lo = 0, hi = 1;
            else if (o == '{') {
                p->s++;
                skip_space(p, 0);
                if (read_int(p, &lo)) goto bad;
                skip_space(p, 0);
                hi = lo;
                if (p->s < p->end && *p->s == ',') {
                    p->s++;
                    skip_space(p, 0);
                    hi = -1;
                    if (p->s < p->end && *p->s != '}' && read_int(p, &hi)) goto bad;
                    skip_space(p, 0);
                    if (hi >= 0 && hi < lo) {
                        fail(p, "repetition {m,n} with n < m");
                        goto bad;
                    }
                }
                if (p->s >= p->end || *p->s != '}') {
                    fail(p, "expected '}'");
                    goto bad;
                }
            } else
                break;
            p->s++;
            if (u.n != 1) { /* a literal of several characters: one rule */
                int r = rule_synth(p, owner);
                pseq *a = r < 0 ? NULL : alt_new(p, r);
                if (!a || seq_append(p, a, &u)) goto bad;
                u.n = 0;
                if (seq_push(p, &u, el_rule(r))) goto bad;
            }
            if (repeat(p, owner, &u, lo, hi)) goto bad;
        }
        int rc = seq_append(p, q, &u);
        free(u.e);
        if (rc) return -1;
        continue;
    bad:
        free(u.e);
        return -1;
    }
}

static int parse_alternatives(parser *p, int rule, int nested) {
    for (;;) {
        pseq *q = alt_new(p, rule);
        if (!q || parse_sequence(p, rule, q, nested)) return -1;
        skip_space(p, nested);
        if (p->s >= p->end || *p->s != '|') return 0;
        p->s++;
        skip_space(p, 1);
    }
}

static int parse_rules(parser *p) {
    for (;;) {
        skip_space(p, 1);
        if (p->s >= p->end) return 0;
        const char *b = p->s;
        while (p->s < p->end && is_name(*p->s)) p->s++;
        if (p->s == b) return fail(p, "expected a rule name");
        const size_t len = (size_t)(p->s - b);
        skip_space(p, 0);
        if (p->end - p->s < 3 || memcmp(p->s, "::=", 3)) return fail(p, "expected '::='");
        p->s += 3;
        skip_space(p, 1); /* the body may start on the next line */
        int r = rule_ref(p, b, len);
        if (r < 0) return -1;
        if (p->r[r].defined) return fail(p, "rule defined twice");
        p->r[r].defined = 1;
        p->r[r].line = p->line;
        if (parse_alternatives(p, r, 0)) return -1;
        skip_space(p, 0);
        if (p->s < p->end && *p->s != '\n') return fail(p, "unexpected text after the rule");
    }
}

/* ---- checks and flattening ---- */

static int elem_nullable(const tl_gelem *e, const uint8_t *nullable) {
    return e->kind == GE_RULE && nullable[e->a];
}

/* Rules reachable from r without consuming input; a cycle is left recursion. */
static int left_cycle(const tl_grammar *g, const uint8_t *nullable, int r, uint8_t *mark) {
    if (mark[r] == 1) return r;
    if (mark[r] == 2) return -1;
    mark[r] = 1;
    for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
        for (const tl_gelem *e = &g->el[g->alt[a]]; e->kind != GE_END; e++) {
            if (e->kind != GE_RULE) break;
            int c = left_cycle(g, nullable, (int)e->a, mark);
            if (c >= 0) return c;
            if (!elem_nullable(e, nullable)) break;
        }
    mark[r] = 2;
    return -1;
}

/* owner[r]: as prule's (for the messages: a user knows the rules written). */
static int check(tl_grammar *g, const int *owner, tl_error *err) {
    uint8_t *nullable = calloc((size_t)g->n_rule, 1), *mark = calloc((size_t)g->n_rule, 1);
    if (!nullable || !mark) {
        free(nullable);
        free(mark);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < g->n_rule; r++) {
            if (nullable[r]) continue;
            for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !nullable[r]; a++) {
                const tl_gelem *e = &g->el[g->alt[a]];
                while (e->kind == GE_RULE && nullable[e->a]) e++;
                if (e->kind == GE_END) nullable[r] = 1, changed = 1;
            }
        }
    }
    int rc = TL_OK;
    for (int r = 0; r < g->n_rule && !rc; r++) {
        int c = left_cycle(g, nullable, r, mark);
        if (c >= 0 && owner[c])
            rc = tl_fail(err, TL_ERR_ARG,
                         "grammar: a group or repetition in rule '%s' is left-recursive: it repeats something that "
                         "can match nothing, as (\"a\"*)* does (write (\"a\"+)* or \"a\"*)",
                         g->name[owner[c] - 1]);
        else if (c >= 0)
            rc = tl_fail(err, TL_ERR_ARG, "grammar: rule '%s' is left-recursive", g->name[c]);
    }
    free(nullable);
    free(mark);
    return rc;
}

int tl_gelem_match(const tl_grammar *g, const tl_gelem *e, uint32_t c) {
    const tl_grange *r = g->rg + e->a;
    for (uint32_t i = 0; i < e->n; i++)
        if (c >= r[i].lo && c <= r[i].hi) return !e->neg;
    return e->neg;
}

void tl_grammar_free(tl_grammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n_rule; i++) free(g->name[i]);
    free(g->name);
    free(g->el);
    free(g->rg);
    free(g->alt);
    free(g->rule_alt);
    free(g);
}

static void parser_free(parser *p) {
    for (int i = 0; i < p->n_r; i++) {
        free(p->r[i].name);
        for (int a = 0; a < p->r[i].n_alt; a++) free(p->r[i].alt[a].e);
        free(p->r[i].alt);
    }
    free(p->r);
    free(p->rg);
}

int tl_grammar_parse(const char *text, size_t len, tl_grammar **out, tl_error *err) {
    *out = NULL;
    parser p = {.s = text, .end = text + len, .line = 1, .err = err};
    if (parse_rules(&p)) {
        parser_free(&p);
        return TL_ERR_ARG;
    }
    int root = -1;
    for (int i = 0; i < p.n_r; i++) {
        if (!p.r[i].defined) {
            tl_fail(err, TL_ERR_ARG, "grammar line %d: rule '%s' is used but not defined", p.r[i].line, p.r[i].name);
            parser_free(&p);
            return TL_ERR_ARG;
        }
        if (!strcmp(p.r[i].name, "root")) root = i;
    }
    if (root < 0) {
        parser_free(&p);
        return tl_fail(err, TL_ERR_ARG, "grammar: no 'root' rule");
    }
    tl_grammar *g = calloc(1, sizeof *g);
    int n_alt = 0, n_el = 0;
    for (int i = 0; i < p.n_r; i++) {
        n_alt += p.r[i].n_alt;
        for (int a = 0; a < p.r[i].n_alt; a++) n_el += p.r[i].alt[a].n + 1;
    }
    if (g) {
        g->el = malloc((size_t)(n_el + 1) * sizeof *g->el);
        g->alt = malloc((size_t)(n_alt + 1) * sizeof *g->alt);
        g->rule_alt = malloc((size_t)(p.n_r + 1) * sizeof *g->rule_alt);
        g->name = calloc((size_t)p.n_r + 1, sizeof *g->name);
    }
    if (!g || !g->el || !g->alt || !g->rule_alt || !g->name) {
        tl_grammar_free(g);
        parser_free(&p);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < p.n_r; i++) {
        g->rule_alt[i] = g->n_alt;
        for (int a = 0; a < p.r[i].n_alt; a++) {
            g->alt[g->n_alt++] = g->n_el;
            if (p.r[i].alt[a].n) /* an empty alternative has no array */
                memcpy(g->el + g->n_el, p.r[i].alt[a].e, (size_t)p.r[i].alt[a].n * sizeof *g->el);
            g->n_el += p.r[i].alt[a].n;
            g->el[g->n_el++] = (tl_gelem){.kind = GE_END};
        }
        g->name[i] = p.r[i].name;
        p.r[i].name = NULL;
    }
    g->rule_alt[p.n_r] = g->n_alt;
    g->n_rule = p.n_r;
    g->rg = p.rg;
    g->n_rg = p.n_rg;
    p.rg = NULL;
    g->root = root;
    int *owner = malloc((size_t)p.n_r * sizeof *owner);
    for (int i = 0; owner && i < p.n_r; i++) owner[i] = p.r[i].owner;
    parser_free(&p);
    int rc = owner ? check(g, owner, err) : tl_fail(err, TL_ERR_NOMEM, "out of memory");
    free(owner);
    if (rc) {
        tl_grammar_free(g);
        return rc;
    }
    *out = g;
    return TL_OK;
}
