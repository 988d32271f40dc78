/* tokenize/: text to token ids and back: the file's own vocabulary and
 * rules (tokenizer.c, this file), the Unicode tables the pre-tokenizers
 * need (unicode.c), and the streaming detokenizer that never splits a UTF-8
 * character (detok.c).
 *
 * tokenizer: loads tokenizer.ggml.* from a GGUF file into owned copies and
 * turns text into ids the way llama.cpp does: special-token partition, then
 * byte-level BPE ("gpt2", pre-tokenizer regexes by tokenizer.ggml.pre), BPE
 * over raw UTF-8 with spaces as U+2581 ("gemma4") or SentencePiece-style
 * merging by score ("llama"). Also token -> bytes. */
#include "tokenize/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenize/unicode.h"
#include "tokenize/wpm.h"
#include "base/util.h"

/* TOK_NONE: a file without a vocabulary (tokenizer.ggml.model = "none", as
 * random-weight benchmark files are): it runs on token ids only. */
/* TOK_WPM: llama.cpp's WordPiece ("bert"): words from wpm.c, each matched
 * greedily longest-first; the GGUF stores a word-initial piece with a
 * leading U+2581 and a "##" continuation piece bare. */
enum { TOK_BPE = 1, TOK_SPM = 2, TOK_NONE = 3, TOK_WPM = 4 };

/* Token attributes, numbered as llama.cpp's llama_token_attr, plus ours. */
enum {
    ATTR_UNKNOWN = 1 << 0,
    ATTR_UNUSED = 1 << 1,
    ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE = 1 << 5,
    ATTR_LSTRIP = 1 << 7,
    ATTR_RSTRIP = 1 << 8,
    ATTR_EOG = 1 << 15,
};

/* ---- interned strings: text -> id ------------------------------------------- */

typedef struct strtab {
    char *blob; /* every string followed by a NUL */
    size_t blob_len, blob_cap;
    size_t *off;
    uint32_t *len;
    int32_t n, cap;
    int32_t *slot; /* open addressing, -1 = empty */
    uint32_t mask;
} strtab;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int32_t strtab_find(const strtab *st, const char *s, size_t n) {
    if (!st->slot) return -1;
    uint32_t i = (uint32_t)hash_bytes(s, n) & st->mask;
    for (;; i = (i + 1) & st->mask) {
        int32_t id = st->slot[i];
        if (id < 0) return -1;
        if (st->len[id] == n && memcmp(st->blob + st->off[id], s, n) == 0) return id;
    }
}

static int strtab_rehash(strtab *st, uint32_t nslots) {
    int32_t *slot = malloc((size_t)nslots * sizeof *slot);
    if (!slot) return -1;
    memset(slot, 0xff, (size_t)nslots * sizeof *slot);
    free(st->slot);
    st->slot = slot;
    st->mask = nslots - 1;
    for (int32_t id = 0; id < st->n; id++) {
        const char *s = st->blob + st->off[id];
        uint32_t n = st->len[id];
        uint32_t i = (uint32_t)hash_bytes(s, n) & st->mask;
        /* a later duplicate replaces the earlier one: the last one wins, as in llama.cpp */
        while (slot[i] >= 0 && !(st->len[slot[i]] == n && memcmp(st->blob + st->off[slot[i]], s, n) == 0))
            i = (i + 1) & st->mask;
        slot[i] = id;
    }
    return 0;
}

/* Appends a string (even if already present) and returns its id. */
static int32_t strtab_append(strtab *st, const char *s, size_t n) {
    if (n >= UINT32_MAX || st->n == INT32_MAX) return -1;
    if (st->n == st->cap) {
        int32_t cap = st->cap ? (st->cap > INT32_MAX / 2 ? INT32_MAX : st->cap * 2) : 1024;
        size_t *off = realloc(st->off, (size_t)cap * sizeof *off);
        if (!off) return -1;
        st->off = off;
        uint32_t *len = realloc(st->len, (size_t)cap * sizeof *len);
        if (!len) return -1;
        st->len = len;
        st->cap = cap;
    }
    if (st->blob_len + n + 1 > st->blob_cap) {
        size_t cap = st->blob_cap ? st->blob_cap : 65536;
        while (cap < st->blob_len + n + 1) cap *= 2;
        char *b = realloc(st->blob, cap);
        if (!b) return -1;
        st->blob = b;
        st->blob_cap = cap;
    }
    memcpy(st->blob + st->blob_len, s, n);
    st->blob[st->blob_len + n] = 0;
    st->off[st->n] = st->blob_len;
    st->len[st->n] = (uint32_t)n;
    st->blob_len += n + 1;
    int32_t id = st->n++;
    if ((uint64_t)st->n * 2 > (uint64_t)st->mask + 1 || !st->slot) {
        uint32_t nslots = st->slot ? (st->mask + 1) * 2 : 4096;
        while ((uint64_t)st->n * 2 > nslots) nslots *= 2;
        if (strtab_rehash(st, nslots)) return -1;
        return id;
    }
    uint32_t i = (uint32_t)hash_bytes(s, n) & st->mask;
    for (;; i = (i + 1) & st->mask) {
        int32_t o = st->slot[i];
        if (o < 0 || (st->len[o] == n && memcmp(st->blob + st->off[o], s, n) == 0)) break;
    }
    st->slot[i] = id; /* replaces an equal string: the last one wins */
    return id;
}

/* The id of s, appending it if new. */
static int32_t strtab_intern(strtab *st, const char *s, size_t n) {
    int32_t id = strtab_find(st, s, n);
    return id >= 0 ? id : strtab_append(st, s, n);
}

static void strtab_free(strtab *st) {
    free(st->blob);
    free(st->off);
    free(st->len);
    free(st->slot);
}

/* ---- BPE merges: (left id, right id) -> (rank, merged id) ---------------------- */

typedef struct pairmap {
    uint64_t *key; /* UINT64_MAX = empty */
    int32_t *rank, *res;
    uint32_t mask;
} pairmap;

static uint32_t pair_hash(uint64_t k) { return (uint32_t)((k * 0x9E3779B97F4A7C15ull) >> 32); }

static int pairmap_init(pairmap *pm, size_t n) {
    size_t cap = 1024;
    while (cap < n * 2) cap *= 2;
    if (cap > (1u << 31)) return -1;
    pm->key = malloc(cap * sizeof *pm->key);
    pm->rank = malloc(cap * sizeof *pm->rank);
    pm->res = malloc(cap * sizeof *pm->res);
    if (!pm->key || !pm->rank || !pm->res) return -1;
    memset(pm->key, 0xff, cap * sizeof *pm->key);
    pm->mask = (uint32_t)cap - 1;
    return 0;
}

/* Keeps the first rank for a repeated pair, as llama.cpp's map emplace. */
static void pairmap_put(pairmap *pm, int32_t a, int32_t b, int32_t rank, int32_t res) {
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = pair_hash(k) & pm->mask;
    while (pm->key[i] != UINT64_MAX) {
        if (pm->key[i] == k) return;
        i = (i + 1) & pm->mask;
    }
    pm->key[i] = k;
    pm->rank[i] = rank;
    pm->res[i] = res;
}

static int pairmap_get(const pairmap *pm, int32_t a, int32_t b, int32_t *rank, int32_t *res) {
    if (!pm->key) return 0;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t i = pair_hash(k) & pm->mask; pm->key[i] != UINT64_MAX; i = (i + 1) & pm->mask) {
        if (pm->key[i] == k) {
            *rank = pm->rank[i];
            *res = pm->res[i];
            return 1;
        }
    }
    return 0;
}

