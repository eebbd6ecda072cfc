"""Extra buffer types (AMX, repacking): the policy that keeps a broken AMX path from crashing the user's CPU.

The real crash needs an AMX CPU with a native llama.cpp build; these tests drive the policy with a
fake feature line and a fake check, and run the real check process on whatever CPU this is.
"""

from __future__ import annotations

import signal

import pytest

from pc_cpu.engine.llama import extra_buffers
from pc_cpu.engine.llama.extra_buffers import CheckOutcome, decide, outcome_of, run_amx_check
from pc_cpu.errors import ConfigError

WITH_AMX = "CPU : SSE3 = 1 | AVX512 = 1 | AMX_INT8 = 1 | REPACK = 1 |"
WITHOUT_AMX = "CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | REPACK = 1 |"


class FakeCheck:
    """A check that returns `outcome` and counts its runs."""

    def __init__(self, outcome: CheckOutcome):
        self.outcome = outcome
        self.runs = 0

    def __call__(self) -> CheckOutcome:
        self.runs += 1
        return self.outcome


CRASHED = CheckOutcome(False, "crashed with SIGSEGV", final=True)
PASSED = CheckOutcome(True, "passed", final=True)
TIMED_OUT = CheckOutcome(False, "timed out after 300 s", final=False)


def test_a_build_without_amx_keeps_extra_buffers_and_runs_no_check(tmp_path):
    check = FakeCheck(CRASHED)
    decision = decide({}, info=WITHOUT_AMX, run_check=check, verdicts=tmp_path)
    assert decision.enabled and "no AMX" in decision.reason and check.runs == 0


def test_an_amx_crash_turns_extra_buffers_off_and_is_remembered_per_build_and_cpu(tmp_path):
    check = FakeCheck(CRASHED)
    first = decide({}, info=WITH_AMX, run_check=check, verdicts=tmp_path)
    assert not first.enabled and "crashed with SIGSEGV" in first.reason
    again = decide({}, info=WITH_AMX, run_check=check, verdicts=tmp_path)
    assert not again.enabled and "kept from an earlier check" in again.reason and check.runs == 1
    # Another build (its feature line differs) is checked anew.
    other = FakeCheck(PASSED)
    assert decide({}, info=WITH_AMX + " AVX512_BF16 = 1 |", run_check=other, verdicts=tmp_path).enabled
    assert other.runs == 1


def test_an_amx_check_that_passes_keeps_extra_buffers(tmp_path):
    decision = decide({}, info=WITH_AMX, run_check=FakeCheck(PASSED), verdicts=tmp_path)
    assert decision.enabled and decision.reason == "AMX check passed"


def test_an_inconclusive_check_turns_them_off_for_now_but_is_not_kept(tmp_path):
    check = FakeCheck(TIMED_OUT)
    assert not decide({}, info=WITH_AMX, run_check=check, verdicts=tmp_path).enabled
    assert not decide({}, info=WITH_AMX, run_check=check, verdicts=tmp_path).enabled
    assert check.runs == 2


@pytest.mark.parametrize("value, enabled", [("on", True), ("off", False), (" OFF ", False)])
def test_the_environment_overrides_the_check(tmp_path, value, enabled):
    check = FakeCheck(PASSED if not enabled else CRASHED)
    decision = decide({extra_buffers.ENV: value}, info=WITH_AMX, run_check=check, verdicts=tmp_path)
    assert decision.enabled is enabled and check.runs == 0
    assert f"{extra_buffers.ENV}={value.strip().lower()}" in decision.describe()


def test_a_setting_that_is_not_one_is_refused_with_the_valid_ones():
    with pytest.raises(ConfigError, match=r"PC_CPU_EXTRA_BUFFERS='maybe' is not a setting; use on, off or auto"):
        decide({extra_buffers.ENV: "maybe"}, info=WITH_AMX, run_check=FakeCheck(PASSED))


@pytest.mark.parametrize("returncode, stdout, passed, final, cause", [
    (0, "ok\n", True, True, "passed"),
    (-int(signal.SIGSEGV), "", False, True, "crashed with SIGSEGV"),
    (-int(signal.SIGILL), "", False, True, "crashed with SIGILL"),
    (-int(signal.SIGKILL), "", False, False, "crashed with SIGKILL"),  # the OOM killer, not the CPU
    (1, "Traceback...\nValueError: boom\n", False, False, "failed (exit code 1: ValueError: boom)"),
    (0, "", False, False, "failed (exit code 0)"),
])
def test_how_a_check_process_ended_is_read(returncode, stdout, passed, final, cause):
    assert outcome_of(returncode, stdout) == CheckOutcome(passed, cause, final)


def test_the_real_check_process_runs_an_amx_sized_model_and_ends_with_a_verdict():
    outcome = run_amx_check(timeout_s=120)
    # On a CPU without AMX, or with a working AMX path, it passes; where AMX is broken it crashes. An
    # error in the check itself (a model llama.cpp refuses, a gguf API change) is neither.
    assert outcome.final, outcome.cause
    assert outcome.passed or outcome.cause.startswith("crashed"), outcome.cause


def test_models_and_llama_peers_load_with_the_decision(tiny_model_path, monkeypatch):
    from pc_cpu.engine.llama.extra_buffers import llama_peer, model_params
    from pc_cpu.engine.llama.model import Model

    import llama_cpp

    for value, enabled in (("off", False), ("on", True)):
        monkeypatch.setenv(extra_buffers.ENV, value)
        assert model_params().use_extra_bufts is enabled
        model = Model(tiny_model_path)
        try:
            assert model.extra_buffers.enabled is enabled
        finally:
            model.close()
        default = llama_cpp.llama_cpp.llama_model_default_params
        peer = llama_peer(tiny_model_path, n_ctx=64, verbose=False)
        try:
            assert peer.model_params.use_extra_bufts is enabled
        finally:
            peer.close()
        assert llama_cpp.llama_cpp.llama_model_default_params is default  # the patch is undone
