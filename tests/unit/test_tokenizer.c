/* Tests the tokenizer against references: the Hugging Face tokenizations in
 * ../shared/vocab (*.gguf.inp/.out), llama.cpp's in tests/oracle/fixtures
 * (tokenizer*.json, invalid UTF-8 included) and HF's for SmolLM2 made by
 * tests/oracle/hf_tokenize.py; plus round trips, special tokens, pieces, the
 * streaming detokenizer, load errors and speed. Run from the repo root. */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load/gguf.h"
#include "tl_test.h"
#include "tokenize/tokenizer.h"
#include "base/util.h"

/* The shared vocabularies: $TL_VOCAB_DIR (tests/run.sh sets it), else ../shared/vocab. */
static const char *vocab_dir(void) {
    const char *dir = getenv("TL_VOCAB_DIR");
    return dir && *dir ? dir : "../shared/vocab";
}

static const char *vocab_path(const char *file) {
    static char bufs[4][1024];
    static int next;
    char *b = bufs[next++ & 3];
    snprintf(b, sizeof bufs[0], "%s/%s", vocab_dir(), file);
    return b;
}
#define SMOLLM "models/SmolLM2-135M-Instruct.Q4_1.gguf"

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

typedef struct loaded {
    tl_gguf *g;
    tl_tokenizer *t;
} loaded;

static int load(const char *path, loaded *l) {
    tl_error err = {0};
    l->g = NULL;
    l->t = NULL;
    if (tl_gguf_open(path, &l->g, &err) != TL_OK) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        return -1;
    }
    if (tl_tokenizer_load(l->g, &l->t, &err) != TL_OK) {
        fprintf(stderr, "%s: %s\n", path, err.msg);
        tl_gguf_close(l->g);
        l->g = NULL;
        return -1;
    }
    return 0;
}

static void unload(loaded *l) {
    tl_tokenizer_free(l->t);
    tl_gguf_close(l->g);
}

static int encode(const tl_tokenizer *t, const char *s, size_t n, int flags, int32_t **ids,
                  size_t *nids) {
    tl_error err = {0};
    int st = tl_tokenizer_encode(t, s, n, flags, ids, nids, &err);
    if (st != TL_OK) fprintf(stderr, "encode: %s\n", err.msg);
    return st;
}

static int same_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (na == 0 || memcmp(a, b, na * sizeof *a) == 0);
}

