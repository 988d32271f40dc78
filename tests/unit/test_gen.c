/* tl_gen, the output side of the generation loop, driven with the SmolLM2
 * tokenizer's real tokens: streamed text must add up to the detokenized text,
 * never split a UTF-8 character, cut exactly at stop strings that span token
 * boundaries, hold back (and later release) a stop string's possible start,
 * and stop on the n_predict cap and on end-of-generation tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tl_test.h"
#include "tokenloop.h"

#define DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

typedef struct text {
    char buf[8192];
    size_t len;
} text;

static void text_add(text *t, const char *p, size_t n) {
    if (t->len + n >= sizeof t->buf) n = sizeof t->buf - 1 - t->len;
    memcpy(t->buf + t->len, p, n);
    t->len += n;
    t->buf[t->len] = 0;
}

/* Whether s[0..n) is whole UTF-8: every lead byte followed by all of its
 * continuation bytes (the check a streaming client does on each chunk). */
static int whole_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        size_t need = u[i] < 0x80 ? 1 : (u[i] & 0xE0) == 0xC0 ? 2 : (u[i] & 0xF0) == 0xE0 ? 3
                    : (u[i] & 0xF8) == 0xF0 ? 4 : 0;
        if (!need || i + need > n) return 0;
        for (size_t k = 1; k < need; k++)
            if ((u[i + k] & 0xC0) != 0x80) return 0;
        i += need;
    }
    return 1;
}

typedef struct toks {
    int32_t *ids;
    size_t n;
    text full;   /* the pieces concatenated: the detokenized text */
    size_t *end; /* end[i]: byte offset in full where token i's piece ends */
} toks;

static int tokenize(const tl_model *m, const char *s, toks *t) {
    tl_error err = {0};
    memset(t, 0, sizeof *t);
    if (tl_tokenize(m, s, strlen(s), 0, &t->ids, &t->n, &err)) {
        CHECK(0, "tokenize: %s", err.msg);
        return -1;
    }
    t->end = calloc(t->n ? t->n : 1, sizeof *t->end);
    for (size_t i = 0; i < t->n; i++) {
        char piece[256];
        size_t pl = tl_token_piece(m, t->ids[i], 0, piece, sizeof piece);
        text_add(&t->full, piece, pl < sizeof piece ? pl : sizeof piece);
        t->end[i] = t->full.len;
    }
    return 0;
}

static void toks_free(toks *t) {
    tl_free(t->ids);
    free(t->end);
}

typedef struct run_out {
    text out;       /* everything emitted, flush included */
    size_t flushed; /* bytes that came from tl_gen_flush */
    int stop;       /* the push result that ended the run (TL_STOP_NONE: none did) */
    int n_pushed;
    int chunks_whole; /* every emitted chunk was whole UTF-8 */
} run_out;

/* Pushes ids[0..n) (or until a stop), checking each event, then flushes. */
static void run_gen(const tl_model *m, const tl_gen_params *gp, const int32_t *ids, size_t n,
                    run_out *r) {
    memset(r, 0, sizeof *r);
    r->chunks_whole = 1;
    tl_gen *g;
    tl_error err = {0};
    if (tl_gen_new(m, gp, &g, &err)) {
        CHECK(0, "tl_gen_new: %s", err.msg);
        return;
    }
    for (size_t i = 0; i < n && !r->stop; i++) {
        tl_gen_event ev;
        tl_token_prob chosen = {.token = ids[i], .prob = 0.5f, .logprob = -0.6931f};
        r->stop = tl_gen_push(g, ids[i], &chosen, NULL, 0, &ev);
        r->n_pushed++;
        CHECK(ev.token == ids[i] && ev.chosen.token == ids[i] && ev.chosen.prob == 0.5f,
              "event %zu carries the token", i);
        if (!whole_utf8(ev.text, ev.text_len)) r->chunks_whole = 0;
        text_add(&r->out, ev.text, ev.text_len);
    }
    CHECK(tl_gen_count(g) == r->n_pushed, "count %d vs %d pushed", tl_gen_count(g), r->n_pushed);
    const char *rest;
    r->flushed = tl_gen_flush(g, &rest);
    text_add(&r->out, rest, r->flushed);
    const char *again;
    CHECK(tl_gen_flush(g, &again) == 0, "a second flush is empty");
    tl_gen_free(g);
}

