/* cli/quantize: `tokenloop quantize`, converting a GGUF model's weights to
 * another type. Owns the choice of each tensor's type (llama.cpp's
 * llama-quantize rules, so files match what it makes), the threaded row
 * conversion and the write-to-temporary-then-rename of the output.
 * Uses the internal headers (gguf, quant, threadpool, gguf_write). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "load/gguf.h"
#include "load/gguf_write.h"
#include "quant/quant.h"
#include "forward/threadpool.h"
#include "base/util.h"

#define SLAB_BYTES ((size_t)32 << 20) /* output bytes converted per slab */
#define MAX_NAME 64

static const char QUANTIZE_HELP[] =
    "usage: tokenloop quantize [--pure] [-t N] IN.gguf OUT.gguf TYPE\n"
    "\n"
    "  TYPE        Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q2_K Q3_K_S Q3_K_M Q3_K_L Q4_K_S\n"
    "              Q4_K_M Q5_K_S Q5_K_M Q6_K IQ4_NL IQ4_XS F16 BF16 F32, or\n"
    "              MXFP4_MOE (mixture-of-experts tensors MXFP4, the rest Q8_0);\n"
    "              Q3_K, Q4_K and Q5_K are llama-quantize's aliases of the _M mixes\n"
    "  --pure      every quantizable tensor gets TYPE's base type (no Q6_K\n"
    "              output matrix, no _S/_M mixture); shapes a type cannot hold\n"
    "              still fall back\n"
    "  -t, --threads N  threads (default: all online CPUs)\n"
    "\n"
    "Chooses tensor types as llama.cpp's llama-quantize does: 2-D weights are\n"
    "converted (norms and 1-D tensors are copied), the output matrix (or the\n"
    "tied token embedding) gets Q6_K unless TYPE is Q8_0/F16/BF16/F32, the\n"
    "mixes give attn_v, ffn_down and attn_output tensors more bits as\n"
    "llama-quantize's do, and rows a type cannot hold fall back to a\n"
    "32-element type or F16. Already quantized inputs are dequantized first.\n"
    "OUT is written to OUT.tmp and renamed when complete. An importance matrix\n"
    "(llama-quantize's --imatrix) is out of scope: no type here needs one.\n";

/* TYPE names and llama.cpp's LLAMA_FTYPE for each (Q3_K, Q4_K, Q5_K: the _M
 * mixes, llama-quantize's aliases). */
static const struct qtype_entry {
    const char *name;
    tl_type type;
    uint32_t ftype;
} QTYPES[] = {
    {"F32", TL_F32, 0},   {"F16", TL_F16, 1},   {"Q4_0", TL_Q4_0, 2}, {"Q4_1", TL_Q4_1, 3},
    {"Q8_0", TL_Q8_0, 7}, {"Q5_0", TL_Q5_0, 8}, {"Q5_1", TL_Q5_1, 9}, {"Q2_K", TL_Q2_K, 10},
    {"Q3_K", TL_Q3_K, 12}, {"Q3_K_S", TL_Q3_K, 11}, {"Q3_K_M", TL_Q3_K, 12}, {"Q3_K_L", TL_Q3_K, 13},
    {"Q4_K", TL_Q4_K, 15}, {"Q4_K_S", TL_Q4_K, 14}, {"Q4_K_M", TL_Q4_K, 15}, {"Q5_K", TL_Q5_K, 17},
    {"Q5_K_S", TL_Q5_K, 16}, {"Q5_K_M", TL_Q5_K, 17}, {"Q6_K", TL_Q6_K, 18}, {"BF16", TL_BF16, 32},
    {"MXFP4_MOE", TL_MXFP4, 38}, {"IQ4_NL", TL_IQ4_NL, 25}, {"IQ4_XS", TL_IQ4_XS, 30},
};
#define FTYPE_IQ4_NL 25
#define FTYPE_IQ4_XS 30
#define FTYPE_Q2_K 10
#define FTYPE_Q3_K_S 11
#define FTYPE_Q3_K_M 12
#define FTYPE_Q3_K_L 13
#define FTYPE_Q4_K_S 14
#define FTYPE_Q4_K_M 15
#define FTYPE_Q5_K_M 17
#define FTYPE_MXFP4_MOE 38

typedef enum category {
    CAT_OTHER, CAT_TOKEN_EMBD, CAT_OUTPUT, CAT_ATTN_V, CAT_FFN_DOWN, CAT_ATTN_K, CAT_ATTN_OUT,
} category;

