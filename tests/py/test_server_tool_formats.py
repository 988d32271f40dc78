"""Tool calls in each family's own format, through the openai client, on
random-weight models (scripts/mkmodel.py) that carry real chat templates:
Llama 3.1's ({"name": ..., "parameters": ...} as the whole reply) and
Mistral v3's ([TOOL_CALLS] [{"name": ..., "arguments": ...}], with
[TOOL_CALLS] a control token) and Qwen3.5's (XML: <tool_call> <function=...>
<parameter=...>, on a random hybrid qwen35 model, with and without its
reasoning, through the chat, Responses and Messages dialects). The server picks the format from the
template; required and named choices make the model write it; every call's
arguments validate against the function's schema; streamed equals whole
(names, arguments, indices); Mistral's ids are nine letters and digits,
as its template demands when the history comes back; the history with the
calls and their results renders through the template. Under auto, a logit
bias towards Mistral's control token opens a call, and the grammar completes
it.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_tool_formats.py"""
import json
import os
import re
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
TEMPLATES = os.path.join(ROOT, "tests", "templates")
VOCAB = os.path.join(os.environ.get("TL_VOCAB_DIR", os.path.join(ROOT, "..", "shared", "vocab")),
                     "ggml-vocab-gpt-2.gguf")
FAMILIES = {
    "llama3.1": dict(template="llama3.1.jinja", eos="<|eot_id|>",
                     control=["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                              "<|python_tag|>"]),
    "mistral": dict(template="mistral-v3.jinja", eos=None,
                    control=["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                             "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]),
    "qwen3.5": dict(template="qwen3.5.jinja", eos="<|im_end|>", control=["<|im_start|>", "<|im_end|>"],
                    tokens=["<think>", "</think>"], arch="qwen35",
                    kwargs={"chat_template_kwargs": {"enable_thinking": False}}),
    # Gemma 4's vocabulary has these types: the turn markers control tokens,
    # the call, channel and string markers text that shows (USER_DEFINED)
    "gemma4": dict(template="gemma4.jinja", eos="<turn|>", arch="llama3",
                   control=["<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|think|>"],
                   tokens=["<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", '<|"|>', "<|tool_response>",
                           "<tool_response|>"],
                   kwargs={"chat_template_kwargs": {"enable_thinking": False}}),
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                         "unit": {"enum": ["c", "f"]}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSGS = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]


def make_model(path, fam):
    args = [sys.executable, MKMODEL, fam.get("arch", "qwen3"), path, "--vocab", VOCAB, "--seed", "11",
            "--template", os.path.join(TEMPLATES, fam["template"])]
    for c in fam["control"]:
        args += ["--add-control", c]
    for c in fam.get("tokens", []):
        args += ["--add-token", c]
    if fam["eos"]:
        args += ["--eos", fam["eos"]]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    return check(p.returncode == 0, f"mkmodel: {p.stderr[-300:]}")


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60 * SLOW) as r:
        return json.loads(r.read())


def valid(calls):
    try:
        for c in calls:
            jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])
        return bool(calls)
    except (KeyError, ValueError, jsonschema.ValidationError):
        return False


def strip_ids(calls):  # ids are per request
    return [{k: v for k, v in c.items() if k != "id"} for c in calls]


def whole(cl, **kw):
    r = cl.chat.completions.create(**kw)
    m = r.choices[0].message
    return r.choices[0].finish_reason, m.content, [{"id": c.id, "name": c.function.name,
                                                    "arguments": c.function.arguments} for c in m.tool_calls or []]


