"""Gives the Plan of a prompt: the ordered operations that assemble its KV cache.

A Plan lists, in position order, which cells to share from encoded modules
(CopyCells) and which tokens to compute (DecodeTokens: parameter arguments at
their reserved slots, and the free text right after the last assembled
position). Executing it in order keeps llama.cpp's rule that a sequence's
decoded positions continue from its last one. The same Plan gives the baseline:
its tokens, in position order, are exactly what a full prefill computes.

Scaffolds: when a prompt imports every member of a scaffold (one by one, or all
at once by naming the scaffold, `<x/>`), the members' cells are shared from the
scaffold's joint encoding (CopyCells.source = "scaffold:x") instead of their own.
A prompt that imports only some members uses the members' own encodings.

Order: a prompt that imports its top-level modules in schema order gets them at
their schema positions, with the gaps the modules it leaves out make (the paper's
layout): their cells are shared as they were encoded. A prompt that writes them in
another order gets them in the order written, back to back after the preamble
("packed", `_packed_ops`): each module's cells are then moved to the position the
prompt gives them (CopyCells.home says where they were encoded). ROOT's text after
the preamble follows the modules, then the prompt's own text.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Union

from pc_cpu.errors import ArgumentTooLongError, PromptError
from pc_cpu.pml.encoding import scaffold_key
from pc_cpu.pml.layout import ROOT, Layout, ModuleLayout, Piece
from pc_cpu.pml.prompt import Import, Prompt
from pc_cpu.pml.recompute import NO_RECOMPUTE, RecomputePolicy, most_relevant
from pc_cpu.pml.roles import RoleMarkup
from pc_cpu.pml.tokenizer import Tokenizer


@dataclass(frozen=True)
class CopyCells:
    """Share the cells of `module` at positions [start, end) into the prompt, from encoding `source`."""

    module: str
    start: int
    tokens: tuple[int, ...]  # what those cells encode (the baseline computes them)
    source: str | None = None  # None: the module's own encoding; "scaffold:<name>": that scaffold's joint one
    home: int | None = None  # where the encoding holds these cells, when the prompt moves them elsewhere

    @property
    def encoded_at(self) -> int:
        """Returns the first position the encoding holds these cells at (`start` unless the prompt moves them)."""
        return self.start if self.home is None else self.home

    @property
    def moved(self) -> bool:
        return self.encoded_at != self.start

    @property
    def encoding(self) -> str:
        """Returns the key of the encoding that holds the cells: `source`, else the module's name."""
        return self.source or self.module

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class DecodeTokens:
    """Compute `tokens` at positions [start, end) of the prompt's sequence."""

    start: int
    tokens: tuple[int, ...]
    what: str  # e.g. "argument 'days' of module 'plan'" or "prompt text", for messages
    # The encoding (a module, or "scaffold:<name>") that computed these tokens' cells too (recomputed
    # tokens, the last token of a prompt that is all modules): the prompt computes them again where
    # they stand. None: tokens no encoding computed.
    recomputes: str | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


Op = Union[CopyCells, DecodeTokens]