static void pairmap_free(pairmap *pm) {
    free(pm->key);
    free(pm->rank);
    free(pm->res);
}

/* ---- the tokenizer ---------------------------------------------------------------- */

struct tl_tokenizer {
    int type;
    char model_name[8];
    char *pre_name;
    int32_t n_vocab;
    strtab st; /* ids < n_vocab are the vocabulary; BPE adds merge parts after it */
    uint16_t *attr;
    float *score;
    pairmap merges;
    int32_t byte_sym[256]; /* byte-level BPE: string id of each byte's code point */
    int32_t byte_tok[256]; /* SPM, gemma4: the <0xXX> token of each byte, or -1 */
    int32_t *special;      /* CONTROL/USER_DEFINED/UNKNOWN ids, longest text first */
    size_t n_special;
    tl_regex_split *re;
    int ignore_merges;
    /* llama.cpp's LLAMA_VOCAB_PRE_TYPE_GEMMA4 (tokenizer model "gemma4", or
     * "gpt2" with pre "granite-embed-multi-311m"): BPE without GPT-2's byte
     * table (byte_encode = false there) and with spaces escaped to U+2581
     * (escape_whitespaces); see raw_bpe_fragment */
    int gemma4;
    int add_bos, add_eos, add_sep, add_space_prefix;
    int wpm_lower, wpm_strip; /* WordPiece: tokenizer.ggml.normalizer.lowercase, .strip_accents */
    size_t max_token_len;     /* WordPiece: the longest token text in bytes */
    int32_t bos, eos, eot, eom, unk, pad, sep;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
};

static int32_t vocab_find(const tl_tokenizer *t, const char *s, size_t n) {
    int32_t id = strtab_find(&t->st, s, n);
    return id < t->n_vocab ? id : -1;
}

/* Pre-tokenizer regex lists (the patterns of each model's tokenizer.json, in
 * the form llama.cpp runs them; PCRE2 syntax). */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACT "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_UPPER "[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_LOWER "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]"
#define RE_CJK "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+"

static const char *const re_default[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+",
                                         "[0-9][0-9][0-9]", NULL};
static const char *const re_gpt2[] = {RE_GPT2, NULL};
static const char *const re_starcoder[] = {"\\p{N}", RE_GPT2, NULL};
static const char *const re_falcon[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]",
                                        NULL};
static const char *const re_deepseek_llm[] = {
    "[\r\n]",
    "\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-\u02AF\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF\U0001E900-\U0001E943]+",
    "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+",
    "\\s+$",
    RE_CJK,
    "\\p{N}+",
    NULL};
static const char *const re_deepseek_coder[] = {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK,
                                                "\\p{N}", NULL};
static const char *const re_deepseek3[] = {
    "\\p{N}{1,3}", "[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_llama3[] = {
    RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_qwen2[] = {
    RE_CONTRACT "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_poro[] = {" ?[^(\\s|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)]+", NULL};
static const char *const re_viking[] = {" ?[^(\\s|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)]+", "\\p{N}", NULL};
static const char *const re_gpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+" RE_CONTRACT "?|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER
    "+" RE_LOWER "*" RE_CONTRACT "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_tekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "*" RE_LOWER "+|[^\\r\\n\\p{L}\\p{N}]?" RE_UPPER "+" RE_LOWER
    "*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};

enum { PRE_IGNORE_MERGES = 1, PRE_ADD_BOS = 2, PRE_NO_BOS = 4 };

static const struct pre_entry {
    const char *name;
    const char *const *re;
    int flags;
} pre_table[] = {
    {"default", re_default, 0},
    {"gpt-2", re_gpt2, 0}, {"gpt2", re_gpt2, 0}, {"phi-2", re_gpt2, 0},
    {"jina-es", re_gpt2, 0}, {"jina-de", re_gpt2, 0}, {"gigachat", re_gpt2, 0},
    {"jina-v2-es", re_gpt2, 0}, {"jina-v2-de", re_gpt2, 0}, {"a.x-4.0", re_gpt2, 0},
    {"mellum", re_gpt2, 0}, {"modern-bert", re_gpt2, 0}, {"jina-v1-en", re_gpt2, 0},
    {"jina-v2-code", re_gpt2, 0}, {"roberta-bpe", re_gpt2, 0}, {"exaone4", re_gpt2, 0},
    {"mpt", re_gpt2, 0}, {"olmo", re_gpt2, 0}, {"jais", re_gpt2, 0}, {"trillion", re_gpt2, 0},
    {"granite-docling", re_gpt2, 0},
    {"starcoder", re_starcoder, 0}, {"refact", re_starcoder, 0}, {"command-r", re_starcoder, 0},
    {"smollm", re_starcoder, 0}, {"codeshell", re_starcoder, 0}, {"exaone", re_starcoder, 0},
    {"minerva-7b", re_starcoder, 0}, {"mellum2", re_starcoder, 0},
    {"falcon", re_falcon, 0},
    {"deepseek-llm", re_deepseek_llm, 0}, {"deepseek-coder", re_deepseek_coder, 0},
    {"deepseek-v3", re_deepseek3, 0},
    {"llama3", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"llama-v3", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"llama-bpe", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"falcon3", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"falcon-h1", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"pixtral", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"midm-2.0", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"lfm2", re_llama3, PRE_IGNORE_MERGES | PRE_ADD_BOS},
    {"dbrx", re_llama3, 0}, {"smaug-bpe", re_llama3, 0},
    {"chatglm-bpe", re_llama3, PRE_NO_BOS},
    {"glm4", re_llama3, PRE_NO_BOS | PRE_IGNORE_MERGES},
    {"qwen2", re_qwen2, 0}, {"deepseek-r1-qwen", re_qwen2, 0}, {"stablelm2", re_qwen2, 0},
    {"megrez", re_qwen2, 0}, {"hunyuan", re_qwen2, 0},
    {"poro-chat", re_poro, 0}, {"bloom", re_poro, 0}, {"gpt3-finnish", re_poro, 0},
    {"viking", re_viking, 0},
    {"gpt-4o", re_gpt4o, 0}, {"llama4", re_gpt4o, 0},
    {"tekken", re_tekken, PRE_IGNORE_MERGES | PRE_ADD_BOS},
};

/* ---- loading ------------------------------------------------------------------------ */

static char *dup_str(tl_str s) {
    char *p = malloc(s.len + 1);
    if (p) {
        memcpy(p, s.ptr, s.len);
        p[s.len] = 0;
    }
    return p;
}

static int load_vocab(tl_tokenizer *t, const tl_gguf *g, tl_error *err) {
    const tl_gguf_kv *tk = tl_gguf_find(g, "tokenizer.ggml.tokens");
    if (!tk || tk->type != GGUF_TYPE_ARRAY || tk->arr_type != GGUF_TYPE_STRING || !tk->arr_str)
        return tl_fail(err, TL_ERR_FORMAT, "tokenizer.ggml.tokens missing or not a string array");
    if (tk->arr_n == 0 || tk->arr_n >= (uint64_t)INT32_MAX / 2)
        return tl_fail(err, TL_ERR_FORMAT, "tokenizer.ggml.tokens: bad count %llu",
                       (unsigned long long)tk->arr_n);
    int32_t n = (int32_t)tk->arr_n;
    const tl_gguf_kv *ty = tl_gguf_find(g, "tokenizer.ggml.token_type");
    const tl_gguf_kv *sc = tl_gguf_find(g, "tokenizer.ggml.scores");
    if (ty && (ty->type != GGUF_TYPE_ARRAY || ty->arr_n < (uint64_t)n || ty->arr_str))
        return tl_fail(err, TL_ERR_FORMAT, "tokenizer.ggml.token_type: not an array of %d ints", n);
    if (sc && (sc->type != GGUF_TYPE_ARRAY || sc->arr_n < (uint64_t)n || sc->arr_str))
        return tl_fail(err, TL_ERR_FORMAT, "tokenizer.ggml.scores: not an array of %d numbers", n);
    t->attr = calloc((size_t)n, sizeof *t->attr);
    t->score = calloc((size_t)n, sizeof *t->score);
    if (!t->attr || !t->score) return tl_fail(err, TL_ERR_NOMEM, "out of memory loading vocab");
    /* token_type values: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte */
    static const uint16_t type_attr[7] = {0, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL,
                                          ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE};
    for (int32_t i = 0; i < n; i++) {
        tl_str s = tk->arr_str[i];
        char empty[32];
        if (s.len == 0) { /* llama.cpp names empty tokens so they stay distinct */
            snprintf(empty, sizeof empty, "[EMPTY_%d]", (int)i);
            s.ptr = empty;
            s.len = strlen(empty);
        }
        if (strtab_append(&t->st, s.ptr, (size_t)s.len) < 0)
            return tl_fail(err, TL_ERR_NOMEM, "out of memory loading vocab");
        int64_t k = ty ? tl_gguf_arr_int(ty, (uint64_t)i) : 1;
        t->attr[i] = (k >= 0 && k <= 6) ? type_attr[k] : 0;
        t->score[i] = sc ? (float)tl_gguf_arr_float(sc, (uint64_t)i) : 0.0f;
    }
    t->n_vocab = n;
    return TL_OK;
}

static int load_merges(tl_tokenizer *t, const tl_gguf *g, tl_error *err) {
    const tl_gguf_kv *mk = tl_gguf_find(g, "tokenizer.ggml.merges");
    if (!mk || mk->type != GGUF_TYPE_ARRAY || mk->arr_type != GGUF_TYPE_STRING || !mk->arr_str)
        return tl_fail(err, TL_ERR_FORMAT, "tokenizer.ggml.merges missing or not a string array");
    if (mk->arr_n >= (uint64_t)INT32_MAX / 4)
        return tl_fail(err, TL_ERR_FORMAT, "tokenizer.ggml.merges: too many (%llu)",
                       (unsigned long long)mk->arr_n);
    if (pairmap_init(&t->merges, (size_t)mk->arr_n))
        return tl_fail(err, TL_ERR_NOMEM, "out of memory loading merges");
    char *buf = NULL;
    size_t cap = 0;
    for (uint64_t i = 0; i < mk->arr_n; i++) {
        tl_str s = mk->arr_str[i];
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) continue; /* not "a b": llama.cpp keeps an empty pair no symbol can meet */
        size_t la = (size_t)(sp - s.ptr), lb = s.len - la - 1;
        if (la + lb > cap) {
            cap = (la + lb) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return tl_fail(err, TL_ERR_NOMEM, "out of memory loading merges");
            }
            buf = nb;
        }
        memcpy(buf, s.ptr, la);
        memcpy(buf + la, sp + 1, lb);
        int32_t a = strtab_intern(&t->st, s.ptr, la);
        int32_t b = strtab_intern(&t->st, sp + 1, lb);
        int32_t r = strtab_intern(&t->st, buf, la + lb);
        if (a < 0 || b < 0 || r < 0) {
            free(buf);
            return tl_fail(err, TL_ERR_NOMEM, "out of memory loading merges");
        }
        pairmap_put(&t->merges, a, b, (int32_t)i, r);
    }
    free(buf);
    if (t->gemma4) return TL_OK; /* its symbols are UTF-8 characters, not bytes */
    /* every byte's symbol gets an id, even one no merge or token uses */
    for (int b = 0; b < 256; b++) {
        char u[4];
        int n = tl_utf8_encode(tl_gpt2_byte_to_cp((unsigned char)b), u);
        t->byte_sym[b] = strtab_intern(&t->st, u, (size_t)n);
        if (t->byte_sym[b] < 0) return tl_fail(err, TL_ERR_NOMEM, "out of memory loading merges");
    }
    return TL_OK;
}