/* One tensor of the plan, in llama.cpp's processing order. */
typedef struct plan_item {
    const tl_gguf_tensor *t;
    char name[MAX_NAME];
    int layer; /* from "blk.N.", -1 for the others */
    tl_type dst;
} plan_item;

typedef struct qopts {
    const char *in, *out;
    const struct qtype_entry *target;
    int pure, n_threads;
} qopts;

/* ---- which type each tensor gets ----------------------------------------- */

static int is_quantized(tl_type t) { return t != TL_F32 && t != TL_F16 && t != TL_BF16; }

static int64_t blck(tl_type t) { return tl_type_info((uint32_t)t)->block_size; }

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* llama.cpp's tensor_allows_quantization, for the tensors of text models. */
static int allows_quantization(const plan_item *p) {
    int nd = 1;
    for (int d = 1; d < 4; d++)
        if (p->t->ne[d] > 1) nd = d + 1;
    if (nd < 2 || !ends_with(p->name, "weight")) return 0;
    static const char *const keep[] = {
        "_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj",
        "ssm_conv1d", "shortconv.conv.weight", "attn_rel_b.weight", ".position_embd",
        ".rel_pos", ".patch_embd", ".patch_merger",
    };
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        if (strstr(p->name, keep[i])) return 0;
    return strcmp(p->name, "position_embd.weight") && strcmp(p->name, "token_types.weight");
}

static category get_category(const char *name) {
    if (!strcmp(name, "output.weight")) return CAT_OUTPUT;
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "per_layer_token_embd.weight"))
        return CAT_TOKEN_EMBD;
    if (strstr(name, "attn_qkv.weight") || strstr(name, "attn_kv_b.weight") || strstr(name, "attn_v.weight"))
        return CAT_ATTN_V;
    if (strstr(name, "attn_k.weight")) return CAT_ATTN_K;
    if (strstr(name, "attn_output.weight")) return CAT_ATTN_OUT;
    /* attn_q, ffn_up/gate: no rule for the types offered here. */
    if (strstr(name, "attn_q.weight") || strstr(name, "ffn_up") || strstr(name, "ffn_gate")) return CAT_OTHER;
    if (strstr(name, "ffn_down")) return CAT_FFN_DOWN;
    return CAT_OTHER;
}

/* State llama.cpp carries across tensors while choosing types. */
typedef struct mix_state {
    int tied;      /* no output.weight: token_embd is the output matrix */
    int n_layer;
    int n_gqa;     /* query heads per KV head (1 if the metadata does not say) */
    int n_expert;  /* 8: Mixtral's rules; above 1, ffn_down's layer is read from its name */
    int is_70b;    /* llama.cpp's LLM_TYPE_70B (80 layers of llama with grouped KV heads, or of qwen2) */
    int n_attn_v;  /* the attn_v-like tensors of the file */
    int i_attn_v, i_ffn_down;
} mix_state;

/* llama.cpp's use_more_bits: the first and last eighth of n, and every
 * third index between. */
