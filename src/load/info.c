/* info: tl_gguf_describe, the human-readable summary behind `tokenloop info`.
 * Reads only what tl_gguf_open validated (metadata, tensor table); knows
 * nothing of the tokenizer or models, so it works on any GGUF, vocab-only too. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load/gguf.h"
#include "quant/quant.h"
#include "tokenloop.h"
#include "base/util.h"

#define SHOW_STR 80   /* bytes of a string value shown */
#define SHOW_ARR 6    /* elements of an array shown */

/* Writes bytes with C-style escapes for anything not printable ASCII. */
static void put_escaped(FILE *out, const char *p, uint64_t len, uint64_t max) {
    uint64_t n = len < max ? len : max;
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\n') fputs("\\n", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c == '\\' || c == '"') fprintf(out, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f) fprintf(out, "\\x%02x", c);
        else fputc(c, out);
    }
    if (len > n) fprintf(out, "...");
}

static void put_str(FILE *out, tl_str s) {
    fputc('"', out);
    put_escaped(out, s.ptr, s.len, SHOW_STR);
    fputc('"', out);
    if (s.len > SHOW_STR) fprintf(out, " (%" PRIu64 " bytes)", s.len);
}

static int is_int_type(tl_gguf_type t) {
    return t <= GGUF_TYPE_INT32 || t == GGUF_TYPE_UINT64 || t == GGUF_TYPE_INT64;
}

static void put_elem(FILE *out, const tl_gguf_kv *kv, uint64_t i) {
    if (kv->arr_type == GGUF_TYPE_STRING) {
        put_str(out, kv->arr_str[i]);
    } else if (kv->arr_type == GGUF_TYPE_BOOL) {
        fputs(tl_gguf_arr_int(kv, i) ? "true" : "false", out);
    } else if (kv->arr_type == GGUF_TYPE_UINT64) {
        uint64_t v;
        memcpy(&v, kv->data + 8 * i, 8); /* host is little-endian, as GGUF */
        fprintf(out, "%" PRIu64, v);
    } else if (is_int_type(kv->arr_type)) {
        fprintf(out, "%" PRId64, tl_gguf_arr_int(kv, i));
    } else {
        fprintf(out, "%.9g", tl_gguf_arr_float(kv, i));
    }
}

static void put_value(FILE *out, const tl_gguf_kv *kv) {
    tl_gguf_kv tmp = *kv;
    if (kv->type == GGUF_TYPE_ARRAY) {
        if (kv->arr_type == GGUF_TYPE_ARRAY) {
            fprintf(out, "[%" PRIu64 " nested arrays]", kv->arr_n);
            return;
        }
        fputc('[', out);
        for (uint64_t i = 0; i < kv->arr_n && i < SHOW_ARR; i++) {
            if (i) fputs(", ", out);
            put_elem(out, kv, i);
        }
        if (kv->arr_n > SHOW_ARR) fputs(", ...", out);
        fprintf(out, "] (%" PRIu64 " %s)", kv->arr_n, tl_gguf_type_name(kv->arr_type));
        return;
    }
    if (kv->type == GGUF_TYPE_STRING) {
        tl_str s;
        memcpy(&s.len, kv->data, 8);
        s.ptr = (const char *)kv->data + 8;
        put_str(out, s);
        return;
    }
    /* a scalar reads like a one-element array of its type */
    tmp.type = GGUF_TYPE_ARRAY;
    tmp.arr_type = kv->type;
    tmp.arr_n = 1;
    put_elem(out, &tmp, 0);
}

/* Every key starting with prefix, as "  key = value". */
static void put_keys_with_prefix(FILE *out, const tl_gguf *g, const char *prefix) {
    size_t pl = strlen(prefix);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const tl_gguf_kv *kv = &g->kv[i];
        if (kv->key.len < pl || memcmp(kv->key.ptr, prefix, pl) != 0) continue;
        fputs("  ", out);
        put_escaped(out, kv->key.ptr, kv->key.len, 200);
        fputs(" = ", out);
        put_value(out, kv);
        fputc('\n', out);
    }
}

static int has_prefix(tl_str s, const char *prefix, size_t pl) {
    return s.len >= pl && memcmp(s.ptr, prefix, pl) == 0;
}

/* llama.cpp's LLAMA_FTYPE values, by the names llama-quantize (and our
 * quantize) take. */
