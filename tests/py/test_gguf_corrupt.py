"""test_gguf_corrupt: `tokenloop info` on ~300 seeded corruptions of SmolLM2's
GGUF file (truncations, byte flips, absurd counts, lengths, types, shapes and
offsets). Every run must end with exit status 0 or 1 (never a signal), within a
timeout, and a failure must print an error message on stderr.

Full-size cases patch a single 98 MB copy in place and restore it afterwards,
so the whole test writes the big file once. Run: TL_BIN=build/tokenloop python3 tests/py/test_gguf_corrupt.py
"""
import os
import random
import struct
import subprocess
import sys
import tempfile

MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
TIMEOUT_S = 10
SEED = 20240531

from tlcheck import check, finish, summary  # noqa: F401  (shared pass/fail counting)
import tlcheck


class Layout:
    """Byte positions of the header fields worth corrupting."""

    def __init__(self):
        self.counts = []      # (pos, size): n_tensors, n_kv, array counts
        self.lengths = []     # positions of u64 string lengths (keys, values, some array items)
        self.types = []       # positions of u32 value / element types
        self.t_ndims = []
        self.t_ne = []        # positions of u64 dimensions
        self.t_type = []
        self.t_offset = []
        self.header_end = 0
        self.data_offset = 0


def scan(data):
    """A minimal GGUF walk recording field positions (the file is known valid)."""
    L = Layout()
    pos = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", data, pos)
    L.counts += [(pos, 8), (pos + 8, 8)]
    pos += 16
    fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    alignment = 32

    def read_str(p, record):
        (n,) = struct.unpack_from("<Q", data, p)
        if record:
            L.lengths.append(p)
        return p + 8 + n, bytes(data[p + 8:p + 8 + n])

    for _ in range(n_kv):
        pos, key = read_str(pos, True)
        (t,) = struct.unpack_from("<I", data, pos)
        L.types.append(pos)
        pos += 4
        if t == 9:
            (et, n) = struct.unpack_from("<IQ", data, pos)
            L.types.append(pos)
            L.counts.append((pos + 4, 8))
            pos += 12
            if et == 8:
                for i in range(n):
                    pos, _ = read_str(pos, i % 4096 == 7)
            else:
                pos += n * fixed[et]
        elif t == 8:
            pos, _ = read_str(pos, True)
        else:
            if key == b"general.alignment":
                (alignment,) = struct.unpack_from("<I", data, pos)
            pos += fixed[t]
    for _ in range(n_tensors):
        pos, _ = read_str(pos, True)
        (nd,) = struct.unpack_from("<I", data, pos)
        L.t_ndims.append(pos)
        pos += 4
        for d in range(nd):
            L.t_ne.append(pos + 8 * d)
        pos += 8 * nd
        L.t_type.append(pos)
        L.t_offset.append(pos + 4)
        pos += 12
    L.header_end = pos
    L.data_offset = (pos + alignment - 1) // alignment * alignment
    return L