static int setup_pre(tl_tokenizer *t, const tl_gguf *g, tl_error *err) {
    tl_str pre = {"default", 7};
    if (tl_gguf_get_str(g, "tokenizer.ggml.pre", &pre) < 0)
        return tl_fail(err, TL_ERR_FORMAT, "tokenizer.ggml.pre is not a string");
    if (t->gemma4) pre = (tl_str){"gemma4", 6}; /* llama.cpp ignores the file's value */
    if (!(t->pre_name = dup_str(pre))) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    if (t->type != TOK_BPE) return TL_OK;
    if (t->gemma4 || strcmp(t->pre_name, "granite-embed-multi-311m") == 0) {
        t->gemma4 = 1; /* llama.cpp gives this "gpt2" vocab Gemma 4's pre-tokenizer type */
        return TL_OK;  /* no regex: see raw_bpe_fragment */
    }
    const struct pre_entry *e = NULL;
    for (size_t i = 0; i < sizeof pre_table / sizeof pre_table[0]; i++)
        if (strcmp(pre_table[i].name, t->pre_name) == 0) e = &pre_table[i];
    if (!e)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "unknown pre-tokenizer type '%s' (tokenizer.ggml.pre)",
                       t->pre_name);
    int n = 0;
    while (e->re[n]) n++;
    t->ignore_merges = !!(e->flags & PRE_IGNORE_MERGES);
    t->add_bos = !!(e->flags & PRE_ADD_BOS);
    if (e->flags & PRE_NO_BOS) t->bos = -1;
    return tl_regex_split_new(e->re, n, &t->re, err);
}

/* tokenizer.ggml.<key> as a token id, if present and in range. */
static void read_id(const tl_tokenizer *t, const tl_gguf *g, const char *key, int32_t *id) {
    char full[96];
    int64_t v;
    snprintf(full, sizeof full, "tokenizer.ggml.%s", key);
    if (*id >= t->n_vocab) *id = -1;
    if (tl_gguf_get_int(g, full, &v) == 1 && v >= 0 && v < t->n_vocab) *id = (int32_t)v;
}

static void read_flag(const tl_gguf *g, const char *key, int *flag) {
    int v;
    if (tl_gguf_get_bool(g, key, &v) == 1) *flag = v;
}

