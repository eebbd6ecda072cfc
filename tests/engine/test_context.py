"""Context helpers that need no model: how a sequence's state is cut so that llama.cpp saves it whole, flash attention."""

from __future__ import annotations

from types import SimpleNamespace

from pc_cpu.engine.llama.context import Context, default_flash_attn


def spans(n_swa: int, start: int, end: int) -> list[tuple[int, int]]:
    fake = SimpleNamespace(model=SimpleNamespace(info=SimpleNamespace(n_swa=n_swa)))
    return Context.whole_state_spans(fake, start, end)


def test_a_model_without_a_window_saves_any_span_whole():
    assert spans(0, 3, 9000) == [(3, 9000)]
    assert spans(0, 5, 5) == []


def test_spans_are_half_windows_aligned_to_their_size_and_cover_the_range():
    got = spans(512, 200, 900)
    assert got == [(200, 256), (256, 512), (512, 768), (768, 900)]
    assert all(b - a <= 256 for a, b in got)


def test_a_short_span_across_a_chunk_boundary_is_cut_there():
    # With chunked windows (Llama 4) a state keeps only the last chunk's cells: [500, 600) would
    # lose 500..511 if saved as one blob, although it is shorter than half a window.
    assert spans(512, 500, 600) == [(500, 512), (512, 600)]


def test_flash_attention_is_off_by_default_unless_the_model_has_a_sliding_window():
    # Sliding-window models compute in the library context, where slots depend on its history:
    # without flash attention their bits would too (default_flash_attn).
    assert default_flash_attn(SimpleNamespace(n_swa=0)) is False
    assert default_flash_attn(SimpleNamespace(n_swa=512)) is None
