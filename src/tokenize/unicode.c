/* unicode: llama.cpp-compatible UTF-8 decoding, GPT-2's byte table and the
 * PCRE2-based pre-tokenizer split. Owns the compiled patterns of a
 * tl_regex_split; everything else is pure functions. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenize/unicode.h"

#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "base/util.h"

size_t tl_utf8_len(unsigned char lead) {
    static const unsigned char len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[lead >> 4];
}

int tl_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    if (cp <= 0x10FFFF) {
        o[0] = (unsigned char)(0xF0 | (cp >> 18));
        o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[3] = (unsigned char)(0x80 | (cp & 0x3F));
        return 4;
    }
    return 0;
}

/* Decodes one sequence at s[0..n) by llama.cpp's rules: the lead byte fixes the
 * length, the continuation bytes must be there, and nothing else is checked
 * (overlong forms and surrogates pass). Returns the length, 0 if invalid. */
static size_t decode_lenient(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    size_t len;
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if ((c & 0xE0) == 0xC0) {
        len = 2;
        *cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        *cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        *cp = c & 0x07;
    } else {
        return 0; /* a stray continuation byte or 0xF8..0xFF */
    }
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        *cp = (*cp << 6) | (s[i] & 0x3F);
    }
    /* llama.cpp cannot re-encode these and would throw; treat as invalid */
    if (*cp > 0x10FFFF) return 0;
    return len;
}

size_t tl_utf8_normalize(const char *in, size_t n, char *out, int *has_surrogate) {
    const unsigned char *s = (const unsigned char *)in;
    size_t i = 0, o = 0;
    int sur = 0;
    while (i < n) {
        uint32_t cp;
        size_t len = decode_lenient(s + i, n - i, &cp);
        if (len == 0) {
            cp = 0xFFFD;
            len = 1;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) sur = 1;
        o += (size_t)tl_utf8_encode(cp, out + o);
        i += len;
    }
    if (has_surrogate) *has_surrogate = sur;
    return o;
}

void tl_utf8_mask_surrogates(const char *s, size_t n, char *out) {
    const unsigned char *u = (const unsigned char *)s;
    memcpy(out, s, n);
    /* in normalized text 0xED is always the lead of a 3-byte sequence */
    for (size_t i = 0; i + 2 < n; i++) {
        if (u[i] == 0xED && u[i + 1] >= 0xA0) {
            out[i] = (char)0xEE;
            out[i + 1] = (char)0x80;
            out[i + 2] = (char)0x80;
            i += 2;
        }
    }
}

/* Bytes that print as themselves: '!'..'~', 0xA1..0xAC, 0xAE..0xFF. The rest
 * are numbered from U+0100 in byte order. */
static int gpt2_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t tl_gpt2_byte_to_cp(unsigned char b) {
    if (gpt2_printable(b)) return b;
    uint32_t k = 0; /* rank among the non-printable bytes below b */
    for (unsigned x = 0; x < b; x++) k += !gpt2_printable(x);
    return 0x100 + k;
}

int tl_gpt2_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return gpt2_printable(cp) ? (int)cp : -1;
    uint32_t k = cp - 0x100;
    for (unsigned x = 0; x < 256; x++) {
        if (!gpt2_printable(x)) {
            if (k == 0) return (int)x;
            k--;
        }
    }
    return -1;
}

/* ---- the pre-tokenizer split ------------------------------------------------ */

struct tl_regex_split {
    int n;
    pcre2_code **code;
};

void tl_regex_split_free(tl_regex_split *rs) {
    if (!rs) return;
    for (int i = 0; i < rs->n; i++) pcre2_code_free(rs->code[i]);
    free(rs->code);
    free(rs);
}

int tl_regex_split_new(const char *const *patterns, int n, tl_regex_split **out, tl_error *err) {
    *out = NULL;
    tl_regex_split *rs = calloc(1, sizeof *rs);
    if (!rs || !(rs->code = calloc((size_t)(n > 0 ? n : 1), sizeof *rs->code))) {
        free(rs);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory compiling the pre-tokenizer");
    }
    for (int i = 0; i < n; i++) {
        int ec;
        PCRE2_SIZE eo;
        rs->code[i] = pcre2_compile((PCRE2_SPTR)patterns[i], PCRE2_ZERO_TERMINATED,
                                    PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
        if (!rs->code[i]) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(ec, msg, sizeof msg);
            rs->n = i;
            tl_regex_split_free(rs);
            return tl_fail(err, TL_ERR_UNSUPPORTED, "pre-tokenizer regex %d: %s at offset %zu", i,
                           (const char *)msg, (size_t)eo);
        }
        rs->n = i + 1;
        /* JIT is only a speed-up: if it is unavailable the interpreter runs */
        (void)pcre2_jit_compile(rs->code[i], PCRE2_JIT_COMPLETE);
    }
    *out = rs;
    return TL_OK;
}