static void print_ids(const char *what, const int32_t *v, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", v[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* Parses whitespace-separated ints from s up to end (or ']'). */
static size_t parse_ints(const char *s, const char *end, int32_t *out, size_t cap) {
    size_t n = 0;
    while (s < end && *s != ']') {
        char *e;
        long v = strtol(s, &e, 10);
        if (e == s) {
            s++;
            continue;
        }
        if (n < cap) out[n] = (int32_t)v;
        n++;
        s = e;
    }
    return n;
}

/* ---- ../shared/vocab fixtures (HF tokenizers, add_special_tokens=False) ---- */

static void check_vocab_fixture(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", vocab_dir(), name);
    loaded l;
    if (load(path, &l)) {
        CHECK(0, "loading %s", path);
        return;
    }
    size_t ni, no;
    char pin[600], pout[600];
    snprintf(pin, sizeof pin, "%s.inp", path);
    snprintf(pout, sizeof pout, "%s.out", path);
    char *inp = read_file(pin, &ni), *out = read_file(pout, &no);
    CHECK(inp && out, "reading fixtures of %s", name);
    if (!inp || !out) goto done;
    static const char sep[] = "\n__ggml_vocab_test__\n";
    const char *p = inp, *o = out;
    int pass = 0, total = 0;
    int32_t *want = malloc(65536 * sizeof *want);
    while (want && p < inp + ni) {
        const char *e = strstr(p, sep);
        if (!e) break;
        const char *nl = strchr(o, '\n');
        if (!nl) nl = out + no;
        size_t nw = parse_ints(o, nl, want, 65536);
        int32_t *ids = NULL;
        size_t nids = 0;
        int ok = encode(l.t, p, (size_t)(e - p), 0, &ids, &nids) == TL_OK &&
                 same_ids(ids, nids, want, nw);
        total++;
        pass += ok;
        if (!ok) {
            fprintf(stderr, "%s: mismatch on \"%.*s\"\n", name, (int)(e - p < 60 ? e - p : 60), p);
            print_ids("want", want, nw);
            print_ids("got ", ids, nids);
        }
        free(ids);
        p = e + strlen(sep);
        o = nl + (nl < out + no);
    }
    free(want);
    printf("vocab %-16s %d/%d match\n", name, pass, total);
    CHECK(total > 0 && pass == total, "%s: %d/%d fixture strings match", name, pass, total);
done:
    free(inp);
    free(out);
    unload(&l);
}

/* TL_TOK_ADD_SPECIAL: the vocabulary's own markers (llama.cpp's
 * add_special): BOS where the file adds it (llama-spm), none where it does
 * not (gpt-2); EOS where add_eos_token says
 * so, which the vocabularies here leave off. */
static void check_add_special(void) {
    static const struct {
        const char *file;
        int want_bos;
    } v[] = {{"ggml-vocab-llama-spm.gguf", 1}, {"ggml-vocab-gpt-2.gguf", 0}, {"ggml-vocab-phi-3.gguf", 1}};
    for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
        loaded l;
        if (load(vocab_path(v[i].file), &l)) {
            CHECK(0, "loading %s", v[i].file);
            continue;
        }
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        const char *s = "Hello world";
        int ok = !encode(l.t, s, strlen(s), TL_TOK_ADD_SPECIAL, &a, &na) &&
                 !encode(l.t, s, strlen(s), v[i].want_bos ? TL_TOK_ADD_BOS : 0, &b, &nb);
        CHECK(ok && same_ids(a, na, b, nb) && (v[i].want_bos ? na > 0 && a[0] == tl_tokenizer_bos(l.t) : 1),
              "%s: add_special gives %s", v[i].file, v[i].want_bos ? "the BOS add_bos does" : "no BOS");
        free(a);
        free(b);
        unload(&l);
    }
}

/* ---- llama.cpp oracle fixtures (tests/oracle/fixtures/tokenizer*.json) ---- */

static size_t parse_hex(const char *s, char *out) {
    size_t n = 0;
    while (isxdigit((unsigned char)s[0]) && isxdigit((unsigned char)s[1])) {
        unsigned v;
        if (sscanf(s, "%2x", &v) != 1) break;
        out[n++] = (char)v;
        s += 2;
    }
    return n;
}

static int check_oracle_item(const tl_tokenizer *t, const char *label, const char *text, size_t n,
                             const char *field, int flags) {
    int32_t want[8192];
    const char *f = strstr(field, "[");
    const char *end = f ? strchr(f, ']') : NULL;
    if (!end) return 0;
    size_t nw = parse_ints(f + 1, end, want, 8192);
    int32_t *ids = NULL;
    size_t nids = 0;
    int ok = nw <= 8192 && encode(t, text, n, flags, &ids, &nids) == TL_OK &&
             same_ids(ids, nids, want, nw);
    if (!ok) {
        fprintf(stderr, "oracle %s (flags %d) mismatch, %zu bytes\n", label, flags, n);
        print_ids("want", want, nw < 8192 ? nw : 8192);
        print_ids("got ", ids, nids);
    }
    free(ids);
    return ok;
}