static const char *SAMPLE =
    "Hello world! Ünïcödé café, 日本語のテキスト, emoji 🦙🚀🧪 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢.\n"
    "  Indented line\twith tab; numbers 12345.678 and symbols <>&\"'.";

/* No stops, no cap: the stream adds up to the detokenized text, chunk by chunk whole. */
static void test_roundtrip(const tl_model *m) {
    toks t;
    if (tokenize(m, SAMPLE, &t)) return;
    CHECK(t.full.len == strlen(SAMPLE) && memcmp(t.full.buf, SAMPLE, t.full.len) == 0,
          "the tokenizer round-trips the sample");
    /* the sample must really exercise the hold-back: some token ends mid-character */
    int split = 0;
    for (size_t i = 0; i < t.n; i++)
        if (!whole_utf8(t.full.buf, t.end[i])) split++;
    CHECK(split > 0, "some token boundary falls inside a UTF-8 character (%d)", split);
    tl_gen_params gp = {.n_predict = -1};
    run_out r;
    run_gen(m, &gp, t.ids, t.n, &r);
    CHECK(r.stop == TL_STOP_NONE, "no stop: %d", r.stop);
    CHECK(r.out.len == t.full.len && memcmp(r.out.buf, t.full.buf, r.out.len) == 0,
          "emitted + flushed == detokenized (%zu vs %zu bytes)", r.out.len, t.full.len);
    CHECK(r.chunks_whole, "every chunk is whole UTF-8");
    CHECK(r.flushed == 0, "nothing left to flush after a complete text: %zu", r.flushed);
    toks_free(&t);
}

/* A token sequence cut after a half character: the half is never emitted
 * by push; flush hands it out as is. */
static void test_half_char_at_end(const tl_model *m) {
    toks t;
    if (tokenize(m, "🦙🧪", &t)) return;
    size_t cut = 0; /* the first token that ends mid-character */
    while (cut < t.n && whole_utf8(t.full.buf, t.end[cut])) cut++;
    CHECK(cut < t.n, "the emoji is split across tokens");
    if (cut < t.n) {
        tl_gen_params gp = {.n_predict = -1};
        run_out r;
        run_gen(m, &gp, t.ids, cut + 1, &r);
        size_t whole_part = t.end[cut];
        while (!whole_utf8(t.full.buf, whole_part)) whole_part--; /* last whole prefix */
        CHECK(r.out.len == t.end[cut] && memcmp(r.out.buf, t.full.buf, r.out.len) == 0,
              "all bytes come out in the end");
        CHECK(r.flushed == t.end[cut] - whole_part, "flush releases the %zu held bytes (got %zu)",
              t.end[cut] - whole_part, r.flushed);
    }
    toks_free(&t);
}

/* Stop strings that start and end inside tokens: cut exactly at the stop. */
static void test_stop_spanning(const tl_model *m) {
    toks t;
    if (tokenize(m, SAMPLE, &t)) return;
    int tried = 0;
    for (size_t i = 1; i + 2 < t.n && tried < 12; i++) {
        size_t b0 = t.end[i - 1], b1 = t.end[i];
        if (b1 - b0 < 2 || t.end[i + 1] - b1 < 1) continue;
        /* from the middle of token i to one byte into token i+1 */
        size_t at = b0 + 1, len = b1 - at + 1;
        char stop[64];
        if (len >= sizeof stop) continue;
        memcpy(stop, t.full.buf + at, len);
        stop[len] = 0;
        if ((size_t)(strstr(t.full.buf, stop) - t.full.buf) != at) continue; /* earlier copy */
        /* whole characters, so that the detokenizer holds nothing back */
        if (!whole_utf8(t.full.buf, at) || !whole_utf8(stop, len) || !whole_utf8(t.full.buf, t.end[i + 1]))
            continue;
        tried++;
        const char *stops[] = {"never appears here", stop};
        tl_gen_params gp = {.n_predict = -1, .stop = stops, .n_stop = 2};
        run_out r;
        run_gen(m, &gp, t.ids, t.n, &r);
        CHECK(r.stop == TL_STOP_STRING, "stop %zu found: %d", i, r.stop);
        CHECK(r.n_pushed == (int)i + 2, "stopped at the token completing it (%d vs %zu)",
              r.n_pushed, i + 2);
        CHECK(r.out.len == at && memcmp(r.out.buf, t.full.buf, at) == 0,
              "text cut exactly before the stop (%zu vs %zu bytes)", r.out.len, at);
        CHECK(r.flushed == 0, "nothing flushed after a stop string");
    }
    CHECK(tried >= 5, "enough spanning stop strings tried (%d)", tried);
    toks_free(&t);
}

