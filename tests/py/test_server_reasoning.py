"""Reasoning kept apart, with a budget that holds, through the server and the
openai client, on SmolLM2 with a text-level <think> opened by the server
(--reasoning on): at budgets 1, 7 and 64, streamed and not, the reasoning
comes back as reasoning_content, the content never holds a marker, the
reasoning stays within its budget (plus the close marker's tokens the server
writes), streamed equals whole; reasoning_effort maps to a budget; a JSON
schema and forced tool calls apply to the answer after the reasoning;
--reasoning off leaves everything in content.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_reasoning.py"""
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
CLOSE_TOKENS = 4  # "</think>\n\n" as SmolLM2 tokenizes it, at most
MSGS = [{"role": "user", "content": "Is 17 a prime number? Think first."}]


def reasoning_of(m):
    return getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content")


def stream(cl, **kw):
    rs, cs, finish, usage = "", "", None, None
    for ch in cl.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if ch.usage:
            usage = ch.usage
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        rs += getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content") or ""
        cs += d.content or ""
        finish = ch.choices[0].finish_reason or finish
    return rs, cs, finish, usage


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    srv = Server(MODEL, ["-np", "2", "-c", "4096", "-t", "2", "--reasoning", "on"])
    try:
        if not check(srv.wait_ready(), "server ready"):
            tlcheck.finish()
        cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120 * SLOW)
        for budget in (1, 7, 64):
            for temp, seed in ((0.0, 1), (1.0, 2))[: 1 if os.environ.get("TL_ASAN") else 2]:
                kw = dict(model="m", messages=MSGS, max_tokens=150, temperature=temp, seed=seed,
                          extra_body={"max_thinking_tokens": budget})
                r = cl.chat.completions.create(**kw)
                m = r.choices[0].message
                rs, n_r = reasoning_of(m), r.usage.completion_tokens_details.reasoning_tokens
                content = m.content or ""
                check(rs is not None and "<think>" not in content and "</think>" not in content
                      and "</think>" not in rs and 0 < n_r <= budget + CLOSE_TOKENS,
                      f"budget {budget} temp {temp}: {n_r} reasoning tokens, reasoning {rs!r:.80}, content {content!r:.80}")
                srs, scs, sfin, su = stream(cl, **kw)
                check(srs == rs and scs == content and sfin == r.choices[0].finish_reason
                      and su.completion_tokens_details.reasoning_tokens == n_r,
                      f"budget {budget} temp {temp}: streamed {srs!r:.60}/{scs!r:.60} vs {rs!r:.60}/{content!r:.60}")
        # reasoning_effort maps to a budget; a bad one is a 400
        r = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=40, temperature=0,
                                       reasoning_effort="minimal")
        check(r.usage.completion_tokens_details.reasoning_tokens <= CLOSE_TOKENS,
              f"reasoning_effort minimal: {r.usage.completion_tokens_details.reasoning_tokens} reasoning tokens")
        try:
            cl.chat.completions.create(model="m", messages=MSGS, max_tokens=5, extra_body={"reasoning_effort": "max"})
            check(False, "reasoning_effort 'max' accepted")
        except openai.BadRequestError as e:
            check("reasoning_effort" in str(e), f"400 for a bad reasoning_effort: {e}")
        # structured output applies to the answer after the reasoning
        schema = {"type": "object", "properties": {"prime": {"type": "boolean"}, "why": {"type": "string",
                                                                                          "maxLength": 40}},
                  "required": ["prime", "why"], "additionalProperties": False}
        for seed in (3, 4):
            r = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=200, temperature=0.8, seed=seed,
                                           response_format={"type": "json_schema", "json_schema": {"name": "a",
                                                                                                   "schema": schema}},
                                           extra_body={"max_thinking_tokens": 16})
            m = r.choices[0].message
            try:
                jsonschema.validate(json.loads(m.content), schema)
                ok = reasoning_of(m) is not None
            except (TypeError, ValueError, jsonschema.ValidationError):
                ok = False
            check(ok, f"json after reasoning seed {seed}: reasoning {reasoning_of(m)!r:.60}, content {m.content!r:.120}")
        # forced tool calls too
        tools = [{"type": "function", "function": {"name": "is_prime", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
            "additionalProperties": False}}}]
        r = cl.chat.completions.create(model="m", messages=MSGS, tools=tools, tool_choice="required", max_tokens=200,
                                       temperature=0, parallel_tool_calls=False, extra_body={"max_thinking_tokens": 16})
        m = r.choices[0].message
        calls = m.tool_calls or []
        check(r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and reasoning_of(m) is not None
              and "n" in json.loads(calls[0].function.arguments),
              f"a tool call after reasoning: {r.choices[0].finish_reason} {calls} {reasoning_of(m)!r:.60}")
    finally:
        srv.stop()
    # --reasoning off: no split
    srv = Server(MODEL, ["-np", "1", "-c", "2048", "-t", "2", "--reasoning", "off"])
    try:
        if check(srv.wait_ready(), "server ready (--reasoning off)"):
            cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120 * SLOW)
            r = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=20, temperature=0)
            m = r.choices[0].message
            check(reasoning_of(m) is None and m.content, f"--reasoning off: all content: {m}")
    finally:
        srv.stop()
    tlcheck.finish()


if __name__ == "__main__":
    main()