static void check_oracle_json(const char *json_path, const char *model_path) {
    size_t nj;
    char *js = read_file(json_path, &nj);
    loaded l;
    CHECK(js != NULL, "reading %s", json_path);
    if (!js) return;
    if (load(model_path, &l)) {
        CHECK(0, "loading %s", model_path);
        free(js);
        return;
    }
    int pass = 0, total = 0;
    char *text = malloc(nj / 2 + 1);
    for (const char *p = strstr(js, "\"label\""); p && text; p = strstr(p + 1, "\"label\"")) {
        char label[64] = "";
        sscanf(p, "\"label\":\"%63[^\"]", label);
        const char *h = strstr(p, "\"hex\":\"");
        const char *sp = strstr(p, "\"ids_special\"");
        const char *pl = strstr(p, "\"ids_plain\"");
        if (!h || !sp || !pl) break;
        size_t n = parse_hex(h + 7, text);
        pass += check_oracle_item(l.t, label, text, n, sp, TL_TOK_PARSE_SPECIAL);
        pass += check_oracle_item(l.t, label, text, n, pl, 0);
        total += 2;
    }
    free(text);
    printf("oracle %-28s %d/%d match\n", strrchr(json_path, '/') + 1, pass, total);
    CHECK(total > 0 && pass == total, "%s: %d/%d match", json_path, pass, total);
    unload(&l);
    free(js);
}

/* ---- HF reference for SmolLM2 (tests/oracle/hf_tokenize.py) ---- */

static void check_hf_smollm(const tl_tokenizer *t) {
    size_t n;
    char *s = read_file("tests/oracle/fixtures/hf_smollm2.txt", &n);
    CHECK(s != NULL, "reading tests/oracle/fixtures/hf_smollm2.txt (run tests/oracle/hf_tokenize.py)");
    if (!s) return;
    int pass = 0, total = 0;
    /* lines: "<hex of text>\t<ids>" */
    for (char *line = s; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        char *tab = strchr(line, '\t');
        if (tab) {
            char *text = malloc(strlen(line) / 2 + 1);
            int32_t want[4096];
            size_t nt = text ? parse_hex(line, text) : 0;
            size_t nw = parse_ints(tab + 1, tab + strlen(tab), want, 4096);
            int32_t *ids = NULL;
            size_t nids = 0;
            int ok = text && encode(t, text, nt, TL_TOK_PARSE_SPECIAL, &ids, &nids) == TL_OK &&
                     same_ids(ids, nids, want, nw);
            if (!ok) {
                fprintf(stderr, "hf smollm2 mismatch on \"%.*s\"\n", (int)(nt < 60 ? nt : 60), text);
                print_ids("want", want, nw);
                print_ids("got ", ids, nids);
            }
            pass += ok;
            total++;
            free(ids);
            free(text);
        }
        line = nl ? nl + 1 : NULL;
    }
    free(s);
    printf("hf smollm2 %d/%d match\n", pass, total);
    CHECK(total > 0 && pass == total, "hf smollm2: %d/%d", pass, total);
}

/* ---- SmolLM2: special tokens, pieces, EOG ---- */

