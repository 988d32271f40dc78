/* model: the architecture table and a loaded model. Reads every hyperparameter
 * from the GGUF metadata, binds each weight to its tensor in the mapping, and
 * checks shapes and types before anything runs. Weights are immutable; all
 * mutable state lives in a tl_ctx (forward.h). */
#ifndef TL_MODEL_H
#define TL_MODEL_H

#include <pthread.h>

#include "load/gguf.h"
#include "quant/quant.h"
#include "tokenize/tokenizer.h"

typedef enum tl_arch {
    TL_ARCH_NONE = 0, /* vocabulary-only file */
    TL_ARCH_LLAMA,
    TL_ARCH_GEMMA3,
    TL_ARCH_QWEN2,
    TL_ARCH_QWEN3,
    TL_ARCH_PHI3,
    TL_ARCH_QWEN3MOE,
    TL_ARCH_QWEN2MOE,
    TL_ARCH_GPTOSS,
    TL_ARCH_QWEN35,
    TL_ARCH_QWEN35MOE,
    TL_ARCH_GEMMA4,
    TL_ARCH_BERT,       /* encoders: embeddings only (tl_ctx_embed), no logits */
    TL_ARCH_NOMIC_BERT,
} tl_arch;

#define TL_MAX_EXPERT_USED 512 /* llama.cpp's LLAMA_MAX_EXPERTS: no array here is sized by it */

typedef enum tl_ffn_act {
    TL_ACT_SILU = 0, /* SwiGLU: silu(gate) * up */
    TL_ACT_GELU,     /* GeGLU: gelu(gate) * up, through ggml's f16 lookup table */
    TL_ACT_SWIGLU_OAI, /* gpt-oss: gate clamped above, up clamped both ways, gate*sigmoid(1.702 gate)*(up+1) */
    TL_ACT_GELU_SEQ,   /* BERT: gelu(up x + b), no gate, through ggml's f16 table */
} tl_ffn_act;

/* How a mixture of experts weighs its experts from the router's logits. */
typedef enum tl_gating {
    TL_GATE_SOFTMAX = 0,    /* softmax over every expert, then the top k (Qwen, Mixtral) */
    TL_GATE_SOFTMAX_CHOSEN, /* the top k logits, then softmax over those alone (gpt-oss) */
} tl_gating;

/* Per-architecture switches: an architecture is a row of these. */
typedef struct tl_arch_info {
    const char *name; /* general.architecture */
    tl_arch arch;
    int rope_neox;    /* 1: rotate halves (NeoX); 0: adjacent pairs */
    int embd_scale;   /* 1: embeddings multiplied by sqrtf(d) (Gemma) */
    int sandwich;     /* 1: RMSNorm also after attention and FFN (post_*_norm) */
    int qk_norm;      /* 1: per-head RMSNorm of q and k before RoPE */
    tl_ffn_act act;
    int q_prescale;   /* 1: q scaled by 1/sqrt(hd) before the f16 rounding, scores
                       * unscaled (Gemma, Phi-3); 0: scores scaled after the dot */
    int swa_pattern;  /* default sliding-window pattern: every n-th layer global
                       * (0: no sliding window unless the metadata says so) */
    int qkv_bias;     /* 1: attn_{q,k,v}.bias added to the projections (Qwen2) */
    int fused;        /* 1: attn_qkv holds q, k, v rows and ffn_up holds gate
                       * then up rows (Phi-3); bound as views, run as separate */
    int moe;          /* 0: dense only; 1: experts when <arch>.expert_count says so
                       * (llama: Mixtral); 2: always experts */
    int hybrid;       /* 1: Gated DeltaNet layers between full-attention ones, whose q
                       * carries an output gate (Qwen3.5/3.6) */
} tl_arch_info;