static const char *ftype_name(int64_t t) {
    static const char *const names[] = {
        [0] = "F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [7] = "Q8_0", [8] = "Q5_0", [9] = "Q5_1",
        [10] = "Q2_K", [11] = "Q3_K_S", [12] = "Q3_K_M", [13] = "Q3_K_L", [14] = "Q4_K_S", [15] = "Q4_K_M",
        [16] = "Q5_K_S", [17] = "Q5_K_M", [18] = "Q6_K", [19] = "IQ2_XXS", [20] = "IQ2_XS", [21] = "Q2_K_S",
        [22] = "IQ3_XS", [23] = "IQ3_XXS", [24] = "IQ1_S", [25] = "IQ4_NL", [26] = "IQ3_S", [27] = "IQ3_M",
        [28] = "IQ2_S", [29] = "IQ2_M", [30] = "IQ4_XS", [31] = "IQ1_M", [32] = "BF16", [36] = "TQ1_0",
        [37] = "TQ2_0", [38] = "MXFP4_MOE",
    };
    const int64_t n = (int64_t)(sizeof names / sizeof names[0]);
    return t >= 0 && t < n && names[t] ? names[t] : "unknown";
}

/* Keys outside general.*, <arch>.* and tokenizer.*, which have their own sections. */
static void put_other_keys(FILE *out, const tl_gguf *g, const char *arch_prefix) {
    int header = 0;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const tl_gguf_kv *kv = &g->kv[i];
        if (has_prefix(kv->key, "general.", 8) || has_prefix(kv->key, "tokenizer.", 10) ||
            (arch_prefix && has_prefix(kv->key, arch_prefix, strlen(arch_prefix))))
            continue;
        if (!header++) fprintf(out, "other metadata:\n");
        fputs("  ", out);
        put_escaped(out, kv->key.ptr, kv->key.len, 200);
        fputs(" = ", out);
        put_value(out, kv);
        fputc('\n', out);
    }
}

static void put_tensors(FILE *out, const tl_gguf *g) {
    uint64_t count[TL_TYPE_COUNT] = {0}, bytes[TL_TYPE_COUNT] = {0};
    uint64_t params = 0, total = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tl_gguf_tensor *t = &g->tensors[i];
        uint64_t n = 1;
        for (int d = 0; d < 4; d++) n *= (uint64_t)t->ne[d]; /* validated: no overflow */
        params += n;
        total += t->nbytes;
        if (t->type >= TL_TYPE_COUNT) continue; /* cannot happen: open checked the type */
        count[t->type]++;
        bytes[t->type] += t->nbytes;
    }
    fprintf(out, "tensors: %" PRIu64 " (%" PRIu64 " bytes of data, data section at byte %" PRIu64
                 ", alignment %" PRIu64 ")\n",
            g->n_tensors, total, g->data_offset, g->alignment);
    if (!g->n_tensors) return;
    fprintf(out, "parameters: %" PRIu64 " (%.2f M)\n", params, (double)params / 1e6);
    fprintf(out, "tensor types:\n");
    for (uint32_t t = 0; t < TL_TYPE_COUNT; t++) {
        if (!count[t]) continue;
        const tl_type_traits *tt = tl_type_info(t);
        fprintf(out, "  %-6s %5" PRIu64 " tensors, %12" PRIu64 " bytes\n", tt ? tt->name : "?",
                count[t], bytes[t]);
    }
}

static void put_opt_str(FILE *out, const tl_gguf *g, const char *label, const char *key) {
    tl_str s;
    int r = tl_gguf_get_str(g, key, &s);
    fprintf(out, "%s: ", label);
    if (r == 1) put_str(out, s);
    else fputs(r == 0 ? "(none)" : "(not a string)", out);
    fputc('\n', out);
}

/* Every tokenizer.ggml.*_token_id, with the token's text when in range. */
static void put_special_tokens(FILE *out, const tl_gguf *g, const tl_gguf_kv *tokens) {
    const char *pre = "tokenizer.ggml.", *suf = "_token_id";
    size_t pl = strlen(pre), sl = strlen(suf);
    fprintf(out, "special tokens:\n");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const tl_gguf_kv *kv = &g->kv[i];
        tl_str k = kv->key;
        if (k.len <= pl + sl || memcmp(k.ptr, pre, pl) != 0 ||
            memcmp(k.ptr + k.len - sl, suf, sl) != 0)
            continue;
        fputs("  ", out);
        put_escaped(out, k.ptr + pl, k.len - pl - sl, 64);
        fputs(" = ", out);
        put_value(out, kv);
        int64_t id;
        int ok;
        tl_gguf_kv one = *kv;
        one.type = GGUF_TYPE_ARRAY;
        one.arr_type = kv->type;
        one.arr_n = 1;
        ok = is_int_type(kv->type);
        id = ok ? tl_gguf_arr_int(&one, 0) : -1;
        if (ok && tokens && id >= 0 && (uint64_t)id < tokens->arr_n) {
            fputc(' ', out);
            put_str(out, tokens->arr_str[id]);
        }
        fputc('\n', out);
    }
}