static void check_smollm_specials(const tl_tokenizer *t) {
    int32_t *ids = NULL;
    size_t n = 0;
    const char *s = "<|im_start|>user\nhi<|im_end|>";
    CHECK(encode(t, s, strlen(s), TL_TOK_PARSE_SPECIAL, &ids, &n) == TL_OK && n >= 2 && ids[0] == 1 &&
              ids[n - 1] == 2,
          "parse_special turns <|im_start|>/<|im_end|> into ids 1/2");
    free(ids);
    CHECK(encode(t, s, strlen(s), 0, &ids, &n) == TL_OK && n > 5, "plain text tokenizes");
    int has_special = 0;
    for (size_t i = 0; i < n; i++) has_special |= ids[i] == 1 || ids[i] == 2;
    CHECK(!has_special, "without parse_special no special id appears");
    free(ids);
    CHECK(encode(t, "hi", 2, TL_TOK_ADD_BOS, &ids, &n) == TL_OK && n >= 1 && ids[0] == tl_tokenizer_bos(t),
          "TL_TOK_ADD_BOS prepends BOS");
    free(ids);
    CHECK(strcmp(tl_tokenizer_model_name(t), "gpt2") == 0, "model name");
    CHECK(strcmp(tl_tokenizer_pre_name(t), "smollm") == 0, "pre name");
    CHECK(tl_tokenizer_add_bos(t) == 0, "SmolLM2 metadata says no BOS");
    CHECK(tl_tokenizer_is_eog(t, 2) && tl_tokenizer_is_eog(t, 0), "<|im_end|> and <|endoftext|> are EOG");
    CHECK(!tl_tokenizer_is_eog(t, 1) && !tl_tokenizer_is_eog(t, 905), "<|im_start|>, ' world' are not EOG");
    CHECK(tl_tokenizer_is_control(t, 1), "<|im_start|> is control");
    char buf[64];
    CHECK(tl_tokenizer_piece(t, 1, 0, buf, sizeof buf) == 0, "control piece is empty unless special");
    size_t k = tl_tokenizer_piece(t, 1, 1, buf, sizeof buf);
    CHECK(k == 12 && memcmp(buf, "<|im_start|>", 12) == 0, "control piece with special");
    k = tl_tokenizer_piece(t, 905, 0, buf, sizeof buf);
    CHECK(k == 6 && memcmp(buf, " world", 6) == 0, "piece of ' world' (%zu)", k);
    k = tl_tokenizer_piece(t, 905, 0, buf, 3);
    CHECK(k == 6 && memcmp(buf, " wo", 3) == 0, "a short buffer gets a prefix and the full length");
    CHECK(tl_tokenizer_piece(t, -1, 1, buf, sizeof buf) == 0 &&
              tl_tokenizer_piece(t, tl_tokenizer_n_vocab(t), 1, buf, sizeof buf) == 0,
          "out-of-range ids give nothing");
    CHECK(strcmp(tl_tokenizer_text(t, 1), "<|im_start|>") == 0, "token text");
}

/* ---- round trips and speed ---- */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* A random valid UTF-8 string mixing ASCII, spaces, digits, accents, CJK,
 * emoji. Only bytes every tested vocab can spell: some byte-level vocabs lack
 * the symbols of rare control bytes and of lead bytes 0xF1..0xF4, which
 * llama.cpp (and so we) then drop. */
static size_t random_utf8(uint64_t *rng, char *out, size_t max_chars) {
    static const uint32_t ranges[][2] = {{0x20, 0x7E}, {0x20, 0x20},   {0x30, 0x39},
                                         {0x09, 0x0A}, {0xA0, 0x24F},  {0x370, 0x52F},
                                         {0x4E00, 0x9FFF}, {0x1F300, 0x1FAFF}, {0xAC00, 0xD7A3},
                                         {0x2000, 0x206F}, {0x10000, 0x3FFFF}};
    size_t n = 0, nc = rng_next(rng) % max_chars;
    for (size_t i = 0; i < nc; i++) {
        const uint32_t *r = ranges[rng_next(rng) % (sizeof ranges / sizeof ranges[0])];
        uint32_t cp = r[0] + (uint32_t)(rng_next(rng) % (r[1] - r[0] + 1));
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
        char *o = out + n;
        if (cp < 0x80) {
            o[0] = (char)cp;
            n += 1;
        } else if (cp < 0x800) {
            o[0] = (char)(0xC0 | (cp >> 6));
            o[1] = (char)(0x80 | (cp & 0x3F));
            n += 2;
        } else if (cp < 0x10000) {
            o[0] = (char)(0xE0 | (cp >> 12));
            o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
            o[2] = (char)(0x80 | (cp & 0x3F));
            n += 3;
        } else {
            o[0] = (char)(0xF0 | (cp >> 18));
            o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
            o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
            o[3] = (char)(0x80 | (cp & 0x3F));
            n += 4;
        }
    }
    return n;
}

