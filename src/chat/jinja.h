/* jinja.h: what the files of the chat interpreter share (src/chat/, see
 * template.c): the render state, values, tokens, the tree and scopes, and the
 * jj_ functions one file offers another. Not a public header: only the files
 * of src/chat/ include it; the library's users see chat.h and tokenloop.h.
 *
 * Two rules hold everywhere behind it. Every allocation of one compile or
 * one render comes from that R's arena (jj_alloc), freed as a whole at the
 * end, so nothing is freed one by one. Every failure is jj_die, which records
 * the message in R's tl_error and longjmps to the entry point that called
 * setjmp (template.c), so no caller checks a status and nothing leaks. */
#ifndef TL_CHAT_JINJA_H
#define TL_CHAT_JINJA_H

#include <setjmp.h>
#include <stddef.h>
#include <string.h>

#include "tokenloop.h"

#define MAX_DEPTH 200 /* parser, messages and macro recursion */

/* ---- render state: the arena and the way out --------------------------------- */

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
    int vdepth; /* lists and dicts open while printing one (JJ_MAX_NEST) */
    scope *root;
};

/* How deep printing, tojson and == follow lists and dicts: a value that
 * contains itself (a namespace set into itself) or one nested in a loop would
 * recurse without end or past the stack. */
#define JJ_MAX_NEST 256

/* Fails the render: message prefixed with the template position if pos >= 0. */
_Noreturn __attribute__((format(printf, 4, 5))) void jj_die(R *r, int status, int pos, const char *fmt,
                                                               ...);
void *jj_alloc(R *r, size_t n); /* zeroed, 16-aligned, from the arena */
char *jj_strdup(R *r, const char *s, size_t n);
void jj_arena_free(R *r);

/* ---- values ---------------------------------------------------------------------- */

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

/* Keys keep their insertion order, as Python's dicts do: templates and
 * tojson print them in it. */
struct vdict {
    const char **k;
    size_t *kn;
    val *v;
    size_t n, cap;
};

static inline val v_undef(const char *name) { val v = {.t = T_UNDEF}; v.undef_name = name; return v; }
static inline val v_none(void) { val v = {.t = T_NONE}; return v; }
static inline val v_bool(int b) { val v = {.t = T_BOOL}; v.u.b = !!b; return v; }
static inline val v_int(long long i) { val v = {.t = T_INT}; v.u.i = i; return v; }
static inline val v_float(double f) { val v = {.t = T_FLOAT}; v.u.f = f; return v; }
static inline val v_str(const char *s, size_t n) { val v = {.t = T_STR}; v.u.s.s = s; v.u.s.n = n; return v; }
static inline val v_cstr(const char *s) { return v_str(s, strlen(s)); }
static inline val v_list(vlist *l) { val v = {.t = T_LIST}; v.u.l = l; return v; }
static inline val v_dict(vdict *d) { val v = {.t = T_DICT}; v.u.d = d; return v; }

static inline int is_num(val v) { return v.t == T_INT || v.t == T_FLOAT || v.t == T_BOOL; }
static inline double num_f(val v) {
    return v.t == T_FLOAT ? v.u.f : v.t == T_INT ? (double)v.u.i : (double)v.u.b;
}
static inline long long num_i(val v) { return v.t == T_INT ? v.u.i : v.t == T_BOOL ? v.u.b : (long long)v.u.f; }
static inline int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

vlist *jj_list_new(R *r);
void jj_list_push(R *r, vlist *l, val x);
vdict *jj_dict_new(R *r);
val *jj_dict_find(const vdict *d, const char *k, size_t kn);
void jj_dict_set(R *r, vdict *d, const char *k, size_t kn, val x); /* replaces in place */

/* A growable string in the arena (old buffers are simply abandoned). */
typedef struct sb {
    char *s;
    size_t n, cap;
} sb;

void jj_sb_add(R *r, sb *b, const char *s, size_t n);
void jj_sb_puts(R *r, sb *b, const char *s);
void jj_sb_putc(R *r, sb *b, char c);
static inline val sb_val(sb *b) { return v_str(b->s ? b->s : "", b->n); }

/* Python's semantics of values, as templates see them. */
int jj_truthy(val v);
const char *jj_type_name(val v);
void jj_to_str(R *r, sb *b, val v); /* str(), as {{ }} prints */
val jj_str_of(R *r, val v);
void jj_tojson(R *r, sb *b, val v, int indent, int level, int sort, int pos);
int jj_val_eq(val a, val b);
int jj_val_cmp(R *r, int pos, val a, val b);
size_t *jj_cp_offsets(R *r, val s, size_t *ncp);
size_t jj_val_len(R *r, int pos, val v);
vlist *jj_iter_list(R *r, int pos, val v);
int jj_contains(R *r, int pos, val hay, val needle);
_Noreturn void jj_undef_err(R *r, int pos, val v);

/* ---- tokens (lexer.c) ------------------------------------------------------------- */

enum { K_TEXT, K_VAR_BEGIN, K_VAR_END, K_BLOCK_BEGIN, K_BLOCK_END, K_NAME, K_STR, K_INT,
       K_FLOAT, K_OP, K_EOF };

typedef struct tok {
    int k, pos;
    const char *s; /* text, name, string value or operator */
    size_t n;
    long long i;
    double f;
} tok;

/* The tokens of a normalized template source, ending with K_EOF. */
tok *jj_lex(R *r, const char *src, size_t len);

/* ---- the tree (parser.c) ------------------------------------------------------------ */

enum {
    /* statements */
    N_BODY, N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE,
    /* expressions */
    N_LIT, N_NAME, N_ATTR, N_INDEX, N_SLICE, N_CALL, N_FILTER, N_TEST, N_BIN, N_CMP, N_NOT,
    N_NEG, N_AND, N_OR, N_COND, N_LIST, N_TUPLE, N_DICT
};

enum { OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
       OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

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

/* The whole template as one N_BODY. */
node *jj_parse(R *r, tok *t);

/* ---- evaluation (eval.c) and the library of names (filters.c) ---------------------- */

struct scope {
    scope *parent;
    vdict vars;
};

enum { F_RANGE, F_NAMESPACE, F_RAISE, F_STRFTIME, F_DICT }; /* the builtin functions */

typedef struct args {
    val *v;
    const char **kw; /* kw[i] NULL for positional */
    int n, npos;
} args;

scope *jj_scope_new(R *r, scope *parent);
void jj_scope_set(R *r, scope *s, const char *name, val v);
val jj_eval(R *r, scope *s, const node *n);
int jj_exec(R *r, scope *s, const node *n, sb *out); /* 1 on break, 2 on continue */
val jj_arg(const args *a, int i, const char *name, val def);
val jj_get_item(R *r, int pos, val obj, val key);
val jj_get_slice(R *r, int pos, val obj, val vs, val ve, val vst);

int jj_is_method(val self, const char *name);
val jj_call_method(R *r, int pos, val self, const char *name, const args *a);
val jj_call_builtin(R *r, int pos, int fn, const args *a);
int jj_apply_test(R *r, int pos, const char *name, val x, const args *a);
val jj_apply_filter(R *r, int pos, const char *name, val x, const args *a);

#endif
