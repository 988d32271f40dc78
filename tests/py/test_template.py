"""Chat templates: `tokenloop template` must print byte for byte what Python's
jinja2 renders when configured as Hugging Face transformers configures it
(apply_chat_template), for the templates in GGUF files and hand-written ones in
published formats, over several conversations (Gemma 4's over its own too,
and the filters it needs); raise_exception and unsupported constructs must
fail with their message.
Usage: TL_BIN=build/tokenloop python3 tests/py/test_template.py"""
import datetime
import functools
import glob
import json
import os
import subprocess
import sys
import tempfile

import gguf
import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TL_BIN = os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop"))
VOCAB = os.environ.get("TL_VOCAB_DIR", "/work/shared/vocab")
TPL_DIR = os.path.join(ROOT, "tests", "templates")
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
PHI3 = os.path.join(VOCAB, "ggml-vocab-phi-3.gguf")

from tlcheck import check, finish, summary  # noqa: F401  (shared pass/fail counting)
import tlcheck


# transformers' setup (src/transformers/utils/chat_template_utils.py)
class Raised(jinja2.exceptions.TemplateError):
    """What the template's raise_exception() throws (transformers raises TemplateError)."""


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


def hf_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


@functools.lru_cache(maxsize=None)  # reading a GGUF file in Python takes a while: once per file
def gguf_info(path):
    r = gguf.GGUFReader(path)

    def field(name):
        f = r.fields.get(name)
        return None if f is None else f.parts[f.data[0]]

    toks = r.fields["tokenizer.ggml.tokens"]
    def tok(i):
        return bytes(toks.parts[toks.data[i]]).decode()
    tpl = field("tokenizer.chat_template")
    info = {"template": bytes(tpl).decode() if tpl is not None else None}
    for k in ("bos", "eos"):
        v = field(f"tokenizer.ggml.{k}_token_id")
        if v is not None:
            info[k + "_token"] = tok(int(v[0]))
    return info


def py_render(tpl, conv, model, add_gen):
    variables = {"messages": conv} if isinstance(conv, list) else dict(conv)
    for k in ("bos_token", "eos_token"):
        if k in model and k not in variables:
            variables[k] = model[k]
    try:
        return hf_env().from_string(tpl).render(add_generation_prompt=add_gen, **variables), None
    except Raised as e:
        return None, ("raised", str(e))
    except Exception as e:  # undefined errors, type errors
        return None, ("error", str(e))


def tl_render(model_path, tpl_path, conv_path, add_gen):
    cmd = [TL_BIN, "template", "-m", model_path, "--messages", conv_path]
    if tpl_path:
        cmd += ["--template", tpl_path]
    if not add_gen:
        cmd.append("--no-generation-prompt")
    p = subprocess.run(cmd, capture_output=True)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def compare(name, model_path, tpl_path, conv_path):
    model = gguf_info(model_path)
    tpl = open(tpl_path, encoding="utf-8").read() if tpl_path else model["template"]
    conv = json.load(open(conv_path, encoding="utf-8"))
    for add_gen in (True, False):
        want, err = py_render(tpl, conv, model, add_gen)
        rc, out, stderr = tl_render(model_path, tpl_path, conv_path, add_gen)
        label = f"{name} / {os.path.basename(conv_path)} / gen={add_gen}"
        if err is None:
            ok = rc == 0 and out == want.encode("utf-8")
            check(ok, f"{label}: rc={rc} stderr={stderr.strip()!r}\n  want={want!r}\n  got ={out.decode('utf-8', 'replace')!r}")
        else:
            check(rc != 0 and out == b"", f"{label}: jinja2 fails ({err}) but tokenloop gave rc={rc} out={out[:200]!r}")
            if err[0] == "raised":
                check(err[1] in stderr, f"{label}: message {err[1]!r} not in stderr {stderr!r}")


# Gemma 4's template over what it does beyond the shared conversations:
# enable_thinking on and off, tools whose parameters nest (dictsort'ed keys of
# mixed case, arrays of objects, a type list, a function with a response),
# calls with ids and their role "tool" results (text and parts), reasoning in
# a tool loop, an answer after results, an unanswered call with string
# arguments, a result named by `name`, the legacy tool_responses, two
# assistant turns in a row, an empty tools list.
G4_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "Unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer"},
            "opts": {"type": "object", "properties": {"Zeta": {"type": "boolean"},
                                                      "alpha": {"type": "number", "nullable": True}},
                     "required": ["alpha"]},
            "stops": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}},
                                                 "required": ["name"]}},
            "free": {"type": "object"},
            "anyt": {"type": ["string", "null"]},
            "pattern": {"type": "string", "pattern": "^a"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "noargs", "description": "No arguments"}},
    {"type": "function", "function": {"name": "withresp", "description": "Has a response",
                                      "parameters": {"type": "object", "properties": {}},
                                      "response": {"description": "what comes back", "type": "object"}}},
]
G4_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {
    "city": "Paris", "Unit": "c", "days": 3, "opts": {"Zeta": True, "alpha": None, "beta": 1.5},
    "stops": [{"name": "x"}, "y", 2, False], "free": {}}}}