@dataclass(frozen=True)
class Plan:
    schema: str
    ops: tuple[Op, ...]  # strictly increasing positions
    modules: tuple[str, ...]  # imported modules (ROOT first), in position order
    select: float = 0.0  # share of module tokens the engine recomputes by K/V deviation (recompute "select:")
    select_by_module: bool = False  # the engine refreshes them module by module ("select:…@module")

    @property
    def encodings(self) -> frozenset[str]:
        """Returns the keys of every encoding the plan shares cells from."""
        return frozenset(op.encoding for op in self.ops if isinstance(op, CopyCells))

    def encoding_of(self, module: str) -> str:
        """Returns the key of the encoding the plan shares `module`'s cells from (its own or a scaffold's)."""
        return next((op.encoding for op in self.ops if isinstance(op, CopyCells) and op.module == module), module)

    @property
    def tokens(self) -> tuple[int, ...]:
        """Returns every prompt token in position order: the input of the baseline prefill."""
        return tuple(t for op in self.ops for t in op.tokens)

    @property
    def positions(self) -> tuple[int, ...]:
        """Returns the position of each token of `tokens` in the assembled sequence."""
        return tuple(p for op in self.ops for p in range(op.start, op.end))

    @property
    def calls(self) -> tuple[tuple[int, int], ...]:
        """Returns the llama_decode calls that compute the plan's cells as the cached prompt does: [lo, hi) into `tokens`.

        The baseline (use_cache=False) decodes its tokens in exactly these calls, so its cells
        and the cached prompt's come from calls of the same shapes. llama.cpp's CPU kernels give
        a token's result by the shape of the call it is in: some weight types' matmuls
        (tinyBLAS's Q8_0/Q5_0/Q4_0 tiles, repacked 4-row tiles) round a row by its batch's size
        and its place in it. A full prefill in other calls agrees only to rounding, and a near
        tie then turns a greedy answer on one CPU and not on another (docs/concepts.md, "Same tokens, same
        answer"). The cached prompt's calls:
        - the cells it shares were computed when their encoding was: consecutive shared cells of
          one encoding (a module's run, a scaffold's members) are one call, which also covers the
          tokens the prompt computes again right after them (a `recompute=` tail, the last token
          of a prompt that is all modules);
        - every op it computes (arguments, recomputed tokens, its own text) is a call of its own,
          after the cells before it; one that recomputes tokens an earlier call covered
          (lo < the previous call's hi) replaces their cells.
        Every call is decoded in n_batch chunks from its start, as every computation is.
        """
        calls: list[tuple[int, int]] = []
        lo, previous = 0, None
        for op in self.ops:
            hi = lo + len(op.tokens)
            if isinstance(op, CopyCells) and isinstance(previous, CopyCells) and op.encoding == previous.encoding:
                calls[-1] = (calls[-1][0], hi)
            elif (isinstance(op, DecodeTokens) and isinstance(previous, CopyCells) and op.recomputes == previous.encoding
                  and op.start == previous.end):
                calls[-1] = (calls[-1][0], hi)
                calls.append((lo, hi))
            else:
                calls.append((lo, hi))
            lo, previous = hi, op
        return tuple(calls)

    @property
    def end(self) -> int:
        """Returns one past the last assembled position: where generation continues."""
        return self.ops[-1].end if self.ops else 0

    @property
    def cached_tokens(self) -> int:
        return sum(len(op.tokens) for op in self.ops if isinstance(op, CopyCells))

    @property
    def uncached_tokens(self) -> int:
        return sum(len(op.tokens) for op in self.ops if isinstance(op, DecodeTokens))

    @property
    def selected_tokens(self) -> int:
        """Returns how many shared module cells the engine computes again by deviation (`select`)."""
        shared = sum(len(op.tokens) for op in self.ops if isinstance(op, CopyCells) and op.module != ROOT)
        return round(self.select * shared)


def build_plan(layout: Layout, prompt: Prompt, tokenizer: Tokenizer, markup: RoleMarkup,
               recompute: RecomputePolicy = NO_RECOMPUTE) -> Plan:
    """Returns the Plan that assembles `prompt` from `layout`'s modules.

    `recompute` says which cached tokens of each module to compute again (see
    pc_cpu.pml.recompute); a module's own policy in the schema wins over it.

    Raises:
        PromptError: an import or argument does not match the schema (the message says which and the fix).
    """
    if prompt.schema != layout.schema:
        raise PromptError(f"prompt is for schema {prompt.schema!r}, not {layout.schema!r}")
    imported = _resolve_imports(layout, prompt.imports)
    text = _free_text_tokens(layout, prompt, tokenizer, markup)
    redo = (_recomputed_positions(layout, imported, recompute)
            | _relevant_positions(layout, imported, recompute.relevant, text))
    order = _written_order(layout, prompt.imports)
    if not layout.folded and order == sorted(order, key=lambda name: layout.modules[name].start):
        ops = _module_ops(layout, imported, _encoding_sources(layout, imported), tokenizer, redo)
        modules = tuple(sorted(imported, key=lambda name: (layout.modules[name].start, name != ROOT)))
    else:
        if recompute.select:
            raise PromptError("recompute 'select:' needs the modules in schema order; import them in the order "
                              "the schema declares them, or use another recompute policy")
        ops = _packed_ops(layout, imported, order, tokenizer, redo)
        modules = (ROOT,) + tuple(name for top in order for name in imported
                                  if name == top or top in layout.ancestors(name))
    end = ops[-1].end if ops else 0
    if text:
        _append_prompt_text(ops, DecodeTokens(end, tuple(text), "prompt text"),
                            _leading_markup(layout, prompt, tokenizer, markup))
    ops = _close_gaps_after_shared_cells(_ensure_last_is_decoded(ops))
    return Plan(layout.schema, tuple(ops), modules, recompute.select, recompute.select_by_module)


