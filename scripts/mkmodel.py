#!/usr/bin/env python3
"""Writes small GGUF models with seeded random weights and the metadata that
llama.cpp's converter writes for each architecture, so that tokenloop and
llama.cpp can be compared on architectures we have no real model file for.
The vocabulary (tokenizer.ggml.*) is copied from a shared vocab file so both
loaders accept it. Same arguments, same bytes.

Usage: mkmodel.py ARCH OUT.gguf [--seed N] [--type f32|f16|q8_0] [--tied|--untied] [--vocab FILE]
                  [--arch-name NAME] [--drop TENSOR] [--longrope]
                  [--rope-scaling linear|yarn|longrope] [--rope-factor F] [--rope-orig-ctx N] [--rope-attn-factor F]
                  [--add-token TEXT] [--add-control TEXT] [--eos TEXT] [--template FILE] [--rerank]
                  [--no-rerank-template] [--no-rerank-dense]
ARCH: llama3 (Llama 3.1 RoPE frequency factors), qwen2 (QKV biases), qwen3
(QK-norm), mistral (arch llama with a sliding window key, as Mistral 7B v0.1
converts), phi3 (fused attn_qkv, ffn_up holding gate and up), llama1b (the
shape of Llama 3.2 1B: 2048 wide, 16 layers, 32/8 heads, 8192 FFN, the
128,256-token Llama 3 BPE vocabulary, tied output; weights N(0, 0.02); streamed
to the file one tensor at a time, so memory stays near one tensor; for the
quantized variants run `tokenloop quantize` on the F16 file, see
scripts/mkmodel-1b.sh). Mixtures of experts: qwen3moe (8 experts, 3 used,
QK-norm), mixtral (llama with 8 experts, 2 used), qwen2moe (8 experts, 2
used, a shared expert with its sigmoid gate), gpt-oss (sinks, biases, YaRN,
windowed even layers, 4 of 8 experts); their routers are drawn 4x larger so
that routing is decisive. qwen3moe-a3b: Qwen3-30B-A3B's layer at 8 layers,
streamed (benchmarks; see build_big_moe). --vocab FILE overrides the vocabulary file.
--arch-name, --drop, --rope-scaling longrope (and --longrope on an
architecture other than phi3) make files tokenloop must refuse, for the error
tests. --longrope on phi3 writes Phi-3 128k's LongRoPE factors, the original
context from --rope-orig-ctx. --rope-scaling linear|yarn writes the keys
llama.cpp's converter writes for a rope_scaling of that type: the factor
(--rope-factor, default 4), and for YaRN the original context
(--rope-orig-ctx, default the context length) and beta_fast 32, beta_slow 1
(gpt-oss's config); --rope-attn-factor adds rope.scaling.attn_factor. --add-token/--add-control/--eos/--template give a
random model a chat format of its own (markers such as <think> as single
tokens), for the server tests of reasoning and tool calls. Encoders (embeddings
only, the WordPiece vocabulary of tests/oracle/fixtures/bert_vocab.json): bert
(bge's layout: absolute positions, biases, GELU, CLS pooling) and nomic-bert
(nomic-embed-text's: fused qkv, RoPE, SwiGLU, mean pooling), 2 layers of 128.
--rerank makes a
Qwen3-Reranker as llama.cpp's converter writes one (conversion/qwen.py):
pooling_type rank, classifier.output_labels ["yes", "no"], the rerank prompt
as tokenizer.chat_template.rerank, and cls.output [D x 2]. The converter copies
the lm_head's "yes" and "no" rows there (and leaves output.weight out when the
head is not tied); a random head's rows would give logits tens apart and
scores of exactly 0 or 1, so cls.output is drawn at a scale that keeps the
scores spread (std ~0.5 per logit), from its own stream.
--no-rerank-template leaves the template out (llama-server then formats a
pair as BERT cross-encoders take it: [BOS] query [EOS] [SEP] document [EOS]).
bert --rerank makes a cross-encoder as llama.cpp's converter writes
bge-reranker (XLMRobertaForSequenceClassification, conversion/bert.py):
classifier.dense as cls [D x D] + cls.bias, classifier.out_proj as cls.output
[D x 1] + cls.output.bias, classifier.output_labels ["LABEL_0"], and pooling
type rank (the converter leaves it to --reranking; written here so the file
says what it is); --no-rerank-dense leaves cls out, as the converter writes
BertForSequenceClassification (ms-marco-MiniLM: the pooler dropped, the
classifier as cls.output). The head is drawn from its own stream, so the
backbone is the plain file's of the same seed.
"""
import argparse
import math
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
VOCAB_DIR = os.environ.get("TL_VOCAB_DIR", os.path.join(ROOT, "..", "shared", "vocab"))
# SentencePiece-style vocabularies; llama.cpp's phi3 loader looks up phi-3's
# own special tokens, so that architecture gets its vocabulary.
VOCAB = "ggml-vocab-llama-spm.gguf"  # 32000 tokens
VOCAB_PHI3 = "ggml-vocab-phi-3.gguf"

# Shapes shared by every architecture (small, but GQA and several layers).
D, N_HEAD, N_HEAD_KV, FF = 128, 4, 2, 256
HD = D // N_HEAD
EPS = 1e-5

# Per architecture: gguf arch name, layers, rope base, tied output by default,
# sliding window key (0: none).
ARCHS = {
    "llama3": dict(arch="llama", layers=2, base=500000.0, tied=False, swa=0),
    "qwen2": dict(arch="qwen2", layers=2, base=1000000.0, tied=True, swa=0),
    "qwen3": dict(arch="qwen3", layers=3, base=1000000.0, tied=True, swa=0),
    "mistral": dict(arch="llama", layers=2, base=10000.0, tied=False, swa=16),
    "phi3": dict(arch="phi3", layers=2, base=10000.0, tied=False, swa=2047),
    # Mixtures of experts: (experts, used, expert width, shared expert width).
    "qwen3moe": dict(arch="qwen3moe", layers=2, base=1000000.0, tied=False, swa=0, moe=(8, 3, 64, 0)),
    "mixtral": dict(arch="llama", layers=2, base=1000000.0, tied=False, swa=0, moe=(8, 2, FF, 0)),
    "qwen2moe": dict(arch="qwen2moe", layers=2, base=1000000.0, tied=False, swa=0, moe=(8, 2, 64, 128)),
    # gpt-oss: biased q/k/v/o, attention sinks, a 16-position window on the even
    # layers, YaRN (factor 32 over 4096 positions, as its files say), a biased
    # router with softmax over the chosen 4, biased experts, clamped SwiGLU
    "gpt-oss": dict(arch="gpt-oss", layers=4, base=150000.0, tied=False, swa=16, moe=(8, 4, 128, 0)),
    # Qwen3.5/3.6 hybrids (build_qwen35): Gated DeltaNet layers with full
    # attention every second layer (full_attention_interval), gated attention
    # with partial interleaved M-RoPE; qwen35moe adds experts and a shared one.
    "qwen35": dict(arch="qwen35", layers=4, base=10000000.0, tied=False, swa=0),
    "qwen35moe": dict(arch="qwen35moe", layers=4, base=10000000.0, tied=False, swa=0, moe=(8, 3, 64, 128)),
    # Gemma 4 (build_gemma4): sliding-window and global layers of their own
    # shapes; gemma4 is E2B-like (per-layer inputs, the last two layers
    # reading earlier layers' KV cache, global layers without attn_v, wider
    # FFNs on the shared layers), gemma4moe 26B-A4B-like (experts beside the
    # dense FFN, gate and up fused, per-expert scales)
    "gemma4": dict(arch="gemma4", layers=6, base=1000000.0, tied=True, swa=16),
    "gemma4moe": dict(arch="gemma4", layers=4, base=1000000.0, tied=True, swa=16, moe=(8, 2, 64, 0)),
    # encoders (build_bert): embeddings only, a WordPiece vocabulary
    "bert": dict(arch="bert", layers=2, base=10000.0, tied=False, swa=0),
    "nomic-bert": dict(arch="nomic-bert", layers=2, base=1000.0, tied=False, swa=0),
}