G4_CALL2 = {"id": "call_2", "type": "function", "function": {"name": "noargs", "arguments": {}}}
G4_CONVS = {
    "think_on": {"messages": [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Hi"}],
                 "enable_thinking": True},
    "think_off": {"messages": [{"role": "user", "content": "Hi"}], "enable_thinking": False},
    "think_history": {"messages": [{"role": "user", "content": "Hi"},
                                   {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>Hello"},
                                   {"role": "user", "content": "again"}], "enable_thinking": True},
    "developer": {"messages": [{"role": "developer", "content": "Dev."},
                               {"role": "user", "content": [{"type": "text", "text": " a "},
                                                            {"type": "text", "text": "b"}]}]},
    "tool_loop": {"messages": [
        {"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should call.", "tool_calls": [G4_CALL, G4_CALL2]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "a"},
                                                               {"type": "text", "text": "b"}]}],
        "tools": G4_TOOLS, "enable_thinking": True},
    "answer_after_results": {"messages": [
        {"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Let me check.", "tool_calls": [G4_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "Thanks"}], "tools": G4_TOOLS},
    "unanswered": {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "noargs", "arguments": "raw{}"}}]}],
        "tools": G4_TOOLS},
    "result_by_name": {"messages": [
        {"role": "user", "content": "Weather?"}, {"role": "assistant", "tool_calls": [G4_CALL]},
        {"role": "tool", "tool_call_id": "other", "name": "get_weather", "content": "x"}], "tools": G4_TOOLS},
    "tool_responses": {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [G4_CALL], "tool_responses": [
            {"name": "get_weather", "response": {"temp": 21, "Sky": "clear", "list": [1, "a"]}}, {"response": "plain"}]}],
        "tools": G4_TOOLS},
    "assistant_twice": {"messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "One."},
        {"role": "assistant", "content": "Two <|channel>x<channel|> three"}]},
    "empty_tools": {"messages": [{"role": "user", "content": "Hi"}], "tools": []},
}
# The filters Gemma 4's template needs, over the values that tell them apart.
FILTERS = {
    "dictsort": "{{ d | dictsort }}",
    "dictsort_args": "{% for k, v in d | dictsort(reverse=true) %}{{ k }}={{ v }};{% endfor %}|"
                     "{{ d | dictsort(true) }}|{{ d | dictsort(by='value') }}|{{ {} | dictsort }}",
    "dictsort_many": "{{ e | dictsort }}{{ e | dictsort(reverse=true) }}{{ e | dictsort(false, 'value', true) }}",
    "map_filter": "{{ ['a', 'Bc'] | map('upper') | list }}{{ [[1], 'xy', {}] | map('length') | join(',') }}"
                  "{{ ['a', 'b'] | map('replace', 'a', 'z') | list }}",
}


def main():
    for p in (TL_BIN, SMOL, PHI3):
        if not os.path.exists(p):
            print(f"missing {p}")
            print("0 passed, 1 failed")
            return 1
    convs = sorted(glob.glob(os.path.join(TPL_DIR, "*.json")))
    check(len(convs) >= 6, "message sets present")
    for c in convs:
        compare("SmolLM2 (gguf)", SMOL, None, c)
        compare("phi-3 (gguf)", PHI3, None, c)
        for t in sorted(glob.glob(os.path.join(TPL_DIR, "*.jinja"))):
            compare(os.path.basename(t), SMOL, t, c)

    with tempfile.TemporaryDirectory() as d:
        g4 = os.path.join(TPL_DIR, "gemma4.jinja")
        check(os.path.exists(g4), "tests/templates/gemma4.jinja present")
        for name, conv in G4_CONVS.items():
            path = os.path.join(d, name + ".json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(conv, f)
            compare("gemma4.jinja", SMOL, g4, path)
        conv = os.path.join(d, "dict.json")
        with open(conv, "w", encoding="utf-8") as f:
            json.dump({"messages": [{"role": "user", "content": "x"}], "d": {"b": 1, "A": 3, "a": 2, "C": 0, "_": 5},
                       "e": {"x9": 1, "X9": 2, "b": 3, "a1": 4, "A1": 5, "z": 6, "Y": 7, "y": 8, "m": 9, "M": 10,
                             "_a": 11, "1": 12, "Z": 13, "q": 7, "Q": 1}}, f)
        for name, text in FILTERS.items():
            path = os.path.join(d, name + ".jinja")
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            compare(name, SMOL, path, conv)

    # Explicit failure cases: raise_exception text, unsupported construct, syntax error.
    alt = os.path.join(TPL_DIR, "alternation.json")
    rc, out, err = tl_render(SMOL, os.path.join(TPL_DIR, "gemma3.jinja"), alt, True)
    check(rc != 0 and "Conversation roles must alternate" in err and not out,
          f"gemma3 alternation: rc={rc} err={err!r}")
    with tempfile.TemporaryDirectory() as d:
        def write(name, text):
            p = os.path.join(d, name)
            open(p, "w").write(text)
            return p
        bad = write("unsupported.jinja", "{% for m in messages %}{% filter upper %}{{ m.content }}{% endfilter %}{% endfor %}")
        rc, out, err = tl_render(SMOL, bad, alt, True)
        check(rc != 0 and "unsupported construct" in err and "filter" in err and "line 1" in err and not out,
              f"unsupported construct: rc={rc} err={err!r}")
        bad = write("syntax.jinja", "hello\n{% if messages %}\n{{ messages[0].content }\n")
        rc, out, err = tl_render(SMOL, bad, alt, True)
        check(rc != 0 and "line" in err and not out, f"syntax error: rc={rc} err={err!r}")
        bad = write("undef.jinja", "{{ nothing.attr }}")
        rc, out, err = tl_render(SMOL, bad, alt, True)
        check(rc != 0 and "'nothing' is undefined" in err, f"undefined attribute: rc={rc} err={err!r}")
        msgs = write("wrapped.json", json.dumps({"messages": [{"role": "user", "content": "x"}]}))
        rc, out, err = tl_render(SMOL, None, msgs, True)
        check(rc == 0 and out.endswith(b"<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"),
              f"object form of --messages: rc={rc} out={out!r}")
        rc, out, err = tl_render(SMOL, None, write("bad.json", "[{\"role\": }]"), True)
        check(rc != 0 and "JSON" in err, f"bad JSON: rc={rc} err={err!r}")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
