"""The live page (GET /) in a real browser: headless Chromium from Debian's
packages, driven by selenium with Debian's chromedriver (SE_AVOID_STATS set,
the driver's path given: nothing is downloaded, no statistics are sent).
While sixteen requests run together, the page shows each one's tokens in order (the
texts the API returned), a chosen token's alternatives, the forward calls and
the loop's numbers; a prompt sent from the page's own form gets its reply;
the page references no other host and asks for nothing elsewhere; the
records reach the page within 100 ms (median) of being made. A screenshot
goes to docs/img/live-page.png when TL_SCREENSHOT=1.
Run: TL_BIN=build/tokenloop python3 tests/py/test_page.py"""
import json
import os
import re
import statistics
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import ROOT, check  # noqa: E402
from tlserver import SLOW, Server  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
DRIVER = "/usr/bin/chromedriver"
PROMPTS = ["The history of the printing press", "A recipe for bread starts with", "The planets of the solar system are",
           "Rivers of Europe include"]


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120 * SLOW) as r:
        return json.loads(r.read())


def browser():
    os.environ["SE_AVOID_STATS"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000",
              "--disable-background-networking", "--disable-component-update", "--no-first-run"):
        opts.add_argument(a)
    opts.binary_location = "/usr/bin/chromium"
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def wait_for(fn, timeout):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    return fn()


def main():
    if not check(os.path.exists(MODEL), f"{MODEL} (make models)"):
        tlcheck.finish()
    if not check(os.path.exists(DRIVER) and os.path.exists("/usr/bin/chromium"),
                 "chromium and chromium-driver installed (scripts/setup.sh installs them)"):
        tlcheck.finish()
    srv = Server(MODEL, ["-np", "16", "-t", "2", "-c", "512"])
    try:
        if not check(srv.wait_ready(), "server ready"):
            tlcheck.finish()
        page_checks(srv)
    except Exception as e:  # a failure is counted and reported, not a traceback without a summary
        check(False, f"the page test stopped: {type(e).__name__}: {e}")
    finally:
        srv.stop()
    tlcheck.finish()


def page_checks(srv):
    drv = None
    try:
        html = urllib.request.urlopen(srv.url + "/", timeout=30).read().decode()
        hosts = re.findall(r"(?:https?:)?//[a-zA-Z0-9.-]+", html)
        check(not hosts and "/v1/loop" in html, f"the page references no other host: {hosts[:5]}")
        drv = browser()
        drv.get(srv.url + "/")
        from selenium.webdriver.common.by import By
        check(wait_for(lambda: "live" in drv.find_element(By.ID, "status").text, 30 * SLOW),
              f"the page follows the loop: {drv.find_element(By.ID, 'status').text!r}")
        # sixteen requests at once: every sequence live together
        n_req = 16
        results = [None] * n_req

        def one(i):
            results[i] = post(srv.url + "/v1/completions", {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 16 + i,
                                                            "temperature": 0.9, "seed": i})
        ths = [threading.Thread(target=one, args=(i,)) for i in range(n_req)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        texts = [r["choices"][0]["text"] for r in results]

        def shown():
            out = []
            for el in drv.find_elements(By.CSS_SELECTOR, "#seqs .seq .text"):
                out.append(drv.execute_script(
                    "return Array.from(arguments[0].childNodes).filter(n => !(n.classList && "
                    "(n.classList.contains('cached') || n.classList.contains('rej')))).map(n => n.textContent).join('')",
                    el))
            return out
        got = wait_for(lambda: all(t in shown() for t in texts) and shown(), 20 * SLOW)
        check(got and all(t in got for t in texts),
              f"all {n_req} replies shown, their tokens in order: {[t[:20] for t in texts]} in {[g[:20] for g in got or []]}")
        # a chosen token's alternatives
        toks = drv.find_elements(By.CSS_SELECTOR, "#seqs .tok")
        ok = False
        if toks:
            tok = toks[min(3, len(toks) - 1)]
            drv.execute_script("arguments[0].scrollIntoView()", tok)
            tok.click()
            rows = drv.find_elements(By.CSS_SELECTOR, "#alts tr.alt")
            chosen = drv.find_elements(By.CSS_SELECTOR, "#alts tr.alt.chosen")
            ok = len(rows) == 5 and len(chosen) <= 1 and "%" in rows[0].text
            p = float(tok.get_attribute("data-p"))
            ok = ok and 0 < p <= 1 and tok.get_attribute("data-pct").endswith("%")
        check(ok, f"a token's alternatives: {len(toks)} tokens shown")
        # the loop's numbers and the timeline
        nums = {k: drv.find_element(By.ID, k).text for k in ("tps", "batch", "kv", "gbps", "lag")}
        check(all(v not in ("", "–") for v in nums.values()), f"the loop's numbers: {nums}")
        # the form sends a request of its own and shows the reply
        drv.find_element(By.ID, "prompt").clear()
        drv.find_element(By.ID, "prompt").send_keys("Say hello.")
        drv.find_element(By.ID, "max_tokens").clear()
        drv.find_element(By.ID, "max_tokens").send_keys("16")
        drv.find_element(By.ID, "send").click()
        done = wait_for(lambda: "done" in drv.find_element(By.ID, "askstatus").text, 60 * SLOW)
        reply = drv.find_element(By.ID, "reply").text
        check(done and reply.strip(), f"the form's reply: {reply!r} ({drv.find_element(By.ID, 'askstatus').text})")
        check(wait_for(lambda: any(reply.strip()[:10] in s for s in shown()), 10 * SLOW),
              "the form's request appears as a sequence too")
        # latency: record made -> page drew it
        lags = drv.execute_script("return (window.__lags || [])")
        lag = drv.find_element(By.ID, "lag").text
        check(lags and statistics.median(lags) < 100 * SLOW,
              f"records reach the page within 100 ms: median {statistics.median(lags) if lags else None} ms "
              f"over {len(lags)}, last {lag}")
        # no request left this host
        hosts = set()
        for entry in drv.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg.get("method") == "Network.requestWillBeSent":
                u = msg["params"]["request"]["url"]
                if not u.startswith("data:"):
                    hosts.add(re.sub(r"^(\w+://[^/]+).*", r"\1", u))
        check(hosts == {srv.url}, f"the page asked only its server: {sorted(hosts)}")
        if os.environ.get("TL_SCREENSHOT"):
            drv.execute_script("window.scrollTo(0, 0)")
            time.sleep(0.5)
            os.makedirs(os.path.join(ROOT, "docs", "img"), exist_ok=True)
            drv.save_screenshot(os.path.join(ROOT, "docs", "img", "live-page.png"))
    finally:
        if drv:
            drv.quit()


if __name__ == "__main__":
    main()
