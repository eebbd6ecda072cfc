"""Renders benchmark results (plain dicts from latency.run / peers.run, rows from summary) as Markdown."""

from __future__ import annotations

from pc_cpu.benchmarks.summary import Row, by_gold_position, markdown_table


def _ms(s: dict) -> str:
    return f"{s['p50']:.0f} / {s['p95']:.0f} / {s['mean']:.0f}"


def latency_markdown(report: dict) -> str:
    """Returns the tier table, the length sweep with its fits, and the hit-ratio curve."""
    out = [f"Model {report['model']}, {report['threads']} threads, size `{report['size']}`. "
           "TTFT in ms as p50 / p95 / mean; speedup = baseline p50 / cached p50.", "",
           "| workload | cached tok | uncached tok | n | full prefill | resident | RAM | disk | speedup resident / RAM / disk |"
           " encode ms (× prefill) | break-even uses |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in report["workloads"]:
        out.append(f"| {w['workload']} | {w['cached_tokens']} | {w['uncached_tokens']} | {w['repeats']} | "
                   f"{_ms(w['baseline'])} | {_ms(w['resident'])} | {_ms(w['ram'])} | {_ms(w['disk'])} | "
                   f"{w['resident']['speedup_p50']}× / {w['ram']['speedup_p50']}× / {w['disk']['speedup_p50']}× | "
                   f"{w['encode_ms']:.0f} ({w['encode_vs_prefill']}×) | {w['break_even_uses']} |")
    out += ["", "Tiers that served the runs: " + "; ".join(
        f"{w['workload']}: {', '.join(w['tiers_seen'])}" for w in report["workloads"]), ""]
    out += ["| workload | module state bytes/token (RAM tier blobs) | 2·layers·kv_heads·head_dim·2 (F16) |",
            "|---|---|---|"]
    for w in report["workloads"]:
        m = w["memory"]
        out.append(f"| {w['workload']} | {m['bytes_per_token']:.0f} ({m['ram_tier_bytes']} B / "
                   f"{m['encoded_tokens']} tok) | {m['theory_bytes_per_token_f16']} |")
    sweep = report["length_sweep"]
    out += ["", f"Length sweep (multi-doc QA, n={sweep['repeats']} per point, p50 ms):", "",
            "| cached tokens | full prefill | cached | speedup |", "|---|---|---|---|"]
    for p in sweep["points"]:
        out.append(f"| {p['cached_tokens']} | {p['baseline']['p50']:.0f} | {p['cached']['p50']:.0f} | "
                   f"{p['baseline']['p50'] / p['cached']['p50']:.1f}× |")
    if "baseline_quadratic" in sweep:
        q, l, c = sweep["baseline_quadratic"], sweep["baseline_linear"], sweep["cached_linear"]
        out += ["", f"Fits (ms against cached tokens x): full prefill quadratic "
                    f"{q['coeffs'][0]:.3g}·x² + {q['coeffs'][1]:.3g}·x + {q['coeffs'][2]:.3g} (R² {q['r2']}); "
                    f"full prefill linear R² {l['r2']}; cached linear {c['coeffs'][0]:.3g}·x + {c['coeffs'][1]:.3g} "
                    f"(R² {c['r2']})."]
    hit = report["hit_ratio"]
    out += ["", f"Cache-hit ratio at ~{hit['total_tokens']} prompt tokens (n={hit['repeats']}, p50 ms):", "",
            "| hit ratio | cached tok | uncached tok | full prefill | cached | speedup |", "|---|---|---|---|---|---|"]
    for p in hit["points"]:
        out.append(f"| {p['hit_ratio']:.0%} | {p['cached_tokens']} | {p['uncached_tokens']} | "
                   f"{p['baseline']['p50']:.0f} | {p['cached']['p50']:.0f} | {p['speedup_p50']}× |")
    return "\n".join(out)


def peers_markdown(report: dict) -> str:
    """Returns one table row per (workload, system)."""
    out = [f"Model {report['model']}, {report['threads']} threads, {report['n_docs']} documents of "
           f"~{report['doc_tokens'] // report['n_docs']} tokens, n={report['repeats']} prompts per workload "
           "(after one untimed warm-up). TTFT ms p50 / p95 / mean.", "",
           "| workload | prompt tokens | prefix shared with the previous prompt | system | TTFT | speedup vs full prefill |",
           "|---|---|---|---|---|---|"]
    for w in report["workloads"]:
        for name, s in w["systems"].items():
            out.append(f"| {w['workload']} | {w['prompt_tokens']} | {w.get('prefix_with_previous', '?')} | {name} | "
                       f"{_ms(s)} | {s['speedup_vs_full_prefill']}× |")
    return "\n".join(out)


def accuracy_markdown(rows: list[Row], records=None) -> str:
    """Returns the accuracy table and, when records are given, exact match by gold position."""
    out = [markdown_table(rows)]
    if records is not None:
        out += ["", "Exact match by gold-passage position (gap 0):", "",
                "| task | N | setting | variant | gold position | n | exact match [95% CI] |", "|---|---|---|---|---|---|---|"]
        for (task, n, setting, variant, pos), iv in by_gold_position(records).items():
            out.append(f"| {task} | {n} | {setting} | {variant} | {pos + 1} | {iv_n(records, task, n, setting, variant, pos)} "
                       f"| {iv.pct()} |")
    return "\n".join(out)


def iv_n(records, task, n, setting, variant, pos) -> int:
    """Returns how many gap-free records a by-position cell holds."""
    return sum(1 for r in records if (r.task, r.n, r.setting, r.variant, r.gold_index, r.gap)
               == (task, n, setting, variant, pos, 0))
