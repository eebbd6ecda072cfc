"""pc_cpu as a plugin of simonw/llm (pc_cpu.llm_plugin), driven through llm's Python API and CLI, on SmolLM2-135M."""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
import subprocess
import sys
from typing import Literal

import pytest

llm = pytest.importorskip("llm")
import pydantic  # noqa: E402  (llm's dependency)

from pc_cpu import llm_plugin  # noqa: E402  (after the skip: the module imports llm)
from pc_cpu.models import MODELS  # noqa: E402
from tests.conftest import smollm2_path  # noqa: E402

MODEL = "smollm2-135m"
MODEL_ID = "pc-cpu-smollm2-135m"
# Short texts, so that encoding them takes a moment on a busy 2-core machine.
HARBOR = ("The red lighthouse at the end of the breakwater, called the Calder Light, was automated in 1987; "
          "its last keeper, Agnes Moir, kept the light for thirty-one years.\n")
RAILWAY = "The stone viaduct at Kessel Gorge is 212 metres long and 64 metres high.\n"
QUESTION = "Who was the last keeper of the Calder Light?"


@pytest.fixture(scope="module", autouse=True)
def _plugin_registered():
    """Registers the plugin by hand when its entry point is not installed yet (a checkout not reinstalled)."""
    llm.load_plugins()
    if llm.pm.get_plugin("pc_cpu") is None:
        llm.pm.register(llm_plugin, name="pc_cpu")


