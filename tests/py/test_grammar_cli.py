"""Constrained decoding from the command line: `tokenloop run --json-schema`
on SmolLM2 and Gemma 3, at several temperatures and seeds (high temperature
makes the draws nearly random, so the mask alone keeps the output valid),
each output parsed by Python's json and validated by the jsonschema package
(neither is our code). Also `--grammar` with a GBNF file checked by a Python
regex of the same language, speculation on and off giving the same text, and
the refusals: an unsupported keyword named, a malformed grammar with its line.
Run: TL_BIN=build/tokenloop python3 tests/py/test_grammar_cli.py"""
import json
import os
import re
import subprocess
import sys
import tempfile

import jsonschema

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402

TL_BIN = os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop"))
SMOL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
ASAN = os.environ.get("TL_ASAN") == "1"

# Bounded schemas: every output ends well within the length cap.
SCHEMAS = [
    ("cat", {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 16},
            "age": {"type": "integer"},
            "colors": {"type": "array", "items": {"enum": ["black", "white", "orange", "grey"]},
                       "minItems": 1, "maxItems": 3},
            "indoor": {"type": "boolean"},
            "born": {"type": "string", "format": "date"},
        },
        "required": ["name", "age", "colors"],
        "additionalProperties": False,
    }),
    ("refs and anyOf", {
        "$defs": {
            "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                      "required": ["x", "y"], "additionalProperties": False},
        },
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "where": {"$ref": "#/$defs/point"},
            "tag": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-z]{2,5}-[0-9]{1,3}$"}]},
            "kind": {"const": "shape"},
            "when": {"type": "string", "format": "date-time"},
        },
        "required": ["id", "where", "kind"],
        "additionalProperties": False,
    }),
    ("arrays and types", {
        "type": "object",
        "properties": {
            "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": False},
            "maybe": {"type": ["string", "null"], "maxLength": 8},
            "mail": {"type": "string", "format": "email"},
            "at": {"type": "string", "format": "time"},
            "nums": {"type": "array", "items": {"type": "integer"}, "maxItems": 4},
        },
        "required": ["pair", "maybe"],
        "additionalProperties": False,
    }),
]


def run(model, *args, timeout=600):
    p = subprocess.run([TL_BIN, "run", "-m", model, "-t", "2", *args], capture_output=True, text=True,
                       timeout=timeout * (4 if ASAN else 1))
    return p.returncode, p.stdout, p.stderr


