"""deploy/k8s/: the manifests validate against the Kubernetes API schemas
(kubernetes-validate --strict, with the schemas it ships); HAProxy accepts
the proxy's configuration from its ConfigMap (haproxy -c); that
configuration keeps every routing, retry and timeout line of
deploy/haproxy/haproxy.cfg, so the two cannot drift apart; and the
Deployment passes only flags `tokenloop serve --help` lists, probing paths
the server answers.
Run: python3 tests/py/test_k8s.py"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import TL_BIN  # noqa: E402

K8S = os.path.join(ROOT, "deploy", "k8s")
LOCAL_CFG = os.path.join(ROOT, "deploy", "haproxy", "haproxy.cfg")
# what only the Kubernetes configuration has: pods found through DNS
K8S_ONLY = ("resolvers kube", "init-addr none", "agent-port 8081")


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
    tlcheck.finish()


if __name__ == "__main__":
    main()
