"""Compiles Python prompt programs into PML (Prompt Cache, Gim et al. 2023, section 3.2.4).

A function decorated with @prompt_program is never run. Its body is read with `ast` and
translated into a PML schema; calling the decorated object with arguments gives the PML
prompt that imports the modules those arguments select:

    @prompt_program(params={"duration": 8})
    def trip(duration, city, budget=None):
        '''The docstring is ignored.'''
        with system:
            "You are a travel planner. "
        f"Plan a trip of {duration}. "
        match city:
            case "Paris":
                "Paris has museums. "
            case "Tokyo":
                "Tokyo has temples. "
        if budget:
            money(budget)  # money: a @prompt_program(params={"amount": 4}) of its own

    trip.schema_pml
    # <schema name="trip"><system>You are a travel planner. </system>
    # <module name="trip-duration">Plan a trip of <param name="duration" len="8"/>. </module>
    # <union><module name="trip-city-paris">Paris has museums. </module>
    # <module name="trip-city-tokyo">Tokyo has temples. </module></union>
    # <module name="trip-budget"><module name="money">...</module></module></schema>
    # (one line; broken here for reading)
    trip("3 days", "Paris", budget="500").with_user("Where can I surf?")
    # <prompt schema="trip"><trip-duration duration="3 days"/><trip-city-paris/>
    # <trip-budget><money amount="500"/></trip-budget>
    # <user>Where can I surf?</user></prompt>

Statements and what they become:
- a string literal: text, exactly as written (escaped for XML; newlines as `&#10;`). Nothing
  is inserted between statements, so put the spaces and newlines you want inside the strings.
  As in Python, a string that is the first statement of the function is its docstring and is
  ignored (a program with no other text is refused, saying so).
- an f-string whose placeholders are bare names of parameters declared in `params`:
  text with `<param name=... len=...>` at each placeholder (len from the decorator).
  Conversions (`!r`) and format specs are refused. A param is an argument slot of its
  module, so a param may appear once per module. PML puts params only inside modules:
  an f-string with placeholders outside any module (top level, or directly inside a
  role) becomes its own module `<program>-<param>[-<param>...]`, always imported.
- `if c:` without else: a module imported when c holds. `if/elif/else` chains: a
  `<union>` with one member per branch; the prompt imports the first branch that holds.
- `match p:` on a parameter: a `<union>`, one member per case. Case patterns may be
  literals, `None`/`True`/`False`, alternatives (`"a" | "b"`) and a final `case _:`.
  Guards and capture patterns are refused.
- conditions (`if`/`elif`): `p`, `not p` (truthiness), `p == lit`, `p != lit`,
  `p in (lit, ...)`, `p not in (lit, ...)`, with either side of `==`/`!=` the parameter.
  `p` must be a parameter of the function; it need not be in `params`.
- a call to another @prompt_program, as a statement: a module named after that program
  (its `.name`) holding its body, with its own params and conditions. Arguments of the
  call may be the caller's parameters or literals; they are matched to the callee's
  signature when the prompt is built. Recursion is refused.
- `with system:`, `with user:`, `with assistant:` (bare names, attributes such as
  `compiler.system`, or calls with no arguments): a chat-role block. Roles are allowed only
  at the top level of the outermost program, not inside a module or another role.
  The names `system`, `user`, `assistant` are exported here so linters see them defined.
- `pass` is ignored, and so is a final `return` / `return None`.
  Anything else (loops, assignments, other calls, returning a value...) raises CompileError
  with the Python file and line.

Naming (deterministic: the same source gives the same schema):
- the schema is named after the program (`name=` or the function's `__name__`);
- conditional modules are `<program>-<param>` for `if p`, `<program>-not-<param>` for
  `if not p`, `<program>-<param>-<literal>` for comparisons and cases (alternatives joined
  with `-or-`, negations add `not-`), `<program>-<param>-else` for `else` / `case _`.
  `<program>` is the program whose body holds the statement.
- literals are lowercased, accents dropped, other characters turned into `-`, cut to 32
  characters; a literal with no ASCII letter or digit becomes `v<8 hex of its SHA-256>`.
- a name already used in the schema gets `-2`, `-3`... in document order.
- names of nested programs are used as module names, so they must be XML names and not
  reserved PML words (prompt, schema, union, param, scaffold, system, user, assistant).

Prompt building:
- `program(*args, **kwargs)` binds the arguments to the function's signature (defaults
  apply; a missing argument raises PromptError) and returns a CompiledPrompt.
- a param argument is written with `str()`. Every param of an imported module needs one
  (pc_cpu.pml.plan requires it), so `None` for a param of a module being imported raises
  PromptError; put such text under `if p:` to make it optional. Conditions use Python
  truthiness and `==`.
- `CompiledPrompt.with_user(text)` returns the prompt with an uncached `<user>` turn
  appended after the imports (call it again for more turns). A CompiledPrompt is a str (the
  prompt PML) with `.schema_pml` and `.schema_name`, so an engine can load the schema first.

Compilation is lazy (first use of `.schema` / `.schema_pml` or a call), so a program may call
programs defined later in its file; callee names are looked up in the function's closure,
then its globals.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import re
import textwrap
import unicodedata
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from pc_cpu.errors import CompileError, PromptError
from pc_cpu.pml.schema import (RESERVED_NAMES, ROLES, XML_NAME, ModuleNode, ParamNode, RoleNode, TextNode,
                               UnionNode, render_schema)
from pc_cpu.pml.text import NOT_XML, check_xml_chars, escape_attribute, escape_text

_LITERAL_NAME_CHARS = 32
SUPPORTED = ("supported: string literals, f-strings of declared params, `if`/`elif`/`else` and `match` "
             "on a parameter, `with system:`/`with user:`/`with assistant:`, calls to @prompt_program "
             "functions, `pass`")


# --- the compiled tree: the schema's own nodes, and when each module is imported ----------------

@dataclass(frozen=True)
class Condition:
    """When a conditional module is imported, tested on the arguments of its program.

    `values is None` tests the truthiness of the argument; otherwise whether it equals one of
    `values` (Python `in`). `negated` flips the outcome.
    """

    param: str
    values: tuple[Any, ...] | None = None
    negated: bool = False

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        argument = arguments[self.param]
        outcome = bool(argument) if self.values is None else argument in self.values
        return outcome != self.negated


@dataclass(frozen=True)
class CallArgument:
    """One argument of a nested program call: a parameter of the caller, or a literal value."""

    param: str | None = None
    value: Any = None

    def resolve(self, arguments: Mapping[str, Any]) -> Any:
        return arguments[self.param] if self.param is not None else self.value


@dataclass(frozen=True)
class NestedCall:
    """How a nested program's arguments come from its caller's, at prompt time."""

    program: "PromptProgram"
    positional: tuple[CallArgument, ...]
    keywords: tuple[tuple[str, CallArgument], ...]

    def bind(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Returns the callee's arguments given the caller's."""
        positional = [a.resolve(arguments) for a in self.positional]
        keywords = {key: a.resolve(arguments) for key, a in self.keywords}
        return self.program.bind_arguments(*positional, **keywords)