@pytest.fixture
def model(tmp_path, monkeypatch):
    """Returns the llm model of SmolLM2, over a store and an llm directory of this test's own."""
    smollm2_path()  # skips the test when SmolLM2's package is not installed
    monkeypatch.setenv("PC_CPU_STORE_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("LLM_USER_PATH", str(tmp_path / "llm"))
    llm_plugin.close_all()  # the plugin keeps one PromptCache per model for the process: open a fresh one
    yield llm.get_model(MODEL_ID)
    llm_plugin.close_all()


@pytest.fixture
def files(tmp_path) -> dict[str, pathlib.Path]:
    """Returns the paths of harbor.txt and railway.txt, written in this test's directory."""
    paths = {"harbor": tmp_path / "harbor.txt", "railway": tmp_path / "railway.txt"}
    paths["harbor"].write_text(HARBOR)
    paths["railway"].write_text(RAILWAY)
    return paths


def fragment(path: pathlib.Path) -> "llm.Fragment":
    """Returns the fragment `llm -f PATH` makes of a file."""
    return llm.Fragment(path.read_text(), str(path))


def test_the_entry_point_names_the_plugin():
    entry_points = importlib.metadata.entry_points(group="llm")
    assert any(ep.name == "pc_cpu" and ep.value == "pc_cpu.llm_plugin" for ep in entry_points), \
        "reinstall pc_cpu (pip install -e .) to register its llm entry point"


def test_every_packaged_model_is_an_llm_model_that_streams():
    models = {m.model_id: m for m in llm.get_models()}
    for name in MODELS:
        assert models[f"pc-cpu-{name}"].can_stream
    options = models[MODEL_ID].Options()
    assert (options.max_tokens, options.temperature, options.setting, options.threads) == (256, 0.0, None, None)


def test_loading_the_plugin_loads_no_model_code_and_pc_cpu_needs_no_llm():
    # Every `llm` command imports the plugin: llama.cpp loads only when a pc-cpu model is prompted.
    code = "import sys, pc_cpu.llm_plugin; print(sorted({'llama_cpp', 'pc_cpu.cache'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=120).stdout.split() == ["[]"]
    # With llm missing, pc_cpu imports and never reaches for its plugin.
    code = ("import sys; sys.modules['llm'] = None; import pc_cpu.cli, pc_cpu.cache; "
            "print('pc_cpu.llm_plugin' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=120).stdout.split() == ["False"]


def test_fragments_are_documents_encoded_once_and_the_prompt_holds_their_text_once(model, files):
    both = [fragment(files["harbor"]), fragment(files["railway"])]
    first = model.prompt(QUESTION, fragments=both, max_tokens=16)
    first.text()
    pc = llm_plugin.prompt_cache(MODEL)
    docs = pc.list_documents()
    assert [(d.text, d.names) for d in docs] == [(HARBOR, [str(files["harbor"])]), (RAILWAY, [str(files["railway"])])]
    assert first.response_json["documents"] == [d.id for d in docs]
    # The question over the documents, as ask lays it out: llm's prompt.prompt (the fragments pasted
    # before the question) would have held each text twice.
    assert first.usage().input == pc.documents.prompt(QUESTION, [d.text for d in docs]).end
    assert first.response_json["cached_tokens"] >= sum(len(pc.documents.tokens(d.text)) for d in docs)

    encoded = pc.documents.encoded
    again = model.prompt("How long is the viaduct?", fragments=both, max_tokens=8)
    again.text()
    assert pc.documents.encoded == encoded
    assert again.response_json["documents"] == first.response_json["documents"]
    assert [d.id for d in pc.list_documents()] == [d.id for d in docs]

    # An edited file is a new document; its path names the old text still, so the new one gets no name.
    files["railway"].write_text(RAILWAY.replace("212", "213"))
    edited = model.prompt("How long is the viaduct?", fragments=[fragment(files["railway"])], max_tokens=8)
    edited.text()
    new = pc.list_documents()[-1]
    assert (new.text, new.names, edited.response_json["documents"]) == (files["railway"].read_text(), [], [new.id])


def test_a_question_over_fragments_answers_as_ask_over_the_same_documents(model, files):
    response = model.prompt(QUESTION, fragments=[fragment(files["harbor"])], system="Answer briefly.",
                            setting="accurate", max_tokens=24)
    text = response.text()
    pc = llm_plugin.prompt_cache(MODEL)
    ids = response.response_json["documents"]
    asked = pc.ask(QUESTION, documents=ids, system="Answer briefly.", setting="accurate", max_tokens=24)
    baseline = pc.ask(QUESTION, documents=ids, system="Answer briefly.", max_tokens=24, use_cache=False)
    assert text == asked.text == baseline.text  # "accurate": the full prefill's answer
    assert text.strip()


def test_a_conversation_sends_its_history_and_reuses_its_earlier_turns(model):
    conversation = model.conversation()
    first = conversation.prompt("Name three colours.", system="Answer briefly.", max_tokens=12)
    first.text()
    second = conversation.prompt("Now name three animals.", max_tokens=12)
    second.text()
    assert first.response_json["cached_tokens"] == 0
    # At least the first turn's prompt is reused (its answer too, where pc_cpu can reuse it exactly).
    assert second.response_json["cached_tokens"] >= first.usage().input > 0
    # The second turn's prompt is exactly the conversation so far, laid out by the chat template.
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name three colours."},
                {"role": "assistant", "content": first.text()}, {"role": "user", "content": "Now name three animals."}]
    assert second.usage().input == llm_plugin.prompt_cache(MODEL).conversations.prompt(messages).end


def test_a_conversation_keeps_its_first_turns_fragments_as_documents(model, files):
    conversation = model.conversation()
    first = conversation.prompt(QUESTION, fragments=[fragment(files["harbor"])], max_tokens=12)
    first.text()
    second = conversation.prompt("When was it automated?", max_tokens=12)
    second.text()
    third = conversation.prompt("Where does the ferry go?", max_tokens=12)
    third.text()
    ids = first.response_json["documents"]
    pc = llm_plugin.prompt_cache(MODEL)
    assert second.response_json["documents"] == third.response_json["documents"] == ids
    assert ids[0] in second.response_json["tiers"]  # placed as a document, not sent as the turn's text
    # The text once: sent again in the first user message, it would add the document's tokens once more.
    assert second.usage().input < first.usage().input + first.usage().output + len(pc.documents.tokens(HARBOR))
    assert third.response_json["tiers"]["#conversation"] == "context"
    assert third.response_json["cached_tokens"] >= second.usage().input


def test_max_tokens_bounds_the_answer_without_streaming(model):
    response = model.prompt("Count from one to fifty, one number a line.", max_tokens=5, stream=False)
    assert len(list(response)) == 1  # the whole answer at once
    assert response.usage().output == 5
    assert response.response_json["finish_reason"] == "length"


def test_a_schema_holds_the_answer_to_json_it_admits(model):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"]}
    answer = model.prompt("What colour is the sky? Answer in JSON.", schema=schema, max_tokens=32).text()
    assert json.loads(answer) in ({"colour": "red"}, {"colour": "green"}, {"colour": "blue"})


def test_tools_are_called_through_llm_and_their_results_answered_after_the_cached_turn(model):
    def lighthouse_keeper(light: Literal["Calder Light", "Kessel Light"]) -> str:
        """Returns what the harbour records say of a lighthouse's last keeper."""
        return f"The last keeper of the {light} was Agnes Moir."

    first = model.prompt(QUESTION, tools=[lighthouse_keeper], tool_choice="required", max_tokens=64)
    assert first.text() == ""  # the answer is the call
    (call,) = first.tool_calls()[:1]
    assert call.name == "lighthouse_keeper" and call.arguments["light"] in ("Calder Light", "Kessel Light")
    results = first.execute_tool_calls()[:1]
    assert results[0].output.startswith("The last keeper of the")
    # llm's own chain sends the calls and their results back: the next step computes only the results.
    second = model.prompt(None, tools=[lighthouse_keeper], tool_results=results, max_tokens=8,
                          messages=[*first.prompt.messages, *first.messages(),
                                    llm.parts.Message(role="tool", parts=[llm.parts.ToolResultPart(
                                        name=r.name, output=r.output, tool_call_id=r.tool_call_id) for r in results])])
    second.text()
    assert second.response_json["cached_tokens"] >= first.usage().input  # the question, reused from the first step


def test_invalid_options_are_refused_with_the_option_named(model):
    with pytest.raises(pydantic.ValidationError, match="temperature"):  # before anything runs
        model.prompt("Hi", temperature=-1)
    # pc_cpu's own refusals come back as llm.ModelError, which llm's CLI prints as one line.
    with pytest.raises(llm.ModelError, match=r"top_k=4294967296: must be an integer"):
        model.prompt("Hi", top_k=2**32).text()
    with pytest.raises(llm.ModelError, match="threads applies when a model is opened"):
        model.prompt("Hi", threads=1).text()


def test_the_llm_command_answers_over_a_file_and_logs_the_cache_counts(model, files):
    from click.testing import CliRunner
    from llm.cli import cli

    runner = CliRunner()
    answered = runner.invoke(cli, ["-m", MODEL_ID, "-f", str(files["harbor"]), QUESTION, "-o", "max_tokens", "8"])
    assert answered.exit_code == 0, answered.output
    assert answered.output.strip()
    logged = runner.invoke(cli, ["logs", "--json", "-n", "1"])
    assert logged.exit_code == 0, logged.output
    row = json.loads(logged.output)[0]
    assert row["model"] == MODEL_ID and row["output_tokens"] == 8
    assert row["response_json"]["documents"] == [d.id for d in llm_plugin.prompt_cache(MODEL).list_documents()]
    assert row["response_json"]["cached_tokens"] > 0

    refused = runner.invoke(cli, ["-m", MODEL_ID, "Hi", "-o", "temperature", "-1"])
    assert refused.exit_code == 1
    assert "temperature" in refused.output and "greater than or equal to 0" in refused.output
