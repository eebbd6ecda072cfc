"""Property tests of the PML pipeline: random well-formed schemas and prompts, and fuzzed documents.

Schemas are random trees of text, modules, unions, params, roles and scaffolds with unique names;
prompts import a random subset of their modules (respecting nesting and unions) with arguments
within len, then free text. Layout and plan invariants must hold for all of them, and mangled
documents must fail only with PromptCacheError.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pc_cpu.errors import PromptCacheError
from pc_cpu.pml.layout import ROOT, build_layout
from pc_cpu.pml.plan import CopyCells, DecodeTokens, build_plan
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.roles import PLAIN_MARKUP
from pc_cpu.pml.schema import parse_schema
from tests.fake_tokenizer import WordTokenizer
from tests.pml.conftest import TRIP

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

WORDS = st.sampled_from(["alpha", "beta", "gamma", "delta", "x", "y", "z"])
ROLE_NAMES = ("system", "user", "assistant")
MAX_DEPTH = 3


# --- a model of the generated schema ------------------------------------------------------------

@dataclass
class Node:
    kind: str  # "text", "module", "union", "param", "role", "scaffold"
    name: str = ""  # module/union/param/scaffold name, or the role; "" for an unnamed union
    text: str = ""
    length: int = 0  # a param's len
    children: list["Node"] = field(default_factory=list)

    def pml(self) -> str:
        inner = "".join(c.pml() for c in self.children)
        if self.kind == "text":
            return self.text
        if self.kind == "param":
            return f'<param name="{self.name}" len="{self.length}"/>'
        if self.kind == "role":
            return f"<{self.name}>{inner}</{self.name}>"
        if self.kind == "union" and not self.name:
            return f"<union>{inner}</union>"
        return f'<{self.kind} name="{self.name}">{inner}</{self.kind}>'


@st.composite
def schema_trees(draw) -> tuple[str, list[Node]]:
    """Returns (schema PML, top-level nodes) of a random well-formed schema."""
    counter = itertools.count()

    def text() -> Node:
        return Node("text", text=" " + " ".join(draw(st.lists(WORDS, min_size=1, max_size=3))) + " ")

    def module(depth: int, in_role: bool) -> Node:
        name = f"m{next(counter)}"
        return Node("module", name, children=[text()] + children(depth + 1, in_module=True, in_role=in_role))

    def children(depth: int, *, in_module: bool, in_role: bool) -> list[Node]:
        kinds = ["text", "module"]
        if depth < MAX_DEPTH:
            kinds += ["union", "scaffold"] + ([] if in_role else ["role"])
        if in_module:
            kinds.append("param")
        nodes = []
        for kind in draw(st.lists(st.sampled_from(kinds), max_size=3 if depth < MAX_DEPTH else 1)):
            if kind == "text":
                nodes.append(text())
            elif kind == "module":
                nodes.append(module(depth, in_role))
            elif kind == "param":
                nodes.append(Node("param", f"p{next(counter)}", length=draw(st.integers(1, 4))))
            elif kind == "role":
                nodes.append(Node("role", draw(st.sampled_from(ROLE_NAMES)),
                                  children=children(depth + 1, in_module=in_module, in_role=True)))
            elif kind == "union":
                named = draw(st.booleans())
                members = [module(depth, in_role) for _ in range(draw(st.integers(1, 3)))]
                nodes.append(Node("union", f"u{next(counter)}" if named else "", children=members))
            else:
                first = module(depth, in_role)
                rest = children(depth + 1, in_module=in_module, in_role=in_role)
                nodes.append(Node("scaffold", f"sc{next(counter)}", children=[first] + rest))
        return nodes

    top = children(0, in_module=False, in_role=False)
    return f'<schema name="gen">{"".join(n.pml() for n in top)}</schema>', top


def module_params(nodes: list[Node]) -> list[Node]:
    """Returns the params among `nodes` that belong to their enclosing module (roles and scaffolds are
    transparent; child modules and unions own theirs)."""
    params = []
    for node in nodes:
        if node.kind == "param":
            params.append(node)
        elif node.kind in ("role", "scaffold"):
            params += module_params(node.children)
    return params


def inside(node: Node, kind: str) -> list[Node]:
    """Returns every node of `kind` below `node`, at any depth."""
    found = []
    for child in node.children:
        if child.kind == kind:
            found.append(child)
        found += inside(child, kind)
    return found


@st.composite
def prompts_for(draw, top: list[Node]) -> tuple[str, dict[str, dict[str, str]], list[tuple[str | None, str]]]:
    """Returns (prompt PML, {imported module: args}, [(role, text)] turns) of a random valid prompt.

    A scaffold whose modules take no arguments and hold no union is sometimes imported by name.
    """
    imported: dict[str, dict[str, str]] = {}

    def imports(nodes: list[Node]) -> str:
        written = []
        work = list(nodes)
        while work:
            node = work.pop(0)
            if node.kind in ("role", "text", "param"):
                work[:0] = node.children
                continue
            if node.kind == "scaffold":
                members = inside(node, "module")
                by_name = (not inside(node, "union") and not any(inside(m, "param") for m in members)
                           and draw(st.booleans()))
                if by_name:
                    imported.update({m.name: {} for m in members})
                    written.append(f"<{node.name}/>")
                else:
                    work[:0] = list(node.children)
                continue
            group = [node] if node.kind == "module" else node.children
            choice = draw(st.integers(-1, len(group) - 1))
            if choice < 0:
                continue
            module = group[choice]
            params = module_params(module.children)
            args = {p.name: " ".join(draw(st.lists(WORDS, max_size=p.length))) for p in params}
            imported[module.name] = args
            attrs = "".join(f' {k}="{v}"' for k, v in args.items())
            inner = imports(module.children)
            written.append(f"<{module.name}{attrs}>{inner}</{module.name}>" if inner else f"<{module.name}{attrs}/>")
        if draw(st.booleans()):
            written.reverse()  # import order does not matter; positions come from the schema
        return "".join(written)

    body = imports(top)
    turns: list[tuple[str | None, str]] = []
    for role in draw(st.lists(st.sampled_from((None,) + ROLE_NAMES), max_size=3)):
        if turns and turns[-1][0] == role:
            continue  # adjacent turns of one role merge; keep them distinct
        turns.append((role, " ".join(draw(st.lists(WORDS, min_size=1, max_size=3)))))
    body += "".join(text if role is None else f"<{role}>{text}</{role}>" for role, text in turns)
    return f'<prompt schema="gen">{body}</prompt>', imported, turns


def free_text_tokens(tok: WordTokenizer, turns, chat: bool) -> list[int]:
    """The free text as PML prompt docs describe it: turns with role markup in a chat, then the generation prompt."""
    tokens: list[int] = []
    for i, (role, text) in enumerate(turns):
        role = role or ("user" if chat else None)
        if role is None:
            tokens += tok.tokenize(text, special=False)
            continue
        tokens += tok.tokenize(PLAIN_MARKUP.prefix[role], special=True) + tok.tokenize(text, special=False)
        if not (role == "assistant" and i == len(turns) - 1):
            tokens += tok.tokenize(PLAIN_MARKUP.suffix[role], special=True)
    if chat and not (turns and turns[-1][0] == "assistant"):
        tokens += tok.tokenize(PLAIN_MARKUP.generation_prompt, special=True)
    return tokens


# --- layout invariants --------------------------------------------------------------------------

@PROPERTY
@given(schema_trees())
def test_layout_invariants(tree):
    pml, _ = tree
    layout = build_layout(parse_schema(pml), WordTokenizer(), PLAIN_MARKUP)

    for union in layout.unions.values():
        members = [layout.modules[m] for m in union.members]
        assert {m.start for m in members} == {union.start}
        assert union.length == max(m.end - m.start for m in members)
        assert all(m.union == union.name for m in members)
    for module in layout.modules.values():
        assert 0 <= module.start <= module.end <= layout.length
        if module.name != ROOT:
            assert module.start < module.end
            parent = layout.modules[module.parent]
            assert parent.start <= module.start and module.end <= parent.end
            assert module.name in parent.children
        starts = [p.start for p in module.pieces]
        assert starts == sorted(starts)
        for a, b in zip(module.pieces, module.pieces[1:]):
            assert a.end <= b.start
        assert all(module.start <= p.start and p.end <= module.end for p in module.pieces)
    for node in layout.nodes:
        assert 0 <= node.start and node.start + node.length <= layout.length
    assert layout.modules[ROOT].start == 0 and layout.modules[ROOT].end == layout.length


# --- plan invariants ----------------------------------------------------------------------------

@PROPERTY
@given(st.data())
def test_plan_invariants(data):
    pml, top = data.draw(schema_trees())
    prompt_pml, imported, turns = data.draw(prompts_for(top))
    tok = WordTokenizer()
    layout = build_layout(parse_schema(pml), tok, PLAIN_MARKUP)
    prompt = parse_prompt(prompt_pml)

    plan = build_plan(layout, prompt, tok, PLAIN_MARKUP)

    assert set(plan.modules) == {ROOT, *imported}
    assert all(len(op.tokens) > 0 for op in plan.ops)
    for before, after in zip(plan.ops, plan.ops[1:]):
        assert before.end <= after.start
    assert list(plan.positions) == sorted(set(plan.positions))
    assert isinstance(plan.ops[-1], DecodeTokens)
    assert plan.cached_tokens + plan.uncached_tokens == len(plan.tokens) == len(plan.positions)

    at = dict(zip(plan.positions, plan.tokens))
    written = [m for item in prompt.imports
               for m in (layout.scaffolds[item.name].members if item.name in layout.scaffolds else [item.name])
               if layout.modules[m].parent == ROOT]
    in_schema_order = written == sorted(written, key=lambda m: layout.modules[m].start)
    assert in_schema_order or not any(op.source for op in plan.ops if isinstance(op, CopyCells))
    for op in plan.ops:
        if isinstance(op, CopyCells) and op.source is not None:  # a complete scaffold's joint encoding
            scaffold = layout.scaffolds[op.source.removeprefix("scaffold:")]
            assert op.module in scaffold.members
            assert all(m in imported for m in scaffold.members)
        if isinstance(op, CopyCells):
            layout_tokens = {p: t for piece in layout.modules[op.module].pieces
                             for p, t in zip(range(piece.start, piece.end), piece.tokens)}
            assert op.tokens == tuple(layout_tokens[p] for p in range(op.encoded_at, op.encoded_at + len(op.tokens)))
            assert in_schema_order or op.start <= layout.length  # packed: moved, never past the schema's span
    if not in_schema_order:  # packed: the cached modules come back to back after the preamble, in the written order
        starts = [min(op.start for op in plan.ops if isinstance(op, CopyCells) and op.module == m)
                  for m in written if any(isinstance(op, CopyCells) and op.module == m for op in plan.ops)]
        assert starts == sorted(starts)
        return
    for scaffold in layout.scaffolds.values():
        if all(m in imported for m in scaffold.members):
            assert all(op.source is not None for op in plan.ops
                       if isinstance(op, CopyCells) and op.module in scaffold.members)
    for name in (ROOT, *imported):  # every schema token of an imported module is in place
        for piece in layout.modules[name].pieces:
            if name == ROOT and piece.start >= layout.preamble_end:
                continue  # ROOT text after the modules follows the prompt's last shared cell (plan docstring)
            if piece.param is None:
                assert [at.get(p) for p in range(piece.start, piece.end)] == list(piece.tokens)
            else:
                arg = tok.tokenize(imported[name][piece.param], special=False)
                assert [at.get(p) for p in range(piece.start, piece.start + len(arg))] == arg

    chat = layout.uses_roles or any(role for role, _ in turns)
    free = free_text_tokens(tok, turns, chat)
    assert plan.end <= layout.length + len(free)
    if free:
        assert list(plan.tokens[-len(free):]) == free
        assert list(plan.positions[-len(free):]) == list(range(plan.end - len(free), plan.end))


# --- fuzzing ------------------------------------------------------------------------------------

VALID_PROMPT = '<prompt schema="trip">\n  <plan days="3 days"><paris/></plan>\n  <user>Where?</user>\n</prompt>'
NOISE = st.sampled_from(list('<>/="&;#!?-[]\'x \n\t') + ["<module", "</", "/>", "&#10;", "&lt;", "<!DOCTYPE",
                                                         "<param", "<union>", "\ue000", "\x00", "\ud800"])


@st.composite
def mutations(draw, document: str) -> str:
    text = document
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        if op == "insert":
            text = text[:i] + draw(NOISE) + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 5)):]
        else:
            text = text[:i] + draw(NOISE) + text[i + 1:]
    return text


def run_pipeline(schema_text, prompt_text, fallback_schema: str = TRIP) -> None:
    """Parses, lays out and plans; lets only PromptCacheError through.

    When `schema_text` is refused, the prompt is planned against the valid `fallback_schema`.
    """
    tok = WordTokenizer()
    try:
        layout = build_layout(parse_schema(schema_text), tok, PLAIN_MARKUP)
    except PromptCacheError:
        layout = build_layout(parse_schema(fallback_schema), tok, PLAIN_MARKUP)
    try:
        build_plan(layout, parse_prompt(prompt_text), tok, PLAIN_MARKUP)
    except PromptCacheError:
        pass


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_prompt_cache_errors(data):
    for parse in (parse_schema, parse_prompt):
        try:
            parse(data)
        except PromptCacheError:
            pass


@FUZZ
@given(st.text(max_size=200))
def test_random_text_raises_only_prompt_cache_errors(text):
    run_pipeline(text, text)


@FUZZ
@given(mutations(TRIP), mutations(VALID_PROMPT))
def test_mutated_documents_raise_only_prompt_cache_errors(schema_text, prompt_text):
    run_pipeline(schema_text, prompt_text)


@PROPERTY
@given(st.data())
def test_mutated_generated_documents_raise_only_prompt_cache_errors(data):
    pml, top = data.draw(schema_trees())
    prompt_pml, _, _ = data.draw(prompts_for(top))
    run_pipeline(data.draw(mutations(pml)), data.draw(mutations(prompt_pml)), pml)