static size_t detok_all(const tl_tokenizer *t, const int32_t *ids, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = tl_tokenizer_piece(t, ids[i], 1, k < cap ? out + k : NULL, k < cap ? cap - k : 0);
        k += len;
    }
    return k;
}

static void check_round_trip(const char *name, const tl_tokenizer *t, uint64_t seed, int count) {
    char text[2048], back[8192];
    int pass = 0;
    uint64_t rng = seed;
    for (int i = 0; i < count; i++) {
        size_t n = random_utf8(&rng, text, 400);
        int32_t *ids = NULL;
        size_t nids = 0;
        int ok = encode(t, text, n, 0, &ids, &nids) == TL_OK;
        size_t m = ok ? detok_all(t, ids, nids, back, sizeof back) : 0;
        ok = ok && m == n && memcmp(back, text, n) == 0;
        if (!ok && pass == i) fprintf(stderr, "%s: round trip %d fails (%zu -> %zu bytes)\n", name, i, n, m);
        pass += ok;
        free(ids);
    }
    printf("round trip %-16s %d/%d\n", name, pass, count);
    CHECK(pass == count, "%s: %d/%d random strings round-trip", name, pass, count);
}

/* SentencePiece vocabs: detokenizing gives the text back, after the space
 * prefix when the vocab adds one (every byte has a <0xXX> token). */
static void check_spm_round_trip(const char *path, const char *name, int space_prefix, int count) {
    loaded l;
    if (load(path, &l)) {
        CHECK(0, "loading %s", path);
        return;
    }
    char text[2048], want[2100], back[8192];
    int pass = 0;
    uint64_t rng = 99;
    for (int i = 0; i < count; i++) {
        size_t n = random_utf8(&rng, text, 300);
        size_t nw = 0;
        if (space_prefix) want[nw++] = ' ';
        memcpy(want + nw, text, n);
        nw += n;
        int32_t *ids = NULL;
        size_t nids = 0;
        int ok = encode(l.t, text, n, 0, &ids, &nids) == TL_OK;
        size_t m = ok ? detok_all(l.t, ids, nids, back, sizeof back) : 0;
        ok = ok && m == nw && memcmp(back, want, nw) == 0;
        if (!ok && pass == i) fprintf(stderr, "%s: round trip %d fails (%zu -> %zu bytes)\n", name, i, n, m);
        pass += ok;
        free(ids);
    }
    printf("round trip %-16s %d/%d\n", name, pass, count);
    CHECK(pass == count, "%s: %d/%d random strings round-trip", name, pass, count);
    unload(&l);
}

static void check_gemma(void) {
    loaded l;
    if (load("models/gemma-3-270m-q4_k_m.gguf", &l)) {
        CHECK(0, "loading gemma 3");
        return;
    }
    const tl_tokenizer *t = l.t;
    CHECK(strcmp(tl_tokenizer_model_name(t), "llama") == 0, "gemma is SentencePiece-style");
    CHECK(tl_tokenizer_bos(t) == 2 && tl_tokenizer_eos(t) == 1 && tl_tokenizer_add_bos(t), "gemma bos/eos");
    const char *s = "<start_of_turn>user\nHi<end_of_turn>\n";
    int32_t *ids = NULL;
    size_t n = 0;
    int ok = encode(t, s, strlen(s), TL_TOK_PARSE_SPECIAL | TL_TOK_ADD_BOS, &ids, &n) == TL_OK && n >= 4;
    CHECK(ok && ids[0] == 2, "gemma: BOS first");
    CHECK(ok && strcmp(tl_tokenizer_text(t, ids[1]), "<start_of_turn>") == 0, "gemma: <start_of_turn> parsed");
    int eot_seen = 0;
    for (size_t i = 0; ok && i < n; i++) eot_seen |= tl_tokenizer_is_eog(t, ids[i]);
    CHECK(eot_seen, "gemma: <end_of_turn> is an end of generation");
    CHECK(tl_tokenizer_is_eog(t, 1), "gemma: <eos> is EOG");
    free(ids);
    unload(&l);
    check_spm_round_trip("models/gemma-3-270m-q4_k_m.gguf", "gemma-3", 0, 100);
}

