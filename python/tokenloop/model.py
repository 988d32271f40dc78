"""tokenloop.Model: a GGUF model and one context (its KV cache) over the C
library, with the CLI's generation loop (tl_generate) behind generate() and
chat(), and OpenAI-shaped dicts from create_completion() and
create_chat_completion().

A Model runs one generation at a time (a lock; other threads wait). A whole
reply is one foreign call (tl_generate), so the GIL is free while it computes;
a stream drives the same loop step by step (tl_step_*, as tl_generate does),
each forward call again one foreign call. Consecutive calls reuse the KV cache
for the tokens a new prompt shares with what the context holds."""
import codecs
import ctypes
import json
import os
import threading
import time
from ctypes import POINTER, byref, c_char_p, c_float, c_int, c_int32, c_size_t, c_uint8, c_void_p

from . import _lib, _reply
from ._lib import lib
from .errors import ArgumentError, check

# Texts embed() runs side by side in one tl_ctx_embed_batch call (sequences
# the context may open for them; their KV blocks go back when the call ends).
EMBED_GROUP = 16


def _err():
    return _lib.Error()


def _bytes(s):
    return s.encode("utf-8") if isinstance(s, str) else bytes(s)


class _Job:
    """One generation's parameters, resolved: the prompt tokens, the
    sampler's settings and the loop's."""

    def __init__(self, ids, sp, n_predict, stop, grammar, n_top, ignore_eos, think):
        self.ids = ids
        self.sp = sp                  # _lib.SamplerParamsIn
        self.n_predict = n_predict
        self.stop = stop              # list of bytes
        self.grammar = grammar        # a _Grammar or None
        self.n_top = n_top
        self.ignore_eos = ignore_eos
        self.think = think            # (open, close, started) or None


class _Grammar:
    """A compiled tl_grammar, freed with its last reference (a job that
    uses one holds it, whatever the model's cache drops meanwhile)."""
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr

    def __del__(self):
        if self.ptr and lib is not None:
            lib.tl_grammar_free(self.ptr)
            self.ptr = None


class Event:
    """A piece of output: text (str, may be empty), the token (-1: text held
    back until the end), whether it is reasoning, and with logprobs the
    token's (token, logprob) and the alternatives [(token, logprob), ...]."""
    __slots__ = ("text", "token", "reasoning", "logprob", "top")

    def __init__(self, text, token, reasoning, logprob=None, top=None):
        self.text = text
        self.token = token
        self.reasoning = reasoning
        self.logprob = logprob
        self.top = top


class Result:
    """How a generation went: prompt tokens (and of those, reused from the
    cache), tokens generated, why it stopped (a tl_stop_reason) and its
    times, as the CLI's stats line reports them."""
    __slots__ = ("n_prompt", "n_cached", "n_gen", "stop", "prefill_s", "ttft_s", "decode_s", "n_drafted",
                 "n_accepted")
    _STOPS = {_lib.STOP_NONE: "none", _lib.STOP_EOG: "eog", _lib.STOP_STRING: "stop string",
              _lib.STOP_LENGTH: "length", _lib.STOP_CONTEXT: "context", _lib.STOP_CALLBACK: "callback"}

    def __init__(self):
        self.n_prompt = self.n_cached = self.n_gen = self.n_drafted = self.n_accepted = 0
        self.stop = _lib.STOP_NONE
        self.prefill_s = self.ttft_s = self.decode_s = 0.0

    @property
    def stop_reason(self):
        """OpenAI's finish_reason."""
        return _finish_reason(self.stop)

    def as_dict(self):
        d = {k: getattr(self, k) for k in self.__slots__}
        d["stop"] = self._STOPS.get(self.stop, str(self.stop))
        d["decode_tok_s"] = (self.n_gen - 1) / self.decode_s if self.decode_s > 0 and self.n_gen > 1 else 0.0
        return d


def _finish_reason(stop):
    return "length" if stop in (_lib.STOP_LENGTH, _lib.STOP_CONTEXT) else "stop"


