"""Gives a schema's segments (pml.segment): what to compute, and after which context, for each encoding.

A module's cells are computed once and reused, so what they attended to at encode
time is fixed. Three modes:

- "preamble" (default): each run of a module is computed after the schema text
  that encloses it: ROOT's text before it (BOS, system message, role markup) and
  its ancestors' and its own earlier tokens. A module right after the preamble
  then gets exactly the cells a full prefill gives.
- "independent": attention confined to the module's own tokens, as in the paper.
- "chain": as "preamble", and a top-level module that starts right where another
  top-level module (not a union member) ends is computed after that module's
  cells too, shared from its encoding. That neighbour was computed after its own
  neighbour, so what each module absorbs from the modules before it is carried
  along the chain: a prompt importing the modules in schema order gets cells much
  closer to a full prefill's (bench/RESULTS.md), at no extra encoding cost. The
  price: a module's cells carry some of its neighbour's text even in a prompt that
  leaves the neighbour out, and changing one module changes the modules after it
  (their content addresses include the neighbour's: encoding_content).

When the context lies exactly at the positions before the run and is itself
encoded (a module right after the system message), its cells are shared from
where they are resident and only the run is computed. Otherwise the context is
decoded at the positions just before the run, so positions stay consecutive in
one llama_decode, and its cells are dropped afterwards.

Where the engine can move cells (pc_cpu.engine.prompts.schema_cells), a module not computed after
resident cells is computed at its *home*, its context from position 0 (home_segments),
and moved into place: its cells, and its content key, then do not depend on how long
the text before it is, so editing one module leaves the others' encodings alone.

A scaffold (`<scaffold name="x">`) is also encoded jointly: its members' runs are
computed in one sequence, each seeing the others before it, and kept under the
key `scaffold_key(x)` beside the members' own encodings (see scaffold_segment).
"""

from __future__ import annotations

from dataclasses import replace

from pc_cpu.errors import PromptCacheError, SchemaError
from pc_cpu.pml.content_keys import content_digest
from pc_cpu.pml.layout import ROOT, Layout, Run
from pc_cpu.pml.segment import Segment

ENCODING_MODES = ("preamble", "independent", "chain")
SCAFFOLD_PREFIX = "scaffold:"  # ':' cannot occur in a module name, so the keys never clash


def check_mode(mode: str) -> str:
    """Returns `mode` if it is an encoding mode; raises naming the valid ones."""
    if mode not in ENCODING_MODES:
        raise PromptCacheError(f"encoding mode {mode!r} is unknown; use one of: {', '.join(ENCODING_MODES)}")
    return mode


def segments_of(layout: Layout, key: str, mode: str) -> list[Segment]:
    """Returns the segments that compute encoding `key` (a module, or scaffold_key(name)) at its layout positions.

    A module has one segment per cached run, in position order (module_segments); a scaffold
    one segment of all its members' runs (scaffold_segment); an encoding with no cached tokens none.
    """
    if key.startswith(SCAFFOLD_PREFIX):
        segment = scaffold_segment(layout, key[len(SCAFFOLD_PREFIX):], mode)
        return [] if segment is None else [segment]
    return module_segments(layout, key, mode)


def module_segments(layout: Layout, module: str, mode: str) -> list[Segment]:
    """Returns the segments that encode `module`'s own tokens, one per run, in position order."""
    check_mode(mode)
    owners = [module] if mode == "independent" else layout.ancestors(module) + [module]
    if module == ROOT:
        owners = [ROOT]
    segments = []
    for run in layout.cached_runs(module):
        before = sorted((p for owner in owners for p in layout.modules[owner].pieces if p.end <= run.start),
                        key=lambda p: p.start)
        context = tuple(t for p in before for t in p.tokens)
        segment = Segment(module, (run,), context, _shareable(layout, owners, before, run))
        if mode == "chain" and not segments:
            segment = _chained(layout, segment, before)
        segments.append(segment)
    return segments


def home_shift(layout: Layout, key: str, mode: str) -> int:
    """Returns how far encoding `key`'s layout positions lie after its home: 0 for encodings computed in place.

    An encoding's home is where its segments fall when the first one's context starts at
    position 0: the same relative positions, so (RoPE being relative) the same cells up to the
    rounding of the rotation, which then no longer depend on how long the text before the
    module is. Editing a module's length leaves the homes, and so the content keys, of the
    modules after it alone (pc_cpu.engine.prompts.schema_cells moves home cells into place). A scaffold's
    runs stay as far apart at home as in the layout. Computed in place: ROOT and chain links,
    scaffolds included (their neighbour's resident cells sit at layout positions).
    """
    if key == ROOT:
        return 0
    segments = segments_of(layout, key, mode)
    if not segments or any(segment.after is not None for segment in segments):
        return 0
    return segments[0].first_position


