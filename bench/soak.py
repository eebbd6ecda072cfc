"""Soak of a real `pc-cpu serve`: four clients for N minutes, its memory, files and latency watched, its answers replayed.

What it runs (one private temporary store; nothing touches the user's):
1. `pc-cpu serve` on a free loopback port with a small RAM tier (--ram-bytes), examples/demo.pml
   loaded, and a document library of invented texts (examples/*.txt, the demo's, synthesized ones).
2. Long prompts, one at a time (a document, a conversation and an exact-prefix question of ~85%
   of the context): llama.cpp's compute buffers and pc_cpu's state buffers get their pages touched
   by the first prompt that long, so after them growth is a leak, not a first touch.
3. Four clients at once, two through the `openai` client and two through plain httpx: conversations
   (continued, edited with and without after_edit="reuse", abandoned), questions over documents
   ("accurate" and the default "fast"), conversations over documents, PML completions, document
   adds (new, again: deduplicated, longer than the context: refused) and removes, streams hung up
   after a few pieces, and hostile requests (each must be a 4xx). Greedy decoding, 16-48 tokens.
   The first part of this phase is warm-up too (thread pools, allocator arenas); the rest is judged.
4. Every --interval seconds: the server's RSS, open files and threads (/proc/<pid>), GET /v1/stats,
   the store's size on disk, and that window's TTFT (p50/p99).
5. After the clients stop: every slot must be free; the server is stopped (SIGTERM) and its log
   searched for tracebacks. Then a sample of the answered requests whose answer pc_cpu promises
   does not depend on history is sent again, one at a time, to a fresh server (new process, new
   empty store, same model and schema), and the answers compared text for text.

Exit code 0 when every goal judged is met, 1 otherwise (the goals missed are printed); a goal that
could not be judged (too short a run) is printed as such and does not fail the run.

    python bench/soak.py --minutes 60 [--model smollm2-135m] [--ram-bytes 256M] [--out PATH]
    python bench/soak.py --minutes 2          # a short run, for development
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script from anywhere: soak_workload is beside it
from soak_workload import (DEMO_QUESTIONS, Client, ClientSettings, DocumentPool, HttpxTransport,  # noqa: E402
                           Lulls, OpenAITransport, Outcome, Replay, RequestRecord, demo_documents, expectation_met,
                           invented_document, text_of_tokens)

from pc_cpu.server.process import entries, status_bytes  # noqa: E402  (this process's /proc reads, for the server's pid)

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "examples" / "demo.pml"
SERVER_IMPORTS = "pc_cpu.cache, pc_cpu.server.app, llama_cpp, fastapi, uvicorn"  # what `pc-cpu serve` imports
ANSWER_KINDS = ("chat", "chat_reuse", "docs_fast", "docs_accurate", "docs_chat", "pml", "pml_param", "hangup")
REPLAY_KINDS = ("chat", "docs_accurate", "pml")
REPLAY_POLICY = ("Replayed on a fresh server: plain chats (after_edit \"recompute\", the default), questions over "
                 "documents with setting \"accurate\", PML completions without a <param>. Not replayed: "
                 "after_edit=\"reuse\" (not exact by design), setting \"fast\" and conversations over documents (a "
                 "new combination answers from encodings whose stand-ins depend on what the library held), PML with "
                 "a <param> (its argument is computed in the library context), hung-up streams, refusals.")

# Goal thresholds (the soak's contract; the output repeats each with the figures it judged).
RSS_FLAT = 1.05  # max RSS after the RAM tier is >= 90% full, over the RSS then
RAM_FULL = 0.90
FD_SLACK = 16  # transient descriptors: 4 clients x 2 connections, the sampler's, a few store files in use
TTFT_DRIFT = 1.25  # p99 of the last edge over p99 of the first, per request kind
TTFT_MIN_SAMPLES = 10  # per kind and edge, else that kind is not judged
EDGE_SHARE, EDGE_MIN_S = 0.10, 60.0  # edges: the first and last 10% of the judged phase, at least 60 s
STORE_FILE_SLACK = 16 << 20  # besides the document library and one entry being written: temp files


# --- the server ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def interpreter_baseline_rss() -> int:
    """Returns the RSS (bytes) of a Python process that imports what the server imports, and nothing more."""
    code = (f"import {SERVER_IMPORTS}\n"
            "print(next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmRSS:')))")
    return int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                              cwd=ROOT).stdout.strip())


@dataclass(frozen=True)
class ServerOptions:
    """The flags every server of one soak gets (the soak's and the fresh one the answers are replayed on)."""

    model: str
    ram_bytes: str
    disk_bytes: str
    parallel: int
    n_ctx: Optional[int]
    threads: Optional[int]
    max_body_bytes: int
    env: tuple[tuple[str, str], ...] = ()  # extra environment, e.g. MALLOC_ARENA_MAX=2 to test a growth's cause


class ServerProcess:
    """`pc-cpu serve` in a child process on a free loopback port, with its own store; its output goes to `log`."""

    def __init__(self, options: ServerOptions, store: Path, log: Path, start_timeout_s: float = 900):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.store = store
        self.log = log
        command = [sys.executable, "-m", "pc_cpu.cli", "serve", "--port", str(self.port), "--store", str(store),
                   "--model", options.model, "--schema", str(SCHEMA), "--ram-bytes", options.ram_bytes,
                   "--disk-bytes", options.disk_bytes, "--parallel", str(options.parallel),
                   "--max-body-bytes", str(options.max_body_bytes)]
        if options.n_ctx:
            command += ["--n-ctx", str(options.n_ctx)]
        if options.threads:
            command += ["--threads", str(options.threads)]
        self._log_file = open(log, "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     env={**os.environ, **dict(options.env)})
        self.pid = self.proc.pid
        self._wait_ready(start_timeout_s)
        self.start_s = time.monotonic() - t0

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.proc.returncode} before it was ready; "
                                   f"its log ({self.log}) ends:\n{log_tail(self.log)}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.kill()
        raise RuntimeError(f"the server was not ready after {timeout_s:.0f} s; its log ends:\n{log_tail(self.log)}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 60) -> Optional[float]:
        """Returns the seconds SIGTERM took to end the server, or None when it had to be killed."""
        t0 = time.monotonic()
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
            took = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            self.kill()
            took = None
        self._log_file.close()
        return took

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait(30)


def log_tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@dataclass(frozen=True)
class LogScan:
    """What a server's log holds that a healthy run must not have."""

    tracebacks: int
    error_lines: int
    excerpts: tuple[str, ...]  # the first tracebacks and error lines, a few lines each


def scan_log(path: Path, keep: int = 5) -> LogScan:
    """Returns the tracebacks and ERROR lines of a server log, with excerpts of the first `keep`."""
    lines = path.read_text(errors="replace").splitlines()
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    errors = [i for i, line in enumerate(lines) if line.startswith("ERROR") or " ERROR " in line[:40]]
    starts = sorted(set(tracebacks) | set(errors))[:keep]
    excerpts = tuple("\n".join(lines[max(0, i - 1):i + 12]) for i in starts)
    return LogScan(len(tracebacks), len(errors), excerpts)


# --- what the soak watches ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """The soak's phases, each ending at a time in seconds since the server was ready (monotonic clock)."""

    t0: float  # time.monotonic() when the server answered /health
    setup_end_s: float = math.inf  # the pinned documents are added
    long_end_s: float = math.inf  # the long prompts are done, the clients start
    warmup_end_s: float = math.inf  # judging starts
    main_end_s: float = math.inf  # the clients are told to stop

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def phase_at(self, t_s: float) -> str:
        """Returns "setup", "long", "warmup", "main" or "drain": the phase at `t_s`."""
        for phase, end in (("setup", self.setup_end_s), ("long", self.long_end_s), ("warmup", self.warmup_end_s),
                           ("main", self.main_end_s)):
            if t_s < end:
                return phase
        return "drain"

    def to_dict(self) -> dict:
        return {key: (None if isinstance(value, float) and math.isinf(value) else round(value, 1))
                for key, value in dataclasses.asdict(self).items() if key != "t0"}


class RequestLog:
    """Every request of the soak, kept in memory and appended to the JSONL output as it completes."""

    def __init__(self, out, clock: "Clock"):
        self.records: list[RequestRecord] = []
        self._out = out
        self._clock = clock
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def record(self, client, kind: str, path: str, outcome: Outcome, expected: str, t0: float, *,
               replay: Optional[Replay] = None, not_replayed: Optional[str] = None,
               problem: Optional[str] = None, streamed: bool = False) -> RequestRecord:
        """Returns the record of one finished request (`t0`: time.monotonic() when it was sent)."""
        usage = outcome.usage or {}
        ok = expectation_met(expected, outcome) and problem is None
        answered = ok and outcome.status == 200 and not outcome.hung_up
        t_start = t0 - self._clock.timeline.t0
        record = RequestRecord(
            id=next(self._ids), client=getattr(client, "name", str(client)),
            transport=getattr(getattr(client, "transport", None), "name", "httpx"), kind=kind, path=path,
            t_start_s=round(t_start, 3), t_end_s=round(self._clock.timeline.now_s(), 3),
            phase=self._clock.timeline.phase_at(t_start), status=outcome.status, expected=expected, ok=ok,
            streamed=streamed, hung_up=outcome.hung_up,
            error=problem or outcome.error, text=outcome.text, ttft_client_ms=_round(outcome.ttft_client_ms),
            ttft_server_ms=usage.get("ttft_ms"), latency_ms=round(outcome.latency_ms, 1),
            prompt_tokens=usage.get("prompt_tokens"), cached_tokens=usage.get("cached_tokens"), tiers=outcome.tiers,
            not_replayed=not_replayed if answered else None, replay=replay if answered else None)
        if hasattr(client, "last_status"):
            client.last_status = outcome.status
        with self._lock:
            self.records.append(record)
            self._out.write({"type": "request", **dataclasses.asdict(record)})
        return record


@dataclass
class Clock:
    """The timeline, replaced as phases end (a frozen Timeline per phase keeps every reader consistent)."""

    timeline: Timeline


@dataclass(frozen=True)
class Window:
    """One sample: the server process, its /v1/stats, the store on disk, and the requests finished since the last."""

    t_s: float
    phase: str
    rss_bytes: Optional[int]
    rss_anon_bytes: Optional[int]  # heap and anonymous maps: where a leak shows
    rss_file_bytes: Optional[int]  # mapped files: the model's weights
    open_files: Optional[int]
    threads: Optional[int]
    stats: Optional[dict]  # GET /v1/stats, None when it did not answer
    stats_error: Optional[str]
    store_bytes: int  # on disk (allocated blocks), the document library included
    library_bytes: int  # <store>/documents/
    largest_entry_bytes: int
    requests: int
    failed: int
    ttft_client_p50_ms: Optional[float]
    ttft_client_p99_ms: Optional[float]
    ttft_client_n: int
    ttft_server_p50_ms: Optional[float]
    ttft_server_p99_ms: Optional[float]
    ttft_server_n: int

    def ram(self) -> Optional[dict]:
        return self.stats["tiers"]["ram"] if self.stats else None

    def disk(self) -> Optional[dict]:
        return self.stats["tiers"]["disk"] if self.stats else None


def store_sizes(store: Path) -> tuple[int, int, int]:
    """Returns (bytes on disk of the whole store, of its document library, of its largest entry file)."""
    total = library = largest = 0
    for path in store.rglob("*"):
        try:
            st = path.lstat()
        except OSError:
            continue  # evicted between listing and looking
        if not path.is_file():
            continue
        size = st.st_blocks * 512
        total += size
        if "documents" in path.relative_to(store).parts:
            library += size
        elif path.suffix == ".pcs":
            largest = max(largest, st.st_size)
    return total, library, largest


def percentile(values: list[float], p: float) -> Optional[float]:
    """Returns the nearest-rank `p`th percentile (p in [0, 100]), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


class Sampler(threading.Thread):
    """Takes a Window every `interval_s` seconds, prints one line for it and appends it to the output."""

    def __init__(self, server: ServerProcess, clock: Clock, requests: RequestLog, out, interval_s: float):
        super().__init__(name="sampler", daemon=True)
        self.server, self.clock, self.requests, self.out = server, clock, requests, out
        self.interval_s = interval_s
        self.windows: list[Window] = []
        self.server_died_at_s: Optional[float] = None
        self.server_died = threading.Event()  # stops the clients early: nothing left to soak
        self._halt = threading.Event()
        self._http = httpx.Client(base_url=server.url, timeout=30)
        self._seen = 0  # records already counted in a window

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self._http.close()

    def sample(self) -> Window:
        """Returns the window taken now (also kept, printed and written)."""
        pid = self.server.pid
        rss, fds, threads = status_bytes("VmRSS", pid), entries("fd", pid), entries("task", pid)
        anon, mapped = status_bytes("RssAnon", pid), status_bytes("RssFile", pid)
        stats, stats_error = None, None
        if not self.server.alive():
            if self.server_died_at_s is None:
                self.server_died_at_s = self.clock.timeline.now_s()
                self.server_died.set()
            stats_error = f"the server exited with code {self.server.proc.returncode}"
        else:
            try:
                response = self._http.get("/v1/stats")
                stats = response.json() if response.status_code == 200 else None
                stats_error = None if stats else f"GET /v1/stats: {response.status_code}"
            except httpx.HTTPError as exc:
                stats_error = f"GET /v1/stats: {type(exc).__name__}: {exc}"
        store, library, largest = store_sizes(self.server.store)
        records = self.requests.records[self._seen:]
        self._seen += len(records)
        client = [r.ttft_client_ms for r in records if r.ok and r.ttft_client_ms is not None]
        server = [r.ttft_server_ms for r in records if r.ok and r.ttft_server_ms is not None]
        t_s = self.clock.timeline.now_s()
        window = Window(round(t_s, 1), self.clock.timeline.phase_at(t_s), rss, anon, mapped, fds, threads, stats,
                        stats_error,
                        store, library, largest, len(records), sum(not r.ok for r in records),
                        percentile(client, 50), percentile(client, 99), len(client),
                        percentile(server, 50), percentile(server, 99), len(server))
        self.windows.append(window)
        self.out.write({"type": "window", **dataclasses.asdict(window)})
        print(window_line(window), flush=True)
        return window


def window_line(w: Window) -> str:
    """Returns the one line printed for a window."""
    head = (f"[{w.t_s:6.0f}s {w.phase:<6}] rss {_gib(w.rss_bytes)} (anon {_gib(w.rss_anon_bytes)}) fds {w.open_files}"
            f" thr {w.threads}")
    if w.stats:
        ram, disk, q = w.stats["tiers"]["ram"], w.stats["tiers"]["disk"], w.stats["queues"]
        head += (f" | ram {ram['bytes_used'] / 2**20:.0f}/{ram['budget_bytes'] / 2**20:.0f}M"
                 f" disk {_gib(disk['bytes_used'])}/{_gib(disk['budget_bytes'])} dir {_gib(w.store_bytes)}"
                 f" tips {w.stats['conversation_tips']} docs {w.stats['documents']}"
                 f" | act {q['active']} wait {q['waiting']} str {w.stats['active_streams']} idle {q['idle_tasks']}")
    else:
        head += f" | stats: {w.stats_error}"
    return (head + f" | req {w.requests} fail {w.failed} | ttft ms client p50/p99 {_ms(w.ttft_client_p50_ms)}/"
            f"{_ms(w.ttft_client_p99_ms)} (n {w.ttft_client_n}) server {_ms(w.ttft_server_p50_ms)}/"
            f"{_ms(w.ttft_server_p99_ms)} (n {w.ttft_server_n})")


def _gib(value: Optional[int]) -> str:
    return "?" if value is None else f"{value / 2**30:.2f}G"


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.0f}"


def _round(value: Optional[float]) -> Optional[float]:
    return None if value is None else round(value, 1)


class JsonLines:
    """The output file: one JSON object a line, flushed as written (a run that dies keeps what it saw)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "w")
        self._lock = threading.Lock()

    def write(self, row: dict) -> None:
        with self._lock:
            self._file.write(json.dumps(row, default=str) + "\n")
            self._file.flush()

    def close(self) -> None:
        self._file.close()


# --- the phases ------------------------------------------------------------------------------------


def build_documents(seed: int) -> tuple[dict[str, str], dict[str, str], dict[str, tuple[str, ...]]]:
    """Returns (pinned name -> text, churned name -> text, name -> questions): the repository's and invented ones."""
    rng = random.Random(seed)
    pinned, questions = demo_documents(), dict(DEMO_QUESTIONS)
    for i, sentences in enumerate((8, 14, 20, 26, 34)):
        doc = invented_document(rng, sentences)
        pinned[f"town-{i}"] = doc.text
        questions[f"town-{i}"] = doc.questions
    churned = {}
    for i in range(10):
        doc = invented_document(rng, rng.randint(4, 24))
        churned[f"churn-{i}"] = doc.text
        questions[f"churn-{i}"] = doc.questions
    return pinned, churned, questions


def document_combos(names: list[str], seed: int) -> list[tuple[str, ...]]:
    """Returns the combinations questions ask about: each document alone, some pairs and triples (so they repeat)."""
    rng = random.Random(seed)
    return [(name,) for name in names] + [tuple(rng.sample(names, 2)) for _ in range(5)] + \
        [tuple(rng.sample(names, 3)) for _ in range(3)]


def add_pinned_documents(transport: HttpxTransport, pool: DocumentPool, log: RequestLog) -> float:
    """Adds the pinned documents; returns the characters per token of the invented ones (to size long texts)."""
    chars = tokens = 0
    for name, text in pool.pinned.items():
        t0 = time.monotonic()
        outcome = transport.add_document(text, name)
        log.record("setup", "setup_doc_add", "/v1/documents", outcome, "200", t0)
        if outcome.status != 200:
            raise RuntimeError(f"adding pinned document {name} failed: {outcome.status} {outcome.error}")
        pool.learn(name, outcome.json["id"])
        if name.startswith("town-"):
            chars, tokens = chars + len(text), tokens + outcome.json["tokens"]
    return chars / tokens


def run_long_prompts(transport: HttpxTransport, log: RequestLog, n_ctx: int, chars_per_token: float,
                     seed: int, share: float) -> None:
    """Sends a document, a conversation and an exact-prefix question of `share` of the context, one at a time."""
    rng = random.Random(seed)
    for attempt in range(4):  # a text the tokenizer finds longer than estimated is refused: shrink it
        text = text_of_tokens(rng, int(n_ctx * share), chars_per_token)
        t0 = time.monotonic()
        outcome = transport.add_document(text, "long-warmup")
        log.record("long", "long_doc_add", "/v1/documents", outcome, "200|400", t0)
        if outcome.status == 200:
            break
        share *= 0.9
    question = "Which town is named first in the text, and who founded it?"
    long_chat = {"messages": [{"role": "user", "content": text_of_tokens(rng, int(n_ctx * share), chars_per_token)
                               + "\n\n" + question}], "max_tokens": 16, "temperature": 0}
    long_ask = {"messages": [{"role": "user", "content": question}], "documents": ["long-warmup"],
                "setting": "accurate", "max_tokens": 16, "temperature": 0}
    for kind, body in (("long_chat", long_chat), ("long_docs_accurate", long_ask)):
        t0 = time.monotonic()
        outcome = transport.answer("/v1/chat/completions", body)
        log.record("long", kind, "/v1/chat/completions", outcome, "200", t0)
        print(f"  {kind}: {outcome.status} in {outcome.latency_ms / 1000:.1f} s, "
              f"{(outcome.usage or {}).get('prompt_tokens')} prompt tokens", flush=True)


def wait_quiet(url: str, timeout_s: float, *, idle_tasks: bool) -> tuple[bool, float, Optional[dict]]:
    """Returns (whether no prompt runs, waits or streams (and, if asked, no idle task waits), seconds waited, last stats)."""
    t0 = time.monotonic()
    stats = None
    with httpx.Client(base_url=url, timeout=30) as http:
        while True:
            try:
                stats = http.get("/v1/stats").json()
                q = stats["queues"]
                if q["active"] == 0 and q["waiting"] == 0 and stats["active_streams"] == 0 and \
                        (not idle_tasks or q["idle_tasks"] == 0):
                    return True, time.monotonic() - t0, stats
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if time.monotonic() - t0 > timeout_s:
                return False, time.monotonic() - t0, stats
            time.sleep(1)


def run_clients(url: str, pool: DocumentPool, settings: ClientSettings, log: RequestLog, seed: int,
                seconds: float, server_died: threading.Event) -> list[Client]:
    """Runs the four clients for `seconds` (less if the server dies); returns them once each has finished its last request."""
    stop = threading.Event()
    clients = []
    for i, kind in enumerate(("openai", "httpx", "openai", "httpx")):
        transport = (OpenAITransport if kind == "openai" else HttpxTransport)(url, settings.timeout_s)
        clients.append(Client(f"{kind}-{i}", transport, pool, settings, seed * 100 + i, log.record, stop,
                              stream_share=0.8 if kind == "openai" else 0.5))
    for client in clients:
        client.start()
    server_died.wait(seconds)
    stop.set()
    for client in clients:
        client.join(settings.timeout_s + 60)
    return clients


# --- the replay ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayResult:
    """One answer of the soak asked again on the fresh server."""

    request_id: int
    kind: str
    t_start_s: float
    same: bool
    soak_text: str
    replay_text: Optional[str]
    status: Optional[int]
    error: Optional[str] = None
    first_difference: Optional[int] = None  # character index where the texts part


def replay_sample(records: list[RequestRecord], n: int) -> list[RequestRecord]:
    """Returns up to `n` replayable answers, shared among the kinds as evenly as they allow, each kind's spread over the run."""
    by_kind = {kind: sorted((r for r in records if r.replay is not None and r.replay.kind == kind
                             and r.phase in ("warmup", "main")), key=lambda r: r.t_start_s)
               for kind in REPLAY_KINDS}
    quota = {kind: 0 for kind in REPLAY_KINDS}
    for _ in range(n):  # one at a time to the kind furthest below its share that still has answers left
        open_kinds = [k for k in REPLAY_KINDS if quota[k] < len(by_kind[k])]
        if not open_kinds:
            break
        quota[min(open_kinds, key=lambda k: quota[k])] += 1
    chosen = []
    for kind, items in by_kind.items():
        step = len(items) / quota[kind] if quota[kind] else 0
        chosen += [items[int(i * step + step / 2)] for i in range(quota[kind])]
    return sorted(chosen, key=lambda r: r.t_start_s)


def replay(sample: list[RequestRecord], options: ServerOptions, store: Path, log_path: Path,
           timeout_s: float, out: JsonLines) -> tuple[list[ReplayResult], Optional[float]]:
    """Returns the sample's answers from a fresh server, and the seconds its SIGTERM took (None: killed).

    Raises:
        RuntimeError: the fresh server did not start, or refused a document the sample needs.
    """
    server = ServerProcess(options, store, log_path)
    print(f"fresh server ready in {server.start_s:.0f} s (pid {server.pid}); replaying {len(sample)} answers",
          flush=True)
    transport = HttpxTransport(server.url, timeout_s)
    try:
        add_replay_documents(transport, sample)
        results = [replay_one(transport, record, out) for record in sample]
    finally:
        transport.close()
        stop_s = server.stop()
    return results, stop_s


def add_replay_documents(transport: HttpxTransport, sample: list[RequestRecord]) -> None:
    """Adds the documents the sample's questions name, under the same names (the same text gets the same id)."""
    documents = {name: text for r in sample for name, text in r.replay.documents.items()}
    for name, text in documents.items():
        outcome = transport.add_document(text, name)
        if outcome.status != 200:
            raise RuntimeError(f"the fresh server refused document {name}: {outcome.status} {outcome.error}")


def replay_one(transport: HttpxTransport, record: RequestRecord, out: JsonLines) -> ReplayResult:
    """Returns how the fresh server answered `record`'s request (not streamed: the text is the same either way)."""
    outcome = transport.answer(record.replay.path, {**record.replay.body, "stream": False})
    same = outcome.status == 200 and outcome.text == record.text
    result = ReplayResult(record.id, record.replay.kind, record.t_start_s, same, record.text, outcome.text,
                          outcome.status, outcome.error,
                          None if same or outcome.text is None else first_difference(record.text, outcome.text))
    out.write({"type": "replay", **dataclasses.asdict(result)})
    if not same:
        print(f"  DIFFERENT: request {record.id} ({record.replay.kind}, t={record.t_start_s:.0f}s): "
              f"soak {record.text!r} / fresh {outcome.text!r} {outcome.error or ''}", flush=True)
    return result


def first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# --- the goals ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """One goal of the soak: met (True), missed (False) or not judged (None), with the figures judged."""

    name: str
    met: Optional[bool]
    detail: str


@dataclass
class RunFacts:
    """Everything the goals are judged on."""

    records: list[RequestRecord]
    windows: list[Window]
    timeline: Timeline
    memory: dict  # /v1/stats "memory": weights, kv, compute, state_buffers, ram_tier, bound, ...
    baseline_rss: int  # the interpreter with the server's imports
    final_stats: Optional[dict]
    quiet_after_clients: bool
    quiet_wait_s: float
    soak_log: LogScan
    replay_log: Optional[LogScan]
    replays: list[ReplayResult]
    stop_s: Optional[float]  # SIGTERM to exit, None: killed
    replay_stop_s: Optional[float]
    server_died_at_s: Optional[float]
    client_crashes: list[str] = field(default_factory=list)
    replay_error: Optional[str] = None  # the fresh server could not start or take the documents


def judge(facts: RunFacts) -> list[Goal]:
    """Returns every goal of the soak, judged on `facts`."""
    return [goal_no_failed_requests(facts), goal_no_tracebacks(facts), goal_rss_under_bound(facts),
            goal_rss_flat(facts), goal_open_files_flat(facts), goal_ttft_steady(facts), goal_replays_identical(facts),
            goal_store_within_budgets(facts), goal_slots_freed(facts), goal_clean_shutdown(facts)]


def goal_no_failed_requests(facts: RunFacts) -> Goal:
    failed = [r for r in facts.records if not r.ok]
    by = {}
    for r in failed:
        by.setdefault(f"{r.kind} -> {r.status}", []).append(r)
    examples = "; ".join(f"{key}: {len(rs)}x, e.g. request {rs[0].id} at {rs[0].t_start_s:.0f}s: {rs[0].error}"
                         for key, rs in list(by.items())[:8])
    crashed = f"; client threads crashed: {len(facts.client_crashes)}" if facts.client_crashes else ""
    died = f"; the server died at {facts.server_died_at_s:.0f}s" if facts.server_died_at_s is not None else ""
    fivexx = sum(1 for r in facts.records if r.status is not None and r.status >= 500)
    noconn = sum(1 for r in facts.records if r.status is None)
    met = not failed and not facts.client_crashes and facts.server_died_at_s is None
    return Goal("0 failed requests", met,
                f"{len(facts.records)} requests, {len(failed)} failed ({fivexx} 5xx, {noconn} without an HTTP answer)"
                f"{': ' + examples if examples else ''}{crashed}{died}")


def goal_no_tracebacks(facts: RunFacts) -> Goal:
    scans = [("soak server", facts.soak_log)] + ([("fresh server", facts.replay_log)] if facts.replay_log else [])
    count = sum(scan.tracebacks for _, scan in scans)
    detail = ", ".join(f"{name}: {scan.tracebacks} tracebacks, {scan.error_lines} ERROR lines" for name, scan in scans)
    return Goal("0 tracebacks in the server logs", count == 0, detail)


def goal_rss_under_bound(facts: RunFacts) -> Goal:
    bound = facts.memory["bound"] + facts.baseline_rss
    rss = [w.rss_bytes for w in facts.windows if w.rss_bytes is not None]
    peak = (facts.final_stats or {}).get("process", {}).get("peak_rss_bytes")
    highest = max(rss + ([peak] if peak else []), default=None)
    if highest is None:
        return Goal("RSS under the bound", None, "no RSS sample")
    return Goal("RSS under the bound", highest <= bound,
                f"max sampled {_gib(max(rss))}, peak (ru_maxrss) {_gib(peak)} <= memory.bound {_gib(facts.memory['bound'])}"
                f" + interpreter baseline {_gib(facts.baseline_rss)} = {_gib(bound)}")


def goal_rss_flat(facts: RunFacts) -> Goal:
    name = f"RSS flat (<= {RSS_FLAT:.2f}x) once the RAM tier is >= {RAM_FULL:.0%} full"
    judged = [w for w in facts.windows if w.phase in ("main", "drain") and w.rss_bytes is not None]
    start = next((i for i, w in enumerate(judged)
                  if w.phase == "main" and w.ram() and w.ram()["bytes_used"] >= RAM_FULL * w.ram()["budget_bytes"]),
                 None)
    if start is None:
        return Goal(name, None, "the RAM tier never reached 90% of its budget after warm-up: lower --ram-bytes or "
                                "run longer")
    ref = judged[start]
    top = max(judged[start:], key=lambda w: w.rss_bytes)
    ratio = top.rss_bytes / ref.rss_bytes
    return Goal(name, ratio <= RSS_FLAT, f"{_gib(ref.rss_bytes)} at {ref.t_s:.0f}s (RAM tier "
                f"{ref.ram()['bytes_used'] / ref.ram()['budget_bytes']:.0%} full), max after {_gib(top.rss_bytes)} "
                f"at {top.t_s:.0f}s: {ratio:.3f}x; {rss_beside_tier_trend(judged[start:])}")


def rss_beside_tier_trend(windows: list[Window]) -> str:
    """Returns the median RSS minus the RAM tier's bytes in the first and last tenth of `windows`, as a sentence.

    Not judged: it tells a leak (both the max and this grow) from the RAM tier and the buffers of
    prompts in flight coming and going (the max moves, this does not).
    """
    beside = [w.rss_bytes - w.ram()["bytes_used"] for w in windows if w.ram()]
    if len(beside) < 2:
        return "too few windows for a trend"
    tenth = max(1, len(beside) // 10)
    first, last = sorted(beside[:tenth])[(tenth - 1) // 2], sorted(beside[-tenth:])[(tenth - 1) // 2]
    return (f"RSS minus the RAM tier, median of the first and last {tenth} window(s): {first / 2**20:.0f} -> "
            f"{last / 2**20:.0f} MiB ({last / first:.3f}x, not judged)")


def goal_open_files_flat(facts: RunFacts) -> Goal:
    name = f"open files flat (<= first judged window + {FD_SLACK})"
    judged = [w for w in facts.windows if w.phase in ("main", "drain") and w.open_files is not None]
    if not judged:
        return Goal(name, None, "no window after warm-up")
    top = max(judged, key=lambda w: w.open_files)
    threads = [w.threads for w in judged if w.threads is not None]
    return Goal(name, top.open_files <= judged[0].open_files + FD_SLACK,
                f"{judged[0].open_files} at {judged[0].t_s:.0f}s, max {top.open_files} at {top.t_s:.0f}s "
                f"(slack {FD_SLACK}: 4 clients x 2 connections, the sampler's, store files in use); threads "
                f"{min(threads, default=None)}..{max(threads, default=None)} (not judged)")


def ttft_edges(timeline: Timeline) -> tuple[tuple[float, float], tuple[float, float]]:
    """Returns the first and last edge of the judged phase, (start_s, end_s) each."""
    start, end = timeline.warmup_end_s, timeline.main_end_s
    edge = min(max(EDGE_SHARE * (end - start), EDGE_MIN_S), (end - start) / 3)
    return (start, start + edge), (end - edge, end)


def goal_ttft_steady(facts: RunFacts) -> Goal:
    name = f"TTFT p99 steady (last edge <= {TTFT_DRIFT}x first, per kind)"
    (a0, a1), (b0, b1) = ttft_edges(facts.timeline)
    rows, missed, judged = [], [], 0
    for kind in ANSWER_KINDS + ("all",):
        def ttfts(lo, hi, key):
            return [getattr(r, key) for r in facts.records if r.ok and lo <= r.t_start_s < hi
                    and getattr(r, key) is not None and (kind == "all" or r.kind == kind)]
        first, last = ttfts(a0, a1, "ttft_client_ms"), ttfts(b0, b1, "ttft_client_ms")
        s_first, s_last = ttfts(a0, a1, "ttft_server_ms"), ttfts(b0, b1, "ttft_server_ms")
        server = (f"; server {_ms(percentile(s_first, 99))}->{_ms(percentile(s_last, 99))}"
                  if s_first and s_last else "")
        if len(first) < TTFT_MIN_SAMPLES or len(last) < TTFT_MIN_SAMPLES:
            rows.append(f"{kind}: not judged (n {len(first)}/{len(last)}){server}")
            continue
        judged += 1
        ratio = percentile(last, 99) / percentile(first, 99)
        if ratio > TTFT_DRIFT:
            missed.append(kind)
        rows.append(f"{kind}: {_ms(percentile(first, 99))}->{_ms(percentile(last, 99))} ms ({ratio:.2f}x, "
                    f"n {len(first)}/{len(last)}){server}")
    definition = (f"client-side TTFT of streamed answers (to the first chunk with content), p99 by nearest rank, "
                  f"requests started in [{a0:.0f}, {a1:.0f}) s vs [{b0:.0f}, {b1:.0f}) s; kinds with fewer than "
                  f"{TTFT_MIN_SAMPLES} in an edge are not judged; server = usage.ttft_ms p99 (not judged)")
    met = None if judged == 0 else not missed
    return Goal(name, met, definition + ". " + "; ".join(rows))


def goal_replays_identical(facts: RunFacts) -> Goal:
    name = "every replayed answer identical on a fresh server"
    if facts.replay_error:
        return Goal(name, False, f"the replay failed: {facts.replay_error}")
    if not facts.replays:
        return Goal(name, None, "nothing replayed")
    same = sum(r.same for r in facts.replays)
    kinds = ", ".join(f"{k} {sum(r.same for r in facts.replays if r.kind == k)}/"
                      f"{sum(r.kind == k for r in facts.replays)}" for k in REPLAY_KINDS)
    differing = "; ".join(f"request {r.request_id} ({r.kind}) at char {r.first_difference}: {r.soak_text!r} vs "
                          f"{r.replay_text!r}{' ' + r.error if r.error else ''}"
                          for r in facts.replays if not r.same)[:2000]
    return Goal(name, same == len(facts.replays), f"{same}/{len(facts.replays)} ({kinds})"
                f"{'; different: ' + differing if differing else ''}")


def goal_store_within_budgets(facts: RunFacts) -> Goal:
    name = "store within its budgets"
    sampled = [w for w in facts.windows if w.stats]
    if not sampled:
        return Goal(name, None, "no /v1/stats sample")
    over = []
    for w in sampled:
        ram, disk = w.ram(), w.disk()
        slack = w.library_bytes + w.largest_entry_bytes + STORE_FILE_SLACK
        if ram["bytes_used"] > ram["budget_bytes"]:
            over.append(f"RAM {ram['bytes_used']} > {ram['budget_bytes']} at {w.t_s:.0f}s")
        if disk["bytes_used"] > disk["budget_bytes"]:
            over.append(f"disk {disk['bytes_used']} > {disk['budget_bytes']} at {w.t_s:.0f}s")
        if w.store_bytes > disk["budget_bytes"] + slack:
            over.append(f"directory {w.store_bytes} > {disk['budget_bytes']} + {slack} at {w.t_s:.0f}s")
    top_ram = max(sampled, key=lambda w: w.ram()["bytes_used"])
    top_disk = max(sampled, key=lambda w: w.disk()["bytes_used"])
    top_dir = max(sampled, key=lambda w: w.store_bytes)
    return Goal(name, not over,
                f"max RAM tier {top_ram.ram()['bytes_used'] / 2**20:.0f}/{top_ram.ram()['budget_bytes'] / 2**20:.0f} MiB, "
                f"disk tier {_gib(top_disk.disk()['bytes_used'])}/{_gib(top_disk.disk()['budget_bytes'])}, "
                f"directory {_gib(top_dir.store_bytes)} (slack: the document library, {_gib(top_dir.library_bytes)}, "
                f"+ the largest entry, one being written before the oldest leaves, + 16 MiB)"
                f"{'; over: ' + '; '.join(over[:5]) if over else ''}")


def goal_slots_freed(facts: RunFacts) -> Goal:
    q = (facts.final_stats or {}).get("queues", {})
    return Goal("every slot and stream freed after the clients stop", facts.quiet_after_clients,
                f"active/waiting/streams 0 after {facts.quiet_wait_s:.1f} s" if facts.quiet_after_clients else
                f"still active {q.get('active')}, waiting {q.get('waiting')}, streams "
                f"{(facts.final_stats or {}).get('active_streams')} after {facts.quiet_wait_s:.0f} s")


def goal_clean_shutdown(facts: RunFacts) -> Goal:
    stops = [("soak server", facts.stop_s)] + ([("fresh server", facts.replay_stop_s)] if facts.replays else [])
    return Goal("clean shutdown on SIGTERM (<= 60 s)", all(s is not None for _, s in stops),
                ", ".join(f"{n}: {'killed after 60 s' if s is None else f'{s:.1f} s'}" for n, s in stops))


# --- main ----------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the four clients run")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--ram-bytes", default="256M", help="the server's RAM tier: small, so it fills")
    parser.add_argument("--disk-bytes", default="2G")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--n-ctx", type=int, default=4096,
                        help="the server's context (0: the model's, up to 8192); 4096 keeps the long warm-up prompts "
                             "to minutes on 2 cores, and nothing the soak holds the server to depends on it")
    parser.add_argument("--long-share", type=float, default=0.85,
                        help="the long warm-up prompts' length, a share of the context (0: none, for developing "
                             "the soak only: growth after warm-up then includes first touches)")
    parser.add_argument("--lull-every", type=float, default=120.0,
                        help="seconds; the clients pause together at the end of each such period")
    parser.add_argument("--lull-seconds", type=float, default=15.0,
                        help="how long each pause lasts, so the server's idle work runs (0: never pause)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--server-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment for both servers (repeatable), e.g. MALLOC_ARENA_MAX=2")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup-minutes", type=float, default=None,
                        help="of the clients' time, not judged (default: 10%%, at least 1)")
    parser.add_argument("--replay", type=int, default=40, help="answers to replay on a fresh server (0: none)")
    parser.add_argument("--request-timeout", type=float, default=600.0, help="seconds; a request slower is a hang")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None,
                        help="JSONL output (default bench/results/soak_<model>_<date>.jsonl); the server logs go "
                             "beside it")
    args = parser.parse_args()
    if any("=" not in pair for pair in args.server_env):
        parser.error("--server-env takes KEY=VALUE")
    if args.n_ctx and args.n_ctx < 4096:
        parser.error("--n-ctx must be at least 4096: three documents and a conversation of the mix must fit")
    if args.out is None:
        args.out = ROOT / "bench" / "results" / f"soak_{args.model}_{time.strftime('%Y-%m-%d_%H%M')}.jsonl"
    return args


