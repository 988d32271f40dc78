/* wpm: llama.cpp's WordPiece pre-tokenizer (wpm.h). */
#include "tokenize/wpm.h"

#include <stdlib.h>
#include <string.h>

#include "tokenize/unicode.h"

enum { F_ACCENT = 0x10, F_PUNCT = 0x20, F_SYMBOL = 0x40, F_CONTROL = 0x80, F_SPACE = 0x100 };

unsigned tl_wpm_cpt_flags(uint32_t cp) {
    if (cp >= 0x110000) return 0; /* llama.cpp: UNDEFINED, none of these */
    size_t lo = 0, hi = tl_wpm_n_flags; /* the last range starting at or before cp */
    while (hi - lo > 1) {
        const size_t mid = (lo + hi) / 2;
        if (tl_wpm_flags[mid].start <= cp) lo = mid;
        else hi = mid;
    }
    unsigned f = tl_wpm_flags[lo].flags;
    lo = 0, hi = tl_wpm_n_space;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (tl_wpm_space[mid] == cp) return f | F_SPACE;
        if (tl_wpm_space[mid] < cp) lo = mid + 1;
        else hi = mid;
    }
    return f;
}

uint32_t tl_wpm_tolower(uint32_t cp) {
    size_t lo = 0, hi = tl_wpm_n_lower;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (tl_wpm_lower[mid].from == cp) return tl_wpm_lower[mid].to;
        if (tl_wpm_lower[mid].from < cp) lo = mid + 1;
        else hi = mid;
    }
    return cp;
}

uint32_t tl_wpm_to_nfd(uint32_t cp) {
    size_t lo = 0, hi = tl_wpm_n_nfd; /* the last range starting at or before cp */
    while (hi - lo > 1) {
        const size_t mid = (lo + hi) / 2;
        if (tl_wpm_nfds[mid].first <= cp) lo = mid;
        else hi = mid;
    }
    const tl_wpm_nfd *r = &tl_wpm_nfds[lo];
    return r->first <= cp && cp <= r->last ? r->nfd : cp;
}

/* The next code point as llama.cpp's unicode_cpt_from_utf8 reads it: a
 * sequence whose continuation bytes are there is taken (overlong and
 * surrogate forms included), anything else is U+FFFD for one byte. */
static uint32_t next_cpt(const unsigned char *s, size_t n, size_t *i) {
    const unsigned char c = s[*i];
    int k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (k < 0 || *i + (size_t)k >= n + (k == 0)) {
        (*i)++;
        return 0xFFFD;
    }
    uint32_t cp = k == 0 ? c : (uint32_t)(c & (0x3F >> k));
    for (int j = 1; j <= k; j++) {
        if ((s[*i + (size_t)j] & 0xC0) != 0x80) {
            (*i)++;
            return 0xFFFD;
        }
        cp = (cp << 6) | (s[*i + (size_t)j] & 0x3F);
    }
    *i += (size_t)k + 1;
    return cp;
}

static int is_chinese(uint32_t c) {
    /* llama.cpp's list (0x2B920, not 0x2B820, as HF's Rust code has it) */
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

typedef struct words {
    char *buf;
    size_t n, cap;        /* bytes */
    size_t *start;
    size_t n_words, wcap; /* start[n_words] is the open word's start */
    int oom;
} words;

static void put(words *w, const char *s, size_t n) {
    if (w->oom) return;
    if (w->n + n > w->cap) {
        size_t cap = w->cap ? w->cap : 64;
        while (cap < w->n + n) cap *= 2;
        char *b = realloc(w->buf, cap);
        if (!b) {
            w->oom = 1;
            return;
        }
        w->buf = b, w->cap = cap;
    }
    memcpy(w->buf + w->n, s, n);
    w->n += n;
}

/* The open word: U+2581 alone while nothing has been appended to it. */
static int open_empty(const words *w) { return w->n - w->start[w->n_words] == 3; }

/* Closes the open word if it has any text, and opens the next one. */
static void finish(words *w) {
    if (w->oom || open_empty(w)) return;
    if (w->n_words + 2 > w->wcap) {
        size_t cap = w->wcap * 2;
        size_t *s = realloc(w->start, cap * sizeof *s);
        if (!s) {
            w->oom = 1;
            return;
        }
        w->start = s, w->wcap = cap;
    }
    w->start[++w->n_words] = w->n;
    put(w, "\xe2\x96\x81", 3);
}

int tl_wpm_words(const char *text, size_t len, int lowercase, int strip_accents, char **buf, size_t **start,
                 size_t *n_words) {
    words w = {0};
    w.wcap = 16;
    w.start = malloc(w.wcap * sizeof *w.start);
    if (!w.start) return -1;
    w.start[0] = 0;
    put(&w, "\xe2\x96\x81", 3);
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len && !w.oom;) {
        uint32_t cp = next_cpt(s, len, &i);
        if (strip_accents) cp = tl_wpm_to_nfd(cp);
        const unsigned f = tl_wpm_cpt_flags(cp);
        if (f & F_SPACE) {
            finish(&w);
            continue;
        }
        /* code points past U+10FFFF: llama.cpp cannot write them back (it throws) */
        if (cp == 0 || cp == 0xFFFD || cp >= 0x110000 || (f & F_CONTROL) || (strip_accents && (f & F_ACCENT)))
            continue;
        char u[4];
        const int n = tl_utf8_encode(lowercase ? tl_wpm_tolower(cp) : cp, u);
        if ((f & F_PUNCT) || (cp < 0x7F && (f & F_SYMBOL)) || is_chinese(cp)) {
            finish(&w);
            put(&w, u, (size_t)n);
            finish(&w);
        } else {
            put(&w, u, (size_t)n);
        }
    }
    if (!w.oom && !open_empty(&w)) finish(&w); /* the last word closed; the empty one after it dropped */
    if (w.oom) {
        free(w.buf);
        free(w.start);
        return -1;
    }
    w.n -= 3; /* the open, empty word */
    *buf = w.buf;
    *start = w.start;
    *n_words = w.n_words;
    return 0;
}