def run_info(path, what):
    tl_bin = os.environ["TL_BIN"]
    try:
        p = subprocess.run([tl_bin, "info", "-m", path], capture_output=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        check(False, f"{what}: timed out after {TIMEOUT_S} s")
        return None
    err = p.stderr.decode("utf-8", "replace")
    ok = p.returncode in (0, 1)
    if p.returncode == 1:
        ok = ok and "error" in err
    elif p.returncode == 0:
        ok = ok and len(p.stdout) > 0
    check(ok, f"{what}: exit {p.returncode}, stderr {err[-300:]!r}")
    return p.returncode


ABSURD64 = [0xFFFFFFFFFFFFFFFF, 1 << 63, (1 << 63) - 1, 1 << 62, 1 << 60, 1 << 32, 1 << 31,
            (1 << 31) - 1, 0xFFFFFFFF, 0, 1]
ABSURD32 = [0xFFFFFFFF, 1 << 31, (1 << 31) - 1, 0, 1, 4, 5, 9, 13, 39, 40, 255, 1 << 16]


def main():
    if "TL_BIN" not in os.environ or not os.access(os.environ["TL_BIN"], os.X_OK):
        print("TL_BIN must point to the tokenloop binary", file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    if not os.path.exists(MODEL):
        print(f"missing {MODEL} (run `make models`)", file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    with open(MODEL, "rb") as f:
        orig = f.read()
    L = scan(orig)
    rng = random.Random(SEED)
    tmpdir = tempfile.mkdtemp(prefix="tl_gguf_corrupt_")
    small = os.path.join(tmpdir, "small.gguf")
    big = os.path.join(tmpdir, "big.gguf")
    try:
        check(run_info(MODEL, "the unmodified file") == 0, "the unmodified file describes")

        # 1. truncations: mostly inside the metadata and tensor table, a few in the data
        cuts = [0, 1, 3, 4, 8, 23, 24, L.header_end - 1, L.header_end, L.data_offset]
        cuts += [rng.randrange(0, L.header_end) for _ in range(60)]
        cuts += [rng.randrange(L.t_ndims[0] - 80, L.header_end) for _ in range(20)]
        for c in cuts:
            with open(small, "wb") as f:
                f.write(orig[:c])
            rc = run_info(small, f"truncated at {c}")
            check(rc == 1, f"truncated at {c} must fail (exit {rc})")
        # in the tensor data: written once at full size minus a little, then shortened
        with open(big, "wb") as f:
            f.write(orig)
        for c in [len(orig) - 1, len(orig) - 4096, L.data_offset + 12345, L.data_offset + 1]:
            os.truncate(big, c)
            rc = run_info(big, f"truncated in the data at {c}")
            check(rc == 1, f"truncated in the data at {c} must fail (exit {rc})")
        with open(big, "wb") as f:
            f.write(orig)

        # 2. in-place patches of the full-size copy, each restored after its run
        fd = os.open(big, os.O_RDWR)

        def patched(pos, raw, what):
            old = orig[pos:pos + len(raw)]
            os.pwrite(fd, raw, pos)
            rc = run_info(big, what)
            os.pwrite(fd, old, pos)
            return rc

        def pick(lst, k):
            return [rng.choice(lst) for _ in range(k)]

        for pos, size in L.counts[:2] + pick(L.counts[2:], 14):
            for v in rng.sample(ABSURD64, 3):
                rc = patched(pos, struct.pack("<Q", v), f"count at {pos} = {v:#x}")
        for pos in pick(L.lengths, 30):
            v = rng.choice(ABSURD64 + [len(orig), len(orig) - pos - 8])
            patched(pos, struct.pack("<Q", v & (2**64 - 1)), f"length at {pos} = {v:#x}")
        for pos in pick(L.types, 20):
            v = rng.choice(ABSURD32)
            patched(pos, struct.pack("<I", v), f"value type at {pos} = {v:#x}")
        for pos in pick(L.t_ndims, 12):
            v = rng.choice([0, 3, 4, 5, 0xFFFFFFFF])
            patched(pos, struct.pack("<I", v), f"n_dims at {pos} = {v}")
        for pos in pick(L.t_ne, 20):
            v = rng.choice(ABSURD64 + [33, 2**64 - 32])
            patched(pos, struct.pack("<Q", v), f"ne at {pos} = {v:#x}")
        for pos in pick(L.t_type, 15):
            v = rng.choice(ABSURD32 + [2, 8, 12, 14, 30])
            patched(pos, struct.pack("<I", v), f"tensor type at {pos} = {v}")
        for pos in pick(L.t_offset, 25):
            (cur,) = struct.unpack_from("<Q", orig, pos)
            v = rng.choice(ABSURD64 + [cur + 1, cur + 32, cur - 32, len(orig), len(orig) - L.data_offset])
            rc = patched(pos, struct.pack("<Q", v & (2**64 - 1)), f"tensor offset at {pos} = {v:#x}")
            if v != cur:
                check(rc == 1, f"tensor offset {cur} -> {v:#x} at {pos} must fail (exit {rc})")
        # random byte flips in the header region (may or may not leave a valid file)
        for i in range(50):
            n = rng.choice([1, 1, 2, 4, 8])
            pos = rng.randrange(0, L.header_end - n)
            raw = bytes(rng.randrange(256) for _ in range(n))
            patched(pos, raw, f"bytes {raw.hex()} at {pos}")
        os.close(fd)
    finally:
        for p in (small, big):
            if os.path.exists(p):
                os.unlink(p)
        os.rmdir(tmpdir)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
