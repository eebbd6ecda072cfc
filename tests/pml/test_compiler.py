"""Tests of the Python-to-PML compiler (pc_cpu.pml.compiler).

Programs are defined at module level: the compiler reads them with inspect.getsource.
Bodies are compiled lazily, so programs with deliberate errors here do not break the import.
"""

from __future__ import annotations

import pathlib
import pickle

import defusedxml.ElementTree as DET
import pytest

from pc_cpu.errors import CompileError, PromptError
from pc_cpu.pml import compiler
from pc_cpu.pml.compiler import CompiledPrompt, prompt_program, system, user

THIS_FILE = pathlib.Path(__file__).resolve()


def line_of(marker: str) -> int:
    """Returns the line number in this file of the line that ends with `# MARK: <marker>`."""
    for number, line in enumerate(THIS_FILE.read_text().splitlines(), start=1):
        if line.rstrip().endswith(f"# MARK: {marker}"):
            return number
    raise AssertionError(f"marker {marker!r} not found")


def parse(pml: str):
    return DET.fromstring(pml)


def modules(element) -> list[str]:
    """Returns the names of every <module> below `element`, in document order."""
    return [m.get("name") for m in element.iter("module")]


# --- programs ----------------------------------------------------------------------------------

@prompt_program
def greeting(formal):
    """Docstring: not text."""
    "Hello"
    if formal:
        ", dear guest"
    "."


@prompt_program
def tone(style):
    if style == "formal":
        "Be formal."
    elif style == "casual":
        "Be casual."
    else:
        "Be neutral."


@prompt_program
def destination(city):
    match city:
        case "Paris":
            "Paris has museums."
        case "Tokyo" | "Kyoto":
            "Japan has temples."
        case None:
            "Pick a city."
        case _:
            "Somewhere else."


@prompt_program(params={"amount": 4})
def budget(amount, currency="EUR"):
    f"on a budget of {amount} "
    if currency == "USD":
        "dollars"
    else:
        "euros"


@prompt_program(params={"duration": 8})
def trip(duration, city, money=None):
    with system:
        "You are a travel planner."
    f"Plan a trip of {duration}. "
    destination(city)
    if money:
        budget(money, currency="USD")


@prompt_program(params={"city": 6}, name="visit")
def visit_program(city):
    if city:
        f"Visit {city}."


@prompt_program
def escaped(flag):
    'Docstring.'
    'a < b && c > "d" \'e\'\n'
    if flag:
        "<module name='x'>not markup</module>"


@prompt_program
def twice():
    greeting(True)
    greeting(formal=False)


@prompt_program(name="greeting")
def other_greeting():
    """A different program that shares the name `greeting`."""
    "Hi there."


@prompt_program
def same_names():
    greeting(True)
    other_greeting()


@prompt_program
def duplicate_conditions(flag):
    if flag:
        "one"
    if flag:
        "two"


@prompt_program
def chat(topic):
    with system:
        "You answer questions."
    with user():
        if topic:
            "About the topic."
        "Question follows."


@prompt_program
def with_loop(items):
    for item in items:  # MARK: for-loop
        "x"


@prompt_program
def with_assignment(a):
    "ok"
    b = a  # MARK: assignment
    "b"


@prompt_program
def with_other_call(a):
    print(a)  # MARK: other-call


@prompt_program
def with_return(a):
    "text"
    return "value"  # MARK: return-value


@prompt_program
def with_final_return(a):
    """Docstring."""
    "text"
    return


@prompt_program
def only_docstring():  # MARK: only-docstring
    "Hello, world."


@prompt_program(params={"a": 4})
def with_undeclared_placeholder(a, b):
    f"{a} and {b}"  # MARK: undeclared-placeholder


@prompt_program(params={"a": 4})
def with_format_spec(a):
    f"{a!r}"  # MARK: format-spec


@prompt_program(params={"a": 4})
def with_param_twice(a):
    if a:
        f"{a} "
        f"again {a}"  # MARK: param-twice


@prompt_program
def with_bad_condition(a):
    if len(a) > 3:  # MARK: bad-condition
        "long"


