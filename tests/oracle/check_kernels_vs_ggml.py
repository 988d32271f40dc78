#!/usr/bin/env python3
"""Bitwise check of our CPU kernels against the ggml library that llama.cpp's
CPU backend runs (the libggml-cpu.so inside an installed llama-cpp-python).
Run by hand where llama-cpp-python is installed (tests/oracle/make_fixtures.sh
installs it); not part of CI. Usage:
    make && python3 tests/oracle/check_kernels_vs_ggml.py [BUILD_DIR]
It links our objects into a temporary shared library, then for each weight
type feeds the same random blocks (with outliers) to ggml's vec_dot and to our
kernels at every CPU level this machine has, and counts results that differ
in any bit."""
import ctypes, glob, os, subprocess, sys, tempfile
import numpy as np
import llama_cpp

build = sys.argv[1] if len(sys.argv) > 1 else "build"
root = os.path.dirname(os.path.abspath(__file__)) + "/../.."
objs = sorted(glob.glob(f"{root}/{build}/src/*.o") + glob.glob(f"{root}/{build}/src/cpu/*.o"))
so = os.path.join(tempfile.mkdtemp(), "libtl.so")
subprocess.run(["cc", "-shared", "-o", so] + objs + ["-lpcre2-8", "-lm", "-lpthread"], check=True)
tl = ctypes.CDLL(so)
gdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
ctypes.CDLL(os.path.join(gdir, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
gg = ctypes.CDLL(os.path.join(gdir, "libggml-cpu.so"))
gg.ggml_cpu_init()  # fills the fp16 tables the kernels read

NT = 40
DOT = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
QF = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
class Kernels(ctypes.Structure):
    _fields_ = [("level", ctypes.c_int), ("name", ctypes.c_char_p),
                ("vec_dot", ctypes.c_void_p * NT), ("vec_dot4", ctypes.c_void_p * NT),
                ("quantize", ctypes.c_void_p * NT),
                ("dot_f16", ctypes.c_void_p)]
tl.tl_cpu_detect.restype = ctypes.c_int
tl.tl_quantize_row.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
tl.tl_quantize_row_act.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
tl.tl_row_size.restype = ctypes.c_size_t
tl.tl_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]

# weight type -> (ggml vec_dot symbol, activation type)
TYPES = {2: ("q4_0_q8_0", 8), 3: ("q4_1_q8_1", 9), 6: ("q5_0_q8_0", 8), 7: ("q5_1_q8_1", 9),
         8: ("q8_0_q8_0", 8), 12: ("q4_K_q8_K", 15), 13: ("q5_K_q8_K", 15), 14: ("q6_K_q8_K", 15)}
# Q4_K is expected to differ: llama.cpp repacks Q4_K weights on AVX2 and never
# calls this vec_dot for them; ours follows the repacked one-row (gemv) order.
NAMES = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K"}
rng = np.random.default_rng(1)
levels = range(tl.tl_cpu_detect() + 1)
kern = []
for lv in levels:
    k = Kernels(); tl.tl_kernels_init(ctypes.byref(k), lv); kern.append(k)

bad_total = 0
for wt, (sym, at) in TYPES.items():
    fn = getattr(gg, "ggml_vec_dot_" + sym)
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                   ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    counts = [0] * len(kern)
    trials = 0
    for n in (256, 512, 576, 640, 1024, 1536, 2048):
        if wt >= 12 and n % 256: continue
        for _ in range(40):
            w = rng.standard_normal(n).astype(np.float32)
            x = (rng.standard_normal(n) * rng.choice([1, 1, 1, 50], n)).astype(np.float32)
            wb = ctypes.create_string_buffer(tl.tl_row_size(wt, n))
            xb = ctypes.create_string_buffer(tl.tl_row_size(at, n))
            tl.tl_quantize_row(wt, w.ctypes.data, wb, n)
            tl.tl_quantize_row_act(at, x.ctypes.data, xb, n)
            ref = ctypes.c_float()
            fn(n, ctypes.byref(ref), 0, wb, 0, xb, 0, 1)
            trials += 1
            for i, k in enumerate(kern):
                ours = DOT(k.vec_dot[wt])(n, ctypes.cast(wb, ctypes.c_void_p), ctypes.cast(xb, ctypes.c_void_p))
                if np.float32(ours).tobytes() != np.float32(ref.value).tobytes():
                    counts[i] += 1
    print(f"{NAMES[wt]:5s} differs from ggml in " +
          ", ".join(f"{kern[i].name.decode()}: {c}/{trials}" for i, c in enumerate(counts)))
    bad_total += sum(counts)
print("bitwise identical to ggml" if bad_total == 0 else f"{bad_total} results differ")
