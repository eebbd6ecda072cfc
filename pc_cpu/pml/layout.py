"""Gives the Layout of a schema: the tokens and the fixed positions of every node.

Positions are what make modules reusable: a module's KV cells are computed at
its layout positions once, and every prompt that imports it uses them there.
Rules (paper §3.2): nodes follow each other in document order; a module's range
covers its own tokens and its children; union members all start where the union
starts, and the union reserves its longest member; a param reserves `len`
positions. All ranges are half-open, [start, end).

The anonymous text outside any module belongs to a pseudo-module named ROOT,
which every prompt includes. ROOT text before the first module (BOS, system
message) is the preamble and is cached; ROOT text after a module (role markup,
closing instructions) is computed in each prompt, so that it attends to the
modules that prompt imported. Wrap such text in a module to cache it instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from pc_cpu.errors import PromptError, SchemaError
from pc_cpu.pml.recompute import RecomputePolicy
from pc_cpu.pml.roles import RoleMarkup
from pc_cpu.pml.schema import (ModuleNode, ParamNode, RoleNode, ScaffoldNode, Schema, TextNode,
                               UnionNode, Child)
from pc_cpu.pml.tokenizer import Tokenizer

ROOT = "#root"  # the anonymous, always-included text of a schema
NODE_KINDS = ("text", "module", "union", "param", "scaffold")


@dataclass(frozen=True)
class Piece:
    """Tokens one module owns at positions [start, end); a param's placeholders when `param` is set."""

    start: int
    tokens: tuple[int, ...]
    param: str | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class Run:
    """Pieces of one module that sit at consecutive positions: what one decode can encode."""

    start: int
    tokens: tuple[int, ...]

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class ModuleLayout:
    name: str
    start: int
    end: int  # the range covers the module's own pieces and its children
    parent: str | None  # None only for ROOT
    union: str | None  # the union this module is a member of
    pieces: tuple[Piece, ...]  # the module's own tokens, in position order
    children: tuple[str, ...]  # modules directly inside (union members included)
    recompute: RecomputePolicy | None = None  # the schema's policy for this module, if it sets one

    @property
    def n_tokens(self) -> int:
        """Number of cells the module's own encoding occupies."""
        return sum(len(p.tokens) for p in self.pieces)

    def params(self) -> dict[str, Piece]:
        """Returns the module's param slots by name."""
        return {p.param: p for p in self.pieces if p.param is not None}

    def runs(self) -> tuple[Run, ...]:
        """Returns the own pieces merged into runs of consecutive positions."""
        runs: list[Run] = []
        for piece in self.pieces:
            if runs and runs[-1].end == piece.start:
                runs[-1] = Run(runs[-1].start, runs[-1].tokens + piece.tokens)
            else:
                runs.append(Run(piece.start, piece.tokens))
        return tuple(runs)


@dataclass(frozen=True)
class UnionLayout:
    name: str
    start: int
    length: int  # the longest member's length
    members: tuple[str, ...]
    parent: str  # ROOT or the enclosing module


@dataclass(frozen=True)
class ScaffoldLayout:
    name: str
    start: int
    end: int
    members: tuple[str, ...]  # every module inside the scaffold, nested ones included


@dataclass(frozen=True)
class NodeLayout:
    """One row of `pc-cpu inspect`: a node of the schema tree with its position range."""

    name: str  # a module, union, scaffold or param name; "#text" for text
    kind: str  # one of NODE_KINDS
    start: int
    length: int
    parent: str | None  # the enclosing module (ROOT's children have None)
    tokens: int  # tokens this node contributes to encodings (a union: 0, its members count)


@dataclass(frozen=True)
class Layout:
    schema: str
    length: int  # positions the whole schema spans
    modules: Mapping[str, ModuleLayout]  # ROOT first, then document order
    unions: Mapping[str, UnionLayout]
    scaffolds: Mapping[str, ScaffoldLayout]
    nodes: tuple[NodeLayout, ...]
    uses_roles: bool
    preamble_end: int  # where the first module starts; ROOT text from here on is computed per prompt
    folded: bool = False  # every top-level module starts at preamble_end (pc_cpu.pml.fold): prompts are packed

    def module(self, name: str) -> ModuleLayout:
        """Returns the named module's layout; raises PromptError naming the known modules."""
        try:
            return self.modules[name]
        except KeyError:
            known = ", ".join(n for n in self.modules if n != ROOT) or "none"
            raise PromptError(f"schema {self.schema!r} has no module {name!r}; its modules: {known}") from None

    def ancestors(self, name: str) -> list[str]:
        """Returns the modules enclosing `name`, outermost (ROOT) first."""
        chain: list[str] = []
        parent = self.modules[name].parent
        while parent is not None:
            chain.append(parent)
            parent = self.modules[parent].parent
        return chain[::-1]

    def is_cached(self, module: str, piece: Piece) -> bool:
        """Returns True when `piece` of `module` comes from an encoding (else each prompt computes it)."""
        return piece.param is None and (module != ROOT or piece.start < self.preamble_end)

    def cached_runs(self, name: str) -> tuple[Run, ...]:
        """Returns the runs of `name` that are encoded once and shared (ROOT: only the preamble)."""
        runs = self.modules[name].runs()
        return runs if name != ROOT else tuple(r for r in runs if r.start < self.preamble_end)

    @property
    def cached_cells(self) -> int:
        """Number of KV cells needed to hold every module's own encoding."""
        return sum(len(r.tokens) for name in self.modules for r in self.cached_runs(name))