def main():
    if not check(os.path.exists(SMOL) and os.path.exists(GEMMA), "models present (make models)"):
        tlcheck.finish()
    with tempfile.TemporaryDirectory() as d:
        models = [("SmolLM2", SMOL)] + ([] if ASAN else [("Gemma 3", GEMMA)])
        for label, schema in SCHEMAS:
            path = os.path.join(d, "s.json")
            with open(path, "w") as f:
                json.dump(schema, f)
            for mname, model in models:
                for temp, seed in (("0", 1), ("1.0", 2), ("3.0", 3), ("8.0", 4))[: 2 if ASAN else 4]:
                    chat = ["--chat"] if model == SMOL else []  # this Gemma file has no chat template
                    rc, out, err = run(model, *chat, "-p", f"Give me one {label} example as JSON.",
                                       "--json-schema", path, "--temp", temp, "--seed", str(seed), "-n", "600",
                                       "--top-k", "0", "--top-p", "1", "--min-p", "0")
                    ok = check(rc == 0, f"{mname} {label} temp {temp}: rc {rc}: {err[-300:]}")
                    if not ok:
                        continue
                    check("stop: end of generation" in err, f"{mname} {label} temp {temp}: ended by the grammar, "
                          f"not the length cap: {err.strip().splitlines()[-1][:200]}")
                    try:
                        jsonschema.validate(json.loads(out), schema)
                        check(True, "")
                    except (ValueError, jsonschema.ValidationError) as e:
                        check(False, f"{mname} {label} temp {temp}: output does not validate: {e}\n{out[:400]}")
        # the same text with speculation on and off (greedy), on a copy-heavy prompt
        path = os.path.join(d, "s.json")
        with open(path, "w") as f:
            json.dump(SCHEMAS[0][1], f)
        outs = [run(SMOL, "--chat", "-p", 'Repeat this JSON: {"name": "Tom", "age": 3, "colors": ["grey"]}',
                    "--json-schema", path, "--temp", "0", "-n", "200", "--spec", spec)[1] for spec in ("off", "ngram", "auto")]
        check(outs[0] == outs[1] == outs[2] and outs[0], f"--spec off/ngram/auto give one text: {outs}")
        # a GBNF grammar, its language checked by a Python regex
        gpath = os.path.join(d, "g.gbnf")
        with open(gpath, "w") as f:
            f.write('root ::= "Answer: " ("yes" | "no") ", because " [a-z ,]{1,40} "."\n')
        for seed in (1, 2, 3):
            rc, out, err = run(SMOL, "--chat", "-p", "Is the sky blue?", "--grammar", gpath, "--temp", "1.5",
                               "--seed", str(seed), "-n", "100")
            check(rc == 0 and re.fullmatch(r"Answer: (yes|no), because [a-z ,]{1,40}\.\n?", out),
                  f"grammar output seed {seed}: {out!r} {err[-200:]}")
        # grammars in the style of llama.cpp's examples (written here): each
        # parses, and the output is in its language by a Python check
        arith = ('root ::= expr\n'
                 'expr ::= term (ws [-+] ws term){0,6}\n'
                 'term ::= factor (ws [*/] ws factor){0,3}\n'
                 'factor ::= [0-9]{1,4} | "(" ws expr ws ")"\n'
                 'ws ::= " "?\n')
        listg = 'root ::= item{1,5}\nitem ::= "- " [a-zA-Z] [a-zA-Z ,]{0,30} "\\n"\n'
        chess = ('root ::= "1. " move " " move (" " num " " move " " move){0,3}\n'
                 'num ::= [2-9] "."\n'
                 'move ::= (pawn | piece | castle) [+#]?\n'
                 'pawn ::= file ("x" file)? rank ("=" [QRBN])?\n'
                 'piece ::= [KQRBN] file? rank? "x"? file rank\n'
                 'castle ::= "O-O" "-O"?\n'
                 'file ::= [a-h]\n'
                 'rank ::= [1-8]\n')
        move = r"(?:(?:[a-h](?:x[a-h])?[1-8](?:=[QRBN])?)|(?:[KQRBN][a-h]?[1-8]?x?[a-h][1-8])|O-O(?:-O)?)[+#]?"
        checks = [
            (arith, "Compute 12 times (3 plus 4):", lambda t: re.fullmatch(r"[0-9()+\-*/ ]+", t) is not None
             and isinstance(eval(t, {"__builtins__": {}}), (int, float))),  # noqa: S307 - digits and operators only
            (listg, "List three fruits:", lambda t: re.fullmatch(r"(- [a-zA-Z][a-zA-Z ,]{0,30}\n){1,5}", t) is not None),
            (chess, "Start a chess game:", lambda t: re.fullmatch(rf"1\. {move} {move}( [2-9]\. {move} {move}){{0,3}}", t)
             is not None),
        ]
        for g, prompt, ok in checks:
            with open(gpath, "w") as f:
                f.write(g)
            for temp, seed in (("0", 1), ("1.0", 2)):
                rc, out, err = run(SMOL, "--chat", "-p", prompt, "--grammar", gpath, "--temp", temp, "--seed",
                                   str(seed), "-n", "200")
                text = out[:-1] if out.endswith("\n") else out
                try:
                    good = rc == 0 and "end of generation" in err and ok(text)
                except ZeroDivisionError:  # arithmetic that parsed and divides by zero: in the language
                    good = rc == 0
                except SyntaxError:
                    good = False
                check(good, f"grammar {g.splitlines()[0]!r} temp {temp}: {out!r} {err[-200:]}")
        # refusals: named keyword, grammar line
        for schema, want in (({"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 3}}}, "multipleOf"),
                             ({"type": "string", "format": "hostname"}, "hostname"),
                             ({"allOf": [{"type": "string"}]}, "allOf"),
                             ({"$ref": "https://example.com/s.json"}, "$ref"),
                             ({"type": "object", "properties": {"a": {"type": "integer"}},
                               "additionalProperties": True}, "additionalProperties"),
                             ({"type": "string", "maxLength": 1500}, "1000"),
                             ({"type": "string", "pattern": "^a\\qb$"}, "\\q")):
            with open(path, "w") as f:
                json.dump(schema, f)
            rc, out, err = run(SMOL, "-p", "x", "--json-schema", path, "-n", "5")
            check(rc != 0 and want in err and not out, f"schema refused naming '{want}': rc {rc}, {err.strip()[-200:]}")
        with open(gpath, "w") as f:
            f.write('root ::= "a" b\n\nb ::= "c\n')
        rc, out, err = run(SMOL, "-p", "x", "--grammar", gpath, "-n", "5")
        check(rc != 0 and "line 3" in err, f"bad grammar refused with its line: {err.strip()[-200:]}")
    tlcheck.finish()


if __name__ == "__main__":
    main()