static void put_bool_key(FILE *out, const tl_gguf *g, const char *label, const char *key) {
    int b = 0, r = tl_gguf_get_bool(g, key, &b);
    fprintf(out, "%s: %s\n", label, r == 1 ? (b ? "true" : "false") : r == 0 ? "(unset)" : "(not a bool)");
}

static void put_vocab(FILE *out, const tl_gguf *g) {
    const tl_gguf_kv *tokens = tl_gguf_find(g, "tokenizer.ggml.tokens");
    const tl_gguf_kv *merges = tl_gguf_find(g, "tokenizer.ggml.merges");
    if (tokens && (tokens->type != GGUF_TYPE_ARRAY || tokens->arr_type != GGUF_TYPE_STRING))
        tokens = NULL;
    fprintf(out, "vocabulary:\n");
    put_opt_str(out, g, "tokenizer model", "tokenizer.ggml.model");
    put_opt_str(out, g, "pre-tokenizer", "tokenizer.ggml.pre");
    if (tokens) fprintf(out, "vocab size: %" PRIu64 "\n", tokens->arr_n);
    else fprintf(out, "vocab size: (no tokenizer.ggml.tokens)\n");
    if (merges && merges->type == GGUF_TYPE_ARRAY)
        fprintf(out, "merges: %" PRIu64 "\n", merges->arr_n);
    else
        fprintf(out, "merges: (none)\n");
    put_special_tokens(out, g, tokens);
    put_bool_key(out, g, "add_bos", "tokenizer.ggml.add_bos_token");
    put_bool_key(out, g, "add_eos", "tokenizer.ggml.add_eos_token");
    tl_str tmpl;
    if (tl_gguf_get_str(g, "tokenizer.chat_template", &tmpl) == 1)
        fprintf(out, "chat template: yes (%" PRIu64 " bytes)\n", tmpl.len);
    else
        fprintf(out, "chat template: no\n");
}

int tl_gguf_describe(const char *path, FILE *out, tl_error *err) {
    if (!path || !out) return tl_fail(err, TL_ERR_ARG, "tl_gguf_describe: NULL argument");
    tl_gguf *g = NULL;
    int rc = tl_gguf_open(path, &g, err);
    if (rc) return rc;
    tl_str arch = {0};
    int has_arch = tl_gguf_get_str(g, "general.architecture", &arch) == 1;
    fprintf(out, "file: %s\n", path);
    fprintf(out, "file size: %" PRIu64 " bytes (%.2f MiB)\n", g->file_size,
            (double)g->file_size / (1024.0 * 1024.0));
    fprintf(out, "GGUF version: %u\n", g->version);
    fprintf(out, "metadata entries: %" PRIu64 "\n", g->n_kv);
    fprintf(out, "architecture: ");
    if (has_arch) put_escaped(out, arch.ptr, arch.len, SHOW_STR);
    else fputs("(none)", out);
    fputc('\n', out);
    put_opt_str(out, g, "name", "general.name");
    int64_t ftype;
    if (tl_gguf_get_int(g, "general.file_type", &ftype) == 1)
        fprintf(out, "file type: %s (general.file_type %lld)\n", ftype_name(ftype), (long long)ftype);
    fprintf(out, "general:\n");
    put_keys_with_prefix(out, g, "general.");
    char prefix[208];
    int use_prefix = has_arch && arch.len > 0 && arch.len < 200 && !memchr(arch.ptr, 0, arch.len);
    if (use_prefix) {
        memcpy(prefix, arch.ptr, arch.len);
        memcpy(prefix + arch.len, ".", 2);
        fprintf(out, "hyperparameters:\n");
        put_keys_with_prefix(out, g, prefix);
    }
    put_other_keys(out, g, use_prefix ? prefix : NULL);
    put_tensors(out, g);
    put_vocab(out, g);
    tl_gguf_close(g);
    if (fflush(out) != 0 || ferror(out)) return tl_fail(err, TL_ERR_IO, "cannot write the description");
    return TL_OK;
}
