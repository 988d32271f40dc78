"""chat --session FILE (issue 30): a conversation kept in FILE (messages) and
FILE.kv (tl_ctx_save of its KV cache) after every turn, and resumed by the
next process without computing it again: the second turn's process
evaluates only the new message (its stats line), and its answer is the one
an uninterrupted conversation gives, token for token (temperature 0). A
damaged FILE.kv fails its checksum and one of another KV type is refused
by name; either way the conversation is computed again, to the same answer.
A reply cut inside a character is stored (its bad bytes as U+FFFD) and
resumed. Run: TL_BIN=build/tokenloop python3 tests/py/test_session.py"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import check  # noqa: E402
from tlserver import SLOW, TL_BIN  # noqa: E402

MODEL = os.path.join(tlcheck.ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
TURNS = ["My name is Ada and I keep bees. Remember both.", "What do I keep, and what is my name?"]


def chat(lines, *args):
    """stdout (the answers, each ended by a newline), stderr, exit status of one chat process."""
    p = subprocess.run([TL_BIN, "chat", "-m", MODEL, "-n", "24", "--temp", "0", "-t", "2", *args],
                       input="".join(x + "\n" for x in lines), capture_output=True, text=True, errors="replace",
                       timeout=300 * SLOW)
    return p.stdout, p.stderr, p.returncode


def prompt_tokens(err):
    """The prompt sizes of the stats lines, in order."""
    return [int(x) for x in re.findall(r"\[prompt (\d+) tokens", err)]


def main():
    tmp = tempfile.mkdtemp(prefix="tl-session-")
    try:
        ref, err, rc = chat(TURNS)
        if not check(rc == 0 and len(prompt_tokens(err)) == 2 and ref.strip(),
                     f"an uninterrupted two-turn chat ({rc}: {err[-300:]})"):
            tlcheck.finish()
        whole = prompt_tokens(err)
        f = os.path.join(tmp, "s.json")
        a1, err, rc = chat(TURNS[:1], "--session", f)
        check(rc == 0 and a1 and ref.startswith(a1), f"first turn with --session: {a1!r} vs {ref!r}")
        check(os.path.exists(f) and os.path.exists(f + ".kv"), "the session's files are written")
        a2, err, rc = chat(TURNS[1:], "--session", f)
        check(rc == 0 and "resumed" in err, f"the second process resumes the session: {err[-300:]}")
        check(a1 + a2 == ref, f"the resumed turn gives the uninterrupted conversation's answer: {a2!r} vs "
                              f"{ref[len(a1):]!r}")
        got = prompt_tokens(err)
        check(len(got) == 1 and len(whole) == 2 and got[0] <= whole[1] + 2,
              f"only the new message is evaluated after resuming ({got} vs the uninterrupted {whole})")
        for what, damage, needle in (("damaged", "flip", "checksum"), ("of another KV type", "q8_0", "another")):
            g = os.path.join(tmp, f"{damage}.json")
            chat(TURNS[:1], "--session", g, *(("--kv-type", "q8_0") if damage == "q8_0" else ()))
            if damage == "flip":
                with open(g + ".kv", "r+b") as fh:
                    fh.seek(os.path.getsize(g + ".kv") - 100)
                    b = fh.read(1)
                    fh.seek(os.path.getsize(g + ".kv") - 100)
                    fh.write(bytes([b[0] ^ 1]))
            a, err, rc = chat(TURNS[1:], "--session", g)
            check(rc == 0 and needle in err and "computed again" in err, f"a KV file {what} is refused by name: "
                                                                           f"{err[-300:]}")
            if damage == "flip":
                check(a1 + a == ref, f"and the conversation computed again gives the same answer: {a!r}")
            else:
                check(a.strip() != "", f"and the conversation goes on: {a!r}")
        # a reply cut inside a character (one token of a 4-byte emoji, which
        # SmolLM2 spells in several) is not JSON's UTF-8: the session keeps it
        # (the bad bytes as U+FFFD) and the next process resumes it
        bee = os.path.join(tmp, "bee.gbnf")
        with open(bee, "w", encoding="utf-8") as f:
            f.write('root ::= "\U0001F41D"+\n')
        cut = os.path.join(tmp, "cut.json")
        out, err, rc = chat(["Say bees."], "-n", "1", "--grammar", bee, "--session", cut)
        check(rc == 0 and os.path.exists(cut) and os.path.exists(cut + ".kv"),
              f"a reply cut inside a character is kept: rc {rc} {err.strip()[-200:]}")
        out, err, rc = chat(["Again."], "-n", "4", "--session", cut)
        check(rc == 0 and "resumed" in err and "2 messages" in err,
              f"and resumed by the next process: rc {rc} {err.strip()[-300:]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    tlcheck.finish()


if __name__ == "__main__":
    main()