def _written_order(layout: Layout, imports: tuple[Import, ...]) -> list[str]:
    """Returns the top-level modules in the order the prompt writes them (a scaffold import: its members)."""
    order: list[str] = []
    for item in imports:
        if item.name in layout.scaffolds:
            order += [m for m in layout.scaffolds[item.name].members if layout.modules[m].parent == ROOT]
        else:
            order.append(item.name)
    return order


def _packed_ops(layout: Layout, imported: dict[str, dict[str, str]], order: list[str], tokenizer: Tokenizer,
                redo: frozenset[tuple[str, int]]) -> list[Op]:
    """Returns the ops of a prompt whose modules are placed in `order`, back to back after the preamble.

    Each top-level module comes with the modules nested in it and its arguments, moved
    as one block (gaps inside it, e.g. a short argument, stay). Every module uses its own
    encoding: a scaffold's joint encoding holds its members in schema order.
    """
    own = {name: None for name in imported}
    root = _module_ops(layout, {ROOT: {}}, own, tokenizer)
    ops = [op for op in root if op.start < layout.preamble_end]
    position = layout.preamble_end
    for top in order:
        block = {name: args for name, args in imported.items() if name == top or top in layout.ancestors(name)}
        block_ops = _module_ops(layout, block, own, tokenizer, redo)
        if not block_ops:
            continue
        delta = position - block_ops[0].start
        for op in block_ops:
            _append(ops, _shifted(op, delta))
        position = block_ops[-1].end + delta
    for op in root:  # ROOT's text after the preamble (e.g. a turn's closing markup): after every module
        if op.start >= layout.preamble_end:
            _append(ops, _shifted(op, position - op.start))
            position += len(op.tokens)
    return ops


def _shifted(op: Op, delta: int) -> Op:
    """Returns `op` placed `delta` positions later (earlier if negative); shared cells remember where they were encoded."""
    if delta == 0:
        return op
    if isinstance(op, CopyCells):
        return replace(op, start=op.start + delta, home=op.encoded_at)
    return replace(op, start=op.start + delta)


def _resolve_imports(layout: Layout, imports: tuple[Import, ...]) -> dict[str, dict[str, str]]:
    """Returns {module: arguments} for ROOT and every import, after checking them against the layout."""
    imported: dict[str, dict[str, str]] = {ROOT: {}}
    lines: dict[str, int] = {}

    def visit(item: Import, parent: str) -> None:
        if item.name in layout.scaffolds:
            for member in _scaffold_members(layout, item, parent):
                if member in imported:
                    raise PromptError(f"module {member!r} is imported twice (also by scaffold {item.name!r}); "
                                      "import it once", line=item.line)
                imported[member] = {}
                lines[member] = item.line
            return
        module = layout.module(item.name)
        if item.name in imported:
            raise PromptError(f"module {item.name!r} is imported twice; import it once", line=item.line)
        if module.parent != parent:
            raise PromptError(_nesting_message(layout, item.name), line=item.line)
        _check_args(layout, module, item)
        imported[item.name] = dict(item.args)
        lines[item.name] = item.line
        for child in item.children:
            visit(child, item.name)

    for item in imports:
        visit(item, ROOT)
    for union in layout.unions.values():
        chosen = [m for m in union.members if m in imported]
        if len(chosen) > 1:
            raise PromptError(f"module {chosen[1]!r} is in union {union.name!r} with {chosen[0]!r}: "
                              "import one of them", line=lines[chosen[1]])
    return imported


