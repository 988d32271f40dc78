"""Replicas behind HAProxy (deploy/cluster.sh, deploy/haproxy/haproxy.cfg) on
loopback, with SmolLM2:
(a) multi-turn sessions, each with its own document, sent without a key
    (least-connections) and then keyed (prompt_cache_key in the body, or the
    X-Session-ID header): the keyed run prefills fewer uncached prompt tokens
    (by 15% at least; 5% under ASan; measured 30-50% and about 20%), and
    every turn of each keyed session is answered by one replica (HAProxy's
    X-Served-By); tokens and time to first token printed for both;
(b) a replica drained (SIGTERM) in the middle of a load: no request fails,
    and its keys move to the others;
(c) a replica killed (SIGKILL) in the middle of a load: every request ends,
    those it did not hold succeed, new ones go to the others, and restarted
    (cluster.sh restart) it serves again;
(d) the same reply at temperature 0 whichever replica answers;
(e) 4,000 connections from 127.0.0.2 to the proxy that send part of a
    request and stop: the proxy holds 512 of them, /health through it from
    127.0.0.1 answers within a second and a completion succeeds;
and the agent-check line of a replica.
First, cluster.sh itself: a replica that cannot start (a missing model)
fails `up` at once, naming the replica and its log, and leaves nothing
running; one that stays loading fails it after --ready-timeout; serve flags
after `--` add to the computed `-t`, and a -t/--threads of theirs replaces it.
HAProxy comes from Debian's package (scripts/setup.sh installs it).
Run: python3 tests/py/test_cluster.py (`... test_cluster.py script`: only cluster.sh's own checks)"""
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, TL_BIN, flood, raise_fd_limit  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
CLUSTER = os.path.join(ROOT, "deploy", "cluster.sh")
ASAN = os.environ.get("TL_ASAN") == "1"
SESSIONS, TURNS = (4, 6) if ASAN else (6, 6)
WORDS = ("river mountain lantern copper meadow harbor violet engine saddle orchard thunder pebble "
         "whisper canyon marble falcon ember glacier quill tundra beacon walnut").split()


def free_port_block(n):
    """A port p with p..p+n and p+100..p+100+n free."""
    for base in range(20000, 60000, 997):
        ok = True
        for p in list(range(base, base + n + 1)) + list(range(base + 100, base + 101 + n)):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


def document(seed, n=220):
    words = [WORDS[(seed * 7 + i * i * 3 + i) % len(WORDS)] for i in range(n)]
    return f"Document {seed}: " + " ".join(words) + "."