static int more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* llama_tensor_get_type_impl for our ftypes (no Falcon rules): the output
 * matrix gets Q6_K (Q8_0 if its rows do not fit the target's blocks); the
 * mixes raise attn_v, ffn_down and attn_output as below; an 8-expert model
 * keeps attn_k/attn_v in Q8_0. */
static tl_type mixture(mix_state *s, const plan_item *p, tl_type t, uint32_t ftype) {
    category c = get_category(p->name);
    if (ftype == FTYPE_MXFP4_MOE) /* experts (3-D) MXFP4, everything else Q8_0 */
        return p->t->ne[2] > 1 ? TL_MXFP4 : TL_Q8_0;
    if (c == CAT_OUTPUT || (s->tied && c == CAT_TOKEN_EMBD)) {
        if (p->t->ne[0] % blck(t)) return TL_Q8_0;
        return t == TL_Q8_0 ? t : TL_Q6_K;
    }
    const int iq4 = ftype == FTYPE_IQ4_NL || ftype == FTYPE_IQ4_XS;
    const int km = ftype == FTYPE_Q4_K_M || ftype == FTYPE_Q5_K_M;
    if (c == CAT_ATTN_V) {
        if (ftype == FTYPE_Q2_K) t = s->n_gqa >= 4 ? TL_Q4_K : TL_Q3_K;
        else if (ftype == FTYPE_Q3_K_M) t = s->i_attn_v < 2 ? TL_Q5_K : TL_Q4_K;
        else if (ftype == FTYPE_Q3_K_L) t = TL_Q5_K;
        else if (iq4 && s->n_gqa >= 4) t = TL_Q5_K;
        else if (km && more_bits(s->i_attn_v, s->n_attn_v)) t = TL_Q6_K;
        else if (ftype == FTYPE_Q4_K_S && s->i_attn_v < 4) t = TL_Q5_K;
        if (s->is_70b && (t == TL_Q3_K || t == TL_Q4_K)) t = TL_Q5_K; /* 8 query heads share each attn_v row */
        if (s->n_expert == 8) t = TL_Q8_0;
        s->i_attn_v++;
    } else if (c == CAT_ATTN_K) {
        if (s->n_expert == 8) t = TL_Q8_0;
    } else if (c == CAT_ATTN_OUT) {
        if (s->n_expert == 8) {
            if (iq4 || ftype == FTYPE_Q2_K || ftype == FTYPE_Q3_K_S || ftype == FTYPE_Q3_K_M ||
                ftype == FTYPE_Q4_K_S || ftype == FTYPE_Q4_K_M)
                t = TL_Q5_K;
        } else if (ftype == FTYPE_Q2_K) {
            t = TL_Q3_K;
        } else if (ftype == FTYPE_Q3_K_M) {
            t = TL_Q4_K;
        } else if (ftype == FTYPE_Q3_K_L) {
            t = TL_Q5_K;
        }
    } else if (c == CAT_FFN_DOWN) {
        /* a mixture's experts are not in layer order among the ffn_down
         * tensors: llama.cpp takes the layer from the name there */
        const int i = s->n_expert > 1 ? p->layer : s->i_ffn_down, n = s->n_layer;
        if (ftype == FTYPE_Q2_K) t = TL_Q3_K;
        else if (ftype == FTYPE_Q3_K_M) t = i < n / 16 ? TL_Q5_K : TL_Q4_K;
        else if (ftype == FTYPE_Q3_K_L) t = TL_Q5_K;
        else if (km && more_bits(i, n)) t = TL_Q6_K;
        else if (iq4 && i < n / 8) t = TL_Q5_K; /* no importance matrix */
        else if (ftype == FTYPE_Q4_K_S && i < n / 8) t = TL_Q5_K;
        s->i_ffn_down++;
    }
    return t;
}

/* llama.cpp's tensor_type_fallback: rows that are no whole number of blocks. */
static tl_type fallback(tl_type t, int64_t ncols) {
    if (ncols % blck(t) == 0) return t;
    switch (t) {
    case TL_Q2_K:
    case TL_Q3_K: t = TL_Q4_0; break;
    case TL_Q4_K: t = TL_Q5_0; break;
    case TL_Q5_K: t = TL_Q5_1; break;
    case TL_Q6_K: t = TL_Q8_0; break;
    case TL_IQ4_XS: t = TL_IQ4_NL; break;
    default: break;
    }
    return ncols % blck(t) ? TL_F16 : t;
}

static tl_type choose_type(mix_state *s, const plan_item *p, const qopts *o) {
    if (!allows_quantization(p)) return (tl_type)p->t->type;
    tl_type t = o->target->type;
    if (!is_quantized(t)) return t; /* llama.cpp: no mixture, no fallback */
    if (!o->pure) t = mixture(s, p, t, o->target->ftype);
    return fallback(t, p->t->ne[0]);
}

/* ---- the plan: llama.cpp's order (by layer, then name) ---------------------- */

static int parse_layer(const char *name) {
    int layer = -1;
    if (sscanf(name, "blk.%d.", &layer) != 1) return -1;
    return layer;
}

static int cmp_item(const void *a, const void *b) {
    const plan_item *x = a, *y = b;
    if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int make_plan(const tl_gguf *g, const qopts *o, plan_item **out, tl_error *err) {
    plan_item *items = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *items);
    if (!items) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    mix_state s = {.tied = 1, .n_gqa = 1};
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        plan_item *p = &items[i];
        p->t = &g->tensors[i];
        /* gguf.c limits names to 63 bytes, as ggml does. */
        snprintf(p->name, sizeof p->name, "%.*s", (int)p->t->name.len, p->t->name.ptr);
        p->layer = parse_layer(p->name);
        if (!strcmp(p->name, "output.weight")) s.tied = 0;
        if (get_category(p->name) == CAT_ATTN_V) s.n_attn_v++;
        if (p->layer + 1 > s.n_layer) s.n_layer = p->layer + 1;
    }
    int64_t n_layer;
    tl_str a;
    if (tl_gguf_get_str(g, "general.architecture", &a) == 1) {
        char key[128];
        snprintf(key, sizeof key, "%.*s.block_count", (int)(a.len < 64 ? a.len : 64), a.ptr);
        if (tl_gguf_get_int(g, key, &n_layer) == 1 && n_layer > 0 && n_layer < (1 << 20))
            s.n_layer = (int)n_layer;
        int64_t nh = 0, nkv = 0, ne = 0;
        snprintf(key, sizeof key, "%.*s.attention.head_count", (int)(a.len < 64 ? a.len : 64), a.ptr);
        (void)tl_gguf_get_int(g, key, &nh);
        snprintf(key, sizeof key, "%.*s.attention.head_count_kv", (int)(a.len < 64 ? a.len : 64), a.ptr);
        if (tl_gguf_get_int(g, key, &nkv) != 1) nkv = nh;
        s.n_gqa = nh > 0 && nkv > 0 ? (int)(nh / nkv) : 1;
        snprintf(key, sizeof key, "%.*s.expert_count", (int)(a.len < 64 ? a.len : 64), a.ptr);
        if (tl_gguf_get_int(g, key, &ne) == 1 && ne > 0 && ne < (1 << 20)) s.n_expert = (int)ne;
        if (s.n_layer == 80 && ((tl_str_eq(a, "llama") && nh != nkv) || tl_str_eq(a, "qwen2"))) s.is_70b = 1;
    }
    qsort(items, g->n_tensors, sizeof *items, cmp_item);
    for (uint64_t i = 0; i < g->n_tensors; i++) items[i].dst = choose_type(&s, &items[i], o);
    *out = items;
    return TL_OK;
}