@prompt_program
def with_guard(a):
    match a:
        case "x" if a:  # MARK: guard
            "x"


@prompt_program
def with_empty_branch(a):
    if a:  # MARK: empty-branch
        pass


@prompt_program
def with_nested_role(a):
    if a:
        with system:  # MARK: nested-role
            "sys"


@prompt_program
def with_non_literal_argument(a):
    budget(a.upper())  # MARK: non-literal-argument


@prompt_program
def with_bad_arity(a):
    budget(a, "USD", "extra")  # MARK: bad-arity


@prompt_program
def recursive(a):
    "r"
    recursive(a)  # MARK: recursion


@prompt_program(name="user")
def reserved_program():
    "I am reserved."


@prompt_program
def calls_reserved():
    reserved_program()  # MARK: reserved


@prompt_program
def conditions(a, b=3):
    if "Paris" == a:
        "paris"
    if a != "Rome":
        "not rome"
    if b in (1, 2):
        "small"
    elif not a:
        "no a"
    if b not in (1, 2):
        "not small"


# --- if -> module; if/elif/else and match -> union ------------------------------------------------

def test_if_becomes_a_module_and_the_docstring_is_ignored():
    schema = parse(greeting.schema_pml)
    assert schema.tag == "schema" and schema.get("name") == "greeting"
    assert schema.text == "Hello"
    [module] = list(schema)
    assert module.tag == "module" and module.get("name") == "greeting-formal"
    assert module.text == ", dear guest" and module.tail == "."


def test_if_module_is_imported_only_when_its_condition_holds():
    assert greeting(formal=True) == '<prompt schema="greeting"><greeting-formal/></prompt>'
    assert greeting(formal=False) == '<prompt schema="greeting"></prompt>'


def test_if_elif_else_becomes_a_union_of_one_module_per_branch():
    [union] = list(parse(tone.schema_pml))
    assert union.tag == "union"
    assert [(m.tag, m.get("name"), m.text) for m in union] == [
        ("module", "tone-style-formal", "Be formal."),
        ("module", "tone-style-casual", "Be casual."),
        ("module", "tone-style-else", "Be neutral."),
    ]


@pytest.mark.parametrize("style, imported", [
    ("formal", "tone-style-formal"), ("casual", "tone-style-casual"), ("loud", "tone-style-else"),
])
def test_union_imports_the_first_branch_that_holds(style, imported):
    assert list(parse(tone(style)))[0].tag == imported
    assert len(list(parse(tone(style)))) == 1


def test_match_becomes_a_union_named_from_the_case_literals():
    [union] = list(parse(destination.schema_pml))
    assert union.tag == "union"
    assert modules(union) == ["destination-city-paris", "destination-city-tokyo-or-kyoto",
                              "destination-city-none", "destination-city-else"]


@pytest.mark.parametrize("city, imported", [
    ("Paris", "destination-city-paris"), ("Kyoto", "destination-city-tokyo-or-kyoto"),
    (None, "destination-city-none"), ("Rome", "destination-city-else"),
])
def test_match_imports_the_case_that_equals_the_argument(city, imported):
    assert [e.tag for e in parse(destination(city))] == [imported]


def test_supported_conditions_name_and_select_modules():
    assert modules(parse(conditions.schema_pml)) == [
        "conditions-a-paris", "conditions-a-not-rome", "conditions-b-1-or-2", "conditions-not-a",
        "conditions-b-not-1-or-2"]
    assert [e.tag for e in parse(conditions("Paris", 1))] == [
        "conditions-a-paris", "conditions-a-not-rome", "conditions-b-1-or-2"]
    assert [e.tag for e in parse(conditions("", 5))] == [
        "conditions-a-not-rome", "conditions-not-a", "conditions-b-not-1-or-2"]


