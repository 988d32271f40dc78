/* load/: the first stage of the loop: a GGUF file mapped and checked
 * (gguf.c; gguf_write.c writes one), its architecture, hyperparameters and
 * weights bound into layers of typed blocks (model.c, this file), weights
 * packed once per kernel layout (packed.c), and the file described (info.c).
 * Everything here is immutable once loaded; contexts only read it.
 *
 * model: loading a GGUF file into a tl_model. The architecture table, reading
 * hyperparameters from metadata, binding and checking every weight tensor, and
 * the public accessors that only need the model (tokens, template). */
#include "load/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "load/packed.h"
#include "base/util.h"

static const tl_arch_info ARCHS[] = {
    /* name     arch           neox scale sandw qknorm act          qpre swa bias fused moe */
    {"llama", TL_ARCH_LLAMA, 0, 0, 0, 0, TL_ACT_SILU, 0, 0, 0, 0, 1, 0},
    {"gemma3", TL_ARCH_GEMMA3, 1, 1, 1, 1, TL_ACT_GELU, 1, 6, 0, 0, 0, 0},
    {"qwen2", TL_ARCH_QWEN2, 1, 0, 0, 0, TL_ACT_SILU, 0, 0, 1, 0, 0, 0},
    {"qwen3", TL_ARCH_QWEN3, 1, 0, 0, 1, TL_ACT_SILU, 0, 0, 0, 0, 0, 0},
    /* llama.cpp turns Phi-3's sliding window off (its swa 0 here does too);
     * it scales q before the scores, as qpre does */
    {"phi3", TL_ARCH_PHI3, 1, 0, 0, 0, TL_ACT_SILU, 1, 0, 0, 1, 0, 0},
    {"qwen3moe", TL_ARCH_QWEN3MOE, 1, 0, 0, 1, TL_ACT_SILU, 0, 0, 0, 0, 2, 0},
    {"qwen2moe", TL_ARCH_QWEN2MOE, 1, 0, 0, 0, TL_ACT_SILU, 0, 0, 1, 0, 2, 0},
    /* every other layer (the even ones) attends to a sliding window */
    {"gpt-oss", TL_ARCH_GPTOSS, 1, 0, 0, 0, TL_ACT_SWIGLU_OAI, 0, 2, 1, 0, 2, 0},
    /* Gated DeltaNet layers and gated attention; text positions make its
     * interleaved M-RoPE the NeoX rotation (every section at the same position) */
    {"qwen35", TL_ARCH_QWEN35, 1, 0, 0, 1, TL_ACT_SILU, 0, 0, 0, 0, 0, 1},
    {"qwen35moe", TL_ARCH_QWEN35MOE, 1, 0, 0, 1, TL_ACT_SILU, 0, 0, 0, 0, 2, 1},
    /* sliding-window and global layers of their own shapes (the window's
     * layers listed by a flag array), per-layer inputs, shared KV layers,
     * experts beside the dense FFN; attention scale 1 (q and k are normed) */
    {"gemma4", TL_ARCH_GEMMA4, 1, 1, 1, 1, TL_ACT_GELU, 0, 0, 0, 0, 1, 0},
    /* encoders, post-norm (LayerNorm after each residual add): bert with
     * absolute positions, biases and a GELU FFN; nomic-bert with a fused
     * qkv, NeoX RoPE and SwiGLU without biases (bind_bert) */
    {"bert", TL_ARCH_BERT, 0, 0, 0, 0, TL_ACT_GELU_SEQ, 0, 0, 1, 0, 0, 0},
    {"nomic-bert", TL_ARCH_NOMIC_BERT, 1, 0, 0, 0, TL_ACT_SILU, 0, 0, 0, 1, 0, 0},
};

static int is_encoder(const tl_arch_info *a) { return a->arch == TL_ARCH_BERT || a->arch == TL_ARCH_NOMIC_BERT; }

const char *tl_supported_architectures(void) {
    return "llama (incl. Llama 3 RoPE factors and Mixtral's experts), gemma3, qwen2, qwen3, phi3, qwen3moe, qwen2moe, gpt-oss, "
           "qwen35, qwen35moe, gemma4, bert and nomic-bert (embeddings only)";
}

static const tl_arch_info *find_arch(tl_str name) {
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (tl_str_eq(name, ARCHS[i].name)) return &ARCHS[i];
    return NULL;
}

/* Reads "<arch>.<key>" as an integer; required keys fail when absent. */
static int hp_int(const tl_model *m, const char *key, int required, int def, int *out,
                  tl_error *err) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", m->arch->name, key);
    int64_t v;
    int r = tl_gguf_get_int(m->gguf, full, &v);
    if (r < 0) return tl_fail(err, TL_ERR_FORMAT, "metadata %s has a non-integer type", full);
    if (r == 0) {
        if (required) return tl_fail(err, TL_ERR_FORMAT, "metadata %s is missing", full);
        v = def;
    }
    if (v < 0 || v > (1 << 30))
        return tl_fail(err, TL_ERR_FORMAT, "metadata %s = %lld is out of range", full, (long long)v);
    *out = (int)v;
    return TL_OK;
}

static int hp_float(const tl_model *m, const char *key, int required, double def, float *out,
                    tl_error *err) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", m->arch->name, key);
    double v;
    int r = tl_gguf_get_float(m->gguf, full, &v);
    if (r < 0) return tl_fail(err, TL_ERR_FORMAT, "metadata %s has a non-float type", full);
    if (r == 0) {
        if (required) return tl_fail(err, TL_ERR_FORMAT, "metadata %s is missing", full);
        v = def;
    }
    if (!(v == v) || v < 0 || v > 1e30)
        return tl_fail(err, TL_ERR_FORMAT, "metadata %s = %g is out of range", full, v);
    *out = (float)v;
    return TL_OK;
}

/* "<arch>.<key>" for layer il: a scalar for every layer, or an array with
 * one value per layer (llama.cpp's get_key_or_arr). */
static int hp_int_layer(const tl_model *m, const char *key, int il, int def, int *out, tl_error *err) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", m->arch->name, key);
    const tl_gguf_kv *kv = tl_gguf_find(m->gguf, full);
    if (!kv || kv->type != GGUF_TYPE_ARRAY) return hp_int(m, key, 0, def, out, err);
    if (kv->arr_type == GGUF_TYPE_STRING || kv->arr_n < (uint64_t)m->hp.n_layer)
        return tl_fail(err, TL_ERR_FORMAT, "metadata %s is not an array of %d integers", full, m->hp.n_layer);
    const int64_t v = tl_gguf_arr_int(kv, (uint64_t)il);
    if (v < 0 || v > (1 << 30))
        return tl_fail(err, TL_ERR_FORMAT, "metadata %s[%d] = %lld is out of range", full, il, (long long)v);
    *out = (int)v;
    return TL_OK;
}

/* The widest value of a per-layer key (hp_int_layer) over the layers. */
static int hp_int_max(const tl_model *m, const char *key, int required, int def, int *out, tl_error *err) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", m->arch->name, key);
    const tl_gguf_kv *kv = tl_gguf_find(m->gguf, full);
    if (!kv || kv->type != GGUF_TYPE_ARRAY) return hp_int(m, key, required, def, out, err);
    *out = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        int v, st;
        if ((st = hp_int_layer(m, key, il, def, &v, err))) return st;
        if (v > *out) *out = v;
    }
    return TL_OK;
}

/* Whether sliding-window layers take the global RoPE base and scaling unless
 * rope.freq_base_swa says otherwise, as llama.cpp sets gpt-oss up; other
 * families (Gemma 3) default to base 10000, unscaled. */
static int swa_rope_global(const tl_arch_info *a) { return a->arch == TL_ARCH_GPTOSS; }

/* RoPE scaling as llama.cpp reads it (llama-model.cpp, llama-context.cpp):
 * the type defaults to linear, so a factor alone scales; "none" never does.
 * YaRN's beta_fast/slow stay at llama.cpp's 32 and 1 (it reads
 * rope.scaling.yarn_beta_* for other families only), and its cos/sin
 * multiplier is computed here in llama.cpp's float steps (unfused: that
 * library is built without FMA), before the rope cache multiplies in YaRN's
 * own 1 + 0.1 ln(1/freq_scale). */
