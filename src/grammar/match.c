/* match: follows one output through a grammar, and says which tokens may
 * come next.
 *
 * The state is a set of pushdown stacks of element positions (the top is the
 * character set the next code point must match; below it, where each
 * enclosing rule resumes) plus the bytes of a code point still incomplete.
 * Rule references expand when they reach the top, so every stack in a state
 * is waiting for a character; a reference last in its alternative does not
 * leave a return position (a tail call), so repetition costs no stack.
 *
 * Allowed tokens: a depth-first walk of the vocabulary's byte trie, the state
 * advanced one byte per edge and the subtree dropped as soon as no stack
 * survives; every token ending on a surviving node is allowed, and the end
 * tokens when the grammar may end. The result is cached per state (most
 * steps of a JSON string revisit one state), so the walk runs once per new
 * state, never once per token of the vocabulary per step. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "base/util.h"

#define MAX_STACK 4096   /* nesting the matcher follows */
#define CACHE_N 64       /* allowed-token sets kept per matcher */
#define IST_CAP 256      /* distinct states one walk interns */
#define MAX_EXPAND 200000 /* rule expansions one step may take */
/* expand()'s recursion (~110 bytes of stack a level): empty alternatives let
 * it walk through many rules without the stack it follows growing (nested
 * repetitions: a client's grammar overflowed the thread's stack) */
#define MAX_DEPTH 8192
#define CP_ANY 0xFFFFFFFFu /* a partial code point whose completions every stack takes alike */

/* ---- the vocabulary trie ---- */

/* Byte classes, for a subtree's summary: plain printable ASCII (not " or \),
 * and the rest. */
#define CLS_PLAIN 1
#define CLS_OTHER 2

typedef struct tnode {
    int32_t child, n_child; /* children: node[child .. child + n_child) */
    int32_t tok, n_tok;     /* tokens ending here: ord[tok .. tok + n_tok) */
    int32_t tok_end;        /* the subtree's tokens: ord[tok .. tok_end) */
    uint8_t byte;           /* the edge from the parent */
    uint8_t cls;            /* the classes of every byte below this node */
    uint8_t depth;          /* the longest path below this node (255 at most) */
    uint8_t ok;             /* bit k: every token below, from here on, is text (plain ASCII, whole
                             * characters, perhaps one cut short at its end) when k continuation
                             * bytes are due first */
} tnode;

/* The continuation bytes a lead byte announces, for leads every continuation
 * of which is a character (not E0, ED, F0, F4: those cut the next byte's
 * range); -1 for anything else. */
static int safe_lead(uint8_t b) {
    if (b >= 0xC2 && b < 0xE0) return 1;
    if ((b >= 0xE1 && b < 0xF0 && b != 0xED)) return 2;
    if (b >= 0xF1 && b < 0xF4) return 3;
    return -1;
}

static uint8_t byte_cls(uint8_t b) { return b >= 0x20 && b < 0x7F && b != '"' && b != '\\' ? CLS_PLAIN : CLS_OTHER; }

struct tl_vocab_trie {
    const tl_model *model;
    int n_vocab;
    tnode *node;
    int n_node, cap_node;
    int32_t *ord;         /* token ids sorted by their bytes */
    int32_t *eog;         /* end-of-generation tokens */
    int n_eog;
    int max_len;
};

typedef struct tpiece {
    const uint8_t *b;
    int n;
} tpiece;

static int piece_cmp(const void *x, const void *y, void *ctx) {
    const tpiece *pc = ctx;
    const tpiece *a = &pc[*(const int32_t *)x], *b = &pc[*(const int32_t *)y];
    int n = a->n < b->n ? a->n : b->n, c = memcmp(a->b, b->b, (size_t)n);
    if (c) return c;
    return a->n != b->n ? (a->n < b->n ? -1 : 1) : (*(const int32_t *)x < *(const int32_t *)y ? -1 : 1);
}

