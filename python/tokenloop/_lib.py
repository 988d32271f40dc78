"""The C library (libtokenloop.so, built from this repository's src/) and the
part of include/tokenloop.h this package calls, as ctypes declarations.

Every structure mirrors its C definition field by field, in order; the test
(tests/py/test_python_pkg.py) compiles a program against the header and checks
each size and offset here. Structures the library reads or writes through a
pointer from us end in zeroed spare bytes, so that a field appended to the C
struct later reads as 0 (every parameter's default) instead of past our buffer.

ctypes releases the GIL around every foreign call; callbacks take it back
only while they run."""
import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int32,
                    c_size_t, c_uint8, c_uint64, c_void_p)

# tl_status
OK = 0
ERR_IO = -1
ERR_FORMAT = -2
ERR_NOMEM = -3
ERR_ARG = -4
ERR_UNSUPPORTED = -5
ERR_CONTEXT_FULL = -6

TOK_ADD_BOS = 1
TOK_PARSE_SPECIAL = 2

SEED_RANDOM = (1 << 64) - 1
STEP_MAX_FEED = 17

# tl_pooling
POOL_MODEL, POOL_NONE, POOL_MEAN, POOL_CLS, POOL_LAST = -1, 0, 1, 2, 3
# tl_stop_reason
STOP_NONE, STOP_EOG, STOP_STRING, STOP_LENGTH, STOP_CONTEXT, STOP_CALLBACK = range(6)
# tl_spec_mode
SPEC_OFF, SPEC_AUTO, SPEC_NGRAM, SPEC_DRAFT = range(4)
# harmony pieces
HARMONY_REASONING, HARMONY_CONTENT, HARMONY_CALL = 1, 2, 3
HARMONY_THINK_OPEN = b"<|channel|>analysis<|message|>"
HARMONY_THINK_CLOSE = b"<|end|>"

_SPARE = 256  # zeroed bytes after a structure the library reads or fills


class Error(Structure):  # tl_error
    _fields_ = [("status", c_int), ("msg", c_char * 512)]


class CtxParams(Structure):  # tl_ctx_params
    _fields_ = [("n_ctx", c_int), ("n_threads", c_int), ("n_batch", c_int), ("n_seq_max", c_int),
                ("kv_bytes", c_size_t), ("n_logits_max", c_int), ("numerics", c_int), ("kv_type_k", c_int),
                ("kv_type_v", c_int), ("share_threads", c_void_p), ("n_seq_embd", c_int),
                ("_spare", c_uint8 * _SPARE)]


class LogitBias(Structure):  # tl_logit_bias
    _fields_ = [("token", c_int32), ("bias", c_float)]


class SamplerParams(Structure):  # tl_sampler_params
    _fields_ = [("temp", c_float), ("top_k", c_int), ("top_p", c_float), ("min_p", c_float),
                ("repeat_penalty", c_float), ("freq_penalty", c_float), ("presence_penalty", c_float),
                ("penalty_last_n", c_int), ("seed", c_uint64), ("logit_bias", POINTER(LogitBias)),
                ("n_logit_bias", c_int)]


class SamplerParamsIn(Structure):  # the same with spare bytes, for tl_sampler_new
    _fields_ = SamplerParams._fields_ + [("_spare", c_uint8 * _SPARE)]


class TokenProb(Structure):  # tl_token_prob
    _fields_ = [("token", c_int32), ("prob", c_float), ("logprob", c_float)]


class GenEvent(Structure):  # tl_gen_event (read only: the library owns it)
    _fields_ = [("token", c_int32), ("text", c_void_p), ("text_len", c_size_t), ("chosen", TokenProb),
                ("top", POINTER(TokenProb)), ("n_top", c_int), ("reasoning", c_int), ("forced", c_int),
                ("source", c_int)]


GenCallback = CFUNCTYPE(c_int, POINTER(GenEvent), c_void_p)
HarmonyCallback = CFUNCTYPE(c_int, c_void_p, c_int, c_char_p, c_void_p, c_size_t)


