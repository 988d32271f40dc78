#!/usr/bin/env python3
"""A small tool-using agent over `tokenloop serve`, with only the `openai`
package: a calculator and a file reader confined to one folder. Each turn
sends the whole conversation again (as agents do); the server's prefix cache
should then serve everything but the newest part. Per turn it prints the
prompt tokens, how many came from the cache, and the time to first token.

  ./tokenloop serve -np 2 &
  python3 examples/agent.py --folder docs "How many lines does GRAMMAR.md have?"

--first-tool NAME forces the first turn to call that tool (small models
rarely choose to); --json prints the per-turn figures as JSON at the end.
"""
import argparse
import ast
import json
import operator
import os
import sys
import time

from openai import OpenAI

TOOLS = [
    {"type": "function", "function": {
        "name": "calculate", "description": "Evaluates an arithmetic expression (+ - * / ** and parentheses).",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string", "maxLength": 80}},
                       "required": ["expression"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Reads a text file from the agent's folder.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string", "maxLength": 80}},
                       "required": ["path"], "additionalProperties": False}}},
]

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression):
    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in OPS:
            return OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and type(n.op) in OPS:
            return OPS[type(n.op)](ev(n.operand))
        raise ValueError("only numbers and + - * / ** ( )")
    try:
        return str(ev(ast.parse(expression, mode="eval")))
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as e:
        return f"error: {e}"


def read_file(folder, path):
    full = os.path.realpath(os.path.join(folder, path))
    if not full.startswith(os.path.realpath(folder) + os.sep):
        return "error: outside the folder"
    try:
        with open(full, encoding="utf-8", errors="replace") as f:
            return f.read(2000)
    except OSError as e:
        return f"error: {e.strerror}"


def turn(client, msgs, tool_choice, temperature, parallel):
    """One streamed request: the assistant message, usage and time to first token."""
    t0 = time.time()
    ttft = None
    content, calls, usage = "", {}, None
    stream = client.chat.completions.create(model="local", messages=msgs, tools=TOOLS, tool_choice=tool_choice,
                                            parallel_tool_calls=parallel, temperature=temperature, max_tokens=256, stream=True,
                                            stream_options={"include_usage": True})
    for ch in stream:
        if ch.usage:
            usage = ch.usage
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        if ttft is None and (d.content or d.tool_calls):
            ttft = time.time() - t0
        content += d.content or ""
        for tc in d.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": tc.id, "type": "function", "function": {"name": "", "arguments": ""}})
            c["function"]["name"] += tc.function.name or ""
            c["function"]["arguments"] += tc.function.arguments or ""
    msg = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg, usage, ttft if ttft is not None else time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("question")
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--folder", default=".", help="the folder read_file may read (default: .)")
    ap.add_argument("--first-tool", default=None, help="force the first turn to call this tool")
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--parallel", action="store_true", help="allow several calls per turn")
    ap.add_argument("--json", action="store_true", help="print the per-turn figures as JSON at the end")
    a = ap.parse_args()
    client = OpenAI(base_url=a.base_url, api_key=os.environ.get("OPENAI_API_KEY", "unused"))
    msgs = [{"role": "system", "content": "You are a careful assistant. Use the tools when they help."},
            {"role": "user", "content": a.question}]
    rows = []
    print(f"{'turn':>4} {'prompt':>7} {'cached':>7} {'ttft ms':>8}  action")
    for n in range(1, a.max_turns + 1):
        choice = {"type": "function", "function": {"name": a.first_tool}} if n == 1 and a.first_tool else "auto"
        msg, usage, ttft = turn(client, msgs, choice, a.temperature, a.parallel)
        msgs.append(msg)
        cached = usage.prompt_tokens_details.cached_tokens if usage and usage.prompt_tokens_details else 0
        calls = msg.get("tool_calls", [])
        action = ", ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in calls) or \
            f"answer: {(msg['content'] or '')[:60]!r}"
        rows.append({"turn": n, "prompt_tokens": usage.prompt_tokens if usage else None, "cached_tokens": cached,
                     "ttft_ms": round(ttft * 1000, 1), "tool_calls": len(calls)})
        print(f"{n:>4} {rows[-1]['prompt_tokens']:>7} {cached:>7} {rows[-1]['ttft_ms']:>8}  {action}", flush=True)
        if not calls:
            break
        for c in calls:
            try:
                args = json.loads(c["function"]["arguments"])
            except ValueError:
                args = {}
            if c["function"]["name"] == "calculate":
                out = calculate(str(args.get("expression", "")))
            elif c["function"]["name"] == "read_file":
                out = read_file(a.folder, str(args.get("path", "")))
            else:
                out = "error: no such tool"
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": out})
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
