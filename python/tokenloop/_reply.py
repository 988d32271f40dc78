"""Replies in OpenAI's shapes, as llama-cpp-python returns them: a reply's
text split into content, reasoning and tool calls (Splitter), and the
completion and chat-completion dicts and stream chunks built from a
generation's events."""
import ctypes
import json
import time
import uuid

from . import _lib
from ._lib import lib
from .errors import ArgumentError, check

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"

# llama-cpp-python's parameters this package takes only at their neutral value.
_NEUTRAL = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat_mode": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
            "stopping_criteria": None, "logits_processor": None, "functions": None, "function_call": None,
            "n": 1, "user": None, "stream_options": None}


def check_unsupported(kw):
    for k, v in kw.items():
        if k not in _NEUTRAL:
            raise TypeError(f"unexpected keyword argument {k!r}")
        if v != _NEUTRAL[k]:
            raise ArgumentError(f"{k}={v!r} is not supported (only {_NEUTRAL[k]!r})")


def response_schema(rf):
    """The JSON Schema a response_format asks for, or None."""
    if not rf or rf.get("type") in (None, "text"):
        return None
    if rf["type"] == "json_object":
        return rf.get("schema") or {"type": "object"}
    if rf["type"] == "json_schema":
        js = rf.get("json_schema") or {}
        schema = js.get("schema")
        if schema is None:
            raise ArgumentError("response_format json_schema: no schema")
        return schema
    raise ArgumentError(f"response_format type {rf['type']!r} is not supported")


def template_message(m):
    """A message as chat templates read it: text parts joined into one
    string, tool calls' arguments as objects (the templates write them with
    tojson)."""
    if not isinstance(m, dict) or "role" not in m:
        raise ArgumentError(f"a message must be a dict with a role: {m!r}")
    m = dict(m)
    c = m.get("content")
    if isinstance(c, list):
        parts = []
        for p in c:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and p.get("type") == "text":
                parts.append(p.get("text", ""))
            else:
                raise ArgumentError(f"message content part {p!r}: only text is supported")
        m["content"] = "".join(parts)
    if m.get("tool_calls"):
        calls = []
        for tc in m["tool_calls"]:
            tc = dict(tc)
            fn = dict(tc.get("function") or {})
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass
            tc["function"] = fn
            calls.append(tc)
        m["tool_calls"] = calls
    return m


def _call(name, args, index=None):
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    c = {"id": "call_" + uuid.uuid4().hex[:24], "type": "function", "function": {"name": name, "arguments": args}}
    if index is not None:
        c["index"] = index
    return c


def parse_hermes(text):
    """The calls in <tool_call>{"name", "arguments"}</tool_call> blocks, or
    None when a block does not hold such JSON."""
    calls = []
    rest = text
    while True:
        i = rest.find(CALL_OPEN)
        if i < 0:
            break
        j = rest.find(CALL_CLOSE, i)
        body = rest[i + len(CALL_OPEN): j if j >= 0 else len(rest)]
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        calls.append((obj["name"], obj.get("arguments", obj.get("parameters", {}))))
        if j < 0:
            break
        rest = rest[j + len(CALL_CLOSE):]
    return calls


class Parts:
    __slots__ = ("content", "reasoning", "calls")

    def __init__(self):
        self.content, self.reasoning, self.calls = [], [], []


class Splitter:
    """A reply's events into content, reasoning and tool calls, as they
    come: gpt-oss's channels through the library's harmony parser; otherwise
    the loop's reasoning flag, and with tools the text from <tool_call> on
    held back and parsed at the end."""

    def __init__(self, harmony, tools, think_markers=(None, None)):
        self.parts = Parts()
        self.tools = tools
        self.markers = [m.decode() for m in think_markers if m]
        self.held = ""          # text that may open a call
        self.in_call = False
        self.hm = None
        self.cb = None
        if harmony:
            h = ctypes.c_void_p()
            err = _lib.Error()
            check(lib.tl_harmony_new(ctypes.byref(h), ctypes.byref(err)), err)
            self.hm = h
            self.cb = _lib.HarmonyCallback(self._harmony_piece)

    def __del__(self):
        if self.hm:
            lib.tl_harmony_free(self.hm)
            self.hm = None

    def _harmony_piece(self, user, kind, name, text, n):
        s = ctypes.string_at(text, n).decode("utf-8", "replace") if n else ""
        if kind == _lib.HARMONY_REASONING:
            self.parts.reasoning.append(s)
        elif kind == _lib.HARMONY_CONTENT:
            self.parts.content.append(s)
        else:
            self.parts.calls.append((name.decode("utf-8", "replace") if name else "", s or "{}"))
        return 0

    def _feed_harmony(self, data, last):
        check(lib.tl_harmony_feed(self.hm, data, len(data), int(last), self.cb, None), _lib.Error())

    def push(self, ev):
        if not ev.text:
            return
        if self.hm:
            self._feed_harmony(ev.text.encode("utf-8"), 0)
        elif ev.reasoning:
            t = ev.text
            for m in self.markers:
                t = t.replace(m, "")
            if t:
                self.parts.reasoning.append(t)
        elif not self.tools:
            self.parts.content.append(ev.text)
        else:
            self._push_tools(ev.text)

    def _push_tools(self, text):
        self.held += text
        if self.in_call:
            return
        i = self.held.find(CALL_OPEN)
        if i >= 0:
            if i:
                self.parts.content.append(self.held[:i])
            self.held = self.held[i:]
            self.in_call = True
            return
        # keep back the longest end that could start the opening tag
        k = min(len(CALL_OPEN) - 1, len(self.held))
        while k and not CALL_OPEN.startswith(self.held[-k:]):
            k -= 1
        out, self.held = self.held[:len(self.held) - k], self.held[len(self.held) - k:]
        if out:
            self.parts.content.append(out)

    def end(self):
        if self.hm:
            self._feed_harmony(b"", 1)
            return
        if self.held:
            calls = parse_hermes(self.held) if self.in_call else None
            if calls:
                self.parts.calls.extend(calls)
            else:
                self.parts.content.append(self.held)
            self.held = ""

    def take(self):
        p, self.parts = self.parts, Parts()
        return p