static int read_rope_scaling(tl_model *m, tl_error *err) {
    tl_hparams *hp = &m->hp;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", m->arch->name);
    tl_str v;
    const int r = tl_gguf_get_str(m->gguf, key, &v);
    if (r < 0) return tl_fail(err, TL_ERR_FORMAT, "metadata %s has a non-string type", key);
    hp->rope_scaling = TL_ROPE_SCALING_LINEAR;
    if (r == 1 && tl_str_eq(v, "none")) hp->rope_scaling = TL_ROPE_SCALING_NONE;
    else if (r == 1 && tl_str_eq(v, "yarn")) hp->rope_scaling = TL_ROPE_SCALING_YARN;
    else if (r == 1 && !tl_str_eq(v, "linear"))
        return tl_fail(err, TL_ERR_UNSUPPORTED, "RoPE scaling '%.*s' (%s) is not supported",
                       (int)(v.len > 32 ? 32 : v.len), v.ptr, key);
    float factor = 0.0f, attn = 1.0f;
    int st;
    if ((st = hp_float(m, "rope.scaling.factor", 0, 0.0, &factor, err))) return st;
    if (factor == 0.0f && (st = hp_float(m, "rope.scale_linear", 0, 0.0, &factor, err))) return st;
    if ((st = hp_int(m, "rope.scaling.original_context_length", 0, 0, &hp->rope_n_ctx_orig, err)) ||
        (st = hp_float(m, "rope.scaling.attn_factor", 0, 1.0, &attn, err)))
        return st;
    if (hp->rope_n_ctx_orig == 0) hp->rope_n_ctx_orig = hp->n_ctx_train;
    hp->rope_freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    if (hp->rope_scaling == TL_ROPE_SCALING_NONE) hp->rope_freq_scale = 1.0f;
    hp->rope_freq_scale_swa = swa_rope_global(m->arch) ? hp->rope_freq_scale : 1.0f;
    hp->yarn_ext_factor = hp->rope_scaling == TL_ROPE_SCALING_YARN ? 1.0f : 0.0f;
    hp->yarn_beta_fast = 32.0f;
    hp->yarn_beta_slow = 1.0f;
    hp->yarn_attn_factor = 1.0f;
    if (hp->yarn_ext_factor != 0.0f) {
        const float f = 1.0f / hp->rope_freq_scale;
        const float mscale = f <= 1.0f ? 1.0f : 0.1f * logf(f) + 1.0f;
        /* llama.cpp cancels the factor YaRN's cos/sin scaling adds again */
        hp->yarn_attn_factor = mscale * (1.0f / (1.0f + 0.1f * logf(f)));
    }
    hp->yarn_attn_factor *= attn;
    return TL_OK;
}

/* The hybrids' Gated DeltaNet shape (ssm.*) and their M-RoPE sections. Text
 * positions put every section at the same position, so the rotation is
 * NeoX's over n_rot dimensions provided the sections cover them all. */
static int read_ssm(tl_model *m, tl_error *err) {
    tl_hparams *hp = &m->hp;
    int st, inner;
    if ((st = hp_int(m, "ssm.conv_kernel", 1, 0, &hp->ssm_d_conv, err)) ||
        (st = hp_int(m, "ssm.state_size", 1, 0, &hp->ssm_d_state, err)) ||
        (st = hp_int(m, "ssm.group_count", 1, 0, &hp->ssm_n_kh, err)) ||
        (st = hp_int(m, "ssm.time_step_rank", 1, 0, &hp->ssm_n_vh, err)) ||
        (st = hp_int(m, "ssm.inner_size", 1, 0, &inner, err)))
        return st;
    if (hp->ssm_d_conv < 1 || hp->ssm_d_conv > 16 || hp->ssm_d_state < 8 || hp->ssm_d_state % 8 ||
        hp->ssm_d_state > 512 || hp->ssm_n_kh < 1 || hp->ssm_n_vh < hp->ssm_n_kh || hp->ssm_n_vh % hp->ssm_n_kh ||
        inner != hp->ssm_n_vh * hp->ssm_d_state)
        return tl_fail(err, TL_ERR_UNSUPPORTED,
                       "Gated DeltaNet shape not supported: conv %d, state %d, key heads %d, value heads %d, inner %d",
                       hp->ssm_d_conv, hp->ssm_d_state, hp->ssm_n_kh, hp->ssm_n_vh, inner);
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", m->arch->name);
    int64_t sec[4] = {0};
    const tl_gguf_kv *kv = tl_gguf_find(m->gguf, key);
    const int n = kv && kv->type == GGUF_TYPE_ARRAY && kv->arr_type != GGUF_TYPE_STRING && kv->arr_n <= 4
                      ? (int)kv->arr_n : 0;
    for (int i = 0; i < n; i++) sec[i] = tl_gguf_arr_int(kv, (uint64_t)i);
    if (n > 0) {
        int64_t sum = 0;
        for (int i = 0; i < n; i++) sum += sec[i];
        /* interleaved sections: pair i takes t, h, w by i % 3 while inside 3 * its section */
        for (int i = 0; i < hp->n_rot / 2; i++) {
            const int k = i % 3;
            if (!(k < 3 && i < 3 * sec[k]))
                return tl_fail(err, TL_ERR_UNSUPPORTED,
                               "%s leaves rotary pair %d to the extra section (sections sum %lld of %d pairs)", key,
                               i, (long long)sum, hp->n_rot / 2);
        }
    }
    return TL_OK;
}

static int read_hparams(tl_model *m, tl_error *err) {
    tl_hparams *hp = &m->hp;
    int st;
    if ((st = hp_int(m, "embedding_length", 1, 0, &hp->n_embd, err)) ||
        (st = hp_int(m, "block_count", 1, 0, &hp->n_layer, err)) ||
        (st = hp_int(m, "attention.head_count", 1, 0, &hp->n_head, err)) ||
        (st = hp_int_max(m, "attention.head_count_kv", 0, hp->n_head, &hp->n_head_kv, err)) ||
        (st = hp_int_max(m, "feed_forward_length", 1, 0, &hp->n_ff, err)) ||
        (st = hp_int(m, "context_length", 0, 2048, &hp->n_ctx_train, err)) ||
        (st = hp_float(m, "rope.freq_base", 0, 10000.0, &hp->rope_base, err)) ||
        (st = hp_float(m, is_encoder(m->arch) ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon", 1,
                       0, &hp->norm_eps, err)) ||
        /* llama.cpp's default when a sliding-window model has no such key */
        (st = hp_float(m, "rope.freq_base_swa", 0, swa_rope_global(m->arch) ? hp->rope_base : 10000.0,
                       &hp->rope_base_swa, err)) ||
        (st = hp_int(m, "attention.sliding_window", 0, 0, &hp->n_swa, err)) ||
        (st = hp_float(m, "final_logit_softcapping", 0, 0.0, &hp->logit_softcap, err)))
        return st;
    /* The last nextn_predict_layers blocks predict further tokens (Qwen3.5's
     * multi-token prediction, for a draft that reads the model's own hidden
     * state); the model is the blocks before them, as llama.cpp's n_layer(). */
    int n_nextn = 0;
    if ((st = hp_int(m, "nextn_predict_layers", 0, 0, &n_nextn, err))) return st;
    if (n_nextn < 0 || n_nextn >= hp->n_layer)
        return tl_fail(err, TL_ERR_FORMAT, "metadata %s.nextn_predict_layers = %d leaves no layer of %d", m->arch->name,
                       n_nextn, hp->n_layer);
    hp->n_layer -= n_nextn;
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_ff <= 0 || hp->n_head % hp->n_head_kv != 0)
        return tl_fail(err, TL_ERR_FORMAT,
                       "inconsistent hyperparameters: d=%d layers=%d heads=%d kv_heads=%d ff=%d",
                       hp->n_embd, hp->n_layer, hp->n_head, hp->n_head_kv, hp->n_ff);
    int def_hd = hp->n_embd / hp->n_head;
    if ((st = hp_int(m, "attention.key_length", 0, def_hd, &hp->head_dim, err))) return st;
    int vlen;
    if ((st = hp_int(m, "attention.value_length", 0, hp->head_dim, &vlen, err))) return st;
    if (vlen != hp->head_dim || hp->head_dim <= 0 || hp->head_dim % 2)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "head sizes k=%d v=%d not supported",
                       hp->head_dim, vlen);
    if ((st = hp_int(m, "rope.dimension_count", 0, hp->head_dim, &hp->n_rot, err)) ||
        (st = hp_int(m, "attention.key_length_swa", 0, hp->head_dim, &hp->head_dim_swa, err)) ||
        (st = hp_int(m, "attention.value_length_swa", 0, hp->head_dim_swa, &vlen, err)) ||
        (st = hp_int(m, "rope.dimension_count_swa", 0, hp->n_rot, &hp->n_rot_swa, err)) ||
        (st = hp_int(m, "embedding_length_per_layer_input", 0, 0, &hp->n_embd_pl, err)) ||
        (st = hp_int(m, "pooling_type", 0, TL_POOL_MEAN, &hp->pooling, err)))
        return st;
    if (hp->pooling > TL_POOL_RANK) hp->pooling = TL_POOL_MEAN;
    char key[128];
    {
        int causal = !is_encoder(m->arch); /* llama.cpp's converter writes false for every encoder */
        snprintf(key, sizeof key, "%s.attention.causal", m->arch->name);
        if (tl_gguf_get_bool(m->gguf, key, &causal) < 0)
            return tl_fail(err, TL_ERR_FORMAT, "metadata %s is not a bool", key);
        if (causal != !is_encoder(m->arch))
            return tl_fail(err, TL_ERR_UNSUPPORTED, "%s with %s = %s is not supported", m->arch->name, key,
                           causal ? "true" : "false");
        hp->causal = causal;
    }
    /* llama.cpp's n_cls_out: how many labels the classifier names */
    snprintf(key, sizeof key, "%s.classifier.output_labels", m->arch->name);
    const tl_gguf_kv *lab = tl_gguf_find(m->gguf, key);
    hp->n_cls_labels = 1;
    if (lab && (lab->type != GGUF_TYPE_ARRAY || lab->arr_type != GGUF_TYPE_STRING || lab->arr_n == 0 ||
                lab->arr_n > (1u << 20)))
        return tl_fail(err, TL_ERR_FORMAT, "metadata %s is not a list of labels", key);
    if (lab) hp->n_cls_labels = (int)lab->arr_n;
    if (vlen != hp->head_dim_swa || hp->head_dim_swa <= 0 || hp->head_dim_swa % 2 || hp->n_rot_swa > hp->head_dim_swa ||
        hp->n_rot_swa % 2 || hp->n_rot_swa <= 0)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "sliding-window head sizes k=%d v=%d (rotary %d) not supported",
                       hp->head_dim_swa, vlen, hp->n_rot_swa);
    if (hp->n_embd_pl > 0 && m->arch->arch != TL_ARCH_GEMMA4)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "per-layer inputs (%s.embedding_length_per_layer_input) are not supported",
                       m->arch->name);
    /* Experts: "<arch>.expert_count" makes the feed-forward a mixture (Mixtral
     * is llama with experts); an expert's width defaults as llama.cpp's does. */
    if ((st = hp_int(m, "expert_count", 0, 0, &hp->n_expert, err)) ||
        (st = hp_int(m, "expert_used_count", 0, 0, &hp->n_expert_used, err)) ||
        (st = hp_int_max(m, "expert_feed_forward_length", 0, 0, &hp->n_ff_exp, err)) ||
        (st = hp_int(m, "expert_shared_feed_forward_length", 0, 0, &hp->n_ff_shexp, err)))
        return st;
    /* <arch>.expert_weights_scale is left unread: llama.cpp reads it for
     * DeepSeek, GLM and their kind, none of the architectures here, and a file
     * of ours that carries it runs unscaled there */
    if (m->arch->moe == 2 && hp->n_expert == 0)
        return tl_fail(err, TL_ERR_FORMAT, "metadata %s.expert_count is missing (architecture %s has experts)",
                       m->arch->name, m->arch->name);
    if (hp->n_expert > 0) {
        if (!m->arch->moe)
            return tl_fail(err, TL_ERR_UNSUPPORTED, "architecture %s with experts (%s.expert_count) is not supported",
                           m->arch->name, m->arch->name);
        if (hp->n_expert_used <= 0 || hp->n_expert_used > hp->n_expert || hp->n_expert_used > TL_MAX_EXPERT_USED)
            return tl_fail(err, TL_ERR_FORMAT, "metadata %s.expert_used_count = %d is invalid for %d experts (at most %d)",
                           m->arch->name, hp->n_expert_used, hp->n_expert, TL_MAX_EXPERT_USED);
        if (hp->n_ff_exp == 0) hp->n_ff_exp = m->arch->arch == TL_ARCH_LLAMA ? hp->n_ff : hp->n_ff / hp->n_expert_used;
        if (hp->n_ff_exp <= 0) return tl_fail(err, TL_ERR_FORMAT, "an expert's feed-forward width is 0");
    }
    if (m->arch->hybrid && (st = read_ssm(m, err))) return st;
    /* llama.cpp: 1/sqrt(key_length), as a float; Gemma 4 normalises q and k
     * and scales by 1 */
    hp->attn_scale = m->arch->arch == TL_ARCH_GEMMA4 ? 1.0f : 1.0f / sqrtf((float)hp->head_dim);
    if (hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return tl_fail(err, TL_ERR_FORMAT, "rope.dimension_count %d invalid for head size %d",
                       hp->n_rot, hp->head_dim);
    return read_rope_scaling(m, err);
}