def _scaffold_members(layout: Layout, item: Import, parent: str) -> tuple[str, ...]:
    """Returns the modules a scaffold import `<x/>` stands for, after checking it is written where they go.

    `<x/>` imports every member of scaffold x, nested ones included. It is written
    where its outermost members would be imported: at the top level, or inside the
    import of the module that encloses the scaffold. It takes no arguments.
    """
    scaffold = layout.scaffolds[item.name]
    if item.args or item.children:
        raise PromptError(f"scaffold import <{item.name}/> takes no arguments or nested imports; import its "
                          f"modules one by one to pass arguments ({', '.join(scaffold.members)})", line=item.line)
    owner = layout.modules[scaffold.members[0]].parent  # the first member in document order is outermost
    if owner != parent:
        where = ("at the top level, outside other imports" if owner == ROOT else
                 f"inside the import of module {owner!r}, as <{owner}><{item.name}/></{owner}>")
        raise PromptError(f"scaffold {item.name!r} must be imported {where}", line=item.line)
    for member in scaffold.members:
        module = layout.modules[member]
        if module.union is not None:
            raise PromptError(f"scaffold {item.name!r} holds module {member!r} of union {module.union!r}; "
                              "import the modules one by one", line=item.line)
        if module.params():
            raise PromptError(f"scaffold {item.name!r} holds module {member!r}, which needs arguments for "
                              f"{', '.join(module.params())}; import the modules one by one", line=item.line)
    return scaffold.members


def _encoding_sources(layout: Layout, imported: dict[str, dict[str, str]]) -> dict[str, str | None]:
    """Returns {module: CopyCells.source} for every imported module: None (its own), or its scaffold's key.

    A scaffold counts when all its members are imported; when nested scaffolds
    both qualify, the one with more members (the outer one) wins.
    """
    sources: dict[str, str | None] = {name: None for name in imported}
    complete = [s for s in layout.scaffolds.values() if all(m in imported for m in s.members)]
    for scaffold in sorted(complete, key=lambda s: len(s.members)):  # larger ones overwrite smaller ones
        for member in scaffold.members:
            sources[member] = scaffold_key(scaffold.name)
    return sources


def _nesting_message(layout: Layout, name: str) -> str:
    chain = [a for a in layout.ancestors(name) if a != ROOT] + [name]
    written = "".join(f"<{a}>" for a in chain[:-1]) + f"<{name}/>" + "".join(f"</{a}>" for a in chain[-2::-1])
    if len(chain) == 1:
        return f"module {name!r} is a top-level module; import it outside other imports, as <{name}/>"
    return f"module {name!r} is inside module {chain[-2]!r}; import it nested, as {written}"


def _check_args(layout: Layout, module: ModuleLayout, item: Import) -> None:
    params = module.params()
    for arg in item.args:
        if arg not in params:
            names = ", ".join(sorted(params)) or "none"
            raise PromptError(f"module {module.name!r} has no param {arg!r}; its params: {names}", line=item.line)
    for name, slot in params.items():
        if name not in item.args:
            raise PromptError(f"module {module.name!r} needs an argument for param {name!r} (up to "
                              f"{len(slot.tokens)} tokens): write <{module.name} {name}=\"...\"/>",
                              line=item.line)


def _recomputed_positions(layout: Layout, imported, policy: RecomputePolicy) -> frozenset[tuple[str, int]]:
    """Returns the (module, cached position) pairs the policies say to compute again (ROOT's preamble never)."""
    chosen: set[tuple[str, int]] = set()
    for name in imported:
        module = layout.modules[name]
        own_policy = module.recompute or policy
        if name == ROOT or own_policy == NO_RECOMPUTE:
            continue
        cached = [p for piece in module.pieces if layout.is_cached(name, piece) for p in range(piece.start, piece.end)]
        chosen |= {(name, p) for p in own_policy.choose(cached)}
    return frozenset(chosen)


