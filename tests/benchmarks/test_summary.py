"""Summary rows: pairing with the baseline, counts, and the Markdown table."""

from pc_cpu.benchmarks.accuracy import Record
from pc_cpu.benchmarks.summary import markdown_table, summarize


def rec(index, variant, em, same=False, setting="modular", gap=0):
    return Record("nq", 5, setting, variant, gap, index, index % 5, em, same, "", 0, 10)


def records():
    out = []
    for i in range(10):
        out.append(rec(i, "baseline", i < 6, True))
        out.append(rec(i, "preamble", i < 4, i < 3))
        out.append(rec(i, "scaffold", i < 6, True))
    return out


def test_rows_pair_each_variant_with_its_baseline():
    rows = {r.variant: r for r in summarize(records())}
    assert [r.variant for r in summarize(records())] == ["baseline", "preamble", "scaffold"]
    assert rows["preamble"].n_items == 10 and rows["preamble"].em.estimate == 0.4
    assert rows["preamble"].diff.estimate == -0.2 and (rows["preamble"].wins, rows["preamble"].losses) == (0, 2)
    assert rows["preamble"].agreement.estimate == 0.3
    assert rows["scaffold"].diff.estimate == 0.0


def test_settings_are_kept_apart():
    data = records() + [rec(i, "baseline", True, True, setting="single") for i in range(10)]
    rows = summarize(data)
    single = [r for r in rows if r.setting == "single"]
    assert len(single) == 1 and single[0].em.estimate == 1.0
    assert rows[0].setting == "single"  # single before modular


def test_markdown_table_has_one_line_per_row_and_dashes_for_the_baseline():
    text = markdown_table(summarize(records()))
    lines = text.splitlines()
    assert len(lines) == 2 + 3
    assert "| baseline | 0 | 10 | 60.0%" in lines[2] and "—" in lines[2]
    assert "-20.0" in lines[3]