/* RoPE scaling (<arch>.rope.scaling.type), as llama.cpp reads it. */
typedef enum tl_rope_scaling {
    TL_ROPE_SCALING_NONE = 0,
    TL_ROPE_SCALING_LINEAR, /* positions times freq_scale (the default type when a factor is given) */
    TL_ROPE_SCALING_YARN,   /* YaRN: interpolation and extrapolation mixed by dimension, cos/sin scaled */
} tl_rope_scaling;

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
    float rope_base_swa; /* RoPE base of sliding-window layers */
    tl_rope_scaling rope_scaling;
    float rope_freq_scale;     /* theta multiplier: 1/rope.scaling.factor (1: none) */
    float rope_freq_scale_swa; /* the same for sliding-window layers */
    int rope_n_ctx_orig;       /* rope.scaling.original_context_length (YaRN's corr dims) */
    float yarn_ext_factor;     /* 1 with YaRN, else 0 (no extrapolation mix) */
    float yarn_attn_factor;    /* cos and sin multiplied by this (llama.cpp's cparams
                                * value: its mscale over YaRN's own, times rope.scaling.attn_factor) */
    float yarn_beta_fast, yarn_beta_slow; /* the corr dims' rotations: 32 and 1 */
    float norm_eps;
    int n_swa;           /* sliding window in positions (0: none) */
    float attn_scale;    /* multiplies q.k */
    float logit_softcap; /* 0: none */
    int n_expert;        /* experts of each MoE block (0: a dense model) */
    int n_expert_used;   /* experts each token is routed to */
    int n_ff_exp;        /* one expert's feed-forward width */
    int n_ff_shexp;      /* the shared expert's width (qwen2moe), or 0 */
    int n_kv_layer;      /* layers with keys and values in the cache (attention blocks) */
    /* Gated DeltaNet (hybrids): ssm.* keys */
    int n_rec_layer;     /* layers with a recurrent state */
    int ssm_d_conv;      /* the causal convolution's width (ssm.conv_kernel) */
    int ssm_d_state;     /* a head's key and value size (ssm.state_size) */
    int ssm_n_kh;        /* key (and query) heads (ssm.group_count) */
    int ssm_n_vh;        /* value heads (ssm.time_step_rank), a multiple of ssm_n_kh */
    /* Attention shapes that differ by layer (Gemma 4: sliding-window layers
     * have their own head size, KV heads and rotary width); the blocks carry
     * their own (tl_attn_block.hd ...), these are the widest, for buffers */
    int head_dim_swa;    /* attention.key_length_swa (default head_dim) */
    int n_rot_swa;       /* rope.dimension_count_swa (default n_rot) */
    int head_dim_max, q_dim_max, kv_dim_max;
    int n_embd_pl;       /* Gemma 4's per-layer input width (embedding_length_per_layer_input), or 0 */
    int pooling;         /* pooling_type (tl_pooling), TL_POOL_MEAN when absent */
    int causal;          /* 0: every token attends to its whole sequence in the call (BERT's
                          * attention.causal false): an encoder, embeddings only */
    int n_cls_labels;    /* classifier.output_labels' count (llama.cpp's n_cls_out), 1 when absent */
} tl_hparams;

/* A weight: the tensor in the mapping. Matrices are [rows = ne[1]] x
 * [cols = ne[0]] with each row stored contiguously in its type. */
typedef const tl_gguf_tensor *tl_w;

/* Rows of w as a matrix: experts' 3-D tensors stack their slices' rows. */
static inline int64_t tl_w_rows(tl_w w) { return w->ne[1] * w->ne[2] * w->ne[3]; }

/* A layer is a list of typed blocks, each reading the residual stream and
 * adding its output back, run in order. New families add kinds of blocks
 * (experts, recurrent state) rather than fields every layer carries. */
