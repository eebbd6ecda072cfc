"""Gives a schema Layout as a table for people or as JSON for programs (`pc-cpu inspect`)."""

from __future__ import annotations

from pc_cpu.pml.layout import ROOT, Layout


def layout_json(layout: Layout) -> dict:
    """Returns {"schema", "length", "nodes": [{"name", "kind", "start", "length", "parent"}]}."""
    nodes = [{"name": n.name, "kind": n.kind, "start": n.start, "length": n.length, "parent": n.parent}
             for n in layout.nodes]
    return {"schema": layout.schema, "length": layout.length, "nodes": nodes}


def layout_table(layout: Layout) -> str:
    """Returns an aligned table of the layout's nodes with start, end and length."""
    rows = [("node", "kind", "start", "end", "length", "parent")]
    for n in layout.nodes:
        depth = 0 if n.parent is None else len(layout.ancestors(n.parent)) + (0 if n.parent == ROOT else 1)
        rows.append(("  " * depth + n.name, n.kind, str(n.start), str(n.start + n.length), str(n.length),
                     n.parent or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.append(f"schema {layout.schema!r}: {layout.length} positions, {layout.cached_cells} tokens encoded "
                 f"across {len(layout.modules) - 1} modules")
    return "\n".join(lines)
