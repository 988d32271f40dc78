"""`tokenloop info FILE` ends with whether this build runs the file: "runs:
yes" with the weight bytes a token reads (for a mixture of experts, how many
experts it is routed to), or "runs: no:" naming exactly what is missing: the
architecture, a tensor, a tensor's type, or a metadata key. Files come from
scripts/mkmodel.py, and from copies of one with a key left out or a tensor's
type changed (written with the gguf package).
Run: TL_BIN=build/tokenloop python3 tests/py/test_info_runs.py"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import check  # noqa: E402

ROOT = tlcheck.ROOT
TL_BIN = os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop"))
MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")


def mk(arch, path, *extra):
    p = subprocess.run([sys.executable, MKMODEL, arch, path, "--seed", "3", *extra], capture_output=True, text=True,
                       timeout=300)
    check(p.returncode == 0, f"mkmodel.py {arch} {' '.join(extra)}: {p.stderr[-300:]}")


def info(path):
    p = subprocess.run([TL_BIN, "info", path], capture_output=True, text=True, timeout=120)
    last = [l for l in p.stdout.splitlines() if l.startswith("runs:")]
    return p.returncode, last[-1] if last else "", p.stderr


def copy_gguf(src, dst, drop_key=None, retype=None):
    """src rewritten to dst with metadata key drop_key left out, or tensor
    retype=(name, ggml type id, bytes per block, block size) given that type
    (its bytes zeroed, its shape kept)."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name == drop_key:
            continue
        vt = f.types[0]
        w.add_key_value(name, f.contents(), vt, f.types[1] if vt == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        data = np.array(t.data)  # rows first, as numpy; src is F32 throughout
        if retype and t.name == retype[0]:
            tid, bpb, bs = retype[1:]
            w.add_tensor(t.name, np.zeros((data.shape[0], data.shape[1] // bs * bpb), dtype=np.uint8),
                         raw_dtype=gguf.GGMLQuantizationType(tid))
        else:
            w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if not check(os.path.exists(TL_BIN), f"{TL_BIN} exists"):
        tlcheck.finish()
    with tempfile.TemporaryDirectory() as tmp:
        moe = os.path.join(tmp, "moe.gguf")
        mk("qwen3moe", moe, "--type", "q8_0")
        rc, line, err = info(moe)
        check(rc == 0 and line.startswith("runs: yes") and "3 of 8 experts" in line, f"qwen3moe: {line!r} {err}")
        dense = os.path.join(tmp, "dense.gguf")
        mk("qwen3", dense)
        rc, line, err = info(dense)
        check(rc == 0 and line.startswith("runs: yes") and "experts" not in line, f"qwen3: {line!r} {err}")

        bad = os.path.join(tmp, "arch.gguf")
        mk("qwen3", bad, "--arch-name", "mamba9")
        rc, line, _ = info(bad)
        check(rc == 0 and line.startswith("runs: no") and "'mamba9'" in line, f"unknown architecture: {line!r}")

        mk("qwen3", bad, "--drop", "blk.1.attn_k_norm.weight")
        rc, line, _ = info(bad)
        check(line.startswith("runs: no") and "blk.1.attn_k_norm.weight" in line, f"missing tensor: {line!r}")

        mk("qwen3moe", bad, "--drop", "blk.0.ffn_down_exps.weight")
        rc, line, _ = info(bad)
        check(line.startswith("runs: no") and "blk.0.ffn_down_exps.weight" in line, f"missing expert tensor: {line!r}")

        src = os.path.join(tmp, "src.gguf")
        mk("qwen3", src, "--type", "f32")
        copy_gguf(src, bad, drop_key="qwen3.attention.layer_norm_rms_epsilon")
        rc, line, _ = info(bad)
        check(line.startswith("runs: no") and "qwen3.attention.layer_norm_rms_epsilon" in line,
              f"missing key: {line!r}")

        # IQ2_XXS (ggml type 16): 66 bytes per 256 (ffn_down's rows are 256 wide)
        copy_gguf(src, bad, retype=("blk.0.ffn_down.weight", 16, 66, 256))
        rc, line, err = info(bad)
        check(rc == 0 and line.startswith("runs: no") and "blk.0.ffn_down.weight" in line and "IQ2_XXS" in line,
              f"unsupported type: {line!r} {err[-200:]}")

        copy_gguf(src, bad, drop_key="qwen3.expert_used_count")  # a dense file: nothing lacking
        rc, line, _ = info(bad)
        check(line.startswith("runs: yes"), f"copy of a dense file still runs: {line!r}")
    tlcheck.finish()


if __name__ == "__main__":
    main()
