#!/usr/bin/env python3
"""Checks tokenloop's "gemma4" tokenizer (tokenizer.ggml.model = "gemma4":
BPE over raw UTF-8, spaces as U+2581, text split into runs of newlines and
runs of anything else, <0xXX> byte fallback) against llama.cpp's output in
tests/oracle/fixtures/gemma4_vocab.json (written by
tests/oracle/make_fixtures_gemma4_vocab.py through llama-cpp-python).

The fixture holds a small Gemma-4-style vocabulary (its tokens, types and
merges); this writes it as a vocabulary-only GGUF file, byte for byte the
file llama.cpp read (its sha256 is in the fixture), then for every string:
  - `tokenloop tokenize --bos --ids` with and without --no-special gives
    llama.cpp's ids (llm.tokenize(text, add_bos=True, special=True|False));
  - the pieces `tokenloop tokenize --bos` prints for the special-parsed ids
    join to llama.cpp's detokenization of them (special tokens rendered).
Needs only the standard library; a missing binary or fixture is a failure.
Usage: TL_BIN=build/tokenloop python3 tests/py/test_gemma4_vocab.py
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tlcheck import ROOT, check, finish  # noqa: E402

FIXTURE = os.path.join(ROOT, "tests", "oracle", "fixtures", "gemma4_vocab.json")
TL_BIN = os.path.abspath(os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop")))

# ---------------------------------------------------------------- GGUF writing

# GGUF value types (ggml's gguf.h)
T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
ALIGNMENT = 32


def _str(s):
    b = s if isinstance(s, bytes) else s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v):
    if vtype == T_STRING:
        return _str(v)
    if vtype == T_UINT32:
        return struct.pack("<I", v)
    if vtype == T_INT32:
        return struct.pack("<i", v)
    if vtype == T_FLOAT32:
        return struct.pack("<f", v)
    if vtype == T_BOOL:
        return struct.pack("<?", v)
    raise ValueError(f"unsupported GGUF type {vtype}")


def gguf_bytes(kvs):
    """A GGUF v3 file without tensors from [(key, type, value)], where an
    array is (T_ARRAY, (element type, list)). The layout is gguf-py's
    GGUFWriter's: header, key/values in order, zero padding to 32 bytes."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)))
    for key, vtype, v in kvs:
        out += _str(key) + struct.pack("<I", vtype)
        if vtype == T_ARRAY:
            etype, items = v
            out += struct.pack("<IQ", etype, len(items))
            for x in items:
                out += _value(etype, x)
        else:
            out += _value(vtype, v)
    out += b"\0" * (-len(out) % ALIGNMENT)
    return bytes(out)


def vocab_kvs(v):
    """The key/values of the fixture's vocabulary, in the order the generator
    writes them (general.architecture first, as GGUFWriter puts it)."""
    tokens = [bytes.fromhex(h) for h in v["tokens_hex"]]
    kvs = [
        ("general.architecture", T_STRING, v["architecture"]),
        ("general.name", T_STRING, v["name"]),
        ("tokenizer.ggml.model", T_STRING, v["model"]),
    ] + ([("tokenizer.ggml.pre", T_STRING, v["pre"])] if "pre" in v else []) + [
        ("tokenizer.ggml.tokens", T_ARRAY, (T_STRING, tokens)),
        ("tokenizer.ggml.scores", T_ARRAY, (T_FLOAT32, [0.0] * len(tokens))),
        ("tokenizer.ggml.token_type", T_ARRAY, (T_INT32, v["token_types"])),
        ("tokenizer.ggml.merges", T_ARRAY, (T_STRING, [bytes.fromhex(h) for h in v["merges_hex"]])),
    ]
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        kvs.append((f"tokenizer.ggml.{key}", T_UINT32, v[key]))
    kvs.append(("tokenizer.ggml.add_bos_token", T_BOOL, v["add_bos_token"]))
    kvs.append(("tokenizer.ggml.add_space_prefix", T_BOOL, False))
    return kvs


# ---------------------------------------------------------------- running tokenloop

def tl(args, data):
    try:
        p = subprocess.run([TL_BIN, *args], input=data, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, b"", str(e).encode()
    return p.returncode, p.stdout, p.stderr


def tokenize_ids(model, data, special):
    args = ["tokenize", "-m", model, "--stdin", "--bos", "--ids"] + ([] if special else ["--no-special"])
    rc, out, err = tl(args, data)
    if rc != 0:
        return None, f"rc={rc} {err.decode(errors='replace').strip()[-200:]}"
    try:
        ids = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError, UnicodeDecodeError):
        return None, f"unparsable output {out[-200:]!r}"
    return ids, None