/* Binds tensor `name` and checks its shape [ne0, ne1] (ne1 = 0: 1-D). */
static int bind(tl_model *m, const char *name, int64_t ne0, int64_t ne1, int required,
                int need_dot, tl_w *out, tl_error *err) {
    const tl_gguf_tensor *t = tl_gguf_find_tensor(m->gguf, name);
    *out = t;
    if (!t) {
        if (!required) return TL_OK;
        return tl_fail(err, TL_ERR_FORMAT, "tensor %s is missing (architecture %s)", name,
                       m->arch->name);
    }
    int64_t want1 = ne1 ? ne1 : 1;
    if (t->ne[0] != ne0 || t->ne[1] != want1 || t->ne[2] != 1 || t->ne[3] != 1)
        return tl_fail(err, TL_ERR_FORMAT,
                       "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                       name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                       (long long)t->ne[3], (long long)ne0, (long long)want1);
    const tl_type_traits *tt = tl_type_info(t->type);
    if (!tt || !tt->can_dequant)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "tensor %s has unsupported type %s", name,
                       tt ? tt->name : "?");
    if (need_dot && !tt->can_dot)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "tensor %s: type %s cannot be a matmul weight",
                       name, tt->name);
    if (!need_dot && ne1 == 0 && t->type != TL_F32)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "norm tensor %s must be F32, is %s", name,
                       tt->name);
    return TL_OK;
}

/* Binds the 3-D expert tensor `name` of shape [ne0, ne1, n_expert]
 * (required) or the 2-D per-expert bias [ne0, n_expert] (ne1 = 0, optional). */
static int bind_exps(tl_model *m, const char *name, int64_t ne0, int64_t ne1, tl_w *out, tl_error *err) {
    const int64_t ne2 = m->hp.n_expert;
    const tl_gguf_tensor *t = tl_gguf_find_tensor(m->gguf, name);
    *out = t;
    if (!t) {
        if (!ne1) return TL_OK;
        return tl_fail(err, TL_ERR_FORMAT, "tensor %s is missing (architecture %s)", name, m->arch->name);
    }
    const int64_t w1 = ne1 ? ne1 : ne2, w2 = ne1 ? ne2 : 1;
    if (t->ne[0] != ne0 || t->ne[1] != w1 || t->ne[2] != w2 || t->ne[3] != 1)
        return tl_fail(err, TL_ERR_FORMAT,
                       "tensor %s has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                       (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                       (long long)ne0, (long long)w1, (long long)w2);
    const tl_type_traits *tt = tl_type_info(t->type);
    if (!tt || !tt->can_dequant || (ne1 && !tt->can_dot) || (!ne1 && t->type != TL_F32))
        return tl_fail(err, TL_ERR_UNSUPPORTED, "tensor %s has unsupported type %s", name, tt ? tt->name : "?");
    return TL_OK;
}

/* The experts of layer il: router, the three 3-D tensors, optional biases
 * and a shared expert. */
static int bind_moe(tl_model *m, int il, tl_moe_block *E, tl_error *err) {
    const tl_hparams *hp = &m->hp;
    const int d = hp->n_embd, ff = hp->n_ff_exp;
    char n[96];
    int st;
    E->n_expert = hp->n_expert;
    E->n_used = hp->n_expert_used;
    E->act = m->arch->act;
    const int oss = m->arch->arch == TL_ARCH_GPTOSS;
    /* gpt-oss: softmax over the chosen logits alone; qwen2moe keeps the
     * softmax weights as they are; the others renormalise the chosen ones */
    E->gating = oss ? TL_GATE_SOFTMAX_CHOSEN : TL_GATE_SOFTMAX;
    E->norm_w = !oss && m->arch->arch != TL_ARCH_QWEN2MOE;
#define BE(field, nm, a, b)                                           \
    snprintf(n, sizeof n, "blk.%d." nm, il);                          \
    if ((st = bind_exps(m, n, a, b, &field, err))) return st;
#define BM(field, nm, a, b, req, dot)                                 \
    snprintf(n, sizeof n, "blk.%d." nm, il);                          \
    if ((st = bind(m, n, a, b, req, dot, &field, err))) return st;
    if (oss || m->arch->hybrid) { /* its norm before the experts is named for the attention it follows */
        BM(E->norm, "post_attention_norm.weight", d, 0, 1, 0)
    } else {
        BM(E->norm, "ffn_norm.weight", d, 0, 1, 0)
    }
    BM(E->router, "ffn_gate_inp.weight", d, hp->n_expert, 1, 1)
    BM(E->router_b, "ffn_gate_inp.bias", hp->n_expert, 0, oss, 0)
    BE(E->gate, "ffn_gate_exps.weight", d, ff)
    BE(E->up, "ffn_up_exps.weight", d, ff)
    BE(E->down, "ffn_down_exps.weight", ff, d)
    BE(E->gate_b, "ffn_gate_exps.bias", ff, 0)
    BE(E->up_b, "ffn_up_exps.bias", ff, 0)
    BE(E->down_b, "ffn_down_exps.bias", d, 0)
    if (m->arch->arch == TL_ARCH_QWEN2MOE || m->arch->arch == TL_ARCH_QWEN35MOE) {
        E->sh_sigmoid = m->arch->arch == TL_ARCH_QWEN35MOE;
        const int sff = hp->n_ff_shexp ? hp->n_ff_shexp : hp->n_ff;
        BM(E->sh_router, "ffn_gate_inp_shexp.weight", d, 0, 1, 0)
        BM(E->sh_gate, "ffn_gate_shexp.weight", d, sff, 1, 1)
        BM(E->sh_up, "ffn_up_shexp.weight", d, sff, 1, 1)
        BM(E->sh_down, "ffn_down_shexp.weight", sff, d, 1, 1)
    }
#undef BE
#undef BM
    if (oss && (!E->gate_b || !E->up_b || !E->down_b))
        return tl_fail(err, TL_ERR_FORMAT, "tensor blk.%d.ffn_%s_exps.bias is missing (architecture gpt-oss)", il,
                       !E->gate_b ? "gate" : !E->up_b ? "up" : "down");
    if (E->router->type != TL_F32 && E->router->type != TL_F16 && E->router->type != TL_BF16 &&
        !tl_type_info(E->router->type)->can_dot)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "blk.%d.ffn_gate_inp.weight: type %s cannot be a matmul weight", il,
                       tl_type_info(E->router->type)->name);
    return TL_OK;
}