@dataclass(frozen=True)
class Selection:
    """When the prompt imports a module of the compiled schema, and with which arguments."""

    # None: imported whenever its parent is; in a union, None marks the else branch.
    condition: Condition | None = None
    # Set for a nested program: conditions and params below see the callee's arguments.
    call: NestedCall | None = None

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        return self.condition is None or self.condition.holds(arguments)


Node = TextNode | ParamNode | ModuleNode | UnionNode | RoleNode  # what a program body compiles to


@dataclass(frozen=True)
class CompiledSchema:
    """A program's schema as pc_cpu.pml.schema nodes, with the rule that selects each module.

    A node's `line` is the line of the program's Python source it came from, not a PML line.
    """

    name: str
    children: tuple[Node, ...]
    selections: Mapping[str, Selection]  # module name -> when it is imported


# --- public API --------------------------------------------------------------------------------

class CompiledPrompt(str):
    """The PML of one prompt (this str), with the schema it imports from.

    Attributes:
        schema_name: the schema the prompt names.
        schema_pml: that schema's PML, so an engine can load it before the prompt.
    """

    def __new__(cls, schema_name: str, body: str, schema_pml: str) -> "CompiledPrompt":
        text = f"<prompt schema=\"{escape_attribute(schema_name)}\">{body}</prompt>"
        prompt = super().__new__(cls, text)
        prompt.schema_name = schema_name
        prompt.schema_pml = schema_pml
        prompt._body = body  # imports and turns, without the <prompt> tag
        return prompt

    def __getnewargs__(self) -> tuple[str, str, str]:
        return self.schema_name, self._body, self.schema_pml

    def with_user(self, text: str) -> "CompiledPrompt":
        """Returns this prompt with an uncached user turn appended after the imports.

        Args:
            text: the user's message, plain text (it is escaped here).
        Raises:
            PromptError: the text holds characters XML cannot carry.
        """
        turn = f"<user>{escape_text(text, 'user text')}</user>"
        return CompiledPrompt(self.schema_name, self._body + turn, self.schema_pml)