def parse_pieces(out, ids):
    """Splits `tokenize`'s listing ('%6d -> '<piece>'\\n' per token) into the
    pieces' bytes, given the ids it lists (a piece may hold newlines and
    quotes, so each one ends where the next token's line begins)."""
    pieces, pos = [], 0
    for i, t in enumerate(ids):
        head = b"%6d -> '" % t
        if out[pos:pos + len(head)] != head:
            return None
        pos += len(head)
        end = out.find(b"'\n" + (b"%6d -> '" % ids[i + 1]), pos) if i + 1 < len(ids) else len(out) - 2
        if end < pos or (i + 1 == len(ids) and out[end:] != b"'\n"):
            return None
        pieces.append(out[pos:end])
        pos = end + 2
    return pieces if pos == len(out) else None


def tokenize_pieces(model, data, ids):
    rc, out, err = tl(["tokenize", "-m", model, "--stdin", "--bos"], data)
    if rc != 0:
        return None, f"rc={rc} {err.decode(errors='replace').strip()[-200:]}"
    pieces = parse_pieces(out, ids)
    return pieces, (None if pieces is not None else f"unparsable listing {out[-200:]!r}")


# ---------------------------------------------------------------- the checks

def check_file(model, name, items):
    workers = max(2, os.cpu_count() or 2)
    for mode, key in (("special", "ids_special"), ("plain", "ids_plain")):
        with ThreadPoolExecutor(max_workers=workers) as ex:
            res = list(ex.map(lambda it: tokenize_ids(model, bytes.fromhex(it["hex"]), mode == "special"), items))
        bad = [(it, ids, err) for it, (ids, err) in zip(items, res) if ids != it[key]]
        print(f"{name} ids [{mode}]: {len(items) - len(bad)}/{len(items)} identical to llama.cpp's")
        for it, ids, err in bad[:6]:
            ref, got = it[key], ids or []
            k = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
            print(f"  {it['label']} {bytes.fromhex(it['hex'])[:50]!r}: first difference at {k}: "
                  f"ref {ref[k:k + 8]} got {got[k:k + 8]} {err or ''}")
        check(not bad, f"{name} ids [{mode}]: {len(bad)} of {len(items)} strings tokenize differently")
    # detokenization: the pieces of the special-parsed ids, joined
    with ThreadPoolExecutor(max_workers=workers) as ex:
        res = list(ex.map(lambda it: tokenize_pieces(model, bytes.fromhex(it["hex"]), it["ids_special"]), items))
    bad = []
    for it, (pieces, err) in zip(items, res):
        text = b"".join(pieces) if pieces is not None else None
        # the listing prints each piece with printf's %.*s, which stops at a
        # NUL byte: the piece of <0x00> shows as nothing
        if text != bytes.fromhex(it["detok_hex"]).replace(b"\0", b""):
            bad.append((it, text, err))
    print(f"{name} detokenized [special rendered]: {len(items) - len(bad)}/{len(items)} identical to llama.cpp's")
    for it, text, err in bad[:6]:
        print(f"  {it['label']} ref {bytes.fromhex(it['detok_hex'])[:60]!r} got {text[:60] if text else text!r} {err or ''}")
    check(not bad, f"{name} detokenization: {len(bad)} of {len(items)} strings differ")


def main():
    if not check(os.path.isfile(FIXTURE), f"fixture {FIXTURE} missing"):
        return
    if not check(os.path.isfile(TL_BIN) and os.access(TL_BIN, os.X_OK), f"TL_BIN {TL_BIN} is not an executable"):
        return
    with open(FIXTURE, encoding="utf-8") as f:
        fx = json.load(f)
    items = fx["items"]
    check(len(items) >= 200, f"the fixture holds {len(items)} strings, expected at least 200")
    # the vocabulary as written (model "gemma4"), then each variant llama.cpp
    # tokenizes the same way ("gpt2" with pre "granite-embed-multi-311m")
    vocabs = [fx["vocab"]] + [{**fx["vocab"], **v} for v in fx["variants"]]
    check(len(vocabs) >= 2, "the fixture has no variant")
    with tempfile.TemporaryDirectory() as tmp:
        for i, v in enumerate(vocabs):
            name = v["model"] + (f"/{v['pre']}" if "pre" in v else "")
            blob = gguf_bytes(vocab_kvs(v))
            sha = hashlib.sha256(blob).hexdigest()
            if not check(sha == v["gguf_sha256"],
                         f"{name}: the rebuilt GGUF differs from the one llama.cpp read "
                         f"(sha256 {sha} vs {v['gguf_sha256']})"):
                continue
            model = os.path.join(tmp, f"vocab{i}.gguf")
            with open(model, "wb") as f:
                f.write(blob)
            check_file(model, name, items)


if __name__ == "__main__":
    main()
    finish()
