"""Reasoning on a model whose vocabulary carries the markers: a random-weight
Qwen 3-shape model (scripts/mkmodel.py) with <think>, </think>, <tool_call>
and </tool_call> as single tokens and a template whose generation prompt
opens <think> (tests/templates/think.jinja). The server finds the reasoning
from the template alone (--reasoning auto). A logit bias against </think>
keeps the model thinking, so only the budget can end it: at budgets 1, 7 and
64, streamed and not, the reasoning comes back apart, the content never
holds a marker, the reasoning tokens are the budget plus the close marker's,
streamed equals whole. Also: no budget runs to max_tokens inside the
reasoning; chat_template_kwargs enable_thinking=false leaves it all content;
reasoning_effort low caps at its documented 256; a JSON schema and tool calls
apply to the answer after the reasoning; an assistant turn sent back with
its reasoning_content renders through the template.
Gemma 4 too (tests/templates/gemma4.jinja on a random model whose vocabulary
has its markers as tokens): it reasons in a thought channel,
<|channel>thought ... <channel|>, and thinks only when its template is asked
(enable_thinking, which the server sets unless the request's reasoning is
none); a grammar that holds the reply from its first token gets the channel
opened in the prompt, so the reasoning (within its budget) comes first;
with --reasoning on the server opens it for any reply: budgets, streamed
equal to whole, no marker (nor the header's newline) in either part, and
the Messages and Responses dialects' reasoning equal to chat's.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_think.py"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

import jsonschema
import anthropic
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, Server  # noqa: E402

MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")
TEMPLATE = os.path.join(ROOT, "tests", "templates", "think.jinja")
MSGS = [{"role": "user", "content": "Is 17 a prime number?"}]


def make_model(path):
    vocab = os.path.join(os.environ.get("TL_VOCAB_DIR", os.path.join(ROOT, "..", "shared", "vocab")),
                         "ggml-vocab-gpt-2.gguf")
    p = subprocess.run([sys.executable, MKMODEL, "qwen3", path, "--vocab", vocab, "--seed", "7",
                        "--add-control", "<|im_start|>", "--add-control", "<|im_end|>",
                        "--add-token", "<think>", "--add-token", "</think>",
                        "--add-token", "<tool_call>", "--add-token", "</tool_call>",
                        "--eos", "<|im_end|>", "--template", TEMPLATE],
                       capture_output=True, text=True, timeout=300)
    return check(p.returncode == 0, f"mkmodel: {p.stderr[-300:]}")


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60 * SLOW) as r:
        return json.loads(r.read())


def reasoning_of(m):
    return getattr(m, "reasoning_content", None) or (m.model_extra or {}).get("reasoning_content")


def stream(cl, **kw):
    rs, cs, finish, usage, calls = "", "", None, None, {}
    for ch in cl.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if ch.usage:
            usage = ch.usage
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        rs += getattr(d, "reasoning_content", None) or (d.model_extra or {}).get("reasoning_content") or ""
        cs += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"name": "", "arguments": ""})
            if tc.function and tc.function.name:
                c["name"] += tc.function.name
            if tc.function and tc.function.arguments:
                c["arguments"] += tc.function.arguments
        finish = ch.choices[0].finish_reason or finish
    return rs, cs, finish, usage, [calls[i] for i in sorted(calls)]


def no_marker(s):
    return "<think>" not in (s or "") and "</think>" not in (s or "")


def dialects(srv, cl):
    """The reasoning through the Responses and Messages dialects: a reasoning
    item / a thinking block holding what chat gives as reasoning_content, the
    budget honoured, streamed equal to whole."""
    chat = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=30, temperature=0,
                                      extra_body={"max_thinking_tokens": 7})
    cm = chat.choices[0].message
    n_r = chat.usage.completion_tokens_details.reasoning_tokens
    ac = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120 * SLOW)
    kw = dict(model="m", max_tokens=30, messages=MSGS, thinking={"type": "enabled", "budget_tokens": 7},
              extra_body={"temperature": 0})
    m = ac.messages.create(**kw)
    th = [b.thinking for b in m.content if b.type == "thinking"]
    tx = "".join(b.text for b in m.content if b.type == "text")
    check(th == [reasoning_of(cm)] and tx == (cm.content or "") and 7 <= n_r <= 9,
          f"messages thinking (budget 7): {th!r:.80} / {tx!r:.60} vs chat {reasoning_of(cm)!r:.80} / {cm.content!r:.60}")
    with ac.messages.stream(**kw) as s:
        fm = s.get_final_message()
    check([b.thinking for b in fm.content if b.type == "thinking"] == th and
          "".join(b.text for b in fm.content if b.type == "text") == tx, f"messages thinking streamed: {fm.content}")
    off = ac.messages.create(model="m", max_tokens=12, messages=MSGS, thinking={"type": "disabled"},
                             extra_body={"temperature": 0})
    off_th = [b for b in off.content if b.type == "thinking"]
    check(all(not b.thinking.strip() for b in off_th), f"thinking disabled: {off.content}")
    oc = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120 * SLOW)
    ce = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=300, temperature=0, reasoning_effort="low")
    r = oc.responses.create(model="m", input=MSGS[0]["content"], max_output_tokens=300, temperature=0,
                            reasoning={"effort": "low"})
    items = [o for o in r.output if o.type == "reasoning"]
    text = items[0].content[0].text if items and items[0].content else None
    check(text == reasoning_of(ce.choices[0].message) and r.output_text == (ce.choices[0].message.content or "")
          and r.usage.output_tokens_details.reasoning_tokens == ce.usage.completion_tokens_details.reasoning_tokens,
          f"responses reasoning item = chat's reasoning: {text!r:.60} vs {reasoning_of(ce.choices[0].message)!r:.60}")
    with oc.responses.stream(model="m", input=MSGS[0]["content"], max_output_tokens=300, temperature=0,
                             reasoning={"effort": "low"}) as s:
        deltas = "".join(ev.delta for ev in s if ev.type == "response.reasoning_text.delta")
    check(deltas == text, f"responses reasoning streamed: {deltas!r:.60}")


G4_TEMPLATE = os.path.join(ROOT, "tests", "templates", "gemma4.jinja")
G4_MARKERS = ("<|channel>", "<channel|>", "<|turn>", "<turn|>")


def g4_model(path):
    vocab = os.path.join(os.environ.get("TL_VOCAB_DIR", os.path.join(ROOT, "..", "shared", "vocab")),
                         "ggml-vocab-gpt-2.gguf")
    args = [sys.executable, MKMODEL, "llama3", path, "--vocab", vocab, "--seed", "5", "--eos", "<turn|>",
            "--template", G4_TEMPLATE]
    for c in ("<|turn>", "<turn|>", "<|tool>", "<tool|>", "<|think|>"):
        args += ["--add-control", c]
    for c in ("<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", '<|"|>', "<|tool_response>",
              "<tool_response|>"):
        args += ["--add-token", c]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    return check(p.returncode == 0, f"mkmodel gemma4: {p.stderr[-300:]}")


def g4_clean(s):
    return not any(m in (s or "") for m in G4_MARKERS)


def gemma4_auto(model):
    """--reasoning auto: the template's markers are Gemma's; a JSON schema
    opens the channel in the prompt, the budget ends it, the JSON follows;
    reasoning none renders enable_thinking false and reasons not at all."""
    srv = Server(model, ["-np", "2", "-c", "2048", "-t", "2"])
    try:
        if not check(srv.wait_ready(), "gemma4 server ready"):
            return
        close = post(srv.url + "/tokenize", {"content": "<channel|>", "add_special": False})["tokens"]
        check(len(close) == 1, f"gemma4: <channel|> is one token: {close}")
        cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120 * SLOW)
        schema = {"type": "object", "properties": {"prime": {"type": "boolean"},
                                                   "why": {"type": "string", "maxLength": 20}},
                  "required": ["prime", "why"], "additionalProperties": False}
        rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}
        kw = dict(model="m", messages=MSGS, max_tokens=120, temperature=0.8, seed=5, response_format=rf,
                  logit_bias={str(close[0]): -100}, extra_body={"max_thinking_tokens": 8})
        r = cl.chat.completions.create(**kw)
        m = r.choices[0].message
        n_r = r.usage.completion_tokens_details.reasoning_tokens
        try:
            jsonschema.validate(json.loads(m.content), schema)
            ok = bool(reasoning_of(m)) and g4_clean(reasoning_of(m)) and 8 <= n_r <= 11
        except (TypeError, ValueError, jsonschema.ValidationError):
            ok = False
        check(ok, f"gemma4: json after reasoning: {n_r} tokens, reasoning {reasoning_of(m)!r:.50}, "
                  f"content {m.content!r:.100}")
        srs, scs, sfin, su, _ = stream(cl, **kw)
        check(srs == reasoning_of(m) and scs == m.content and su.completion_tokens_details.reasoning_tokens == n_r,
              f"gemma4: json after reasoning streamed: {srs!r:.50}/{scs!r:.60} vs {reasoning_of(m)!r:.50}/{m.content!r:.60}")
        r = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=120, temperature=0.8, seed=5,
                                       response_format=rf, reasoning_effort="none")
        m = r.choices[0].message
        try:
            jsonschema.validate(json.loads(m.content), schema)
            ok = not reasoning_of(m) and r.usage.completion_tokens_details.reasoning_tokens == 0
        except (TypeError, ValueError, jsonschema.ValidationError):
            ok = False
        check(ok, f"gemma4: reasoning none: {reasoning_of(m)!r:.40}, content {m.content!r:.80}")
    finally:
        srv.stop()


def gemma4_on(model):
    """--reasoning on: the server opens Gemma's channel after the generation
    prompt; budgets hold, streamed equals whole, the dialects agree."""
    srv = Server(model, ["-np", "2", "-c", "2048", "-t", "2", "--reasoning", "on"])
    try:
        if not check(srv.wait_ready(), "gemma4 server ready (--reasoning on)"):
            return
        close = post(srv.url + "/tokenize", {"content": "<channel|>", "add_special": False})["tokens"]
        cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120 * SLOW)
        keep = {str(close[0]): -100}
        for budget in (1, 7, 40):
            kw = dict(model="m", messages=MSGS, max_tokens=budget + 16, temperature=0.8, seed=budget,
                      logit_bias=keep, extra_body={"max_thinking_tokens": budget})
            r = cl.chat.completions.create(**kw)
            m = r.choices[0].message
            rs, n_r = reasoning_of(m), r.usage.completion_tokens_details.reasoning_tokens
            check(rs and g4_clean(rs) and g4_clean(m.content) and not rs.startswith("\n")
                  and budget <= n_r <= budget + 3 and r.usage.completion_tokens > n_r,
                  f"gemma4 budget {budget}: {n_r} reasoning tokens, reasoning {rs!r:.60}, content {m.content!r:.60}")
            srs, scs, sfin, su, _ = stream(cl, **kw)
            check(srs == rs and scs == (m.content or "") and sfin == r.choices[0].finish_reason
                  and su.completion_tokens_details.reasoning_tokens == n_r,
                  f"gemma4 budget {budget}: streamed {srs!r:.50}/{scs!r:.50} vs {rs!r:.50}/{m.content!r:.50}")
        chat = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=30, temperature=0, logit_bias=keep,
                                          extra_body={"max_thinking_tokens": 7})
        cm = chat.choices[0].message
        ac = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0, timeout=120 * SLOW)
        akw = dict(model="m", max_tokens=30, messages=MSGS, thinking={"type": "enabled", "budget_tokens": 7},
                   extra_body={"temperature": 0, "logit_bias": keep})
        am = ac.messages.create(**akw)
        th = [b.thinking for b in am.content if b.type == "thinking"]
        tx = "".join(b.text for b in am.content if b.type == "text")
        check(th == [reasoning_of(cm)] and tx == (cm.content or ""),
              f"gemma4 messages thinking: {th!r:.80} / {tx!r:.60} vs chat {reasoning_of(cm)!r:.80} / {cm.content!r:.60}")
        with ac.messages.stream(**akw) as st:
            fm = st.get_final_message()
        check([b.thinking for b in fm.content if b.type == "thinking"] == th, f"gemma4 messages streamed: {fm.content}")
        ce = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=40, temperature=0, logit_bias=keep,
                                        reasoning_effort="low")
        rkw = dict(model="m", input=MSGS[0]["content"], max_output_tokens=40, temperature=0,
                   reasoning={"effort": "low"}, extra_body={"logit_bias": keep})
        rr = cl.responses.create(**rkw)
        items = [o for o in rr.output if o.type == "reasoning"]
        text = items[0].content[0].text if items and items[0].content else None
        check(text and text == reasoning_of(ce.choices[0].message) and rr.output_text == (ce.choices[0].message.content or ""),
              f"gemma4 responses reasoning item: {text!r:.60} vs {reasoning_of(ce.choices[0].message)!r:.60}")
        with cl.responses.stream(**rkw) as st:
            deltas = "".join(ev.delta for ev in st if ev.type == "response.reasoning_text.delta")
        check(deltas == text, f"gemma4 responses reasoning streamed: {deltas!r:.60}")
    finally:
        srv.stop()


def main():
    tmp = tempfile.mkdtemp(prefix="tl-think-")
    try:
        run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tlcheck.finish()


def run(tmp):
    model = os.path.join(tmp, "think.gguf")
    if not make_model(model):
        tlcheck.finish()
    srv = Server(model, ["-np", "2", "-c", "2048", "-t", "2"])
    try:
        if not check(srv.wait_ready(), "server ready"):
            tlcheck.finish()
        toks = post(srv.url + "/tokenize", {"content": "<think></think>", "add_special": False})["tokens"]
        check(len(toks) == 2, f"the markers are single tokens: {toks}")
        close = toks[-1]
        prompt = post(srv.url + "/tokenize", {"messages": MSGS})["tokens"]
        prompt_off = post(srv.url + "/tokenize", {"messages": MSGS,
                                                  "chat_template_kwargs": {"enable_thinking": False}})["tokens"]
        check(prompt[-2] == toks[0] and prompt_off[-2] == close,
              f"the generation prompt opens <think> ({prompt[-3:]}); enable_thinking=false closes it ({prompt_off[-4:]})")
        cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120 * SLOW)
        keep_thinking = {str(close): -100}
        for budget in (1, 7, 64):
            for temp, seed in ((0.0, 1), (0.8, 2)):
                kw = dict(model="m", messages=MSGS, max_tokens=budget + 24, temperature=temp, seed=seed,
                          logit_bias=keep_thinking, extra_body={"max_thinking_tokens": budget})
                r = cl.chat.completions.create(**kw)
                m = r.choices[0].message
                rs, n_r = reasoning_of(m), r.usage.completion_tokens_details.reasoning_tokens
                # the forced close is "</think>" and "\n\n": two tokens with this vocabulary
                check(rs is not None and no_marker(m.content) and no_marker(rs) and budget <= n_r <= budget + 2
                      and r.usage.completion_tokens > n_r,
                      f"budget {budget} temp {temp}: {n_r} reasoning tokens of {r.usage.completion_tokens}, "
                      f"reasoning {rs!r:.60}, content {m.content!r:.60}")
                srs, scs, sfin, su, _ = stream(cl, **kw)
                check(srs == rs and scs == (m.content or "") and sfin == r.choices[0].finish_reason
                      and su.completion_tokens_details.reasoning_tokens == n_r,
                      f"budget {budget} temp {temp}: streamed {srs!r:.50}/{scs!r:.50} vs {rs!r:.50}/{m.content!r:.50}")
        # no budget: the reasoning runs to max_tokens, nothing reaches content
        r = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=20, temperature=0,
                                       logit_bias=keep_thinking)
        m = r.choices[0].message
        check(r.choices[0].finish_reason == "length" and not m.content and reasoning_of(m)
              and r.usage.completion_tokens_details.reasoning_tokens == 20,
              f"no budget: {r.choices[0].finish_reason}, {r.usage.completion_tokens_details}, content {m.content!r:.40}")
        # thinking switched off by the template's own variable
        r = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=12, temperature=0,
                                       logit_bias=keep_thinking,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        m = r.choices[0].message
        check(not reasoning_of(m) and m.content and r.usage.completion_tokens_details.reasoning_tokens == 0,
              f"enable_thinking false: reasoning {reasoning_of(m)!r:.40}, content {m.content!r:.40}")
        # reasoning_effort low: 256 tokens at most
        r = cl.chat.completions.create(model="m", messages=MSGS, max_tokens=280, temperature=0,
                                       logit_bias=keep_thinking, reasoning_effort="low")
        n_r = r.usage.completion_tokens_details.reasoning_tokens
        check(256 <= n_r <= 258 and no_marker(r.choices[0].message.content),
              f"reasoning_effort low: {n_r} reasoning tokens")
        # a schema applies to the answer after the reasoning
        schema = {"type": "object", "properties": {"prime": {"type": "boolean"},
                                                   "why": {"type": "string", "maxLength": 20}},
                  "required": ["prime", "why"], "additionalProperties": False}
        for stream_it in (False, True):
            kw = dict(model="m", messages=MSGS, max_tokens=120, temperature=0.8, seed=5, logit_bias=keep_thinking,
                      response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
                      extra_body={"max_thinking_tokens": 8})
            if stream_it:
                rs, content, _, _, _ = stream(cl, **kw)
            else:
                m = cl.chat.completions.create(**kw).choices[0].message
                rs, content = reasoning_of(m), m.content
            try:
                jsonschema.validate(json.loads(content), schema)
                ok = bool(rs) and no_marker(rs)
            except (TypeError, ValueError, jsonschema.ValidationError):
                ok = False
            check(ok, f"json after reasoning (stream {stream_it}): reasoning {rs!r:.50}, content {content!r:.100}")
        # tool calls too, two in one reply, streamed and not
        tools = [{"type": "function", "function": {"name": "is_prime", "parameters": {
            "type": "object", "properties": {"n": {"type": "integer"}},
            "required": ["n"], "additionalProperties": False}}}]
        kw = dict(model="m", messages=MSGS, tools=tools, tool_choice="required", max_tokens=200, temperature=0.8,
                  seed=9, logit_bias=keep_thinking, extra_body={"max_thinking_tokens": 6})
        r = cl.chat.completions.create(**kw)
        m = r.choices[0].message
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls or []]
        ok = r.choices[0].finish_reason == "tool_calls" and calls and reasoning_of(m) and not m.content
        for c in calls:
            ok = ok and c["name"] == "is_prime" and isinstance(json.loads(c["arguments"]).get("n"), int)
        check(ok, f"tool calls after reasoning: {r.choices[0].finish_reason} {calls} {reasoning_of(m)!r:.40}")
        srs, scs, sfin, _, scalls = stream(cl, **kw)
        check(srs == reasoning_of(m) and sfin == "tool_calls" and scalls == calls and not scs,
              f"streamed tool calls after reasoning: {sfin} {scalls} vs {calls}")
        # the assistant turn goes back as the client returned it (reasoning_content
        # included); the template keeps the reasoning within the tool loop
        back = m.model_dump(exclude_none=True)
        hist = MSGS + [back, {"role": "tool", "tool_call_id": m.tool_calls[0].id,
                              "content": "yes"}]
        try:
            r2 = cl.chat.completions.create(model="m", messages=hist, tools=tools, max_tokens=4, temperature=0)
            ok, why = r2.choices[0].finish_reason is not None, ""
        except openai.APIError as e:
            ok, why = False, str(e)
        check(ok and "reasoning_content" in back, f"history with reasoning_content accepted: {why:.200}")
        said = dict(back, reasoning_content="I should call is_prime on seventeen.")
        with_r = post(srv.url + "/tokenize", {"messages": MSGS + [said, hist[-1]]})["tokens"]
        without = post(srv.url + "/tokenize", {"messages": MSGS + [{k: v for k, v in said.items()
                                                                    if k != "reasoning_content"}, hist[-1]]})["tokens"]
        check(len(with_r) > len(without) + 5, f"the template renders the loop's reasoning: {len(with_r)} vs {len(without)}")
        # under auto, the <tool_call> token (biased up) opens a call that the grammar completes
        opener = post(srv.url + "/tokenize", {"content": "<tool_call>", "add_special": False})["tokens"]
        r = cl.chat.completions.create(model="m", messages=MSGS, tools=tools, tool_choice="auto", max_tokens=200,
                                       temperature=0.8, seed=3, parallel_tool_calls=False,
                                       logit_bias={str(opener[0]): 100},
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        m = r.choices[0].message
        check(len(opener) == 1 and r.choices[0].finish_reason == "tool_calls" and len(m.tool_calls or []) == 1
              and isinstance(json.loads(m.tool_calls[0].function.arguments).get("n"), int),
              f"auto: a call opened by the <tool_call> token: {r.choices[0].finish_reason} {m.tool_calls} {m.content!r:.60}")
        dialects(srv, cl)
    finally:
        srv.stop()
    g4 = os.path.join(tmp, "gemma4.gguf")
    if g4_model(g4):
        gemma4_auto(g4)
        gemma4_on(g4)


if __name__ == "__main__":
    main()