def streamed(cl, **kw):
    content, finish, calls = "", None, {}
    for ch in cl.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            c["id"] += tc.id or ""
            if tc.function:
                c["name"] += tc.function.name or ""
                c["arguments"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    return finish, content or None, [calls[i] for i in sorted(calls)]


def qwen35_more(srv, cl):
    """Qwen3.5: the reasoning its prompt opens comes first (cut by a budget),
    then the call; the same calls through the Responses and Messages dialects."""
    kw = dict(model="m", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=400, temperature=0.8, seed=1,
              parallel_tool_calls=False, extra_body={"max_thinking_tokens": 12})
    r = cl.chat.completions.create(**kw)
    m = r.choices[0].message
    reasoning = getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content")
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls or []]
    check(r.choices[0].finish_reason == "tool_calls" and valid(calls) and reasoning,
          f"qwen3.5 with reasoning: {r.choices[0].finish_reason} {calls} reasoning {reasoning!r:.60}")
    # each dialect's own way to keep the reasoning short: effort none, a thinking budget
    body = {"model": "m", "input": MSGS[0]["content"], "tool_choice": "required", "max_output_tokens": 400,
            "temperature": 0.8, "seed": 2, "parallel_tool_calls": False, "reasoning": {"effort": "none"},
            "tools": [{"type": "function", **t["function"]} for t in TOOLS]}
    out = post(srv.url + "/v1/responses", body)
    fc = [{"name": o["name"], "arguments": o["arguments"]} for o in out.get("output", []) if o["type"] == "function_call"]
    check(valid(fc), f"qwen3.5 Responses: function_call items {fc}")
    body = {"model": "m", "max_tokens": 400, "temperature": 0.8, "messages": MSGS, "tool_choice": {"type": "any"},
            "thinking": {"type": "enabled", "budget_tokens": 10},
            "tools": [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]}
    out = post(srv.url + "/v1/messages", body)
    tu = [{"name": b["name"], "arguments": json.dumps(b["input"])} for b in out.get("content", [])
          if b["type"] == "tool_use"]
    check(out.get("stop_reason") == "tool_use" and valid(tu), f"qwen3.5 Messages: tool_use blocks {tu}")


def detok(srv, body):
    toks = post(srv.url + "/tokenize", body)["tokens"]
    return post(srv.url + "/detokenize", {"tokens": toks})["content"]