/* ---- conversion ------------------------------------------------------------ */

typedef struct conv_job {
    const uint8_t *src; /* first row of the slab */
    uint8_t *dst;
    tl_type st, dt;
    int64_t ncols, nrows;
    size_t src_row, dst_row;
    float *scratch; /* ncols floats per thread */
} conv_job;

static void conv_rows(void *arg, int ith, int nth) {
    const conv_job *j = arg;
    int64_t lo, hi;
    tl_split(j->nrows, ith, nth, &lo, &hi);
    float *f = j->scratch + (size_t)ith * (size_t)j->ncols;
    for (int64_t r = lo; r < hi; r++) {
        const uint8_t *s = j->src + (size_t)r * j->src_row;
        /* Unsupported pairs were refused before any thread started. */
        (void)tl_dequantize_row(j->st, s, f, j->ncols);
        (void)tl_quantize_row(j->dt, f, j->dst + (size_t)r * j->dst_row, j->ncols);
    }
}

typedef struct conv_bufs {
    uint8_t *dst;
    size_t dst_cap;
    float *scratch;
    size_t scratch_cap; /* floats */
} conv_bufs;

static int grow(void **p, size_t *cap, size_t need, size_t elt, tl_error *err) {
    if (need <= *cap) return TL_OK;
    void *n = realloc(*p, need * elt);
    if (!n) return tl_fail(err, TL_ERR_NOMEM, "out of memory (%zu bytes of conversion buffer)", need * elt);
    *p = n;
    *cap = need;
    return TL_OK;
}

/* Streams tensor p's data, converted to p->dst, into the writer. */
static int write_tensor(tl_gguf_writer *w, tl_pool *pool, const plan_item *p, conv_bufs *b, tl_error *err) {
    const tl_gguf_tensor *t = p->t;
    if ((tl_type)t->type == p->dst) return tl_gguf_writer_write(w, t->data, (size_t)t->nbytes, err);
    int64_t ncols = t->ne[0], nrows = t->ne[1] * t->ne[2] * t->ne[3];
    conv_job j = {.st = (tl_type)t->type, .dt = p->dst, .ncols = ncols,
                  .src_row = tl_row_size((tl_type)t->type, ncols), .dst_row = tl_row_size(p->dst, ncols)};
    int64_t slab = (int64_t)(SLAB_BYTES / j.dst_row);
    if (slab < 1) slab = 1;
    if (slab > nrows) slab = nrows;
    int nth = tl_pool_size(pool);
    int rc = grow((void **)&b->dst, &b->dst_cap, (size_t)slab * j.dst_row, 1, err);
    if (!rc) rc = grow((void **)&b->scratch, &b->scratch_cap, (size_t)nth * (size_t)ncols, sizeof(float), err);
    for (int64_t r0 = 0; !rc && r0 < nrows; r0 += slab) {
        j.nrows = nrows - r0 < slab ? nrows - r0 : slab;
        j.src = (const uint8_t *)t->data + (size_t)r0 * j.src_row;
        j.dst = b->dst;
        j.scratch = b->scratch;
        tl_pool_run(pool, conv_rows, &j);
        rc = tl_gguf_writer_write(w, b->dst, (size_t)j.nrows * j.dst_row, err);
    }
    return rc;
}