/* Of several stop strings the earliest in the text wins, not the first listed. */
static void test_stop_earliest(const tl_model *m) {
    toks t;
    if (tokenize(m, "one two three four five", &t)) return;
    const char *stops[] = {"four", "two"};
    tl_gen_params gp = {.n_predict = -1, .stop = stops, .n_stop = 2};
    run_out r;
    run_gen(m, &gp, t.ids, t.n, &r);
    CHECK(r.stop == TL_STOP_STRING, "stopped");
    CHECK(r.out.len == 4 && memcmp(r.out.buf, "one ", 4) == 0, "cut before \"two\": \"%s\"", r.out.buf);
    toks_free(&t);
}

/* A stop string's possible start is held back while it could still match:
 * released by the next token once it cannot, or by flush at the end. */
static void test_hold_back(const tl_model *m) {
    toks t;
    if (tokenize(m, "The cat sat on the mat, then the dog ran to the end", &t)) return;
    const char *stops[] = {"the doge", "end of it all"};
    tl_gen_params gp = {.n_predict = -1, .stop = stops, .n_stop = 2};
    tl_gen *g;
    tl_error err = {0};
    CHECK(tl_gen_new(m, &gp, &g, &err) == 0, "new: %s", err.msg);
    text out = {0};
    int held_dog = 0;
    for (size_t i = 0; i < t.n; i++) {
        tl_gen_event ev;
        CHECK(tl_gen_push(g, t.ids[i], NULL, NULL, 0, &ev) == TL_STOP_NONE, "no stop at %zu", i);
        text_add(&out, ev.text, ev.text_len);
        /* what is not yet out must be a proper prefix of some stop string */
        const char *rest = t.full.buf + out.len;
        size_t rl = t.end[i] - out.len;
        CHECK(out.len <= t.end[i] && memcmp(out.buf, t.full.buf, out.len) == 0, "a prefix");
        int ok = rl == 0;
        for (int s = 0; s < 2; s++) ok |= rl < strlen(stops[s]) && memcmp(rest, stops[s], rl) == 0;
        CHECK(ok, "held \"%.*s\" after token %zu could start a stop", (int)rl, rest, i);
        if (rl >= 7 && memcmp(rest, "the dog", 7) == 0) held_dog = 1;
    }
    CHECK(held_dog, "\"the dog\" was held while \"the doge\" could follow");
    size_t before = out.len;
    CHECK(before == t.full.len - 3, "all but \"end\" emitted by push (%zu of %zu)", before, t.full.len);
    const char *rest;
    size_t fl = tl_gen_flush(g, &rest);
    text_add(&out, rest, fl);
    CHECK(fl == 3 && memcmp(rest, "end", 3) == 0, "flush releases \"end\"");
    CHECK(out.len == t.full.len && memcmp(out.buf, t.full.buf, out.len) == 0, "all text out");
    CHECK(tl_gen_count(g) == (int)t.n, "count");
    tl_gen_free(g);
    toks_free(&t);
}

/* The n_predict cap: the n-th push says TL_STOP_LENGTH; < 0 never does. */
static void test_n_predict(const tl_model *m) {
    toks t;
    if (tokenize(m, SAMPLE, &t)) return;
    for (int np = 1; np <= 5; np += 2) {
        tl_gen_params gp = {.n_predict = np};
        run_out r;
        run_gen(m, &gp, t.ids, t.n, &r);
        CHECK(r.stop == TL_STOP_LENGTH && r.n_pushed == np, "n_predict %d: stop %d after %d", np,
              r.stop, r.n_pushed);
        CHECK(r.out.len == t.end[np - 1] && memcmp(r.out.buf, t.full.buf, r.out.len) == 0,
              "n_predict %d: the text of %d tokens", np, np);
    }
    toks_free(&t);
}

/* End of generation: stops (its text is not emitted, held text is flushed)
 * unless ignore_eog. Pushing after a stop gives nothing more. */