/* Node `at` holds ord[lo, hi), which share their first d bytes. */
static int trie_build(tl_vocab_trie *t, const tpiece *pc, int at, int lo, int hi, int d) {
    int i = lo;
    while (i < hi && pc[t->ord[i]].n == d) i++;
    t->node[at].tok = lo;
    t->node[at].n_tok = i - lo;
    t->node[at].tok_end = hi;
    t->node[at].ok = 0xF; /* children narrow it */
    int groups = 0;
    for (int j = i; j < hi;) {
        int k = j;
        while (k < hi && pc[t->ord[k]].b[d] == pc[t->ord[j]].b[d]) k++;
        groups++;
        j = k;
    }
    if (t->n_node + groups > t->cap_node) {
        int c = t->cap_node * 2;
        while (c < t->n_node + groups) c *= 2;
        tnode *n = realloc(t->node, (size_t)c * sizeof *n);
        if (!n) return -1;
        t->node = n;
        t->cap_node = c;
    }
    const int first = t->n_node;
    t->node[at].child = first;
    t->node[at].n_child = groups;
    t->n_node += groups;
    int g = 0;
    for (int j = i; j < hi; g++) {
        int k = j;
        while (k < hi && pc[t->ord[k]].b[d] == pc[t->ord[j]].b[d]) k++;
        memset(&t->node[first + g], 0, sizeof(tnode));
        t->node[first + g].byte = pc[t->ord[j]].b[d];
        if (trie_build(t, pc, first + g, j, k, d + 1)) return -1;
        const tnode *c = &t->node[first + g];
        t->node[at].cls |= (uint8_t)(byte_cls(c->byte) | c->cls);
        /* text from here: a continuation where one is due, else plain ASCII
         * or a safe lead and what it announces */
        uint8_t ok = 0;
        if (c->byte >= 0x80 && c->byte < 0xC0) ok |= (uint8_t)((c->ok << 1) & 0xE);
        if (byte_cls(c->byte) == CLS_PLAIN && (c->ok & 1)) ok |= 1;
        else if (safe_lead(c->byte) > 0 && (c->ok >> safe_lead(c->byte) & 1)) ok |= 1;
        t->node[at].ok &= ok;
        const int dd = 1 + t->node[first + g].depth;
        if (dd > t->node[at].depth) t->node[at].depth = (uint8_t)(dd > 255 ? 255 : dd);
        j = k;
    }
    return 0;
}

void tl_vocab_trie_free(tl_vocab_trie *t) {
    if (!t) return;
    free(t->node);
    free(t->ord);
    free(t->eog);
    free(t);
}

int tl_vocab_trie_new(const tl_model *m, tl_vocab_trie **out, tl_error *err) {
    *out = NULL;
    const int nv = tl_model_n_vocab(m);
    tl_vocab_trie *t = calloc(1, sizeof *t);
    tpiece *pc = calloc((size_t)nv, sizeof *pc);
    uint8_t *bytes = NULL;
    size_t n_bytes = 0, cap = 0;
    char buf[512];
    if (!t || !pc) goto oom;
    t->n_vocab = nv;
    t->model = m;
    t->ord = malloc((size_t)nv * sizeof *t->ord);
    t->eog = malloc((size_t)nv * sizeof *t->eog);
    if (!t->ord || !t->eog) goto oom;
    /* pieces first into one buffer (offsets), then pointers */
    size_t *off = malloc((size_t)nv * sizeof *off);
    if (!off) goto oom;
    int n_ord = 0;
    for (int i = 0; i < nv; i++) {
        if (tl_token_is_eog(m, i)) t->eog[t->n_eog++] = i;
        size_t n = tl_token_piece(m, i, 0, buf, sizeof buf);
        off[i] = n_bytes;
        pc[i].n = 0;
        /* control tokens (no text) and overlong ones are never allowed */
        if (n == 0 || n > sizeof buf) continue;
        if (n_bytes + n > cap) {
            size_t c = cap ? cap * 2 : 1 << 20;
            while (c < n_bytes + n) c *= 2;
            uint8_t *nb = realloc(bytes, c);
            if (!nb) {
                free(off);
                goto oom;
            }
            bytes = nb;
            cap = c;
        }
        memcpy(bytes + n_bytes, buf, n);
        n_bytes += n;
        pc[i].n = (int)n;
        if ((int)n > t->max_len) t->max_len = (int)n;
        t->ord[n_ord++] = i;
    }
    for (int i = 0; i < nv; i++) pc[i].b = bytes + off[i];
    free(off);
    qsort_r(t->ord, (size_t)n_ord, sizeof *t->ord, piece_cmp, pc);
    t->cap_node = 1024;
    t->node = calloc((size_t)t->cap_node, sizeof *t->node);
    if (!t->node) goto oom;
    t->n_node = 1;
    if (trie_build(t, pc, 0, 0, n_ord, 0)) goto oom;
    free(pc);
    free(bytes);
    *out = t;
    return TL_OK;
oom:
    free(pc);
    free(bytes);
    tl_vocab_trie_free(t);
    return tl_fail(err, TL_ERR_NOMEM, "out of memory");
}