class GenParams(Structure):  # tl_gen_params
    _fields_ = [("n_predict", c_int), ("stop", POINTER(c_char_p)), ("n_stop", c_int), ("n_top", c_int),
                ("ignore_eog", c_int), ("on_token", GenCallback), ("user", c_void_p), ("spec", c_int),
                ("spec_max", c_int), ("draft_ctx", c_void_p), ("draft_seq", c_int), ("grammar", c_void_p),
                ("think_open", c_char_p), ("think_close", c_char_p), ("think_started", c_int),
                ("think_budget", c_int), ("grammar_trigger", c_char_p), ("grammar_trigger_start", c_int),
                ("tracer", c_void_p), ("trace_cached", c_int), ("special_text", c_int),
                ("_spare", c_uint8 * _SPARE)]


class GenStats(Structure):  # tl_gen_stats
    _fields_ = [("n_prompt", c_int), ("n_gen", c_int), ("prefill_s", c_double), ("ttft_s", c_double),
                ("decode_s", c_double), ("n_drafted", c_int), ("n_accepted", c_int), ("n_reasoning", c_int),
                ("n_masks", c_int), ("mask_median_us", c_double), ("mask_s", c_double), ("stop", c_int),
                ("_spare", c_uint8 * _SPARE)]


class Batch(Structure):  # tl_batch
    _fields_ = [("n", c_int), ("token", POINTER(c_int32)), ("seq", POINTER(c_int32)), ("logits", POINTER(c_uint8)),
                ("pending", c_int), ("_spare", c_uint8 * _SPARE)]


class ThreadStats(Structure):  # tl_thread_stats
    _fields_ = [("n_threads", c_int), ("jobs", c_uint64), ("wall_s", c_double), ("busy_s", c_double),
                ("_spare", c_uint8 * _SPARE)]