static void check_speed(const char *name, const tl_tokenizer *t) {
    size_t n = 1 << 20, k = 0;
    char *text = malloc(n);
    uint64_t rng = 42;
    static const char *const words[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ",
                                        "dog. ", "12345 ", "\n", "  ", "naïve ", "日本語 ", "😀 ", "(x) "};
    while (text && k < n) {
        const char *w = words[rng_next(&rng) % (sizeof words / sizeof words[0])];
        size_t l = strlen(w);
        if (k + l > n) l = n - k;
        memcpy(text + k, w, l);
        k += l;
    }
    int32_t *ids = NULL;
    size_t nids = 0;
    double t0 = tl_now();
    int st = text ? encode(t, text, n, TL_TOK_PARSE_SPECIAL, &ids, &nids) : -1;
    double dt = tl_now() - t0;
    printf("speed %-16s 1 MiB -> %zu tokens in %.3f s\n", name, nids, dt);
    CHECK(st == TL_OK && nids > 100000, "%s: tokenizes 1 MiB", name);
    free(ids);
    free(text);
}

/* ---- the streaming detokenizer's byte logic ---- */

static void check_detok(void) {
    tl_detok d;
    char out[64];
    char all[256];
    size_t n_all = 0;
    const char emoji[] = "\xf0\x9f\x98\x80"; /* 😀 */
    /* every split of the emoji into up to 4 pushes emits it whole, once */
    for (int mask = 0; mask < 8; mask++) {
        tl_detok_init(&d, 0);
        n_all = 0;
        size_t start = 0;
        for (size_t i = 1; i <= 4; i++) {
            if (i < 4 && !(mask & (1 << (i - 1)))) continue;
            size_t k = tl_detok_feed_bytes(&d, emoji + start, i - start, out, sizeof out);
            CHECK(k == 0 || k == 4, "emoji split %d: no partial character emitted (%zu)", mask, k);
            CHECK(strlen(out) == k, "output is NUL-terminated");
            memcpy(all + n_all, out, k);
            n_all += k;
            start = i;
        }
        n_all += tl_detok_flush(&d, all + n_all, sizeof all - n_all);
        CHECK(n_all == 4 && memcmp(all, emoji, 4) == 0, "emoji split %d reassembles", mask);
    }
    /* text then a split 3-byte char: "ab" + "\xe6\x97" -> "ab", then "\xa5c" -> "日c" */
    tl_detok_init(&d, 0);
    size_t k = tl_detok_feed_bytes(&d, "ab\xe6\x97", 4, out, sizeof out);
    CHECK(k == 2 && memcmp(out, "ab", 2) == 0 && d.n_held == 2, "holds the unfinished char");
    k = tl_detok_feed_bytes(&d, "\xa5" "c", 2, out, sizeof out);
    CHECK(k == 4 && memcmp(out, "\xe6\x97\xa5" "c", 4) == 0 && d.n_held == 0, "completes it");
    /* invalid bytes pass through; a held lead that never completes comes out as is */
    k = tl_detok_feed_bytes(&d, "\xff\x80z", 3, out, sizeof out);
    CHECK(k == 3 && memcmp(out, "\xff\x80z", 3) == 0, "invalid bytes are not held");
    k = tl_detok_feed_bytes(&d, "\xc3", 1, out, sizeof out);
    CHECK(k == 0 && d.n_held == 1, "lone lead byte held");
    k = tl_detok_feed_bytes(&d, "x", 1, out, sizeof out);
    CHECK(k == 2 && memcmp(out, "\xc3x", 2) == 0, "broken sequence released as is");
    k = tl_detok_feed_bytes(&d, "\xf0\x9f", 2, out, sizeof out);
    k = tl_detok_flush(&d, out, sizeof out);
    CHECK(k == 2 && memcmp(out, "\xf0\x9f", 2) == 0 && d.n_held == 0, "flush emits what is held");
    CHECK(tl_detok_flush(&d, out, sizeof out) == 0, "second flush is empty");
    /* a cap too small truncates but never overflows */
    tl_detok_init(&d, 0);
    k = tl_detok_feed_bytes(&d, "abcdef", 6, out, 4);
    CHECK(k == 3 && memcmp(out, "abc", 4) == 0, "truncated to cap-1 and terminated");
}