static void load_special_ids(tl_tokenizer *t, const tl_gguf *g) {
    t->eot = t->eom = t->pad = t->sep = -1;
    t->fim_pre = t->fim_suf = t->fim_mid = t->fim_pad = t->fim_rep = t->fim_sep = -1;
    read_id(t, g, "bos_token_id", &t->bos);
    read_id(t, g, "eos_token_id", &t->eos);
    read_id(t, g, "eot_token_id", &t->eot);
    read_id(t, g, "eom_token_id", &t->eom);
    read_id(t, g, "unknown_token_id", &t->unk);
    read_id(t, g, "seperator_token_id", &t->sep);
    read_id(t, g, "padding_token_id", &t->pad);
    read_id(t, g, "fim_pre_token_id", &t->fim_pre);
    read_id(t, g, "fim_suf_token_id", &t->fim_suf);
    read_id(t, g, "fim_mid_token_id", &t->fim_mid);
    read_id(t, g, "fim_pad_token_id", &t->fim_pad);
    read_id(t, g, "fim_rep_token_id", &t->fim_rep);
    read_id(t, g, "fim_sep_token_id", &t->fim_sep);
    read_id(t, g, "prefix_token_id", &t->fim_pre);
    read_id(t, g, "suffix_token_id", &t->fim_suf);
    read_id(t, g, "middle_token_id", &t->fim_mid);
    read_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    read_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos);
    if (t->type == TOK_WPM) t->add_sep = 1; /* llama.cpp's default for "bert"; the key may say otherwise */
    read_flag(g, "tokenizer.ggml.add_sep_token", &t->add_sep);
    read_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
    if (t->gemma4) t->add_bos = 1; /* llama.cpp forces it (its PR 21500) */
    /* llama.cpp's WordPiece adds [CLS] and [SEP] with add_special whatever
     * add_bos_token says; the SEP goes on in the encoder, never as an EOS */
    if (t->type == TOK_WPM) t->add_bos = 1, t->add_eos = 0;
}

/* Roles llama.cpp recognises by a token's text when the metadata lacks them.
 * llama.cpp takes whichever match its hash map yields first; we take the first
 * listed text present (so <|im_end|> before <|endoftext|>). The token is
 * forced to CONTROL. */
static const char *const eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\uFF5Cend\u2581of\u2581sentence\uFF5C>", "<end_of_utterance>", NULL};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_pre_texts[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                            "<\uFF5Cfim\u2581begin\uFF5C>", "<PRE>", "\u2581<PRE>", "<|code_prefix|>",
                                            "<|prefix|>", NULL};
static const char *const fim_suf_texts[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                            "<\uFF5Cfim\u2581hole\uFF5C>", "<SUF>", "\u2581<SUF>", "<|code_suffix|>",
                                            "<|suffix|>", NULL};
static const char *const fim_mid_texts[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                            "<\uFF5Cfim\u2581end\uFF5C>", "<MID>", "\u2581<MID>", "<|code_middle|>",
                                            "<|middle|>", NULL};
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                            "[PAD]", NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                            "<REPO>", "<reponame>", NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
/* Every token with one of these texts ends generation. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uFF5Cend\u2581of\u2581sentence\uFF5C>", "[e~[", NULL};

static void detect_role(tl_tokenizer *t, const char *const *texts, int32_t *id) {
    if (*id >= 0) return;
    for (int i = 0; texts[i]; i++) {
        int32_t k = vocab_find(t, texts[i], strlen(texts[i]));
        if (k >= 0) {
            *id = k;
            t->attr[k] |= ATTR_CONTROL;
            return;
        }
    }
}

static void mark_eog(tl_tokenizer *t, int32_t id) {
    if (id >= 0 && id < t->n_vocab) t->attr[id] |= ATTR_EOG;
}

static void detect_special(tl_tokenizer *t) {
    detect_role(t, eot_texts, &t->eot);
    detect_role(t, eom_texts, &t->eom);
    detect_role(t, fim_pre_texts, &t->fim_pre);
    detect_role(t, fim_suf_texts, &t->fim_suf);
    detect_role(t, fim_mid_texts, &t->fim_mid);
    detect_role(t, fim_pad_texts, &t->fim_pad);
    detect_role(t, fim_rep_texts, &t->fim_rep);
    detect_role(t, fim_sep_texts, &t->fim_sep);
    mark_eog(t, t->fim_pad);
    mark_eog(t, t->fim_rep);
    mark_eog(t, t->fim_sep);
    for (int i = 0; eog_texts[i]; i++) {
        /* a text may be held by several ids only in a malformed vocab; the
         * lookup finds the one llama.cpp's map would keep (the last) */
        int32_t k = vocab_find(t, eog_texts[i], strlen(eog_texts[i]));
        if (k >= 0) t->attr[k] |= ATTR_CONTROL | ATTR_EOG;
    }
    /* gpt-oss: these always render, so they must not be control tokens */
    static const char *const always_shown[] = {"<|channel|>", "<|message|>", "<|start|>",
                                               "<|constrain|>", NULL};
    for (int i = 0; always_shown[i]; i++) {
        int32_t k = vocab_find(t, always_shown[i], strlen(always_shown[i]));
        if (k >= 0) t->attr[k] = (uint16_t)(ATTR_USER_DEFINED | (t->attr[k] & ATTR_EOG));
    }
    mark_eog(t, t->eos);
    mark_eog(t, t->eot);
    mark_eog(t, t->eom);
    /* harmony (gpt-oss): <|end|> closes a message, not the reply, which ends
     * at <|return|> or <|call|>; where both end generation, <|end|> renders
     * like <|channel|> (llama.cpp's rule) */
    const int32_t ret = vocab_find(t, "<|return|>", 10), call = vocab_find(t, "<|call|>", 8),
                  end = vocab_find(t, "<|end|>", 7);
    if (ret >= 0 && call >= 0 && end >= 0 && (t->attr[ret] & ATTR_EOG) && (t->attr[call] & ATTR_EOG))
        t->attr[end] = ATTR_USER_DEFINED;
    /* Gemma 4 and PLaMo-2 hold </s> as ordinary text: where <|tool_response>
     * or <|plamo:eos|> ends generation, an end-of-generation </s> becomes a
     * normal token (llama.cpp's rule, keyed on these texts) */
    int marker = 0;
    int32_t s_id = -1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!(t->attr[i] & ATTR_EOG)) continue;
        const char *x = t->st.blob + t->st.off[i];
        const uint32_t n = t->st.len[i];
        if ((n == 16 && !memcmp(x, "<|tool_response>", 16)) || (n == 13 && !memcmp(x, "<|plamo:eos|>", 13)))
            marker = 1;
        else if (n == 4 && !memcmp(x, "</s>", 4))
            s_id = i;
    }
    if (marker && s_id >= 0) t->attr[s_id] = ATTR_NORMAL;
}

typedef struct len_id {
    uint32_t len;
    int32_t id;
} len_id;

/* Longest first; equal lengths by id so the order is deterministic. */
static int cmp_len_id(const void *a, const void *b) {
    const len_id *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int build_special_cache(tl_tokenizer *t, const tl_gguf *g, tl_error *err) {
    size_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        n += !!(t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN));
    t->special = malloc((n ? n : 1) * sizeof *t->special);
    len_id *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!t->special || !tmp) {
        free(tmp);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))
            tmp[t->n_special++] = (len_id){t->st.len[i], i};
    qsort(tmp, t->n_special, sizeof *tmp, cmp_len_id);
    for (size_t i = 0; i < t->n_special; i++) t->special[i] = tmp[i].id;
    free(tmp);

    /* Phi-3's added tokens eat the whitespace after them (llama.cpp keys this
     * on the model name). */
    tl_str name;
    if (tl_gguf_get_str(g, "general.name", &name) == 1) {
        char low[128];
        size_t k = name.len < sizeof low - 1 ? (size_t)name.len : sizeof low - 1;
        for (size_t i = 0; i < k; i++) {
            char c = name.ptr[i];
            low[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
        }
        low[k] = 0;
        if (strstr(low, "phi-3") || strstr(low, "phi3")) {
            for (size_t i = 0; i < t->n_special; i++) t->attr[t->special[i]] |= ATTR_RSTRIP;
            int32_t s = vocab_find(t, "</s>", 4);
            if (s >= 0) t->attr[s] |= ATTR_RSTRIP;
            static const char *const keep[] = {"<unk>", "<s>", "<|endoftext|>"};
            for (int i = 0; i < 3; i++) {
                s = vocab_find(t, keep[i], strlen(keep[i]));
                if (s >= 0) t->attr[s] &= (uint16_t)~ATTR_RSTRIP;
            }
        }
    }
    return TL_OK;
}