/* ---- states ---- */

typedef struct gstate {
    uint32_t *pos;  /* the stacks, concatenated (each bottom first) */
    int32_t *off;   /* stack i: pos[off[i] .. off[i + 1]) */
    int n, cap_n, n_pos, cap_pos;
    int accept;     /* the output may end here */
    uint32_t cp;    /* an incomplete code point's bits so far */
    int need;       /* its continuation bytes still to come */
    int len;        /* its length in bytes */
} gstate;

static void st_free(gstate *s) {
    free(s->pos);
    free(s->off);
}

static void st_clear(gstate *s) {
    s->n = 0;
    s->n_pos = 0;
    s->accept = 0;
    s->cp = 0;
    s->need = 0;
    s->len = 0;
    if (s->off) s->off[0] = 0;
}

static int st_reserve(gstate *s, int n, int n_pos) {
    if (n + 1 > s->cap_n) {
        int c = s->cap_n ? s->cap_n * 2 : 16;
        while (c < n + 1) c *= 2;
        int32_t *o = realloc(s->off, (size_t)c * sizeof *o);
        if (!o) return -1;
        if (!s->off) o[0] = 0;
        s->off = o;
        s->cap_n = c;
    }
    if (n_pos > s->cap_pos) {
        int c = s->cap_pos ? s->cap_pos * 2 : 64;
        while (c < n_pos) c *= 2;
        uint32_t *p = realloc(s->pos, (size_t)c * sizeof *p);
        if (!p) return -1;
        s->pos = p;
        s->cap_pos = c;
    }
    return 0;
}

/* Adds stack stk[0..len) unless the set has it. */
static int st_add(gstate *s, const uint32_t *stk, int len) {
    for (int i = 0; i < s->n; i++)
        if (s->off[i + 1] - s->off[i] == len && !memcmp(s->pos + s->off[i], stk, (size_t)len * sizeof *stk))
            return 0;
    if (st_reserve(s, s->n + 1, s->n_pos + len)) return -1;
    memcpy(s->pos + s->n_pos, stk, (size_t)len * sizeof *stk);
    s->n_pos += len;
    s->off[++s->n] = s->n_pos;
    return 0;
}

static int st_copy(gstate *d, const gstate *s) {
    if (st_reserve(d, s->n, s->n_pos)) return -1;
    if (s->n_pos) memcpy(d->pos, s->pos, (size_t)s->n_pos * sizeof *s->pos);
    memcpy(d->off, s->off, (size_t)(s->n + 1) * sizeof *s->off);
    d->n = s->n;
    d->n_pos = s->n_pos;
    d->accept = s->accept;
    d->cp = s->cp;
    d->need = s->need;
    d->len = s->len;
    return 0;
}

struct tl_matcher {
    const tl_grammar *g;
    const tl_vocab_trie *t;
    gstate cur;
    gstate *lvl;       /* the trie walk's states, one per depth */
    int n_lvl;
    uint32_t *scratch; /* expansion copies */
    int n_scratch, cap_scratch;
    int words;         /* bitset words per vocabulary */
    /* the cache: keys are the state's stacks, accept flag and partial bytes */
    struct {
        uint64_t hash;
        uint32_t *key;
        int key_n;
        uint32_t *bits;
        int used;
    } cache[CACHE_N];
    int clock;
    long n_expand; /* expansions since the count was last reset (MAX_EXPAND) */
    int depth;     /* expand()'s recursion now (MAX_DEPTH) */
    /* the walk's states, interned, and their transitions by byte (-2: not
     * computed yet, -1: no stack survives): most nodes of the trie lead to a
     * state already seen, so a node usually costs one table read */
    gstate ist[IST_CAP];
    uint64_t ist_hash[IST_CAP];
    int16_t ist_run[IST_CAP]; /* plain bytes in a row this state takes alike: -1 unknown */
    int8_t ist_text[IST_CAP]; /* any text leads back to this state (1), or not (0); -1 unknown */
    int n_ist;
    int32_t *trans;           /* [IST_CAP][256] */
    uint32_t *key; /* the current state's key */
    int cap_key;
    int failed; /* out of memory or too deep while expanding */
    int limit;  /* ... and it was a limit (MAX_STACK, MAX_EXPAND, the scratch), not memory: the
                 * grammar asks more than the matcher follows, whatever is retried */
};

/* What a failed walk or expansion reports: TL_ERR_UNSUPPORTED when the
 * grammar hit a limit (a server answers that request 400, not "try again"),
 * TL_ERR_NOMEM when memory ran out. */
