"""Gives the decision whether llama.cpp may load weights into the CPU's extra buffer types (AMX, repacking).

llama.cpp's CPU backend offers "extra buffer types": weights repacked into the layout of a
faster kernel (CPU_REPACK: Q4_0/Q4_K/IQ4_NL/Q8_0 interleaved for AVX2/AVX-512/NEON) and, in a
build compiled on a CPU with AMX, the AMX tile kernels. On some AMX CPUs (Sapphire Rapids class)
the AMX matmul dies with a general protection fault at `ldtilecfg` (ggml-org/llama.cpp#20824:
tile permission is requested on the main thread only and the tile config is partly optimised
away); a segfault with no message, in model loading's first decode or any batch after it.
Loading with `llama_model_params.use_extra_bufts = False` avoids both extra types.

The policy, in order:
1. `$PC_CPU_EXTRA_BUFFERS=on|off` forces it (`auto`, the default, decides);
2. a llama.cpp build without AMX (`AMX_INT8 = 1` absent from `llama_print_system_info`)
   keeps extra buffers on: repacking is safe and faster there;
3. with AMX compiled in, a child process loads a tiny quantized model with extra buffers on
   and decodes a batch on several threads (pc_cpu.engine.llama.amx_check). It surviving means the
   AMX path works here; a crash, an error or a hang turns extra buffers off. The verdict of a
   run that finished (passed or crashed) is kept per llama.cpp build and CPU in
   <user cache dir>/pc_cpu/cpu, so the check runs once per machine and build.

Every model load in pc_cpu goes through `model_params()` (or `llama_peer` for llama-cpp-python's
own `Llama`), so the decision holds for PromptCache, the probe, benchmarks and tests alike.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import llama_cpp

from pc_cpu.errors import ConfigError
from pc_cpu.store.disk import cache_dir

ENV = "PC_CPU_EXTRA_BUFFERS"
SETTINGS = ("auto", "on", "off")
CHECK_TIMEOUT_S = 300  # the check loads a ~2 MB model and decodes 64 tokens: seconds, even under load


@dataclass(frozen=True)
class ExtraBuffers:
    """Whether models load with llama.cpp's CPU extra buffer types, and why (one clause, for logs and errors)."""

    enabled: bool
    reason: str

    def describe(self) -> str:
        """Returns one line for `pc-cpu models` and --verbose, e.g. 'CPU extra buffers: on (no AMX in this build)'."""
        return (f"CPU extra buffers (AMX, weight repacking): {'on' if self.enabled else 'off'} ({self.reason}; "
                f"${ENV}=on|off|auto overrides)")


@dataclass(frozen=True)
class CheckOutcome:
    """What the AMX check process did: passed, or failed with a cause; `final` when worth keeping."""

    passed: bool
    cause: str   # e.g. "passed", "crashed with SIGSEGV", "timed out after 300 s"
    final: bool  # a pass or a crash says something about the CPU; an error or time-out may not


def system_info() -> str:
    """Returns llama.cpp's feature line (`llama_print_system_info`), e.g. 'CPU : SSE3 = 1 | ... | AMX_INT8 = 1 |'."""
    raw = llama_cpp.llama_print_system_info()
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def amx_compiled(info: str) -> bool:
    """Returns whether llama.cpp was built with its AMX kernels (the only extra type known to crash)."""
    return re.search(r"\bAMX_INT8\s*=\s*1\b", info) is not None


def setting(environ: Mapping[str, str] | None = None) -> str:
    """Returns $PC_CPU_EXTRA_BUFFERS as one of on/off/auto (unset or empty: auto); raises ConfigError otherwise."""
    value = (os.environ if environ is None else environ).get(ENV, "").strip().lower() or "auto"
    if value not in SETTINGS:
        raise ConfigError(f"${ENV}={value!r} is not a setting; use on, off or auto (the default: check the CPU once)")
    return value


_lock = threading.Lock()
_decided: dict[str, ExtraBuffers] = {}


def decide(environ: Mapping[str, str] | None = None, *, info: str | None = None,
           run_check: Callable[[], CheckOutcome] | None = None, verdicts: Path | None = None) -> ExtraBuffers:
    """Returns whether to load models with extra buffer types on this CPU (see the module docstring).

    Decided once per process and setting; the keywords exist for tests (a fake build's
    feature line, a fake check, another verdict directory), which are never memoized.
    """
    chosen = setting(environ)
    memoize = info is None and run_check is None and verdicts is None
    with _lock:
        if memoize and chosen in _decided:
            return _decided[chosen]
        decision = _decide(chosen, info if info is not None else system_info(), run_check or run_amx_check,
                           verdicts if verdicts is not None else cache_dir("cpu", "PC_CPU_CPU_DIR", environ))
        if memoize:
            _decided[chosen] = decision
        return decision