# name -> (restype, argtypes); every function returning a tl_status is int.
_P = c_void_p
_I32P = POINTER(c_int32)
_ERR = POINTER(Error)
_PROTOS = {
    "tl_model_load": (c_int, [c_char_p, POINTER(_P), _ERR]),
    "tl_model_free": (None, [_P]),
    "tl_model_n_vocab": (c_int, [_P]),
    "tl_model_n_ctx_train": (c_int, [_P]),
    "tl_model_can_run": (c_int, [_P]),
    "tl_model_chat_template": (c_char_p, [_P]),
    "tl_model_add_bos": (c_int, [_P]),
    "tl_model_add_eos": (c_int, [_P]),
    "tl_model_n_embd": (c_int, [_P]),
    "tl_model_pooling": (c_int, [_P]),
    "tl_pooling_parse": (c_int, [c_char_p]),
    "tl_pooling_name": (c_char_p, [c_int]),
    "tl_ctx_embed": (c_int, [_P, _I32P, c_size_t, c_int, c_int, POINTER(c_float), _ERR]),
    "tl_ctx_embed_batch": (c_int, [_P, POINTER(_I32P), POINTER(c_size_t), c_int, c_int, c_int,
                                   POINTER(POINTER(c_float)), _ERR]),
    "tl_token_bos": (c_int32, [_P]),
    "tl_token_eos": (c_int32, [_P]),
    "tl_token_is_eog": (c_int, [_P, c_int32]),
    "tl_token_piece": (c_size_t, [_P, c_int32, c_int, c_void_p, c_size_t]),
    "tl_tokenize": (c_int, [_P, c_char_p, c_size_t, c_int, POINTER(_I32P), POINTER(c_size_t), _ERR]),
    "tl_free": (None, [c_void_p]),
    "tl_numerics_parse": (c_int, [c_char_p]),
    "tl_kv_type_parse": (c_int, [c_char_p]),
    "tl_spec_parse": (c_int, [c_char_p]),
    "tl_spec_check_draft": (c_int, [_P, _P, _ERR]),
    "tl_ctx_new": (c_int, [_P, POINTER(CtxParams), POINTER(_P), _ERR]),
    "tl_ctx_free": (None, [_P]),
    "tl_ctx_n_ctx": (c_int, [_P]),
    "tl_ctx_n_past": (c_int, [_P]),
    "tl_ctx_truncate": (c_int, [_P, c_int, _ERR]),
    "tl_ctx_eval": (c_int, [_P, _I32P, c_size_t, c_int, _ERR]),
    "tl_ctx_logits": (POINTER(c_float), [_P, c_int]),
    "tl_ctx_backend": (c_char_p, [_P]),
    "tl_ctx_numerics": (c_char_p, [_P]),
    "tl_ctx_sizing": (c_char_p, [_P]),
    "tl_ctx_thread_stats": (None, [_P, POINTER(ThreadStats)]),
    "tl_ctx_decode": (c_int, [_P, POINTER(Batch), _ERR]),
    "tl_ctx_batch_logits": (POINTER(c_float), [_P, c_int]),
    "tl_seq_tokens": (_I32P, [_P, c_int, POINTER(c_int)]),
    "tl_sampler_default_params": (SamplerParams, []),
    "tl_sampler_new": (c_int, [POINTER(SamplerParamsIn), c_int, POINTER(_P), _ERR]),
    "tl_sampler_free": (None, [_P]),
    "tl_sampler_accept": (None, [_P, c_int32]),
    "tl_grammar_parse": (c_int, [c_char_p, c_size_t, POINTER(_P), _ERR]),
    "tl_grammar_from_json_schema": (c_int, [c_char_p, c_size_t, POINTER(_P), _ERR]),
    "tl_grammar_free": (None, [_P]),
    "tl_json_schema_to_gbnf": (c_int, [c_char_p, c_size_t, POINTER(c_void_p), _ERR]),
    "tl_vocab_trie_new": (c_int, [_P, POINTER(_P), _ERR]),
    "tl_vocab_trie_free": (None, [_P]),
    "tl_matcher_new": (c_int, [_P, _P, POINTER(_P), _ERR]),
    "tl_matcher_free": (None, [_P]),
    "tl_step_new": (c_int, [_P, c_int, _P, POINTER(GenParams), POINTER(_P), _ERR]),
    "tl_step_free": (None, [_P]),
    "tl_step_feed": (c_int, [_P, c_int, _I32P, c_int]),
    "tl_step_take": (c_int, [_P, POINTER(POINTER(c_float)), c_int, _ERR]),
    "tl_step_flush": (c_size_t, [_P, POINTER(c_void_p)]),
    "tl_step_count": (c_int, [_P]),
    "tl_step_spec_stats": (None, [_P, POINTER(c_int), POINTER(c_int)]),
    "tl_generate": (c_int, [_P, _P, _I32P, c_size_t, POINTER(GenParams), POINTER(GenStats), _ERR]),
    "tl_chat_template_new": (c_int, [_P, c_char_p, POINTER(_P), _ERR]),
    "tl_chat_template_free": (None, [_P]),
    "tl_chat_template_render": (c_int, [_P, c_char_p, c_size_t, c_int, POINTER(c_void_p), POINTER(c_size_t),
                                        _ERR]),
    "tl_chat_add_bos": (c_int, [_P, c_char_p]),
    "tl_chat_think_markers": (c_int, [c_char_p, POINTER(c_char_p), POINTER(c_char_p)]),
    "tl_chat_think_started": (c_int, [c_char_p, c_size_t]),
    "tl_chat_harmony": (c_int, [c_char_p]),
    "tl_harmony_new": (c_int, [POINTER(_P), _ERR]),
    "tl_harmony_free": (None, [_P]),
    "tl_harmony_feed": (c_int, [_P, c_char_p, c_size_t, c_int, HarmonyCallback, c_void_p]),
}


def _find():
    env = os.environ.get("TOKENLOOP_LIB")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libtokenloop.so")


def _load():
    path = _find()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(f"tokenloop: cannot load the C library {path}: {e} (the package is built by "
                          "'pip install ./python' from the repository; TOKENLOOP_LIB names another copy)") from e
    for name, (res, args) in _PROTOS.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib, path


lib, lib_path = _load()
