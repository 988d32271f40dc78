"""Tool calls through the server with the official openai client, on SmolLM2
(whose template has no tool support: the tools go in a system message):
tool_choice required, a named function and auto, parallel and not, streamed
(the openai client parses the deltas) and not, hot sampling; every call's
arguments validated by jsonschema against its function's parameters; the
content never holds a tag; a tool-result round trip renders and reuses the
cached prefix; bad tool definitions are 400s.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_tools.py"""
import json
import os
import sys

import jsonschema
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, Server  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                             "unit": {"enum": ["c", "f"]}},
           "required": ["city"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "description": "Adds two integers", "parameters": ADD}}]
PARAMS = {"get_weather": WEATHER, "add": ADD}
# The sanitizer run (make asan) looks for memory errors: fewer samples of each
# kind, every kind still run.
ASAN = os.environ.get("TL_ASAN") == "1"


def few(xs, n):
    return xs[:n] if ASAN else xs


def valid_calls(calls, only=None):
    """Every call names a known function (the named one, if given) and its
    arguments validate."""
    for c in calls:
        name = c.function.name
        if name not in PARAMS or (only and name != only):
            return f"unexpected function {name}"
        try:
            jsonschema.validate(json.loads(c.function.arguments), PARAMS[name])
        except (ValueError, jsonschema.ValidationError) as e:
            return f"{name} arguments {c.function.arguments!r}: {e}"
    return None


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    srv = Server(MODEL, ["-np", "4", "-c", "4096", "-t", "2"])
    try:
        if not check(srv.wait_ready(), "server ready"):
            tlcheck.finish()
        cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120 * SLOW)
        msgs = [{"role": "user", "content": "What is the weather in Paris? And what is 2 plus 3?"}]
        cases = [("required", None, True), ({"type": "function", "function": {"name": "add"}}, "add", True),
                 ("required", None, False)]
        for choice, only, parallel in cases:
            for temp, seed in few(((0.0, 1), (2.0, 3), (1.0, 2)), 2):
                r = cl.chat.completions.create(model="m", messages=msgs, tools=TOOLS, tool_choice=choice,
                                               parallel_tool_calls=parallel, temperature=temp, seed=seed,
                                               max_tokens=300)
                m = r.choices[0].message
                calls = m.tool_calls or []
                err = valid_calls(calls, only)
                check(r.choices[0].finish_reason == "tool_calls" and calls and not err
                      and (parallel or len(calls) == 1) and len({c.id for c in calls}) == len(calls),
                      f"{choice} parallel={parallel} temp {temp}: finish {r.choices[0].finish_reason}, "
                      f"{len(calls)} calls, {err}, content {m.content!r}")
                check(not m.content or "<tool_call>" not in m.content, f"content holds no tag: {m.content!r}")
        # streamed: the client assembles the calls from the deltas
        greedy_parts = None
        for temp, seed in ((0.0, 1), (1.5, 4)):
            stream = cl.chat.completions.create(model="m", messages=msgs, tools=TOOLS, tool_choice="required",
                                                temperature=temp, seed=seed, max_tokens=300, stream=True)
            parts, finish, content = {}, None, ""
            for ch in stream:
                if not ch.choices:
                    continue
                d = ch.choices[0].delta
                content += d.content or ""
                for tc in d.tool_calls or []:
                    p = parts.setdefault(tc.index, {"name": "", "args": "", "id": None})
                    p["name"] += tc.function.name or ""
                    p["args"] += tc.function.arguments or ""
                    p["id"] = p["id"] or tc.id
                finish = ch.choices[0].finish_reason or finish
            ok = finish == "tool_calls" and parts and sorted(parts) == list(range(len(parts)))
            for p in parts.values():
                try:
                    jsonschema.validate(json.loads(p["args"]), PARAMS[p["name"]])
                except (KeyError, ValueError, jsonschema.ValidationError):
                    ok = False
            check(ok and "<tool_call>" not in content, f"streamed temp {temp}: finish {finish}, calls {parts}, "
                  f"content {content!r}")
            if temp == 0.0:
                greedy_parts = [(p["name"], p["args"]) for _, p in sorted(parts.items())]
        # greedy: streamed and not give the same calls
        r = cl.chat.completions.create(model="m", messages=msgs, tools=TOOLS, tool_choice="required", temperature=0,
                                       max_tokens=300)
        whole = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls]
        check(whole and whole == greedy_parts, f"greedy calls streamed {greedy_parts} and not {whole}")
        # cut by max_tokens inside or after a call: streamed ends as whole does
        for mt in few((6, 40, 12), 2):
            kw = dict(model="m", messages=msgs, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=mt,
                      parallel_tool_calls=False)
            r = cl.chat.completions.create(**kw)
            m = r.choices[0].message
            whole = (m.content or None, [(c.function.name, c.function.arguments) for c in m.tool_calls or []],
                     r.choices[0].finish_reason)
            content, got, fin = "", {}, None
            for ch in cl.chat.completions.create(stream=True, **kw):
                if ch.choices:
                    d = ch.choices[0].delta
                    content += d.content or ""
                    for tc in d.tool_calls or []:
                        got[tc.index] = (tc.function.name, tc.function.arguments)
                    fin = ch.choices[0].finish_reason or fin
            check(whole == (content or None, [got[i] for i in sorted(got)], fin),
                  f"max_tokens {mt}: streamed {content!r} {got} {fin} vs whole {whole}")
        # auto: either an answer or valid calls, never a broken call
        for seed in few((5, 6, 7), 1):
            r = cl.chat.completions.create(model="m", messages=msgs, tools=TOOLS, tool_choice="auto",
                                           temperature=1.0, seed=seed, max_tokens=300)
            m = r.choices[0].message
            err = valid_calls(m.tool_calls or [])
            check(not err and (m.tool_calls or m.content) and (not m.content or "<tool_call>" not in m.content),
                  f"auto seed {seed}: {r.choices[0].finish_reason} {m.content!r} {err}")
        # a round trip: the call and its result render back; the prefix is reused
        r0 = cl.chat.completions.create(model="m", messages=msgs, tools=TOOLS, tool_choice="required",
                                             parallel_tool_calls=False, temperature=0, max_tokens=300)
        tc = r0.choices[0].message.tool_calls[0]
        msgs2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [tc.model_dump()]},
                        {"role": "tool", "tool_call_id": tc.id, "content": "18 C, sunny"}]
        r2 = cl.chat.completions.create(model="m", messages=msgs2, tools=TOOLS, temperature=0, max_tokens=40)
        cached = r2.usage.prompt_tokens_details.cached_tokens if r2.usage.prompt_tokens_details else 0
        check(r2.choices[0].finish_reason in ("stop", "length", "tool_calls") and cached > r0.usage.prompt_tokens // 2,
              f"round trip: {r2.choices[0].finish_reason}, cached {cached} of {r2.usage.prompt_tokens} "
              f"(first turn {r0.usage.prompt_tokens})")
        # refusals
        for tools, choice, want in (([{"type": "function", "function": {"name": "bad name"}}], None, "name"),
                                    ([{"type": "retrieval"}], None, "function"),
                                    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "not in"),
                                    ([{"type": "function", "function": {"name": "f", "parameters":
                                                                        {"type": "object", "properties":
                                                                         {"x": {"type": "integer", "multipleOf": 2}}}}}],
                                     None, "multipleOf")):
            try:
                kw = {"tool_choice": choice} if choice else {}
                cl.chat.completions.create(model="m", messages=msgs, tools=tools, max_tokens=5, **kw)
                check(False, f"accepted a bad tool request ({want})")
            except openai.BadRequestError as e:
                check(want in str(e), f"400 names '{want}': {e}")
    finally:
        srv.stop()
    tlcheck.finish()


if __name__ == "__main__":
    main()
