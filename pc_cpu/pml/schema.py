"""Gives the Schema tree of a PML `<schema>` document.

A schema declares the reusable parts of prompts:

    <schema name="trip">
      <system>You plan trips.</system>            role text, rendered by the chat template
      <module name="plan">Plan <param name="days" len="4"/> days in
        <union name="city">                          at most one member per prompt
          <module name="paris">Paris ...</module>
          <module name="tokyo">Tokyo ...</module>
        </union>
      </module>
      <scaffold name="both">...modules...</scaffold>  also encoded jointly (see pc_cpu.pml.layout)
    </schema>

Text outside any module is anonymous and always included. Text is taken as
written except for XML indentation: whitespace-only text that contains a newline
is dropped, and one leading newline-plus-indent and one trailing newline-plus-indent
are trimmed from every text run. Use `&#10;` where a newline must stay.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from pc_cpu.errors import PromptCacheError, SchemaError
from pc_cpu.pml.recompute import RecomputePolicy, parse_policy
from pc_cpu.pml.text import escape_attribute, escape_text
from pc_cpu.pml.xmltree import Element, Text, parse_xml, restore_newlines

ROLES = ("system", "user", "assistant")
RESERVED_NAMES = frozenset({"prompt", "schema", "union", "param", "scaffold", *ROLES})
MAX_PARAM_LEN = 4096
XML_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_LEADING_INDENT = re.compile(r"^[ \t]*\r?\n[ \t]*")
_TRAILING_INDENT = re.compile(r"\r?\n[ \t]*$")


@dataclass(frozen=True)
class TextNode:
    text: str
    line: int


@dataclass(frozen=True)
class ParamNode:
    name: str
    length: int  # tokens reserved for the argument
    line: int


@dataclass(frozen=True)
class RoleNode:
    role: str  # one of ROLES
    children: tuple["Child", ...]
    line: int


@dataclass(frozen=True)
class ModuleNode:
    name: str
    children: tuple["Child", ...]
    line: int
    recompute: RecomputePolicy | None = None  # the module's own recompute policy (wins over the call's)


@dataclass(frozen=True)
class UnionNode:
    name: str
    members: tuple[ModuleNode, ...]
    line: int


@dataclass(frozen=True)
class ScaffoldNode:
    name: str
    children: tuple["Child", ...]
    line: int


Child = Union[TextNode, ParamNode, RoleNode, ModuleNode, UnionNode, ScaffoldNode]


@dataclass(frozen=True)
class Schema:
    name: str
    children: tuple[Child, ...]
    source: str  # the PML text, kept for hashing and re-encoding

    def uses_roles(self) -> bool:
        """Returns True when any <system>/<user>/<assistant> appears in the schema."""
        return any(isinstance(n, RoleNode) for n in walk(self.children))


def walk(children: tuple[Child, ...]):
    """Yields every node below `children`, depth first, in document order."""
    for node in children:
        yield node
        if isinstance(node, UnionNode):
            yield from walk(node.members)
        elif not isinstance(node, (TextNode, ParamNode)):
            yield from walk(node.children)


def render_schema(name: str, children: tuple[Child, ...]) -> str:
    """Returns the compact `<schema>` PML that parse_schema reads back as these nodes (lines aside).

    No whitespace is added and text keeps its newlines as references, so nothing is trimmed on the
    way back. A union named by the parser (`#union<n>`, unnamed in its source) is written unnamed.
    """
    return f"<schema name=\"{escape_attribute(name)}\">{_render(children)}</schema>"


def _render(children: tuple[Child, ...]) -> str:
    return "".join(_render_node(node) for node in children)


def _render_node(node: Child) -> str:
    if isinstance(node, TextNode):
        return escape_text(node.text)
    if isinstance(node, ParamNode):
        return f"<param name=\"{escape_attribute(node.name)}\" len=\"{node.length}\"/>"
    if isinstance(node, ModuleNode):
        policy = "" if node.recompute is None else f" recompute=\"{escape_attribute(str(node.recompute))}\""
        return f"<module name=\"{escape_attribute(node.name)}\"{policy}>{_render(node.children)}</module>"
    if isinstance(node, UnionNode):
        name = "" if node.name.startswith("#") else f" name=\"{escape_attribute(node.name)}\""
        return f"<union{name}>{_render(node.members)}</union>"
    if isinstance(node, ScaffoldNode):
        return f"<scaffold name=\"{escape_attribute(node.name)}\">{_render(node.children)}</scaffold>"
    return f"<{node.role}>{_render(node.children)}</{node.role}>"


def normalize_text(text: str) -> str:
    """Returns `text` without XML indentation (see the module docstring)."""
    if not text.strip() and "\n" in text:
        return ""
    return restore_newlines(_TRAILING_INDENT.sub("", _LEADING_INDENT.sub("", text, count=1), count=1))


def check_name(name: str | None, *, what: str, line: int) -> str:
    """Returns `name` if it can name a module, schema or param; raises SchemaError otherwise."""
    if not name:
        raise SchemaError(f"<{what}> needs a name attribute, e.g. <{what} name=\"docs\">", line=line)
    if not XML_NAME.match(name):
        raise SchemaError(f"{what} name {name!r} is not an XML name; use letters, digits, '_', '-', '.' "
                          "and start with a letter or '_'", line=line)
    if what == "module" and name in RESERVED_NAMES:
        raise SchemaError(f"module name {name!r} is reserved; rename the module "
                          f"(reserved: {', '.join(sorted(RESERVED_NAMES))})", line=line)
    return name


def parse_schema(source: str | bytes) -> Schema:
    """Returns the Schema that a `<schema>` PML document declares.

    Raises:
        PMLSyntaxError: the text is not well-formed or safe XML.
        SchemaError: it breaks a PML rule; the message names the element and the fix.
    """
    root = parse_xml(source, what="schema")
    if root.tag != "schema":
        raise SchemaError(f"root element is <{root.tag}>; a schema starts with <schema name=\"...\">",
                          line=root.line)
    _reject_attrs(root, {"name"})
    name = check_name(root.attrs.get("name"), what="schema", line=root.line)
    parser = _SchemaParser()
    children = parser.children(root, in_module=None)
    text = source.decode("utf-8") if isinstance(source, bytes) else source
    return Schema(name=name, children=children, source=text)


class _SchemaParser:
    """Turns Elements into schema nodes; tracks names to reject duplicates."""

    def __init__(self) -> None:
        self.module_lines: dict[str, int] = {}
        self.module_params: dict[str | None, set[str]] = {}
        self.union_count = 0
        self.other_names: set[str] = set()
        self.other_lines: dict[str, int] = {}

    def children(self, element: Element, *, in_module: str | None, in_role: bool = False) -> tuple[Child, ...]:
        nodes: list[Child] = []
        params_here = self.module_params.setdefault(in_module, set())
        for child in element.children:
            if isinstance(child, Text):
                text = normalize_text(child.value)
                if text:
                    nodes.append(TextNode(text, child.line))
                continue
            node = self.element(child, in_module=in_module, in_role=in_role)
            if isinstance(node, ParamNode):
                if node.name in params_here:
                    raise SchemaError(f"param {node.name!r} appears twice in module {in_module!r}; "
                                      "give each param its own name", line=node.line)
                params_here.add(node.name)
            nodes.append(node)
        return tuple(nodes)

    def element(self, el: Element, *, in_module: str | None, in_role: bool) -> Child:
        if el.tag == "module":
            return self.module(el, in_role=in_role)
        if el.tag == "union":
            return self.union(el, in_role=in_role)
        if el.tag == "param":
            return self.param(el, in_module)
        if el.tag in ROLES:
            if in_role:
                raise SchemaError(f"<{el.tag}> is inside another role tag; close the first role before "
                                  f"opening <{el.tag}>", line=el.line)
            _reject_attrs(el, set())
            return RoleNode(el.tag, self.children(el, in_module=in_module, in_role=True), el.line)
        if el.tag == "scaffold":
            _reject_attrs(el, {"name"})
            name = self.unique_other(check_name(el.attrs.get("name"), what="scaffold", line=el.line), el)
            children = self.children(el, in_module=in_module, in_role=in_role)
            if not any(isinstance(c, (ModuleNode, UnionNode)) for c in walk(children)):
                raise SchemaError(f"scaffold {name!r} holds no module; wrap the modules it should encode "
                                  "jointly", line=el.line)
            return ScaffoldNode(name, children, el.line)
        raise SchemaError(f"unknown element <{el.tag}> in a schema; use module, union, param, scaffold, "
                          "system, user or assistant (write a literal '<' as &lt;)", line=el.line)

    def module(self, el: Element, *, in_role: bool = False) -> ModuleNode:
        _reject_attrs(el, {"name", "recompute"})
        name = check_name(el.attrs.get("name"), what="module", line=el.line)
        if name in self.module_lines or name in self.other_names:
            raise SchemaError(f"module name {name!r} is used twice (first on line "
                              f"{self.module_lines.get(name) or self.other_lines.get(name)}); module names must be "
                              "unique in a schema",
                              line=el.line)
        self.module_lines[name] = el.line
        children = self.children(el, in_module=name, in_role=in_role)
        if not children:
            raise SchemaError(f"module {name!r} is empty; give it text or remove it", line=el.line)
        return ModuleNode(name, children, el.line, _module_policy(el, name))

    def union(self, el: Element, *, in_role: bool) -> UnionNode:
        _reject_attrs(el, {"name"})
        self.union_count += 1
        if el.attrs.get("name"):
            name = self.unique_other(check_name(el.attrs["name"], what="union", line=el.line), el)
        else:
            name = self.unique_other(f"#union{self.union_count}", el)  # '#' keeps it apart from user names
        for child in el.children:
            if isinstance(child, Text) and child.value.strip():
                raise SchemaError(f"union {name!r} holds text {child.value.strip()[:30]!r}; a union holds only "
                                  "<module> elements: move the text into a module or outside the union",
                                  line=child.line)
        members = []
        for child in el.elements():
            if child.tag != "module":
                raise SchemaError(f"union {name!r} holds <{child.tag}>; a union holds only <module> elements",
                                  line=child.line)
            members.append(self.module(child, in_role=in_role))
        if not members:
            raise SchemaError(f"union {name!r} has no module; add <module> members or remove it", line=el.line)
        return UnionNode(name, tuple(members), el.line)

    def param(self, el: Element, in_module: str | None) -> ParamNode:
        _reject_attrs(el, {"name", "len"})
        name = check_name(el.attrs.get("name"), what="param", line=el.line)
        if in_module is None:
            raise SchemaError(f"param {name!r} is outside any module; put it inside the <module> it belongs to",
                              line=el.line)
        if el.children:
            raise SchemaError(f"param {name!r} has content; write it as an empty tag <param name=\"{name}\" "
                              "len=\"N\"/>", line=el.line)
        raw = el.attrs.get("len")
        try:
            length = int(raw) if raw is not None else 0
        except ValueError:
            length = 0
        if not 1 <= length <= MAX_PARAM_LEN:
            raise SchemaError(f"param {name!r} in module {in_module!r} has len={raw!r}; len must be a whole "
                              f"number of tokens from 1 to {MAX_PARAM_LEN}", line=el.line)
        return ParamNode(name, length, el.line)

    def unique_other(self, name: str, el: Element) -> str:
        if name in self.other_names or name in self.module_lines:
            raise SchemaError(f"name {name!r} is used twice; union, scaffold and module names must be unique",
                              line=el.line)
        self.other_names.add(name)
        self.other_lines[name] = el.line
        return name


def _module_policy(el: Element, name: str) -> RecomputePolicy | None:
    if "recompute" not in el.attrs:
        return None
    try:
        return parse_policy(el.attrs["recompute"])
    except PromptCacheError as exc:
        raise SchemaError(f"module {name!r}: {exc}", line=el.line) from None


def _reject_attrs(el: Element, allowed: set[str]) -> None:
    extra = sorted(set(el.attrs) - allowed)
    if extra:
        allowed_text = ", ".join(sorted(allowed)) if allowed else "none"
        raise SchemaError(f"<{el.tag}> has unknown attribute {extra[0]!r}; allowed: {allowed_text}", line=el.line)