/* Which layers attend to a sliding window: with a window, every
 * swa_pattern-th layer (the last of each group) is global, as llama.cpp's
 * default; "<arch>.attention.sliding_window_pattern" overrides the period. */
static int set_swa_layers(tl_model *m, tl_error *err) {
    int n_pat = m->arch->swa_pattern, st;
    if (m->hp.n_swa <= 0 || n_pat <= 0) {
        m->hp.n_swa = 0;
        return TL_OK;
    }
    if ((st = hp_int(m, "attention.sliding_window_pattern", 0, n_pat, &n_pat, err))) return st;
    for (int i = 0; i < m->hp.n_layer; i++)
        for (int b = 0; b < m->layers[i].n_block; b++)
            if (m->layers[i].block[b].kind == TL_BLOCK_ATTN)
                m->layers[i].block[b].u.attn.swa = n_pat == 0 || i % n_pat < n_pat - 1;
    return TL_OK;
}

/* A fused matrix blk.<il>.<nm>.weight of n parts stacked by rows: each part
 * becomes a view (rows are whole, so a view is the same matrix's rows). */
static int bind_fused(tl_model *m, int il, const char *nm, const int64_t *rows, int n,
                      tl_gguf_tensor *views, tl_error *err) {
    char name[96];
    snprintf(name, sizeof name, "blk.%d.%s.weight", il, nm);
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += rows[i];
    tl_w t;
    int st = bind(m, name, m->hp.n_embd, total, 1, 1, &t, err);
    if (st) return st;
    size_t rb = tl_row_size((tl_type)t->type, t->ne[0]);
    int64_t r0 = 0;
    for (int i = 0; i < n; i++) {
        views[i] = *t;
        views[i].ne[1] = rows[i];
        views[i].data = (const uint8_t *)t->data + (size_t)r0 * rb;
        views[i].offset += (uint64_t)r0 * rb;
        views[i].nbytes = (uint64_t)rows[i] * rb;
        r0 += rows[i];
    }
    return TL_OK;
}

/* Optional q, k, v biases (Qwen2): 1-D F32 of the projections' widths. */
static int bind_qkv_bias(tl_model *m, int il, tl_attn_block *A, tl_error *err) {
    const char *nm[3] = {"attn_q", "attn_k", "attn_v"};
    tl_w *dst[3] = {&A->bq, &A->bk, &A->bv};
    int64_t w[3] = {A->wq->ne[1], A->wk->ne[1], A->wv->ne[1]};
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.%s.bias", il, nm[i]);
        int st = bind(m, name, w[i], 0, 0, 0, dst[i], err);
        if (st) return st;
    }
    return TL_OK;
}

/* Phi-3's LongRoPE factors: both or neither, read for phi3 only (as
 * llama.cpp reads them); in another family they would be ignored there, so
 * they are refused rather than run otherwise than the file means. */
static int bind_longrope(tl_model *m, tl_error *err) {
    const int has_long = tl_gguf_find_tensor(m->gguf, "rope_factors_long.weight") != NULL;
    const int has_short = tl_gguf_find_tensor(m->gguf, "rope_factors_short.weight") != NULL;
    if (!has_long && !has_short) return TL_OK;
    if (m->arch->arch != TL_ARCH_PHI3)
        return tl_fail(err, TL_ERR_UNSUPPORTED, "LongRoPE (tensor rope_factors_long.weight) is not supported for %s",
                       m->arch->name);
    if (has_long != has_short)
        return tl_fail(err, TL_ERR_FORMAT, "tensor %s is missing (LongRoPE needs both)",
                       has_long ? "rope_factors_short.weight" : "rope_factors_long.weight");
    const int half = m->hp.n_rot / 2;
    int st;
    if ((st = bind(m, "rope_factors_long.weight", half, 0, 1, 0, &m->rope_long, err)) ||
        (st = bind(m, "rope_factors_short.weight", half, 0, 1, 0, &m->rope_short, err)))
        return st;
    if (m->rope_long->type != TL_F32 || m->rope_short->type != TL_F32)
        return tl_fail(err, TL_ERR_FORMAT, "LongRoPE factors must be F32");
    return TL_OK;
}

/* Which layers of a hybrid are Gated DeltaNet: attention.recurrent_layers
 * when the file lists them, else all but every full_attention_interval-th
 * (default 4), as llama.cpp reads them. */
static int hybrid_is_rec(const tl_model *m, int il, int *rec, tl_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", m->arch->name);
    const tl_gguf_kv *kv = tl_gguf_find(m->gguf, key);
    if (kv) {
        if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type == GGUF_TYPE_STRING || kv->arr_n < (uint64_t)m->hp.n_layer)
            return tl_fail(err, TL_ERR_FORMAT, "metadata %s is not an array of %d flags", key, m->hp.n_layer);
        *rec = tl_gguf_arr_int(kv, (uint64_t)il) != 0;
        return TL_OK;
    }
    int interval, st;
    if ((st = hp_int(m, "full_attention_interval", 0, 4, &interval, err))) return st;
    if (interval < 1) return tl_fail(err, TL_ERR_FORMAT, "metadata %s.full_attention_interval is 0", m->arch->name);
    *rec = (il + 1) % interval != 0;
    return TL_OK;
}

/* A Qwen3.5/3.6 layer: Gated DeltaNet or gated attention, then the dense
 * feed-forward or the experts, each after its RMSNorm (the second named
 * post_attention_norm). */
static int bind_hybrid_layer(tl_model *m, int il, tl_error *err) {
    tl_hparams *hp = &m->hp;
    tl_layer *L = &m->layers[il];
    const int d = hp->n_embd, hd = hp->head_dim, ds = hp->ssm_d_state;
    const int kd = hp->ssm_n_kh * ds, vd = hp->ssm_n_vh * ds, conv_dim = 2 * kd + vd;
    int rec = 0, st;
    if ((st = hybrid_is_rec(m, il, &rec, err))) return st;
    char n[96];
#define B(field, nm, a, b, dot)                                                    \
    snprintf(n, sizeof n, "blk.%d." nm, il);                                       \
    if ((st = bind(m, n, a, b, 1, dot, &field, err))) return st;
    L->n_block = 2;
    if (rec) {
        L->block[0].kind = TL_BLOCK_GDN;
        tl_gdn_block *G = &L->block[0].u.gdn;
        G->rec_layer = hp->n_rec_layer++;
        B(G->norm, "attn_norm.weight", d, 0, 0)
        B(G->wqkv, "attn_qkv.weight", d, conv_dim, 1)
        B(G->wz, "attn_gate.weight", d, vd, 1)
        B(G->wbeta, "ssm_beta.weight", d, hp->ssm_n_vh, 1)
        B(G->walpha, "ssm_alpha.weight", d, hp->ssm_n_vh, 1)
        B(G->conv, "ssm_conv1d.weight", hp->ssm_d_conv, conv_dim, 0)
        B(G->dt_bias, "ssm_dt.bias", hp->ssm_n_vh, 0, 0)
        B(G->a, "ssm_a", hp->ssm_n_vh, 0, 0)
        B(G->ssm_norm, "ssm_norm.weight", ds, 0, 0)
        B(G->wout, "ssm_out.weight", vd, d, 1)
        if (G->conv->type != TL_F32)
            return tl_fail(err, TL_ERR_UNSUPPORTED, "tensor blk.%d.ssm_conv1d.weight must be F32, is %s", il,
                           tl_type_info(G->conv->type)->name);
    } else {
        L->block[0].kind = TL_BLOCK_ATTN;
        tl_attn_block *A = &L->block[0].u.attn;
        A->kv_layer = hp->n_kv_layer++;
        A->q_gate = 1;
        B(A->norm, "attn_norm.weight", d, 0, 0)
        B(A->wq, "attn_q.weight", d, 2 * hp->n_head * hd, 1)
        B(A->wk, "attn_k.weight", d, hp->n_head_kv * hd, 1)
        B(A->wv, "attn_v.weight", d, hp->n_head_kv * hd, 1)
        B(A->wo, "attn_output.weight", hp->n_head * hd, d, 1)
        B(A->q_norm, "attn_q_norm.weight", hd, 0, 0)
        B(A->k_norm, "attn_k_norm.weight", hd, 0, 0)
    }
    if (hp->n_expert > 0) {
        L->block[1].kind = TL_BLOCK_MOE;
        if ((st = bind_moe(m, il, &L->block[1].u.moe, err))) return st;
    } else {
        L->block[1].kind = TL_BLOCK_FFN;
        tl_ffn_block *F = &L->block[1].u.ffn;
        F->act = m->arch->act;
        B(F->norm, "post_attention_norm.weight", d, 0, 0)
        B(F->gate, "ffn_gate.weight", d, hp->n_ff, 1)
        B(F->up, "ffn_up.weight", d, hp->n_ff, 1)
        B(F->down, "ffn_down.weight", hp->n_ff, d, 1)
    }
#undef B
    return TL_OK;
}

