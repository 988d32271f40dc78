"""deploy/k8s/: the manifests validate against the Kubernetes API schemas
(kubernetes-validate --strict, with the schemas it ships); HAProxy accepts
the proxy's configuration from its ConfigMap (haproxy -c); that
configuration keeps every routing, retry and timeout line of
deploy/haproxy/haproxy.cfg, so the two cannot drift apart.

Then the Deployment is run, not read: `tokenloop serve` is started with the
container's exact `args`, changing only what cannot hold outside a pod (said
in the output): --model's /models/model.gguf becomes the SmolLM2 file and the
two ports (8080, 8081) free ones, since other servers may hold them on this
machine. While the model loads (held open by the test-only
TL_TEST_LOAD_GATE) the startup and readiness probes must fail and the
liveness probe must not be reached before the startupProbe passes; once
loaded, every probe must succeed on the port its name stands for, the agent
port must answer HAProxy's agent-check, and HAProxy itself, run with the
ConfigMap's haproxy.cfg (its pod discovery swapped for this one replica),
must health-check the replica up and route keyed and unkeyed requests to it.

deploy/k8s/Dockerfile is built, and run with the same args, when a container
tool with a working engine is there (docker, podman); otherwise the test
prints SKIPPED for that part (TL_K8S_REQUIRE_IMAGE=1 makes it a failure).
Run: TL_BIN=build/tokenloop python3 tests/py/test_k8s.py"""
import glob
import http.client
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, TL_BIN, free_port  # noqa: E402

K8S = os.path.join(ROOT, "deploy", "k8s")
LOCAL_CFG = os.path.join(ROOT, "deploy", "haproxy", "haproxy.cfg")
# what only the Kubernetes configuration has: pods found through DNS
K8S_ONLY = ("resolvers kube", "init-addr none", "agent-port 8081")
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
POD_MODEL = "/models/model.gguf"


def cfg_lines(text):
    """The configuration's directives, comments and blank lines left out, blanks squeezed."""
    out = []
    for ln in text.splitlines():
        ln = ln.split("#", 1)[0].strip() if not ln.strip().startswith("http-request") else ln.strip()
        if ln:
            out.append(" ".join(ln.split()))
    return out