# Gemma 4's shapes: sliding-window layers' heads of 32 (2 KV heads, fully
# rotated), global ones' of 64 (partly rotated: proportional RoPE through
# rope_freqs); layers alternate window, global.
G4 = dict(hd_swa=32, nkv_swa=2, hd=64, nkv=2, rot_frac=0.25, base_swa=10000.0, n_pl=32, shared=2, softcap=30.0)

# The hybrids' shapes: DeltaNet heads of 32 (2 key heads, 4 value heads), a
# 4-wide convolution; attention heads of 64 (4 query, 2 KV), 16 of them
# rotated in M-RoPE sections [3, 3, 2, 0] (text positions: every section the same).
Q35 = dict(d_conv=4, d_state=32, n_kh=2, n_vh=4, hd=64, n_head=4, n_head_kv=2, n_rot=16, sections=[3, 3, 2, 0],
           interval=2)

# The router's weights are drawn this many times larger than a matrix's, so
# that the chosen experts win by clear margins: a float rounding difference
# between two engines then never changes which experts a token runs.
ROUTER_SCALE = 4.0

# Llama 3.1's rope_scaling ("rope_type": "llama3"), with a short original
# context so that the three bands (1, smoothed, factor) all occur at hd=32.
LLAMA3_ROPE = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=256)

# llama1b: Llama 3.2 1B's shape (head dim 64), with llama.cpp's Llama 3 vocabulary.
L1B = dict(d=2048, layers=16, heads=32, heads_kv=8, ff=8192, base=500000.0, ctx=8192, std=0.02)
VOCAB_L1B = "ggml-vocab-llama-bpe.gguf"  # 128256 tokens
# Qwen3-Reranker's prompt, as llama.cpp's converter writes it
# (conversion/qwen.py, Qwen3Model.set_gguf_parameters).
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
LLAMA3_TEMPLATE = os.path.join(ROOT, "tests", "templates", "llama3.jinja")

TYPES = {"f32": QT.F32, "f16": QT.F16, "q8_0": QT.Q8_0}
FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7}


def llama3_rope_factors(base, dim):
    """The rope_freqs tensor as convert_hf_to_gguf computes it for llama3 rope."""
    p = LLAMA3_ROPE
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    old = p["original_max_position_embeddings"]
    low_wl = old / p["low_freq_factor"]
    high_wl = old / p["high_freq_factor"]
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(p["factor"])
        else:
            s = (old / wl - p["low_freq_factor"]) / (p["high_freq_factor"] - p["low_freq_factor"])
            out.append(1.0 / ((1 - s) / p["factor"] + s))
    return np.array(out, dtype=np.float32)


def tokenizer_fields(path):
    """The tokenizer.* fields of a GGUF file as (name, type, array subtype,
    value). GGUFReader takes seconds over a 32k-token vocabulary and the suite
    makes dozens of files from the same few: the fields are cached (pickled,
    keyed by the file's path, size and mtime) in models/random/.vocab-cache."""
    import hashlib
    import pickle
    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:24]
    cache = os.path.join(ROOT, "models", "random", ".vocab-cache", key + ".pkl")
    try:
        with open(cache, "rb") as f:
            return pickle.load(f)
    except (OSError, EOFError, pickle.UnpicklingError):
        pass
    r = gguf.GGUFReader(path)
    out = []
    for name, f in r.fields.items():
        if name.startswith("tokenizer."):
            vt = f.types[0]
            out.append((name, vt, f.types[1] if vt == VT.ARRAY else None, f.contents()))
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        tmp = f"{cache}.{os.getpid()}"
        with open(tmp, "wb") as f:
            pickle.dump(out, f)
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only tree: no cache, same fields
    return out


def copy_vocab(w, path, keys=None, none=False, added=(), eos=None, template=None):
    """Copies the tokenizer.* keys; their names go into the set keys if given.
    none: write only tokenizer.ggml.model = "none" (a file without a vocabulary,
    as benchmark files often are), keeping the vocabulary's size.
    added: (text, token type) pairs appended to the vocabulary, as a converter
    writes a model's added tokens (USER_DEFINED for <think>, CONTROL for
    <|im_end|>); eos: the text of the end token, template: a chat template."""
    if not os.path.isfile(path):
        sys.exit(f"mkmodel: vocabulary {path} not found (set TL_VOCAB_DIR, see scripts/fetch-vocab.sh)")
    n_vocab, tokens = None, []
    if none:
        w.add_tokenizer_model("none")
        if keys is not None:
            keys.update({"tokenizer.ggml.model", "tokenizer.chat_template", "tokenizer.ggml.add_bos_token"})
    for name, vt, sub, val in tokenizer_fields(path):
        if none:
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(val)
            continue
        if added and name == "tokenizer.ggml.tokens":
            val = val + [t for t, _ in added]
        elif added and name == "tokenizer.ggml.scores":
            val = val + [0.0] * len(added)
        elif added and name == "tokenizer.ggml.token_type":
            val = val + [int(k) for _, k in added]
        elif added and name == "tokenizer.ggml.merges":
            pass  # added tokens are matched whole, before BPE
        elif (eos and name == "tokenizer.ggml.eos_token_id") or (template and name == "tokenizer.chat_template"):
            continue
        if name == "tokenizer.ggml.tokens":
            tokens = val
        w.add_key_value(name, val, vt, sub)
        if keys is not None:
            keys.add(name)
        if name == "tokenizer.ggml.tokens":
            n_vocab = len(val)
    if not n_vocab:
        sys.exit(f"mkmodel: {path} has no tokenizer.ggml.tokens")
    if eos:
        if eos not in tokens:
            sys.exit(f"mkmodel: --eos {eos!r} is not a token")
        w.add_eos_token_id(tokens.index(eos))
    if template:
        with open(template, encoding="utf-8") as f:
            w.add_chat_template(f.read())
    return n_vocab


class Gen:
    """Seeded tensor factory; every tensor draws from one stream in file order."""

    def __init__(self, seed, wtype):
        self.rng = np.random.default_rng(seed)
        self.wtype = wtype

    def mat(self, rows, cols, scale=None):
        s = scale if scale is not None else 1.0 / math.sqrt(cols)
        return (self.rng.standard_normal((rows, cols)) * s).astype(np.float32)

    def vec(self, n, mean, std):
        return (mean + self.rng.standard_normal(n) * std).astype(np.float32)


def add_weight(w, name, arr, wtype, drop):
    """Matrices in the chosen type; 1-D tensors (norms, biases, factors) and
    the router (ffn_gate_inp, kept F32 as llama.cpp's quantizer keeps it) stay F32."""
    if name in drop:
        return
    qt = (TYPES[wtype] if arr.ndim >= 2 and "ffn_gate_inp" not in name and "ssm_conv1d" not in name
          and not name.endswith(".bias") else QT.F32)
    if qt == QT.F32:
        w.add_tensor(name, arr)
    elif qt == QT.F16:
        w.add_tensor(name, arr.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(arr, qt), raw_dtype=qt)