static int fail_status(const tl_matcher *m, tl_error *err) {
    if (m->limit)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "grammar: too complex to follow: nesting deeper than %d, more "
                       "than %d ways to one state, or rules %d deep at one step", MAX_STACK, MAX_EXPAND, MAX_DEPTH);
    return tl_fail(err, TL_ERR_NOMEM, "grammar: out of memory");
}

/* Resolves stk[0..len) until every stack waits for a character: a rule
 * reference on top becomes each of its alternatives, an alternative's end
 * returns to the position below. Adds the results to out. */
static void expand(tl_matcher *m, gstate *out, uint32_t *stk, int len) {
    const tl_grammar *g = m->g;
    /* a grammar whose empty derivations multiply (a ::= "" | "", used n
     * times) would take 2^n paths to one state: bounded, it fails instead */
    if (++m->n_expand > MAX_EXPAND || m->depth >= MAX_DEPTH) {
        m->failed = m->limit = 1;
        return;
    }
    for (;;) {
        if (len == 0) {
            out->accept = 1;
            return;
        }
        const tl_gelem *e = &g->el[stk[len - 1]];
        if (e->kind == GE_CHARS) {
            if (st_add(out, stk, len)) m->failed = 1;
            return;
        }
        if (e->kind == GE_END) {
            len--;
            continue;
        }
        break;
    }
    const uint32_t p = stk[len - 1];
    const tl_gelem *e = &g->el[p];
    int base = len - 1;
    const int ret = g->el[p + 1].kind != GE_END; /* not a tail call: come back to p + 1 */
    if (base + ret + 1 > MAX_STACK || m->n_scratch + base + 2 > m->cap_scratch) {
        m->failed = m->limit = 1;
        return;
    }
    const int at = m->n_scratch;
    m->n_scratch += base + 2;
    for (int a = g->rule_alt[e->a]; a < g->rule_alt[e->a + 1]; a++) {
        uint32_t *s = m->scratch + at;
        memcpy(s, stk, (size_t)base * sizeof *s);
        int l = base;
        if (ret) s[l++] = p + 1;
        s[l++] = (uint32_t)g->alt[a];
        m->depth++;
        expand(m, out, s, l);
        m->depth--;
    }
    m->n_scratch = at;
}

/* out = in after code point c. */
static void advance_cp(tl_matcher *m, const gstate *in, uint32_t c, gstate *out) {
    st_clear(out);
    m->n_expand = 0;
    for (int i = 0; i < in->n; i++) {
        const int len = in->off[i + 1] - in->off[i];
        const uint32_t *stk = in->pos + in->off[i];
        if (!tl_gelem_match(m->g, &m->g->el[stk[len - 1]], c)) continue;
        if (m->n_scratch + len > m->cap_scratch) {
            m->failed = m->limit = 1;
            return;
        }
        uint32_t *s = m->scratch + m->n_scratch;
        memcpy(s, stk, (size_t)len * sizeof *s);
        s[len - 1]++;
        m->n_scratch += len;
        expand(m, out, s, len);
        m->n_scratch -= len;
    }
}

/* out = in after a code point every stack's set holds (a canonical partial
 * state completing: which one it is no longer matters). */
static void advance_all(tl_matcher *m, const gstate *in, gstate *out) {
    st_clear(out);
    m->n_expand = 0;
    for (int i = 0; i < in->n; i++) {
        const int len = in->off[i + 1] - in->off[i];
        if (m->n_scratch + len > m->cap_scratch) {
            m->failed = m->limit = 1;
            return;
        }
        uint32_t *s = m->scratch + m->n_scratch;
        memcpy(s, in->pos + in->off[i], (size_t)len * sizeof *s);
        s[len - 1]++;
        m->n_scratch += len;
        expand(m, out, s, len);
        m->n_scratch -= len;
    }
}

/* How stack i's set meets [lo, hi]: 2 holds all of it, 0 none of it, 1 part
 * (or cannot tell from single ranges). */
static int set_meets(const tl_matcher *m, const gstate *s, int i, uint32_t lo, uint32_t hi) {
    const tl_gelem *e = &m->g->el[s->pos[s->off[i + 1] - 1]];
    const tl_grange *r = m->g->rg + e->a;
    int covered = 0, touched = 0;
    for (uint32_t k = 0; k < e->n; k++) {
        covered |= r[k].lo <= lo && r[k].hi >= hi;
        touched |= r[k].lo <= hi && r[k].hi >= lo;
    }
    if (e->neg) return covered ? 0 : touched ? 1 : 2;
    return covered ? 2 : touched ? 1 : 0;
}