def home_segments(layout: Layout, key: str, mode: str) -> list[Segment]:
    """Returns segments_of(layout, key, mode) moved to the encoding's home (home_shift positions earlier).

    A moved segment shares no context: what is resident sits at layout positions, not at the home's.
    """
    shift = home_shift(layout, key, mode)
    moved = [segment.moved(shift) for segment in segments_of(layout, key, mode)]
    if any(segment.first_position < 0 for segment in moved):  # cannot happen for layouts build_layout makes
        raise SchemaError(f"encoding {key!r}: its runs' contexts do not fit before its home; report this schema")
    return moved


def encoded_after(layout: Layout, key: str, mode: str) -> str | None:
    """Returns the module whose resident cells encoding `key` is computed after (chain mode), if any."""
    segments = segments_of(layout, key, mode)
    return segments[0].after if segments else None


def _chained(layout: Layout, segment: Segment, before: list) -> Segment:
    """Returns the segment computed after its neighbour's cells too, when the chain applies (module docstring)."""
    if segment.name == ROOT or layout.modules[segment.name].parent != ROOT or any(
            p.end > layout.preamble_end for p in before):
        return segment  # nested, or after ROOT text that each prompt computes: preamble mode
    preamble = _shareable(layout, [ROOT], before, Run(layout.preamble_end, ())) if before else ()
    if before and not preamble:
        return segment
    siblings = layout.modules[ROOT].children
    union = layout.modules[segment.name].union
    neighbour = next((s for s in reversed(siblings[:siblings.index(segment.name)])
                      if union is None or layout.modules[s].union != union), None)
    runs = layout.cached_runs(neighbour) if neighbour is not None else ()
    if not runs or layout.modules[neighbour].union is not None or runs[-1].end != segment.start:
        return segment
    return replace(segment, context=segment.context + tuple(t for r in runs for t in r.tokens),
                   shared_context=preamble + tuple((neighbour, r.start, r.end) for r in runs), after=neighbour)


def _shareable(layout: Layout, owners: list[str], before: list, run: Run) -> tuple[tuple[str, int, int], ...]:
    """Returns the encoded ranges that tile [run.start - len(context), run.start), or () if they do not."""
    ranges: list[tuple[str, int, int]] = []
    expected = run.start - sum(len(p.tokens) for p in before)
    for piece in before:
        owner = next(o for o in owners if piece in layout.modules[o].pieces)
        inside_cached_run = any(r.start <= piece.start and piece.end <= r.end for r in layout.cached_runs(owner))
        if piece.start != expected or not inside_cached_run or owner == ROOT and piece.start >= layout.preamble_end:
            return ()
        if ranges and ranges[-1][0] == owner and ranges[-1][2] == piece.start:
            ranges[-1] = (owner, ranges[-1][1], piece.end)
        else:
            ranges.append((owner, piece.start, piece.end))
        expected = piece.end
    return tuple(ranges)


def encode_cells(layout: Layout, key: str, mode: str) -> int:
    """Returns the most KV cells computing encoding `key` holds at once: its runs, and the context it computes.

    A run's cells are computed once and shared (seq_cp) into the library, so they count
    once; a chain link's context is shared from resident cells and counts nothing.
    """
    segments = segments_of(layout, key, mode)
    runs = sum(segment.n_tokens for segment in segments)
    return runs + max(((0 if s.after else len(s.context)) for s in segments), default=0)


# --- scaffolds ---------------------------------------------------------------------------------

def scaffold_key(name: str) -> str:
    """Returns the key under which scaffold `name`'s joint encoding is stored (beside module names)."""
    return SCAFFOLD_PREFIX + name


def check_scaffolds(layout: Layout) -> None:
    """Raises SchemaError if a scaffold cannot be encoded jointly.

    A union member is refused: its siblings share its positions, so the joint
    encoding would have to pick one member, and a prompt importing every member
    of the scaffold could not exist (at most one union member per prompt).
    """
    for scaffold in layout.scaffolds.values():
        for member in scaffold.members:
            union = layout.modules[member].union
            if union is not None:
                raise SchemaError(f"scaffold {scaffold.name!r} holds module {member!r} of union {union!r}; "
                                  "a scaffold's modules are encoded together and union members exclude each "
                                  "other: move the union out of the scaffold")