def gemma4_more(srv, cl, fam, tmp):
    """Gemma 4: its template renders the tools and thinks when asked (the
    server asks unless reasoning is off or none); under required the server
    opens the thought channel, so the reasoning comes first (cut by a budget),
    then the call; auto opens a call at <|tool_call>; the same calls through
    the Responses and Messages dialects, read by the vendors' clients; the
    history's turn that answers after tool results gets the model's turn
    opened; the older template gets the results moved into tool_responses."""
    text = detok(srv, {"messages": MSGS})
    check("<|think|>" in text and text.endswith("<|turn>model\n"), f"gemma4: thinking on by default: {text[-80:]!r}")
    text = detok(srv, {"messages": MSGS, "chat_template_kwargs": {"enable_thinking": False}})
    check("<|think|>" not in text and text.endswith("<|turn>model\n<|channel>thought\n<channel|>"),
          f"gemma4: enable_thinking false closes an empty thought: {text[-80:]!r}")
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    hist = MSGS + [{"role": "assistant", "content": "Adding.", "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    text = detok(srv, {"messages": hist})
    check("<|tool_call>call:add{a:2,b:3}<tool_call|><|tool_response>response:add{value:<|\"|>5<|\"|>}"
          "<tool_response|>Adding.<turn|>\n<|turn>model\n" in text and text.endswith("<|turn>model\n"),
          f"gemma4: an answer after results closes the turn; the model's is opened: {text[-160:]!r}")
    text = detok(srv, {"messages": MSGS + [dict(hist[1], content=None)] + hist[2:]})
    check(text.endswith("<tool_response|>"), f"gemma4: after bare results the model goes on in its turn: {text[-60:]!r}")
    # the reasoning comes first under required (the prompt opens it), a budget cuts it
    kw = dict(model="m", messages=MSGS, tools=TOOLS, tool_choice="required", max_tokens=400, temperature=0.8, seed=1,
              parallel_tool_calls=False, extra_body={"max_thinking_tokens": 12})
    r = cl.chat.completions.create(**kw)
    m = r.choices[0].message
    reasoning = getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content")
    got = [{"name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls or []]
    fin, content, calls = r.choices[0].finish_reason, m.content, got
    check(r.choices[0].finish_reason == "tool_calls" and valid(got) and reasoning and not m.content
          and "<channel|>" not in reasoning and "<|channel>" not in reasoning
          and 12 <= r.usage.completion_tokens_details.reasoning_tokens <= 16,
          f"gemma4 with reasoning: {r.choices[0].finish_reason} {got} reasoning {reasoning!r:.60} "
          f"({r.usage.completion_tokens_details.reasoning_tokens} tokens) content {m.content!r:.40}")
    sfin, scontent, scalls = streamed(cl, **kw)
    check((sfin, scontent, strip_ids(scalls)) == (fin, content, strip_ids(calls)),
          f"gemma4 with reasoning: streamed {sfin} {scalls} vs whole {fin} {calls}")
    # auto: a bias towards <|tool_call> opens a call that the grammar completes
    tok = post(srv.url + "/tokenize", {"content": "<|tool_call>", "add_special": False})["tokens"]
    check(len(tok) == 1, f"<|tool_call> is one token: {tok}")
    kw = dict(model="m", messages=MSGS, tools=TOOLS, tool_choice="auto", max_tokens=400, temperature=0.8, seed=4,
              logit_bias={str(tok[0]): 100}, extra_body=fam["kwargs"])
    fin, content, calls = whole(cl, **kw)
    check(fin == "tool_calls" and valid(calls), f"gemma4 auto, <|tool_call> biased: {fin} {calls} {content!r:.60}")
    sfin, scontent, scalls = streamed(cl, **kw)
    check((sfin, scontent, strip_ids(scalls)) == (fin, content, strip_ids(calls)),
          f"gemma4 auto: streamed {sfin} {scalls} equals whole {fin} {calls}")
    # Responses, through the openai client: effort none renders no thinking
    oc = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120 * SLOW)
    rtools = [{"type": "function", **t["function"]} for t in TOOLS]
    out = oc.responses.create(model="m", input=MSGS[0]["content"], tool_choice="required", max_output_tokens=400,
                              temperature=0.8, parallel_tool_calls=False, reasoning={"effort": "none"}, tools=rtools)
    fc = [{"name": o.name, "arguments": o.arguments} for o in out.output if o.type == "function_call"]
    check(valid(fc) and not [o for o in out.output if o.type == "reasoning"],
          f"gemma4 Responses: function_call items {fc}, {[o.type for o in out.output]}")
    with oc.responses.stream(model="m", input=MSGS[0]["content"], tool_choice="required", max_output_tokens=400,
                             temperature=0.8, parallel_tool_calls=False, reasoning={"effort": "none"},
                             tools=rtools) as st:
        final = st.get_final_response()
    sfc = [{"name": o.name, "arguments": o.arguments} for o in final.output if o.type == "function_call"]
    check(valid(sfc), f"gemma4 Responses streamed: function_call items {sfc}")
    # Messages, through the anthropic client: a thinking budget, then tool_use blocks
    ac = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120 * SLOW)
    akw = dict(model="m", max_tokens=400, messages=MSGS, tool_choice={"type": "any"},
               thinking={"type": "enabled", "budget_tokens": 10}, extra_body={"temperature": 0.8},
               tools=[{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS])
    msg = ac.messages.create(**akw)
    tu = [{"name": b.name, "arguments": json.dumps(b.input)} for b in msg.content if b.type == "tool_use"]
    th = [b.thinking for b in msg.content if b.type == "thinking"]
    check(msg.stop_reason == "tool_use" and valid(tu) and th and th[0],
          f"gemma4 Messages: tool_use blocks {tu}, thinking {th!r:.60}")
    with ac.messages.stream(**akw) as st:
        fm = st.get_final_message()
    stu = [{"name": b.name, "arguments": json.dumps(b.input)} for b in fm.content if b.type == "tool_use"]
    check(fm.stop_reason == "tool_use" and valid(stu), f"gemma4 Messages streamed: tool_use blocks {stu}")
    legacy(fam, tmp)


def legacy(fam, tmp):
    """The older Gemma 4 template (it does not scan role "tool" messages
    itself): the server moves the results into the calling message's
    tool_responses, as llama.cpp does, and they render."""
    src = open(os.path.join(TEMPLATES, fam["template"]), encoding="utf-8").read()
    marker = "{#- OpenAI Chat Completions: forward-scan consecutive role:tool messages -#}"
    if not check(marker in src, "gemma4.jinja names its role:tool scan"):
        return
    path = os.path.join(tmp, "gemma4-legacy.jinja")
    with open(path, "w", encoding="utf-8") as f:
        f.write(src.replace(marker, ""))
    model = os.path.join(tmp, "gemma4-legacy.gguf")
    if not make_model(model, dict(fam, template=path)):
        return
    srv = Server(model, ["-np", "1", "-c", "1024", "-t", "2"])
    try:
        if not check(srv.wait_ready(), "gemma4 legacy: server ready"):
            return
        call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
        hist = MSGS + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "5"},
                       {"role": "assistant", "content": "It is 5."}, {"role": "user", "content": "Thanks"}]
        text = detok(srv, {"messages": hist})
        check("<|tool_call>call:add{a:2,b:3}<tool_call|><|tool_response>response:add{value:5}<tool_response|>"
              "It is 5.<turn|>\n<|turn>user\nThanks<turn|>\n" in text and "<|turn>tool" not in text,
              f"gemma4 legacy: results as tool_responses: {text[-200:]!r}")
    finally:
        srv.stop()


def family(name, fam, tmp):
    model = os.path.join(tmp, name + ".gguf")
    if not make_model(model, fam):
        return
    srv = Server(model, ["-np", "2", "-c", "2048", "-t", "2"])
    try:
        if not check(srv.wait_ready(), f"{name}: server ready"):
            return
        cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120 * SLOW)
        # (a random model may write calls until max_tokens: one call is asked for where the seed does)
        choices = [("required", 1, True), ("required", 2, False),
                   ({"type": "function", "function": {"name": "add"}}, 3, False)]
        last = None
        for choice, seed, parallel in choices:
            kw = dict(model="m", messages=MSGS, tools=TOOLS, tool_choice=choice, max_tokens=400, temperature=0.8,
                      seed=seed, parallel_tool_calls=parallel)
            if fam.get("kwargs"):
                kw["extra_body"] = fam["kwargs"]
            fin, content, calls = whole(cl, **kw)
            named = isinstance(choice, dict)
            check(fin == "tool_calls" and valid(calls) and not content
                  and (not named or all(c["name"] == "add" for c in calls))
                  and (parallel or len(calls) == 1) and (name != "llama3.1" or len(calls) == 1),
                  f"{name} {choice} seed {seed}: {fin} {calls} content {content!r:.60}")
            if name == "mistral":
                check(all(re.fullmatch(r"[A-Za-z0-9]{9}", c["id"]) for c in calls),
                      f"{name}: ids of nine letters and digits: {[c['id'] for c in calls]}")
            sfin, scontent, scalls = streamed(cl, **kw)
            check((sfin, scontent, strip_ids(scalls)) == (fin, content, strip_ids(calls)),
                  f"{name} {choice} seed {seed}: streamed {sfin} {scalls} vs whole {fin} {calls}")
            last = calls
        # the history comes back: the calls, their results, through the template
        if last:
            hist = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in last]}]
            hist += [{"role": "tool", "tool_call_id": c["id"], "content": "42"} for c in last]
            if name == "llama3.1":  # its template takes one call per message
                hist = hist[:2] + hist[2:3]
                hist[1]["tool_calls"] = hist[1]["tool_calls"][:1]
            try:
                r = cl.chat.completions.create(model="m", messages=hist, tools=TOOLS, max_tokens=8, temperature=0)
                ok = r.choices[0].finish_reason in ("stop", "length", "tool_calls")
                err = ""
            except openai.APIError as e:
                ok, err = False, str(e)
            check(ok, f"{name}: the history with calls and results renders: {err:.300}")
        if name == "qwen3.5":
            qwen35_more(srv, cl)
        if name == "gemma4":
            gemma4_more(srv, cl, fam, tmp)
        if name == "mistral":
            tok = post(srv.url + "/tokenize", {"content": "[TOOL_CALLS]", "add_special": False})["tokens"]
            check(len(tok) == 1, f"[TOOL_CALLS] is one token: {tok}")
            kw = dict(model="m", messages=MSGS, tools=TOOLS, tool_choice="auto", max_tokens=400, temperature=0.8,
                      seed=4, logit_bias={str(tok[0]): 100})
            fin, content, calls = whole(cl, **kw)
            check(fin == "tool_calls" and valid(calls), f"{name} auto, the control token biased: {fin} {calls}")
            sfin, scontent, scalls = streamed(cl, **kw)
            check((sfin, scontent, strip_ids(scalls)) == (fin, content, strip_ids(calls)),
                  f"{name} auto: streamed {sfin} {scalls} equals whole {fin} {calls}")
    finally:
        srv.stop()


def main():
    with tempfile.TemporaryDirectory(prefix="tl-toolfmt-") as tmp:
        for name, fam in FAMILIES.items():
            family(name, fam, tmp)
    tlcheck.finish()


if __name__ == "__main__":
    main()