/* Whether Gemma 4's layer il attends to a sliding window: the flag array
 * attention.sliding_window_pattern, as its converter writes it. */
static int gemma4_is_swa(const tl_model *m, int il, int *swa, tl_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", m->arch->name);
    const tl_gguf_kv *kv = tl_gguf_find(m->gguf, key);
    if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->arr_type == GGUF_TYPE_STRING || kv->arr_n < (uint64_t)m->hp.n_layer)
        return tl_fail(err, TL_ERR_FORMAT, "metadata %s is missing or not an array of %d flags", key, m->hp.n_layer);
    *swa = tl_gguf_arr_int(kv, (uint64_t)il) != 0;
    return TL_OK;
}

/* A Gemma 4 layer (llama.cpp's gemma4 graph): attention whose shape is the
 * sliding window's or the global one's, with v = k's projection where the
 * file has no attn_v, v normed without a weight; the last shared_kv_layers
 * layers read the KV cache of the last earlier layer of their kind. Then
 * the GeGLU FFN, or it and the experts side by side; then the per-layer
 * input, and the layer's output scale. */
static int bind_gemma4_layer(tl_model *m, int il, int n_kv_start, tl_error *err) {
    tl_hparams *hp = &m->hp;
    tl_layer *L = &m->layers[il];
    const int d = hp->n_embd;
    int swa = 0, nkv = 0, ff = 0, st;
    if ((st = gemma4_is_swa(m, il, &swa, err)) ||
        (st = hp_int_layer(m, "attention.head_count_kv", il, hp->n_head, &nkv, err)) ||
        (st = hp_int_layer(m, "feed_forward_length", il, hp->n_ff, &ff, err)))
        return st;
    const int hd = swa ? hp->head_dim_swa : hp->head_dim;
    if (nkv <= 0 || hp->n_head % nkv)
        return tl_fail(err, TL_ERR_FORMAT, "layer %d: %d KV heads for %d heads", il, nkv, hp->n_head);
    char n[96];
#define B(field, nm, a, b, req, dot)                                               \
    snprintf(n, sizeof n, "blk.%d." nm, il);                                       \
    if ((st = bind(m, n, a, b, req, dot, &field, err))) return st;
    L->n_block = 0;
    tl_attn_block *A = &L->block[L->n_block++].u.attn;
    L->block[0].kind = TL_BLOCK_ATTN;
    A->swa = swa;
    A->hd = hd;
    A->n_head = hp->n_head;
    A->n_head_kv = nkv;
    A->n_rot = swa ? hp->n_rot_swa : hp->n_rot;
    A->v_norm = 1;
    A->kv_shared = il >= n_kv_start;
    B(A->norm, "attn_norm.weight", d, 0, 1, 0)
    B(A->wq, "attn_q.weight", d, hp->n_head * hd, 1, 1)
    B(A->wo, "attn_output.weight", hp->n_head * hd, d, 1, 1)
    B(A->q_norm, "attn_q_norm.weight", hd, 0, 1, 0)
    B(A->post_norm, "post_attention_norm.weight", d, 0, 1, 0)
    if (A->kv_shared) {
        /* llama.cpp's reuse: the layer before the first shared one for a
         * global layer, the one before that for a sliding-window one */
        const int src = n_kv_start - (swa ? 2 : 1);
        const tl_attn_block *S = src >= 0 ? &m->layers[src].block[0].u.attn : NULL;
        if (!S || S->kv_shared || S->swa != swa || S->hd != hd || S->n_head_kv != nkv)
            return tl_fail(err, TL_ERR_FORMAT, "layer %d shares the KV cache of layer %d, which is not of its kind", il,
                           src);
        A->kv_layer = S->kv_layer;
    } else {
        A->kv_layer = hp->n_kv_layer++;
        B(A->wk, "attn_k.weight", d, nkv * hd, 1, 1)
        B(A->wv, "attn_v.weight", d, nkv * hd, 0, 1)
        B(A->k_norm, "attn_k_norm.weight", hd, 0, 1, 0)
    }
    snprintf(n, sizeof n, "blk.%d.ffn_gate_inp.weight", il);
    const int moe = tl_gguf_find_tensor(m->gguf, n) != NULL;
    if (moe && hp->n_expert <= 0)
        return tl_fail(err, TL_ERR_FORMAT, "layer %d has experts but metadata %s.expert_count is missing", il,
                       m->arch->name);
    tl_ffn_block *F;
    if (moe) {
        L->block[L->n_block].kind = TL_BLOCK_MOE;
        tl_moe_block *E = &L->block[L->n_block++].u.moe;
        const int fe = hp->n_ff_exp;
        E->n_expert = hp->n_expert;
        E->n_used = hp->n_expert_used;
        E->act = TL_ACT_GELU;
        E->gating = TL_GATE_SOFTMAX;
        E->norm_w = 1;
        B(E->norm, "pre_ffw_norm_2.weight", d, 0, 1, 0)
        B(E->router, "ffn_gate_inp.weight", d, hp->n_expert, 1, 1)
        B(E->router_s, "ffn_gate_inp.scale", d, 0, 1, 0)
        B(E->down_s, "ffn_down_exps.scale", hp->n_expert, 0, 0, 0)
        B(E->sh_norm, "ffn_norm.weight", d, 0, 1, 0)
        B(E->sh_gate, "ffn_gate.weight", d, ff, 1, 1)
        B(E->sh_up, "ffn_up.weight", d, ff, 1, 1)
        B(E->sh_down, "ffn_down.weight", ff, d, 1, 1)
        B(E->sh_post_norm, "post_ffw_norm_1.weight", d, 0, 1, 0)
        B(E->post_norm, "post_ffw_norm_2.weight", d, 0, 1, 0)
        B(E->out_norm, "post_ffw_norm.weight", d, 0, 1, 0)
        snprintf(n, sizeof n, "blk.%d.ffn_gate_up_exps.weight", il);
        if (tl_gguf_find_tensor(m->gguf, n)) {
            if ((st = bind_exps(m, n, d, 2 * (int64_t)fe, &E->gate_up, err))) return st;
        } else {
            snprintf(n, sizeof n, "blk.%d.ffn_gate_exps.weight", il);
            if ((st = bind_exps(m, n, d, fe, &E->gate, err))) return st;
            snprintf(n, sizeof n, "blk.%d.ffn_up_exps.weight", il);
            if ((st = bind_exps(m, n, d, fe, &E->up, err))) return st;
        }
        snprintf(n, sizeof n, "blk.%d.ffn_down_exps.weight", il);
        if ((st = bind_exps(m, n, fe, d, &E->down, err))) return st;
    } else {
        L->block[L->n_block].kind = TL_BLOCK_FFN;
        F = &L->block[L->n_block++].u.ffn;
        F->act = TL_ACT_GELU;
        B(F->norm, "ffn_norm.weight", d, 0, 1, 0)
        B(F->gate, "ffn_gate.weight", d, ff, 1, 1)
        B(F->up, "ffn_up.weight", d, ff, 1, 1)
        B(F->down, "ffn_down.weight", ff, d, 1, 1)
        B(F->post_norm, "post_ffw_norm.weight", d, 0, 1, 0)
    }
    if (hp->n_embd_pl > 0) {
        L->block[L->n_block].kind = TL_BLOCK_PLE;
        tl_ple_block *P = &L->block[L->n_block++].u.ple;
        P->layer = il;
        B(P->gate, "inp_gate.weight", d, hp->n_embd_pl, 1, 1)
        B(P->proj, "proj.weight", hp->n_embd_pl, d, 1, 1)
        B(P->post_norm, "post_norm.weight", d, 0, 1, 0)
    }
    B(L->out_scale, "layer_output_scale.weight", 1, 0, 0, 0)
#undef B
    return TL_OK;
}

/* Gemma 4's model-level tensors: the per-layer inputs' embedding,
 * projection and norm, and the global layers' RoPE divisors. */