class Model:
    """A GGUF model loaded with one context.

    path: the .gguf file. n_ctx: positions (0: the engine's choice, as the
    CLI's -c 0). n_threads: threads (None or 0: all CPUs). n_batch: tokens
    per forward call (0: 512). numerics: "fast" or "exact" (None: $TL_NUMERICS
    or fast). kv_type_k / kv_type_v: "f16", "q8_0" or "q4_0". spec:
    speculative decoding, "auto" (default), "off", "ngram" or "draft" (the
    output is the same either way). draft: a draft model's path.
    chat_template: a Jinja template to use instead of the file's."""

    def __init__(self, path, *, n_ctx=0, n_threads=None, n_batch=0, numerics=None, kv_type_k=None,
                 kv_type_v=None, spec="auto", draft=None, chat_template=None):
        self._m = self._ctx = self._dm = self._dctx = self._trie = self._tmpl = None
        self._grammars = {}  # (kind, text) -> _Grammar
        self._glock = threading.Lock()
        self.last = None  # the last generation's Result (stats())
        self.default_seed = None  # the seed of calls that give none (None: random)
        self._lock = threading.Lock()
        self._owner = None
        self.path = os.fspath(path)
        err = _err()
        m = c_void_p()
        check(lib.tl_model_load(_bytes(self.path), byref(m), byref(err)), err, self.path)
        self._m = m
        try:
            if not lib.tl_model_can_run(m):
                raise ArgumentError(f"{self.path}: a vocabulary-only file: it has no weights to run")
            cp = _lib.CtxParams()
            cp.n_ctx = int(n_ctx or 0)
            cp.n_threads = int(n_threads or 0)
            cp.n_batch = int(n_batch or 0)
            cp.numerics = self._parse("numerics", lib.tl_numerics_parse, numerics)
            cp.kv_type_k = self._parse("kv_type_k", lib.tl_kv_type_parse, kv_type_k)
            cp.kv_type_v = self._parse("kv_type_v", lib.tl_kv_type_parse, kv_type_v)
            cp.n_seq_embd = EMBED_GROUP  # embed() runs texts side by side (no KV reserved for them)
            self.spec = self._parse("spec", lib.tl_spec_parse, spec)
            ctx = c_void_p()
            check(lib.tl_ctx_new(m, byref(cp), byref(ctx), byref(err)), err)
            self._ctx = ctx
            if draft and self.spec not in (_lib.SPEC_OFF, _lib.SPEC_NGRAM):
                self._open_draft(os.fspath(draft), cp)
            elif self.spec == _lib.SPEC_DRAFT:
                raise ArgumentError('spec="draft" needs draft=PATH')
        except BaseException:
            self.close()
            raise
        self._tmpl_text = _bytes(chat_template) if chat_template is not None else lib.tl_model_chat_template(m)
        self._harmony = bool(lib.tl_chat_harmony(self._tmpl_text))
        o, c = c_char_p(), c_char_p()
        self._think = (not self._harmony and bool(lib.tl_chat_think_markers(self._tmpl_text, byref(o), byref(c))))
        self._think_markers = (o.value, c.value)
        self._pieces = {}

    @staticmethod
    def _parse(what, fn, value):
        if value is None:
            return 0
        v = fn(_bytes(str(value)))
        if v < 0:
            raise ArgumentError(f"{what}: unknown value {value!r}")
        return v

    def _open_draft(self, path, cp):
        err = _err()
        dm, dctx = c_void_p(), c_void_p()
        check(lib.tl_model_load(_bytes(path), byref(dm), byref(err)), err, path)
        self._dm = dm
        check(lib.tl_spec_check_draft(self._m, dm, byref(err)), err, path)
        dp = _lib.CtxParams()
        dp.n_ctx = lib.tl_ctx_n_ctx(self._ctx)
        dp.n_batch = cp.n_batch
        dp.numerics = cp.numerics
        dp.share_threads = self._ctx.value
        check(lib.tl_ctx_new(dm, byref(dp), byref(dctx), byref(err)), err, path)
        self._dctx = dctx

    # ---- lifetime ----

    def close(self):
        """Frees the context and the model (also at garbage collection);
        waits for a generation another thread runs."""
        if self._owner == threading.get_ident():
            raise RuntimeError("this thread has an unfinished stream on this model: read it to the end or "
                               "close() it first")
        with self._lock:
            self._free()

    def _free(self):
        if self._tmpl:
            lib.tl_chat_template_free(self._tmpl)
        self._grammars = {}
        if self._trie:
            lib.tl_vocab_trie_free(self._trie)
        if self._dctx:
            lib.tl_ctx_free(self._dctx)  # before ctx: it runs on ctx's threads
        if self._dm:
            lib.tl_model_free(self._dm)
        if self._ctx:
            lib.tl_ctx_free(self._ctx)
        if self._m:
            lib.tl_model_free(self._m)
        self._m = self._ctx = self._dm = self._dctx = self._trie = self._tmpl = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _live(self):
        if not self._ctx:
            raise ArgumentError("the model is closed")

    # ---- facts ----

    @property
    def n_ctx(self):
        self._live()
        return lib.tl_ctx_n_ctx(self._ctx)

    @property
    def n_vocab(self):
        self._live()
        return lib.tl_model_n_vocab(self._m)

    @property
    def n_ctx_train(self):
        self._live()
        return lib.tl_model_n_ctx_train(self._m)

    @property
    def token_bos(self):
        return lib.tl_token_bos(self._m)

    @property
    def token_eos(self):
        return lib.tl_token_eos(self._m)

    @property
    def chat_template(self):
        return self._tmpl_text.decode("utf-8", "replace") if self._tmpl_text else None

    @property
    def backend(self):
        """The CPU code path in use, e.g. "avx2"."""
        return lib.tl_ctx_backend(self._ctx).decode()

    @property
    def numerics(self):
        return lib.tl_ctx_numerics(self._ctx).decode()

    @property
    def n_threads(self):
        """Threads the context computes on."""
        self._live()
        ts = _lib.ThreadStats()
        lib.tl_ctx_thread_stats(self._ctx, byref(ts))
        return ts.n_threads

    @property
    def sizing(self):
        """How the context length and the KV cache were sized, and why."""
        return lib.tl_ctx_sizing(self._ctx).decode()

    def stats(self):
        """The last generation's numbers, as the CLI's stats line has them:
        prompt tokens (n_cached of them reused from the context), tokens
        generated, why it stopped, prefill, time to first token and decode
        times and decode_tok_s, speculative guesses drafted and accepted. A
        stream's times include the time its reader took. None before any."""
        return self.last.as_dict() if self.last else None

    def reset(self):
        """Forgets what the context holds (the next prompt is computed whole)."""
        with self._locked():
            err = _err()
            check(lib.tl_ctx_truncate(self._ctx, 0, byref(err)), err)

    # ---- tokens ----

    def tokenize(self, text, add_bos=None, special=False):
        """Token ids of text (str or bytes). add_bos None: as the model's
        metadata asks for completions; special: control-token text such as
        "<|im_start|>" becomes the token."""
        self._live()
        data = _bytes(text)
        if add_bos is None:
            add_bos = bool(lib.tl_model_add_bos(self._m))
        flags = (_lib.TOK_ADD_BOS if add_bos else 0) | (_lib.TOK_PARSE_SPECIAL if special else 0)
        ids = POINTER(c_int32)()
        n = c_size_t()
        err = _err()
        check(lib.tl_tokenize(self._m, data, len(data), flags, byref(ids), byref(n), byref(err)), err)
        try:
            return ids[:n.value] if n.value else []
        finally:
            lib.tl_free(ids)

    def token_bytes(self, token, special=False):
        """The bytes one token stands for (control tokens: only if special)."""
        self._live()
        key = (int(token), bool(special))
        b = self._pieces.get(key)
        if b is None:
            if not 0 <= key[0] < self.n_vocab:
                raise ArgumentError(f"token {token} out of range (vocabulary {self.n_vocab})")
            buf = ctypes.create_string_buffer(256)
            n = lib.tl_token_piece(self._m, key[0], int(special), buf, 256)
            if n > 256:
                buf = ctypes.create_string_buffer(n)
                n = lib.tl_token_piece(self._m, key[0], int(special), buf, n)
            b = self._pieces[key] = buf.raw[:n]
        return b

    def detokenize(self, ids, special=False, as_bytes=False):
        """The text of token ids (str; bytes with as_bytes). Control tokens
        show their text only if special."""
        data = b"".join(self.token_bytes(t, special) for t in ids)
        return data if as_bytes else data.decode("utf-8", "replace")

    # ---- embeddings ----

    @property
    def n_embd(self):
        """The length of an embedding."""
        self._live()
        return lib.tl_model_n_embd(self._m)

    def _embed_ids(self, text):
        """A text's tokens as `tokenloop embed` takes them: BOS and EOS where
        the file asks for them, special-token text parsed."""
        if isinstance(text, (list, tuple)):
            return [int(t) for t in text]
        data = _bytes(text)
        ids = self.tokenize(data, add_bos=None, special=True)
        if lib.tl_model_add_eos(self._m):
            ids.append(lib.tl_token_eos(self._m))
        return ids

    def embed(self, input, pooling=None, normalize=True):
        """Embeddings, as `tokenloop embed` computes them: a text (or token
        ids) gives a list of floats, a list of texts a list of those.
        pooling: "mean", "cls", "last" or "none" (a vector per token); None:
        the file's pooling_type, else mean. normalize: unit L2 length
        (OpenAI's vectors). Texts run side by side, EMBED_GROUP at a time
        (tl_ctx_embed_batch), each vector bitwise the one it gets alone. Runs
        on the context's sequence, so it forgets what the context held for
        generation."""
        single = isinstance(input, (str, bytes)) or (isinstance(input, (list, tuple)) and input and
                                                     isinstance(input[0], int))
        texts = [input] if single else list(input)
        pool = lib.tl_model_pooling(self._m) if pooling is None else self._parse_pooling(pooling)
        if pool == 4:  # TL_POOL_RANK: n_cls_out scores, not n_embd floats (tokenloop rerank, /v1/rerank)
            raise ArgumentError("pooling rank gives a reranker's scores, not embeddings: ask for another pooling")
        d = self.n_embd
        out = []
        self.last_embed_tokens = 0
        ids = [self._embed_ids(t) for t in texts]
        if not all(ids):
            raise ArgumentError("nothing to embed: an empty text")
        with self._locked():
            try:
                for g in range(0, len(ids), EMBED_GROUP):
                    grp = ids[g:g + EMBED_GROUP]
                    k = len(grp)
                    arrs = [(c_int32 * len(t))(*t) for t in grp]
                    rows = [len(t) if pool == _lib.POOL_NONE else 1 for t in grp]
                    vecs = [(c_float * (r * d))() for r in rows]
                    tok = (POINTER(c_int32) * k)(*[ctypes.cast(a, POINTER(c_int32)) for a in arrs])
                    lens = (c_size_t * k)(*[len(t) for t in grp])
                    outs = (POINTER(c_float) * k)(*[ctypes.cast(v, POINTER(c_float)) for v in vecs])
                    err = _err()
                    check(lib.tl_ctx_embed_batch(self._ctx, tok, lens, k, pool, int(bool(normalize)), outs,
                                                 byref(err)), err)
                    for t, r, v in zip(grp, rows, vecs):
                        self.last_embed_tokens += len(t)
                        flat = v[:]
                        out.append([flat[i * d:(i + 1) * d] for i in range(r)] if pool == _lib.POOL_NONE else flat)
            finally:
                lib.tl_ctx_truncate(self._ctx, 0, byref(_err()))  # generation starts over
        return out[0] if single else out

    @staticmethod
    def _parse_pooling(name):
        v = lib.tl_pooling_parse(_bytes(str(name)))
        if v < 0:
            raise ArgumentError(f"pooling: unknown value {name!r} (none, mean, cls, last)")
        return v

    def create_embedding(self, input, model=None, pooling=None, normalize=True):
        """OpenAI's embeddings response as a dict, as llama-cpp-python's
        create_embedding returns it."""
        vecs = self.embed([input] if isinstance(input, (str, bytes)) else input, pooling=pooling,
                          normalize=normalize)
        n = self.last_embed_tokens
        return {"object": "list", "data": [{"object": "embedding", "embedding": v, "index": i}
                                           for i, v in enumerate(vecs)],
                "model": model or self.path, "usage": {"prompt_tokens": n, "total_tokens": n}}

    # ---- grammars ----

    def _grammar(self, grammar=None, json_schema=None):
        """A compiled grammar (_Grammar) for GBNF text or a JSON Schema (dict
        or text), kept for reuse; None for neither."""
        if grammar is not None and json_schema is not None:
            raise ArgumentError("give grammar or json_schema, not both")
        if grammar is None and json_schema is None:
            return None
        if json_schema is not None:
            text = json_schema if isinstance(json_schema, (str, bytes)) else json.dumps(json_schema)
            key = ("schema", _bytes(text))
        else:
            key = ("gbnf", _bytes(grammar))
        with self._glock:
            g = self._grammars.get(key)
        if g is None:
            ptr = c_void_p()
            err = _err()
            fn = lib.tl_grammar_from_json_schema if key[0] == "schema" else lib.tl_grammar_parse
            check(fn(key[1], len(key[1]), byref(ptr), byref(err)), err,
                  "json_schema" if key[0] == "schema" else "grammar")
            g = _Grammar(ptr)
            with self._glock:
                while len(self._grammars) >= 32:  # a job that holds one keeps it alive
                    self._grammars.pop(next(iter(self._grammars)))
                self._grammars[key] = g
        return g

    def _matcher(self, g):
        err = _err()
        if not self._trie:
            t = c_void_p()
            check(lib.tl_vocab_trie_new(self._m, byref(t), byref(err)), err)
            self._trie = t
        mt = c_void_p()
        check(lib.tl_matcher_new(g, self._trie, byref(mt), byref(err)), err, "grammar")
        return mt

    # ---- jobs ----

    def _sampler_params(self, temperature, top_p, top_k, min_p, repeat_penalty, repeat_last_n, frequency_penalty,
                        presence_penalty, seed, logit_bias):
        d = lib.tl_sampler_default_params()
        sp = _lib.SamplerParamsIn()
        for name, _ in _lib.SamplerParams._fields_:
            setattr(sp, name, getattr(d, name))
        for field, v in (("temp", temperature), ("top_p", top_p), ("top_k", top_k), ("min_p", min_p),
                         ("repeat_penalty", repeat_penalty), ("penalty_last_n", repeat_last_n),
                         ("freq_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
            if v is not None:
                setattr(sp, field, v)
        if seed is None:
            seed = self.default_seed
        if seed is not None and seed >= _lib.SEED_RANDOM:
            raise ArgumentError(f"seed {seed} out of range")
        sp.seed = _lib.SEED_RANDOM if seed is None or seed < 0 else int(seed)
        if logit_bias:
            arr = (_lib.LogitBias * len(logit_bias))()
            for i, (tok, bias) in enumerate(logit_bias.items()):
                tok = int(tok)
                if not 0 <= tok < self.n_vocab:
                    raise ArgumentError(f"logit_bias: token {tok} out of range")
                arr[i].token, arr[i].bias = tok, float(bias)
            sp.logit_bias = ctypes.cast(arr, POINTER(_lib.LogitBias))
            sp.n_logit_bias = len(logit_bias)
            sp._keep = arr
        return sp

    def _job(self, ids, *, max_tokens=None, temperature=None, top_p=None, top_k=None, min_p=None,
             repeat_penalty=None, repeat_last_n=None, frequency_penalty=None, presence_penalty=None, seed=None,
             stop=None, grammar=None, json_schema=None, logit_bias=None, n_top=0, ignore_eos=False,
             think=None):
        if not ids:
            raise ArgumentError("the prompt is empty")
        if isinstance(stop, (str, bytes)):
            stop = [stop]
        stops = [_bytes(s) for s in (stop or []) if s]
        sp = self._sampler_params(temperature, top_p, top_k, min_p, repeat_penalty, repeat_last_n,
                                  frequency_penalty, presence_penalty, seed, logit_bias)
        n_predict = -1 if max_tokens is None or max_tokens < 0 else int(max_tokens)
        if n_predict == 0:
            n_predict = -1  # OpenAI's and llama-cpp-python's 0: no limit but the context
        g = self._grammar(grammar, json_schema)
        return _Job(list(ids), sp, n_predict, stops, g, max(0, min(20, int(n_top))), bool(ignore_eos), think)

    def _think_for(self, prompt_bytes):
        """The loop's reasoning markers for a prompt, as the CLI sets them."""
        if self._harmony:
            return (_lib.HARMONY_THINK_OPEN, _lib.HARMONY_THINK_CLOSE, 0)
        if self._think:
            return (self._think_markers[0], self._think_markers[1],
                    int(lib.tl_chat_think_started(prompt_bytes, len(prompt_bytes))))
        return None

    class _Locked:
        def __init__(self, model):
            self.model = model

        def __enter__(self):
            m = self.model
            if m._owner == threading.get_ident():
                raise RuntimeError("this thread has an unfinished stream on this model: read it to the end "
                                   "or close() it first")
            m._lock.acquire()
            m._owner = threading.get_ident()
            if not m._ctx:
                self.__exit__()
                raise ArgumentError("the model is closed")

        def __exit__(self, *exc):
            self.model._owner = None
            self.model._lock.release()

    def _locked(self):
        return Model._Locked(self)

    def _prepare(self, job, res):
        """Keeps the cached positions the prompt shares; a sampler with the
        kept tokens in its penalty history. Returns (sampler, keep)."""
        err = _err()
        n = c_int()
        held = lib.tl_seq_tokens(self._ctx, 0, byref(n))
        ids = job.ids
        keep = 0
        if held and n.value:
            lim = min(n.value, len(ids))
            while keep < lim and held[keep] == ids[keep]:
                keep += 1
        if keep == len(ids):
            keep -= 1  # the last token is evaluated again for its logits
        check(lib.tl_ctx_truncate(self._ctx, keep, byref(err)), err)
        res.n_prompt, res.n_cached = len(ids), keep
        smp = c_void_p()
        check(lib.tl_sampler_new(byref(job.sp), self.n_vocab, byref(smp), byref(err)), err)
        if job.sp.repeat_penalty != 1 or job.sp.freq_penalty != 0 or job.sp.presence_penalty != 0:
            for t in ids[:keep]:
                lib.tl_sampler_accept(smp, t)
        return smp, keep

    def _gen_params(self, job, matcher, cb, n_top):
        gp = _lib.GenParams()
        gp.n_predict = job.n_predict
        if job.stop:
            arr = (c_char_p * len(job.stop))(*job.stop)
            gp.stop = ctypes.cast(arr, POINTER(c_char_p))
            gp.n_stop = len(job.stop)
            gp._keep = arr
        gp.n_top = n_top
        gp.ignore_eog = int(job.ignore_eos)
        gp.on_token = cb
        gp.spec = self.spec
        gp.draft_ctx = self._dctx
        gp.grammar = matcher
        gp.think_budget = -1
        if job.think:
            gp.think_open, gp.think_close, gp.think_started = job.think
        return gp

    def _event_fn(self, job, sink, decoder):
        """The on_token callback: each event's text (decoded) into sink."""
        n_top = job.n_top
        string_at = ctypes.string_at
        decode = decoder.decode

        def on_token(evp, user):
            ev = evp.contents
            text = decode(string_at(ev.text, ev.text_len)) if ev.text_len else ""
            if n_top:
                top = [(ev.top[i].token, ev.top[i].logprob) for i in range(ev.n_top)]
                sink.append(Event(text, ev.token, ev.reasoning, (ev.chosen.token, ev.chosen.logprob), top))
            else:
                sink.append(Event(text, ev.token, ev.reasoning))
            return 0

        return on_token

    def _run_whole(self, job):
        """The whole reply in one tl_generate call: (events, Result)."""
        res = Result()
        events = []
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        cb_fn = self._event_fn(job, events, decoder)
        cb = _lib.GenCallback(cb_fn)
        with self._locked():
            smp, keep = self._prepare(job, res)
            matcher = None
            try:
                matcher = self._matcher(job.grammar.ptr) if job.grammar else None
                gp = self._gen_params(job, matcher, cb, job.n_top)
                st = _lib.GenStats()
                err = _err()
                arr = (c_int32 * (len(job.ids) - keep))(*job.ids[keep:])
                check(lib.tl_generate(self._ctx, smp, arr, len(arr), byref(gp), byref(st), byref(err)), err)
            finally:
                if matcher:
                    lib.tl_matcher_free(matcher)
                lib.tl_sampler_free(smp)
        tail = decoder.decode(b"", final=True)
        if tail:
            events.append(Event(tail, -1, 0))
        res.n_gen, res.stop, res.prefill_s, res.ttft_s, res.decode_s = (st.n_gen, st.stop, st.prefill_s, st.ttft_s,
                                                                        st.decode_s)
        res.n_drafted, res.n_accepted = st.n_drafted, st.n_accepted
        self.last = res
        return events, res

    def _run_stream(self, job, res):
        """The same loop as tl_generate, a forward call at a time: yields
        lists of events as tokens come out. res is filled at the end."""
        events = []
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        cb = _lib.GenCallback(self._event_fn(job, events, decoder))
        with self._locked():
            smp, keep = self._prepare(job, res)
            matcher = step = None
            err = _err()
            try:
                matcher = self._matcher(job.grammar.ptr) if job.grammar else None
                gp = self._gen_params(job, matcher, cb, job.n_top)
                step = c_void_p()
                check(lib.tl_step_new(self._ctx, 0, smp, byref(gp), byref(step), byref(err)), err)
                arr = (c_int32 * (len(job.ids) - keep))(*job.ids[keep:])
                t0 = time.perf_counter()
                check(lib.tl_ctx_eval(self._ctx, arr, len(arr), 0, byref(err)), err)
                res.prefill_s = time.perf_counter() - t0
                if job.sp.repeat_penalty != 1 or job.sp.freq_penalty != 0 or job.sp.presence_penalty != 0:
                    for t in job.ids[keep:]:
                        lib.tl_sampler_accept(smp, t)
                rows = (POINTER(c_float) * _lib.STEP_MAX_FEED)()
                tok = (c_int32 * _lib.STEP_MAX_FEED)()
                seq = (c_int32 * _lib.STEP_MAX_FEED)()
                keep_rows = (c_uint8 * _lib.STEP_MAX_FEED)(*([1] * _lib.STEP_MAX_FEED))
                batch = _lib.Batch(n=0, token=tok, seq=seq, logits=keep_rows, pending=1)
                rows[0] = lib.tl_ctx_logits(self._ctx, -1)
                stop = check(lib.tl_step_take(step, rows, 1, byref(err)), err)
                t_first = time.perf_counter()
                res.ttft_s = t_first - t0
                while True:
                    if events:
                        out = events[:]
                        del events[:]
                        yield out
                    if stop != _lib.STOP_NONE:
                        break
                    n = lib.tl_step_feed(step, 0, tok, _lib.STEP_MAX_FEED)
                    batch.n = n
                    check(lib.tl_ctx_decode(self._ctx, byref(batch), byref(err)), err)
                    for i in range(n):
                        rows[i] = lib.tl_ctx_batch_logits(self._ctx, i)
                    stop = check(lib.tl_step_take(step, rows, n, byref(err)), err)
                rest = c_void_p()
                n_rest = lib.tl_step_flush(step, byref(rest))
                text = decoder.decode(ctypes.string_at(rest, n_rest) if n_rest else b"", final=True)
                res.n_gen, res.stop = lib.tl_step_count(step), stop
                res.decode_s = time.perf_counter() - t_first if res.n_gen else 0.0
                d, a = c_int(), c_int()
                lib.tl_step_spec_stats(step, byref(d), byref(a))
                res.n_drafted, res.n_accepted = d.value, a.value
                self.last = res
            finally:
                if step:
                    lib.tl_step_free(step)
                if matcher:
                    lib.tl_matcher_free(matcher)
                lib.tl_sampler_free(smp)
        if text:
            yield [Event(text, -1, 0)]

    # ---- prompts ----

    def _prompt_ids(self, prompt):
        """A completion prompt as the CLI's run takes it: special-token text
        parsed, BOS as the metadata asks. Token ids pass as they are."""
        if isinstance(prompt, (list, tuple)):
            return [int(t) for t in prompt], None
        data = _bytes(prompt)
        return self.tokenize(data, add_bos=None, special=True), data

    def render_chat(self, messages, tools=None, add_generation_prompt=True, **template_vars):
        """The prompt text the chat template makes of messages (OpenAI-style
        dicts), tools (OpenAI's tool list, given to the template as `tools`)
        and any other template variables (e.g. enable_thinking=False)."""
        self._live()
        err = _err()
        with self._glock:
            if not self._tmpl:
                t = c_void_p()
                check(lib.tl_chat_template_new(self._m, self._tmpl_text, byref(t), byref(err)), err,
                      "chat template")
                self._tmpl = t
        vars_ = dict(template_vars)
        vars_["messages"] = [_reply.template_message(m) for m in messages]
        if tools:
            vars_["tools"] = tools
        data = json.dumps(vars_, ensure_ascii=False).encode("utf-8")
        out = c_void_p()
        n = c_size_t()
        check(lib.tl_chat_template_render(self._tmpl, data, len(data), int(add_generation_prompt), byref(out),
                                          byref(n), byref(err)), err, "chat template")
        try:
            return ctypes.string_at(out, n.value).decode("utf-8", "replace")
        finally:
            lib.tl_free(out)

    def _chat_ids(self, messages, tools, template_vars):
        text = self.render_chat(messages, tools=tools, **(template_vars or {}))
        data = text.encode("utf-8")
        add_bos = bool(lib.tl_chat_add_bos(self._m, data))
        return self.tokenize(data, add_bos=add_bos, special=True), data

    # ---- the plain API ----

    def generate(self, prompt, max_tokens=None, temperature=None, top_p=None, top_k=None, min_p=None, seed=None,
                 stop=None, grammar=None, json_schema=None, stream=False, repeat_penalty=None, repeat_last_n=None,
                 frequency_penalty=None, presence_penalty=None, logit_bias=None, ignore_eos=False):
        """Continues prompt (text, or token ids) as `tokenloop run -p` does:
        the generated text, or with stream=True an iterator of its pieces.
        Sampling parameters left None take the CLI's defaults (temperature
        0.8, top_k 40, top_p 0.95, min_p 0.05; temperature 0: greedy).
        max_tokens None: until an end token or a full context. stop: strings
        that end the text (not included). grammar: GBNF text; json_schema: a
        JSON Schema (dict or text) the output follows."""
        ids, data = self._prompt_ids(prompt)
        job = self._job(ids, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                        min_p=min_p, seed=seed, stop=stop, grammar=grammar, json_schema=json_schema,
                        repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                        logit_bias=logit_bias, ignore_eos=ignore_eos,
                        think=self._think_for(data) if data is not None else None)
        if stream:
            return _texts(self._run_stream(job, Result()))
        events, _ = self._run_whole(job)
        return "".join(e.text for e in events)

    def chat(self, messages, max_tokens=None, temperature=None, top_p=None, top_k=None, min_p=None, seed=None,
             stop=None, grammar=None, json_schema=None, stream=False, tools=None, repeat_penalty=None,
             repeat_last_n=None, frequency_penalty=None, presence_penalty=None, logit_bias=None,
             template_vars=None):
        """The assistant's reply to messages ([{"role", "content"}, ...]) in
        the model's chat template, as `tokenloop run --chat --hide-thinking`
        prints it: its content (reasoning, if the model reasons, is left out;
        create_chat_completion gives it as reasoning_content). tools: OpenAI's
        tool list, rendered by the template (create_chat_completion parses
        the calls). stream=True: an iterator of the content's pieces."""
        ids, data = self._chat_ids(messages, tools, template_vars)
        job = self._job(ids, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                        min_p=min_p, seed=seed, stop=stop, grammar=grammar, json_schema=json_schema,
                        repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                        frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                        logit_bias=logit_bias, think=self._think_for(data))
        if stream:
            return self._chat_content_stream(job)
        events, _ = self._run_whole(job)
        split = self._splitter(False)
        for e in events:
            split.push(e)
        split.end()
        return "".join(split.take().content)

    def _splitter(self, tools):
        return _reply.Splitter(self._harmony, tools, self._think_markers if self._think else (None, None))

    def _chat_content_stream(self, job):
        split = self._splitter(False)
        for evs in self._run_stream(job, Result()):
            for e in evs:
                split.push(e)
            out = split.take()
            if out.content:
                yield "".join(out.content)
        split.end()
        out = split.take()
        if out.content:
            yield "".join(out.content)

    # ---- OpenAI-shaped (llama-cpp-python's create_completion / create_chat_completion) ----

    def create_completion(self, prompt, max_tokens=16, temperature=0.8, top_p=0.95, top_k=40, min_p=0.05,
                          stop=None, seed=None, stream=False, logprobs=None, echo=False, repeat_penalty=1.0,
                          frequency_penalty=0.0, presence_penalty=0.0, grammar=None, json_schema=None,
                          logit_bias=None, model=None, suffix=None, **unsupported):
        """An OpenAI text completion as a dict (stream=True: an iterator of
        chunk dicts), as llama-cpp-python's Llama.create_completion returns.
        logprobs: alternatives per token (0..20). grammar: GBNF text."""
        _reply.check_unsupported(unsupported)
        if suffix:
            raise ArgumentError("suffix (fill in the middle) is not supported")
        ids, data = self._prompt_ids(prompt)
        job = self._job(ids, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                        min_p=min_p, seed=seed, stop=stop, grammar=grammar, json_schema=json_schema,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, logit_bias=logit_bias,
                        n_top=(max(1, logprobs) if logprobs is not None else 0),
                        think=self._think_for(data) if data is not None else None)
        echo_text = (prompt if isinstance(prompt, str) else self.detokenize(ids)) if echo else ""
        name = model or self.path
        if stream:
            return _reply.completion_chunks(self, job, name, echo_text, logprobs)
        events, res = self._run_whole(job)
        return _reply.completion(self, events, res, name, echo_text, logprobs)

    def create_chat_completion(self, messages, max_tokens=None, temperature=0.2, top_p=0.95, top_k=40, min_p=0.05,
                               stop=None, seed=None, stream=False, tools=None, tool_choice=None,
                               response_format=None, logprobs=False, top_logprobs=None, repeat_penalty=1.0,
                               frequency_penalty=0.0, presence_penalty=0.0, grammar=None, logit_bias=None,
                               model=None, template_vars=None, **unsupported):
        """An OpenAI chat completion as a dict (stream=True: an iterator of
        chunk dicts), as llama-cpp-python's create_chat_completion returns.
        response_format: {"type": "json_object"} or {"type": "json_schema",
        "json_schema": {"schema": ...}}. tools are rendered by the template;
        calls come back as message.tool_calls for gpt-oss (harmony, parsed by
        the library) and the <tool_call>{json}</tool_call> format (Hermes,
        Qwen, SmolLM3), unconstrained: the server's other formats and its
        call grammars are not in the C API."""
        _reply.check_unsupported(unsupported)
        if tool_choice not in (None, "auto", "none"):
            raise ArgumentError("tool_choice: only 'auto' and 'none' are supported here "
                                "(tokenloop serve constrains calls with a grammar)")
        if tool_choice == "none":
            tools = None
        schema = _reply.response_schema(response_format)
        ids, data = self._chat_ids(messages, tools, template_vars)
        n_top = 0
        if logprobs:
            n_top = max(1, top_logprobs or 0)
        job = self._job(ids, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                        min_p=min_p, seed=seed, stop=stop, grammar=grammar, json_schema=schema,
                        repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
                        presence_penalty=presence_penalty, logit_bias=logit_bias, n_top=n_top,
                        think=self._think_for(data))
        name = model or self.path
        want_lp = top_logprobs or 0 if logprobs else None
        if stream:
            return _reply.chat_chunks(self, job, name, bool(tools), want_lp)
        events, res = self._run_whole(job)
        return _reply.chat_completion(self, events, res, name, bool(tools), want_lp)

    __call__ = create_completion


def _texts(chunks):
    for evs in chunks:
        t = "".join(e.text for e in evs)
        if t:
            yield t