/* The public streaming path: tl_tokenize, then tl_detok_push token by token
 * never emits a partial character and reproduces the text. */
static void check_detok_public(void) {
    tl_model *m = NULL;
    tl_error err = {0};
    if (tl_model_load_vocab(vocab_path("ggml-vocab-gpt-2.gguf"), &m, &err) != TL_OK) {
        CHECK(0, "tl_model_load_vocab: %s", err.msg);
        return;
    }
    const char *s = "emoji \xf0\x9f\xa6\x99 and \xe6\x97\xa5\xe6\x9c\xac, caf\xc3\xa9 \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9";
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(tl_tokenize(m, s, strlen(s), 0, &ids, &n, &err) == TL_OK, "tl_tokenize: %s", err.msg);
    tl_detok d;
    tl_detok_init(&d, 0);
    char all[256], out[64];
    size_t k = 0;
    int partial = 0;
    for (size_t i = 0; i < n; i++) {
        size_t m2 = tl_detok_push(&d, m, ids[i], out, sizeof out);
        /* each emitted chunk ends on a character boundary */
        partial |= m2 > 0 && (unsigned char)out[m2 - 1] >= 0xC0;
        if (k + m2 < sizeof all) memcpy(all + k, out, m2);
        k += m2;
    }
    k += tl_detok_flush(&d, all + k, sizeof all - k);
    CHECK(!partial, "tl_detok_push never ends a chunk inside a character");
    CHECK(k == strlen(s) && memcmp(all, s, k) == 0, "tl_detok_push reproduces the text (%zu bytes)", k);
    tl_free(ids);
    tl_model_free(m);
}

/* ---- load errors, on a GGUF built in memory ---- */

typedef struct gbuf {
    uint8_t b[4096];
    size_t n;
} gbuf;

static void g_u32(gbuf *g, uint32_t v) { memcpy(g->b + g->n, &v, 4), g->n += 4; }
static void g_u64(gbuf *g, uint64_t v) { memcpy(g->b + g->n, &v, 8), g->n += 8; }
static void g_str(gbuf *g, const char *s) {
    g_u64(g, strlen(s));
    memcpy(g->b + g->n, s, strlen(s));
    g->n += strlen(s);
}

static int load_synthetic(const char *model, const char *pre, tl_error *err) {
    gbuf g = {.n = 0};
    g_u32(&g, 0x46554747); /* "GGUF" */
    g_u32(&g, 3);
    g_u64(&g, 0); /* tensors */
    g_u64(&g, 4); /* kv */
    g_str(&g, "tokenizer.ggml.model");
    g_u32(&g, GGUF_TYPE_STRING);
    g_str(&g, model);
    g_str(&g, "tokenizer.ggml.pre");
    g_u32(&g, GGUF_TYPE_STRING);
    g_str(&g, pre);
    g_str(&g, "tokenizer.ggml.tokens");
    g_u32(&g, GGUF_TYPE_ARRAY);
    g_u32(&g, GGUF_TYPE_STRING);
    g_u64(&g, 3);
    g_str(&g, "a");
    g_str(&g, "b");
    g_str(&g, "ab");
    g_str(&g, "tokenizer.ggml.merges");
    g_u32(&g, GGUF_TYPE_ARRAY);
    g_u32(&g, GGUF_TYPE_STRING);
    g_u64(&g, 1);
    g_str(&g, "a b");
    tl_gguf *gg = NULL;
    int st = tl_gguf_open_buffer(g.b, g.n, &gg, err);
    if (st != TL_OK) return st;
    tl_tokenizer *t = NULL;
    st = tl_tokenizer_load(gg, &t, err);
    if (st == TL_OK) {
        int32_t *ids = NULL;
        size_t n = 0;
        int e = tl_tokenizer_encode(t, "abab", 4, 0, &ids, &n, err);
        CHECK(e == TL_OK && n == 2 && ids[0] == 2 && ids[1] == 2, "tiny vocab: abab -> [ab ab]");
        free(ids);
    }
    tl_tokenizer_free(t);
    tl_gguf_close(gg);
    return st;
}