class PromptProgram:
    """A Python function compiled to a PML schema; calling it gives a CompiledPrompt.

    Attributes:
        name: the schema name (and the module name when another program calls this one).
        params: param name -> tokens reserved for its argument.
        signature: the function's signature, used to bind call arguments.
    """

    def __init__(self, function: Callable[..., Any], params: Mapping[str, int], name: str | None):
        self.function = function
        self.name = name if name is not None else function.__name__
        self.params = MappingProxyType(dict(params))
        self.signature = inspect.signature(function)
        _check_definition(self)
        functools.update_wrapper(self, function)

    def __repr__(self) -> str:
        return f"<PromptProgram {self.name!r} params={dict(self.params)}>"

    def __call__(self, *args: Any, **kwargs: Any) -> CompiledPrompt:
        """Returns the prompt importing the modules these arguments select.

        Raises:
            CompileError: the program cannot be compiled.
            PromptError: the arguments do not fit the signature or XML.
        """
        arguments = self.bind_arguments(*args, **kwargs)
        body = render_imports(self.schema, arguments)
        return CompiledPrompt(self.schema.name, body, self.schema_pml)

    @functools.cached_property
    def schema(self) -> CompiledSchema:
        """The compiled tree (compiled on first use)."""
        build = _SchemaBuild()
        children = _BodyCompiler(self, build, active=()).compile_body(in_module=None)
        if not children:
            raise self._source.error(self._source.function, f"prompt program {self.name!r} has no text; "
                                     "note that a string that is the first statement is the docstring")
        return CompiledSchema(self.name, children, MappingProxyType(build.selections))

    @functools.cached_property
    def schema_pml(self) -> str:
        """The whole `<schema>` document."""
        return render_schema(self.schema.name, self.schema.children)

    @functools.cached_property
    def _source(self) -> "_ProgramSource":
        return _load_source(self)

    def bind_arguments(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Returns every parameter's argument, defaults applied.

        Raises:
            PromptError: an argument is missing or unexpected.
        """
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise PromptError(f"prompt program {self.name!r}: {exc}; call it as "
                              f"{self.name}{self.signature}") from None
        bound.apply_defaults()
        return dict(bound.arguments)


def prompt_program(function: Callable[..., Any] | None = None, *, params: Mapping[str, int] | None = None,
                   name: str | None = None) -> Any:
    """Decorates a function as a prompt program (see the module docstring for the rules).

    Usable bare (`@prompt_program`) or with arguments:

        @prompt_program(params={"city": 8}, name="trip")
        def plan(city): f"Plan a visit to {city}."

    Args:
        params: parameters that are PML params (argument slots), mapped to their length in tokens.
        name: the schema / module name; defaults to the function's name.
    Returns:
        A PromptProgram, or a decorator making one.
    Raises:
        CompileError: params or name are invalid (the body is compiled later, on first use).
    """
    def decorate(func: Callable[..., Any]) -> PromptProgram:
        return PromptProgram(func, params or {}, name)

    if function is not None and not callable(function):
        raise TypeError(f"prompt_program takes a function; pass params as a keyword: "
                        f"@prompt_program(params={function!r})")
    return decorate(function) if function is not None else decorate


class _RoleMarker:
    """Marks a chat-role block (`with system:`) in a program body; bodies are compiled, never run."""

    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return self.role

    def __enter__(self) -> None:
        raise CompileError(f"`with {self.role}:` ran as Python; a prompt program's body is compiled, "
                           "not executed: call the @prompt_program object instead")

    def __exit__(self, *exc_info: object) -> None:
        return None


system = _RoleMarker("system")
user = _RoleMarker("user")
assistant = _RoleMarker("assistant")


# --- checks on the decorated function --------------------------------------------------------

def _check_definition(program: PromptProgram) -> None:
    """Raises CompileError when the name, params or signature cannot make a schema."""
    code = getattr(program.function, "__code__", None)
    where = {"filename": getattr(code, "co_filename", None), "line": getattr(code, "co_firstlineno", None)}
    if not isinstance(program.name, str) or not XML_NAME.match(program.name):
        raise CompileError(f"prompt program name {program.name!r} is not an XML name; pass name= with "
                           "letters, digits, '_', '-', '.', starting with a letter or '_'", **where)
    for parameter in program.signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise CompileError(f"prompt program {program.name!r}: *{parameter.name} / **{parameter.name} "
                               "cannot be compiled; name every parameter", **where)
    for param, length in program.params.items():
        if param not in program.signature.parameters:
            raise CompileError(f"prompt program {program.name!r}: params names {param!r}, which is not a "
                               f"parameter of {program.name}{program.signature}", **where)
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise CompileError(f"prompt program {program.name!r}: param {param!r} has len={length!r}; "
                               "len must be a positive whole number of tokens", **where)


# --- reading the source ------------------------------------------------------------------------

@dataclass(frozen=True)
class _ProgramSource:
    filename: str
    first_line: int  # line in `filename` where the parsed source starts (the first decorator)
    function: ast.FunctionDef

    def error(self, node: ast.AST, message: str) -> CompileError:
        return CompileError(message, filename=self.filename, line=self.line(node))

    def line(self, node: ast.AST) -> int:
        """Returns the line of `filename` that `node` starts on."""
        return self.first_line + node.lineno - 1

    def body(self) -> list[ast.stmt]:
        """Returns the statements to compile: without the docstring and a final bare return."""
        statements = list(self.function.body)
        if statements and _is_string_statement(statements[0]):
            statements = statements[1:]
        if statements and _is_bare_return(statements[-1]):
            statements = statements[:-1]
        return statements


def _load_source(program: PromptProgram) -> _ProgramSource:
    function = program.function
    try:
        lines, first_line = inspect.getsourcelines(function)
        filename = inspect.getsourcefile(function) or "<unknown>"
    except (OSError, TypeError) as exc:
        raise CompileError(f"prompt program {program.name!r}: cannot read the source of "
                           f"{getattr(function, '__qualname__', function)!r} ({exc}); "
                           "define it in a .py file") from None
    tree, offset = _parse_indented("".join(lines))
    definition = tree.body[0] if tree.body else None
    if offset:  # parsed inside a wrapper `if True:` block
        definition = definition.body[0]
    if not isinstance(definition, ast.FunctionDef):
        raise CompileError(f"prompt program {program.name!r}: only plain `def` functions can be compiled "
                           "(not async functions, lambdas or classes)", filename=filename, line=first_line)
    return _ProgramSource(filename, first_line - offset, definition)


def _parse_indented(source: str) -> tuple[ast.Module, int]:
    """Parses a function's source wherever it was indented; returns the tree and added lines."""
    try:
        return ast.parse(textwrap.dedent(source)), 0
    except SyntaxError:
        # dedent gives up when a multi-line string starts a line at column 0: wrap instead.
        return ast.parse("if True:\n" + source), 1


# --- compiling a body --------------------------------------------------------------------------

@dataclass
class _Scope:
    """Where statements land: inside a module (which owns its params) or outside any module."""

    module: str | None  # enclosing module name; None at the schema's top level
    role: str | None = None  # enclosing chat role
    params_seen: set[str] = field(default_factory=set)  # params already in this module's own text


class _SchemaBuild:
    """What the compilers of one schema share: module names, union numbers, and each module's Selection."""

    def __init__(self) -> None:
        self._taken: set[str] = set()
        self._unions = 0
        self.selections: dict[str, Selection] = {}

    def claim(self, base: str) -> str:
        """Returns `base`, or `base-2`, `base-3`... : the first name not taken yet in document order."""
        name, suffix = base, 2
        while name in self._taken:
            name, suffix = f"{base}-{suffix}", suffix + 1
        self._taken.add(name)
        return name

    def union_name(self) -> str:
        """Returns the name the PML parser gives the next unnamed union (numbered where it opens)."""
        self._unions += 1
        return f"#union{self._unions}"

    def module(self, name: str, children: tuple[Node, ...], line: int, selection: Selection) -> ModuleNode:
        """Returns the module node, keeping when it is imported."""
        self.selections[name] = selection
        return ModuleNode(name, children, line)


class _BodyCompiler:
    """Compiles one program's body; a nested program gets its own compiler sharing the names."""

    def __init__(self, program: PromptProgram, build: _SchemaBuild, active: tuple[PromptProgram, ...]):
        self.program = program
        self.source = program._source
        self.build = build
        self.active = active + (program,)  # programs being compiled, to refuse recursion

    def compile_body(self, *, in_module: str | None) -> tuple[Node, ...]:
        return self.block(self.source.body(), _Scope(in_module))

    def block(self, statements: list[ast.stmt], scope: _Scope) -> tuple[Node, ...]:
        nodes: list[Node] = []
        for statement in statements:
            nodes.extend(self.statement(statement, scope))
        return tuple(nodes)

    def statement(self, node: ast.stmt, scope: _Scope) -> tuple[Node, ...]:
        if isinstance(node, ast.Pass):
            return ()
        if isinstance(node, ast.Expr) and _is_string_statement(node):
            return (self.text(node.value.value, node),) if node.value.value else ()
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.JoinedStr):
            return self.fstring(node.value, scope)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return (self.nested_call(node.value, scope),)
        if isinstance(node, ast.If):
            return (self.if_chain(node, scope),)
        if isinstance(node, ast.Match):
            return (self.match(node, scope),)
        if isinstance(node, ast.With):
            return (self.role(node, scope),)
        raise self.source.error(node, f"{_describe(node)} is not supported in prompt program "
                                      f"{self.program.name!r}; {SUPPORTED}")

    # text and f-strings -> text and params

    def text(self, value: str, at: ast.AST) -> TextNode:
        bad = NOT_XML.search(value)
        if bad is not None:
            raise self.source.error(at, f"text holds {bad.group()!r}, which XML cannot carry; remove control "
                                        "characters")
        return TextNode(value, self.source.line(at))

    def fstring(self, node: ast.JoinedStr, scope: _Scope) -> tuple[Node, ...]:
        parts = tuple(self.fstring_part(value, node) for value in node.values)
        params = [part.name for part in parts if isinstance(part, ParamNode)]
        if not params:
            return parts
        if scope.module is None:  # PML params live in modules: give this text its own
            name = self.build.claim(f"{self.program.name}-" + "-".join(_name_part(p) for p in params))
            scope = _Scope(name, scope.role)
            self.claim_params(params, scope, node)
            return (self.build.module(name, parts, self.source.line(node), Selection()),)
        self.claim_params(params, scope, node)
        return parts

    def fstring_part(self, value: ast.expr, at: ast.JoinedStr) -> TextNode | ParamNode:
        # Errors point at the f-string: before Python 3.12 nodes inside it may carry wrong lines.
        if isinstance(value, ast.Constant):
            return self.text(value.value, at)
        assert isinstance(value, ast.FormattedValue)
        placeholder = ast.unparse(value.value)
        if value.conversion != -1 or value.format_spec is not None:
            raise self.source.error(at, f"f-string placeholder {{{placeholder}}} has a conversion or format "
                                        "spec; write a bare parameter name like {city}")
        if not isinstance(value.value, ast.Name):
            raise self.source.error(at, f"f-string placeholder {{{placeholder}}} is an expression; only bare "
                                        f"parameter names declared in params= become PML params")
        name = value.value.id
        if name not in self.program.signature.parameters:
            raise self.source.error(at, f"f-string placeholder {{{name}}} is not a parameter of "
                                        f"{self.program.name}{self.program.signature}")
        if name not in self.program.params:
            raise self.source.error(at, f"f-string placeholder {{{name}}} is not declared as a param; add "
                                        f"{name!r}: <tokens> to @prompt_program(params=...)")
        return ParamNode(name, self.program.params[name], self.source.line(at))

    def claim_params(self, params: list[str], scope: _Scope, node: ast.AST) -> None:
        for param in params:
            if param in scope.params_seen:
                raise self.source.error(node, f"param {param!r} appears twice in module {scope.module!r}; a "
                                              "module has one slot per param: move one use into another "
                                              "module (an `if` block) or use another parameter")
            scope.params_seen.add(param)

    # if / match -> module or union

    def if_chain(self, node: ast.If, scope: _Scope) -> ModuleNode | UnionNode:
        branches: list[tuple[Condition | None, list[ast.stmt], ast.AST]] = []
        current: ast.If | None = node
        while current is not None:
            branches.append((self.condition(current.test), current.body, current))
            rest = current.orelse
            current = rest[0] if len(rest) == 1 and isinstance(rest[0], ast.If) else None
            if current is None and rest:  # a final else
                branches.append((None, rest, rest[0]))
        union = self.build.union_name() if len(branches) > 1 else ""
        members = tuple(self.conditional_module(condition, body, at, scope,
                                                else_of=branches[0][0].param)
                        for condition, body, at in branches)
        return members[0] if not union else UnionNode(union, members, self.source.line(node))

    def match(self, node: ast.Match, scope: _Scope) -> UnionNode:
        subject = node.subject
        if not isinstance(subject, ast.Name) or subject.id not in self.program.signature.parameters:
            raise self.source.error(node, f"`match {ast.unparse(subject)}`: match on a bare parameter of "
                                          f"{self.program.name!r}")
        union = self.build.union_name()
        members = []
        for case in node.cases:
            if case.guard is not None:
                raise self.source.error(case.pattern, "`case ... if ...`: guards are not supported; use "
                                                      "literal patterns")
            values = self.case_values(case.pattern)
            condition = None if values is None else Condition(subject.id, values)
            members.append(self.conditional_module(condition, case.body, case.pattern, scope,
                                                   else_of=subject.id))
        return UnionNode(union, tuple(members), self.source.line(node))

    def case_values(self, pattern: ast.pattern) -> tuple[Any, ...] | None:
        """Returns the literals a case matches; None for the wildcard `case _`."""
        if isinstance(pattern, ast.MatchAs) and pattern.pattern is None and pattern.name is None:
            return None
        if isinstance(pattern, ast.MatchSingleton):
            return (pattern.value,)
        if isinstance(pattern, ast.MatchValue):
            try:
                return (ast.literal_eval(pattern.value),)
            except ValueError:
                pass
        if isinstance(pattern, ast.MatchOr):
            values: list[Any] = []
            for alternative in pattern.patterns:
                found = self.case_values(alternative)
                if found is None:
                    break
                values.extend(found)
            else:
                return tuple(values)
        raise self.source.error(pattern, f"`case {ast.unparse(pattern)}`: use literal patterns (\"a\", 3, None, "
                                         "\"a\" | \"b\") or a final `case _:`")

    def conditional_module(self, condition: Condition | None, body: list[ast.stmt], at: ast.AST,
                           scope: _Scope, *, else_of: str) -> ModuleNode:
        name = self.build.claim(_condition_name(self.program.name, condition, else_of))
        children = self.block(body, _Scope(name, scope.role))
        if not children:
            raise self.source.error(at, f"the branch that makes module {name!r} has no text; a PML module "
                                        "cannot be empty: add text or drop the branch")
        return self.build.module(name, children, self.source.line(at), Selection(condition))

    def condition(self, test: ast.expr) -> Condition:
        if isinstance(test, ast.Name):
            return Condition(self.condition_param(test, test))
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Name):
            return Condition(self.condition_param(test.operand, test), negated=True)
        comparison = self.comparison(test) if isinstance(test, ast.Compare) else None
        if comparison is None:
            raise self.source.error(test, f"condition `{ast.unparse(test)}` is not supported; use `p`, `not p`, "
                                          "`p == literal`, `p != literal`, `p in (literals)` or "
                                          "`p not in (literals)` with p a parameter")
        return comparison

    def comparison(self, test: ast.Compare) -> Condition | None:
        """Returns the Condition of `p == lit`, `lit == p`, `p != lit`, `p [not] in (lits)`; else None."""
        if len(test.ops) != 1:
            return None
        op, left, right = test.ops[0], test.left, test.comparators[0]
        if isinstance(op, (ast.Eq, ast.NotEq)) and not isinstance(left, ast.Name):
            left, right = right, left
        if not isinstance(left, ast.Name) or not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
            return None
        if isinstance(op, (ast.Eq, ast.NotEq)):
            values = (self.literal(right, test),)
        else:
            values = self.literal(right, test)
            if not isinstance(values, (tuple, list, set, frozenset)):
                raise self.source.error(test, f"`{ast.unparse(test)}`: `in` needs a tuple of literals")
            values = tuple(values)
        negated = isinstance(op, (ast.NotEq, ast.NotIn))
        return Condition(self.condition_param(left, test), values, negated)

    def condition_param(self, name: ast.Name, at: ast.AST) -> str:
        if name.id not in self.program.signature.parameters:
            raise self.source.error(at, f"condition uses {name.id!r}, which is not a parameter of "
                                        f"{self.program.name}{self.program.signature}")
        return name.id

    def literal(self, node: ast.expr, at: ast.AST) -> Any:
        try:
            return ast.literal_eval(node)
        except ValueError:
            raise self.source.error(at, f"`{ast.unparse(node)}` is not a literal; conditions compare a "
                                        "parameter with literals") from None

    # nested programs and roles

    def nested_call(self, call: ast.Call, scope: _Scope) -> ModuleNode:
        callee = self.resolve_callee(call)
        if any(callee is caller for caller in self.active):
            chain = " -> ".join(p.name for p in (*self.active, callee))
            raise self.source.error(call, f"prompt program {callee.name!r} calls itself ({chain}); recursion "
                                          "cannot be compiled")
        if callee.name in RESERVED_NAMES:
            raise self.source.error(call, f"prompt program {callee.name!r} cannot be a module: {callee.name!r} "
                                          "is a reserved PML name; pass name=... to its @prompt_program")
        nested = NestedCall(callee, tuple(self.call_argument(a, call) for a in call.args),
                            tuple((k.arg, self.call_argument(k.value, call)) for k in call.keywords))
        self.check_binds(nested, call)
        name = self.build.claim(callee.name)
        children = _BodyCompiler(callee, self.build, self.active).compile_body(in_module=name)
        if not children:
            raise self.source.error(call, f"prompt program {callee.name!r} has no text; a PML module cannot "
                                          "be empty (a string that is the first statement is the docstring)")
        return self.build.module(name, children, self.source.line(call), Selection(call=nested))

    def resolve_callee(self, call: ast.Call) -> PromptProgram:
        described = ast.unparse(call.func)
        if not isinstance(call.func, (ast.Name, ast.Attribute)):
            raise self.source.error(call, f"call `{ast.unparse(call)}`: only calls to @prompt_program "
                                          "functions by name are supported")
        found = _lookup(self.program.function, call.func)
        if found is _MISSING:
            raise self.source.error(call, f"call to {described!r}: no such name where {self.program.name!r} "
                                          "is defined; define the @prompt_program before using the program")
        if not isinstance(found, PromptProgram):
            raise self.source.error(call, f"call to {described!r} is not supported: only calls to "
                                          f"@prompt_program functions become nested modules; {SUPPORTED}")
        return found

    def call_argument(self, node: ast.expr, call: ast.Call) -> CallArgument:
        if isinstance(node, ast.Starred):
            raise self.source.error(call, f"`{ast.unparse(call)}`: *args cannot be compiled; pass each argument")
        if isinstance(node, ast.Name):
            if node.id not in self.program.signature.parameters:
                raise self.source.error(call, f"`{ast.unparse(call)}` passes {node.id!r}, which is not a "
                                              f"parameter of {self.program.name!r}; pass parameters or literals")
            return CallArgument(param=node.id)
        try:
            return CallArgument(value=ast.literal_eval(node))
        except ValueError:
            raise self.source.error(call, f"`{ast.unparse(call)}` passes `{ast.unparse(node)}`; pass "
                                          "parameters or literals") from None

    def check_binds(self, nested: NestedCall, call: ast.Call) -> None:
        if any(key is None for key, _ in nested.keywords):
            raise self.source.error(call, f"`{ast.unparse(call)}`: **kwargs cannot be compiled; name each "
                                          "argument")
        try:
            nested.program.signature.bind(*nested.positional, **dict(nested.keywords))
        except TypeError as exc:
            raise self.source.error(call, f"`{ast.unparse(call)}` does not fit {nested.program.name}"
                                          f"{nested.program.signature}: {exc}") from None

    def role(self, node: ast.With, scope: _Scope) -> RoleNode:
        role = _role_of(node)
        if role is None:
            raise self.source.error(node, f"`with {ast.unparse(node.items[0])}` is not supported; only `with "
                                          "system:`, `with user:` and `with assistant:` mark chat roles")
        if scope.module is not None or scope.role is not None:
            inside = f"module {scope.module!r}" if scope.module is not None else f"role {scope.role!r}"
            raise self.source.error(node, f"`with {role}:` inside {inside}; chat roles are allowed only at the "
                                          "top level of the outermost program")
        return RoleNode(role, self.block(node.body, _Scope(None, role)), self.source.line(node))


