"""Gives a schema Layout as a table for people or as JSON for programs (`pc-cpu inspect`)."""

from __future__ import annotations

from dataclasses import dataclass

from pc_cpu.pml.encoding import scaffold_cells
from pc_cpu.pml.layout import ROOT, Layout, NodeLayout

_KIND_RANK = {"scaffold": 0, "union": 1, "module": 2, "param": 3, "text": 3}  # containers first on ties
_CONTAINERS = ("scaffold", "union")


def kv_bytes_per_token(n_layer: int, n_head_kv: int, head_dim: int, *, element_bytes: int = 2) -> int:
    """Returns the state bytes one encoded token takes: K and V of every layer (F16: 2 bytes each).

    Pass the model's ModelInfo fields: n_layer, n_head_kv, n_embd_head.
    """
    return 2 * n_layer * n_head_kv * head_dim * element_bytes  # bytes


def layout_json(layout: Layout) -> dict:
    """Returns {"schema", "length", "nodes": [{"name", "kind", "start", "length", "parent"}]}."""
    nodes = [{"name": n.name, "kind": n.kind, "start": n.start, "length": n.length, "parent": n.parent}
             for n in layout.nodes]
    return {"schema": layout.schema, "length": layout.length, "nodes": nodes}


@dataclass(frozen=True)
class TableRow:
    """One line of the table: a node, its depth in the display tree and the cells it encodes."""

    node: NodeLayout
    depth: int  # union members sit under their union, a scaffold's modules under the scaffold
    encoded: int | None  # KV cells of this row's own encoding; None: counted in its module's row


def table_rows(layout: Layout) -> list[TableRow]:
    """Returns the layout's nodes in display order (containers before their contents), with depth and cells.

    A node's display parent is the innermost union or scaffold with the same
    enclosing module that covers its range, else that module. Encoded cells: a
    module's own cached runs; a scaffold's joint encoding (kept besides the
    members' own); ROOT text when it is in the cached preamble (0 after it, since
    each prompt computes that text); None for text and params inside a module.
    """
    nodes = sorted(layout.nodes, key=lambda n: (n.start, -n.length, _KIND_RANK[n.kind],
                                                len(layout.ancestors(n.name)) if n.kind == "module" else 0))
    depth_of_module: dict[str, int] = {ROOT: -1}
    rows: list[TableRow] = []
    open_containers: list[tuple[NodeLayout, int]] = []  # (container, depth), in display order
    for node in nodes:
        owner = node.parent or ROOT
        inner = [(c, d) for c, d in open_containers if (c.parent or ROOT) == owner
                 and c.start <= node.start and node.start + node.length <= c.start + c.length]
        depth = inner[-1][1] + 1 if inner else depth_of_module.get(owner, -1) + 1
        if node.kind == "module":
            depth_of_module[node.name] = depth
        if node.kind in _CONTAINERS:
            open_containers.append((node, depth))
        rows.append(TableRow(node, depth, _encoded_cells(layout, node)))
    return rows


def _encoded_cells(layout: Layout, node: NodeLayout) -> int | None:
    if node.kind == "module":
        return sum(len(run.tokens) for run in layout.cached_runs(node.name))
    if node.kind == "scaffold":
        return sum(len(run.tokens) for m in layout.scaffolds[node.name].members for run in layout.cached_runs(m))
    if node.parent is None and node.kind == "text":
        return node.length if node.start < layout.preamble_end else 0
    return None


def layout_table(layout: Layout, bytes_per_token: int | None = None) -> str:
    """Returns an aligned table of the layout's nodes: positions, tokens, encoded cells and their bytes.

    Args:
        layout: the schema layout.
        bytes_per_token: state bytes per encoded token (see kv_bytes_per_token); None leaves bytes out.

    Returns:
        The table, then a totals line: schema length, tokens encoded, and bytes once all is encoded.
    """
    header = ("node", "kind", "start", "end", "length", "tokens", "encoded")
    if bytes_per_token is not None:
        header += ("state bytes",)
    lines_in = [header]
    for row in table_rows(layout):
        n = row.node
        name = "  " * row.depth + (f"[{n.name}]" if n.kind == "scaffold" else n.name)
        cells = (name, n.kind, str(n.start), str(n.start + n.length), str(n.length), str(n.tokens),
                 "-" if row.encoded is None else str(row.encoded))
        if bytes_per_token is not None:
            cells += ("-" if row.encoded is None else _human_bytes(row.encoded * bytes_per_token),)
        lines_in.append(cells)
    widths = [max(len(r[i]) for r in lines_in) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
             for r in lines_in]
    joint = scaffold_cells(layout)
    total = layout.cached_cells + joint
    summary = (f"schema {layout.schema!r}: {layout.length} positions, {len(layout.modules) - 1} modules, "
               f"{total} tokens encoded")
    if layout.scaffolds:
        summary += (f" ({layout.cached_cells} by modules and the preamble, {joint} by the joint encodings of "
                    f"{len(layout.scaffolds)} scaffold(s))")
    if bytes_per_token is not None:
        summary += f", {_human_bytes(total * bytes_per_token)} of state once all is encoded"
    lines.append(summary)
    if layout.scaffolds:
        lines.append("[name]: a scaffold; its modules are also encoded together, used when a prompt imports them all")
    return "\n".join(lines)


def _human_bytes(n: int) -> str:
    """Returns `n` bytes as e.g. "512 B", "22.5 KiB", "3.1 MiB"."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"
