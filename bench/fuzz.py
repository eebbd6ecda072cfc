"""The HTTP API fuzz, long: N generated requests against `pc-cpu serve` run as a child process on 127.0.0.1.

The requests and the oracle are tests/server/fuzz_api.py's, which tests/server/test_fuzz.py runs a
few hundred of. The server gets a private temp store (--store) and temp probe and CPU dirs, so
nothing touches the user's cache. Goals, each of which fails the run (exit status 1): no 5xx; every
refusal a 4xx naming the field; no path or traceback in any answer; every 2xx parsed by the
`openai` client's types; no traceback in the server's log; the server answers GET /health at the end.

    python bench/fuzz.py --requests 10000 [--seed 0] [--model tiny] [--out bench/results/fuzz.json]

--model tiny (the default) writes the tests' 2-layer random-weight model (tests/tiny_gguf.py);
any other value is passed to `pc-cpu serve --model` (a name from `pc-cpu models`, or a path).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from hypothesis import HealthCheck, Phase, given, seed, settings

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' fuzz module and tiny model, run from anywhere

from tests.server import fuzz_api  # noqa: E402

START_TIMEOUT_S = 300  # a real model loads in seconds; a loaded machine may take longer
REQUEST_TIMEOUT_S = 300  # one answer; a fuzzed max_tokens may run to the end of the context
KEPT_FAILURES = 50  # failures kept in full in the report; the rest are counted


class ServerGone(Exception):
    """The server stopped answering: no request after this one can be judged."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_path(model: str, tmp: Path) -> str:
    """Returns what `pc-cpu serve --model` takes for `model`; 'tiny' is written into `tmp` first."""
    if model != "tiny":
        return model
    from tests.tiny_gguf import write_tiny_llama_gguf

    return str(write_tiny_llama_gguf(tmp / "tiny-llama.gguf"))


def start_server(model: str, tmp: Path, *, threads: int, n_ctx: int) -> tuple[subprocess.Popen, str, Path]:
    """Returns the server process, its base URL and its log file, once it answers GET /health."""
    port = free_port()
    log = tmp / "server.log"
    env = {**os.environ, "PC_CPU_PROBE_DIR": str(tmp / "probe"), "PC_CPU_CPU_DIR": str(tmp / "cpu")}
    env.pop("PC_CPU_API_KEY", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "pc_cpu.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--model", model, "--threads", str(threads), "--n-ctx", str(n_ctx), "--store", str(tmp / "store")],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), env=env, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return process, url, log
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"the server did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.2)


def stop_server(process: subprocess.Popen) -> int | None:
    """Returns the server's exit status after Ctrl-C (None when it had to be killed)."""
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def fuzz(client: httpx.Client, requests: int, seed_: int) -> dict:
    """Returns the tally of `requests` generated requests sent one at a time: statuses, failures, times."""
    tally = {"sent": 0, "statuses": collections.Counter(), "failures": [], "failed": 0, "slowest": []}

    @settings(max_examples=requests, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @seed(seed_)
    @given(fuzz_api.requests)
    def one(request: fuzz_api.FuzzRequest) -> None:
        started = time.perf_counter()
        try:
            answer = fuzz_api.send(client, request)
        except httpx.TransportError as exc:
            tally["failures"].append({"request": request.describe(), "problems": [f"no answer: {exc!r}"]})
            tally["failed"] += 1
            raise ServerGone from exc
        elapsed = time.perf_counter() - started
        tally["sent"] += 1
        tally["statuses"][answer.status] += 1
        tally["slowest"] = sorted(tally["slowest"] + [(round(elapsed, 3), request.describe(200))], reverse=True)[:5]
        problems = fuzz_api.problems(request, answer)
        if problems:
            tally["failed"] += 1
            if len(tally["failures"]) < KEPT_FAILURES:
                tally["failures"].append({"request": request.describe(), "status": answer.status,
                                          "problems": problems})
        if tally["sent"] % 500 == 0:
            print(f"  {tally['sent']:,} sent, {tally['failed']} failed, statuses {dict(tally['statuses'])}",
                  flush=True)

    try:
        one()
    except ServerGone:
        pass
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="tiny", help="'tiny' (the tests' random-weight model), a name or a path")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=1024, help="the server's context: a fuzzed max_tokens runs "
                                                                "to its end")
    parser.add_argument("--out", type=Path, help="write the result as JSON here (e.g. bench/results/fuzz.json)")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pc_cpu-fuzz-") as tmp:
        process, url, log = start_server(model_path(args.model, Path(tmp)), Path(tmp), threads=args.threads,
                                         n_ctx=args.n_ctx)
        try:
            with httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as client:
                fuzz_api.prepare(client)
                tally = fuzz(client, args.requests, args.seed)
                try:
                    healthy = client.get("/health", timeout=30).status_code == 200
                except httpx.TransportError:
                    healthy = False
        finally:
            exit_status = stop_server(process)
        server_log = log.read_text(errors="replace")
    tracebacks = server_log.count("Traceback")
    result = {"requests": args.requests, "sent": tally["sent"], "seed": args.seed, "model": args.model,
              "n_ctx": args.n_ctx, "seconds": round(time.monotonic() - started, 1),
              "statuses": {str(k): v for k, v in sorted(tally["statuses"].items())},
              "failed": tally["failed"], "failures": tally["failures"], "server_tracebacks": tracebacks,
              "healthy_at_end": healthy, "server_exit_status": exit_status,
              "slowest_s": tally["slowest"], "commit": _commit()}
    print(_summary(result))
    if tracebacks:
        print("server log, first traceback:\n" + server_log[server_log.find("Traceback"):][:3000])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    passed = tally["failed"] == 0 and tracebacks == 0 and healthy and tally["sent"] == args.requests
    return 0 if passed else 1


def _summary(result: dict) -> str:
    lines = [f"{result['sent']:,} of {result['requests']:,} requests in {result['seconds']} s (seed {result['seed']}, "
             f"model {result['model']}): statuses {result['statuses']}",
             f"failed: {result['failed']}; tracebacks in the server log: {result['server_tracebacks']}; "
             f"healthy at the end: {result['healthy_at_end']}"]
    for failure in result["failures"]:
        lines += [f"- {failure['request']}"] + [f"    {problem}" for problem in failure["problems"]]
    lines.append("slowest: " + "; ".join(f"{s} s {what}" for s, what in result["slowest_s"]))
    # Requests and answers may hold lone surrogates (the fuzz sends them): shown escaped, never a crash.
    return "\n".join(lines).encode("utf-8", "backslashreplace").decode("utf-8")


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() + ("+dirty" if _dirty() else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def _dirty() -> bool:
    return bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    sys.exit(main())