def main() -> int:
    args = parse_args()
    out = JsonLines(args.out)
    with tempfile.TemporaryDirectory(prefix="pc_cpu-soak-") as tmp:
        run = Soak(args, out, Path(tmp))
        try:
            facts = run.run()
        finally:
            run.server.kill()  # a soak that failed midway must not leave its server running
    goals = judge(facts)
    for goal in goals:
        out.write({"type": "goal", **dataclasses.asdict(goal)})
    summary = summarize(facts, goals)
    out.write({"type": "summary", **summary})
    out.close()
    print_report(facts, goals, summary, args.out)
    return 0 if all(goal.met is not False for goal in goals) else 1


class Soak:
    """One soak: its server, clock, request log and sampler, run phase by phase (`run`)."""

    def __init__(self, args: argparse.Namespace, out: JsonLines, tmp: Path):
        self.args, self.out, self.tmp = args, out, tmp
        self.options = ServerOptions(args.model, args.ram_bytes, args.disk_bytes, args.parallel, args.n_ctx or None,
                                     args.threads, args.max_body_bytes,
                                     tuple(tuple(pair.split("=", 1)) for pair in args.server_env))
        self.soak_log, self.replay_log = args.out.with_suffix(".server.log"), args.out.with_suffix(".fresh-server.log")
        for path in (self.soak_log, self.replay_log):
            path.unlink(missing_ok=True)
        self.baseline = interpreter_baseline_rss()
        print(f"interpreter baseline ({SERVER_IMPORTS}): {_gib(self.baseline)}", flush=True)
        self.server = ServerProcess(self.options, tmp / "store", self.soak_log)
        self.clock = Clock(Timeline(time.monotonic()))
        self.log = RequestLog(out, self.clock)
        self.stats = httpx.get(self.server.url + "/v1/stats", timeout=60).json()
        self.n_ctx = self.stats["library_cells"]
        out.write({"type": "config", "args": {k: str(v) for k, v in vars(args).items()}, "server_pid": self.server.pid,
                   "server_start_s": round(self.server.start_s, 1), "n_ctx": self.n_ctx,
                   "memory": self.stats["memory"], "interpreter_baseline_rss": self.baseline,
                   "server_log": str(self.soak_log), "replay_policy": REPLAY_POLICY})
        print(f"server ready in {self.server.start_s:.0f} s (pid {self.server.pid}, n_ctx {self.n_ctx}, memory.bound "
              f"{_gib(self.stats['memory']['bound'])}); writing {args.out}", flush=True)
        self.sampler = Sampler(self.server, self.clock, self.log, out, args.interval)
        self.sampler.start()

    def run(self) -> RunFacts:
        """Returns the facts the goals are judged on, once every phase is done and both servers are stopped."""
        pool, chars_per_token = self.setup()
        clients = self.clients(pool, chars_per_token)
        crashes = [f"{c.name}: {c.crashed}" for c in clients if c.crashed] + \
            [f"{c.name}: still running a request" for c in clients if c.is_alive()]
        quiet, waited, final_stats = self.drain()
        stop_s = self.server.stop()
        print(f"soak server stopped ({'SIGTERM in %.1f s' % stop_s if stop_s is not None else 'killed: SIGTERM hung'})",
              flush=True)
        replays, replay_stop_s, replay_error = self.replay()
        return RunFacts(self.log.records, self.sampler.windows, self.clock.timeline, self.stats["memory"],
                        self.baseline, final_stats, quiet, waited, scan_log(self.soak_log),
                        scan_log(self.replay_log) if self.replay_log.exists() else None, replays, stop_s,
                        replay_stop_s, self.sampler.server_died_at_s, crashes, replay_error)

    def setup(self) -> tuple[DocumentPool, float]:
        """Returns the documents (the pinned ones added) and the tokenizer's characters per token on invented text.

        Then sends the long prompts, and waits for the background work they leave.
        """
        pinned, churned, questions = build_documents(self.args.seed)
        pool = DocumentPool(pinned, churned, document_combos(sorted(pinned), self.args.seed), questions)
        with HttpxTransport(self.server.url, self.args.request_timeout * 3) as transport:
            chars_per_token = add_pinned_documents(transport, pool, self.log)
            self.clock.timeline = dataclasses.replace(self.clock.timeline, setup_end_s=self.clock.timeline.now_s())
            if self.args.long_share > 0:
                print(f"long prompts (~{self.args.long_share:.0%} of {self.n_ctx} tokens), one at a time:", flush=True)
                run_long_prompts(transport, self.log, self.n_ctx, chars_per_token, self.args.seed,
                                 self.args.long_share)
        quiet, waited, _ = wait_quiet(self.server.url, 600, idle_tasks=True)
        print(f"  background work done after {waited:.0f} s" if quiet else "  background work still queued",
              flush=True)
        return pool, chars_per_token

    def clients(self, pool: DocumentPool, chars_per_token: float) -> list[Client]:
        """Returns the four clients once they have run for --minutes and finished their last request."""
        args = self.args
        seconds = args.minutes * 60
        warmup = min(seconds / 2, 60 * (args.warmup_minutes if args.warmup_minutes is not None
                                        else max(1.0, 0.1 * args.minutes)))
        now = self.clock.timeline.now_s()
        self.clock.timeline = dataclasses.replace(self.clock.timeline, long_end_s=now, warmup_end_s=now + warmup,
                                                  main_end_s=now + seconds)
        print(f"four clients for {args.minutes:g} min (the first {warmup:.0f} s not judged; all pause for "
              f"{args.lull_seconds:g} s every {args.lull_every:g} s). {REPLAY_POLICY}", flush=True)
        settings = ClientSettings(self.server.url, self.n_ctx, args.max_body_bytes, chars_per_token,
                                  args.request_timeout, Lulls(time.monotonic(), args.lull_every, args.lull_seconds))
        return run_clients(self.server.url, pool, settings, self.log, args.seed, seconds, self.sampler.server_died)

    def drain(self) -> tuple[bool, float, Optional[dict]]:
        """Returns (whether every slot and stream was freed, seconds waited, the last stats); stops the sampler."""
        quiet, waited, final_stats = False, 0.0, None
        if self.server.alive():
            quiet, waited, final_stats = wait_quiet(self.server.url, 60, idle_tasks=False)
            wait_quiet(self.server.url, 180, idle_tasks=True)  # the repairs and exact prefixes left behind
        self.sampler.sample()
        self.sampler.stop()
        return quiet, waited, self.sampler.windows[-1].stats or final_stats

    def replay(self) -> tuple[list[ReplayResult], Optional[float], Optional[str]]:
        """Returns the replayed answers, the fresh server's SIGTERM time, and why the replay failed (None: it did not)."""
        sample = replay_sample(self.log.records, self.args.replay) if self.args.replay else []
        if not sample:
            return [], None, None
        try:
            replays, stop_s = replay(sample, self.options, self.tmp / "fresh-store", self.replay_log,
                                     self.args.request_timeout, self.out)
        except RuntimeError as exc:  # the fresh server did not start, or refused a document
            return [], None, str(exc)
        return replays, stop_s, None