/* The token of each byte for the fallback: <0xXX>, else (SPM only) the raw byte. */
static void setup_byte_tokens(tl_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        int32_t id = vocab_find(t, hex, 6);
        if (id < 0 && t->type == TOK_SPM) { /* some vocabs hold the raw byte instead */
            char c = (char)b;
            id = vocab_find(t, &c, 1);
        }
        t->byte_tok[b] = id;
    }
}

int tl_tokenizer_load(const tl_gguf *g, tl_tokenizer **out, tl_error *err) {
    *out = NULL;
    tl_str model;
    if (tl_gguf_get_str(g, "tokenizer.ggml.model", &model) != 1)
        return tl_fail(err, TL_ERR_FORMAT, "tokenizer.ggml.model missing or not a string");
    tl_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    if (tl_str_eq(model, "gpt2")) {
        t->type = TOK_BPE;
        t->bos = t->eos = 11; /* llama.cpp's defaults when the file gives none */
        t->unk = -1;
    } else if (tl_str_eq(model, "none")) {
        t->type = TOK_NONE;
        t->bos = t->eos = t->eot = t->unk = -1;
        snprintf(t->model_name, sizeof t->model_name, "none");
        *out = t;
        return TL_OK;
    } else if (tl_str_eq(model, "gemma4")) {
        t->type = TOK_BPE; /* with merges; no default special ids */
        t->gemma4 = 1;
        t->bos = t->eos = t->unk = -1;
    } else if (tl_str_eq(model, "bert")) {
        t->type = TOK_WPM; /* llama.cpp's defaults: [CLS] 101, [UNK] 100, [SEP] 102 */
        t->bos = 101;
        t->eos = -1;
        t->unk = 100;
        t->wpm_lower = 1;
        read_flag(g, "tokenizer.ggml.normalizer.lowercase", &t->wpm_lower);
        t->wpm_strip = t->wpm_lower;
        read_flag(g, "tokenizer.ggml.normalizer.strip_accents", &t->wpm_strip);
    } else if (tl_str_eq(model, "llama")) {
        t->type = TOK_SPM;
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_bos = 1;
        t->add_space_prefix = 1;
    } else {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(model.len < 60 ? model.len : 60), model.ptr);
        free(t);
        return tl_fail(err, TL_ERR_UNSUPPORTED, "unsupported tokenizer model '%s'", name);
    }
    snprintf(t->model_name, sizeof t->model_name, "%s",
             t->gemma4 ? "gemma4" : t->type == TOK_BPE ? "gpt2" : t->type == TOK_WPM ? "bert" : "llama");
    int st = load_vocab(t, g, err);
    if (!st) st = setup_pre(t, g, err);
    if (!st && t->type == TOK_BPE) st = load_merges(t, g, err);
    if (!st) {
        if (t->type == TOK_SPM || t->gemma4) setup_byte_tokens(t);
        for (int32_t i = 0; i < t->n_vocab; i++)
            if (t->st.len[i] > t->max_token_len) t->max_token_len = t->st.len[i];
        load_special_ids(t, g);
        if (t->type == TOK_WPM && t->sep < 0) t->sep = 102 < t->n_vocab ? 102 : -1;
        detect_special(t);
        st = build_special_cache(t, g, err);
    }
    if (st) {
        tl_tokenizer_free(t);
        return st;
    }
    *out = t;
    return TL_OK;
}

void tl_tokenizer_free(tl_tokenizer *t) {
    if (!t) return;
    strtab_free(&t->st);
    pairmap_free(&t->merges);
    tl_regex_split_free(t->re);
    free(t->attr);
    free(t->score);
    free(t->special);
    free(t->pre_name);
    free(t);
}

/* ---- output vector and merge queue ------------------------------------------------- */

typedef struct idvec {
    int32_t *v;
    size_t n, cap;
    int oom;
} idvec;

static void push_id(idvec *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 256;
        int32_t *v = realloc(o->v, cap * sizeof *v);
        if (!v) {
            o->oom = 1;
            return;
        }
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
}

/* A symbol: a span of the word being merged, linked to its neighbours. */
typedef struct sym {
    int32_t id; /* BPE: string id */
    int32_t prev, next;
    uint32_t start, len;
} sym;

/* A candidate merge of symbol left with its right neighbour; lower prio
 * first, then the leftmost (as llama.cpp's queues). It is stale once either
 * side has merged since: both only ever grow, so the summed length tells. */
typedef struct bigram {
    uint32_t prio; /* BPE: merge rank; SPM: order-reversed score bits */
    int32_t left;
    uint32_t size;
    int32_t res; /* BPE: string id of the merged text */
} bigram;

typedef struct work {
    sym *s;
    size_t s_cap;
    bigram *h;
    size_t h_n, h_cap;
    char *buf; /* scratch text */
    size_t buf_cap;
    int oom;
} work;

static int bigram_less(const bigram *a, const bigram *b) {
    return a->prio < b->prio || (a->prio == b->prio && a->left < b->left);
}

/* Maps a score to a key that sorts ascending for descending scores. */
static uint32_t score_key(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

/* The right neighbour of a still-valid bigram, or -1 if it is stale. */
static int32_t bigram_right(const sym *s, const bigram *b) {
    const sym *l = &s[b->left];
    if (l->len == 0 || l->next < 0) return -1;
    const sym *r = &s[l->next];
    return (r->len != 0 && l->len + r->len == b->size) ? l->next : -1;
}

static void heap_push(work *w, const bigram *b) {
    if (w->h_n == w->h_cap) {
        size_t cap = w->h_cap ? w->h_cap * 2 : 256;
        bigram *h = realloc(w->h, cap * sizeof *h);
        if (!h) {
            w->oom = 1;
            return;
        }
        w->h = h;
        w->h_cap = cap;
    }
    size_t i = w->h_n++;
    while (i > 0 && bigram_less(b, &w->h[(i - 1) / 2])) {
        w->h[i] = w->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->h[i] = *b;
}

static bigram heap_pop(work *w) {
    bigram top = w->h[0], last = w->h[--w->h_n];
    size_t i = 0, n = w->h_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_less(&w->h[c + 1], &w->h[c])) c++;
        if (!bigram_less(&w->h[c], &last)) break;
        w->h[i] = w->h[c];
        i = c;
    }
    if (n) w->h[i] = last;
    return top;
}

static int work_reserve(work *w, size_t nsym, size_t nbuf) {
    if (nsym > w->s_cap) {
        sym *s = realloc(w->s, nsym * sizeof *s);
        if (!s) return -1;
        w->s = s;
        w->s_cap = nsym;
    }
    if (nbuf > w->buf_cap) {
        char *b = realloc(w->buf, nbuf);
        if (!b) return -1;
        w->buf = b;
        w->buf_cap = nbuf;
    }
    return 0;
}

/* ---- byte-level BPE ------------------------------------------------------------------ */

/* A symbol with id -1 (gemma4: a character that is no string of the vocab or
 * the merges) merges with nothing. */