/* Whether some stack's set holds a code point in [lo, hi]. */
static int any_in_range(const tl_matcher *m, const gstate *s, uint32_t lo, uint32_t hi) {
    for (int i = 0; i < s->n; i++) {
        const tl_gelem *e = &m->g->el[s->pos[s->off[i + 1] - 1]];
        const tl_grange *r = m->g->rg + e->a;
        if (e->neg) {
            int covered = 0;
            for (uint32_t k = 0; k < e->n && !covered; k++) covered = r[k].lo <= lo && r[k].hi >= hi;
            if (!covered) return 1;
        } else {
            for (uint32_t k = 0; k < e->n; k++)
                if (r[k].lo <= hi && r[k].hi >= lo) return 1;
        }
    }
    return 0;
}

/* The least code point a UTF-8 sequence of n bytes may encode. */
static const uint32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};

/* out = in after byte b; returns 0 when no stack survives. A byte that
 * leaves a code point incomplete keeps the stacks (out shares nothing with
 * in, but they are copied only when the code point completes). */
static int advance_byte(tl_matcher *m, const gstate *in, uint8_t b, gstate *out) {
    uint32_t cp;
    int need;
    if (in->need == 0) {
        if (b < 0x80) {
            advance_cp(m, in, b, out);
            return out->n > 0 || out->accept;
        }
        if (b >= 0xC2 && b < 0xE0) cp = b & 0x1F, need = 1;
        else if (b >= 0xE0 && b < 0xF0) cp = b & 0x0F, need = 2;
        else if (b >= 0xF0 && b < 0xF5) cp = b & 0x07, need = 3;
        else return 0;
    } else {
        if ((b & 0xC0) != 0x80) return 0;
        if (in->cp == CP_ANY) { /* canonical: every continuation completes alike */
            if (in->need == 1) {
                advance_all(m, in, out);
                return out->n > 0 || out->accept;
            }
            if (st_copy(out, in)) {
                m->failed = 1;
                return 0;
            }
            out->need = in->need - 1;
            return 1;
        }
        cp = in->cp << 6 | (b & 0x3F);
        need = in->need - 1;
        if (need == 0) {
            /* overlong and surrogate forms are not characters */
            if (cp < min_of[in->len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
            advance_cp(m, in, cp, out);
            return out->n > 0 || out->accept;
        }
    }
    /* the characters this prefix can still become: its bits followed by any
     * continuation, but no shorter form (overlong), no surrogate, nothing
     * past U+10FFFF */
    const int total = in->need == 0 ? need + 1 : in->len;
    uint32_t lo = cp << (6 * need), hi = lo | ((1u << (6 * need)) - 1);
    if (lo < min_of[total]) lo = min_of[total];
    if (hi > 0x10FFFF) hi = 0x10FFFF;
    if (lo >= 0xD800 && lo <= 0xDFFF) lo = 0xE000;
    if (hi >= 0xD800 && hi <= 0xDFFF) hi = 0xD7FF;
    if (lo > hi || !any_in_range(m, in, lo, hi)) return 0;
    /* When every completion of the prefix is a character (the range was
     * not cut: no overlong, surrogate or too-large form is left to rule out)
     * and each stack's set holds all of them or none, which bits came so far
     * no longer matters: the stacks that hold them all, with CP_ANY, make
     * one state where there were thousands (a 262k vocabulary's multi-byte
     * tokens would otherwise each lead somewhere new). */
    int canon = lo == cp << (6 * need) && hi == (lo | ((1u << (6 * need)) - 1));
    for (int i = 0; canon && i < in->n; i++) canon = set_meets(m, in, i, lo, hi) != 1;
    if (canon) {
        st_clear(out);
        for (int i = 0; i < in->n; i++)
            if (set_meets(m, in, i, lo, hi) == 2 && st_add(out, in->pos + in->off[i], in->off[i + 1] - in->off[i])) {
                m->failed = 1;
                return 0;
            }
        out->cp = CP_ANY;
        out->need = need;
        out->len = total;
        return 1;
    }
    if (st_copy(out, in)) {
        m->failed = 1;
        return 0;
    }
    out->accept = 0;
    out->cp = cp;
    out->need = need;
    out->len = total;
    return 1;
}

/* ---- allowed tokens ---- */

static void walk(tl_matcher *m, const tnode *nd, int depth, uint32_t *bits) {
    const tl_vocab_trie *t = m->t;
    const gstate *s = &m->lvl[depth];
    for (int i = 0; i < nd->n_tok; i++) {
        const int32_t id = t->ord[nd->tok + i];
        bits[id >> 5] |= 1u << (id & 31);
    }
    if (depth + 1 >= m->n_lvl) return;
    for (int c = 0; c < nd->n_child; c++) {
        const tnode *ch = &t->node[nd->child + c];
        if (advance_byte(m, s, ch->byte, &m->lvl[depth + 1])) walk(m, ch, depth + 1, bits);
        if (m->failed) return;
    }
}

static uint64_t state_hash(const gstate *s);

static int state_eq(const gstate *a, const gstate *b) {
    return a->n == b->n && a->n_pos == b->n_pos && a->accept == b->accept && a->need == b->need && a->cp == b->cp &&
           a->len == b->len && !memcmp(a->off, b->off, (size_t)(a->n + 1) * sizeof *a->off) &&
           (!a->n_pos || !memcmp(a->pos, b->pos, (size_t)a->n_pos * sizeof *a->pos));
}

/* The id of state s among the walk's, adding it; -1 when the table is full. */
static int intern(tl_matcher *m, const gstate *s) {
    const uint64_t h = state_hash(s);
    for (int i = 0; i < m->n_ist; i++)
        if (m->ist_hash[i] == h && state_eq(&m->ist[i], s)) return i;
    if (m->n_ist == IST_CAP) return -1;
    const int id = m->n_ist;
    if (st_reserve(&m->ist[id], s->n, s->n_pos) || st_copy(&m->ist[id], s)) {
        m->failed = 1;
        return -1;
    }
    m->ist_hash[id] = h;
    m->ist_run[id] = -1;
    m->ist_text[id] = -1;
    for (int b = 0; b < 256; b++) m->trans[id * 256 + b] = -2;
    m->n_ist++;
    return id;
}

/* The state after byte b from interned state id: its id, -1 if none
 * survives, -3 if the table is full (out holds the state then). */
static int trans(tl_matcher *m, int id, uint8_t b, gstate *out) {
    int32_t *t = &m->trans[id * 256 + b];
    if (*t != -2) return *t;
    if (!advance_byte(m, &m->ist[id], b, out)) return *t = -1;
    const int to = intern(m, out);
    if (to < 0) return -3;
    return *t = to;
}

/* How many plain bytes in a row state id takes whatever they are: every
 * plain byte leads to one same state, and so on from there (255: it loops;
 * inside a JSON string, or a length-bounded one's remaining count). A
 * subtree of plain bytes no deeper than that is allowed whole. */
static int plain_run(tl_matcher *m, int id, gstate *tmp, int depth) {
    if (m->ist_run[id] >= 0) return m->ist_run[id];
    m->ist_run[id] = 0; /* while computing: a cycle through here ends the run */
    int to = -2;
    for (int b = 0x20; b < 0x7F; b++) {
        if (byte_cls((uint8_t)b) != CLS_PLAIN) continue;
        const int t = trans(m, id, (uint8_t)b, tmp);
        if (t < 0 || (to != -2 && t != to)) {
            to = -1;
            break;
        }
        to = t;
    }
    int run = 0;
    if (to == id) run = 255;
    else if (to >= 0 && depth < 255) {
        const int next = plain_run(m, to, tmp, depth + 1);
        run = next >= 255 ? 255 : 1 + next;
    }
    m->ist_run[id] = (int16_t)run;
    return run;
}

/* Whether state id takes any text alike: every plain byte leads back to it,
 * and so does every character after a safe lead (inside an unbounded JSON
 * string). Then a subtree whose tokens are all text (tnode.ok) is allowed
 * whole, whatever characters they hold. */
static int text_loop(tl_matcher *m, int id, gstate *tmp) {
    if (m->ist_text[id] >= 0) return m->ist_text[id];
    m->ist_text[id] = 0;
    /* plain bytes back to this very state (a run of 255 may also mean they
     * lead to another state that loops) */
    if (m->ist[id].need || plain_run(m, id, tmp, 0) != 255 || trans(m, id, 'a', tmp) != id) return 0;
    for (int b = 0xC2; b < 0xF4; b++) {
        const int k = safe_lead((uint8_t)b);
        if (k < 0) continue;
        int at = trans(m, id, (uint8_t)b, tmp);
        for (int j = 0; j < k && at >= 0; j++) {
            if (m->ist[at].cp != CP_ANY) return 0; /* depends on which character */
            at = trans(m, at, 0x80, tmp);
        }
        if (at != id) return 0;
    }
    return m->ist_text[id] = 1;
}

static void walk_memo(tl_matcher *m, const tnode *nd, int id, int depth, uint32_t *bits) {
    const tl_vocab_trie *t = m->t;
    for (int i = 0; i < nd->n_tok; i++) {
        const int32_t tk = t->ord[nd->tok + i];
        bits[tk >> 5] |= 1u << (tk & 31);
    }
    if (!nd->n_child || depth + 1 >= m->n_lvl) return;
    gstate *tmp = &m->lvl[depth + 1];
    if ((nd->cls == CLS_PLAIN && nd->depth <= plain_run(m, id, tmp, 0)) || ((nd->ok & 1) && text_loop(m, id, tmp))) {
        for (int32_t i = nd->tok + nd->n_tok; i < nd->tok_end; i++) {
            const int32_t tk = t->ord[i];
            bits[tk >> 5] |= 1u << (tk & 31);
        }
        return;
    }
    for (int c = 0; c < nd->n_child && !m->failed; c++) {
        const tnode *ch = &t->node[nd->child + c];
        const int to = trans(m, id, ch->byte, tmp);
        if (to >= 0) walk_memo(m, ch, to, depth + 1, bits);
        else if (to == -3) walk(m, ch, depth + 1, bits); /* table full: the plain walk from tmp */
    }
}

static uint64_t state_hash(const gstate *s) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)(s->accept | s->need << 1 | s->len << 4) ^ ((uint64_t)s->cp << 8);
    for (int i = 0; i <= s->n; i++) h = (h ^ (uint64_t)s->off[i]) * 1099511628211ull;
    for (int i = 0; i < s->n_pos; i++) h = (h ^ s->pos[i]) * 1099511628211ull;
    return h;
}

