"""gpt-oss's harmony format through the server, on a random-weight model
(scripts/mkmodel.py) carrying gpt-oss's template and harmony's tokens as
control tokens (<|return|> the end-of-generation one): a GBNF grammar makes
the model write chosen harmony text (an analysis message, then a final one),
which comes back as reasoning and content in Chat Completions
(reasoning_content), Responses (a reasoning item) and Anthropic Messages (a
thinking block), whole and streamed, through the vendors' clients, with no
control token or channel header in the content; <|end|> between the messages
does not stop generation; forced tool calls (required, a named function)
come back as calls whose arguments validate, streamed equal to whole, in
all three dialects; the history with reasoning, a call and its result
renders; reasoning_effort is accepted; `run --chat` shows the analysis as
reasoning (hidden by --hide-thinking) and the final message as the answer.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_harmony.py"""
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

import anthropic
import jsonschema
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, Server  # noqa: E402

MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")
TEMPLATE = os.path.join(ROOT, "tests", "templates", "gpt-oss.jinja")
VOCAB = os.path.join(os.environ.get("TL_VOCAB_DIR", os.path.join(ROOT, "..", "shared", "vocab")),
                     "ggml-vocab-gpt-2.gguf")
CONTROL = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
THINK, ANSWER = "Let me think <about|it>.", "The answer: 42."
FORCED = ('root ::= "<|channel|>analysis<|message|>%s<|end|><|start|>assistant<|channel|>final<|message|>%s"'
          % (THINK, ANSWER))
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "now", "description": "The time",
                                           "parameters": {"type": "object", "properties": {}}}}]
MSGS = [{"role": "user", "content": "What is the weather in Paris?"}]
MARKS = ("<|", "|>", "analysis", "final", "commentary")


def reasoning_of(x):
    return getattr(x, "reasoning_content", None) or (x.model_extra or {}).get("reasoning_content")


def chat_stream(cl, **kw):
    rs, cs, calls, finish = "", "", [], None
    for ch in cl.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        rs += reasoning_of(d) or ""
        cs += d.content or ""
        for c in d.tool_calls or []:
            calls.append((c.index, c.function.name, c.function.arguments))
        finish = ch.choices[0].finish_reason or finish
    return rs, cs, calls, finish


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60 * SLOW) as r:
        return json.loads(r.read())