static void bpe_try_pair(const tl_tokenizer *t, work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0 || w->s[l].id < 0 || w->s[r].id < 0) return;
    bigram b;
    int32_t rank;
    if (!pairmap_get(&t->merges, w->s[l].id, w->s[r].id, &rank, &b.res)) return;
    b.prio = (uint32_t)rank;
    b.left = l;
    b.size = w->s[l].len + w->s[r].len;
    heap_push(w, &b);
}

/* Merges the ns linked symbols of w->s, lowest rank first. */
static void bpe_merge(const tl_tokenizer *t, work *w, int32_t ns) {
    sym *s = w->s;
    w->h_n = 0;
    for (int32_t i = 1; i < ns; i++) bpe_try_pair(t, w, i - 1, i);
    while (w->h_n > 0) {
        bigram b = heap_pop(w);
        int32_t ri = bigram_right(s, &b);
        if (ri < 0) continue;
        sym *l = &s[b.left], *r = &s[ri];
        l->id = b.res;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = b.left;
        bpe_try_pair(t, w, l->prev, b.left);
        bpe_try_pair(t, w, b.left, l->next);
    }
}

/* A final symbol that is no token: llama.cpp falls back to looking up each
 * byte of its (byte-encoded) text as a one-byte token, usually finding none. */
static void bpe_emit(const tl_tokenizer *t, int32_t id, idvec *out) {
    if (id < t->n_vocab) {
        push_id(out, id);
        return;
    }
    const char *s = t->st.blob + t->st.off[id];
    for (uint32_t i = 0; i < t->st.len[id]; i++) {
        int32_t k = vocab_find(t, s + i, 1);
        if (k >= 0) push_id(out, k);
    }
}

/* Encodes raw word bytes as their byte-level text into w->buf; returns length. */
static size_t bpe_encode_word(work *w, const unsigned char *word, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += (size_t)tl_utf8_encode(tl_gpt2_byte_to_cp(word[i]), w->buf + o);
    return o;
}

static void bpe_word(const tl_tokenizer *t, work *w, const unsigned char *word, size_t n, idvec *out) {
    if (n == 0) return;
    if (work_reserve(w, n, 2 * n)) {
        w->oom = 1;
        return;
    }
    if (t->ignore_merges) {
        int32_t id = vocab_find(t, w->buf, bpe_encode_word(w, word, n));
        if (id >= 0) {
            push_id(out, id);
            return;
        }
    }
    sym *s = w->s;
    for (size_t i = 0; i < n; i++) {
        s[i].id = t->byte_sym[word[i]];
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        s[i].start = (uint32_t)i;
        s[i].len = 1;
    }
    bpe_merge(t, w, (int32_t)n);
    for (int32_t i = 0; i >= 0; i = s[i].next) bpe_emit(t, s[i].id, out);
}

static int bpe_fragment(const tl_tokenizer *t, work *w, const char *raw, size_t n, idvec *out,
                        tl_error *err) {
    if (n > SIZE_MAX / 3 - 1) return tl_fail(err, TL_ERR_ARG, "text too long");
    char *norm = malloc(3 * n + 1);
    if (!norm) return tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
    int sur = 0;
    size_t nn = tl_utf8_normalize(raw, n, norm, &sur);
    char *masked = NULL;
    if (sur) { /* PCRE2 needs valid UTF-8; offsets stay the same */
        if (!(masked = malloc(nn + 1))) {
            free(norm);
            return tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
        }
        tl_utf8_mask_surrogates(norm, nn, masked);
    }
    tl_span *sp = NULL;
    size_t nsp = 0;
    int st = tl_regex_split_run(t->re, masked ? masked : norm, nn, &sp, &nsp, err);
    for (size_t i = 0; st == TL_OK && i < nsp; i++) {
        bpe_word(t, w, (const unsigned char *)norm + sp[i].off, sp[i].len, out);
        if (w->oom || out->oom) st = tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
    }
    free(sp);
    free(masked);
    free(norm);
    return st;
}

/* ---- gemma4: BPE over raw UTF-8 ------------------------------------------------------------- */

/* A final symbol that is no token becomes the <0xXX> token of each of its
 * bytes; a byte without one is dropped (llama.cpp's fallback for BPE without
 * byte encoding). */
static void raw_emit(const tl_tokenizer *t, int32_t id, const char *s, uint32_t len, idvec *out) {
    if (id >= 0 && id < t->n_vocab) {
        push_id(out, id);
        return;
    }
    for (uint32_t i = 0; i < len; i++) {
        int32_t b = t->byte_tok[(unsigned char)s[i]];
        if (b >= 0) push_id(out, b);
    }
}

/* One run of newlines or of other characters, merged from its UTF-8 characters. */
static void raw_bpe_word(const tl_tokenizer *t, work *w, const char *word, size_t n, idvec *out) {
    if (n == 0) return;
    if (word[0] == '\n') { /* a run of newlines that is a token is taken whole (llama.cpp PR 21343) */
        int32_t id = vocab_find(t, word, n);
        if (id >= 0) {
            push_id(out, id);
            return;
        }
    }
    if (work_reserve(w, n, 0)) {
        w->oom = 1;
        return;
    }
    sym *s = w->s;
    int32_t ns = 0;
    for (size_t off = 0; off < n; ns++) {
        size_t len = tl_utf8_len((unsigned char)word[off]);
        if (len > n - off) len = n - off;
        s[ns] = (sym){strtab_find(&t->st, word + off, len), ns - 1, off + len < n ? ns + 1 : -1,
                      (uint32_t)off, (uint32_t)len};
        off += len;
    }
    bpe_merge(t, w, ns);
    for (int32_t i = 0; i >= 0; i = s[i].next) raw_emit(t, s[i].id, word + s[i].start, s[i].len, out);
}

/* llama.cpp's gemma4 path: spaces become U+2581, the text is decoded as its
 * regex split decodes it (tl_utf8_normalize), then split into runs of
 * newlines and runs of anything else ("[^\n]+|[\n]+"), each merged alone. */