/* The cache key: header (accept, need, cp, n), offsets, positions. */
static int state_key(const gstate *s, uint32_t *key) {
    int k = 0;
    key[k++] = (uint32_t)s->accept;
    key[k++] = (uint32_t)(s->need | s->len << 4);
    key[k++] = s->cp;
    key[k++] = (uint32_t)s->n;
    for (int i = 0; i <= s->n; i++) key[k++] = (uint32_t)s->off[i];
    if (s->n_pos) memcpy(key + k, s->pos, (size_t)s->n_pos * sizeof *key);
    return k + s->n_pos;
}

const uint32_t *tl_matcher_allowed(tl_matcher *m, tl_error *err) {
    gstate *s = &m->cur;
    const int kn = 5 + s->n + s->n_pos;
    if (kn > m->cap_key) {
        uint32_t *k = realloc(m->key, (size_t)kn * 2 * sizeof *k);
        if (!k) {
            tl_fail(err, TL_ERR_NOMEM, "out of memory");
            return NULL;
        }
        m->key = k;
        m->cap_key = kn * 2;
    }
    state_key(s, m->key);
    const uint64_t h = state_hash(s);
    for (int i = 0; i < CACHE_N; i++)
        if (m->cache[i].bits && m->cache[i].hash == h && m->cache[i].key_n == kn &&
            !memcmp(m->key, m->cache[i].key, (size_t)kn * sizeof *m->key)) { /* a collision never passes */
            m->cache[i].used = ++m->clock;
            return m->cache[i].bits;
        }
    /* the least recently used entry */
    int v = 0;
    for (int i = 1; i < CACHE_N; i++)
        if (m->cache[i].used < m->cache[v].used) v = i;
    if (!m->cache[v].bits) m->cache[v].bits = malloc((size_t)m->words * sizeof(uint32_t));
    uint32_t *key = realloc(m->cache[v].key, (size_t)kn * sizeof *key);
    if (!m->cache[v].bits || !key) {
        tl_fail(err, TL_ERR_NOMEM, "out of memory");
        return NULL;
    }
    memcpy(key, m->key, (size_t)kn * sizeof *key);
    m->cache[v].key = key;
    m->cache[v].key_n = kn;
    m->cache[v].hash = h;
    m->cache[v].used = ++m->clock;
    uint32_t *bits = m->cache[v].bits;
    memset(bits, 0, (size_t)m->words * sizeof *bits);
    m->failed = m->limit = 0;
    m->n_ist = 0;
    const int id0 = intern(m, s);
    if (id0 >= 0) walk_memo(m, &m->t->node[0], id0, 0, bits);
    else if (st_copy(&m->lvl[0], s)) m->failed = 1;
    else walk(m, &m->t->node[0], 0, bits);
    if (m->failed) {
        m->cache[v].key_n = -1;
        fail_status(m, err);
        return NULL;
    }
    if (s->accept && s->need == 0)
        for (int i = 0; i < m->t->n_eog; i++) bits[m->t->eog[i] >> 5] |= 1u << (m->t->eog[i] & 31);
    return bits;
}