def _decide(chosen: str, info: str, run_check: Callable[[], CheckOutcome], verdicts: Path) -> ExtraBuffers:
    if chosen != "auto":
        return ExtraBuffers(chosen == "on", f"${ENV}={chosen}")
    if not amx_compiled(info):
        return ExtraBuffers(True, "this llama.cpp build has no AMX kernels")
    path = verdicts / f"amx-{_build_and_cpu_key(info)}.json"
    kept = _read_verdict(path)
    if kept is not None:
        return kept
    outcome = run_check()
    decision = ExtraBuffers(outcome.passed, f"AMX check {outcome.cause}")
    if outcome.final:
        _write_verdict(path, decision)
    return decision


def model_params(environ: Mapping[str, str] | None = None):
    """Returns llama.cpp's default model params with `use_extra_bufts` set by `decide()`."""
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = decide(environ).enabled
    return params


_peer_lock = threading.Lock()


@contextlib.contextmanager
def _patched_default_params():
    # llama-cpp-python's Llama builds its model params from llama_model_default_params() inside
    # __init__ and has no use_extra_bufts argument; while one is constructed, the default it reads
    # carries the decision. Serialized, so concurrent constructions never see each other's patch.
    module = llama_cpp.llama_cpp
    original = module.llama_model_default_params
    with _peer_lock:
        module.llama_model_default_params = model_params
        try:
            yield
        finally:
            module.llama_model_default_params = original


def llama_peer(path: str | os.PathLike, **kwargs) -> "llama_cpp.Llama":
    """Returns llama-cpp-python's own `Llama` for `path`, loaded with the same extra-buffer decision as pc_cpu's."""
    with _patched_default_params():
        return llama_cpp.Llama(str(path), **kwargs)


def run_amx_check(timeout_s: float = CHECK_TIMEOUT_S) -> CheckOutcome:
    """Returns how a child process that runs an AMX matmul (pc_cpu.engine.llama.amx_check) ended."""
    env = {**os.environ, ENV: "on"}  # the child loads with extra buffers whatever this process was told
    try:
        done = subprocess.run([sys.executable, "-m", "pc_cpu.engine.llama.amx_check"], env=env, capture_output=True,
                              text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return CheckOutcome(False, f"timed out after {timeout_s:.0f} s", final=False)
    except OSError as exc:
        return CheckOutcome(False, f"could not start ({exc.strerror or exc})", final=False)
    return outcome_of(done.returncode, done.stdout)


def outcome_of(returncode: int, stdout: str) -> CheckOutcome:
    """Returns the outcome a check process's exit code and output mean (negative code: killed by that signal)."""
    if returncode == 0 and stdout.strip().endswith("ok"):
        return CheckOutcome(True, "passed", final=True)
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        # SIGKILL is the OOM killer or a user, not the CPU: not a verdict on AMX.
        return CheckOutcome(False, f"crashed with {name}", final=-returncode != signal.SIGKILL)
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    return CheckOutcome(False, f"failed (exit code {returncode}{': ' + last[:120] if last else ''})", final=False)


def _build_and_cpu_key(info: str) -> str:
    """Returns a hash that changes with the llama.cpp build and the CPU: the two things the verdict is about."""
    digest = hashlib.sha256(info.encode())
    digest.update(getattr(llama_cpp, "__version__", "").encode())
    for lib in sorted(Path(llama_cpp.__file__).parent.glob("lib/*")):
        stat = lib.stat()
        digest.update(f"{lib.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    digest.update(_cpu_identity().encode())
    return digest.hexdigest()[:16]


@functools.cache
def _cpu_identity() -> str:
    """Returns the CPU's model name and feature flags (Linux), else what platform knows."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    fields = dict(line.split(":", 1) for line in text.splitlines()[:40] if ":" in line)
    return "|".join(fields.get(k, "").strip() for k in ("vendor_id", "model name", "flags"))


def _read_verdict(path: Path) -> ExtraBuffers | None:
    try:
        data = json.loads(path.read_text())
        return ExtraBuffers(bool(data["enabled"]), str(data["reason"]) + " (kept from an earlier check)")
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no verdict yet, or an unreadable one: check again


def _write_verdict(path: Path, decision: ExtraBuffers) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"enabled": decision.enabled, "reason": decision.reason}))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only means checking again next time