def _relevant_positions(layout: Layout, imported, count: int, query: list[int]) -> frozenset[tuple[str, int]]:
    """Returns every (module, cached position) of the `count` imported modules most like the prompt's own text."""
    if not count or not query:
        return frozenset()
    cached = {name: [(p, t) for piece in layout.modules[name].pieces if layout.is_cached(name, piece)
                     for p, t in zip(range(piece.start, piece.end), piece.tokens)]
              for name in sorted((n for n in imported if n != ROOT), key=lambda n: layout.modules[n].start)}
    top = most_relevant({name: [t for _, t in cells] for name, cells in cached.items()}, query, count)
    return frozenset((name, p) for name in top for p, _ in cached[name])


def _split_recomputed(piece: Piece, redo: frozenset[int]) -> list[tuple[bool, Piece]]:
    """Returns `piece` cut into runs that are recomputed (True) or shared (False), in order."""
    runs: list[tuple[bool, Piece]] = []
    for offset, token in enumerate(piece.tokens):
        pos = piece.start + offset
        again = pos in redo
        if runs and runs[-1][0] == again:
            last = runs[-1][1]
            runs[-1] = (again, Piece(last.start, last.tokens + (token,)))
        else:
            runs.append((again, Piece(pos, (token,))))
    return runs


def _module_ops(layout: Layout, imported: dict[str, dict[str, str]], sources: dict[str, str | None],
                tokenizer: Tokenizer, redo: frozenset[tuple[str, int]] = frozenset()) -> list[Op]:
    """Returns the ops that place every imported module's pieces, in position order.

    Cached pieces are shared from the encoding `sources` names for their module,
    except the (module, position) pairs in `redo`, which are computed again where they stand.
    """
    pieces = sorted(((p, name) for name in imported for p in layout.modules[name].pieces), key=lambda x: x[0].start)
    ops: list[Op] = []
    for piece, module in pieces:
        if layout.is_cached(module, piece):
            own = frozenset(p for m, p in redo if m == module)
            for again, part in _split_recomputed(piece, own) if own else [(False, piece)]:
                _append(ops, DecodeTokens(part.start, part.tokens, f"recomputed tokens of module {module!r}",
                                          recomputes=sources[module] or module)
                        if again else CopyCells(module, part.start, part.tokens, sources[module]))
        elif piece.param is None:
            _append(ops, DecodeTokens(piece.start, piece.tokens, "schema text after a module"))
        else:
            tokens = tuple(tokenizer.tokenize(imported[module][piece.param], special=False))
            if len(tokens) > len(piece.tokens):
                raise ArgumentTooLongError(
                    f"param {piece.param!r} of module {module!r}: argument is {len(tokens)} tokens > "
                    f"len={len(piece.tokens)}; shorten it or raise len in schema {layout.schema!r}")
            if tokens:
                _append(ops, DecodeTokens(piece.start, tokens, f"argument {piece.param!r} of module {module!r}"))
    return ops


def _append(ops: list[Op], op: Op) -> None:
    """Appends `op`, merged into the last op when both are contiguous and of one source (fewer calls)."""
    last = ops[-1] if ops else None
    if last is not None and last.end == op.start:
        if (isinstance(op, CopyCells) and isinstance(last, CopyCells) and last.module == op.module
                and last.encoded_at + len(last.tokens) == op.encoded_at):
            ops[-1] = replace(last, tokens=last.tokens + op.tokens)
            return
        if isinstance(op, DecodeTokens) and isinstance(last, DecodeTokens) and (
                op.recomputes == last.recomputes or not _continues_its_encoding(ops)):
            recomputes = last.recomputes if op.recomputes == last.recomputes else None
            ops[-1] = DecodeTokens(last.start, last.tokens + op.tokens, last.what, recomputes)
            return
    ops.append(op)


def _continues_its_encoding(ops: list[Op]) -> bool:
    """Returns whether the last op recomputes the tokens right after shared cells of the encoding that computed them.

    Plan.calls counts those tokens into that encoding's call, so the op stays apart from the
    decodes after it (merged, the baseline could not tell where the encoding's tokens end).
    """
    last, before = ops[-1], ops[-2] if len(ops) > 1 else None
    return (isinstance(last, DecodeTokens) and last.recomputes is not None and isinstance(before, CopyCells)
            and before.encoding == last.recomputes and before.end == last.start)