typedef enum tl_block_kind {
    TL_BLOCK_ATTN = 1, /* self-attention over the sequence's cached keys and values */
    TL_BLOCK_FFN,      /* dense gated feed-forward */
    TL_BLOCK_MOE,      /* a router choosing k of n gated feed-forward experts per token */
    TL_BLOCK_GDN,      /* Gated DeltaNet: linear attention over a recurrent state per sequence */
    TL_BLOCK_PLE,      /* Gemma 4's per-layer input: a gated projection of the layer's slice of
                        * the per-layer embeddings, added to the stream */
} tl_block_kind;

typedef struct tl_attn_block {
    tl_w norm;                   /* [d] f32, before the block */
    tl_w wq, wk, wv;             /* [n_head*hd, d], [n_head_kv*hd, d] x2 */
    tl_w wo;                     /* [d, n_head*hd] */
    tl_w q_norm, k_norm;         /* [hd] f32: per-head RMSNorm of q and k before RoPE, or NULL */
    tl_w post_norm;              /* [d] f32: RMSNorm of the output before the residual add, or NULL */
    tl_w bq, bk, bv;             /* [q_dim], [kv_dim] x2 f32, or NULL */
    tl_w bo;                     /* [d] f32 bias of the output projection, or NULL (gpt-oss) */
    tl_w sinks;                  /* [n_head] f32: a per-head logit in every softmax's denominator
                                  * that weighs no value (gpt-oss), or NULL */
    int kv_layer;                /* which of the KV cache's layers holds its keys and values */
    int swa;                     /* 1: attends to a sliding window of hparams.n_swa positions */
    int q_gate;                  /* 1: wq's rows hold per head q then a gate of the same size, and
                                  * the attention's output is multiplied by sigmoid(gate) (Qwen3.5) */
    int hd, n_head, n_head_kv;   /* its head size and heads (Gemma 4's differ by layer) */
    int n_rot;                   /* rotary dimensions per head */
    int kv_shared;               /* 1: no keys or values of its own: it reads kv_layer, which an
                                  * earlier layer writes (Gemma 4's last layers); wk, wv NULL */
    int v_norm;                  /* 1: v RMS-normalised without a weight before the cache; v = k's
                                  * projection when wv is NULL (Gemma 4) */
    tl_w ln, ln_b;               /* [d] f32 x2: BERT's post-norm, x = LayerNorm(x + out) * ln + ln_b
                                  * (norm NULL then: the block reads x itself), or NULL */
} tl_attn_block;

typedef struct tl_ffn_block {
    tl_w norm;                   /* [d] f32, before the block */
    tl_w gate, up, down;         /* [ff, d] x2, [d, ff] */
    tl_w post_norm;              /* [d] f32, or NULL */
    tl_ffn_act act;              /* act(gate) * up; TL_ACT_GELU_SEQ: gelu(up), gate NULL */
    tl_w up_b, down_b;           /* [ff], [d] f32 biases (BERT), or NULL */
    tl_w ln, ln_b;               /* [d] f32 x2: post-norm as tl_attn_block's, or NULL */
} tl_ffn_block;

/* Experts: 3-D tensors, expert e's matrix the e-th slice of ne[2] (its rows
 * contiguous, so a slice is an ordinary matrix of ne[1] rows). */