_MISSING = object()


def _lookup(function: Callable[..., Any], expression: ast.Name | ast.Attribute) -> Any:
    """Returns what a dotted name means inside `function` (closure, then globals), or _MISSING."""
    if isinstance(expression, ast.Attribute):
        owner = _lookup(function, expression.value) if isinstance(expression.value, (ast.Name, ast.Attribute)) \
            else _MISSING
        return _MISSING if owner is _MISSING else getattr(owner, expression.attr, _MISSING)
    code = function.__code__
    for name, cell in zip(code.co_freevars, function.__closure__ or ()):
        if name == expression.id:
            try:
                return cell.cell_contents
            except ValueError:  # the enclosing function has not assigned it yet
                return _MISSING
    return function.__globals__.get(expression.id, _MISSING)


def _role_of(node: ast.With) -> str | None:
    """Returns the role a `with` statement marks, or None if it is not a role block."""
    if len(node.items) != 1 or node.items[0].optional_vars is not None:
        return None
    marker = node.items[0].context_expr
    if isinstance(marker, ast.Call) and not marker.args and not marker.keywords:
        marker = marker.func
    if isinstance(marker, ast.Name):
        return marker.id if marker.id in ROLES else None
    if isinstance(marker, ast.Attribute):
        return marker.attr if marker.attr in ROLES else None
    return None


