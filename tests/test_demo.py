"""The demo's text: the headline it ends with and answers on one line (no model needed)."""

from __future__ import annotations

from pc_cpu.demo import headline, one_line


def test_headline_says_what_was_cached_and_how_much_sooner_the_first_token_came():
    assert (headline("Long document", 4312, 210, 8000)
            == "Long document: 4,312 tokens cached, first token 38x sooner (210 ms vs 8.0 s).")
    assert (headline("The harbor document", 304, 196, 960)
            == "The harbor document: 304 tokens cached, first token 4.9x sooner (196 ms vs 960 ms).")
    assert headline("Long document", 4250, 1320, 138_000).endswith("105x sooner (1.3 s vs 2 min 18 s).")


def test_headline_says_later_when_the_cached_prompt_was_slower():
    assert (headline("The railway document", 297, 8, 5)
            == "The railway document: 297 tokens cached, first token 1.6x later (8 ms vs 5 ms).")


def test_one_line_collapses_every_run_of_whitespace():
    assert one_line(" The ferry carried\n\n912 passengers\ton  day 77.\n") == "The ferry carried 912 passengers on day 77."
