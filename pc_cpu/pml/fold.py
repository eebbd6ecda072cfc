"""Gives the layout of a schema longer than the context: every top-level module right after the preamble.

A schema's own layout puts its modules one after another, so a library of many
modules spans more positions than a context holds, and cells cannot be computed
past the context (nor past the model's training context). Folded, every top-level
module (with what is nested in it) starts where the preamble ends, as union members
share a position: each is encoded there, inside the context, after the preamble, and
a prompt places the modules it imports back to back (pc_cpu.pml.plan packs every
prompt of a folded schema), moving their cells. ROOT's text after the preamble
follows the longest module. Only one prompt then has to fit in the context.

What changes for a module of a folded schema, against the same schema unfolded: it is
encoded at another position (its content key says so), and in chain mode it no longer
follows its neighbour (they overlap), so it is encoded as in preamble mode. A scaffold
must lie inside one top-level module: its members are encoded jointly, at positions
that a fold would make overlap.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from pc_cpu.errors import SchemaError
from pc_cpu.pml.layout import ROOT, Layout, ModuleLayout, NodeLayout, Piece


def fold_layout(layout: Layout, limit: int) -> Layout:
    """Returns `layout` unchanged when it spans at most `limit` positions, else folded (module docstring)."""
    if layout.length <= limit:
        return layout
    root = layout.modules[ROOT]
    delta = {}  # module -> how far it moves
    block_end = layout.preamble_end
    for top in root.children:
        top_layout = layout.modules[top]
        union = layout.unions.get(top_layout.union) if top_layout.union else None
        start = union.start if union else top_layout.start
        for name in _subtree(layout, top):
            delta[name] = layout.preamble_end - start
        block_end = max(block_end, top_layout.end - start + layout.preamble_end)
    text_moves = {}  # ROOT text after the preamble: old start -> new start, in order after the longest module
    position = block_end
    for piece in root.pieces:
        if piece.start >= layout.preamble_end:
            text_moves[piece.start] = position
            position += len(piece.tokens)
    modules = {ROOT: replace(root, end=position, pieces=tuple(
        replace(p, start=text_moves.get(p.start, p.start)) for p in root.pieces))}
    for name, module in layout.modules.items():
        if name != ROOT:
            modules[name] = _shift_module(module, delta[name])
    unions = {name: replace(u, start=u.start + (delta[u.members[0]] if u.members else 0))
              for name, u in layout.unions.items()}
    scaffolds = {name: replace(s, start=s.start + _scaffold_delta(layout, s.name, s.members, delta),
                               end=s.end + _scaffold_delta(layout, s.name, s.members, delta))
                 for name, s in layout.scaffolds.items()}
    nodes = tuple(sorted((_shift_node(layout, n, delta, text_moves) for n in layout.nodes),
                         key=lambda n: (n.start, -n.length)))
    return replace(layout, length=position, modules=MappingProxyType(modules), unions=MappingProxyType(unions),
                   scaffolds=MappingProxyType(scaffolds), nodes=nodes, folded=True)


def _subtree(layout: Layout, name: str) -> list[str]:
    names = [name]
    for child in layout.modules[name].children:
        names += _subtree(layout, child)
    return names


def _shift_module(module: ModuleLayout, d: int) -> ModuleLayout:
    return replace(module, start=module.start + d, end=module.end + d,
                   pieces=tuple(Piece(p.start + d, p.tokens, p.param) for p in module.pieces))


def _scaffold_delta(layout: Layout, name: str, members: tuple[str, ...], delta: dict[str, int]) -> int:
    moves = {delta[m] for m in members}
    if len(moves) > 1:
        raise SchemaError(f"schema {layout.schema!r} is longer than the context, so its top-level modules are "
                          f"encoded apart, but scaffold {name!r} spans several of them ({', '.join(members)}); "
                          "put the scaffold inside one module, or raise n_ctx so that the schema fits")
    return moves.pop() if moves else 0


def _shift_node(layout: Layout, node: NodeLayout, delta: dict[str, int], text_moves: dict[int, int]) -> NodeLayout:
    """Returns `node` at its folded position (the module that holds it, or ROOT's moved text)."""
    owner = node.name if node.kind == "module" else node.parent
    if node.kind == "union":
        union = layout.unions[node.name]
        owner = union.members[0] if union.members else None
    elif node.kind == "scaffold":
        members = layout.scaffolds[node.name].members
        owner = members[0] if members else None
    if owner is not None and owner in delta:
        return replace(node, start=node.start + delta[owner])
    return replace(node, start=text_moves.get(node.start, node.start))