def chat(url, messages, key=None, header=False, max_tokens=8):
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"}
    if key and header:
        headers["X-Session-ID"] = key
    elif key:
        body["prompt_cache_key"] = key
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), headers=headers)
    t0 = time.time()
    ttft, text, usage = None, "", None
    with urllib.request.urlopen(req, timeout=300 * SLOW) as r:
        served_by = r.headers.get("X-Served-By")  # set by haproxy.cfg's backends
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices", []):
                piece = ch.get("delta", {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.time() - t0
                text += piece
    return text, usage, ttft if ttft is not None else time.time() - t0, served_by


def sessions(url, keyed, first_seed):
    """SESSIONS conversations of TURNS turns at once; their totals."""
    stats = {"prompt": 0, "cached": 0, "ttft": [], "errors": [], "served": {}}
    mu = threading.Lock()

    def one(si):
        msgs = [{"role": "system", "content": document(first_seed + si)}]
        key = f"session-{first_seed + si}" if keyed else None
        rnd = random.Random(si)
        for turn in range(TURNS):
            time.sleep(rnd.random() * 0.05)  # conversations out of step, as users are
            msgs.append({"role": "user", "content": f"Question {turn}: which word comes after '{WORDS[turn]}'?"})
            try:
                text, usage, ttft, by = chat(url, msgs, key, header=si % 2 == 1)
            except Exception as e:  # noqa: BLE001 (counted as a failure)
                with mu:
                    stats["errors"].append(str(e))
                return
            msgs.append({"role": "assistant", "content": text})
            with mu:
                stats["prompt"] += usage["prompt_tokens"]
                stats["cached"] += usage["prompt_tokens_details"]["cached_tokens"]
                stats["ttft"].append(ttft)
                stats["served"].setdefault(si, []).append(by)
    ths = [threading.Thread(target=one, args=(i,)) for i in range(SESSIONS)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return stats


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def pid_alive(path):
    try:
        with open(path) as f:
            pid = int(f.read())
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, ValueError):
        return False


def cluster_env():
    env = dict(os.environ)
    if TL_BIN != os.path.join(ROOT, "tokenloop"):
        env["TOKENLOOP_BIN"] = TL_BIN
    return env


def up_fails(what, args, env, limit, want):
    """`cluster.sh up ARGS` must fail within limit seconds, saying each of want,
    and leave no replica or proxy running."""
    tmp = tempfile.mkdtemp(prefix="tl-cluster-")
    port = free_port_block(2)
    cmd = [CLUSTER, "up", "--replicas", "2", "--port", str(port), "--dir", tmp, *args]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, err = "hung", (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    try:
        check(rc not in (0, "hung"), f"{what}: `up` fails within {limit} s (rc {rc})")
        for w in want:
            check(w.replace("DIR", tmp) in err, f"{what}: `up` says {w!r}: {err[-600:]}")
        left = [f"replica {i}" for i in (1, 2) if listening(port + i)] + \
               (["haproxy"] if pid_alive(os.path.join(tmp, "haproxy.pid")) or listening(port) else [])
        check(not left, f"{what}: nothing left running after the failed `up`: {left}")
    finally:
        subprocess.run([CLUSTER, "down", "--dir", tmp], capture_output=True, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


def replica_argv(tmp, i):
    with open(os.path.join(tmp, f"replica{i}.pid")) as f:
        pid = int(f.read())
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [a.decode() for a in f.read().split(b"\0") if a]


def test_script():
    """cluster.sh's start: failures end it, serve flags add to -t."""
    env = cluster_env()
    # a replica that cannot start: the model is missing, it exits at once, and
    # `up` says so without waiting for the (default) timeout
    up_fails("a missing model", ["-m", "/nonexistent/model.gguf"], env, 60 * SLOW,
             ["replica 1", "exited before it was ready", "DIR/replica1.log", "cannot"])
    # a replica that stays loading (the test-only load gate, never opened) until the timeout
    with tempfile.TemporaryDirectory() as gdir:
        genv = dict(env, TL_TEST_LOAD_GATE=os.path.join(gdir, "never"))
        up_fails("a replica still loading", ["-m", MODEL, "--ready-timeout", "3"], genv, 60 * SLOW,
                 ["replica 1", "not ready after 3 s", "still loading the model", "DIR/replica1.log"])
    # serve flags add to the computed -t; their own -t replaces it
    nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)  # what cluster.sh divides
    threads = str(max(1, nproc // 2))
    for extra, want, unwanted in ((["-np", "1", "-c", "512"], ["-t", threads, "-np", "1", "-c", "512"], None),
                                  (["-np", "1", "--threads=2"], ["-np", "1", "--threads=2"], "-t")):
        tmp = tempfile.mkdtemp(prefix="tl-cluster-")
        port = free_port_block(2)
        try:
            p = subprocess.run([CLUSTER, "up", "--replicas", "2", "--port", str(port), "-m", MODEL, "--dir", tmp,
                                "--", *extra], capture_output=True, text=True, timeout=300 * SLOW, env=env)
            if check(p.returncode == 0, f"up -- {' '.join(extra)}: {p.stderr[-500:]}"):
                for i in (1, 2):
                    argv = replica_argv(tmp, i)
                    tail = argv[argv.index("serve") + 1:]
                    flags = [a for j, a in enumerate(tail) if not (j > 0 and tail[j - 1] in ("-m", "--port",
                                                                                               "--agent-port"))
                             and a not in ("-m", "--port", "--agent-port")]
                    check(flags == want and (unwanted is None or unwanted not in tail),
                          f"up -- {' '.join(extra)}: replica {i} runs with {flags}, want {want}")
        finally:
            subprocess.run([CLUSTER, "down", "--dir", tmp], capture_output=True, timeout=120)
            shutil.rmtree(tmp, ignore_errors=True)


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    if not check(shutil.which("haproxy") is not None, "haproxy installed (scripts/setup.sh installs it)"):
        tlcheck.finish()
    test_script()
    if sys.argv[1:] == ["script"]:
        tlcheck.finish()
    n_flood = min(4000, raise_fd_limit(3 * 4000) // 3)  # HAProxy needs two per connection
    tmp = tempfile.mkdtemp(prefix="tl-cluster-")
    port = free_port_block(3)
    env = cluster_env()
    flags = ["--", "-t", "1", "-np", "2", "-c", "1024"]
    up = subprocess.run([CLUSTER, "up", "--replicas", "3", "--port", str(port), "-m", MODEL, "--dir", tmp, *flags],
                        capture_output=True, text=True, timeout=300 * SLOW, env=env)
    try:
        if not check(up.returncode == 0, f"cluster up: {up.stdout[-300:]} {up.stderr[-500:]}"):
            tlcheck.finish()
        url = f"http://127.0.0.1:{port}"
        st = subprocess.run([CLUSTER, "status", "--dir", tmp], capture_output=True, text=True, timeout=60)
        check(st.returncode == 0 and st.stdout.count(", ready") == 3 and "up ready" in st.stdout,
              f"cluster status: {st.stdout}")
        # (d) the same reply from every replica at temperature 0
        msgs = [{"role": "user", "content": "Name three colours."}]
        replies = [chat(f"http://127.0.0.1:{port + i}", msgs, max_tokens=12)[0] for i in (1, 2, 3)]
        check(len(set(replies)) == 1 and replies[0], f"the same reply from each replica: {replies}")
        # (e) a flood of unfinished requests from one address
        socks, closed, refused = flood(port, n_flood)
        try:
            held = len(socks) - closed
            t1 = time.time()
            try:
                code = urllib.request.urlopen(url + "/health", timeout=5).status
            except OSError as e:
                code = str(e)
            dt = time.time() - t1
            check(code == 200 and dt < 1.0 * SLOW, f"/health through the proxy while {n_flood} connections hang: "
                                                   f"{code} in {dt * 1e3:.0f} ms")
            try:
                got = chat(url, [{"role": "user", "content": "Hi"}], max_tokens=3)[1]
            except OSError as e:
                got = {"error": str(e)}
            check(got and got.get("completion_tokens") == 3, f"a completion through the proxy meanwhile: {got}")
            print(f"{n_flood} connections to the proxy from 127.0.0.2: {held} held, {closed} closed, {refused} refused")
            check(held <= 512, f"the proxy holds at most 512 of one address's connections: {held}")
        finally:
            for s in socks:
                s.close()
        # (a) unkeyed, then keyed (other documents, so no cache carries over)
        un = sessions(url, False, 100)
        ke = sessions(url, True, 200)
        unc_u, unc_k = un["prompt"] - un["cached"], ke["prompt"] - ke["cached"]
        med_u, med_k = statistics.median(un["ttft"] or [0]), statistics.median(ke["ttft"] or [0])
        print(f"| routing | prompt tokens | uncached | median TTFT ms |\n|---|---|---|---|\n"
              f"| unkeyed (least connections) | {un['prompt']} | {unc_u} | {med_u * 1e3:.0f} |\n"
              f"| keyed | {ke['prompt']} | {unc_k} | {med_k * 1e3:.0f} |")
        check(not un["errors"] and not ke["errors"], f"no request failed: {un['errors'][:2]} {ke['errors'][:2]}")
        # stickiness itself: under this moderate load (6 sessions, 6 sequences in all, no queue
        # full) every turn of a keyed session lands on one replica. hash-balance-factor 150 moved
        # 5-6 of 12 sessions in bench/cluster, since its bound follows the requests in flight.
        homes = {si: sorted(set(b)) for si, b in ke["served"].items()}
        check(len(homes) == SESSIONS and all(len(h) == 1 and h[0] for h in homes.values()),
              f"every keyed session stays on one replica: {homes}")
        check(len({h[0] for h in homes.values() if h}) > 1, f"the keyed sessions spread over replicas: {homes}")
        print(f"unkeyed sessions' replicas: {[sorted(set(b)) for b in un['served'].values()]}")
        # (the target, at most half on 24 sessions of 6 turns, is bench/cluster's to show; here
        # the sessions run in step, which lets least-connections keep many of them in place by chance)
        # (under ASan every request takes longer, more of them overlap, and the bounded-load hash
        # moves more keys: a looser bound there)
        bound = 0.95 if ASAN else 0.85
        check(unc_k <= bound * unc_u, f"keyed routing prefills fewer uncached tokens: {unc_k} vs {unc_u} (bound {bound})")
        # (b) drain replica 2 during a load: nothing fails, its keys move
        errs, done = [], []

        def load(i):
            try:
                text, usage, _, _ = chat(url, [{"role": "user", "content": document(300 + i, 60)}],
                                      key=f"drain-{i}", max_tokens=24)
                done.append(usage["completion_tokens"])
            except Exception as e:  # noqa: BLE001
                errs.append(str(e))
        ths = [threading.Thread(target=load, args=(i,)) for i in range(12)]
        for t in ths:
            t.start()
        time.sleep(0.5)
        with open(os.path.join(tmp, "replica2.pid")) as f:
            os.kill(int(f.read()), signal.SIGTERM)
        for t in ths:
            t.join()
        check(not errs and len(done) == 12, f"drain under load: {len(done)} done, errors {errs[:3]}")
        after = [chat(url, [{"role": "user", "content": "Hi"}], key=f"drain-{i}", max_tokens=2) for i in range(6)]
        check(all(a[1]["completion_tokens"] > 0 for a in after), "after the drain every key is served elsewhere")
        # (c) kill replica 3 (SIGKILL) during a load: the requests that were not on it
        # succeed, those on it fail with an HTTP error or are retried elsewhere; new
        # requests go to the others; restarted, it takes its keys back
        res = []

        def load2(i):
            try:
                _, usage, _, _ = chat(url, [{"role": "user", "content": document(400 + i, 60)}], key=f"kill-{i}",
                                   max_tokens=24)
                res.append(("ok", usage["completion_tokens"]))
            except urllib.error.HTTPError as e:
                res.append(("http", e.code))
            except Exception as e:  # noqa: BLE001 (a cut stream: not a hang)
                res.append(("cut", str(e)[:80]))
        ths = [threading.Thread(target=load2, args=(i,)) for i in range(12)]
        for t in ths:
            t.start()
        time.sleep(0.5)
        with open(os.path.join(tmp, "replica3.pid")) as f:
            os.kill(int(f.read()), signal.SIGKILL)
        for t in ths:
            t.join()
        n_ok = sum(1 for r in res if r[0] == "ok")
        # replica 2 drained and 3 killed: replica 1 is left; every request ends, and only the ones
        # replica 3 held (two sequences and its queue) may fail
        check(len(res) == 12 and n_ok >= 6 and all(r[0] in ("ok", "http", "cut") for r in res),
              f"a replica killed under load: {n_ok} of 12 succeeded, the rest {[r for r in res if r[0] != 'ok']}")
        after = [chat(url, [{"role": "user", "content": "Hi"}], key=f"kill-{i}", max_tokens=2) for i in range(6)]
        check(all(a[1]["completion_tokens"] > 0 for a in after), "after the kill every key is served elsewhere")
        rs = subprocess.run([CLUSTER, "restart", "3", "--dir", tmp], capture_output=True, text=True,
                            timeout=300 * SLOW, env=env)
        with open(os.path.join(tmp, "replica3.pid")) as f:
            pid3 = int(f.read())
        try:
            with open(f"/proc/{pid3}/cmdline", "rb") as f:
                argv3 = f.read().split(b"\0")
        except OSError:
            argv3 = []
        # (a shell around it would be all that `down` stops: the server would outlive the cluster)
        check(b"serve" in argv3, f"replica3.pid is the restarted server itself: {argv3[:3]}")
        time.sleep(2.5)  # the proxy's checks (inter 1s, rise 2) see it again
        st = subprocess.run([CLUSTER, "status", "--dir", tmp], capture_output=True, text=True, timeout=60)
        served = 0
        for i in range(12):
            chat(url, [{"role": "user", "content": "Hello"}], key=f"back-{i}", max_tokens=1)
        m = urllib.request.urlopen(f"http://127.0.0.1:{port + 3}/metrics", timeout=10).read().decode()
        for ln in m.splitlines():
            if ln.startswith("tokenloop_requests_total") and 'endpoint="/v1/chat/completions"' in ln:
                served += int(float(ln.split()[-1]))
        check(rs.returncode == 0 and "replica 3: port" in st.stdout and served > 0,
              f"replica 3 restarted and served again ({served} requests): {rs.stderr[-200:]} {st.stdout[-300:]}")
        # the agent-check line
        with socket.create_connection(("127.0.0.1", port + 103), timeout=5) as s:
            line = s.recv(64).decode()
        check(line.startswith("up ready ") and line.strip().endswith("%"), f"agent-check: {line!r}")
    finally:
        subprocess.run([CLUSTER, "down", "--dir", tmp], capture_output=True, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)
    for i in (1, 2, 3):
        try:
            socket.create_connection(("127.0.0.1", port + i), timeout=2).close()
            up_after = True
        except OSError:
            up_after = False
        check(not up_after, f"replica {i} stopped by cluster.sh down")
    tlcheck.finish()


if __name__ == "__main__":
    main()