static void shape_str(const tl_gguf_tensor *t, char *buf, size_t cap) {
    int o = snprintf(buf, cap, "[%lld", (long long)t->ne[0]);
    for (uint32_t d = 1; d < t->n_dims && o > 0 && (size_t)o < cap; d++)
        o += snprintf(buf + o, cap - (size_t)o, ", %lld", (long long)t->ne[d]);
    if (o > 0 && (size_t)o < cap) snprintf(buf + o, cap - (size_t)o, "]");
}

static double mib(uint64_t n) { return (double)n / (1024.0 * 1024.0); }

/* Every conversion the plan needs must be possible before writing starts. */
static int check_plan(const plan_item *items, uint64_t n, tl_error *err) {
    for (uint64_t i = 0; i < n; i++) {
        const plan_item *p = &items[i];
        if ((tl_type)p->t->type == p->dst) continue;
        const tl_type_traits *s = tl_type_info(p->t->type);
        if (!s || !s->can_dequant)
            return tl_fail(err, TL_ERR_UNSUPPORTED, "tensor '%s': cannot convert from type %s", p->name,
                           s ? s->name : "?");
    }
    return TL_OK;
}

static int setup_writer(const tl_gguf *g, const qopts *o, const plan_item *items, tl_gguf_writer **out,
                        tl_error *err) {
    tl_gguf_writer *w;
    int rc = tl_gguf_writer_new(g->alignment, &w, err);
    if (rc) return rc;
    rc = tl_gguf_writer_copy_kvs(w, g, err);
    if (!rc) rc = tl_gguf_writer_set_u32(w, "general.quantization_version", 2, err);
    if (!rc) rc = tl_gguf_writer_set_u32(w, "general.file_type", o->target->ftype, err);
    /* The output is one file, whatever the input was. */
    tl_gguf_writer_remove(w, "split.no");
    tl_gguf_writer_remove(w, "split.count");
    tl_gguf_writer_remove(w, "split.tensors.count");
    for (uint64_t i = 0; !rc && i < g->n_tensors; i++)
        rc = tl_gguf_writer_add_tensor(w, items[i].name, items[i].t->n_dims, items[i].t->ne, items[i].dst, err);
    if (rc) {
        tl_gguf_writer_free(w);
        return rc;
    }
    *out = w;
    return TL_OK;
}

/* Writes every tensor to the open writer, reporting progress on stderr. */
static int write_all(tl_gguf_writer *w, tl_pool *pool, const plan_item *items, uint64_t n,
                     uint64_t *size_in, uint64_t *size_out, tl_error *err) {
    conv_bufs b = {0};
    int rc = TL_OK;
    for (uint64_t i = 0; !rc && i < n; i++) {
        const plan_item *p = &items[i];
        char shape[96];
        shape_str(p->t, shape, sizeof shape);
        uint64_t nb = tl_gguf_writer_tensor_nbytes(w, i);
        fprintf(stderr, "[%4llu/%4llu] %-32s %-16s %5s -> %-5s %9.3f MiB -> %9.3f MiB\n",
                (unsigned long long)i + 1, (unsigned long long)n, p->name, shape,
                tl_type_info(p->t->type)->name, tl_type_info(p->dst)->name, mib(p->t->nbytes), mib(nb));
        rc = write_tensor(w, pool, p, &b, err);
        *size_in += p->t->nbytes;
        *size_out += nb;
    }
    free(b.dst);
    free(b.scratch);
    return rc;
}