def test_programs_defined_in_a_function_find_callees_in_the_closure():
    @prompt_program
    def inner_callee(x):
        """Doc."""
        "callee text"

    @prompt_program
    def outer(a):
        """
A docstring at column 0 defeats textwrap.dedent.
"""
        inner_callee(x=a)
        if a:
            for _ in a:  # MARK: indented-loop
                "x"

    with pytest.raises(CompileError) as raised:
        outer.schema_pml
    assert raised.value.line == line_of("indented-loop")

    @prompt_program
    def fine(a):
        inner_callee(a)

    assert fine.schema_pml == '<schema name="fine"><module name="inner_callee">callee text</module></schema>'
    assert fine("v") == '<prompt schema="fine"><inner_callee/></prompt>'


# --- f-strings -> params; nested calls -> nested modules ------------------------------------------

def test_fstring_becomes_a_param_with_the_declared_len():
    [module] = list(parse(visit_program.schema_pml))
    assert module.get("name") == "visit-city"
    [param] = list(module)
    assert (param.tag, param.get("name"), param.get("len")) == ("param", "city", "6")
    assert module.text == "Visit " and param.tail == "."
    assert visit_program("Rome") == '<prompt schema="visit"><visit-city city="Rome"/></prompt>'


def test_top_level_fstring_gets_its_own_always_imported_module():
    schema = parse(trip.schema_pml)
    wrapper = schema.find("module[@name='trip-duration']")
    assert wrapper is not None and wrapper.text == "Plan a trip of "
    assert wrapper.find("param").attrib == {"name": "duration", "len": "8"}
    assert parse(trip("3 days", "Rome")).find("trip-duration").attrib == {"duration": "3 days"}


def test_nested_call_becomes_a_nested_module_with_the_callees_params():
    schema = parse(trip.schema_pml)
    assert [child.tag for child in schema] == ["system", "module", "module", "module"]
    money = schema.find("module[@name='trip-money']")
    [nested] = list(money)
    assert nested.get("name") == "budget"
    assert nested.find("param").attrib == {"name": "amount", "len": "4"}
    assert modules(nested) == ["budget", "budget-currency-usd", "budget-currency-else"]
    assert schema.find("module[@name='destination']/union") is not None


def test_nested_call_arguments_map_the_callers_arguments_to_nested_imports():
    prompt = trip("3 days", "Paris", money="500")
    assert prompt == ('<prompt schema="trip"><trip-duration duration="3 days"/>'
                      '<destination><destination-city-paris/></destination>'
                      '<trip-money><budget amount="500"><budget-currency-usd/></budget></trip-money></prompt>')


def test_none_for_a_param_of_an_imported_module_is_refused():
    with pytest.raises(PromptError, match="param 'duration' of module 'trip-duration' got None"):
        trip(None, "Paris")
    assert visit_program(None) == '<prompt schema="visit"></prompt>'  # under `if city:`, None skips the module


def test_a_program_called_twice_gets_unique_deterministic_names():
    assert modules(parse(twice.schema_pml)) == ["greeting", "greeting-formal", "greeting-2", "greeting-formal-2"]
    assert twice() == '<prompt schema="twice"><greeting><greeting-formal/></greeting><greeting-2/></prompt>'
    assert modules(parse(duplicate_conditions.schema_pml)) == ["duplicate_conditions-flag",
                                                               "duplicate_conditions-flag-2"]


def test_different_programs_with_one_name_are_not_recursion_and_get_unique_names():
    assert modules(parse(same_names.schema_pml)) == ["greeting", "greeting-formal", "greeting-2"]
    assert same_names() == ('<prompt schema="same_names"><greeting><greeting-formal/></greeting>'
                            '<greeting-2/></prompt>')


def test_compiling_the_same_source_twice_gives_the_same_schema():
    again = prompt_program(params={"duration": 8})(trip.__wrapped__)
    assert again.schema_pml == trip.schema_pml
    assert again("3 days", "Tokyo", money="9") == trip("3 days", "Tokyo", money="9")


def test_roles_wrap_text_and_modules_and_are_not_imported():
    schema = parse(chat.schema_pml)
    assert [child.tag for child in schema] == ["system", "user"]
    assert modules(schema.find("user")) == ["chat-topic"]
    assert chat("x") == '<prompt schema="chat"><chat-topic/></prompt>'


