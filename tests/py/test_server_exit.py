"""A clean exit of `tokenloop serve` under valgrind: on a tiny random model
(scripts/mkmodel.py), one completion, then SIGTERM. The server must exit 0 with
every thread it started joined and nothing definitely or possibly lost (a
thread left running at exit keeps its stack's TLS block: 'possibly lost').
Needs valgrind (scripts/setup.sh installs it; missing is a failure, not a skip).
Under the sanitizers (TL_ASAN=1: valgrind cannot run an ASan binary) the same
exit is checked with LeakSanitizer's report instead: exit 0 and no sanitizer
error; the valgrind check is the plain build's.
Run: TL_BIN=build/tokenloop python3 tests/py/test_server_exit.py"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlserver  # noqa: E402
from tlcheck import ROOT, check, finish  # noqa: E402
from tlserver import TL_BIN  # noqa: E402

MKMODEL = os.path.join(ROOT, "scripts", "mkmodel.py")
LEAK_RC = 99  # valgrind's exit status when it found an error or a leak


def main():
    if not check(os.access(TL_BIN, os.X_OK), f"no binary at {TL_BIN}"):
        finish()
    asan = os.environ.get("TL_ASAN") == "1"
    vg = shutil.which("valgrind")
    if not asan and not check(vg is not None, "valgrind not found (run scripts/setup.sh)"):
        finish()
    if asan:
        print("TL_ASAN=1: the exit checked by LeakSanitizer, not valgrind (the plain build's run uses valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "tiny.gguf")
        mk = subprocess.run([sys.executable, MKMODEL, "qwen2", model], capture_output=True, text=True, timeout=300)
        if not check(mk.returncode == 0, f"mkmodel failed: {mk.stderr[-500:]}"):
            finish()
        vg_args = [vg, "--leak-check=full", "--errors-for-leak-kinds=definite,possible",
                   f"--error-exitcode={LEAK_RC}"]
        srv = tlserver.Server(model, ["-np", "1", "-c", "256", "-t", "1"], prefix=() if asan else vg_args)
        try:
            if check(srv.wait_ready(timeout=300), "the server under valgrind did not become ready"):
                c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
                c.request("POST", "/v1/completions", body=json.dumps({"prompt": "hi", "max_tokens": 4}),
                          headers={"Content-Type": "application/json"})
                r = c.getresponse()
                body = r.read()
                c.close()
                check(r.status == 200 and json.loads(body)["usage"]["completion_tokens"] == 4,
                      f"a completion under valgrind: {r.status} {body[:200]!r}")
                srv.proc.send_signal(signal.SIGTERM)
                try:
                    rc = srv.proc.wait(timeout=300)
                except subprocess.TimeoutExpired:
                    rc = None
                out = ""
                if srv.log is not sys.stderr:
                    srv.log.seek(0)
                    out = srv.log.read().decode(errors="replace")
                lost = [ln for ln in out.splitlines() if "lost in loss record" in ln]
                if not check(rc == 0, f"SIGTERM under valgrind: exit status {rc} (0: clean; {LEAK_RC}: valgrind "
                                      f"found errors or leaks)"):
                    print(out[-4000:])
                if srv.log is not sys.stderr and asan:
                    check("Sanitizer" not in out, f"a sanitizer report at exit: {out[-2000:]}")
                elif srv.log is not sys.stderr:  # TL_SERVER_LOG=1 shows the log instead of keeping it
                    check(not lost and ("All heap blocks were freed" in out or "possibly lost: 0 bytes" in out),
                          f"valgrind: nothing definitely or possibly lost: {lost[:3]}")
        finally:
            srv.stop()
    finish()


if __name__ == "__main__":
    main()