def put_experts(put, g, b, moe, biases=False):
    """A layer's experts (router drawn ROUTER_SCALE larger), gpt-oss's biases,
    and a shared expert with its gate when the shape has one, in file order."""
    n_exp, _, ff_exp, ff_sh = moe
    put(b + "ffn_gate_inp.weight", g.mat(n_exp, D, ROUTER_SCALE / math.sqrt(D)))
    put(b + "ffn_gate_exps.weight", np.stack([g.mat(ff_exp, D) for _ in range(n_exp)]))
    put(b + "ffn_up_exps.weight", np.stack([g.mat(ff_exp, D) for _ in range(n_exp)]))
    put(b + "ffn_down_exps.weight", np.stack([g.mat(D, ff_exp) for _ in range(n_exp)]))
    if biases:
        put(b + "ffn_gate_inp.bias", g.vec(n_exp, 0.0, 0.5))
        put(b + "ffn_gate_exps.bias", np.stack([g.vec(ff_exp, 0.0, 0.5) for _ in range(n_exp)]))
        put(b + "ffn_up_exps.bias", np.stack([g.vec(ff_exp, 0.0, 0.5) for _ in range(n_exp)]))
        put(b + "ffn_down_exps.bias", np.stack([g.vec(D, 0.0, 0.5) for _ in range(n_exp)]))
    if ff_sh:
        put(b + "ffn_gate_inp_shexp.weight", g.vec(D, 0.0, 1.0 / math.sqrt(D)))
        put(b + "ffn_gate_shexp.weight", g.mat(ff_sh, D))
        put(b + "ffn_up_shexp.weight", g.mat(ff_sh, D))
        put(b + "ffn_down_shexp.weight", g.mat(D, ff_sh))


def build_qwen35(args, w, spec, g, put, n_vocab):
    """The layers of a Qwen3.5/3.6 hybrid, as llama.cpp's converter names them."""
    q = Q35
    L = spec["layers"]
    kd, vd = q["d_state"] * q["n_kh"], q["d_state"] * q["n_vh"]
    conv_dim = 2 * kd + vd
    w.add_ssm_conv_kernel(q["d_conv"])
    w.add_ssm_inner_size(vd)
    w.add_ssm_state_size(q["d_state"])
    w.add_ssm_time_step_rank(q["n_vh"])
    w.add_ssm_group_count(q["n_kh"])
    w.add_full_attention_interval(q["interval"])
    w.add_rope_dimension_sections(q["sections"])
    w.add_key_length(q["hd"])
    w.add_value_length(q["hd"])
    moe = spec.get("moe")
    hd, nh, nkv = q["hd"], q["n_head"], q["n_head_kv"]

    def attention(b):  # gated full attention (q carries its gate)
        put(b + "attn_q.weight", g.mat(2 * nh * hd, D))
        put(b + "attn_k.weight", g.mat(nkv * hd, D))
        put(b + "attn_v.weight", g.mat(nkv * hd, D))
        put(b + "attn_q_norm.weight", g.vec(hd, 1.0, 0.2))
        put(b + "attn_k_norm.weight", g.vec(hd, 1.0, 0.2))
        put(b + "attn_output.weight", g.mat(D, nh * hd))

    def ffn(b):  # after the post-attention norm: experts or a dense FFN
        put(b + "post_attention_norm.weight", g.vec(D, 1.0, 0.2))
        if moe:
            put_experts(put, g, b, moe)
        else:
            put(b + "ffn_gate.weight", g.mat(FF, D))
            put(b + "ffn_up.weight", g.mat(FF, D))
            put(b + "ffn_down.weight", g.mat(D, FF))

    for i in range(L):
        b = f"blk.{i}."
        put(b + "attn_norm.weight", g.vec(D, 1.0, 0.2))
        if (i + 1) % q["interval"]:  # a DeltaNet layer
            put(b + "attn_qkv.weight", g.mat(conv_dim, D))
            put(b + "attn_gate.weight", g.mat(vd, D))
            put(b + "ssm_conv1d.weight", g.mat(conv_dim, q["d_conv"], 0.5))
            put(b + "ssm_dt.bias", g.vec(q["n_vh"], 0.0, 0.5))
            # -exp(A_log): decays between exp(-0.1 softplus) and exp(-2 softplus)
            put(b + "ssm_a", -np.exp(g.rng.uniform(np.log(0.1), np.log(2.0), q["n_vh"])).astype(np.float32))
            put(b + "ssm_beta.weight", g.mat(q["n_vh"], D))
            put(b + "ssm_alpha.weight", g.mat(q["n_vh"], D))
            put(b + "ssm_norm.weight", g.vec(q["d_state"], 1.0, 0.2))
            put(b + "ssm_out.weight", g.mat(D, vd))
        else:
            attention(b)
        ffn(b)
    put("output_norm.weight", g.vec(D, 1.0, 0.2))
    put("output.weight", g.mat(n_vocab, D))
    # multi-token prediction blocks (--mtp) after the model: drawn last, so the
    # model's own weights are those of the same seed without them
    for i in range(L, L + args.mtp):
        b = f"blk.{i}."
        put(b + "attn_norm.weight", g.vec(D, 1.0, 0.2))
        attention(b)
        ffn(b)
        put(b + "nextn.eh_proj.weight", g.mat(D, 2 * D))
        put(b + "nextn.enorm.weight", g.vec(D, 1.0, 0.2))
        put(b + "nextn.hnorm.weight", g.vec(D, 1.0, 0.2))
        put(b + "nextn.shared_head_norm.weight", g.vec(D, 1.0, 0.2))