@dataclass
class _Draft:
    """A module being laid out (mutable until the walk finishes)."""

    name: str
    start: int
    parent: str | None
    union: str | None
    pieces: list[Piece] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    end: int = 0
    recompute: RecomputePolicy | None = None


class _LayoutBuilder:
    def __init__(self, schema: Schema, tokenizer: Tokenizer, markup: RoleMarkup):
        self.schema = schema
        self.tokenizer = tokenizer
        self.markup = markup
        self.pos = 0
        self.drafts: dict[str, _Draft] = {}
        self.unions: dict[str, UnionLayout] = {}
        self.scaffolds: dict[str, ScaffoldLayout] = {}
        self.nodes: list[NodeLayout] = []

    def build(self) -> Layout:
        root = self.open_module(ROOT, parent=None, union=None)
        if self.tokenizer.bos_id is not None:
            self.add_text_tokens(root, (self.tokenizer.bos_id,))
        self.walk(self.schema.children, root)
        root.end = self.pos
        first_module = next((d.start for d in self.drafts.values() if d.name != ROOT), self.pos)
        modules = {name: ModuleLayout(d.name, d.start, d.end, d.parent, d.union, tuple(d.pieces),
                                      tuple(d.children), d.recompute) for name, d in self.drafts.items()}
        return Layout(schema=self.schema.name, length=self.pos, modules=MappingProxyType(modules),
                      unions=MappingProxyType(self.unions), scaffolds=MappingProxyType(self.scaffolds),
                      nodes=tuple(sorted(self.nodes, key=_parent_first)), uses_roles=self.schema.uses_roles(),
                      preamble_end=first_module)

    def open_module(self, name: str, *, parent: str | None, union: str | None) -> _Draft:
        draft = _Draft(name, self.pos, parent, union)
        self.drafts[name] = draft
        if parent is not None:
            self.drafts[parent].children.append(name)
        return draft

    def parent_name(self, owner: _Draft) -> str | None:
        return None if owner.name == ROOT else owner.name

    def add_text_tokens(self, owner: _Draft, tokens: tuple[int, ...]) -> None:
        if not tokens:
            return
        owner.pieces.append(Piece(self.pos, tokens))
        self.nodes.append(NodeLayout("#text", "text", self.pos, len(tokens), self.parent_name(owner), len(tokens)))
        self.pos += len(tokens)

    def walk(self, children: tuple[Child, ...], owner: _Draft) -> None:
        for node in children:
            if isinstance(node, TextNode):
                self.add_text_tokens(owner, tuple(self.tokenizer.tokenize(node.text, special=False)))
            elif isinstance(node, ParamNode):
                self.add_param(node, owner)
            elif isinstance(node, RoleNode):
                self.add_markup(owner, self.markup.prefix[node.role])
                self.walk(node.children, owner)
                self.add_markup(owner, self.markup.suffix[node.role])
            elif isinstance(node, ModuleNode):
                self.add_module(node, owner, union=None)
            elif isinstance(node, UnionNode):
                self.add_union(node, owner)
            elif isinstance(node, ScaffoldNode):
                self.add_scaffold(node, owner)

    def add_markup(self, owner: _Draft, text: str) -> None:
        if text:
            self.add_text_tokens(owner, tuple(self.tokenizer.tokenize(text, special=True)))

    def add_param(self, node: ParamNode, owner: _Draft) -> None:
        tokens = (self.tokenizer.placeholder_id,) * node.length
        owner.pieces.append(Piece(self.pos, tokens, param=node.name))
        self.nodes.append(NodeLayout(node.name, "param", self.pos, node.length, owner.name, node.length))
        self.pos += node.length

    def add_module(self, node: ModuleNode, owner: _Draft, *, union: str | None) -> None:
        draft = self.open_module(node.name, parent=owner.name, union=union)
        draft.recompute = node.recompute
        self.walk(node.children, draft)
        draft.end = self.pos
        if draft.end == draft.start:
            raise SchemaError(f"module {node.name!r} has no tokens; give it text", line=node.line)
        self.nodes.append(NodeLayout(node.name, "module", draft.start, draft.end - draft.start,
                                     self.parent_name(owner), sum(len(p.tokens) for p in draft.pieces)))

    def add_union(self, node: UnionNode, owner: _Draft) -> None:
        start, longest = self.pos, 0
        for member in node.members:
            self.pos = start
            self.add_module(member, owner, union=node.name)
            longest = max(longest, self.pos - start)
        self.pos = start + longest
        self.unions[node.name] = UnionLayout(node.name, start, longest, tuple(m.name for m in node.members),
                                             owner.name)
        self.nodes.append(NodeLayout(node.name, "union", start, longest, self.parent_name(owner), 0))

    def add_scaffold(self, node: ScaffoldNode, owner: _Draft) -> None:
        start = self.pos
        before = set(self.drafts)
        self.walk(node.children, owner)
        members = tuple(n for n in self.drafts if n not in before)
        self.scaffolds[node.name] = ScaffoldLayout(node.name, start, self.pos, members)
        self.nodes.append(NodeLayout(node.name, "scaffold", start, self.pos - start, self.parent_name(owner), 0))


_KIND_RANK = {"scaffold": 0, "union": 1, "module": 2, "param": 3, "text": 4}


def _parent_first(node: NodeLayout) -> tuple[int, int, int]:
    """Sort key: by start; at one start, enclosing nodes (longer, or container kinds) first."""
    return node.start, -node.length, _KIND_RANK[node.kind]


def build_layout(schema: Schema, tokenizer: Tokenizer, markup: RoleMarkup) -> Layout:
    """Returns the Layout of `schema`: every node's tokens and its [start, end) positions."""
    return _LayoutBuilder(schema, tokenizer, markup).build()