def chat_checks(srv, cl):
    toks = post(srv.url + "/tokenize", {"content": "".join(CONTROL), "add_special": False})["tokens"]
    check(len(toks) == len(CONTROL), f"harmony's tokens are one token each: {toks}")
    kw = dict(model="m", messages=MSGS, max_tokens=120, extra_body={"grammar": FORCED})
    r = cl.chat.completions.create(**kw)
    m = r.choices[0].message
    check(reasoning_of(m) == THINK and m.content == ANSWER and r.choices[0].finish_reason == "stop",
          f"chat: analysis is reasoning, final is content (<|end|> did not stop it): {m}")
    rs, cs, calls, finish = chat_stream(cl, **kw)
    check((rs, cs, calls, finish) == (THINK, ANSWER, [], "stop"), f"chat streamed: {rs!r} {cs!r} {calls} {finish}")
    # calls: required and a named function, whole and streamed
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        kw = dict(model="m", messages=MSGS, tools=TOOLS, tool_choice=choice, max_tokens=120, temperature=0.8, seed=3)
        r = cl.chat.completions.create(**kw)
        m = r.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in m.tool_calls or []]
        ok = len(calls) == 1 and calls[0][0] in ("get_weather", "now")
        try:
            ok = ok and jsonschema.validate(json.loads(calls[0][1]),
                                            WEATHER if calls[0][0] == "get_weather" else {"type": "object"}) is None
        except (ValueError, jsonschema.ValidationError):
            ok = False
        if isinstance(choice, dict):
            ok = ok and calls[0][0] == "get_weather"
        check(ok and r.choices[0].finish_reason == "tool_calls" and not any(k in (m.content or "") for k in MARKS),
              f"chat tool_choice={choice}: one valid call, no markers in content: {m}")
        rs, cs, scalls, finish = chat_stream(cl, **kw)
        check([(n, a) for _, n, a in scalls] == calls and finish == "tool_calls" and [i for i, _, _ in scalls] == [0],
              f"chat tool_choice={choice}: streamed {scalls} {finish} equals whole {calls}")
        check(not cs or cs == (m.content or ""), f"streamed content {cs!r} equals whole {m.content!r}")
    # the history: reasoning, a call, its result; and reasoning_effort
    hist = MSGS + [{"role": "assistant", "content": "", "reasoning_content": "I need the tool.",
                    "tool_calls": [{"id": "c1", "type": "function",
                                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                   {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    lengths = {}
    for effort in ("low", "medium", "high"):
        r = cl.chat.completions.create(model="m", messages=hist, tools=TOOLS, max_tokens=2, reasoning_effort=effort)
        lengths[effort] = r.usage.prompt_tokens
    check(len(lengths) == 3, f"history with reasoning, a call and its result renders at every effort: {lengths}")
    short = cl.chat.completions.create(model="m", messages=hist[:1], max_tokens=2).usage.prompt_tokens
    check(lengths["low"] > short + 10, f"the history's call and reasoning are in the prompt: {lengths} vs {short}")


def responses_checks(oc):
    r = oc.responses.create(model="m", input="What is 6 x 7?", max_output_tokens=120, extra_body={"grammar": FORCED})
    kinds = [o.type for o in r.output]
    reasoning = "".join(c.text for o in r.output if o.type == "reasoning" for c in (o.content or []))
    check(kinds == ["reasoning", "message"] and reasoning == THINK and r.output_text == ANSWER,
          f"responses: a reasoning item, then the answer: {kinds} {reasoning!r} {r.output_text!r}")
    final, deltas = None, ""
    for ev in oc.responses.create(model="m", input="What is 6 x 7?", max_output_tokens=120, stream=True,
                                  extra_body={"grammar": FORCED}):
        if ev.type == "response.output_text.delta":
            deltas += ev.delta
        if ev.type == "response.completed":
            final = ev.response
    check(final is not None and deltas == ANSWER and [o.type for o in final.output] == kinds
          and final.output_text == ANSWER, f"responses streamed: {deltas!r} {final}")
    tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}]
    t = oc.responses.create(model="m", input="Weather in Paris?", tools=tools, tool_choice="required",
                            max_output_tokens=120, temperature=0)
    fc = [o for o in t.output if o.type == "function_call"]
    check(len(fc) == 1 and fc[0].name == "get_weather" and "city" in json.loads(fc[0].arguments),
          f"responses: a function_call: {t.output}")


def messages_checks(ac):
    kw = dict(model="m", max_tokens=120, messages=[{"role": "user", "content": "What is 6 x 7?"}],
              extra_body={"grammar": FORCED})
    m = ac.messages.create(**kw)
    blocks = [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in m.content]
    check(blocks == [("thinking", THINK), ("text", ANSWER)] and m.stop_reason == "end_turn",
          f"messages: a thinking block, then the text: {blocks} {m.stop_reason}")
    with ac.messages.stream(**kw) as s:
        fm = s.get_final_message()
    sblocks = [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in fm.content]
    check(sblocks == blocks, f"messages streamed: {sblocks} vs {blocks}")
    tools = [{"name": "get_weather", "description": "Weather in a city", "input_schema": WEATHER}]
    q = [{"role": "user", "content": "Weather in Paris?"}]
    t = ac.messages.create(model="m", max_tokens=120, tools=tools, tool_choice={"type": "any"}, messages=q,
                           extra_body={"temperature": 0})
    uses = [b for b in t.content if b.type == "tool_use"]
    check(t.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather" and "city" in uses[0].input,
          f"messages: a tool_use: {t}")
    with ac.messages.stream(model="m", max_tokens=120, tools=tools, tool_choice={"type": "any"}, messages=q,
                            extra_body={"temperature": 0}) as s:
        ft = s.get_final_message()
    su = [b for b in ft.content if b.type == "tool_use"]
    check([(b.name, b.input) for b in su] == [(b.name, b.input) for b in uses], f"messages tool_use streamed: {ft}")


def cli_checks(tmp, path):
    """run --chat: the analysis shown as reasoning (hidden with --hide-thinking),
    the final message as the answer, no channel header or control token."""
    gpath = os.path.join(tmp, "forced.gbnf")
    with open(gpath, "w") as f:
        f.write(FORCED + "\n")
    base = [os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop")), "run", "-m", path, "--chat",
            "-p", "What is 6 x 7?", "-n", "120", "--grammar", gpath, "-t", "1"]
    for hide in (False, True):
        p = subprocess.run(base + (["--hide-thinking"] if hide else []), capture_output=True, text=True,
                           timeout=120 * SLOW)
        want = ANSWER if hide else THINK + ANSWER
        check(p.returncode == 0 and p.stdout.strip() == want,
              f"run --chat{' --hide-thinking' if hide else ''}: stdout {p.stdout!r} (want {want!r}), "
              f"rc {p.returncode}, stderr {p.stderr[-300:]!r}")


def main():
    with tempfile.TemporaryDirectory(prefix="tl-harmony-") as tmp:
        path = os.path.join(tmp, "harmony.gguf")
        args = [sys.executable, MKMODEL, "qwen3", path, "--vocab", VOCAB, "--seed", "11", "--template", TEMPLATE,
                "--eos", "<|return|>"]
        for c in CONTROL:
            args += ["--add-control", c]
        p = subprocess.run(args, capture_output=True, text=True, timeout=300)
        if check(p.returncode == 0, f"mkmodel: {p.stderr[-300:]}"):
            srv = Server(path, ["-np", "2", "-c", "2048"])
            try:
                srv.wait_ready()
                chat_checks(srv, openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0))
                responses_checks(openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0))
                messages_checks(anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0))
            finally:
                srv.stop()
            cli_checks(tmp, path)
    tlcheck.finish()


if __name__ == "__main__":
    main()
