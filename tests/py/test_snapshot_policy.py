"""Where a model whose sequences carry a state (Gated DeltaNet layers, or
sliding-window layers in rings) keeps it, since a cached prompt resumes only
where its state was kept (random qwen35 and gemma4 files with their chat
templates, made by scripts/mkmodel.py):
- two chats with the same system prompt and other user messages: the second
  resumes at the end of the system prompt (the server cuts a prompt chunk
  there), i.e. cached_tokens is the count of tokens the two prompts share
  (each from /tokenize) rounded down to a block, past the 256-token chunks'
  boundaries; a third asks the first
  again and resumes at the end of its prompt;
- the replies are a cold server's (--cache-dir-free, one request each);
- a long prompt leaves a few snapshots, not one per chunk (before: one per
  256 tokens, each pushing another conversation's out of the store).
Run: TL_BIN=build/tokenloop python3 tests/py/test_snapshot_policy.py"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
import tlserver  # noqa: E402
from tlcheck import check  # noqa: E402

ROOT = tlcheck.ROOT
SYSTEM = " ".join(f"Rule {i}: always answer about lantern number {5 * i + 3} with care." for i in range(37))
USERS = ["Tell me about the tower.", "What is rule 7?"]


def chat(srv, user, n=8):
    body = tlserver.post_json(srv.port, "/v1/chat/completions",
                              {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
                               "max_tokens": n, "temperature": 0})
    u = body["usage"]
    return body["choices"][0]["message"], (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)


def shared_tokens(srv):
    """The prompt tokens the two chats share (each rendered and tokenized by /tokenize)."""
    ids = [tlserver.post_json(srv.port, "/tokenize", {"messages": [{"role": "system", "content": SYSTEM},
                                                                  {"role": "user", "content": u}]})["tokens"]
           for u in USERS]
    n = 0
    while n < min(map(len, ids)) and ids[0][n] == ids[1][n]:
        n += 1
    return n


def run(path, what):
    srv = tlserver.Server(path, ["-np", "2", "-t", "2", "-c", "4096"])
    cold = tlserver.Server(path, ["-np", "1", "-t", "2", "-c", "4096"])
    try:
        if not check(srv.wait_ready() and cold.wait_ready(), f"{what}: servers ready"):
            return
        n_sys = shared_tokens(srv)
        check(n_sys > 512 + 16, f"{what}: the chats share {n_sys} tokens, past two chunks of 256")
        a, ca = chat(srv, USERS[0])
        b, cb = chat(srv, USERS[1])
        want = {(n_sys - 1) // 16 * 16, n_sys // 16 * 16}
        check(ca == 0 and cb in want,
              f"{what}: the second chat resumes at the system prompt's end ({cb}; its {n_sys} tokens give {want})")
        a2, ca2 = chat(srv, USERS[0])
        check(ca2 > cb and ca2 % 16 == 0, f"{what}: the first chat again resumes at its prompt's end ({ca2})")
        for user, got in ((USERS[0], a), (USERS[1], b), (USERS[0], a2)):
            ref, _ = chat(cold, user)
            cold.stop()  # a fresh one per request: nothing cached
            cold = tlserver.Server(path, ["-np", "1", "-t", "2", "-c", "4096"])
            check(cold.wait_ready() and got == ref, f"{what}: {user!r} as a cold server answers it: {got} vs {ref}")
        # a long prompt (~12 chunks of 256) leaves a few snapshots, not one per chunk
        before = tlserver.metric(srv.port, "tokenloop_state_snapshots") or 0
        long = " ".join(f"Step {i}: the lantern lit {5 * i + 3} rooms." for i in range(200))
        tlserver.post_json(srv.port, "/v1/completions", {"prompt": long, "max_tokens": 2, "temperature": 0})
        after = tlserver.metric(srv.port, "tokenloop_state_snapshots")
        check(after is not None and after - before <= 3,
              f"{what}: a 3000-token prompt added {after - before if after is not None else None} snapshots")
    finally:
        srv.stop()
        cold.stop()


def main():
    with tempfile.TemporaryDirectory() as d:
        for arch, tmpl in (("qwen35", "qwen3.5.jinja"), ("gemma4", "gemma4.jinja")):
            path = os.path.join(d, f"{arch}.gguf")
            template = os.path.join(ROOT, "tests", "templates", tmpl)
            p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "mkmodel.py"), arch, path, "--seed", "9",
                                "--template", template], capture_output=True, text=True, timeout=600)
            if check(p.returncode == 0, f"mkmodel.py {arch}: {p.stderr[-300:]}"):
                run(path, arch)
    return tlcheck.finish()


if __name__ == "__main__":
    sys.exit(main())