static int quantize_file(const qopts *o, const char *tmp, int *created, tl_error *err) {
    double t0 = tl_now();
    tl_gguf *g = NULL;
    plan_item *items = NULL;
    tl_gguf_writer *w = NULL;
    tl_pool *pool = NULL;
    uint64_t size_in = 0, size_out = 0;
    int rc = tl_gguf_open(o->in, &g, err);
    if (rc) { /* say which file: the reader's message may not */
        tl_error e = *err;
        tl_fail(err, rc, "%s: %s", o->in, e.msg);
    }
    if (!rc) rc = make_plan(g, o, &items, err);
    if (!rc) rc = check_plan(items, g->n_tensors, err);
    if (!rc) rc = setup_writer(g, o, items, &w, err);
    if (!rc) rc = tl_pool_new(o->n_threads, &pool, err);
    if (!rc) {
        *created = 1;
        rc = tl_gguf_writer_open(w, tmp, err);
    }
    if (!rc) rc = write_all(w, pool, items, g->n_tensors, &size_in, &size_out, err);
    if (!rc) rc = tl_gguf_writer_close(w, err);
    if (!rc) {
        fprintf(stderr, "quantize: %s -> %s (%s, %d threads): tensors %.2f MiB -> %.2f MiB, file %.2f MiB, %.2f s\n",
                o->in, o->out, o->target->name, o->n_threads, mib(size_in), mib(size_out),
                mib(tl_gguf_writer_file_size(w)), tl_now() - t0);
    }
    tl_pool_free(pool);
    tl_gguf_writer_free(w);
    free(items);
    tl_gguf_close(g);
    return rc;
}

/* ---- the command ------------------------------------------------------------ */

static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    if (stat(a, &sa) || stat(b, &sb)) return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

static int parse_args(int argc, char **argv, qopts *o, const char **type_name) {
    const char *pos[3];
    int n_pos = 0;
    cli_args p = cli_args_start(argc, argv);
    const char *a;
    int more;
    while ((more = cli_next(&p, &a)) > 0) {
        if (!strcmp(a, "--pure")) {
            o->pure = 1;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            const char *v = cli_arg(&p);
            if (!v || cli_int(a, v, 1, 1024, &o->n_threads)) return EXIT_USAGE;
        } else if (a[0] == '-' && a[1]) {
            cli_error("unknown option '%s' (try 'tokenloop quantize --help')", a);
            return EXIT_USAGE;
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            cli_error("too many arguments (usage: tokenloop quantize [--pure] [-t N] IN OUT TYPE)");
            return EXIT_USAGE;
        }
    }
    if (more < 0) return EXIT_USAGE;
    if (n_pos != 3) {
        cli_error("quantize needs IN.gguf OUT.gguf TYPE (try 'tokenloop quantize --help')");
        return EXIT_USAGE;
    }
    o->in = pos[0];
    o->out = pos[1];
    *type_name = pos[2];
    return 0;
}

int cmd_quantize(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(QUANTIZE_HELP, stdout);
            return 0;
        }
    qopts o = {0};
    const char *type_name = NULL;
    int rc = parse_args(argc, argv, &o, &type_name);
    if (rc) return rc;
    for (size_t i = 0; i < sizeof QTYPES / sizeof QTYPES[0]; i++)
        if (!strcasecmp(type_name, QTYPES[i].name)) o.target = &QTYPES[i];
    if (!o.target) {
        char names[256] = "";
        for (size_t i = 0; i < sizeof QTYPES / sizeof QTYPES[0]; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? " " : "", QTYPES[i].name);
        cli_error("unknown type '%s' (one of %s)", type_name, names);
        return 1;
    }
    if (!o.n_threads) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        o.n_threads = n < 1 ? 1 : n > 1024 ? 1024 : (int)n;
    }
    if (same_file(o.in, o.out)) {
        cli_error("input and output are the same file (%s)", o.out);
        return 1;
    }
    size_t tl = strlen(o.out) + 5;
    char *tmp = malloc(tl);
    if (!tmp) {
        cli_error("out of memory");
        return 1;
    }
    snprintf(tmp, tl, "%s.tmp", o.out);
    if (same_file(o.in, tmp)) {
        cli_error("input is the output's temporary file %s", tmp);
        free(tmp);
        return 1;
    }
    /* Progress piped into `head` must not kill us with OUT.tmp left behind. */
    signal(SIGPIPE, SIG_IGN);
    tl_error err = {0};
    int created = 0;
    rc = quantize_file(&o, tmp, &created, &err);
    if (!rc && rename(tmp, o.out) != 0)
        rc = tl_fail(&err, TL_ERR_IO, "cannot rename %s to %s: %s", tmp, o.out, strerror(errno));
    if (rc) {
        if (created) unlink(tmp); /* never leave a partial file behind */
        cli_tl_error(&err);
    }
    free(tmp);
    return rc ? 1 : 0;
}
