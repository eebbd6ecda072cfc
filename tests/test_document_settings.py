"""pc_cpu.document_settings: named settings for questions over documents, per model, with what they lose."""

from __future__ import annotations

import pytest

from dataclasses import replace

from pc_cpu import document_settings as ds
from pc_cpu.errors import PromptCacheError
from pc_cpu.models import MODELS
from pc_cpu.pml.document_layout import ENCODINGS, ORDERS, check_document_policy
from pc_cpu.pml.recompute import parse_policy


def test_every_measured_setting_is_a_packaged_model_s_and_a_policy_documents_take():
    for name, measured in ds.TABLE.items():
        assert name in MODELS
        for setting in (measured.fast, measured.accurate):
            check_document_policy(parse_policy(setting.recompute))
            # The exact prefix is the full prefill by construction: its n is how many answers confirmed it.
            assert setting.order in ORDERS and setting.encoding in ENCODINGS
            # Figures are confirmations on odd lines: n = 300, or n = 150 on the 1.5B (a full prefill ~3x the 0.5B's).
            assert setting.n >= 150 or setting.prefix == "first"
            low, high = setting.interval
            assert low <= setting.vs_full_pts <= high and (setting.speedup or 0) >= 0
        assert measured.fast.recompute == "0" and measured.fast.order == "given"  # the default ask path
        assert measured.fast.prefix == "background" and measured.accurate.prefix == "first"
        # The accurate one loses no more (Gemma's fast scores above its weak full prefill: no loss either).
        assert min(measured.accurate.vs_full_pts, 0) >= min(measured.fast.vs_full_pts, 0)


def test_a_model_is_found_by_name_or_file_and_an_unknown_one_gets_the_fallback():
    qwen = MODELS["qwen2.5-coder-0.5b"]
    assert ds.settings_for(qwen.name) is ds.settings_for(qwen.file_name) is ds.TABLE[qwen.name]
    assert ds.settings_for("my-own.gguf") is ds.FALLBACK and ds.settings_for(None) is ds.FALLBACK
    assert ds.setting("my-own.gguf", "accurate") is ds.EXACT  # exact on any model: no figure needed
    with pytest.raises(PromptCacheError, match="setting='best' is not a setting for documents; use one of fast, "
                                               "accurate"):
        ds.setting(qwen.name, "best")


def test_advice_offers_the_accurate_setting_only_where_the_fast_one_loses_more_than_noise(monkeypatch):
    assert ds.advice("my-own.gguf") is None  # nothing measured: nothing claimed
    # -2.0 [-6.3, +2.3] with stand-ins and flash attention off (n = 300): within CLOSE_PTS, nothing to warn of
    assert ds.advice("qwen2.5-coder-0.5b") is None
    assert ds.advice("qwen2.5-coder-1.5b") is None  # +2.7 [-2.0, +8.0] at n = 150: nothing to warn of
    qwen = replace(ds.TABLE["qwen2.5-coder-0.5b"],
                   fast=ds.DocumentSetting("0", encoding="preamble", vs_full_pts=-17.3, interval=(-23.7, -11.3),
                                           speedup=16.9, n=300))
    monkeypatch.setitem(ds.TABLE, "test-lossy", qwen)
    text = ds.advice("test-lossy")
    assert f"{-qwen.fast.vs_full_pts:.1f} points below a full prefill" in text
    assert "'accurate' setting is prefix first: the full prefill's answers, token for token" in text
    assert f"every later one {qwen.accurate.speedup:.1f}x its speed" in text
    close = ds.ModelDocuments(ds.DocumentSetting("0", vs_full_pts=-1.0, interval=(-4, 2), speedup=20, n=300),
                              ds.FALLBACK.accurate)
    monkeypatch.setitem(ds.TABLE, "test-close", close)
    assert ds.advice("test-close") is None