static int raw_bpe_fragment(const tl_tokenizer *t, work *w, const char *raw, size_t n, idvec *out,
                            tl_error *err) {
    if (n > SIZE_MAX / 9 - 1) return tl_fail(err, TL_ERR_ARG, "text too long");
    size_t ne = n;
    for (size_t i = 0; i < n; i++) ne += raw[i] == ' ' ? 2 : 0;
    char *esc = malloc(ne + 1), *norm = malloc(3 * ne + 1); /* tl_utf8_normalize's bound */
    if (!esc || !norm) {
        free(esc);
        free(norm);
        return tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
    }
    for (size_t i = 0, k = 0; i < n; i++) {
        if (raw[i] == ' ') {
            memcpy(esc + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            esc[k++] = raw[i];
        }
    }
    const size_t nn = tl_utf8_normalize(esc, ne, norm, NULL);
    free(esc);
    int st = TL_OK;
    if (nn > UINT32_MAX / 2) st = tl_fail(err, TL_ERR_ARG, "text too long for one fragment");
    for (size_t off = 0; st == TL_OK && off < nn;) {
        const int nl = norm[off] == '\n';
        size_t end = off + 1;
        while (end < nn && (norm[end] == '\n') == nl) end++;
        raw_bpe_word(t, w, norm + off, end - off, out);
        if (w->oom || out->oom) st = tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
        off = end;
    }
    free(norm);
    return st;
}

/* ---- SentencePiece-style merging by score ---------------------------------------------- */

static void spm_try_pair(const tl_tokenizer *t, work *w, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    uint32_t size = w->s[l].len + w->s[r].len;
    int32_t id = vocab_find(t, w->buf + w->s[l].start, size);
    if (id < 0) return;
    bigram b = {score_key(t->score[id]), l, size, id};
    heap_push(w, &b);
}

static void spm_emit(const tl_tokenizer *t, const char *text, uint32_t len, idvec *out) {
    int32_t id = vocab_find(t, text, len);
    if (id >= 0) {
        push_id(out, id);
        return;
    }
    for (uint32_t i = 0; i < len; i++) {
        int32_t b = t->byte_tok[(unsigned char)text[i]];
        if (b < 0) b = t->unk;
        if (b >= 0) push_id(out, b);
    }
}

static int spm_fragment(const tl_tokenizer *t, work *w, const char *raw, size_t n, int prefix,
                        idvec *out, tl_error *err) {
    if (n > SIZE_MAX / 3 - 4) return tl_fail(err, TL_ERR_ARG, "text too long");
    if (n + 1 > INT32_MAX / 3) return tl_fail(err, TL_ERR_ARG, "text too long for one fragment");
    /* a symbol per character, but a stray lead byte takes the bytes after
     * it, and a space's U+2581 is three: up to a symbol per byte of buf */
    if (work_reserve(w, 3 * (n + 1), 3 * (n + 1)))
        return tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
    size_t m = 0;
    for (size_t i = 0; i < n + (size_t)prefix; i++) { /* spaces become U+2581 */
        char c = (prefix && i == 0) ? ' ' : raw[i - (size_t)prefix];
        if (c == ' ') {
            memcpy(w->buf + m, "\xe2\x96\x81", 3);
            m += 3;
        } else {
            w->buf[m++] = c;
        }
    }
    sym *s = w->s;
    int32_t ns = 0;
    for (size_t off = 0; off < m; ns++) {
        size_t len = tl_utf8_len((unsigned char)w->buf[off]);
        if (len > m - off) len = m - off;
        s[ns] = (sym){0, ns - 1, off + len < m ? ns + 1 : -1, (uint32_t)off, (uint32_t)len};
        off += len;
    }
    w->h_n = 0;
    for (int32_t i = 1; i < ns; i++) spm_try_pair(t, w, i - 1, i);
    while (w->h_n > 0) {
        bigram b = heap_pop(w);
        int32_t ri = bigram_right(s, &b);
        if (ri < 0) continue;
        sym *l = &s[b.left], *r = &s[ri];
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = b.left;
        spm_try_pair(t, w, l->prev, b.left);
        spm_try_pair(t, w, b.left, l->next);
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = s[i].next) spm_emit(t, w->buf + s[i].start, s[i].len, out);
    if (w->oom || out->oom) return tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
    return TL_OK;
}

/* ---- special-token partition ---------------------------------------------------------------- */

typedef struct frag {
    int32_t tok; /* -1: raw text */
    size_t off, len;
} frag;

typedef struct fragvec {
    frag *v;
    size_t n, cap;
} fragvec;

static int frag_push(fragvec *f, int32_t tok, size_t off, size_t len) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        frag *v = realloc(f->v, cap * sizeof *v);
        if (!v) return -1;
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = (frag){tok, off, len};
    return 0;
}

static int is_space_c(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* Trigram presence filter: skips special tokens that cannot occur in the text
 * without scanning it once per token (Gemma has thousands). */
static uint32_t tri_hash(const unsigned char *p) {
    uint32_t x = ((uint32_t)p[0] << 16) | ((uint32_t)p[1] << 8) | p[2];
    return (x * 2654435761u) >> 16;
}

static int may_occur(const uint8_t *bits, const char *s, size_t n) {
    for (size_t i = 0; i + 2 < n; i++) {
        uint32_t h = tri_hash((const unsigned char *)s + i);
        if (!(bits[h >> 3] & (1u << (h & 7)))) return 0;
    }
    return 1;
}

/* Splits each raw fragment of in at the occurrences of token id, into out. */
static int split_by_token(const tl_tokenizer *t, const char *text, int32_t id, const fragvec *in,
                          fragvec *out) {
    const char *tok = t->st.blob + t->st.off[id];
    size_t tl = t->st.len[id];
    uint16_t a = t->attr[id];
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        frag f = in->v[i];
        if (f.tok >= 0) {
            if (frag_push(out, f.tok, 0, 0)) return -1;
            continue;
        }
        size_t off = f.off, rem = f.len;
        for (;;) {
            const char *p = rem >= tl ? memmem(text + off, rem, tok, tl) : NULL;
            if (!p) {
                if (rem > 0 && frag_push(out, -1, off, rem)) return -1;
                break;
            }
            size_t m = (size_t)(p - text), left = m - off;
            if (a & ATTR_LSTRIP)
                while (left > 0 && is_space_c((unsigned char)text[off + left - 1])) left--;
            if ((left > 0 && frag_push(out, -1, off, left)) || frag_push(out, id, 0, 0)) return -1;
            size_t roff = m + tl, rlen = off + rem - roff;
            if (a & ATTR_RSTRIP)
                while (rlen > 0 && is_space_c((unsigned char)text[roff])) roff++, rlen--;
            off = roff;
            rem = rlen;
        }
    }
    return 0;
}

