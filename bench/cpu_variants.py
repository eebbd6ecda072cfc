"""Runs the exactness tests on other CPU paths of llama.cpp: a promise that holds by one CPU's kernels is a defect.

pc_cpu promises the full prefill's tokens where the cached prompt computes the same cells in the
same llama_decode calls (README, "Same tokens, same answer"). Which kernels compute them depends
on the CPU, on how llama.cpp was built and on the extra buffer types weights load into: an AVX2
laptop runs other matmul tiles than an AVX-512 server, and repacked weights others again. One
machine can run several of those paths, so this runs the tests that hold the promises on each:

- `native`: the installed llama-cpp-python (built with GGML_NATIVE: every instruction this CPU
  has, AMX included where the CPU has it);
- `avx2`: llama-cpp-python built without AVX-512 or AMX (GGML_NATIVE=OFF with AVX2, FMA, F16C:
  a laptop's kernels), once, from the sdist of the pinned version, into --build-dir;

each with extra buffers off and, where the build and CPU allow them (pc_cpu.engine.llama.extra_buffers:
no AMX compiled, or the AMX check passed), on: weights repacked into interleaved tiles. A path the
CPU cannot run is reported as skipped, with the reason.

    python bench/cpu_variants.py                                   # every variant, the exactness tests
    python bench/cpu_variants.py --variant avx2 -- tests/engine/test_exactness.py -x
    python bench/cpu_variants.py --out bench/results/cpu_variants.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # pyproject.toml's pin: the state format changes between releases
# Every promise of the README's "Same tokens, same answer", on the tiny model and every installed packaged one.
EXACTNESS_TESTS = [
    "tests/engine/test_exactness.py",
    "tests/engine/test_compiled_programs.py",
    "tests/engine/test_determinism.py",
    "tests/engine/test_document_prefix.py",
    "tests/engine/test_scaffold.py",
    "tests/engine/test_chain.py",
    "tests/engine/test_default_model.py::test_the_demos_first_answers_are_the_full_prefills",
    "tests/engine/test_scheduler.py::test_concurrent_prompts_get_their_single_request_answers",
    "tests/engine/test_chat.py::test_every_turn_answers_as_the_full_prefill_of_its_messages_and_reuses_the_turns_before",
    "tests/engine/test_chat.py::test_a_turn_sent_before_the_repair_computes_the_answer_again_and_answers_as_the_full_prefill",
]
VARIANTS = {
    "native": None,  # the installed build
    "avx2": ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_TILE=OFF",
             "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"],
}
# What a child prints of the build it imported: its features, and the extra-buffer decision for `on`.
PROBE = """
import json, os
from pc_cpu.engine.llama import extra_buffers
info = extra_buffers.system_info()
on = extra_buffers.decide({"PC_CPU_EXTRA_BUFFERS": "auto"})
features = " ".join(f.split(":")[-1].split("=")[0].strip() for f in info.split("|") if f.strip().endswith("= 1"))
print(json.dumps({"features": features,
                  "llama_cpp": __import__("llama_cpp").__file__, "extra_buffers_allowed": on.enabled,
                  "why": on.reason}))
"""


@dataclass
class Run:
    """One CPU path's test run."""

    variant: str
    extra_buffers: str  # "off" or "on"
    features: str  # llama.cpp's feature line, the flags that are 1
    outcome: str  # "passed", "failed" or "skipped: <why>"
    summary: str  # pytest's last line
    seconds: float


def build(variant: str, build_dir: Path) -> Path | None:
    """Returns the directory to put first on PYTHONPATH for `variant` (None: the installed build), building it once."""
    flags = VARIANTS[variant]
    if flags is None:
        return None
    target = build_dir / variant
    if (target / "llama_cpp").is_dir():
        return target
    print(f"building {LLAMA_CPP_PYTHON} for {variant} into {target} (about 4 minutes on 2 cores)...", flush=True)
    env = {**os.environ, "CMAKE_ARGS": " ".join(flags + ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF"])}
    # --no-cache-dir: pip's wheel cache does not know CMAKE_ARGS and would hand back the native wheel.
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-deps", "--no-binary",
                    "llama-cpp-python", "--target", str(target), LLAMA_CPP_PYTHON], env=env, check=True)
    return target


def child_env(path: Path | None, extra_buffers: str) -> dict:
    """Returns the environment of a child that imports `path`'s llama_cpp and loads models with extra buffers so."""
    env = {**os.environ, "PC_CPU_EXTRA_BUFFERS": extra_buffers}
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def probe(path: Path | None) -> dict:
    """Returns what the build at `path` is: its features, and whether this CPU allows it extra buffers."""
    done = subprocess.run([sys.executable, "-c", PROBE], env=child_env(path, "auto"), capture_output=True,
                          text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_tests(variant: str, path: Path | None, extra_buffers: str, tests: list[str], features: str) -> Run:
    """Returns the outcome of pytest on `tests` with the build at `path` and extra buffers `extra_buffers`."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                          env=child_env(path, extra_buffers), capture_output=True, text=True, cwd=ROOT)
    lines = done.stdout.strip().splitlines()
    summary = lines[-1] if lines else done.stderr.strip()[-200:]
    failed = [line for line in lines if line.startswith("FAILED")]
    for line in failed:
        print(f"    {line}", flush=True)
    return Run(variant, extra_buffers, features, "passed" if done.returncode == 0 else "failed", summary,
               round(time.monotonic() - started, 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", choices=tuple(VARIANTS), help="default: every variant")
    parser.add_argument("--extra-buffers", action="append", choices=("off", "on"), help="default: off and on")
    parser.add_argument("--build-dir", type=Path, default=Path.home() / ".cache" / "pc_cpu" / "llama_variants")
    parser.add_argument("--out", type=Path, help="write the runs as JSON here")
    parser.add_argument("tests", nargs="*", help="pytest arguments after --; default: the exactness tests")
    args = parser.parse_args()
    tests = args.tests or EXACTNESS_TESTS
    runs = []
    for variant in args.variant or list(VARIANTS):
        path = build(variant, args.build_dir)
        about = probe(path)
        print(f"{variant}: {about['features']}", flush=True)
        for setting in args.extra_buffers or ["off", "on"]:
            if setting == "on" and not about["extra_buffers_allowed"]:
                run = Run(variant, setting, about["features"], f"skipped: {about['why']}", "", 0.0)
            else:
                run = run_tests(variant, path, setting, tests, about["features"])
            runs.append(run)
            print(f"  extra buffers {setting}: {run.outcome}  {run.summary}  ({run.seconds:.0f} s)", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "tests": tests,
                                        "runs": [asdict(r) for r in runs]}, indent=1) + "\n")
    return 1 if any(r.outcome == "failed" for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