def _append_prompt_text(ops: list[Op], text: DecodeTokens, markup: int) -> None:
    """Appends the prompt's own text as decodes of their own: its first turn's role markup, then the rest.

    Kept apart from the schema text before them (never merged), everything before the
    prompt's own words is computed alike, in batches of its own, by every prompt that
    shares it, so a prompt stream that holds it can be reused (pc_cpu.engine.runtime.scheduler,
    PromptWork.head).
    """
    if 0 < markup < len(text.tokens):
        ops.append(DecodeTokens(text.start, text.tokens[:markup], "prompt markup"))
        text = DecodeTokens(text.start + markup, text.tokens[markup:], text.what)
    ops.append(text)


def _close_gaps_after_shared_cells(ops: list[Op]) -> list[Op]:
    """Returns ops whose schema and prompt text after the last shared cells follow the cells before them, with no gap.

    Text a prompt computes after its last imported module (schema text such as a turn's
    closing markup, and its own text) has no cells to line up with, so it goes right after
    that module rather than after the positions of modules the prompt left out. llama.cpp
    could only compute it there and move it (seq_add), and a move makes it re-rotate K over
    the whole prompt stream at the next decode. Module tokens (arguments, a recomputed last
    token) keep their positions.
    """
    last_copy = max((i for i, op in enumerate(ops) if isinstance(op, CopyCells)), default=-1)
    out = list(ops[:last_copy + 1])
    position = out[-1].end if out else 0
    for op in ops[last_copy + 1:]:
        if op.what in _FREE_TEXT and op.start != position:
            op = replace(op, start=position)
        out.append(op)
        position = op.end
    return out


_FREE_TEXT = ("schema text after a module", "prompt markup", "prompt text")


def _leading_markup(layout: Layout, prompt: Prompt, tokenizer: Tokenizer, markup: RoleMarkup) -> int:
    """Returns how many of the prompt text's first tokens are its first turn's role prefix (0 without roles)."""
    chat = layout.uses_roles or prompt.uses_roles
    if not chat or not prompt.turns:
        return 0
    role = prompt.turns[0].role or "user"
    return len(tokenizer.tokenize(markup.prefix[role], special=True))


def _free_text_tokens(layout: Layout, prompt: Prompt, tokenizer: Tokenizer, markup: RoleMarkup) -> list[int]:
    """Returns the tokens of the prompt's free text, with chat markup where roles are in use."""
    chat = layout.uses_roles or prompt.uses_roles
    tokens: list[int] = []
    for i, turn in enumerate(prompt.turns):
        role = turn.role or ("user" if chat else None)
        if role is None:
            tokens += tokenizer.tokenize(turn.text, special=False)
            continue
        is_open_answer = role == "assistant" and i == len(prompt.turns) - 1
        tokens += tokenizer.tokenize(markup.prefix[role], special=True)
        tokens += tokenizer.tokenize(turn.text, special=False)
        if not is_open_answer:
            tokens += tokenizer.tokenize(markup.suffix[role], special=True)
    if chat and not prompt.ends_with_assistant():
        tokens += tokenizer.tokenize(markup.generation_prompt, special=True)
    return tokens


def _ensure_last_is_decoded(ops: list[Op]) -> list[Op]:
    """Returns ops whose last op computes a token, so the model has logits to sample from.

    When every prompt token is cached, the last one is recomputed (as vLLM does).
    """
    if not ops:
        raise PromptError("the prompt is empty: import a module or write some text")
    last = ops[-1]
    if isinstance(last, DecodeTokens):
        return ops
    head = [replace(last, tokens=last.tokens[:-1])] if len(last.tokens) > 1 else []
    return ops[:-1] + head + [DecodeTokens(last.end - 1, last.tokens[-1:], f"last token of module {last.module!r}",
                                            recomputes=last.encoding)]