static int partition(const tl_tokenizer *t, const char *text, size_t len, int parse_special,
                     fragvec *res) {
    fragvec a = {0}, b = {0};
    uint8_t *bits = calloc(8192, 1);
    int rc = -1;
    if (!bits || (len > 0 && frag_push(&a, -1, 0, len))) goto done;
    for (size_t i = 0; i + 2 < len; i++) {
        uint32_t h = tri_hash((const unsigned char *)text + i);
        bits[h >> 3] |= (uint8_t)(1u << (h & 7));
    }
    for (size_t k = 0; k < t->n_special && a.n > 0; k++) {
        int32_t id = t->special[k];
        if (!parse_special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
        const char *s = t->st.blob + t->st.off[id];
        size_t sl = t->st.len[id];
        if (sl == 0 || sl > len || !may_occur(bits, s, sl)) continue;
        if (split_by_token(t, text, id, &a, &b)) goto done;
        fragvec tmp = a;
        a = b;
        b = tmp;
    }
    rc = 0;
done:
    free(bits);
    free(b.v);
    if (rc) {
        free(a.v);
        a = (fragvec){0};
    }
    *res = a;
    return rc;
}

/* llm_tokenizer_wpm_session::tokenize: per word (U+2581 first), from each
 * byte offset the longest vocabulary text (pieces after the first are
 * looked up bare: the GGUF's "##" form); a word with any position that
 * matches nothing is one [UNK]. */
static int wpm_fragment(const tl_tokenizer *t, const char *raw, size_t n, idvec *out, tl_error *err) {
    char *buf = NULL;
    size_t *start = NULL, nw = 0;
    if (tl_wpm_words(raw, n, t->wpm_lower, t->wpm_strip, &buf, &start, &nw))
        return tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
    for (size_t w = 0; w < nw; w++) {
        const char *word = buf + start[w];
        const size_t wn = start[w + 1] - start[w], mark = out->n;
        int whole = 1;
        for (size_t i = 0; i < wn && whole; i++) {
            size_t j = i + t->max_token_len + 1 < wn ? i + t->max_token_len + 1 : wn;
            int32_t id = -1;
            for (; j > i && (id = vocab_find(t, word + i, j - i)) < 0; j--) {}
            if (id < 0) whole = 0;
            else {
                push_id(out, id);
                i = j - 1;
            }
        }
        if (!whole) out->n = mark;
        if (out->n == mark && t->unk >= 0) push_id(out, t->unk);
    }
    free(buf);
    free(start);
    return TL_OK;
}

int tl_tokenizer_encode(const tl_tokenizer *t, const char *text, size_t len, int flags,
                        int32_t **ids, size_t *n_ids, tl_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!text && len > 0)) return tl_fail(err, TL_ERR_ARG, "tokenize: NULL argument");
    if (t->type == TOK_NONE)
        return tl_fail(err, TL_ERR_UNSUPPORTED,
                       "the file has no vocabulary (tokenizer.ggml.model = none): it runs on token ids only");
    idvec out = {0};
    work w = {0};
    fragvec fr = {0};
    int st = TL_OK;
    const int add_bos = (flags & TL_TOK_ADD_BOS) || ((flags & TL_TOK_ADD_SPECIAL) && t->add_bos);
    if (add_bos && t->bos >= 0) push_id(&out, t->bos);
    if (partition(t, text, len, !!(flags & TL_TOK_PARSE_SPECIAL), &fr))
        st = tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
    int prev_special = 1; /* SPM: a space is prefixed after a special token or at the start */
    for (size_t i = 0; st == TL_OK && i < fr.n; i++) {
        frag f = fr.v[i];
        if (f.tok >= 0) {
            push_id(&out, f.tok);
            prev_special = 1;
        } else if (t->type == TOK_WPM) {
            st = wpm_fragment(t, text + f.off, f.len, &out, err);
        } else if (t->gemma4) {
            st = raw_bpe_fragment(t, &w, text + f.off, f.len, &out, err);
        } else if (t->type == TOK_BPE) {
            st = bpe_fragment(t, &w, text + f.off, f.len, &out, err);
        } else {
            st = spm_fragment(t, &w, text + f.off, f.len, t->add_space_prefix && prev_special, &out, err);
            prev_special = 0;
        }
    }
    if (st == TL_OK && t->type == TOK_WPM && add_bos && t->sep >= 0) push_id(&out, t->sep);
    if (st == TL_OK && (flags & TL_TOK_ADD_SPECIAL) && t->add_eos && t->eos >= 0) push_id(&out, t->eos);
    if (st == TL_OK && out.oom) st = tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
    free(fr.v);
    free(w.s);
    free(w.h);
    free(w.buf);
    if (st != TL_OK) {
        free(out.v);
        return st;
    }
    if (!out.v) out.v = malloc(sizeof *out.v); /* a valid pointer even for no tokens */
    if (!out.v) return tl_fail(err, TL_ERR_NOMEM, "out of memory tokenizing");
    *ids = out.v;
    *n_ids = out.n;
    return TL_OK;
}

/* ---- token -> text ------------------------------------------------------------------------ */

typedef struct outbuf {
    char *p;
    size_t cap, n;
} outbuf;

static void put(outbuf *o, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++, o->n++)
        if (o->n < o->cap) o->p[o->n] = s[i];
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "<0xAB>" -> 0xAB (0 when malformed, as strtol would give). */
static unsigned char byte_token_value(const char *s, size_t n) {
    if (n < 5) return 0;
    int hi = hexval(s[3]), lo = hexval(s[4]);
    if (hi < 0) return 0;
    return (unsigned char)(lo < 0 ? hi : hi * 16 + lo);
}

/* Byte-level text back to bytes; a code point outside GPT-2's table is shown
 * as llama.cpp shows it: "[UNK_BYTE_0x<utf8 hex><whole token>]". */
static void bpe_decode(const char *s, size_t n, outbuf *o) {
    size_t i = 0;
    while (i < n) {
        uint32_t cp = (unsigned char)s[i];
        size_t len = tl_utf8_len((unsigned char)s[i]);
        if (len > n - i) len = n - i;
        if (len > 1) {
            cp = (unsigned char)s[i] & (0x7F >> len);
            for (size_t k = 1; k < len; k++) cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
        }
        int b = tl_gpt2_cp_to_byte(cp);
        if (b >= 0) {
            char c = (char)b;
            put(o, &c, 1);
        } else {
            char hx[4];
            put(o, "[UNK_BYTE_0x", 12);
            for (size_t k = 0; k < len; k++) {
                snprintf(hx, sizeof hx, "%02x", (unsigned char)s[i + k]);
                put(o, hx, 2);
            }
            put(o, s, n);
            put(o, "]", 1);
        }
        i += len;
    }
}

size_t tl_tokenizer_piece(const tl_tokenizer *t, int32_t id, int special, char *out, size_t cap) {
    if (!t || id < 0 || id >= t->n_vocab) return 0;
    outbuf o = {out, out ? cap : 0, 0};
    uint16_t a = t->attr[id];
    const char *s = t->st.blob + t->st.off[id];
    size_t n = t->st.len[id];
    if (!special && (a & (ATTR_UNKNOWN | ATTR_CONTROL))) return 0;
    if (a & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) {
        put(&o, s, n);
    } else if (a & ATTR_NORMAL) {
        if (t->type == TOK_BPE && !t->gemma4) {
            bpe_decode(s, n, &o);
        } else {
            for (size_t i = 0; i < n; i++) { /* U+2581 back to a space */
                if (i + 2 < n && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    put(&o, " ", 1);
                    i += 2;
                } else {
                    put(&o, s + i, 1);
                }
            }
        }
    } else if (a & ATTR_BYTE) {
        char c = (char)byte_token_value(s, n);
        put(&o, &c, 1);
    }
    return o.n;
}

/* ---- accessors -------------------------------------------------------------------------------- */

int tl_tokenizer_n_vocab(const tl_tokenizer *t) { return t ? t->n_vocab : 0; }
int tl_tokenizer_has_vocab(const tl_tokenizer *t) { return t && t->type != TOK_NONE; }
int32_t tl_tokenizer_bos(const tl_tokenizer *t) { return t ? t->bos : -1; }
int32_t tl_tokenizer_eos(const tl_tokenizer *t) { return t ? t->eos : -1; }
int32_t tl_tokenizer_eot(const tl_tokenizer *t) { return t ? t->eot : -1; }
int tl_tokenizer_add_bos(const tl_tokenizer *t) { return t && t->add_bos && t->bos >= 0; }
int tl_tokenizer_add_eos(const tl_tokenizer *t) { return t && t->add_eos && t->eos >= 0; }
int tl_tokenizer_add_eos_key(const tl_tokenizer *t) { return t && t->add_eos; }
int tl_tokenizer_add_sep(const tl_tokenizer *t) { return t && t->add_sep && t->sep >= 0; }
int32_t tl_tokenizer_sep(const tl_tokenizer *t) { return t ? t->sep : -1; }

int tl_tokenizer_is_eog(const tl_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && (t->attr[id] & ATTR_EOG);
}

int tl_tokenizer_is_control(const tl_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && (t->attr[id] & ATTR_CONTROL);
}

const char *tl_tokenizer_text(const tl_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    return t->st.blob + t->st.off[id];
}

const char *tl_tokenizer_model_name(const tl_tokenizer *t) { return t ? t->model_name : ""; }
const char *tl_tokenizer_pre_name(const tl_tokenizer *t) { return t && t->pre_name ? t->pre_name : ""; }

const char *tl_supported_tokenizers(void) {
    return "gpt2 (byte-level BPE, llama.cpp's pre-tokenizers), gemma4 (BPE over UTF-8), "
           "llama (SentencePiece-style), bert (WordPiece)";
}