def _is_string_statement(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def _is_bare_return(node: ast.stmt) -> bool:
    return isinstance(node, ast.Return) and (
        node.value is None or (isinstance(node.value, ast.Constant) and node.value.value is None))


_DESCRIPTIONS = {
    ast.For: "a `for` loop", ast.AsyncFor: "an `async for` loop", ast.While: "a `while` loop",
    ast.Assign: "an assignment", ast.AugAssign: "an assignment", ast.AnnAssign: "an assignment",
    ast.Return: "`return` (other than a final bare `return`)", ast.FunctionDef: "a nested `def`",
    ast.ClassDef: "a class definition", ast.Import: "an import", ast.ImportFrom: "an import",
    ast.Try: "`try`", ast.Raise: "`raise`", ast.Assert: "`assert`", ast.Delete: "`del`",
    ast.Global: "`global`", ast.Nonlocal: "`nonlocal`", ast.Break: "`break`", ast.Continue: "`continue`",
}


def _describe(node: ast.stmt) -> str:
    if isinstance(node, ast.Expr):
        snippet = ast.unparse(node.value).splitlines()[0][:60]
        return f"the expression `{snippet}`"
    return _DESCRIPTIONS.get(type(node), f"a `{type(node).__name__}` statement")


# --- names -------------------------------------------------------------------------------------

def _condition_name(program: str, condition: Condition | None, else_of: str) -> str:
    """Returns the base module name of a branch (before uniqueness suffixes)."""
    if condition is None:
        return f"{program}-{_name_part(else_of)}-else"
    negation = "not-" if condition.negated else ""
    if condition.values is None:
        return f"{program}-{negation}{_name_part(condition.param)}"
    literals = "-or-".join(_name_part(value) for value in condition.values)
    return f"{program}-{_name_part(condition.param)}-{negation}{literals}"


def _name_part(value: Any) -> str:
    """Returns `value` as a piece of an XML name: lowercase ASCII letters, digits, '_' and '-'."""
    text = str(value)
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    part = re.sub(r"[^a-z0-9_]+", "-", ascii_text).strip("-")[:_LITERAL_NAME_CHARS].strip("-")
    if part:
        return part
    return "empty" if text == "" else "v" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


# --- rendering ---------------------------------------------------------------------------------

def render_imports(schema: CompiledSchema, arguments: Mapping[str, Any]) -> str:
    """Returns the prompt imports of the modules of `schema` that `arguments` select."""
    return _Imports(schema.selections).of(schema.children, arguments)


@dataclass(frozen=True)
class _Imports:
    selections: Mapping[str, Selection]

    def of(self, nodes: tuple[Node, ...], arguments: Mapping[str, Any]) -> str:
        return "".join(self.of_node(node, arguments) for node in nodes)

    def of_node(self, node: Node, arguments: Mapping[str, Any]) -> str:
        if isinstance(node, RoleNode):  # roles are not imported; the modules inside them are
            return self.of(node.children, arguments)
        if isinstance(node, UnionNode):
            chosen = next((m for m in node.members if self.selections[m.name].holds(arguments)), None)
            return "" if chosen is None else self.module(chosen, arguments)
        if isinstance(node, ModuleNode):
            return self.module(node, arguments) if self.selections[node.name].holds(arguments) else ""
        return ""  # text and params are in the schema: nothing to import

    def module(self, module: ModuleNode, arguments: Mapping[str, Any]) -> str:
        call = self.selections[module.name].call
        own_arguments = call.bind(arguments) if call is not None else arguments
        attributes = "".join(f" {param.name}=\"{escape_attribute(_argument_text(module, param, own_arguments))}\""
                             for param in module.children if isinstance(param, ParamNode))
        inner = self.of(module.children, own_arguments)
        return f"<{module.name}{attributes}>{inner}</{module.name}>" if inner else f"<{module.name}{attributes}/>"


def _argument_text(module: ModuleNode, param: ParamNode, arguments: Mapping[str, Any]) -> str:
    value = arguments[param.name]
    if value is None:
        raise PromptError(f"param {param.name!r} of module {module.name!r} got None; an imported module needs "
                          f"every argument: pass {param.name}=..., or put the text under `if {param.name}:` "
                          "in the program to make it optional")
    text = str(value)
    check_xml_chars(text, f"argument of param {param.name!r} in module {module.name!r}")
    return text