typedef struct tl_moe_block {
    tl_w norm;                   /* [d] f32, before the block */
    tl_w router;                 /* ffn_gate_inp [n_expert, d]: one logit per expert */
    tl_w router_b;               /* [n_expert] f32, or NULL (gpt-oss) */
    tl_w gate, up, down;         /* [n_ff_exp, d, n_expert] x2, [d, n_ff_exp, n_expert] */
    tl_w gate_b, up_b, down_b;   /* [n_ff_exp, n_expert] x2, [d, n_expert] f32, or NULL (gpt-oss) */
    tl_w sh_gate, sh_up, sh_down;/* a shared expert every token runs (qwen2moe), or NULL */
    tl_w sh_router;              /* ffn_gate_inp_shexp [d]: the shared expert's output times
                                  * sigmoid(this . x), or NULL */
    int sh_sigmoid;              /* that sigmoid as 1 / (1 + exp(-x)) (Qwen3.5); else silu(x) / x,
                                  * as llama.cpp's qwen2moe graph writes it */
    tl_w post_norm;              /* [d] f32, or NULL */
    /* Gemma 4: a dense GeGLU feed-forward beside the experts, each with its
     * own norms, their sum normed again; the router reads
     * RMSNorm(x) / sqrt(d) * router_s; each expert's output times down_s[e] */
    tl_w gate_up;                /* [d, 2 * n_ff_exp, n_expert]: gate then up rows per expert (fused
                                  * in the file), with gate and up NULL; or NULL */
    tl_w sh_norm, sh_post_norm;  /* the dense FFN's norms before and after (ffn_norm, post_ffw_norm_1) */
    tl_w out_norm;               /* [d] the sum's norm (post_ffw_norm), or NULL */
    tl_w router_s;               /* ffn_gate_inp.scale [d], or NULL */
    tl_w down_s;                 /* ffn_down_exps.scale [n_expert], or NULL */
    int n_expert, n_used;
    tl_gating gating;
    int norm_w;                  /* 1: the chosen weights divided by their sum */
    tl_ffn_act act;
} tl_moe_block;

/* Gated DeltaNet (llama.cpp's qwen35 graph): per token, a projection to q,
 * k, v of every head (conv_dim = 2 * n_kh * d_state + n_vh * d_state), a
 * causal convolution of width d_conv over it, SiLU, q and k L2-normalised;
 * per value head h a decay g = softplus(alpha + dt_bias) * a (a < 0) and a
 * write strength beta = sigmoid(beta); the state S (d_state x d_state per
 * value head, key head h % n_kh) decays by exp(g), takes the delta rule's
 * update beta (v - S k) k^T, and gives o = S q / sqrt(d_state); then an RMSNorm
 * of o gated by silu(z), and the output projection. */
typedef struct tl_gdn_block {
    tl_w norm;                   /* [d] f32, before the block */
    tl_w wqkv;                   /* attn_qkv [conv_dim, d] */
    tl_w wz;                     /* attn_gate [n_vh * d_state, d]: the output gate z */
    tl_w wbeta, walpha;          /* ssm_beta, ssm_alpha [n_vh, d] */
    tl_w conv;                   /* ssm_conv1d [conv_dim][d_conv] f32: oldest tap first */
    tl_w dt_bias, a;             /* [n_vh] f32 */
    tl_w ssm_norm;               /* [d_state] f32 */
    tl_w wout;                   /* ssm_out [d, n_vh * d_state] */
    int rec_layer;               /* which of the sequences' recurrent states it owns */
} tl_gdn_block;

/* Gemma 4's per-layer input: x += RMSNorm(proj (gelu(gate x) * the
 * layer's per-layer input)) * post_norm. */
typedef struct tl_ple_block {
    tl_w gate;                   /* per_layer_inp_gate [n_embd_pl, d] */
    tl_w proj;                   /* per_layer_proj [d, n_embd_pl] */
    tl_w post_norm;              /* [d] f32 */
    int layer;                   /* its slice of the per-layer inputs */
} tl_ple_block;

typedef struct tl_block {
    tl_block_kind kind;
    union {
        tl_attn_block attn;
        tl_ffn_block ffn;
        tl_moe_block moe;
        tl_gdn_block gdn;
        tl_ple_block ple;
    } u;
} tl_block;

#define TL_LAYER_MAX_BLOCKS 4
#define TL_BLOCK_MAX_W 24

typedef struct tl_layer {
    int n_block;
    tl_block block[TL_LAYER_MAX_BLOCKS];
    tl_w out_scale;              /* [1] f32: the layer's output times this (Gemma 4), or NULL */
    tl_gguf_tensor views[5];     /* fused: q, k, v of attn_qkv; gate, up of ffn_up */
} tl_layer;

/* A block's tensors (NULLs left out) into out[TL_BLOCK_MAX_W]; with
 * matmul_only, only the matrices multiplied by activations. Returns how many. */