def main():
    files = sorted(glob.glob(os.path.join(K8S, "*.yaml")))
    check(len(files) >= 2, f"manifests in deploy/k8s/: {files}")
    kv = shutil.which("kubernetes-validate")
    if check(kv is not None, "kubernetes-validate installed (scripts/setup.sh installs it)"):
        p = subprocess.run([kv, "--strict", *files], capture_output=True, text=True, timeout=300)
        out = p.stdout + p.stderr
        check(p.returncode == 0 and "passed" in out and "fail" not in out.lower(),
              f"kubernetes-validate --strict: {out[-1500:]}")
    docs = [d for f in files for d in yaml.safe_load_all(open(f)) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for want in (("Deployment", "tokenloop"), ("Service", "tokenloop"), ("Deployment", "tokenloop-proxy"),
                 ("Service", "tokenloop-proxy"), ("ConfigMap", "tokenloop-proxy")):
        check(want in kinds, f"deploy/k8s has {want}: {sorted(kinds)}")

    # the proxy's configuration: valid, and the local one's lines all there
    cm = [d for d in docs if d["kind"] == "ConfigMap"]
    cfg = cm[0]["data"]["haproxy.cfg"] if cm else ""
    if shutil.which("haproxy"):
        with tempfile.NamedTemporaryFile("w", suffix=".cfg") as f:
            f.write(cfg)
            f.flush()
            p = subprocess.run(["haproxy", "-c", "-f", f.name], capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, f"haproxy -c on the ConfigMap's haproxy.cfg: {p.stdout[-500:]} {p.stderr[-800:]}")
    else:
        check(False, "haproxy installed (scripts/setup.sh installs it)")
    theirs = set()
    for ln in cfg_lines(cfg):
        for extra in K8S_ONLY:
            ln = ln.replace(" " + extra, "")
        theirs.add(ln)
    local = [ln for ln in cfg_lines(open(LOCAL_CFG).read())
             if not ln.startswith(("bind ", "server ")) and "@" not in ln]
    missing = [ln for ln in local if ln not in theirs]
    check(local and not missing, f"the Kubernetes haproxy.cfg keeps deploy/haproxy/haproxy.cfg's lines; missing: {missing}")

    # the replicas' flags and probes
    help_text = subprocess.run([TL_BIN, "serve", "--help"], capture_output=True, text=True, timeout=30).stdout
    dep = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "tokenloop"]
    ctr = dep[0]["spec"]["template"]["spec"]["containers"][0] if dep else {}
    args = ctr.get("args", [])
    check(args[:1] == ["serve"], f"the container runs serve: {args}")
    for a in args[1:]:
        flag = a.split("=", 1)[0]
        check(re.search(r"(^|[ ,])" + re.escape(flag) + r"[ ,=\n]", help_text) is not None,
              f"`tokenloop serve --help` lists {flag}")
    paths = {ctr.get(p, {}).get("httpGet", {}).get("path") for p in ("startupProbe", "readinessProbe", "livenessProbe")}
    check(paths == {"/health", "/ready"}, f"probes on /health and /ready: {paths}")
    grace = dep[0]["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30) if dep else 0
    drain = [int(a.split("=", 1)[1]) for a in args if a.startswith("--drain-timeout=")]
    check(drain and grace > drain[0], f"the grace period ({grace} s) outlasts --drain-timeout ({drain})")
    if dep:
        live_replica(ctr, cfg)
        container_image(ctr)
    tlcheck.finish()


def get(port, path):
    """(status, body) of GET path, or (None, why) when nothing answers."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10 * SLOW)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    except OSError as e:
        return None, str(e)
    finally:
        c.close()


def probe_ok(status):
    """Kubernetes' httpGet probe: success is a status from 200 to 399."""
    return status is not None and 200 <= status < 400


def local_args(args, port, agent):
    """The container's args with only what cannot hold here replaced; (args, changes)."""
    out, changes = [], []
    for a in args:
        flag, eq, val = a.partition("=")
        if flag == "--model" and eq:
            b = f"--model={MODEL}"
        elif flag == "--port" and eq:
            b = f"--port={port}"
        elif flag == "--agent-port" and eq:
            b = f"--agent-port={agent}"
        else:
            b = a
        if b != a:
            changes.append(f"{a} -> {b}")
        out.append(b)
    return out, changes


def wait_status(port, path, want, timeout):
    t_end = time.time() + timeout * SLOW
    st = (None, "")
    while time.time() < t_end:
        st = get(port, path)
        if st[0] == want:
            break
        time.sleep(0.1)
    return st


def agent_line(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            return s.recv(200).decode(errors="replace").strip()
    except OSError as e:
        return f"({e})"


def local_haproxy_cfg(cfg, server_port, agent_port, bind_port, health_port):
    """The ConfigMap's haproxy.cfg for one replica on loopback: each
    server-template (pods by DNS) becomes one server line, the DNS-only
    options go, the binds move to free loopback ports. Everything else,
    checks and routing included, stays as written."""
    out = []
    for ln in cfg.splitlines():
        t = ln.strip()
        if t.startswith("server-template "):
            ln = ln[:len(ln) - len(ln.lstrip())] + f"server r1 127.0.0.1:{server_port}"
        elif t.startswith("default-server "):
            ln = ln.replace(" resolvers kube", "").replace(" init-addr none", "")
            ln = ln.replace("agent-port 8081", f"agent-port {agent_port}")
        elif t.startswith("bind :8080"):
            ln = ln.replace("bind :8080", f"bind 127.0.0.1:{bind_port}")
        elif t.startswith("bind :8404"):
            ln = ln.replace("bind :8404", f"bind 127.0.0.1:{health_port}")
        out.append(ln)
    return "\n".join(out) + "\n"


def sections(cfg, kind):
    """{name: body} of the haproxy.cfg sections of one kind (backend, frontend)."""
    out, cur = {}, None
    for ln in cfg.splitlines():
        words = ln.split()
        if words and words[0] in ("global", "defaults", "frontend", "backend", "listen", "resolvers"):
            cur = words[1] if words[0] == kind and len(words) > 1 else None
            if cur:
                out[cur] = ""
        elif cur:
            out[cur] += ln + "\n"
    return out


def post(port, path, body, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120 * SLOW)
    try:
        c.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    except OSError as e:
        return None, str(e)
    finally:
        c.close()


def live_replica(ctr, cfg):
    """The Deployment's container run here with its args, probed as the kubelet and HAProxy would."""
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        return
    args = ctr.get("args", [])
    check(f"--model={POD_MODEL}" in args, f"the container loads {POD_MODEL}, where the volume holds it: {args}")
    ports = {p["name"]: p["containerPort"] for p in ctr.get("ports", [])}
    port, agent = free_port(), free_port()
    here = {ports.get("http", 8080): port, ports.get("agent", 8081): agent}
    largs, changes = local_args(args, port, agent)
    print(f"test_k8s: running `tokenloop {' '.join(largs)}`")
    print(f"test_k8s: changed from the Deployment's args: {'; '.join(changes)} (the rest exactly as written)")
    check(len(changes) == 3, f"exactly --model, --port and --agent-port changed: {changes}")

    def probe(name):
        pr = ctr.get(name, {}).get("httpGet", {})
        p = pr.get("port")
        cport = ports.get(p, p)  # a name stands for the container port of that name
        return get(here.get(cport, -1), pr.get("path", "/"))

    with tempfile.TemporaryDirectory() as tmp:
        gate = os.path.join(tmp, "gate")
        log = open(os.path.join(tmp, "serve.log"), "w+")
        proc = subprocess.Popen([TL_BIN, *largs], stdout=log, stderr=log,
                                env=dict(os.environ, TL_TEST_LOAD_GATE=gate))
        hp = None
        try:
            # loading: the container is up, the model not yet
            st = wait_status(port, "/metrics", 200, 30)
            check(st[0] == 200 and proc.poll() is None,
                  f"the replica starts with the Deployment's args and listens (rc {proc.poll()}, {st})")
            if proc.poll() is not None:
                return
            for name in ("startupProbe", "readinessProbe"):
                st = probe(name)
                check(st[0] is not None and not probe_ok(st[0]),
                      f"{name} fails while the model loads, so the kubelet waits: {st}")
            sp = ctr.get("startupProbe", {})
            budget = sp.get("periodSeconds", 10) * sp.get("failureThreshold", 3)
            check(budget >= 60, f"the startupProbe allows a load of a minute or more: {budget} s")
            lp = ctr.get("livenessProbe", {})
            check(sp and lp.get("httpGet", {}).get("path") == sp.get("httpGet", {}).get("path"),
                  f"liveness probes the path the startupProbe waited on (so it only runs after a load): {lp}")
            # loaded
            open(gate, "w").close()
            st = wait_status(port, "/ready", 200, 120)
            check(st[0] == 200, f"/ready once loaded: {st}")
            for name in ("startupProbe", "readinessProbe", "livenessProbe"):
                st = probe(name)
                check(probe_ok(st[0]), f"{name} succeeds on the loaded replica: {st}")
            line = agent_line(agent)
            check(line.startswith("up ready"), f"the agent port answers HAProxy's agent-check: {line!r}")

            # HAProxy with the ConfigMap's configuration in front of it
            if not shutil.which("haproxy"):
                check(False, "haproxy installed (scripts/setup.sh installs it)")
                return
            backends = sections(cfg, "backend")
            check(len(backends) >= 2, f"the ConfigMap's backends: {list(backends)}")
            for name, text in backends.items():
                chk = re.search(r"option httpchk (\w+) (\S+)", text)
                exp = re.search(r"http-check expect status (\d+)", text)
                if check(chk and exp, f"backend {name} health-checks with an expected status"):
                    st = get(port, chk[2]) if chk[1] == "GET" else (None, chk[1])
                    check(st[0] == int(exp[1]), f"backend {name}: `{chk[0]}` answered {st[0]}, expects {exp[1]}")
            fport, hport = free_port(), free_port()
            hcfg = os.path.join(tmp, "haproxy.cfg")
            with open(hcfg, "w") as f:
                f.write(local_haproxy_cfg(cfg, port, agent, fport, hport))
            hlog = open(os.path.join(tmp, "haproxy.log"), "w+")
            hp = subprocess.Popen(["haproxy", "-db", "-f", hcfg], stdout=hlog, stderr=hlog)
            check(wait_status(hport, "/healthz", 200, 30)[0] == 200, "the proxy's own /healthz (its probes)")
            body = '{"prompt": "Hello", "max_tokens": 2}'
            # the checks run every second and need `rise 2`: wait for the first 200
            t_end = time.time() + 60 * SLOW
            st = (None, "")
            while time.time() < t_end and st[0] != 200:
                st = post(fport, "/v1/completions", body)
                time.sleep(0.2)
            check(st[0] == 200, f"an unkeyed completion through the ConfigMap's HAProxy: {st[0]} {st[1][:200]}")
            t_end = time.time() + 60 * SLOW
            st = (None, "")
            while time.time() < t_end and st[0] != 200:
                st = post(fport, "/v1/completions", body, {"X-Session-ID": "k8s-test"})
                time.sleep(0.2)
            check(st[0] == 200, f"a keyed completion through the ConfigMap's HAProxy: {st[0]} {st[1][:200]}")
        finally:
            if hp:
                hp.kill()
                hp.wait(timeout=30)
            proc.kill()
            proc.wait(timeout=30)
            if tlcheck.failed:
                log.seek(0)
                print(log.read()[-3000:])


def engine():
    """A container tool whose engine answers, and why not when none does."""
    why = []
    for tool in ("docker", "podman"):
        exe = shutil.which(tool)
        if not exe:
            why.append(f"{tool}: not installed")
            continue
        p = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=60)
        if p.returncode == 0:
            return exe, ""
        last = (p.stderr.strip() or p.stdout.strip()).splitlines()[-1:] or ["?"]
        why.append(f"{tool}: `{tool} info` failed: {last[0][:160]}")
    return None, "; ".join(why)


def container_image(ctr):
    """Builds deploy/k8s/Dockerfile and runs the image with the Deployment's exact args."""
    exe, why = engine()
    if not exe:
        msg = f"deploy/k8s/Dockerfile was NOT built or run: no working container engine ({why})"
        if os.environ.get("TL_K8S_REQUIRE_IMAGE") == "1":
            check(False, msg)
        else:
            print("SKIPPED:", msg, "(TL_K8S_REQUIRE_IMAGE=1 makes this a failure)")
        return
    tag = "tokenloop:test-k8s"
    p = subprocess.run([exe, "build", "-f", os.path.join(K8S, "Dockerfile"), "-t", tag, ROOT],
                       capture_output=True, text=True, timeout=3600)
    if not check(p.returncode == 0, f"{exe} build -f deploy/k8s/Dockerfile: {p.stderr[-1500:]}"):
        return
    port = free_port()
    name = f"tokenloop-k8s-{os.getpid()}"
    # inside the container the args hold exactly: the model mounted where the volume puts it
    run = [exe, "run", "-d", "--rm", "--name", name, "--read-only", "--user", "65532:65532",
           "-v", f"{os.path.realpath(MODEL)}:{POD_MODEL}:ro", "-p", f"127.0.0.1:{port}:8080", tag, *ctr["args"]]
    p = subprocess.run(run, capture_output=True, text=True, timeout=120)
    if not check(p.returncode == 0, f"{' '.join(run)}: {p.stderr[-800:]}"):
        return
    try:
        st = wait_status(port, "/ready", 200, 120)
        check(st[0] == 200, f"the image, run with the Deployment's exact args, gets ready: {st}")
    finally:
        logs = subprocess.run([exe, "logs", name], capture_output=True, text=True, timeout=60)
        if tlcheck.failed:
            print(logs.stdout[-1500:], logs.stderr[-1500:])
        subprocess.run([exe, "rm", "-f", name], capture_output=True, timeout=60)


if __name__ == "__main__":
    main()