# --- the compiled prompt ------------------------------------------------------------------------

def test_compiled_prompt_is_a_str_carrying_its_schema():
    prompt = trip("3 days", "Paris")
    assert isinstance(prompt, str) and isinstance(prompt, CompiledPrompt)
    assert prompt.schema_pml == trip.schema_pml and prompt.schema_name == "trip"
    assert pickle.loads(pickle.dumps(prompt)).schema_pml == trip.schema_pml


def test_with_user_appends_an_escaped_turn_after_the_imports():
    prompt = greeting(True).with_user('Is 1 < 2 & "yes"?').with_user("second")
    assert prompt == ('<prompt schema="greeting"><greeting-formal/>'
                      '<user>Is 1 &lt; 2 &amp; "yes"?</user><user>second</user></prompt>')
    assert [e.text for e in parse(prompt).iter("user")] == ['Is 1 < 2 & "yes"?', "second"]
    assert prompt.schema_pml == greeting.schema_pml


def test_missing_argument_raises_prompt_error_naming_the_program():
    with pytest.raises(PromptError, match=r"'trip'.*missing a required argument: 'city'"):
        trip("3 days")


def test_argument_with_control_characters_is_refused():
    with pytest.raises(PromptError, match="param 'city'"):
        visit_program("Ro\x00me")


# --- escaping -----------------------------------------------------------------------------------

def test_text_and_arguments_are_escaped_and_round_trip():
    schema = parse(escaped.schema_pml)
    assert schema.text == 'a < b && c > "d" \'e\'\n'
    assert schema.find("module").text == "<module name='x'>not markup</module>"
    assert "&#10;" in escaped.schema_pml  # newlines survive the schema parser's indentation trimming
    argument = 'Rio "de" <Janeiro> & \'more\'\n'
    assert parse(visit_program(argument)).find("visit-city").get("city") == argument


# --- errors -------------------------------------------------------------------------------------

@pytest.mark.parametrize("program, marker, words", [
    (with_loop, "for-loop", "`for` loop"),
    (with_assignment, "assignment", "assignment"),
    (with_other_call, "other-call", "'print'"),
    (with_return, "return-value", "`return`"),
    (with_undeclared_placeholder, "undeclared-placeholder", "{b} is not declared as a param"),
    (with_format_spec, "format-spec", "conversion or format spec"),
    (with_param_twice, "param-twice", "param 'a' appears twice"),
    (with_bad_condition, "bad-condition", "condition `len(a) > 3`"),
    (with_guard, "guard", "guards"),
    (with_empty_branch, "empty-branch", "cannot be empty"),
    (with_nested_role, "nested-role", "roles are allowed only at the top level"),
    (with_non_literal_argument, "non-literal-argument", "pass parameters or literals"),
    (with_bad_arity, "bad-arity", "does not fit budget(amount, currency='EUR')"),
    (recursive, "recursion", "calls itself"),
    (calls_reserved, "reserved", "reserved PML name"),
])
def test_unsupported_constructs_raise_compile_error_at_their_line(program, marker, words):
    with pytest.raises(CompileError) as raised:
        program.schema_pml
    error = raised.value
    assert error.filename == str(THIS_FILE) and error.line == line_of(marker)
    assert words in str(error)
    assert str(error).startswith(f"{THIS_FILE}:{line_of(marker)}: ")


def test_unsupported_statement_message_lists_what_is_supported():
    with pytest.raises(CompileError, match="supported: string literals"):
        with_loop.schema_pml


def test_calling_a_program_that_does_not_compile_raises_compile_error():
    with pytest.raises(CompileError):
        with_loop([1])


def test_final_bare_return_is_ignored():
    assert with_final_return.schema_pml == '<schema name="with_final_return">text</schema>'


def test_a_program_whose_only_string_is_its_docstring_is_refused():
    with pytest.raises(CompileError, match="docstring") as raised:
        only_docstring.schema_pml
    assert raised.value.line == line_of("only-docstring")


