/* detok: the streaming detokenizer of the public API. Owns nothing: the state
 * lives in the caller's tl_detok, which holds back the bytes of a UTF-8
 * character that a later token will complete. */
#include <string.h>

#include "tokenize/tokenizer.h"

/* How many bytes at the end of s[0..n) are an unfinished but so far valid
 * multi-byte sequence (0..3). Anything else, invalid bytes included, is
 * final and passes through as is. */
static size_t incomplete_tail(const unsigned char *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = s[n - k];
        if ((c & 0xC0) == 0x80) continue; /* continuation: keep looking for the lead */
        size_t need = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        return need > k ? k : 0;
    }
    return 0;
}

/* out[0..n) holds the held bytes followed by the new ones; keeps back an
 * unfinished tail, NUL-terminates and returns the bytes to emit. */
static size_t settle(tl_detok *d, char *out, size_t n) {
    size_t tail = incomplete_tail((const unsigned char *)out, n);
    memcpy(d->held, out + n - tail, tail);
    d->n_held = (int)tail;
    out[n - tail] = 0;
    return n - tail;
}

size_t tl_detok_feed_bytes(tl_detok *d, const char *piece, size_t len, char *out, size_t cap) {
    if (!d || !out || cap == 0) return 0;
    size_t h = (size_t)d->n_held;
    if (cap - 1 < h) { /* no room even for what is held: keep holding */
        out[0] = 0;
        return 0;
    }
    memcpy(out, d->held, h);
    size_t room = cap - 1 - h, n = len < room ? len : room; /* a too-small cap truncates */
    if (n) memcpy(out + h, piece, n);
    return settle(d, out, h + n);
}

void tl_detok_init(tl_detok *d, int special) {
    if (!d) return;
    memset(d, 0, sizeof *d);
    d->special = special;
}

size_t tl_detok_push(tl_detok *d, const tl_model *model, int32_t id, char *out, size_t cap) {
    if (!d || !out || cap == 0) return 0;
    size_t h = (size_t)d->n_held;
    if (cap - 1 < h) {
        out[0] = 0;
        return 0;
    }
    /* the piece goes straight after the held bytes, no second buffer */
    size_t room = cap - 1 - h;
    size_t len = tl_token_piece(model, id, d->special, out + h, room);
    memcpy(out, d->held, h);
    return settle(d, out, h + (len < room ? len : room));
}

size_t tl_detok_flush(tl_detok *d, char *out, size_t cap) {
    if (!d || !out || cap == 0) return 0;
    size_t h = (size_t)d->n_held;
    if (h > cap - 1) h = cap - 1;
    memcpy(out, d->held, h);
    out[h] = 0;
    d->n_held = 0;
    return h;
}