static int bind_gemma4(tl_model *m, tl_error *err) {
    tl_hparams *hp = &m->hp;
    int shared, st;
    if ((st = hp_int(m, "attention.shared_kv_layers", 0, 0, &shared, err))) return st;
    const int n_kv_start = hp->n_layer - shared;
    if (shared > 0 && n_kv_start < 2)
        return tl_fail(err, TL_ERR_FORMAT, "metadata %s.attention.shared_kv_layers = %d leaves fewer than 2 layers",
                       m->arch->name, shared);
    if ((st = bind(m, "rope_freqs.weight", hp->n_rot / 2, 0, 0, 0, &m->rope_freqs, err))) return st;
    if (hp->n_embd_pl > 0) {
        const int64_t w = (int64_t)hp->n_layer * hp->n_embd_pl;
        if ((st = bind(m, "per_layer_token_embd.weight", w, hp->n_vocab, 1, 0, &m->pl_tok_embd, err)) ||
            (st = bind(m, "per_layer_model_proj.weight", hp->n_embd, w, 1, 1, &m->pl_model_proj, err)) ||
            (st = bind(m, "per_layer_proj_norm.weight", hp->n_embd_pl, 0, 1, 0, &m->pl_proj_norm, err)))
            return st;
    }
    for (int i = 0; i < hp->n_layer; i++)
        if ((st = bind_gemma4_layer(m, i, n_kv_start, err))) return st;
    return TL_OK;
}

/* Every attention block's shape (the model's unless its binder set one),
 * the widest of them for the buffers, and each cached layer's width. */
static int finish_shapes(tl_model *m, tl_error *err) {
    tl_hparams *hp = &m->hp;
    hp->head_dim_max = hp->head_dim;
    hp->q_dim_max = hp->kv_dim_max = 0;
    for (int i = 0; i < hp->n_layer; i++)
        for (int b = 0; b < m->layers[i].n_block; b++) {
            if (m->layers[i].block[b].kind != TL_BLOCK_ATTN) continue;
            tl_attn_block *A = &m->layers[i].block[b].u.attn;
            if (!A->hd) {
                A->hd = hp->head_dim;
                A->n_head = hp->n_head;
                A->n_head_kv = hp->n_head_kv;
                A->n_rot = hp->n_rot;
            }
            if (A->hd > hp->head_dim_max) hp->head_dim_max = A->hd;
            if (A->n_head * A->hd > hp->q_dim_max) hp->q_dim_max = A->n_head * A->hd;
            if (A->n_head_kv * A->hd > hp->kv_dim_max) hp->kv_dim_max = A->n_head_kv * A->hd;
        }
    m->kv_dim = calloc((size_t)(hp->n_kv_layer > 0 ? hp->n_kv_layer : 1), sizeof *m->kv_dim);
    if (!m->kv_dim) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < hp->n_layer; i++)
        for (int b = 0; b < m->layers[i].n_block; b++)
            if (m->layers[i].block[b].kind == TL_BLOCK_ATTN && !m->layers[i].block[b].u.attn.kv_shared) {
                const tl_attn_block *A = &m->layers[i].block[b].u.attn;
                m->kv_dim[A->kv_layer] = A->n_head_kv * A->hd;
            }
    return TL_OK;
}

/* A LayerNorm's weight and bias, blk.<il>.<nm>.{weight,bias} (il < 0: <nm>.*). */
static int bind_ln(tl_model *m, int il, const char *nm, tl_w *w, tl_w *b, tl_error *err) {
    char n[96];
    int st;
    if (il >= 0) snprintf(n, sizeof n, "blk.%d.%s.weight", il, nm);
    else snprintf(n, sizeof n, "%s.weight", nm);
    if ((st = bind(m, n, m->hp.n_embd, 0, 1, 0, w, err))) return st;
    memcpy(n + strlen(n) - 6, "bias", 5);
    return bind(m, n, m->hp.n_embd, 0, 1, 0, b, err);
}

/* An optional 1-D F32 bias blk.<il>.<nm>.bias of width w. */
static int bind_bias(tl_model *m, int il, const char *nm, int64_t w, tl_w *out, tl_error *err) {
    char n[96];
    snprintf(n, sizeof n, "blk.%d.%s.bias", il, nm);
    return bind(m, n, w, 0, 0, 0, out, err);
}

/* bert and nomic-bert, as llama.cpp's llm_build_bert reads them: the
 * embeddings' extra rows and LayerNorm, then per layer attention (q, k, v
 * or the fused qkv, output, biases where present) and the feed-forward,
 * each followed by a LayerNorm of the residual sum. */
static int bind_bert(tl_model *m, tl_error *err) {
    tl_hparams *hp = &m->hp;
    const int d = hp->n_embd, hd = hp->head_dim, bert = m->arch->arch == TL_ARCH_BERT;
    const int64_t qd = (int64_t)hp->n_head * hd, kvd = (int64_t)hp->n_head_kv * hd;
    int st;
    const tl_gguf_tensor *tt = tl_gguf_find_tensor(m->gguf, "token_types.weight");
    if ((tt && (st = bind(m, "token_types.weight", d, tt->ne[1], 1, 0, &m->type_embd, err))) ||
        (bert && (st = bind(m, "position_embd.weight", d, hp->n_ctx_train, 1, 0, &m->pos_embd, err))) ||
        (st = bind_ln(m, -1, "token_embd_norm", &m->embd_norm, &m->embd_norm_b, err)))
        return st;
    /* the cache is sized as for a decoder (the context's sizing counts on
     * it) but never read: the attention takes the call's own keys */
    hp->n_kv_layer = hp->n_layer;
    for (int i = 0; i < hp->n_layer; i++) {
        tl_layer *L = &m->layers[i];
        L->n_block = 2;
        L->block[0].u.attn.kv_layer = i;
        L->block[0].kind = TL_BLOCK_ATTN;
        L->block[1].kind = TL_BLOCK_FFN;
        tl_attn_block *A = &L->block[0].u.attn;
        tl_ffn_block *F = &L->block[1].u.ffn;
        char n[96];
#define B(field, nm, a, b, req, dot)                                                \
    snprintf(n, sizeof n, "blk.%d." nm ".weight", i);                               \
    if ((st = bind(m, n, a, b, req, dot, &field, err))) return st;
        if (tl_gguf_find_tensor(m->gguf, (snprintf(n, sizeof n, "blk.%d.attn_qkv.weight", i), n))) {
            const int64_t qkv[3] = {qd, kvd, kvd};
            if ((st = bind_fused(m, i, "attn_qkv", qkv, 3, L->views, err))) return st;
            A->wq = &L->views[0], A->wk = &L->views[1], A->wv = &L->views[2];
            if (tl_gguf_find_tensor(m->gguf, (snprintf(n, sizeof n, "blk.%d.attn_qkv.bias", i), n)))
                return tl_fail(err, TL_ERR_UNSUPPORTED, "tensor %s (a fused qkv bias) is not supported", n);
        } else {
            B(A->wq, "attn_q", d, qd, 1, 1)
            B(A->wk, "attn_k", d, kvd, 1, 1)
            B(A->wv, "attn_v", d, kvd, 1, 1)
            if ((st = bind_qkv_bias(m, i, A, err))) return st;
        }
        B(A->wo, "attn_output", qd, d, 1, 1)
        if ((st = bind_bias(m, i, "attn_output", d, &A->bo, err)) ||
            (st = bind_ln(m, i, "attn_output_norm", &A->ln, &A->ln_b, err)))
            return st;
        F->act = m->arch->act;
        B(F->up, "ffn_up", d, hp->n_ff, 1, 1)
        B(F->down, "ffn_down", hp->n_ff, d, 1, 1)
        B(F->gate, "ffn_gate", d, hp->n_ff, !bert, 1)
        if (F->gate && bert)
            return tl_fail(err, TL_ERR_UNSUPPORTED, "tensor %s (a gated bert feed-forward) is not supported", n);
        if ((st = bind_bias(m, i, "ffn_up", hp->n_ff, &F->up_b, err)) ||
            (st = bind_bias(m, i, "ffn_down", d, &F->down_b, err)) ||
            (st = bind_ln(m, i, "layer_output_norm", &F->ln, &F->ln_b, err)))
            return st;
#undef B
    }
    return finish_shapes(m, err);
}