def scaffold_segments(layout: Layout, mode: str) -> list[Segment]:
    """Returns one segment per scaffold of `layout` that has cached tokens, in document order."""
    segments = [scaffold_segment(layout, name, mode) for name in layout.scaffolds]
    return [segment for segment in segments if segment is not None]


def scaffold_segment(layout: Layout, name: str, mode: str) -> Segment | None:
    """Returns the segment that encodes scaffold `name` jointly, or None when its members cache nothing.

    Its runs are the members' cached runs in position order, adjacent ones merged, computed
    back to back (Segment.computed_starts) and then moved to their positions: each run sees
    the context and every earlier run, the joint encoding the paper asks for. Its name is
    scaffold_key(name). The context is the one the first member's first run gets on its own
    (module_segments), so a scaffold whose members follow each other right after the
    preamble gets exactly the cells a full prefill gives.
    """
    members = layout.scaffolds[name].members
    runs = sorted((run for m in members for run in layout.cached_runs(m)), key=lambda r: r.start)
    if not runs:
        return None
    merged: list[Run] = []
    for run in runs:
        if merged and merged[-1].end == run.start:
            merged[-1] = Run(merged[-1].start, merged[-1].tokens + run.tokens)
        else:
            merged.append(run)
    first = next(s for m in members for s in module_segments(layout, m, mode) if s.start == runs[0].start)
    return Segment(scaffold_key(name), tuple(merged), first.context, first.shared_context, first.after)


def scaffold_cells(layout: Layout) -> int:
    """Returns the KV cells the scaffolds' joint encodings keep (on top of layout.cached_cells)."""
    return sum(len(run.tokens) for s in layout.scaffolds.values() for m in s.members
               for run in layout.cached_runs(m))


def encoding_keys(layout: Layout, mode: str) -> list[str]:
    """Returns every encoding a schema keeps, in the order they must be made.

    Modules come in document order (ROOT and parents before children, whose
    context they may share), then the scaffolds' joint encodings.
    """
    modules = [name for name in layout.modules if layout.cached_runs(name)]
    return modules + [segment.name for segment in scaffold_segments(layout, mode)]


def encoding_runs(layout: Layout, key: str, mode: str) -> tuple[Run, ...]:
    """Returns the runs whose cells the encoding `key` (a module or scaffold_key) holds."""
    if key.startswith(SCAFFOLD_PREFIX):
        return tuple(run for segment in segments_of(layout, key, mode) for run in segment.runs)
    return layout.cached_runs(key)


# --- content addresses -------------------------------------------------------------------------

def encoding_content(layout: Layout, key: str, mode: str, *, at_home: bool = False) -> str:
    """Returns the content digest of encoding `key`: what its cells depend on (pc_cpu.store.keys).

    That is the tokens each segment computes (its context, then its runs) and the positions it
    computes them at, and in chain mode the content of the neighbour whose cells it
    attends to. Names do not enter it: the same text after the same preamble at the same
    position is one encoding, whichever schema declares it. `at_home`: the encoding is
    computed at its home (home_segments) and moved into place, so the positions are the
    home's: the same module text after the same context is one encoding wherever the
    schema puts it. An encoding computed in place (home_shift 0) gets the same digest
    either way, since it is the same computation.
    """
    check_mode(mode)
    segments = home_segments(layout, key, mode) if at_home else segments_of(layout, key, mode)
    # The two recipes predate Segment and are kept as they were, so stored entries keep their keys.
    if key.startswith(SCAFFOLD_PREFIX):
        if not segments:
            return content_digest(mode, "scaffold", [])
        (s,) = segments
        return content_digest(mode, "scaffold", s.first_position, list(s.context),
                              [[run.start, list(run.tokens)] for run in s.runs], _after(layout, s.after, mode, at_home))
    return content_digest(mode, "module", [[s.first_position, list(s.context), s.start, list(s.tokens),
                                            _after(layout, s.after, mode, at_home)] for s in segments])


def _after(layout: Layout, neighbour: str | None, mode: str, at_home: bool) -> str | None:
    return None if neighbour is None else encoding_content(layout, neighbour, mode, at_home=at_home)
