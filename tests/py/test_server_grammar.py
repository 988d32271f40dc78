"""Constrained decoding through the server with the official openai client:
response_format json_schema and json_object on chat and completions, llama.cpp's
`grammar` field, streamed and not, sampled at high temperature and several
seeds, several requests at once; every reply parsed by json and validated by
the jsonschema package. A schema keyword the server does not support is a 400
naming it; a bad grammar is a 400 with its line.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_grammar.py"""
import concurrent.futures
import json
import os
import random
import re
import sys

import jsonschema
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, Server  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
T = 120 * SLOW

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer"},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


def random_schema(rng, depth=0, defs=None):
    """A random schema over the supported keywords whose every valid reply is
    short (strings and arrays bounded), so a reply always ends."""
    kinds = ["string", "enum", "integer", "number", "boolean", "null", "format", "pattern", "const", "nullable"]
    if depth < 2:
        kinds += ["object", "array", "anyOf"] + (["ref"] if defs is not None else [])
    k = rng.choice(kinds)
    if k == "string":
        lo = rng.randint(0, 3)
        return {"type": "string", "minLength": lo, "maxLength": lo + rng.randint(0, 12)}
    if k == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 7, None, True, "a b", "x\"y"], rng.randint(1, 4))}
    if k == "integer" and rng.random() < 0.5:  # bounds of either sign, one side open at times
        lo = rng.randint(-300, 300)
        b = {"minimum": lo, "maximum": lo + rng.randint(2, 2000)}
        if rng.random() < 0.3:
            del b[rng.choice(["minimum", "maximum"])]
        if rng.random() < 0.3:
            b = {"exclusiveM" + kk[1:]: v for kk, v in b.items()}
        return {"type": "integer", **b}
    if k in ("integer", "number", "boolean", "null"):
        return {"type": k}
    if k == "format":
        return {"type": "string", "format": rng.choice(["date", "time", "date-time", "uuid", "email"])}
    if k == "pattern":
        return {"type": "string", "pattern": rng.choice(["^[A-Z]{2}-[0-9]{3}$", "^(yes|no|maybe)$",
                                                         "^\\d{1,4}(\\.\\d{1,2})?$", "^[a-z]{1,12}( [a-z]{1,12}){0,2}$"])}
    if k == "const":
        return {"const": rng.choice(["fixed", 42, False, {"a": 1}, [1, "two"]])}
    if k == "nullable":
        return {"type": ["string", "null"], "maxLength": rng.randint(1, 10)}
    if k == "object":
        n = rng.randint(0, 4)
        names = rng.sample(["id", "name", "size", "tags", "when", "kind", "ok", "note"], n)
        props = {nm: random_schema(rng, depth + 1, defs) for nm in names}
        return {"type": "object", "properties": props, "required": [nm for nm in names if rng.random() < 0.6],
                "additionalProperties": False}
    if k == "array":
        lo = rng.randint(0, 2)
        return {"type": "array", "items": random_schema(rng, depth + 1, defs), "minItems": lo,
                "maxItems": lo + rng.randint(0, 2)}
    if k == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1, defs) for _ in range(rng.randint(2, 3))]}
    name = f"d{len(defs)}"
    defs[name] = random_schema(rng, depth + 1, None)
    return {"$ref": f"#/$defs/{name}"}


def random_root(rng):
    defs = {}
    n = rng.randint(1, 4)
    names = rng.sample(["alpha", "beta", "gamma", "delta", "eps"], n)
    props = {nm: random_schema(rng, 1, defs) for nm in names}
    root = {"type": "object", "properties": props, "required": [nm for nm in names if rng.random() < 0.7],
            "additionalProperties": False}
    if defs:
        root["$defs"] = defs
    return root


