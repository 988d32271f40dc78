/* harmony: gpt-oss's output format (OpenAI's "harmony"), read as it streams.
 * A reply is a run of messages, each a header and a body:
 *   [<|start|>assistant][ to=R]<|channel|>C[ to=R][ [<|constrain|>]json]<|message|>BODY<|end|>
 * (the first message's <|start|>assistant is the prompt's). The body ends at
 * <|end|>, <|return|> (the answer's end) or <|call|> (a call's end); the
 * last two end generation, so the text usually just stops there. Channel
 * `analysis` is reasoning, `final` the answer, a body addressed
 * to=functions.NAME a call whose body is its JSON arguments; `commentary`
 * without a recipient is text for the user (a preamble). Bodies stream out
 * as soon as no control token can be starting in them; a call goes out whole
 * at its end. Text that never becomes a header (a model that writes no
 * channels) is content. The caller's buffer grows to the longest header or
 * call, never per token. */
#include <stdlib.h>
#include <string.h>

#include "tokenloop.h"
#include "base/util.h"

/* The texts that end a body; <|start|> too: a message that never closed. */
static const char *const ENDS[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>"};
#define N_ENDS (sizeof ENDS / sizeof *ENDS)
static const char MSG[] = "<|message|>", CHANNEL[] = "<|channel|>", START[] = "<|start|>";
#define PLAIN_AFTER 256 /* header bytes without <|message|> after which a reply is plain text */

enum { ST_HEADER, ST_BODY, ST_PLAIN };

struct tl_harmony {
    int st;
    int kind;         /* the body's: TL_HARMONY_* or 0 (dropped: a recipient we do not serve) */
    int opened;       /* a message has opened: a stray header is no longer content */
    char name[72];    /* a call's function */
    char *buf;        /* ST_HEADER: the header so far; ST_BODY: the held tail, or a call's arguments */
    size_t n, cap;
};

int tl_chat_harmony(const char *tmpl) {
    return tmpl && strstr(tmpl, CHANNEL) && strstr(tmpl, MSG) && strstr(tmpl, START);
}

int tl_harmony_new(tl_harmony **out, tl_error *err) {
    *out = calloc(1, sizeof **out);
    return *out ? TL_OK : tl_fail(err, TL_ERR_NOMEM, "out of memory");
}

void tl_harmony_free(tl_harmony *h) {
    if (!h) return;
    free(h->buf);
    free(h);
}

static int add(tl_harmony *h, const char *s, size_t n) {
    if (h->n + n + 1 > h->cap) {
        size_t c = h->cap ? h->cap : 256;
        while (c < h->n + n + 1) c *= 2;
        char *b = realloc(h->buf, c);
        if (!b) return TL_ERR_NOMEM;
        h->buf = b;
        h->cap = c;
    }
    if (n) memcpy(h->buf + h->n, s, n);
    h->n += n;
    h->buf[h->n] = 0;
    return TL_OK;
}

static void drop(tl_harmony *h, size_t k) {
    memmove(h->buf, h->buf + k, h->n - k);
    h->n -= k;
}

static const char *find(const char *s, size_t n, const char *m) { return memmem(s, n, m, strlen(m)); }

/* The word after key's last occurrence in the header (up to a blank or a
 * control token): gpt-oss sometimes writes a stray channel before the real one. */
static size_t word_after(const char *hd, size_t n, const char *key, const char **w) {
    const char *k = NULL;
    for (const char *f = find(hd, n, key); f; f = find(f + 1, (size_t)(hd + n - f - 1), key)) k = f;
    if (!k) return 0;
    const char *s = k + strlen(key), *e = s;
    while (e < hd + n && *e != ' ' && *e != '\n' && *e != '\t' && *e != '<') e++;
    *w = s;
    return (size_t)(e - s);
}

/* What the header hd[0..n) makes of the body that follows. */
static void read_header(tl_harmony *h, const char *hd, size_t n) {
    const char *ch = NULL, *to = NULL;
    size_t chn = word_after(hd, n, CHANNEL, &ch), ton = word_after(hd, n, "to=", &to);
    h->name[0] = 0;
    if (ton == 9 && !memcmp(to, "assistant", 9)) ton = 0; /* to itself: no recipient */
    if (ton) {
        static const char FN[] = "functions.";
        const size_t fl = sizeof FN - 1;
        /* another recipient (a built-in tool, or assistant itself) is no call of ours */
        if (ton > fl && !memcmp(to, FN, fl) && ton - fl < sizeof h->name) {
            memcpy(h->name, to + fl, ton - fl);
            h->name[ton - fl] = 0;
            h->kind = TL_HARMONY_CALL;
        } else {
            h->kind = 0;
        }
        return;
    }
    h->kind = chn == 8 && !memcmp(ch, "analysis", 8) ? TL_HARMONY_REASONING : TL_HARMONY_CONTENT;
}

/* The body's first end in s[0..n), its index in ENDS in *which. */
static const char *body_end(const char *s, size_t n, int *which) {
    const char *best = NULL;
    for (size_t i = 0; i < N_ENDS; i++) {
        const char *e = find(s, n, ENDS[i]);
        if (e && (!best || e < best)) best = e, *which = (int)i;
    }
    return best;
}

/* How many of s[0..n)'s last bytes may be the start of a body's end. */
static size_t end_prefix(const char *s, size_t n) {
    for (size_t k = n < 9 ? n : 9; k > 0; k--)
        for (size_t i = 0; i < N_ENDS; i++)
            if (strlen(ENDS[i]) > k && !memcmp(s + n - k, ENDS[i], k)) return k;
    return 0;
}

static int out(tl_harmony *h, tl_harmony_fn fn, void *user, int kind, const char *s, size_t n) {
    if (!n && kind != TL_HARMONY_CALL) return 0;
    return kind ? fn(user, kind, kind == TL_HARMONY_CALL ? h->name : NULL, s, n) : 0;
}

/* A body's text in buf: emitted up to its end or to what may be its end's
 * start; *more: the rest of buf is the next header's. */
static int body(tl_harmony *h, int last, tl_harmony_fn fn, void *user, int *more) {
    int which = 0;
    const char *e = body_end(h->buf, h->n, &which);
    if (!e) {
        if (h->kind == TL_HARMONY_CALL && !last) return 0; /* a call goes out whole */
        const size_t keep = last ? 0 : end_prefix(h->buf, h->n);
        int rc = out(h, fn, user, h->kind, h->buf, h->n - keep);
        if (!rc) drop(h, h->n - keep);
        if (!rc && last) h->st = ST_HEADER;
        return rc;
    }
    const size_t at = (size_t)(e - h->buf);
    int rc = out(h, fn, user, h->kind, h->buf, at);
    if (rc) return rc;
    /* <|start|> opens the next header: it stays */
    drop(h, at + (strcmp(ENDS[which], START) ? strlen(ENDS[which]) : 0));
    h->st = ST_HEADER;
    *more = 1;
    return 0;
}

/* A header in buf: once whole, the body follows (*more). */
static void header(tl_harmony *h, int last, int *more) {
    const char *m = find(h->buf, h->n, MSG);
    if (m) {
        read_header(h, h->buf, (size_t)(m - h->buf));
        drop(h, (size_t)(m - h->buf) + sizeof MSG - 1);
        h->st = ST_BODY;
        h->opened = 1;
        *more = 1;
        return;
    }
    /* a reply that writes no headers is content: at its end, or once it is
     * longer than any header */
    if (!h->opened && (last || h->n > PLAIN_AFTER) && !find(h->buf, h->n, CHANNEL)) {
        h->st = ST_PLAIN;
        *more = 1;
        return;
    }
    if (last) h->n = 0; /* an unfinished header says nothing */
}

int tl_harmony_feed(tl_harmony *h, const char *text, size_t n, int last, tl_harmony_fn fn, void *user) {
    if (add(h, text, n)) return TL_ERR_NOMEM;
    for (int more = 1; more;) {
        more = 0;
        if (h->st == ST_PLAIN) {
            int rc = out(h, fn, user, TL_HARMONY_CONTENT, h->buf, h->n);
            h->n = 0;
            return rc;
        }
        if (h->st == ST_HEADER) {
            header(h, last, &more);
        } else {
            int rc = body(h, last, fn, user, &more);
            if (rc) return rc;
        }
    }
    return TL_OK;
}
