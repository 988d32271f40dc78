/* lexer.c: template text to tokens, with jinja2's whitespace rules applied
 * here, once, rather than in the evaluator: trim_blocks (the newline after a
 * block tag goes), lstrip_blocks (the indent before one goes), and the '-'
 * and '+' markers that override both. Text between tags becomes K_TEXT tokens
 * that point into the source; inside a tag come names, literals and
 * operators. String literals take Python's escapes, unknown ones kept as
 * written. */
#include <stdlib.h>
#include <string.h>

#include "chat/jinja.h"

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
    jj_sb_add(r, b, u, n);
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
        tok *nt = jj_alloc(L->r, nc * sizeof *nt);
        if (L->n) memcpy(nt, L->t, L->n * sizeof *nt);
        L->t = nt;
        L->cap = nc;
    }
    L->t[L->n++] = t;
}

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
        if (p >= L->len) jj_die(L->r, TL_ERR_FORMAT, t->pos, "unterminated string literal");
        char c = L->src[p++];
        if (c == q) break;
        if (c != '\\' || p >= L->len) {
            jj_sb_putc(L->r, &b, c);
            continue;
        }
        c = L->src[p++];
        switch (c) {
        case 'n': jj_sb_putc(L->r, &b, '\n'); break;
        case 't': jj_sb_putc(L->r, &b, '\t'); break;
        case 'r': jj_sb_putc(L->r, &b, '\r'); break;
        case '\\': case '\'': case '"': jj_sb_putc(L->r, &b, c); break;
        case '\n': break;
        case 'u': {
            unsigned cp;
            if (hex4(L->src + p, L->src + L->len, &cp))
                jj_die(L->r, TL_ERR_FORMAT, t->pos, "bad \\u escape in string literal");
            p += 4;
            put_utf8(L->r, &b, cp);
            break;
        }
        default: /* Python keeps unknown escapes as written */
            jj_sb_putc(L->r, &b, '\\');
            jj_sb_putc(L->r, &b, c);
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
        if (L->pos >= L->len) jj_die(L->r, TL_ERR_FORMAT, (int)L->pos, "unclosed tag at end of template");
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
            char *tmp = jj_alloc(L->r, n + 1);
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
            static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/",
                                        "%", "~", "(", ")", "[", "]", "{", "}", ",", ".",
                                        ":", "|", "=", "<", ">"};
            size_t i;
            for (i = 0; i < sizeof ops / sizeof ops[0]; i++)
                if (left >= strlen(ops[i]) && !memcmp(p, ops[i], strlen(ops[i]))) break;
            if (i == sizeof ops / sizeof ops[0])
                jj_die(L->r, TL_ERR_FORMAT, t.pos, "unexpected character '%c' in tag", *p);
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
    if (!q) jj_die(L->r, TL_ERR_FORMAT, (int)L->pos, "unclosed comment");
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


tok *jj_lex(R *r, const char *src, size_t len) {
    lexer L = {.r = r, .src = src, .len = len};
    lex_all(&L);
    return L.t;
}