def _now():
    return int(time.time())


def _usage(res):
    return {"prompt_tokens": res.n_prompt, "completion_tokens": res.n_gen,
            "total_tokens": res.n_prompt + res.n_gen}


def _tok_text(model, tok):
    return model.token_bytes(tok, True).decode("utf-8", "replace")


def completion_logprobs(model, events, offset):
    """OpenAI's legacy completion logprobs of events (tokens sampled)."""
    lp = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
    for e in events:
        if e.token < 0 or e.logprob is None:
            continue
        s = _tok_text(model, e.token)
        lp["tokens"].append(s)
        lp["text_offset"].append(offset)
        offset += len(s)
        lp["token_logprobs"].append(e.logprob[1])
        lp["top_logprobs"].append({_tok_text(model, t): p for t, p in e.top})
    return lp, offset


def chat_logprobs(model, events, n_top):
    out = []
    for e in events:
        if e.token < 0 or e.logprob is None:
            continue
        b = model.token_bytes(e.token, True)
        out.append({"token": b.decode("utf-8", "replace"), "logprob": e.logprob[1], "bytes": list(b),
                    "top_logprobs": [{"token": _tok_text(model, t), "logprob": p,
                                      "bytes": list(model.token_bytes(t, True))} for t, p in e.top[:n_top]]})
    return out


def completion(model, events, res, name, echo_text, logprobs):
    text = echo_text + "".join(e.text for e in events)
    lp = completion_logprobs(model, events, len(echo_text))[0] if logprobs is not None else None
    return {"id": "cmpl-" + uuid.uuid4().hex, "object": "text_completion", "created": _now(), "model": name,
            "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": res.stop_reason}],
            "usage": _usage(res)}


def completion_chunks(model, job, name, echo_text, logprobs):
    from .model import Result
    cid, created = "cmpl-" + uuid.uuid4().hex, _now()
    res = Result()
    offset = len(echo_text)

    def chunk(text, lp, finish):
        return {"id": cid, "object": "text_completion", "created": created, "model": name,
                "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}

    if echo_text:
        yield chunk(echo_text, None, None)
    for evs in model._run_stream(job, res):
        lp = None
        if logprobs is not None:
            lp, offset = completion_logprobs(model, evs, offset)
        yield chunk("".join(e.text for e in evs), lp, None)
    yield chunk("", None, res.stop_reason)


def _message(parts, tools):
    content = "".join(parts.content)
    msg = {"role": "assistant", "content": content}
    if parts.reasoning:
        msg["reasoning_content"] = "".join(parts.reasoning)
    if parts.calls:
        msg["tool_calls"] = [_call(n, a) for n, a in parts.calls]
        if not content.strip():
            msg["content"] = None
    return msg


def chat_completion(model, events, res, name, tools, n_top):
    split = model._splitter(tools)
    for e in events:
        split.push(e)
    split.end()
    parts = split.take()
    msg = _message(parts, tools)
    lp = {"content": chat_logprobs(model, events, n_top), "refusal": None} if n_top is not None else None
    return {"id": "chatcmpl-" + uuid.uuid4().hex, "object": "chat.completion", "created": _now(), "model": name,
            "choices": [{"index": 0, "message": msg, "logprobs": lp,
                         "finish_reason": "tool_calls" if parts.calls else res.stop_reason}],
            "usage": _usage(res)}


def chat_chunks(model, job, name, tools, n_top):
    from .model import Result
    cid, created = "chatcmpl-" + uuid.uuid4().hex, _now()
    res = Result()
    split = model._splitter(tools)
    n_calls = 0

    def chunk(delta, finish=None, lp=None):
        return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": name,
                "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}

    def deltas(parts, lp):
        nonlocal n_calls
        if parts.reasoning:
            yield chunk({"reasoning_content": "".join(parts.reasoning)}, lp=lp)
            lp = None
        if parts.content:
            yield chunk({"content": "".join(parts.content)}, lp=lp)
            lp = None
        for n, a in parts.calls:
            yield chunk({"tool_calls": [_call(n, a, n_calls)]})
            n_calls += 1

    yield chunk({"role": "assistant", "content": ""})
    for evs in model._run_stream(job, res):
        for e in evs:
            split.push(e)
        lp = {"content": chat_logprobs(model, evs, n_top), "refusal": None} if n_top is not None else None
        yield from deltas(split.take(), lp)
    split.end()
    yield from deltas(split.take(), None)
    yield chunk({}, "tool_calls" if n_calls else res.stop_reason)