def fmt(schema):
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    srv = Server(MODEL, ["-np", "4", "-c", "4096", "-t", "2"])
    try:
        if not check(srv.wait_ready(), "server ready"):
            tlcheck.finish()
        cl = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=T)
        msgs = [{"role": "user", "content": "Make up a person as JSON."}]

        def chat(seed, temp, stream=False, response_format=None, extra=None, messages=None, max_tokens=400):
            kw = dict(model="m", messages=messages or msgs, max_tokens=max_tokens, temperature=temp, seed=seed,
                      response_format=response_format or fmt(PERSON), extra_body=extra)
            if not stream:
                r = cl.chat.completions.create(**kw)
                return r.choices[0].message.content, r.choices[0].finish_reason
            text, finish = "", None
            for ch in cl.chat.completions.create(stream=True, **kw):
                if ch.choices:
                    text += ch.choices[0].delta.content or ""
                    finish = ch.choices[0].finish_reason or finish
            return text, finish

        # several at once, sampled hot, streamed and not
        jobs = [(seed, temp, stream) for seed, temp in ((1, 0.0), (2, 0.8), (3, 1.5), (4, 2.0))
                for stream in (False, True)]
        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            res = list(ex.map(lambda j: chat(*j), jobs))
        for (seed, temp, stream), (text, finish) in zip(jobs, res):
            try:
                jsonschema.validate(json.loads(text), PERSON)
                ok = finish == "stop"
            except (ValueError, jsonschema.ValidationError) as e:
                ok = False
                text = f"{e}: {text}"
            check(ok, f"json_schema seed {seed} temp {temp} stream {stream}: finish {finish}: {text[:300]}")
        # greedy: streamed equals non-streamed
        check(res[0][0] == res[1][0], f"greedy streamed and not agree: {res[0][0]!r} vs {res[1][0]!r}")
        # json_object: any object
        # unbounded, so greedy only: a sampled reply of this small model can run past max_tokens
        for ask in ("Reply with a JSON object with one key 'ok' set to true.", 'Write {"a": 1} as JSON.'):
            text, finish = chat(5, 0.0, response_format={"type": "json_object"},
                                messages=[{"role": "user", "content": ask}])
            try:
                check(isinstance(json.loads(text), dict) and finish == "stop", f"json_object: {text[:200]}")
            except ValueError:
                check(False, f"json_object does not parse: {text[:300]}")
        # llama.cpp's grammar field, chat and completions
        g = 'root ::= ("yes" | "no") " - " [a-z ]{1,30} "."\n'
        text, finish = chat(7, 1.5, response_format={"type": "text"}, extra={"grammar": g})
        check(re.fullmatch(r"(yes|no) - [a-z ]{1,30}\.", text or "") is not None and finish == "stop",
              f"grammar on chat: {text!r} {finish}")
        r = cl.completions.create(model="m", prompt="Is water wet? Answer:", max_tokens=60, temperature=2.0,
                                  seed=8, extra_body={"grammar": g})
        check(re.fullmatch(r"(yes|no) - [a-z ]{1,30}\.", r.choices[0].text) is not None,
              f"grammar on completions: {r.choices[0].text!r}")
        r = cl.completions.create(model="m", prompt="A person in JSON:", max_tokens=400, temperature=1.0, seed=9,
                                  extra_body={"response_format": fmt(PERSON)})
        try:
            jsonschema.validate(json.loads(r.choices[0].text), PERSON)
            check(True, "")
        except (ValueError, jsonschema.ValidationError) as e:
            check(False, f"json_schema on completions: {e}: {r.choices[0].text[:300]}")
        # refusals
        for bad, want in (({"type": "number", "minimum": 1}, "minimum"),
                          ({"type": "string", "format": "ipv4"}, "ipv4"),
                          ({"not": {"type": "string"}}, "not")):
            try:
                chat(1, 0.0, response_format=fmt(bad))
                check(False, f"schema with '{want}' accepted")
            except openai.BadRequestError as e:
                param = e.body.get("param") if isinstance(e.body, dict) else None
                check(want in str(e) and param == "response_format", f"400 names '{want}' (param {param}): {e}")
        try:
            chat(1, 0.0, response_format={"type": "text"}, extra={"grammar": 'root ::= "a"\nx ::= y\n'})
            check(False, "a grammar with an undefined rule accepted")
        except openai.BadRequestError as e:
            check("'y'" in str(e) and "line 2" in str(e), f"bad grammar: 400 with its line: {e}")
        # random schemas, sampled at 0.8, several at once: every reply validates
        rng = random.Random(20261202)
        n_schemas = 30 if os.environ.get("TL_ASAN") else 300
        schemas = [random_root(rng) for _ in range(n_schemas)]

        def one(i):
            try:
                text, finish = chat(1000 + i, 0.8, response_format=fmt(schemas[i]), max_tokens=1200,
                                    messages=[{"role": "user", "content": "Fill in this JSON: "
                                               + json.dumps(schemas[i])[:300]}])
                jsonschema.validate(json.loads(text), schemas[i])
                return None if finish == "stop" else f"finish {finish}"
            except (ValueError, jsonschema.ValidationError, openai.APIError) as e:
                return f"{type(e).__name__}: {str(e)[:300]}"

        with concurrent.futures.ThreadPoolExecutor(4) as ex:
            errs = list(ex.map(one, range(n_schemas)))
        bad = [(i, e) for i, e in enumerate(errs) if e]
        for i, e in bad[:3]:
            print(f"  schema {i}: {e}\n    {json.dumps(schemas[i])[:600]}")
        check(not bad, f"{n_schemas} random schemas: {len(bad)} replies invalid")
        # the server still answers plain requests
        r = cl.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0)
        check(r.choices[0].message.content is not None, "a plain request after the grammar ones")
    finally:
        srv.stop()
    tlcheck.finish()


if __name__ == "__main__":
    main()