def test_decorator_refuses_params_that_are_not_parameters_or_have_bad_len():
    def plan(city):
        f"{city}"

    with pytest.raises(CompileError, match="'town', which is not a parameter"):
        prompt_program(params={"town": 4})(plan)
    with pytest.raises(CompileError, match="len=0"):
        prompt_program(params={"city": 0})(plan)
    with pytest.raises(CompileError, match="not an XML name"):
        prompt_program(name="1plan")(plan)


def test_decorator_given_params_positionally_says_how_to_call_it():
    with pytest.raises(TypeError, match="params="):
        prompt_program({"city": 4})


def test_role_markers_refuse_to_run():
    with pytest.raises(CompileError, match="compiled, not executed"):
        with system:
            pass
    assert compiler.assistant.role == "assistant" and user.role == "user"


def test_names_from_literals_are_sanitised_xml_names():
    assert compiler._name_part("Zürich Main-Station!") == "zurich-main-station"
    assert compiler._name_part("") == "empty"
    assert compiler._name_part("東京").startswith("v") and len(compiler._name_part("東京")) == 9
    assert compiler._name_part(True) == "true"


# --- the contract with the rest of pc_cpu.pml -----------------------------------------------------

class _ByteTokenizer:
    """One token per UTF-8 byte: enough for layout and planning, no model needed."""

    bos_id = None
    placeholder_id = 0

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        return list(text.encode("utf-8"))


@pytest.mark.parametrize("program, args", [
    (trip, ("3 days", "Paris", "500")), (trip, ("1 week", "Rome")), (tone, ("loud",)),
    (conditions, ("", 5)), (twice, ()), (chat, ("x",)), (same_names, ()), (escaped, (True,)),
])
def test_compiled_pml_is_accepted_by_the_schema_parser_and_the_planner(program, args):
    from pc_cpu.pml.layout import build_layout
    from pc_cpu.pml.plan import build_plan
    from pc_cpu.pml.prompt import parse_prompt
    from pc_cpu.pml.roles import PLAIN_MARKUP
    from pc_cpu.pml.schema import parse_schema

    prompt = program(*args).with_user("A question?")
    layout = build_layout(parse_schema(prompt.schema_pml), _ByteTokenizer(), PLAIN_MARKUP)
    build_plan(layout, parse_prompt(prompt), _ByteTokenizer(), PLAIN_MARKUP)


@pytest.mark.parametrize("program", [trip, tone, conditions, twice, chat, same_names, escaped])
def test_the_compiled_tree_is_the_schema_parsers_own_tree(program):
    """The compiler builds pc_cpu.pml.schema's nodes: parsing its PML gives the same modules, unions and params."""
    from pc_cpu.pml import schema as pml_schema

    def shape(nodes):  # node kinds and names, in order; text runs may be split differently
        out = []
        for node in nodes:
            if isinstance(node, pml_schema.TextNode):
                continue
            assert type(node).__module__ == "pc_cpu.pml.schema"
            name = getattr(node, "name", None) or getattr(node, "role", None)
            inner = node.members if isinstance(node, pml_schema.UnionNode) else getattr(node, "children", ())
            out.append((type(node).__name__, name, shape(inner)))
        return out

    compiled = program.schema
    parsed = pml_schema.parse_schema(program.schema_pml)
    assert shape(compiled.children) == shape(parsed.children)
    text = lambda nodes: "".join(n.text for n in pml_schema.walk(nodes) if isinstance(n, pml_schema.TextNode))
    assert text(compiled.children) == text(parsed.children)
    modules = [n.name for n in pml_schema.walk(compiled.children) if isinstance(n, pml_schema.ModuleNode)]
    assert sorted(compiled.selections) == sorted(modules)


def test_compiled_nodes_carry_the_programs_source_lines():
    import inspect

    lines, first = inspect.getsourcelines(trip.function)
    module_lines = {n.name: n.line for n in trip.schema.children if hasattr(n, "line") and hasattr(n, "name")}
    assert module_lines
    for line in module_lines.values():
        assert first <= line < first + len(lines)
