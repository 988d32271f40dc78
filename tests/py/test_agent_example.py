"""examples/agent.py end to end against `tokenloop serve` on SmolLM2, the
first turn forced to call read_file: the agent runs to the end, and every
turn after the first finds the previous turn's whole prompt in the prefix
cache except its last partial block (the conversation is re-sent each turn,
and the same history renders the same prefix).
Run: TL_BIN=build/tokenloop python3 tests/py/test_agent_example.py"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, Server  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
BLOCK = 16  # TL_KV_BLOCK


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    srv = Server(MODEL, ["-np", "2", "-c", "4096", "-t", "2"])
    try:
        if not check(srv.wait_ready(), "server ready"):
            tlcheck.finish()
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "notes.txt"), "w") as f:
                f.write("The meeting is on Tuesday at 10. Bring 3 copies of the report.\n")
            p = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "agent.py"), "--base-url",
                                srv.url + "/v1", "--folder", d, "--first-tool", "read_file", "--max-turns", "4",
                                "--json", "What does notes.txt say about the meeting?"],
                               capture_output=True, text=True, timeout=300 * SLOW)
        print(p.stdout)
        ok = check(p.returncode == 0, f"agent.py ran: {p.stderr[-500:]}")
        rows = json.loads(p.stdout.strip().splitlines()[-1]) if ok else []
        check(len(rows) >= 2 and rows[0]["tool_calls"] >= 1, f"the forced call, then more turns: {rows}")
        for prev, cur in zip(rows, rows[1:]):
            want = prev["prompt_tokens"] // BLOCK * BLOCK
            check(cur["cached_tokens"] >= want and cur["prompt_tokens"] > prev["prompt_tokens"],
                  f"turn {cur['turn']}: {cur['cached_tokens']} cached of {cur['prompt_tokens']}; the previous "
                  f"prompt had {prev['prompt_tokens']} ({want} in whole blocks)")
    finally:
        srv.stop()
    tlcheck.finish()


if __name__ == "__main__":
    main()
