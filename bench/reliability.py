"""Reliability of `pc-cpu serve` under load and abuse, measured against a real server on 127.0.0.1.

Four measurements, each on a private store in a temp directory (nothing touches the user's):
1. same answer in any company: 32 chat requests over 3 documents sent at once against the same 32
   sent one at a time (greedy); how many answers are identical;
2. a chat request's latency while a ~4,300-token document is being added, against idle;
3. hostile input: requests a client should be refused for; counts of 4xx, 5xx and 2xx (wrongly
   accepted) answers, and any 5xx or error text that leaks a path or a traceback;
4. kill -9 in the middle of adding a document, at several moments: after a restart the documents
   added before are listed and answer, the interrupted one is absent or whole, and
   `pc-cpu store verify` finds no bad file (and lists what an interrupted write left over).

    python bench/reliability.py [--model smollm2-135m] [--threads 2] [--skip kill]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [(ROOT / "examples" / name).read_text() for name in ("harbor.txt", "railway.txt")]
DOCS.append("The Verrin observatory sits on a basalt ridge 2,140 metres up. Its main mirror is 3.6 metres "
            "across and was cast in 1971; the dome turns on 48 steel wheels. Astronomer Ilse Marrow found "
            "the comet that bears her name there in 1994.")
QUESTIONS = ["Who kept the Calder Light?", "When was the light automated?", "How long is the viaduct?",
             "When did the railway open?", "How wide is the observatory's mirror?", "Who found a comet?",
             "What does the dome turn on?", "How high is the ridge?"]


def long_text(words: int = 3300) -> str:
    rng = random.Random(7)
    vocab = ["harbour", "ledger", "crate", "silk", "tea", "clerk", "tide", "quay", "lamp", "rope", "brass",
             "anchor", "wharf", "manifest", "cargo", "storm", "north", "pier", "signal", "keeper"]
    return " ".join(f"{rng.choice(vocab)}{'.' if i % 12 == 11 else ''}" for i in range(words))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`pc-cpu serve` in a child process on a free loopback port, with its own store."""

    def __init__(self, store: Path, model: str, threads: int):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PC_CPU_STORE_DIR": str(store)}
        self.proc = subprocess.Popen([sys.executable, "-m", "pc_cpu.cli", "serve", "--port", str(self.port),
                                      "--model", model, "--threads", str(threads)],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the server did not start")

    def request(self, method: str, path: str, body=None, raw: bytes | None = None,
                timeout: float = 600) -> tuple[int, dict | str]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                text = resp.read().decode("utf-8", "replace")
                status = resp.status
        except urllib.error.HTTPError as err:
            text, status = err.read().decode("utf-8", "replace"), err.code
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def chat(self, question: str, documents: list[str], max_tokens: int = 32) -> str:
        status, body = self.request("POST", "/v1/chat/completions", {
            "documents": documents, "messages": [{"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0})
        if status != 200:
            raise RuntimeError(f"chat failed: {status} {body}")
        return body["choices"][0]["message"]["content"]

    def add(self, text: str, name: str) -> str:
        status, body = self.request("POST", "/v1/documents", {"text": text, "name": name})
        if status != 200:
            raise RuntimeError(f"add failed: {status} {body}")
        return body["id"]

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(timeout=60)


def same_answer_in_any_company(server: Server) -> dict:
    ids = [server.add(text, f"doc{i}") for i, text in enumerate(DOCS)]
    asks = [(QUESTIONS[i % len(QUESTIONS)] + (" Answer briefly." if i >= 8 else "") + (" " * (i // 16)), ids)
            for i in range(32)]
    alone = [server.chat(q, docs) for q, docs in asks]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda a: server.chat(*a), asks))
    return {"requests": len(asks), "identical": sum(a == b for a, b in zip(alone, together))}


def latency_while_adding(server: Server) -> dict:
    ids = [server.add(DOCS[0], "harbor")]
    idle = [timed(lambda: server.chat(QUESTIONS[0], ids)) for _ in range(3)]
    done = threading.Event()
    added = {}

    def add_long():
        added["s"] = timed(lambda: server.add(long_text(), "ledger"))
        done.set()

    threading.Thread(target=add_long).start()
    time.sleep(0.5)
    during = []
    while not done.is_set():
        during.append(timed(lambda: server.chat(QUESTIONS[0], ids)))
    done.wait()
    return {"idle_s_median": round(statistics.median(idle), 2), "while_adding_s": [round(x, 2) for x in during],
            "while_adding_s_max": round(max(during), 2) if during else None, "add_s": round(added["s"], 1)}


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def hostile_requests() -> list[tuple[str, str, str, object]]:
    """(what, method, path, JSON body or raw bytes) of requests that must be refused with a 4xx."""
    chat = {"schema": "nope", "messages": [{"role": "user", "content": "hi"}]}
    doc_chat = lambda content, **extra: {"documents": ["harbor"], "messages": [{"role": "user", "content": content}],
                                         **extra}  # noqa: E731
    return [
        ("not JSON", "POST", "/v1/chat/completions", b"{not json"),
        ("empty body", "POST", "/v1/chat/completions", b""),
        ("unknown schema", "POST", "/v1/chat/completions", chat),
        ("no messages", "POST", "/v1/chat/completions", {"schema": "x", "messages": []}),
        ("unknown document", "POST", "/v1/chat/completions", {**doc_chat("hi"), "documents": ["nope"]}),
        ("lone surrogate in a question", "POST", "/v1/chat/completions", b'{"documents": ["harbor"], '
         b'"messages": [{"role": "user", "content": "why \\udc80?"}]}'),
        ("lone surrogate in a document", "POST", "/v1/documents", b'{"text": "bad \\ud800 text", "name": "s"}'),
        ("lone surrogate in a system message", "POST", "/v1/documents", b'{"text": "ok text", "system": "\\udc80"}'),
        ("empty question", "POST", "/v1/chat/completions", doc_chat("   ")),
        ("NUL document", "POST", "/v1/documents", {"text": "\x00" * 100, "name": "nul"}),
        ("empty document", "POST", "/v1/documents", {"text": "", "name": "empty"}),
        ("top_k 2**32+1", "POST", "/v1/chat/completions", doc_chat("hi", top_k=2**32 + 1)),
        ("negative temperature", "POST", "/v1/chat/completions", doc_chat("hi", temperature=-1)),
        ("top_p 0", "POST", "/v1/chat/completions", doc_chat("hi", top_p=0)),
        ("max_tokens 0", "POST", "/v1/chat/completions", doc_chat("hi", max_tokens=0)),
        ("huge seed", "POST", "/v1/chat/completions", doc_chat("hi", seed=2**70)),
        ("900 KB name", "POST", "/v1/documents", {"text": "a short text", "name": "n" * 900_000}),
        ("2 MB body", "POST", "/v1/documents", {"text": "word " * 400_000}),
        ("PML with a DTD", "POST", "/v1/schemas", {"pml": '<!DOCTYPE x [<!ENTITY e "e">]><schema name="x">&e;'
                                                          '</schema>'}),
        ("schema not PML", "POST", "/v1/schemas", {"pml": "<html></html>"}),
        ("delete unknown document", "DELETE", "/v1/documents/nope", None),
        ("completion against unknown schema", "POST", "/v1/completions", {"prompt": '<prompt schema="nope"/>'}),
    ]


def hostile_input(server: Server) -> dict:
    server.add(DOCS[0], "harbor")
    rows, leaks = [], []
    for what, method, path, body in hostile_requests():
        raw = body if isinstance(body, bytes) else None
        status, answer = server.request(method, path, None if raw is not None else body, raw=raw)
        text = json.dumps(answer) if not isinstance(answer, str) else answer
        if "/" + "root" in text or "Traceback" in text or "/tmp/" in text or "site-packages" in text:
            leaks.append(what)
        rows.append({"what": what, "status": status})
    counts = {"4xx": sum(400 <= r["status"] < 500 for r in rows), "5xx": sum(r["status"] >= 500 for r in rows),
              "accepted": sum(r["status"] < 400 for r in rows)}
    return {"requests": len(rows), **counts, "leaks": leaks, "rows": rows}


def kill_during_add(store: Path, model: str, threads: int, moments=(0.3, 1.0, 3.0)) -> list[dict]:
    rows = []
    for moment in moments:
        trial = Path(tempfile.mkdtemp(dir=store))
        server = Server(trial, model, threads)
        kept = [server.add(DOCS[0], "harbor"), server.add(DOCS[1], "railway")]
        threading.Thread(target=lambda: _ignore(lambda: server.add(long_text(), "ledger")), daemon=True).start()
        time.sleep(moment)
        server.stop(kill=True)
        verify = subprocess.run([sys.executable, "-m", "pc_cpu.cli", "store", "verify", "--store", str(trial)],
                                capture_output=True, text=True)
        server = Server(trial, model, threads)
        status, listing = server.request("GET", "/v1/documents")
        names = {n for d in listing["data"] for n in d.get("names", [])} if status == 200 else set()
        answers = [server.chat(QUESTIONS[0], [doc_id]) for doc_id in kept]
        ledger_ok = "ledger" not in names or bool(server.chat("What is in the ledger?", ["ledger"]))
        server.stop()
        rows.append({"kill_after_s": moment, "kept_listed": {"harbor", "railway"} <= names,
                     "kept_answer": all(answers), "interrupted_doc": "registered" if "ledger" in names else "absent",
                     "interrupted_doc_answers": ledger_ok, "verify_rc": verify.returncode,
                     "verify_out": (verify.stdout + verify.stderr).strip().splitlines()[-3:]})
    return rows


def _ignore(fn) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001  (the server was killed under it: expected)
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip", action="append", default=[], choices=("company", "latency", "hostile", "kill"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pc_cpu-reliability-") as tmp:
        store = Path(tmp)
        report = {}
        for name, run in (("company", same_answer_in_any_company), ("latency", latency_while_adding),
                          ("hostile", hostile_input)):
            if name in args.skip:
                continue
            server = Server(store / name, args.model, args.threads)
            try:
                report[name] = run(server)
            finally:
                server.stop()
            print(json.dumps({name: report[name]}), flush=True)
        if "kill" not in args.skip:
            report["kill"] = kill_during_add(store, args.model, args.threads)
            print(json.dumps({"kill": report["kill"]}), flush=True)


if __name__ == "__main__":
    main()