static void test_eog(const tl_model *m) {
    tl_error err = {0};
    int32_t *eog = NULL;
    size_t n_eog = 0;
    CHECK(tl_tokenize(m, "<|im_end|>", 10, TL_TOK_PARSE_SPECIAL, &eog, &n_eog, &err) == 0, "%s", err.msg);
    CHECK(n_eog == 1 && tl_token_is_eog(m, eog[0]), "<|im_end|> is one EOG token");
    if (n_eog != 1) {
        tl_free(eog);
        return;
    }
    toks t;
    if (tokenize(m, "Goodbye, the do", &t)) return;
    int32_t ids[64];
    memcpy(ids, t.ids, t.n * sizeof *ids);
    ids[t.n] = eog[0];
    ids[t.n + 1] = t.ids[0];
    const char *stops[] = {"the dog"};
    tl_gen_params gp = {.n_predict = -1, .stop = stops, .n_stop = 1};
    run_out r;
    run_gen(m, &gp, ids, t.n + 2, &r);
    CHECK(r.stop == TL_STOP_EOG && r.n_pushed == (int)t.n + 1, "EOG stops: %d after %d", r.stop, r.n_pushed);
    CHECK(r.out.len == t.full.len && memcmp(r.out.buf, t.full.buf, r.out.len) == 0,
          "text before EOG, held part by flush: \"%s\"", r.out.buf);
    CHECK(r.flushed == 6, "\"the do\" came from flush (%zu)", r.flushed);

    gp.ignore_eog = 1;
    run_gen(m, &gp, ids, t.n + 2, &r);
    CHECK(r.stop == TL_STOP_NONE && r.n_pushed == (int)t.n + 2, "ignore_eog goes on: %d", r.stop);
    text want = t.full;
    text_add(&want, t.full.buf, t.end[0]);
    CHECK(r.out.len == want.len && memcmp(r.out.buf, want.buf, want.len) == 0,
          "the EOG token adds no text: \"%s\"", r.out.buf);

    /* after a stop, a push reports the stop again and emits nothing */
    tl_gen *g;
    tl_gen_params gp2 = {.n_predict = -1};
    CHECK(tl_gen_new(m, &gp2, &g, &err) == 0, "new");
    tl_gen_event ev;
    CHECK(tl_gen_push(g, eog[0], NULL, NULL, 0, &ev) == TL_STOP_EOG && ev.text_len == 0, "eog");
    CHECK(tl_gen_push(g, t.ids[0], NULL, NULL, 0, &ev) == TL_STOP_EOG && ev.text_len == 0,
          "nothing after a stop");
    CHECK(tl_gen_count(g) == 1, "the push after the stop is not counted");
    tl_gen_free(g);
    tl_free(eog);
    toks_free(&t);
}

/* The stop strings are copied: the caller's buffers may change after new. */
static void test_stop_copied(const tl_model *m) {
    toks t;
    if (tokenize(m, "alpha beta gamma", &t)) return;
    char s[16] = "beta";
    const char *stops[] = {s};
    tl_gen_params gp = {.n_predict = -1, .stop = stops, .n_stop = 1};
    tl_gen *g;
    tl_error err = {0};
    CHECK(tl_gen_new(m, &gp, &g, &err) == 0, "new");
    strcpy(s, "zzzz");
    text out = {0};
    int stop = 0;
    for (size_t i = 0; i < t.n && !stop; i++) {
        tl_gen_event ev;
        stop = tl_gen_push(g, t.ids[i], NULL, NULL, 0, &ev);
        text_add(&out, ev.text, ev.text_len);
    }
    CHECK(stop == TL_STOP_STRING && strcmp(out.buf, "alpha ") == 0, "stopped at the copy: \"%s\"", out.buf);
    tl_gen_free(g);
    toks_free(&t);
}

int main(void) {
    const char *path = getenv("TL_MODEL");
    if (!path || !*path) path = DEFAULT_MODEL;
    tl_model *m = NULL;
    tl_error err = {0};
    if (tl_model_load_vocab(path, &m, &err)) {
        CHECK(0, "model %s is needed: %s", path, err.msg);
        return tl_test_summary();
    }
    test_roundtrip(m);
    test_half_char_at_end(m);
    test_stop_spanning(m);
    test_stop_earliest(m);
    test_hold_back(m);
    test_n_predict(m);
    test_eog(m);
    test_stop_copied(m);
    tl_gen_params bad = {.n_stop = 1};
    tl_gen *g = NULL;
    CHECK(tl_gen_new(m, &bad, &g, &err) == TL_ERR_ARG && !g, "n_stop without strings is refused");
    tl_model_free(m);
    return tl_test_summary();
}