static int bind_weights(tl_model *m, tl_error *err) {
    const tl_hparams *hp = &m->hp;
    int d = hp->n_embd, hd = hp->head_dim, st;
    const tl_gguf_tensor *emb = tl_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!emb) return tl_fail(err, TL_ERR_FORMAT, "tensor token_embd.weight is missing");
    m->hp.n_vocab = (int)emb->ne[1];
    if (is_encoder(m->arch)) { /* no output norm, no output: embeddings only */
        if ((st = bind(m, "token_embd.weight", d, hp->n_vocab, 1, 0, &m->tok_embd, err))) return st;
        m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
        if (!m->layers) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
        return bind_bert(m, err);
    }
    if ((st = bind(m, "token_embd.weight", d, hp->n_vocab, 1, 0, &m->tok_embd, err)) ||
        (st = bind(m, "output_norm.weight", d, 0, 1, 0, &m->output_norm, err)) ||
        (st = bind(m, "output.weight", d, hp->n_vocab, 0, 1, &m->output, err)))
        return st;
    if (!m->output) {
        const tl_type_traits *tt = tl_type_info(m->tok_embd->type);
        if (!tt->can_dot)
            return tl_fail(err, TL_ERR_UNSUPPORTED, "tied output: type %s cannot be a matmul weight",
                           tt->name);
        m->output = m->tok_embd;
    }
    if ((st = bind_longrope(m, err))) return st;
    /* Llama 3's RoPE frequency factors; llama.cpp reads them for llama only */
    if (m->arch->arch == TL_ARCH_LLAMA &&
        (st = bind(m, "rope_freqs.weight", hp->n_rot / 2, 0, 0, 0, &m->rope_freqs, err)))
        return st;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    if (m->arch->hybrid || m->arch->arch == TL_ARCH_GEMMA4) {
        for (int i = 0; i < hp->n_layer && m->arch->hybrid; i++)
            if ((st = bind_hybrid_layer(m, i, err))) return st;
        if (m->arch->hybrid && hp->n_rec_layer == hp->n_layer) /* llama.cpp cannot run one either */
            return tl_fail(err, TL_ERR_UNSUPPORTED, "%s with no attention layer (all %d layers recurrent) is not supported",
                           m->arch->name, hp->n_layer);
        if (!m->arch->hybrid && (st = bind_gemma4(m, err))) return st;
        return finish_shapes(m, err);
    }
    m->hp.n_kv_layer = hp->n_layer;
    for (int i = 0; i < hp->n_layer; i++) {
        tl_layer *L = &m->layers[i];
        /* every family here: attention, then a dense feed-forward */
        L->n_block = 2;
        L->block[0].kind = TL_BLOCK_ATTN;
        L->block[1].kind = hp->n_expert > 0 ? TL_BLOCK_MOE : TL_BLOCK_FFN;
        tl_attn_block *A = &L->block[0].u.attn;
        tl_ffn_block *F = &L->block[1].u.ffn;
        A->kv_layer = i;
        F->act = m->arch->act;
        char n[96];
#define B(field, nm, a, b, dot)                                                    \
    snprintf(n, sizeof n, "blk.%d." nm ".weight", i);                              \
    if ((st = bind(m, n, a, b, 1, dot, &field, err))) return st;
        B(A->norm, "attn_norm", d, 0, 0)
        if (m->arch->fused) {
            int64_t qkv[3] = {hp->n_head * hd, hp->n_head_kv * hd, hp->n_head_kv * hd};
            if ((st = bind_fused(m, i, "attn_qkv", qkv, 3, L->views, err))) return st;
            A->wq = &L->views[0];
            A->wk = &L->views[1];
            A->wv = &L->views[2];
        } else {
            B(A->wq, "attn_q", d, hp->n_head * hd, 1)
            B(A->wk, "attn_k", d, hp->n_head_kv * hd, 1)
            B(A->wv, "attn_v", d, hp->n_head_kv * hd, 1)
        }
        if (m->arch->qkv_bias && (st = bind_qkv_bias(m, i, A, err))) return st;
        B(A->wo, "attn_output", hp->n_head * hd, d, 1)
        if (m->arch->arch == TL_ARCH_GPTOSS) {
            snprintf(n, sizeof n, "blk.%d.attn_output.bias", i);
            if ((st = bind(m, n, d, 0, 1, 0, &A->bo, err))) return st;
            snprintf(n, sizeof n, "blk.%d.attn_sinks.weight", i);
            if ((st = bind(m, n, hp->n_head, 0, 1, 0, &A->sinks, err))) return st;
        }
        if (hp->n_expert > 0) {
            if ((st = bind_moe(m, i, &L->block[1].u.moe, err))) return st;
        } else {
        B(F->norm, "ffn_norm", d, 0, 0)
        if (m->arch->fused) {
            int64_t gu[2] = {hp->n_ff, hp->n_ff};
            if ((st = bind_fused(m, i, "ffn_up", gu, 2, L->views + 3, err))) return st;
            F->gate = &L->views[3];
            F->up = &L->views[4];
        } else {
            B(F->gate, "ffn_gate", d, hp->n_ff, 1)
            B(F->up, "ffn_up", d, hp->n_ff, 1)
        }
        B(F->down, "ffn_down", hp->n_ff, d, 1)
        }
        if (m->arch->qk_norm) {
            B(A->q_norm, "attn_q_norm", hd, 0, 0)
            B(A->k_norm, "attn_k_norm", hd, 0, 0)
        }
        if (m->arch->sandwich) {
            B(A->post_norm, "post_attention_norm", d, 0, 0)
            B(F->post_norm, "post_ffw_norm", d, 0, 0) /* no sandwich architecture has experts */
        }
#undef B
    }
    if ((st = finish_shapes(m, err))) return st;
    return set_swa_layers(m, err);
}

/* The classification head (llama.cpp binds cls, cls.bias, cls.output and
 * cls.output.bias per architecture, all optional: src/models/bert.cpp,
 * jina-bert-v2.cpp, qwen3.cpp). Bound for every architecture, so the head
 * code takes any backbone's pooled row: cls may have any row count up to d
 * (d for BERT, 1 for Jina v2), cls.output one row per classifier label. */
static int bind_head(tl_model *m, tl_error *err) {
    const int d = m->hp.n_embd;
    const tl_gguf_tensor *c = tl_gguf_find_tensor(m->gguf, "cls.weight");
    const int64_t n_cls = c && c->ne[1] >= 1 && c->ne[1] <= d ? c->ne[1] : d;
    int st;
    if ((st = bind(m, "cls.weight", d, n_cls, 0, 1, &m->cls, err)) ||
        (m->cls && (st = bind(m, "cls.bias", n_cls, 0, 0, 0, &m->cls_b, err))) ||
        (st = bind(m, "cls.output.weight", m->cls ? n_cls : d, m->hp.n_cls_labels, 0, 1, &m->cls_out, err)) ||
        (m->cls_out && (st = bind(m, "cls.output.bias", m->hp.n_cls_labels, 0, 0, 0, &m->cls_out_b, err))))
        return st;
    return TL_OK;
}

/* A copy of the string at key as a C string in *out (NULL when absent). */
static int dup_str_key(const tl_gguf *g, const char *key, char **out, tl_error *err) {
    tl_str s;
    *out = NULL;
    if (tl_gguf_get_str(g, key, &s) != 1) return TL_OK;
    if (!(*out = malloc(s.len + 1))) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    memcpy(*out, s.ptr, s.len);
    (*out)[s.len] = 0;
    return TL_OK;
}

static int load_common(const char *path, tl_model **out, tl_error *err) {
    *out = NULL;
    tl_model *m = calloc(1, sizeof *m);
    if (!m) return tl_fail(err, TL_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&m->pack_mu, NULL);
    int st = tl_gguf_open(path, &m->gguf, err);
    if (st == TL_OK) st = tl_tokenizer_load(m->gguf, &m->tok, err);
    if (st == TL_OK) st = dup_str_key(m->gguf, "tokenizer.chat_template", &m->chat_template, err);
    /* llama_model_chat_template(model, "rerank") reads this key */
    if (st == TL_OK) st = dup_str_key(m->gguf, "tokenizer.chat_template.rerank", &m->rerank_template, err);
    if (st != TL_OK) {
        tl_model_free(m);
        return st;
    }
    *out = m;
    return TL_OK;
}

int tl_model_load_vocab(const char *path, tl_model **out, tl_error *err) {
    return load_common(path, out, err);
}

int tl_model_load(const char *path, tl_model **out, tl_error *err) {
    tl_model *m;
    int st = load_common(path, &m, err);
    if (st) return st;
    tl_str an;
    int r = tl_gguf_get_str(m->gguf, "general.architecture", &an);
    if (r != 1) {
        st = tl_fail(err, TL_ERR_FORMAT, "metadata general.architecture is missing");
    } else if (!(m->arch = find_arch(an))) {
        st = tl_fail(err, TL_ERR_UNSUPPORTED, "architecture '%.*s' is not supported (supported: %s)",
                     (int)(an.len > 64 ? 64 : an.len), an.ptr, tl_supported_architectures());
    } else if (m->gguf->n_tensors == 0) {
        st = tl_fail(err, TL_ERR_FORMAT, "the file has no tensors (vocabulary only?)");
    }
    if (!st) st = read_hparams(m, err);
    if (!st) st = bind_weights(m, err);
    if (!st) st = bind_head(m, err);
    if (!st && tl_tokenizer_has_vocab(m->tok) && m->hp.n_vocab != tl_tokenizer_n_vocab(m->tok))
        st = tl_fail(err, TL_ERR_FORMAT, "output has %d rows but the vocabulary has %d tokens",
                     m->hp.n_vocab, tl_tokenizer_n_vocab(m->tok));
    if (st) {
        tl_model_free(m);
        return st;
    }
    *out = m;
    return TL_OK;
}

void tl_model_free(tl_model *m) {
    if (!m) return;
    tl_model_packed_free(m);
    pthread_mutex_destroy(&m->pack_mu);
    free(m->chat_template);
    free(m->rerank_template);
    free(m->layers);
    free(m->kv_dim);
    tl_tokenizer_free(m->tok);
    tl_gguf_close(m->gguf);
    free(m);
}