static void check_load_errors(void) {
    tl_error err = {0};
    CHECK(load_synthetic("gpt2", "gpt-2", &err) == TL_OK, "synthetic vocab loads: %s", err.msg);
    int st = load_synthetic("gpt2", "no-such-pre", &err);
    CHECK(st == TL_ERR_UNSUPPORTED && strstr(err.msg, "no-such-pre"), "unknown pre named: %s", err.msg);
    st = load_synthetic("wordpiece9", "default", &err);
    CHECK(st == TL_ERR_UNSUPPORTED && strstr(err.msg, "wordpiece9"), "unknown model named: %s", err.msg);
}

int main(void) {
    static const char *const vocab_files[] = {"gpt-2",     "starcoder",      "falcon",
                                              "deepseek-coder", "deepseek-llm", "mpt",
                                              "refact",    "llama-spm",      "phi-3"};
    for (size_t i = 0; i < sizeof vocab_files / sizeof vocab_files[0]; i++)
        check_vocab_fixture(vocab_files[i]);

    check_add_special();
    check_oracle_json("tests/oracle/fixtures/tokenizer_gpt2.json", vocab_path("ggml-vocab-gpt-2.gguf"));
    check_oracle_json("tests/oracle/fixtures/tokenizer_llama_spm.json", vocab_path("ggml-vocab-llama-spm.gguf"));
    check_oracle_json("tests/oracle/fixtures/tokenizer.json", SMOLLM);
    check_oracle_json("tests/oracle/fixtures/gemma_tokenizer.json", "models/gemma-3-270m-q4_k_m.gguf");

    loaded sm;
    if (load(SMOLLM, &sm) == 0) {
        check_hf_smollm(sm.t);
        check_smollm_specials(sm.t);
        check_round_trip("smollm2", sm.t, 1, 300);
        check_speed("smollm2", sm.t);
        unload(&sm);
    } else {
        CHECK(0, "loading %s", SMOLLM);
    }
    static const char *const bpe_rt[] = {"gpt-2", "starcoder", "deepseek-llm", "mpt", "falcon"};
    for (size_t i = 0; i < sizeof bpe_rt / sizeof bpe_rt[0]; i++) {
        char path[256];
        loaded l;
        snprintf(path, sizeof path, "%s/ggml-vocab-%s.gguf", vocab_dir(), bpe_rt[i]);
        if (load(path, &l)) {
            CHECK(0, "loading %s", path);
            continue;
        }
        check_round_trip(bpe_rt[i], l.t, 7 + i, 100);
        unload(&l);
    }
    loaded spm;
    if (load(vocab_path("ggml-vocab-llama-spm.gguf"), &spm) == 0) {
        check_speed("llama-spm", spm.t);
        unload(&spm);
    }
    check_spm_round_trip(vocab_path("ggml-vocab-llama-spm.gguf"), "llama-spm", 1, 100);
    check_spm_round_trip(vocab_path("ggml-vocab-phi-3.gguf"), "phi-3", 1, 100);
    check_spm_round_trip(vocab_path("ggml-vocab-baichuan.gguf"), "baichuan", 1, 100);
    check_gemma();
    check_detok();
    check_detok_public();
    check_load_errors();
    return tl_test_summary();
}
