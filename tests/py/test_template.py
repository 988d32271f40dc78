"""Chat templates: `tokenloop template` must print byte for byte what Python's
jinja2 renders when configured as Hugging Face transformers configures it
(apply_chat_template), for the templates in GGUF files and hand-written ones in
published formats, over several conversations; raise_exception and
unsupported constructs must fail with their message.
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
