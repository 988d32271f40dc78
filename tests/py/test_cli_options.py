"""Every command accepts its long options as `--name=value` as well as
`--name value` (getopt_long's two spellings; deploy/k8s/tokenloop.yaml writes
the first): each command run both ways gives the same output. An option that
takes no value given one (`--ids=1`) is a usage error naming it; a value is
always taken verbatim, so `-p --a=b` passes the prompt "--a=b"; an option
missing its value says so. Run: TL_BIN=build/tokenloop python3 tests/py/test_cli_options.py"""
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import TL_BIN, free_port  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def tl(*args, stdin=None, timeout=300):
    p = subprocess.run([TL_BIN, *args], capture_output=True, text=True, input=stdin, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def same(what, spaced, joined, stdin=None, strip_stderr=True):
    """Runs a command with `--name value` and with `--name=value`; both succeed alike."""
    a = tl(*spaced, stdin=stdin)
    b = tl(*joined, stdin=stdin)
    ok = a[0] == 0 and b[0] == 0 and a[1] == b[1]
    check(ok, f"{what}: `{' '.join(joined)}` differs from `{' '.join(spaced)}`:\n"
              f"rc {a[0]} / {b[0]}\n{a[2][-400:]}\n{b[2][-400:]}\n{a[1][-300:]!r}\n{b[1][-300:]!r}")
    return b


def usage_error(what, args, needle):
    rc, out, err = tl(*args)
    check(rc == 2 and needle in err, f"{what}: `{' '.join(args)}` -> rc {rc}, want 2 and {needle!r}: {err[-300:]}")


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    M = MODEL
    with tempfile.TemporaryDirectory() as tmp:
        # tokenize, info, template
        same("tokenize", ["tokenize", "-m", M, "--prompt", "Hello world", "--ids"],
             ["tokenize", f"--model={M}", "--prompt=Hello world", "--ids"])
        same("info", ["info", "--model", M], ["info", f"--model={M}"])
        msgs = os.path.join(tmp, "m.json")
        with open(msgs, "w") as f:
            json.dump([{"role": "user", "content": "Hi"}], f)
        same("template", ["template", "--model", M, "--messages", msgs],
             ["template", f"--model={M}", f"--messages={msgs}"])
        # run and chat: every value option of theirs in the = form
        common = ["--n-predict", "4", "--ctx-size", "256", "--threads", "2", "--batch-size", "64",
                  "--numerics", "fast", "--spec", "off", "--temp", "0.7", "--top-k", "20", "--top-p", "0.9",
                  "--min-p", "0.05", "--repeat-penalty", "1.1", "--repeat-last-n", "16",
                  "--frequency-penalty", "0.1", "--presence-penalty", "0.1", "--seed", "7", "--stop", "zzz",
                  "--thinking-budget", "8", "--ignore-eos"]

        def joined(args):
            out, i = [], 0
            while i < len(args):
                if i + 1 < len(args) and args[i].startswith("--") and not args[i + 1].startswith("--"):
                    out.append(f"{args[i]}={args[i + 1]}")
                    i += 2
                else:
                    out.append(args[i])
                    i += 1
            return out

        sysf = os.path.join(tmp, "system.txt")
        with open(sysf, "w") as f:
            f.write("Be brief.")
        run_sp = ["run", "--model", M, "--prompt", "The capital of France is", "--ids", *common]
        same("run", run_sp, joined(run_sp))
        trace = os.path.join(tmp, "t.jsonl")
        gram, schema = os.path.join(tmp, "g.gbnf"), os.path.join(tmp, "s.json")
        with open(gram, "w") as f:
            f.write('root ::= "yes" | "no"\n')
        with open(schema, "w") as f:
            f.write('{"type": "integer"}')
        run_sp = ["run", "--model", M, "--file", sysf, "--system", "Be brief.", "--chat", "--trace", trace,
                  "--grammar", gram, *common]
        same("run --chat --grammar", run_sp, joined(run_sp))
        run_sp = ["run", "--model", M, "--prompt", "A", "--json-schema", schema, *common]
        same("run --json-schema", run_sp, joined(run_sp))
        chat_sp = ["chat", "--model", M, "--system", "Be brief.", *common]
        same("chat", chat_sp, joined(chat_sp), stdin="Hi\n")
        # perplexity, logits, bench
        text = os.path.join(tmp, "text.txt")
        with open(text, "w") as f:
            f.write("The quick brown fox jumps over the lazy dog. " * 12)
        ppl_sp = ["perplexity", "--model", M, "--file", text, "--ctx-size", "32", "--batch-size", "32",
                  "--threads", "2", "--numerics", "exact"]
        same("perplexity", ppl_sp, joined(ppl_sp))
        ids = os.path.join(tmp, "ids.json")
        with open(ids, "w") as f:
            json.dump([1, 2, 3], f)
        o1, o2 = os.path.join(tmp, "l1.bin"), os.path.join(tmp, "l2.bin")
        same("logits --ids", ["logits", "--model", M, "--ids", "1,2,3", "-o", o1, "--threads", "2",
                              "--batch-size", "2", "--numerics", "exact"],
             ["logits", f"--model={M}", "--ids=1,2,3", "-o", o2, "--threads=2", "--batch-size=2", "--numerics=exact"])
        check(all(map(os.path.exists, (o1, o2))) and open(o1, "rb").read() == open(o2, "rb").read(),
              "logits: the same bytes both ways")
        # every spelling of the KV cache types gives the same bytes as --kv-type
        # (and q8_0 logits that differ from f16's: the option took)
        outs = []
        for k, kv in enumerate((["--kv-type", "q8_0"], ["--kv-type-k", "q8_0", "--kv-type-v", "q8_0"],
                                ["-ctk", "q8_0", "-ctv", "q8_0"], ["--cache-type-k=q8_0", "--cache-type-v=q8_0"],
                                ["--kv-type", "f16"])):
            o = os.path.join(tmp, f"kv{k}.bin")
            rc, _, err = tl("logits", "-m", M, "--ids", "1,2,3,4,5", "-o", o, "-t", "2", *kv)
            check(rc == 0, f"logits {' '.join(kv)}: rc {rc}: {err[-200:]}")
            outs.append(open(o, "rb").read() if rc == 0 else b"")
        check(outs[0] and outs[1] == outs[0] and outs[2] == outs[0] and outs[3] == outs[0],
              "--kv-type-k/-v, -ctk/-ctv and --cache-type-k/-v give --kv-type's logits")
        check(outs[4] and outs[4] != outs[0], "a q8_0 cache's logits differ from an f16 one's")
        usage_error("an unknown KV type", ["logits", "-m", M, "--ids", "1", "-o", o1, "--kv-type", "q5_0"],
                    "not a KV cache type")
        same("logits --ids-file", ["logits", "--model", M, "--ids-file", ids, "-o", o1],
             ["logits", f"--model={M}", f"--ids-file={ids}", "-o", o2])
        rc, out, err = tl("bench", f"--model={M}", "--n-prompt=8", "--n-gen=2", "--n-depth=0", "--repetitions=1",
                          "--threads=2", "--output=json", "--no-warmup", "--numerics=fast")
        check(rc == 0 and '"n_prompt": 8' in out.replace('"n_prompt":8', '"n_prompt": 8'),
              f"bench with = forms: rc {rc}: {err[-300:]} {out[:300]}")
        rc, out, err = tl("bench", "--memory", "--mem-cache=1", "--mem-dram=8", "--threads=1", "--repetitions=1")
        check(rc == 0, f"bench --memory with = forms: rc {rc}: {err[-300:]}")
        # quantize: options before the positional files
        q1 = os.path.join(tmp, "q.gguf")
        rc, _, err = tl("quantize", "--threads=2", M, q1, "Q8_0")
        check(rc == 0 and os.path.exists(q1), f"quantize --threads=2: rc {rc}: {err[-300:]}")

        # serve: every value option of the Kubernetes kind, and it answers
        port, agent = free_port(), free_port()
        args = ["serve", f"--model={M}", "--host=127.0.0.1", f"--port={port}", f"--agent-port={agent}",
                "--parallel=2", "--ctx-size=512", "--kv-mem=64", "--threads=1", "--numerics=fast", "--spec=off",
                "--reasoning=off", "--prefill-chunk=64", "--drain-timeout=5", "--max-queue=8",
                "--max-conns-per-client=16", "--responses-store=4", "--responses-ttl=60", "--responses-mem=4",
                "--read-timeout=10", "--api-key=k"]
        p = subprocess.Popen([TL_BIN, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ok = False
        try:
            t_end = time.time() + 60
            while time.time() < t_end and p.poll() is None and not ok:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                        ok = r.status == 200
                except OSError:
                    time.sleep(0.1)
            check(ok, f"serve with every option as --name=value gets ready (rc {p.poll()})")
            if ok:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/props", headers={"Authorization": "Bearer k"})
                with urllib.request.urlopen(req, timeout=10) as r:
                    props = json.load(r)
                check(props.get("total_slots") == 2, f"--parallel=2 took: {props.get('total_slots')}")
        finally:
            p.kill()
            out = p.communicate(timeout=30)[0]
        if not ok:
            print(out[-1500:])

        # options that take no value, given one
        usage_error("tokenize --ids=1", ["tokenize", f"--model={M}", "--prompt=x", "--ids=1"],
                    "option --ids takes no value")
        usage_error("run --ignore-eos=yes", ["run", f"--model={M}", "--prompt=x", "--ignore-eos=yes"],
                    "option --ignore-eos takes no value")
        usage_error("serve --no-loop=1", ["serve", f"--model={M}", "--no-loop=1"], "option --no-loop takes no value")
        usage_error("bench --no-warmup=1", ["bench", "--no-warmup=1"], "option --no-warmup takes no value")
        usage_error("quantize --pure=1", ["quantize", "--pure=1", M, q1, "Q8_0"], "option --pure takes no value")
        usage_error("template --no-generation-prompt=0",
                    ["template", f"--messages={msgs}", "--no-generation-prompt=0"], "takes no value")
        # a value missing, and a name no command knows
        usage_error("serve --port", ["serve", "--port"], "option --port needs a value")
        usage_error("serve --bogus=1", ["serve", "--bogus=1"], "unknown option '--bogus'")
        # a value is taken verbatim, whatever it looks like
        rc, out, err = tl("tokenize", f"--model={M}", "-p", "--a=b", "--ids")
        rc2, out2, _ = tl("tokenize", f"--model={M}", "--stdin", "--ids", stdin="--a=b")
        check(rc == 0 and out == out2, f"-p --a=b tokenizes the text '--a=b': {out!r} vs {out2!r} {err[-200:]}")
        rc, out, err = tl("tokenize", f"--model={M}", "--prompt=a=b", "--ids")
        rc2, out2, _ = tl("tokenize", f"--model={M}", "--stdin", "--ids", stdin="a=b")
        check(rc == 0 and out == out2, f"--prompt=a=b splits at the first '=': {out!r} vs {out2!r}")
    tlcheck.finish()


if __name__ == "__main__":
    main()