def build_gemma4(args, w, spec, g, put, n_vocab):
    """The layers of a Gemma 4 model, as llama.cpp's converter names them
    (conversion/gemma.py Gemma4Model). Keys by name: the gguf package on PyPI
    may predate the writer methods for them."""
    q = G4
    L = spec["layers"]
    moe = spec.get("moe")
    a = spec["arch"]
    swa = [i % 2 == 0 for i in range(L)]
    shared = 0 if moe else q["shared"]
    ff = [FF if moe or i < L - shared else 2 * FF for i in range(L)]
    w.add_array(f"{a}.attention.sliding_window_pattern", swa)
    w.add_array(f"{a}.attention.head_count_kv", [q["nkv_swa"] if s else q["nkv"] for s in swa])
    w.add_array(f"{a}.feed_forward_length", ff)
    w.add_uint32(f"{a}.attention.key_length", q["hd"])
    w.add_uint32(f"{a}.attention.value_length", q["hd"])
    w.add_uint32(f"{a}.attention.key_length_swa", q["hd_swa"])
    w.add_uint32(f"{a}.attention.value_length_swa", q["hd_swa"])
    w.add_uint32(f"{a}.rope.dimension_count_swa", q["hd_swa"])
    w.add_float32(f"{a}.rope.freq_base_swa", q["base_swa"])
    w.add_uint32(f"{a}.attention.shared_kv_layers", shared)
    w.add_uint32(f"{a}.embedding_length_per_layer_input", 0 if moe else q["n_pl"])
    w.add_float32(f"{a}.final_logit_softcapping", q["softcap"])
    # proportional RoPE on the global layers: a quarter of the pairs rotate
    n_rot = int(q["hd"] * q["rot_frac"] / 2)
    put("rope_freqs.weight", np.array([1.0] * n_rot + [1e30] * (q["hd"] // 2 - n_rot), dtype=np.float32))
    if not moe:
        npl = q["n_pl"]
        put("per_layer_token_embd.weight", g.mat(n_vocab, L * npl, 1.0))
        put("per_layer_model_proj.weight", g.mat(L * npl, D))
        put("per_layer_proj_norm.weight", g.vec(npl, 1.0, 0.2))
    for i in range(L):
        b = f"blk.{i}."
        hd, nkv = (q["hd_swa"], q["nkv_swa"]) if swa[i] else (q["hd"], q["nkv"])
        # scores are q.k unscaled (q and k normed): norm weights of hd^-1/4
        # keep them of unit size, as trained ones do, not hd-sized
        qk = hd ** -0.25
        put(b + "attn_norm.weight", g.vec(D, 1.0, 0.2))
        put(b + "attn_q.weight", g.mat(N_HEAD * hd, D))
        if i < L - shared:
            put(b + "attn_k.weight", g.mat(nkv * hd, D))
            if swa[i]:  # the global layers' v is k's projection (attention_k_eq_v)
                put(b + "attn_v.weight", g.mat(nkv * hd, D))
            put(b + "attn_k_norm.weight", g.vec(hd, qk, 0.2 * qk))
        put(b + "attn_q_norm.weight", g.vec(hd, qk, 0.2 * qk))
        put(b + "attn_output.weight", g.mat(D, N_HEAD * hd))
        put(b + "post_attention_norm.weight", g.vec(D, 1.0, 0.2))
        put(b + "ffn_norm.weight", g.vec(D, 1.0, 0.2))
        put(b + "ffn_gate.weight", g.mat(ff[i], D))
        put(b + "ffn_up.weight", g.mat(ff[i], D))
        put(b + "ffn_down.weight", g.mat(D, ff[i]))
        put(b + "post_ffw_norm.weight", g.vec(D, 1.0, 0.2))
        if moe:
            n_exp, _, ff_exp, _ = moe
            # its router reads RMSNorm(x) / sqrt(d): weights sqrt(d) larger
            # than put_experts' give its logits the same clear margins
            put(b + "ffn_gate_inp.weight", g.mat(n_exp, D, ROUTER_SCALE))
            put(b + "ffn_gate_inp.scale", g.vec(D, 1.0, 0.2))
            put(b + "ffn_gate_up_exps.weight", np.stack([g.mat(2 * ff_exp, D) for _ in range(n_exp)]))
            put(b + "ffn_down_exps.weight", np.stack([g.mat(D, ff_exp) for _ in range(n_exp)]))
            put(b + "ffn_down_exps.scale", g.vec(n_exp, 1.0, 0.3))
            put(b + "pre_ffw_norm_2.weight", g.vec(D, 1.0, 0.2))
            put(b + "post_ffw_norm_1.weight", g.vec(D, 1.0, 0.2))
            put(b + "post_ffw_norm_2.weight", g.vec(D, 1.0, 0.2))
        else:
            put(b + "inp_gate.weight", g.mat(q["n_pl"], D))
            put(b + "proj.weight", g.mat(D, q["n_pl"]))
            put(b + "post_norm.weight", g.vec(D, 1.0, 0.2))
        put(b + "layer_output_scale.weight", g.vec(1, 1.0, 0.3))
    put("output_norm.weight", g.vec(D, 1.0, 0.2))


# The encoders' vocabulary: the cut of llama.cpp's ggml-vocab-bert-bge that
# test_bert_vocab checks (5,042 WordPiece tokens, [CLS] 101, [SEP] 102).
BERT_VOCAB = os.path.join(ROOT, "tests", "oracle", "fixtures", "bert_vocab.json")


def build_bert(args):
    """bert (absolute positions, biases everywhere, a GELU FFN, CLS pooling,
    as bge) or nomic-bert (fused qkv, NeoX RoPE, SwiGLU without biases, mean
    pooling, as nomic-embed-text), with the keys and tensor names llama.cpp's
    converter writes: post-norm layers, attention over the whole text."""
    import json
    spec = ARCHS[args.arch]
    nomic = args.arch == "nomic-bert"
    with open(BERT_VOCAB, encoding="utf-8") as f:
        v = json.load(f)["vocab"]
    tokens = [bytes.fromhex(h) for h in v["tokens_hex"]]
    w = gguf.GGUFWriter(args.out, args.arch_name or spec["arch"])
    w.add_name(f"tokenloop-random-{args.arch}")
    w.add_file_type(FILE_TYPE[args.type])
    ctx = min(args.ctx, 512)
    w.add_context_length(ctx)
    w.add_embedding_length(D)
    w.add_block_count(spec["layers"])
    w.add_feed_forward_length(FF)
    w.add_head_count(N_HEAD)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    if args.rerank:
        w.add_pooling_type(gguf.PoolingType.RANK)
        w.add_classifier_output_labels(["LABEL_0"])
    else:
        w.add_pooling_type(gguf.PoolingType.MEAN if nomic else gguf.PoolingType.CLS)
    if nomic:
        w.add_rope_freq_base(spec["base"])
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("bert-bge")
    w.add_token_list(tokens)
    w.add_token_types(v["token_types"])
    w.add_token_type_count(2)
    w.add_unk_token_id(v["unknown_token_id"])
    w.add_sep_token_id(v["seperator_token_id"])
    w.add_pad_token_id(v["padding_token_id"])
    w.add_uint32("tokenizer.ggml.cls_token_id", v["cls_token_id"])
    w.add_mask_token_id(v["mask_token_id"])
    g = Gen(args.seed, args.type)
    drop = set(args.drop or [])
    put = lambda name, arr: add_weight(w, name, arr, args.type, drop)  # noqa: E731
    put("token_embd.weight", g.mat(len(tokens), D, 1.0))
    # F32 in every variant, as llama-quantize leaves them (llama.cpp adds
    # the token_types row with ggml_add, which takes no quantized operand)
    put32 = lambda name, arr: add_weight(w, name, arr, "f32", drop)  # noqa: E731
    put32("token_types.weight", g.mat(2, D, 1.0))
    if not nomic:
        put32("position_embd.weight", g.mat(ctx, D, 1.0))
    put("token_embd_norm.weight", g.vec(D, 1.0, 0.2))
    put("token_embd_norm.bias", g.vec(D, 0.0, 0.2))
    for i in range(spec["layers"]):
        b = f"blk.{i}."
        if nomic:
            put(b + "attn_qkv.weight", g.mat(3 * D, D))
        else:
            for t in ("q", "k", "v"):
                put(b + f"attn_{t}.weight", g.mat(D, D))
                put(b + f"attn_{t}.bias", g.vec(D, 0.0, 0.5))
        put(b + "attn_output.weight", g.mat(D, D))
        if not nomic:
            put(b + "attn_output.bias", g.vec(D, 0.0, 0.5))
        put(b + "attn_output_norm.weight", g.vec(D, 1.0, 0.2))
        put(b + "attn_output_norm.bias", g.vec(D, 0.0, 0.2))
        put(b + "ffn_up.weight", g.mat(FF, D))
        if nomic:
            put(b + "ffn_gate.weight", g.mat(FF, D))
        else:
            put(b + "ffn_up.bias", g.vec(FF, 0.0, 0.5))
        put(b + "ffn_down.weight", g.mat(D, FF))
        if not nomic:
            put(b + "ffn_down.bias", g.vec(D, 0.0, 0.5))
        put(b + "layer_output_norm.weight", g.vec(D, 1.0, 0.2))
        put(b + "layer_output_norm.bias", g.vec(D, 0.0, 0.2))
    if args.rerank:  # after the layers, as the classifier follows them in the checkpoint
        h = Gen(args.seed + 7919, args.type)
        if not args.no_rerank_dense:  # tanh(cls x + b) stays off its +-1 plateaus
            put("cls.weight", h.mat(D, D, 0.7 / math.sqrt(D)))
            put("cls.bias", h.vec(D, 0.0, 0.3))
        put("cls.output.weight", h.mat(1, D, 4.0 / math.sqrt(D)))  # scores a few apart
        put("cls.output.bias", h.vec(1, 0.0, 0.5))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build(args):
    spec = ARCHS[args.arch]
    if args.experts:
        if not spec.get("moe"):
            sys.exit(f"mkmodel.py: {args.arch} has no experts (--experts)")
        n_exp, n_used = (int(v) for v in args.experts.split(","))
        spec["moe"] = (n_exp, n_used) + tuple(spec["moe"][2:])
    arch = args.arch_name or spec["arch"]
    tied = spec["tied"] if args.tied is None else args.tied
    w = gguf.GGUFWriter(args.out, arch)
    added = [(t, gguf.TokenType.USER_DEFINED) for t in args.add_token or []]
    added += [(t, gguf.TokenType.CONTROL) for t in args.add_control or []]
    n_vocab = copy_vocab(w, args.vocab or os.path.join(VOCAB_DIR, VOCAB_PHI3 if args.arch == "phi3" else VOCAB),
                         none=args.no_vocab, added=added, eos=args.eos, template=args.template)
    L = spec["layers"]
    w.add_name(f"tokenloop-random-{args.arch}")
    w.add_file_type(FILE_TYPE[args.type])
    w.add_context_length(args.ctx)
    w.add_embedding_length(D)
    hybrid = args.arch in ("qwen35", "qwen35moe")
    w.add_block_count(L + (args.mtp if hybrid else 0))
    if hybrid and args.mtp:
        w.add_uint32(f"{spec['arch']}.nextn_predict_layers", args.mtp)
    gemma4 = spec["arch"] == "gemma4"
    if not gemma4:  # per layer (build_gemma4)
        w.add_feed_forward_length(FF)
    w.add_head_count(Q35["n_head"] if hybrid else N_HEAD)
    if not gemma4:
        w.add_head_count_kv(Q35["n_head_kv"] if hybrid else N_HEAD_KV)
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_freq_base(spec["base"])
    w.add_rope_dimension_count(Q35["n_rot"] if hybrid else G4["hd"] if gemma4 else HD)
    w.add_vocab_size(n_vocab)
    if spec["swa"]:
        w.add_sliding_window(spec["swa"])
    moe = spec.get("moe")
    if moe:
        n_exp, n_used, ff_exp, ff_sh = moe
        w.add_expert_count(n_exp)
        w.add_expert_used_count(n_used)
        if spec["arch"] != "llama":
            w.add_expert_feed_forward_length(ff_exp)
        if ff_sh:
            w.add_expert_shared_feed_forward_length(ff_sh)
        if args.expert_weights_scale is not None:
            w.add_float32(f"{arch}.expert_weights_scale", args.expert_weights_scale)
    if args.arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(args.rope_orig_ctx or 4096)
    if args.arch == "gpt-oss":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    if args.rope_scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType(args.rope_scaling))
        w.add_rope_scaling_factor(args.rope_factor)
        if args.rope_scaling == "yarn":
            w.add_rope_scaling_orig_ctx_len(args.rope_orig_ctx or 4096)
            w.add_rope_scaling_yarn_beta_fast(32.0)
            w.add_rope_scaling_yarn_beta_slow(1.0)
    if args.rope_attn_factor is not None:
        w.add_rope_scaling_attn_factors(args.rope_attn_factor)
    if args.rerank:  # conversion/qwen.py, Qwen3Model.set_gguf_parameters
        w.add_pooling_type(gguf.PoolingType.RANK)
        w.add_classifier_output_labels(["yes", "no"])
        if not args.no_rerank_template:
            w.add_chat_template([{"name": "rerank", "template": RERANK_TEMPLATE}])

    g = Gen(args.seed, args.type)
    drop = set(args.drop or [])
    put = lambda name, arr: add_weight(w, name, arr, args.type, drop)  # noqa: E731
    # Gemma 4's output is tied and soft-capped at 30: embeddings of unit size
    # would saturate every top logit at the cap (near ties everywhere)
    put("token_embd.weight", g.mat(n_vocab, D, 1.0 / math.sqrt(D) if gemma4 else 1.0))
    if hybrid or gemma4:
        (build_gemma4 if gemma4 else build_qwen35)(args, w, spec, g, put, n_vocab)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return
    if args.arch == "llama3":
        put("rope_freqs.weight", llama3_rope_factors(spec["base"], HD))
    if args.longrope:  # Phi-3 128k's factors (not drawn from the stream; both away from 1)
        put("rope_factors_long.weight", np.linspace(1.0, 4.0, HD // 2, dtype=np.float32))
        put("rope_factors_short.weight", np.linspace(1.0, 1.5, HD // 2, dtype=np.float32))
    kv = N_HEAD_KV * HD
    for i in range(L):
        b = f"blk.{i}."
        put(b + "attn_norm.weight", g.vec(D, 1.0, 0.2))
        if args.arch == "phi3":
            put(b + "attn_qkv.weight", g.mat(D + 2 * kv, D))
        else:
            put(b + "attn_q.weight", g.mat(D, D))
            put(b + "attn_k.weight", g.mat(kv, D))
            put(b + "attn_v.weight", g.mat(kv, D))
        if args.arch in ("qwen2", "qwen2moe", "gpt-oss"):
            put(b + "attn_q.bias", g.vec(D, 0.0, 0.5))
            put(b + "attn_k.bias", g.vec(kv, 0.0, 0.5))
            put(b + "attn_v.bias", g.vec(kv, 0.0, 0.5))
        if args.arch in ("qwen3", "qwen3moe"):
            put(b + "attn_q_norm.weight", g.vec(HD, 1.0, 0.2))
            put(b + "attn_k_norm.weight", g.vec(HD, 1.0, 0.2))
        put(b + "attn_output.weight", g.mat(D, D))
        if args.arch == "gpt-oss":
            put(b + "attn_output.bias", g.vec(D, 0.0, 0.5))
            put(b + "attn_sinks.weight", g.vec(N_HEAD, 0.0, 1.0))
            put(b + "post_attention_norm.weight", g.vec(D, 1.0, 0.2))
        else:
            put(b + "ffn_norm.weight", g.vec(D, 1.0, 0.2))
        if moe:
            put_experts(put, g, b, moe, biases=args.arch == "gpt-oss")
            continue
        if args.arch == "phi3":
            put(b + "ffn_up.weight", g.mat(2 * FF, D))
        else:
            put(b + "ffn_gate.weight", g.mat(FF, D))
            put(b + "ffn_up.weight", g.mat(FF, D))
        put(b + "ffn_down.weight", g.mat(D, FF))
    put("output_norm.weight", g.vec(D, 1.0, 0.2))
    if not tied:
        head = g.mat(n_vocab, D)
        if not args.rerank:  # a reranker's lm_head becomes cls.output only
            put("output.weight", head)
    if args.rerank:
        put("cls.output.weight", Gen(args.seed + 7919, args.type).mat(2, D, 0.5 / math.sqrt(D)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def to_type(arr, wtype):
    """A weight in the chosen type (1-D tensors stay F32)."""
    if arr.ndim == 1 or wtype == "f32":
        return arr, None
    if wtype == "f16":
        return arr.astype(np.float16), None
    return gguf.quants.quantize(arr, TYPES[wtype]), TYPES[wtype]


def build_llama1b(args):
    """Writes the header first, then each tensor as it is drawn: the whole
    model (2.5 GB in F16) is never in memory, only the largest tensor."""
    p = L1B
    d, hd, ff = p["d"], p["d"] // p["heads"], p["ff"]
    kv = p["heads_kv"] * hd
    w = gguf.GGUFWriter(args.out, "llama")
    vocab = args.vocab or os.path.join(VOCAB_DIR, VOCAB_L1B)
    vocab_keys = set()
    n_vocab = copy_vocab(w, vocab, vocab_keys, none=args.no_vocab)
    w.add_name("tokenloop-random-llama1b")
    w.add_file_type(FILE_TYPE[args.type])
    w.add_context_length(p["ctx"])
    w.add_embedding_length(d)
    w.add_block_count(p["layers"])
    w.add_feed_forward_length(ff)
    w.add_head_count(p["heads"])
    w.add_head_count_kv(p["heads_kv"])
    w.add_layer_norm_rms_eps(EPS)
    w.add_rope_freq_base(p["base"])
    w.add_rope_dimension_count(hd)
    w.add_vocab_size(n_vocab)
    if "tokenizer.chat_template" not in vocab_keys:
        with open(LLAMA3_TEMPLATE, encoding="utf-8") as f:
            w.add_chat_template(f.read())
    if "tokenizer.ggml.add_bos_token" not in vocab_keys:  # as Llama 3's converted files say
        w.add_add_bos_token(True)
    # (name, shape as rows x cols or n, kind); tied output: no output.weight.
    plan = [("token_embd.weight", (n_vocab, d), "mat")]
    for i in range(p["layers"]):
        b = f"blk.{i}."
        plan += [(b + "attn_norm.weight", (d,), "norm"), (b + "attn_q.weight", (d, d), "mat"),
                 (b + "attn_k.weight", (kv, d), "mat"), (b + "attn_v.weight", (kv, d), "mat"),
                 (b + "attn_output.weight", (d, d), "mat"), (b + "ffn_norm.weight", (d,), "norm"),
                 (b + "ffn_gate.weight", (ff, d), "mat"), (b + "ffn_up.weight", (ff, d), "mat"),
                 (b + "ffn_down.weight", (d, ff), "mat")]
    plan.append(("output_norm.weight", (d,), "norm"))
    rng = np.random.default_rng(args.seed)

    def draw(shape, kind):
        if kind == "norm":
            return (1.0 + rng.standard_normal(shape, dtype=np.float32) * p["std"]).astype(np.float32)
        out = np.empty(shape, dtype=np.float16 if args.type == "f16" else np.float32)
        for r in range(0, shape[0], 8192):  # bounded float32 temporaries
            out[r:r + 8192] = rng.standard_normal((min(8192, shape[0] - r), shape[1]), dtype=np.float32) * p["std"]
        return out if args.type in ("f16", "f32") else to_type(out, args.type)[0]

    for name, shape, kind in plan:
        qt = QT.F32 if kind == "norm" else TYPES[args.type]
        byte_shape = gguf.quant_shape_to_byte_shape(shape, qt)
        nbytes = int(np.prod(byte_shape))
        if qt in (QT.F32, QT.F16):
            w.add_tensor_info(name, shape, np.dtype(np.float32 if qt == QT.F32 else np.float16), nbytes)
        else:
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind in plan:
        w.write_tensor_data(draw(shape, kind))
    w.close()


# Benchmark shapes of mixtures of experts, streamed like llama1b. qwen3moe-a3b:
# Qwen3-30B-A3B's layer (2048 wide, 32/4 heads of 128, QK-norm, 128 experts
# of width 768, 8 used) at 8 of its 48 layers, with SmolLM2's vocabulary
# (--vocab FILE: any GGUF whose tokenizer.* keys to copy; default the
# SmolLM2 file `make models` fetches). Weights N(0, 0.02), the router 4x.
# gptoss-20b: gpt-oss-20b's layer (2880 wide, 64/8 heads of 64, sinks and
# biases, 128-position windows on the even layers, YaRN 32x over 4096, 32
# experts of width 2880, 4 used) at 8 of its 24 layers, the same vocabulary.
BIG_MOE = {
    "qwen3moe-a3b": dict(arch="qwen3moe", d=2048, layers=8, heads=32, heads_kv=4, hd=128, n_exp=128, used=8,
                         ff_exp=768, base=1000000.0, ctx=40960, std=0.02),
    "gptoss-20b": dict(arch="gpt-oss", d=2880, layers=8, heads=64, heads_kv=8, hd=64, n_exp=32, used=4,
                       ff_exp=2880, base=150000.0, ctx=131072, std=0.02, swa=128),
    # Qwen3.6-35B-A3B's layers (2048 wide; Gated DeltaNet with 16 key and 32
    # value heads of 128, a 4-wide convolution; gated attention with 16/2
    # heads of 256, 64 dimensions rotated; 256 experts of width 512, 8 used,
    # and a shared one of 512) at 8 of its 40 layers: 6 DeltaNet, 2 attention
    "qwen35moe-a3b": dict(arch="qwen35moe", d=2048, layers=8, heads=16, heads_kv=2, hd=256, n_exp=256, used=8,
                          ff_exp=512, base=10000000.0, ctx=262144, std=0.02, n_rot=64, sections=[11, 11, 10, 0],
                          ssm=dict(d_conv=4, d_state=128, n_kh=16, n_vh=32, interval=4), ff_sh=512),
    # Gemma 4 26B-A4B's layers (2816 wide; sliding-window layers with 16/8
    # heads of 256, a global one with 16/2 heads of 512 whose v is k's
    # projection and a quarter of whose pairs rotate; a dense GeGLU FFN of
    # 2112 beside 128 experts of width 704, 8 used; logits soft-capped at 30)
    # at 6 of its 30 layers: 5 window, 1 global
    "gemma4-26b-a4b": dict(arch="gemma4", d=2816, layers=6, heads=16, heads_kv=8, hd=256, n_exp=128, used=8,
                           ff_exp=704, base=1000000.0, ctx=262144, std=0.02, swa=1024, ff=2112,
                           g4=dict(hd=512, heads_kv=2, base_swa=10000.0, rot_frac=0.25, every=6)),
}
SMOLLM2 = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def build_big_moe(args):
    """The whole model is never in memory: the header first, then each tensor
    as it is drawn (an expert tensor at a time, ~400 MB in F16)."""
    p = BIG_MOE[args.arch]
    d, hd, ne, ff = p["d"], p["hd"], p["n_exp"], p["ff_exp"]
    q, kv = p["heads"] * hd, p["heads_kv"] * hd
    w = gguf.GGUFWriter(args.out, p["arch"])
    n_vocab = copy_vocab(w, args.vocab or SMOLLM2, None, none=args.no_vocab)
    w.add_name(f"tokenloop-random-{args.arch}")
    w.add_file_type(FILE_TYPE[args.type])
    w.add_context_length(p["ctx"])
    w.add_embedding_length(d)
    w.add_block_count(p["layers"])
    g4 = p.get("g4")
    if not g4:
        w.add_feed_forward_length(ff if p["arch"] == "gpt-oss" else ff * 8)
    w.add_expert_feed_forward_length(ff)
    w.add_expert_count(ne)
    w.add_expert_used_count(p["used"])
    w.add_head_count(p["heads"])
    a = p["arch"]
    if g4:  # per-layer shapes, keys by name (build_gemma4)
        swa = [(i + 1) % g4["every"] != 0 for i in range(p["layers"])]
        w.add_array(f"{a}.attention.sliding_window_pattern", swa)
        w.add_array(f"{a}.attention.head_count_kv", [p["heads_kv"] if s_ else g4["heads_kv"] for s_ in swa])
        w.add_uint32(f"{a}.feed_forward_length", p["ff"])
        w.add_uint32(f"{a}.attention.key_length", g4["hd"])
        w.add_uint32(f"{a}.attention.value_length", g4["hd"])
        w.add_uint32(f"{a}.attention.key_length_swa", hd)
        w.add_uint32(f"{a}.attention.value_length_swa", hd)
        w.add_uint32(f"{a}.rope.dimension_count_swa", hd)
        w.add_float32(f"{a}.rope.freq_base_swa", g4["base_swa"])
        w.add_uint32(f"{a}.attention.sliding_window", p["swa"])
        w.add_uint32(f"{a}.attention.shared_kv_layers", 0)
        w.add_uint32(f"{a}.embedding_length_per_layer_input", 0)
        w.add_float32(f"{a}.final_logit_softcapping", 30.0)
    else:
        w.add_head_count_kv(p["heads_kv"])
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(p["base"])
    w.add_rope_dimension_count(g4["hd"] if g4 else p.get("n_rot", hd))
    w.add_vocab_size(n_vocab)
    oss = p["arch"] == "gpt-oss"
    ssm = p.get("ssm")
    if ssm:
        w.add_ssm_conv_kernel(ssm["d_conv"])
        w.add_ssm_inner_size(ssm["d_state"] * ssm["n_vh"])
        w.add_ssm_state_size(ssm["d_state"])
        w.add_ssm_time_step_rank(ssm["n_vh"])
        w.add_ssm_group_count(ssm["n_kh"])
        w.add_full_attention_interval(ssm["interval"])
        w.add_rope_dimension_sections(p["sections"])
        w.add_expert_shared_feed_forward_length(p["ff_sh"])
    if oss:
        w.add_sliding_window(p["swa"])
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(32.0)
        w.add_rope_scaling_orig_ctx_len(4096)
    plan = [("token_embd.weight", (n_vocab, d), "mat")]
    if g4:
        plan += [("rope_freqs.weight", (g4["hd"] // 2,), "ropefreq")]
    for i in range(p["layers"]):
        b = f"blk.{i}."
        if g4:
            h, nk = (hd, p["heads_kv"]) if swa[i] else (g4["hd"], g4["heads_kv"])
            plan += [(b + "attn_norm.weight", (d,), "norm"), (b + "attn_q.weight", (p["heads"] * h, d), "mat"),
                     (b + "attn_k.weight", (nk * h, d), "mat")]
            if swa[i]:
                plan += [(b + "attn_v.weight", (nk * h, d), "mat")]
            plan += [(b + "attn_q_norm.weight", (h,), "norm"), (b + "attn_k_norm.weight", (h,), "norm"),
                     (b + "attn_output.weight", (d, p["heads"] * h), "mat"),
                     (b + "post_attention_norm.weight", (d,), "norm"), (b + "ffn_norm.weight", (d,), "norm"),
                     (b + "ffn_gate.weight", (p["ff"], d), "mat"), (b + "ffn_up.weight", (p["ff"], d), "mat"),
                     (b + "ffn_down.weight", (d, p["ff"]), "mat"), (b + "post_ffw_norm.weight", (d,), "norm"),
                     (b + "ffn_gate_inp.weight", (ne, d), "router"), (b + "ffn_gate_inp.scale", (d,), "norm"),
                     (b + "ffn_gate_up_exps.weight", (ne, 2 * ff, d), "mat"),
                     (b + "ffn_down_exps.weight", (ne, d, ff), "mat"), (b + "ffn_down_exps.scale", (ne,), "norm"),
                     (b + "pre_ffw_norm_2.weight", (d,), "norm"), (b + "post_ffw_norm_1.weight", (d,), "norm"),
                     (b + "post_ffw_norm_2.weight", (d,), "norm"), (b + "layer_output_scale.weight", (1,), "norm")]
            continue
        if oss:
            plan += [(b + "attn_norm.weight", (d,), "norm"), (b + "attn_q.weight", (q, d), "mat"),
                     (b + "attn_q.bias", (q,), "bias"), (b + "attn_k.weight", (kv, d), "mat"),
                     (b + "attn_k.bias", (kv,), "bias"), (b + "attn_v.weight", (kv, d), "mat"),
                     (b + "attn_v.bias", (kv,), "bias"), (b + "attn_output.weight", (d, q), "mat"),
                     (b + "attn_output.bias", (d,), "bias"), (b + "attn_sinks.weight", (p["heads"],), "bias"),
                     (b + "post_attention_norm.weight", (d,), "norm"),
                     (b + "ffn_gate_inp.weight", (ne, d), "router"), (b + "ffn_gate_inp.bias", (ne,), "bias"),
                     (b + "ffn_gate_exps.weight", (ne, ff, d), "mat"), (b + "ffn_gate_exps.bias", (ne, ff), "bias"),
                     (b + "ffn_up_exps.weight", (ne, ff, d), "mat"), (b + "ffn_up_exps.bias", (ne, ff), "bias"),
                     (b + "ffn_down_exps.weight", (ne, d, ff), "mat"), (b + "ffn_down_exps.bias", (ne, d), "bias")]
            continue
        if ssm:
            kd, vd = ssm["d_state"] * ssm["n_kh"], ssm["d_state"] * ssm["n_vh"]
            plan += [(b + "attn_norm.weight", (d,), "norm")]
            if (i + 1) % ssm["interval"]:
                plan += [(b + "attn_qkv.weight", (2 * kd + vd, d), "mat"), (b + "attn_gate.weight", (vd, d), "mat"),
                         (b + "ssm_conv1d.weight", (2 * kd + vd, ssm["d_conv"]), "conv"),
                         (b + "ssm_dt.bias", (ssm["n_vh"],), "bias"), (b + "ssm_a", (ssm["n_vh"],), "decay"),
                         (b + "ssm_beta.weight", (ssm["n_vh"], d), "mat"),
                         (b + "ssm_alpha.weight", (ssm["n_vh"], d), "mat"),
                         (b + "ssm_norm.weight", (ssm["d_state"],), "norm"), (b + "ssm_out.weight", (d, vd), "mat")]
            else:
                plan += [(b + "attn_q.weight", (2 * q, d), "mat"), (b + "attn_k.weight", (kv, d), "mat"),
                         (b + "attn_v.weight", (kv, d), "mat"), (b + "attn_q_norm.weight", (hd,), "norm"),
                         (b + "attn_k_norm.weight", (hd,), "norm"), (b + "attn_output.weight", (d, q), "mat")]
            plan += [(b + "post_attention_norm.weight", (d,), "norm"),
                     (b + "ffn_gate_inp.weight", (ne, d), "router"), (b + "ffn_gate_exps.weight", (ne, ff, d), "mat"),
                     (b + "ffn_up_exps.weight", (ne, ff, d), "mat"), (b + "ffn_down_exps.weight", (ne, d, ff), "mat"),
                     (b + "ffn_gate_inp_shexp.weight", (d,), "bias"),
                     (b + "ffn_gate_shexp.weight", (p["ff_sh"], d), "mat"),
                     (b + "ffn_up_shexp.weight", (p["ff_sh"], d), "mat"),
                     (b + "ffn_down_shexp.weight", (d, p["ff_sh"]), "mat")]
            continue
        plan += [(b + "attn_norm.weight", (d,), "norm"), (b + "attn_q.weight", (q, d), "mat"),
                 (b + "attn_k.weight", (kv, d), "mat"), (b + "attn_v.weight", (kv, d), "mat"),
                 (b + "attn_q_norm.weight", (hd,), "norm"), (b + "attn_k_norm.weight", (hd,), "norm"),
                 (b + "attn_output.weight", (d, q), "mat"), (b + "ffn_norm.weight", (d,), "norm"),
                 (b + "ffn_gate_inp.weight", (ne, d), "router"), (b + "ffn_gate_exps.weight", (ne, ff, d), "mat"),
                 (b + "ffn_up_exps.weight", (ne, ff, d), "mat"), (b + "ffn_down_exps.weight", (ne, d, ff), "mat")]
    plan += [("output_norm.weight", (d,), "norm")] + ([] if g4 else [("output.weight", (n_vocab, d), "mat")])
    rng = np.random.default_rng(args.seed)

    def draw(shape, kind):
        if kind == "ropefreq":  # proportional RoPE (build_gemma4)
            n_rot = int(shape[0] * 2 * g4["rot_frac"] / 2)
            return np.array([1.0] * n_rot + [1e30] * (shape[0] - n_rot), dtype=np.float32)
        if kind == "norm":
            return (1.0 + rng.standard_normal(shape, dtype=np.float32) * p["std"]).astype(np.float32)
        if kind == "router":
            return rng.standard_normal(shape, dtype=np.float32) * (4 * p["std"])
        if kind == "bias":
            return rng.standard_normal(shape, dtype=np.float32) * 0.1
        if kind == "conv":
            return rng.standard_normal(shape, dtype=np.float32) * 0.5
        if kind == "decay":  # -exp(A_log), A_log uniform in [log 0.1, log 2]
            return -np.exp(rng.uniform(np.log(0.1), np.log(2.0), shape)).astype(np.float32)
        out = np.empty(shape, dtype=np.float16 if args.type == "f16" else np.float32)
        flat = out.reshape(-1, shape[-1])
        for r in range(0, flat.shape[0], 8192):  # bounded float32 temporaries
            flat[r:r + 8192] = rng.standard_normal((min(8192, flat.shape[0] - r), shape[-1]), dtype=np.float32) * p["std"]
        return out if args.type in ("f16", "f32") else to_type(out, args.type)[0]

    for name, shape, kind in plan:
        qt = QT.F32 if kind in ("norm", "router", "bias", "conv", "decay", "ropefreq") else TYPES[args.type]
        byte_shape = gguf.quant_shape_to_byte_shape(shape, qt)
        nbytes = int(np.prod(byte_shape))
        if qt in (QT.F32, QT.F16):
            w.add_tensor_info(name, shape, np.dtype(np.float32 if qt == QT.F32 else np.float16), nbytes)
        else:
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind in plan:
        w.write_tensor_data(draw(shape, kind))
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("arch", choices=sorted(ARCHS) + ["llama1b"] + sorted(BIG_MOE))
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--type", choices=sorted(TYPES), help="weight type (default f32; llama1b: f16)")
    t = ap.add_mutually_exclusive_group()
    t.add_argument("--tied", dest="tied", action="store_true", default=None)
    t.add_argument("--untied", dest="tied", action="store_false")
    ap.add_argument("--arch-name", help="write this general.architecture instead")
    ap.add_argument("--drop", action="append", help="leave this tensor out (repeatable)")
    ap.add_argument("--rope-scaling", choices=["linear", "yarn", "longrope"],
                    help="write <arch>.rope.scaling.type and its keys (tokenloop refuses longrope)")
    ap.add_argument("--rope-factor", type=float, default=4.0, help="rope.scaling.factor (default 4)")
    ap.add_argument("--rope-orig-ctx", type=int, help="YaRN's rope.scaling.original_context_length")
    ap.add_argument("--experts", metavar="E,K", help="a mixture's experts and experts used per token")
    ap.add_argument("--expert-weights-scale", type=float,
                    help="write <arch>.expert_weights_scale (llama.cpp reads it for none of these architectures)")
    ap.add_argument("--mtp", type=int, default=0,
                    help="qwen35/qwen35moe: this many multi-token prediction blocks after the layers "
                         "(<arch>.nextn_predict_layers), as Qwen3.5's files carry")
    ap.add_argument("--ctx", type=int, default=4096, help="context_length, the training context (default 4096)")
    ap.add_argument("--n-head", type=int, help="query heads (default 4: heads of 32); 2 gives heads of 64, 1 of 128 "
                    "(the KV heads: at most as many, default 2)")
    ap.add_argument("--rope-attn-factor", type=float, help="rope.scaling.attn_factor")
    ap.add_argument("--longrope", action="store_true",
                    help="add Phi-3 128k's rope_factors_long/short (the long ones apply when the context "
                         "exceeds --rope-orig-ctx, phi3's default 4096)")
    ap.add_argument("--vocab", help="vocabulary GGUF file (llama1b: default TL_VOCAB_DIR/" + VOCAB_L1B + ")")
    ap.add_argument("--add-token", action="append", metavar="TEXT",
                    help="append a token matched whole in text (USER_DEFINED, as <think> is in Qwen 3)")
    ap.add_argument("--add-control", action="append", metavar="TEXT",
                    help="append a control token (CONTROL, as <|im_end|>)")
    ap.add_argument("--eos", metavar="TEXT", help="the end-of-generation token, by its text")
    ap.add_argument("--template", metavar="FILE", help="tokenizer.chat_template from this Jinja file")
    ap.add_argument("--rerank", action="store_true",
                    help="a Qwen3-Reranker: pooling rank, cls.output [D x 2], the rerank prompt template; "
                         "bert: a cross-encoder (cls [D x D], cls.output [D x 1], biases)")
    ap.add_argument("--no-rerank-template", action="store_true",
                    help="with --rerank: no tokenizer.chat_template.rerank")
    ap.add_argument("--no-rerank-dense", action="store_true",
                    help="bert --rerank: no cls.weight (BertForSequenceClassification's classifier alone)")
    ap.add_argument("--no-vocab", action="store_true",
                    help='write tokenizer.ggml.model = "none" and no tokens (the vocabulary\'s size stays)')
    args = ap.parse_args()
    if args.n_head:  # the shared shapes, for the small dense and MoE builders
        global N_HEAD, N_HEAD_KV, HD
        N_HEAD = args.n_head
        N_HEAD_KV = min(N_HEAD_KV, N_HEAD)
        HD = D // N_HEAD
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if args.type is None:
        args.type = "f16" if args.arch == "llama1b" or args.arch in BIG_MOE else "f32"
    if args.arch in BIG_MOE:
        build_big_moe(args)
    elif args.arch == "llama1b":
        build_llama1b(args)
    elif args.arch in ("bert", "nomic-bert"):
        build_bert(args)
    else:
        build(args)


if __name__ == "__main__":
    main()