/* ---- the matcher ---- */

void tl_matcher_free(tl_matcher *m) {
    if (!m) return;
    st_free(&m->cur);
    for (int i = 0; i < m->n_lvl; i++) st_free(&m->lvl[i]);
    free(m->lvl);
    free(m->scratch);
    free(m->key);
    free(m->trans);
    for (int i = 0; i < IST_CAP; i++) st_free(&m->ist[i]);
    for (int i = 0; i < CACHE_N; i++) {
        free(m->cache[i].key);
        free(m->cache[i].bits);
    }
    free(m);
}

int tl_matcher_reset(tl_matcher *m, tl_error *err) {
    st_clear(&m->cur);
    if (st_reserve(&m->cur, 1, 1)) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    m->failed = m->limit = 0;
    m->n_expand = 0;
    /* the start: root's alternatives */
    for (int a = m->g->rule_alt[m->g->root]; a < m->g->rule_alt[m->g->root + 1]; a++) {
        uint32_t s = (uint32_t)m->g->alt[a];
        expand(m, &m->cur, &s, 1);
    }
    if (m->failed) return fail_status(m, err);
    return TL_OK;
}

int tl_matcher_new(const tl_grammar *g, const tl_vocab_trie *t, tl_matcher **out, tl_error *err) {
    *out = NULL;
    tl_matcher *m = calloc(1, sizeof *m);
    if (!m) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    m->g = g;
    m->t = t;
    m->words = (t->n_vocab + 31) / 32;
    m->n_lvl = t->max_len + 1;
    m->lvl = calloc((size_t)m->n_lvl, sizeof *m->lvl);
    m->cap_scratch = 1 << 18;
    m->scratch = malloc((size_t)m->cap_scratch * sizeof *m->scratch);
    m->trans = malloc((size_t)IST_CAP * 256 * sizeof *m->trans);
    /* every state's offsets exist from the start: a state with no stack
     * (the output may only end) is still hashed, compared and copied */
    int lvl_ok = m->lvl != NULL;
    for (int i = 0; lvl_ok && i < m->n_lvl; i++) lvl_ok = st_reserve(&m->lvl[i], 1, 16) == 0;
    if (!m->lvl || !m->scratch || !m->trans || !lvl_ok) {
        tl_matcher_free(m);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    int rc = tl_matcher_reset(m, err);
    if (rc) {
        tl_matcher_free(m);
        return rc;
    }
    *out = m;
    return TL_OK;
}

int tl_matcher_accept_bytes(tl_matcher *m, const char *b, size_t n, tl_error *err) {
    gstate *tmp = &m->lvl[0];
    for (size_t i = 0; i < n; i++) {
        m->failed = m->limit = 0;
        int ok = advance_byte(m, &m->cur, (uint8_t)b[i], tmp);
        if (m->failed) return fail_status(m, err);
        if (!ok) return tl_fail(err, TL_ERR_ARG, "grammar: byte %zu of the text cannot continue the output", i);
        gstate x = m->cur;
        m->cur = *tmp;
        *tmp = x;
    }
    return TL_OK;
}

int tl_matcher_accept(tl_matcher *m, int32_t tok, tl_error *err) {
    if (tok < 0 || tok >= m->t->n_vocab) return tl_fail(err, TL_ERR_ARG, "grammar: token %d out of range", tok);
    for (int i = 0; i < m->t->n_eog; i++)
        if (m->t->eog[i] == tok) {
            if (!m->cur.accept || m->cur.need)
                return tl_fail(err, TL_ERR_ARG, "grammar: the output cannot end here");
            st_clear(&m->cur);
            m->cur.accept = 1;
            return TL_OK;
        }
    char buf[512];
    size_t n = tl_token_piece(m->t->model, tok, 0, buf, sizeof buf);
    if (n == 0 || n > sizeof buf) return tl_fail(err, TL_ERR_ARG, "grammar: token %d has no text", tok);
    return tl_matcher_accept_bytes(m, buf, n, err);
}

int tl_matcher_can_end(const tl_matcher *m) { return m->cur.accept && m->cur.need == 0; }

int tl_matcher_done(const tl_matcher *m) { return m->cur.n == 0 && tl_matcher_can_end(m); }