int tl_model_n_vocab(const tl_model *m) {
    return m->arch && !tl_tokenizer_has_vocab(m->tok) ? m->hp.n_vocab : tl_tokenizer_n_vocab(m->tok);
}
int tl_model_n_ctx_train(const tl_model *m) { return m->arch ? m->hp.n_ctx_train : 0; }
int tl_model_can_run(const tl_model *m) { return m->arch != NULL; }
int tl_model_is_encoder(const tl_model *m) { return m && m->arch && is_encoder(m->arch); }
int tl_model_n_expert(const tl_model *m, int *n_used) {
    if (n_used) *n_used = m && m->arch ? m->hp.n_expert_used : 0;
    return m && m->arch ? m->hp.n_expert : 0;
}
const char *tl_model_chat_template(const tl_model *m) { return m->chat_template; }
int tl_model_n_embd(const tl_model *m) { return m && m->arch ? m->hp.n_embd : 0; }
int tl_model_pooling(const tl_model *m) { return m && m->arch ? m->hp.pooling : TL_POOL_MEAN; }
int tl_model_n_cls_out(const tl_model *m) {
    if (!m || !m->arch) return 0;
    return m->cls_out ? (int)m->cls_out->ne[1] : m->cls ? (int)m->cls->ne[1] : 0;
}
const char *tl_model_rerank_template(const tl_model *m) { return m ? m->rerank_template : NULL; }

static const char *const POOL_NAMES[] = {"none", "mean", "cls", "last", "rank"};
#define N_POOL_NAMES (int)(sizeof POOL_NAMES / sizeof POOL_NAMES[0])

int tl_pooling_parse(const char *name) {
    for (int i = 0; name && i < N_POOL_NAMES; i++)
        if (!strcmp(name, POOL_NAMES[i])) return i;
    return -2;
}

const char *tl_pooling_name(int pooling) {
    return pooling >= 0 && pooling < N_POOL_NAMES ? POOL_NAMES[pooling] : "?";
}

int tl_tokenize(const tl_model *m, const char *text, size_t len, int flags, int32_t **ids,
                size_t *n_ids, tl_error *err) {
    return tl_tokenizer_encode(m->tok, text, len, flags, ids, n_ids, err);
}
int tl_model_add_bos(const tl_model *m) { return tl_tokenizer_add_bos(m->tok); }
int tl_model_add_eos(const tl_model *m) { return tl_tokenizer_add_eos(m->tok); }
int32_t tl_token_bos(const tl_model *m) { return tl_tokenizer_bos(m->tok); }
int32_t tl_token_eos(const tl_model *m) { return tl_tokenizer_eos(m->tok); }
int tl_token_is_eog(const tl_model *m, int32_t id) { return tl_tokenizer_is_eog(m->tok, id); }
size_t tl_token_piece(const tl_model *m, int32_t id, int special, char *out, size_t cap) {
    return tl_tokenizer_piece(m->tok, id, special, out, cap);
}
void tl_free(void *p) { free(p); }

static size_t w_bytes(tl_w t) { return t ? (size_t)t->nbytes : 0; }

/* A memory-bound decode reads each weight once per token, so this divided by
 * the token time is the weight bandwidth reached (tokenloop bench). Fused
 * tensors count through their views, which tile the whole tensor. */
size_t tl_model_decode_bytes(const tl_model *m) { return tl_model_step_bytes(m, 1); }

size_t tl_model_step_bytes(const tl_model *m, int n_seq) {
    if (!m || !m->arch) return 0;
    if (n_seq < 1) n_seq = 1;
    size_t n = w_bytes(m->output_norm) + w_bytes(m->output) + w_bytes(m->rope_freqs) + w_bytes(m->rope_long) +
               w_bytes(m->embd_norm) + w_bytes(m->embd_norm_b) +
               w_bytes(m->pl_model_proj) + w_bytes(m->pl_proj_norm);
    if (m->pl_tok_embd) /* one row per sequence */
        n += (size_t)n_seq * tl_row_size((tl_type)m->pl_tok_embd->type, m->pl_tok_embd->ne[0]);
    if (m->output != m->tok_embd)
        n += (size_t)n_seq * tl_row_size((tl_type)m->tok_embd->type, m->tok_embd->ne[0]);
    for (int i = 0; i < m->hp.n_layer; i++)
        for (int b = 0; b < m->layers[i].n_block + (m->layers[i].out_scale != NULL); b++) {
            if (b == m->layers[i].n_block) {
                n += w_bytes(m->layers[i].out_scale);
                continue;
            }
            const tl_block *B = &m->layers[i].block[b];
            const tl_moe_block *E = &B->u.moe;
            tl_w ws[TL_BLOCK_MAX_W];
            const int nw = tl_block_weights(B, 0, ws);
            /* of several sequences' tokens, the experts some one chose (one
             * token: exactly n_used, counted in integers below) */
            const double chosen = B->kind == TL_BLOCK_MOE && n_seq > 1
                                      ? E->n_expert * (1.0 - pow(1.0 - (double)E->n_used / E->n_expert, n_seq))
                                      : 0;
            for (int k = 0; k < nw; k++) {
                /* a token reads only its chosen experts' slices */
                const int exps = B->kind == TL_BLOCK_MOE && (ws[k] == E->gate || ws[k] == E->up || ws[k] == E->down ||
                                                             ws[k] == E->gate_up ||
                                                             ws[k] == E->gate_b || ws[k] == E->up_b || ws[k] == E->down_b);
                if (!exps) n += w_bytes(ws[k]);
                else if (n_seq == 1) n += w_bytes(ws[k]) / (size_t)E->n_expert * (size_t)E->n_used;
                else n += (size_t)((double)(w_bytes(ws[k]) / (size_t)E->n_expert) * chosen + 0.5);
            }
        }
    return n;
}

tl_w tl_model_rope_factors(const tl_model *m, int n_ctx) {
    if (!m->rope_long) return NULL;
    const int64_t padded = ((int64_t)n_ctx + 255) / 256 * 256;
    return padded > m->hp.rope_n_ctx_orig ? m->rope_long : m->rope_short;
}

int tl_model_kv_swa(const tl_model *m, int l) {
    if (m->hp.n_swa <= 0) return 0;
    for (int i = 0; i < m->hp.n_layer; i++)
        for (int b = 0; b < m->layers[i].n_block; b++) {
            const tl_block *B = &m->layers[i].block[b];
            if (B->kind == TL_BLOCK_ATTN && !B->u.attn.kv_shared && B->u.attn.kv_layer == l) return B->u.attn.swa;
        }
    return 0;
}

int tl_block_weights(const tl_block *b, int matmul_only, tl_w *out) {
    tl_w all[TL_BLOCK_MAX_W];
    int n = 0, nmat = 0;
    switch (b->kind) {
    case TL_BLOCK_ATTN: {
        const tl_attn_block *a = &b->u.attn;
        const tl_w w[] = {a->wq,        a->wk, a->wv, a->wo, a->norm,  a->q_norm, a->k_norm, a->post_norm,
                          a->bq,        a->bk, a->bv, a->bo, a->sinks, a->ln,     a->ln_b};
        nmat = 4;
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) all[n++] = w[i];
        break;
    }
    case TL_BLOCK_FFN: {
        const tl_ffn_block *f = &b->u.ffn;
        const tl_w w[] = {f->gate, f->up, f->down, f->norm, f->post_norm, f->up_b, f->down_b, f->ln, f->ln_b};
        nmat = 3;
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) all[n++] = w[i];
        break;
    }
    case TL_BLOCK_PLE: {
        const tl_ple_block *p = &b->u.ple;
        const tl_w w[] = {p->gate, p->proj, p->post_norm};
        nmat = 2;
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) all[n++] = w[i];
        break;
    }
    case TL_BLOCK_GDN: {
        const tl_gdn_block *g = &b->u.gdn;
        const tl_w w[] = {g->wqkv, g->wz, g->wbeta, g->walpha, g->wout, g->norm, g->conv, g->dt_bias, g->a, g->ssm_norm};
        nmat = 5;
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) all[n++] = w[i];
        break;
    }
    case TL_BLOCK_MOE: {
        /* the router is a matrix too, though only an expert count wide */
        const tl_moe_block *e = &b->u.moe;
        const tl_w w[] = {e->gate,     e->up,       e->down,      e->sh_gate,  e->sh_up,        e->sh_down,
                          e->router,   e->gate_up,  e->norm,      e->router_b, e->gate_b,       e->up_b,
                          e->down_b,   e->sh_router, e->post_norm, e->sh_norm, e->sh_post_norm, e->out_norm,
                          e->router_s, e->down_s};
        nmat = 8;
        for (size_t i = 0; i < sizeof w / sizeof w[0]; i++) all[n++] = w[i];
        break;
    }
    }
    int k = 0;
    for (int i = 0; i < (matmul_only ? nmat : n); i++)
        if (all[i]) out[k++] = all[i];
    return k;
}
