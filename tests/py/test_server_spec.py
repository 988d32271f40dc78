"""Speculative decoding through the server: a copy-heavy request's tokens and
logprob values (with 5 alternatives, compared exactly) are the same with
--spec ngram as with --spec off, greedy and seeded, alone and while 3 other
requests run beside it (verification rows of some sequences beside plain rows
of others in one forward call); usage.speculative reports drafted and
accepted guesses; /metrics carries vLLM's spec_decode counters and ours; and
after many rejected guesses the prefix cache hands out only right blocks
(the same request again is cached and answers the same); and a draft model
(--draft, the model itself) gives the same tokens.
Run: TL_BIN=./tokenloop python3 tests/py/test_server_spec.py"""
import concurrent.futures
import http.client
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlcheck  # noqa: E402
from tlcheck import check  # noqa: E402
from tlserver import SLOW  # noqa: E402
from test_server_invariance import SMOL, Server, chat, same  # noqa: E402

CODE = """static int blocks_for(int positions) {
    return (positions + TL_KV_BLOCK - 1) / TL_KV_BLOCK;
}
static void slot_clear(srv_sched *s, slot *sl) {
    if (sl->seq > 0) tl_seq_close(s->ctx, sl->seq);
    tl_sampler_free(sl->smp);
    memset(sl, 0, sizeof *sl);
}
"""
COPY = "Rewrite this C code with the variable sl renamed to slot:\n" + CODE
OTHERS = ["Write one sentence about owls.", "Name three rivers.", "Count from one to ten in words."]
N_TOK = 80


def chat_usage(srv, content, **kw):
    """chat() plus the raw usage object."""
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": kw.get("max_tokens", N_TOK),
            "temperature": kw.get("temperature", 0.0)}
    r = srv.post("/v1/chat/completions", body)
    return r["usage"]


def metrics(srv):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        c.request("GET", "/metrics")
        return c.getresponse().read().decode()
    finally:
        c.close()


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def beside(srv, target_fn):
    """Runs target_fn while the OTHERS run too; returns its result."""
    with concurrent.futures.ThreadPoolExecutor(len(OTHERS) + 1) as ex:
        futs = [ex.submit(chat, srv, o, temperature=0.7, seed=i, max_tokens=N_TOK) for i, o in enumerate(OTHERS)]
        time.sleep(0.01)
        mine = ex.submit(target_fn)
        for f in futs:
            f.result(timeout=180 * SLOW)
        return mine.result(timeout=180 * SLOW)


def main():
    if not check(os.path.exists(SMOL), f"{SMOL} exists (run make models)"):
        tlcheck.finish()
    t0 = time.time()
    off = Server(SMOL, "-np", "4", "-t", "2", "-c", "1024", "--spec", "off")
    ref = {}
    try:
        if check(off.wait_ready(), "--spec off server ready"):
            ref["greedy"] = chat(off, COPY, max_tokens=N_TOK)
            ref["seeded"] = chat(off, COPY, temperature=0.8, seed=7, max_tokens=N_TOK)
            u = chat_usage(off, COPY)
            check(u.get("speculative") == {"drafted": 0, "accepted": 0}, f"--spec off drafts nothing: {u}")
    finally:
        off.stop()
    on = Server(SMOL, "-np", "4", "-t", "2", "-c", "1024", "--spec", "ngram")
    try:
        if check(on.wait_ready(), "--spec ngram server ready") and "greedy" in ref:
            same(ref["greedy"], chat(on, COPY, max_tokens=N_TOK), "greedy: ngram vs off")
            same(ref["seeded"], chat(on, COPY, temperature=0.8, seed=7, max_tokens=N_TOK), "seeded: ngram vs off")
            same(ref["greedy"], beside(on, lambda: chat(on, COPY, max_tokens=N_TOK)),
                 "greedy beside 3 other requests: ngram vs off")
            u = chat_usage(on, COPY)
            sp = u.get("speculative") or {}
            check(sp.get("drafted", 0) > 0 and 0 < sp.get("accepted", 0) <= sp["drafted"],
                  f"usage.speculative reports guesses: {u}")
            check(u.get("completion_tokens") == len(ref["greedy"]["tokens"]), f"completion_tokens {u}")
            # the same request again: its prompt comes from the prefix cache, written
            # by requests that rejected many guesses; the answer does not change
            again = chat(on, COPY, max_tokens=N_TOK)
            check(again["cached"] > 0, f"the prompt is cached the second time ({again['cached']})")
            same(ref["greedy"], again, "greedy over cached blocks after rejections")
            m = metrics(on)
            d, a = metric(m, "vllm:spec_decode_num_draft_tokens_total"), metric(m, "vllm:spec_decode_num_accepted_tokens_total")
            check(d is not None and a is not None and d > 0 and 0 < a <= d, f"vLLM spec counters: {d} {a}")
            check(metric(m, "tokenloop_spec_draft_tokens_total") == d, "our draft counter equals vLLM's")
    finally:
        on.stop()
    # a draft model (the model itself: same vocabulary) in the server, one
    # draft sequence per slot, beside other requests
    dr = Server(SMOL, "-np", "4", "-t", "2", "-c", "1024", "--spec", "draft", "--draft", SMOL)
    try:
        if check(dr.wait_ready(), "--spec draft server ready") and "greedy" in ref:
            same(ref["greedy"], chat(dr, COPY, max_tokens=N_TOK), "greedy: draft model vs off")
            same(ref["seeded"], beside(dr, lambda: chat(dr, COPY, temperature=0.8, seed=7, max_tokens=N_TOK)),
                 "seeded beside 3 other requests: draft model vs off")
            # --spec draft guesses every step whatever the measured costs
            sp = chat_usage(dr, COPY).get("speculative") or {}
            check(sp.get("drafted", 0) > 0 and sp.get("accepted", 0) > 0, f"the draft model guessed: {sp}")
    finally:
        dr.stop()
    print(f"  total {time.time() - t0:.1f} s")
    tlcheck.finish()


if __name__ == "__main__":
    main()
