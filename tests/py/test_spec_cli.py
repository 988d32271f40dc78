"""Speculative decoding from the command line with random-weight model pairs
(scripts/mkmodel.py, one shared vocabulary, different seeds): `tokenloop run
--draft` gives the same token ids with --spec draft and auto as with --spec
off, greedy and seeded; the stats line reports the guesses; a draft with
another vocabulary is refused with a clear error, and --spec draft without
--draft too; a batch (-b) smaller than a token and its guesses cuts the
guesses to fit. Run: TL_BIN=build/tokenloop python3 tests/py/test_spec_cli.py"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402

TL_BIN = os.environ.get("TL_BIN", os.path.join(ROOT, "build", "tokenloop"))
MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")
VOCAB_DIR = os.environ.get("TL_VOCAB_DIR", os.path.join(ROOT, "..", "shared", "vocab"))
SLOW = 4 if os.environ.get("TL_ASAN") == "1" else 1


def mkmodel(arch, path, vocab, seed):
    p = subprocess.run([sys.executable, MKMODEL, arch, path, "--vocab", vocab, "--seed", str(seed)],
                       capture_output=True, text=True, timeout=300)
    return check(p.returncode == 0, f"mkmodel {arch} seed {seed}: {p.stderr[-300:]}")


def run(model, *args):
    p = subprocess.run([TL_BIN, "run", "-m", model, "-p", "one two three one two three one two", "-n", "40",
                        "--ids", "-t", "2", "--ignore-eos", *args], capture_output=True, text=True,
                       timeout=300 * SLOW)
    m = re.search(r"speculative: (\d+) drafted, (\d+) accepted", p.stderr)
    return p.returncode, p.stdout.strip(), (int(m[1]), int(m[2])) if m else None, p.stderr


def main():
    llama = os.path.join(VOCAB_DIR, "ggml-vocab-llama-spm.gguf")
    alien = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")  # another vocabulary
    if not check(os.path.exists(llama) and os.path.exists(alien), f"{llama} and {alien} (make models)"):
        tlcheck.finish()
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = (os.path.join(tmp, n) for n in ("target.gguf", "draft.gguf"))
        if not (mkmodel("llama3", target, llama, 1) and mkmodel("llama3", draft, llama, 2)):
            tlcheck.finish()
        for temp in (("--temp", "0"), ("--temp", "0.8", "--seed", "5")):
            rc, ref, _, err = run(target, "--spec", "off", *temp)
            check(rc == 0 and ref.startswith("["), f"{temp}: --spec off: {err[-300:]}")
            for mode in ("draft", "auto"):
                rc, got, sp, err = run(target, "--spec", mode, "--draft", draft, *temp)
                check(rc == 0 and got == ref, f"{temp}: --spec {mode} --draft: ids differ\n{got}\n{ref}\n{err[-300:]}")
                if mode == "draft":
                    check(sp is not None and sp[0] > 0, f"{temp}: the random draft guessed: {sp}")
            # the target as its own draft: greedy guesses are all kept
            rc, got, sp, err = run(target, "--spec", "draft", "--draft", target, *temp)
            check(rc == 0 and got == ref, f"{temp}: self-draft: ids differ")
            if temp[1] == "0":
                check(sp is not None and sp[1] > 0 and sp[1] >= sp[0] - 16,
                      f"greedy self-draft keeps its guesses: {sp}")
        # a batch smaller than a token and its guesses: the guesses are cut
        # to fit it (n-gram guesses on a counting prompt asked for 4 rows of a
        # 3-token batch: an error)
        count = "one two three four five six seven eight nine ten " * 12
        rc, ref, _, err = run(alien, "--spec", "off", "--temp", "0", "-b", "3", "-p", count)
        rc2, got, sp, err2 = run(alien, "--spec", "ngram", "--temp", "0", "-b", "3", "-p", count)
        check(rc == 0 and rc2 == 0 and got == ref and sp is not None and sp[1] > 0,
              f"-b 3 --spec ngram: the same ids, guesses kept ({sp}): {err2.strip()[-200:]}")
        rc, _, _, err = run(target, "--draft", alien)
        check(rc != 0 and "vocabulary" in err, f"a draft with another vocabulary is refused: {err.strip()[-200:]}")
        rc, _, _, err = run(target, "--spec", "draft")
        check(rc != 0 and "--draft" in err, f"--spec draft without --draft: {err.strip()[-200:]}")
    tlcheck.finish()


if __name__ == "__main__":
    main()