typedef struct span_vec {
    tl_span *v;
    size_t n, cap;
} span_vec;

static int span_push(span_vec *sv, size_t off, size_t len) {
    if (sv->n == sv->cap) {
        size_t cap = sv->cap ? sv->cap * 2 : 64;
        tl_span *v = realloc(sv->v, cap * sizeof *v);
        if (!v) return -1;
        sv->v = v;
        sv->cap = cap;
    }
    sv->v[sv->n].off = off;
    sv->v[sv->n].len = len;
    sv->n++;
    return 0;
}

/* One match of code in subject[0..slen) from pos; the JIT's small stack can
 * run out on pathological input, then the interpreter (heap frames) retries. */
static int match_once(const pcre2_code *code, const char *subject, size_t slen, size_t pos,
                      pcre2_match_data *md) {
    int rc = pcre2_match(code, (PCRE2_SPTR)subject, slen, pos, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(code, (PCRE2_SPTR)subject, slen, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         md, NULL);
    return rc;
}

/* Splits one span by one pattern into matches and gaps, appended to out. */
static int split_span(const pcre2_code *code, pcre2_match_data *md, const char *text, tl_span s,
                      span_vec *out, tl_error *err) {
    const char *subject = text + s.off;
    size_t pos = 0, last = 0;
    while (pos < s.len) {
        int rc = match_once(code, subject, s.len, pos, md);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return tl_fail(err, TL_ERR_ARG, "pre-tokenizer match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match produces no piece: step over one character */
            pos = ms + tl_utf8_len((unsigned char)subject[ms]);
            continue;
        }
        if ((ms > last && span_push(out, s.off + last, ms - last)) ||
            span_push(out, s.off + ms, me - ms))
            return tl_fail(err, TL_ERR_NOMEM, "out of memory in the pre-tokenizer");
        last = pos = me;
    }
    if (last < s.len && span_push(out, s.off + last, s.len - last))
        return tl_fail(err, TL_ERR_NOMEM, "out of memory in the pre-tokenizer");
    return TL_OK;
}

int tl_regex_split_run(const tl_regex_split *rs, const char *text, size_t len, tl_span **spans,
                       size_t *n_spans, tl_error *err) {
    span_vec cur = {0}, next = {0};
    *spans = NULL;
    *n_spans = 0;
    if (len > 0 && span_push(&cur, 0, len)) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    int st = TL_OK;
    for (int p = 0; p < rs->n && st == TL_OK; p++) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(rs->code[p], NULL);
        if (!md) {
            st = tl_fail(err, TL_ERR_NOMEM, "out of memory in the pre-tokenizer");
            break;
        }
        next.n = 0;
        for (size_t i = 0; i < cur.n && st == TL_OK; i++)
            st = split_span(rs->code[p], md, text, cur.v[i], &next, err);
        pcre2_match_data_free(md);
        span_vec t = cur;
        cur = next;
        next = t;
    }
    free(next.v);
    if (st != TL_OK) {
        free(cur.v);
        return st;
    }
    *spans = cur.v;
    *n_spans = cur.n;
    return TL_OK;
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is not one. */
size_t tl_utf8_char(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, min = 0x10000;
    else return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

/* The bytes at s that are not a character: a lead byte and the continuation
 * bytes that could still have followed it (Unicode's "maximal subpart", as
 * Python and browsers replace them, and llama-server), else one byte. */
size_t tl_utf8_bad(const unsigned char *s, size_t n) {
    const unsigned c = s[0];
    const size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 1;
    size_t k = 1;
    for (; k < len && k < n; k++) {
        unsigned lo = 0x80, hi = 0xbf;
        if (k == 1 && c == 0xe0) lo = 0xa0;
        if (k == 1 && c == 0xed) hi = 0x9f;
        if (k == 1 && c == 0xf0) lo = 0x90;
        if (k == 1 && c == 0xf4) hi = 0x8f;
        if (s[k] < lo || s[k] > hi) break;
    }
    return k;
}
