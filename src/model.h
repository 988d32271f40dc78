/* model: the architecture table and a loaded model. Reads every hyperparameter
 * from the GGUF metadata, binds each weight to its tensor in the mapping, and
 * checks shapes and types before anything runs. Weights are immutable; all
 * mutable state lives in a tl_ctx (forward.h). */
#ifndef TL_MODEL_H
#define TL_MODEL_H

#include "gguf.h"
#include "quant.h"
#include "tokenizer.h"

typedef enum tl_arch {
    TL_ARCH_NONE = 0, /* vocabulary-only file */
    TL_ARCH_LLAMA,
} tl_arch;

/* Per-architecture switches: an architecture is a row of these. */
typedef struct tl_arch_info {
    const char *name; /* general.architecture */
    tl_arch arch;
    int rope_neox;    /* 1: rotate halves (NeoX); 0: adjacent pairs */
} tl_arch_info;

typedef struct tl_hparams {
    int n_embd;       /* d: width of the residual stream */
    int n_layer;
    int n_head;
    int n_head_kv;
    int head_dim;     /* per-head width of q and k (and v) */
    int n_ff;         /* feed-forward width */
    int n_vocab;      /* rows of the output projection */
    int n_ctx_train;
    int n_rot;        /* RoPE dimensions per head (<= head_dim) */
    float rope_base;
    float norm_eps;
} tl_hparams;

/* A weight: the tensor in the mapping. Matrices are [rows = ne[1]] x
 * [cols = ne[0]] with each row stored contiguously in its type. */
typedef const tl_gguf_tensor *tl_w;

typedef struct tl_layer {
    tl_w attn_norm;              /* [d] f32 */
    tl_w wq, wk, wv;             /* [n_head*hd, d], [n_head_kv*hd, d] x2 */
    tl_w wo;                     /* [d, n_head*hd] */
    tl_w ffn_norm;               /* [d] f32 */
    tl_w w_gate, w_up, w_down;   /* [ff, d] x2, [d, ff] */
} tl_layer;

struct tl_model {
    tl_gguf *gguf;
    tl_tokenizer *tok;
    const tl_arch_info *arch; /* NULL for vocabulary-only */
    tl_hparams hp;
    tl_layer *layers;         /* n_layer */
    tl_w tok_embd;            /* [n_vocab, d] any dequantizable type */
    tl_w output_norm;         /* [d] f32 */
    tl_w output;              /* [n_vocab, d]; == tok_embd when tied */
    char *chat_template;      /* NUL-terminated copy, or NULL */
};

#endif