int tl_block_weights(const tl_block *b, int matmul_only, tl_w *out);
/* 1 when cache layer l (< hp.n_kv_layer) is a sliding-window layer's: its
 * positions older than the window are never read again. */
int tl_model_kv_swa(const tl_model *m, int l);
/* Phi-3's LongRoPE factors for a context of n_ctx positions per sequence:
 * the long ones past the original context, else the short ones; NULL when
 * the file has none. Decided on the context rounded up to 256 positions, as
 * llama.cpp pads its own before choosing. */
tl_w tl_model_rope_factors(const tl_model *m, int n_ctx);

struct tl_model {
    tl_gguf *gguf;
    tl_tokenizer *tok;
    const tl_arch_info *arch; /* NULL for vocabulary-only */
    tl_hparams hp;
    tl_layer *layers;         /* n_layer */
    int *kv_dim;              /* [n_kv_layer] the width of each cached layer's keys (and values) */
    tl_w tok_embd;            /* [n_vocab, d] any dequantizable type */
    tl_w output_norm;         /* [d] f32 */
    tl_w output;              /* [n_vocab, d]; == tok_embd when tied */
    tl_w rope_freqs;          /* [n_rot/2] f32: RoPE theta divisors (Llama 3; Gemma 4's global
                               * layers, whose 1e30 divisors leave dimensions unrotated), or NULL */
    /* Phi-3's LongRoPE divisors [n_rot/2] f32, or NULL: the long ones when a
     * sequence's context exceeds rope.scaling.original_context_length, as
     * llama.cpp chooses them by its per-sequence context */
    tl_w rope_long, rope_short;
    /* Gemma 4's per-layer inputs, or NULL: per token, the embedding row
     * [n_layer * n_embd_pl] and a projection of the scaled embedding */
    tl_w pl_tok_embd;         /* per_layer_token_embd [n_layer * n_embd_pl, n_vocab] */
    tl_w pl_model_proj;       /* per_layer_model_proj [n_layer * n_embd_pl, d] */
    tl_w pl_proj_norm;        /* per_layer_proj_norm [n_embd_pl] f32 */
    /* BERT's input: token + token_types row 0 (+ position_embd row pos),
     * then LayerNorm * embd_norm + embd_norm_b; output_norm and output NULL */
    tl_w pos_embd;            /* [n_ctx_train, d] (bert), or NULL (nomic-bert: RoPE) */
    tl_w type_embd;           /* token_types [n_types, d]: row 0 used, or NULL */
    tl_w embd_norm, embd_norm_b; /* token_embd_norm weight, bias [d] f32 */
    /* The classification head rank pooling runs on the pooled row (llama.cpp's
     * build_pooling, LLAMA_POOLING_TYPE_RANK): tanh(cls x + cls_b), then
     * cls_out (that) + cls_out_b; each NULL when the file has none. */
    tl_w cls;                 /* cls.weight [n_cls, d] (n_cls: d for BERT, 1 for Jina v2) */
    tl_w cls_b;               /* cls.bias [n_cls] f32 */
    tl_w cls_out;             /* cls.output.weight [n_cls_labels, n_cls or d] (Qwen3-Reranker: the
                               * lm_head's "yes" and "no" rows) */
    tl_w cls_out_b;           /* cls.output.bias [n_cls_labels] f32 */
    char *chat_template;      /* NUL-terminated copy, or NULL */
    char *rerank_template;    /* tokenizer.chat_template.rerank, NUL-terminated, or NULL */
    /* Packed weight copies by (numerics mode, CPU level), made on first use
     * (packed.h): the one thing a context may add to a loaded model. */
#define TL_PACK_LEVELS 6
#define TL_PACK_SLOTS (2 * TL_PACK_LEVELS)
    pthread_mutex_t pack_mu;
    struct tl_packed *packs[TL_PACK_SLOTS];
};

#endif