def summarize(facts: RunFacts, goals: list[Goal]) -> dict:
    """Returns the run's figures in one JSON-ready dict."""
    kinds: dict[str, dict] = {}
    for r in facts.records:
        row = kinds.setdefault(r.kind, {"n": 0, "failed": 0, "statuses": {}})
        row["n"] += 1
        row["failed"] += not r.ok
        row["statuses"][str(r.status)] = row["statuses"].get(str(r.status), 0) + 1
    rss = [w.rss_bytes for w in facts.windows if w.rss_bytes]
    sampled = [w.stats for w in facts.windows if w.stats]
    busiest = {"active_streams": max((s["active_streams"] for s in sampled), default=None),
               **{key: max((s["queues"][key] for s in sampled), default=None)
                  for key in ("active", "waiting", "held_streams", "idle_tasks")}}
    return {"goals_met": sum(g.met is True for g in goals), "goals_missed": [g.name for g in goals if g.met is False],
            "goals_not_judged": [g.name for g in goals if g.met is None], "requests_by_kind": kinds,
            "rss_min": min(rss, default=None), "rss_max": max(rss, default=None), "queues_max": busiest,
            "threads_max": max((w.threads for w in facts.windows if w.threads), default=None),
            "timeline": facts.timeline.to_dict(), "log_excerpts": list(facts.soak_log.excerpts),
            "client_crashes": facts.client_crashes}


def print_report(facts: RunFacts, goals: list[Goal], summary: dict, out: Path) -> None:
    print("\nrequests by kind (n, failed, statuses):")
    for kind, row in sorted(summary["requests_by_kind"].items()):
        print(f"  {kind:<40} {row['n']:>5} {row['failed']:>4}  {row['statuses']}")
    if facts.soak_log.excerpts:
        print("\nserver log excerpts:")
        for excerpt in facts.soak_log.excerpts:
            print("  " + excerpt.replace("\n", "\n  "))
    print(f"\nbusiest sample: {summary['queues_max']}, threads max {summary['threads_max']}")
    print("\ngoals:")
    for goal in goals:
        mark = {True: "MET   ", False: "MISSED", None: "NOT JUDGED"}[goal.met]
        print(f"  {mark} {goal.name}: {goal.detail}")
    missed = summary["goals_missed"]
    print(f"\n{'ALL GOALS MET' if not missed else 'MISSED: ' + '; '.join(missed)}"
          f"{' (not judged: ' + '; '.join(summary['goals_not_judged']) + ')' if summary['goals_not_judged'] else ''}"
          f"\nseries and requests: {out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
