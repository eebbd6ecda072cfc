"""Tests of chat-role markup taken from a model's Jinja chat template (pc_cpu.pml.roles)."""

from __future__ import annotations

import logging

import pytest

from pc_cpu.errors import ModelError
from pc_cpu.pml.roles import PLAIN_MARKUP, RoleMarkup, markup_from_template

# SmolLM2-135M-Instruct's template: injects a default system message when the first message is not system.
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
           "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
           "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
           "{% endif %}")

# Qwen2.5's template (its no-tools branch, as in the GGUF): a default system message of its own when
# the first message is not system, and tool-call branches for assistant turns.
QWEN25 = ("{%- if messages[0]['role'] == 'system' %}"
          "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
          "{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
          "assistant.<|im_end|>\n' }}{%- endif %}"
          "{%- for message in messages %}"
          "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
          "(message.role == 'assistant' and not message.tool_calls) %}"
          "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}"
          "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
          "{%- if message.content %}{{- '\n' + message.content }}{%- endif %}{{- '<|im_end|>\n' }}"
          "{%- endif %}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")

# Gemma-style: folds the system message into the first user turn, raises on non-alternating roles.
GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
         "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}"
         "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
         "{% for message in loop_messages %}"
         "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
         "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}"
         "{% set role = message['role'] %}{% endif %}"
         "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
         "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")

# Llama-3-style: BOS from the template, header ids around the role, content trimmed.
LLAMA3 = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")


def test_smollm2_chatml_markup_ignores_the_injected_default_system_message():
    markup = markup_from_template(SMOLLM2, bos_token="<|im_start|>", eos_token="<|im_end|>")

    assert markup == RoleMarkup(
        prefix={"system": "<|im_start|>system\n", "user": "<|im_start|>user\n",
                "assistant": "<|im_start|>assistant\n"},
        suffix={"system": "<|im_end|>\n", "user": "<|im_end|>\n", "assistant": "<|im_end|>\n"},
        generation_prompt="<|im_start|>assistant\n",
        from_template=True,
    )
    assert "SmolLM" not in "".join(markup.prefix.values())


def test_qwen25_chatml_markup_leaves_out_its_default_system_message():
    # A prompt's system turn is the one its PML gives it; the template's default would otherwise
    # be glued to the first user turn, before any module imported there.
    markup = markup_from_template(QWEN25, bos_token="", eos_token="<|im_end|>")

    assert markup.prefix == {"system": "<|im_start|>system\n", "user": "<|im_start|>user\n",
                             "assistant": "<|im_start|>assistant\n"}
    assert markup.suffix == {role: "<|im_end|>\n" for role in ("system", "user", "assistant")}
    assert markup.generation_prompt == "<|im_start|>assistant\n"
    assert "Qwen" not in "".join(markup.prefix.values()) + "".join(markup.suffix.values())


def test_gemma_folds_system_into_a_user_turn_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="pc_cpu.pml.roles"):
        markup = markup_from_template(GEMMA, bos_token="<bos>", eos_token="<eos>")

    assert markup.prefix == {"system": "<start_of_turn>user\n", "user": "<start_of_turn>user\n",
                             "assistant": "<start_of_turn>model\n"}
    assert markup.suffix == {"system": "<end_of_turn>\n", "user": "<end_of_turn>\n",
                             "assistant": "<end_of_turn>\n"}
    assert markup.generation_prompt == "<start_of_turn>model\n"
    assert markup.from_template
    assert "no separate system turn; <system> is rendered as a user turn" in caplog.text


def test_llama3_user_and_assistant_turns():
    markup = markup_from_template(LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")

    assert markup.prefix["user"] == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert markup.prefix["assistant"] == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert markup.suffix == {"system": "<|eot_id|>", "user": "<|eot_id|>", "assistant": "<|eot_id|>"}
    assert markup.generation_prompt == "<|start_header_id|>assistant<|end_header_id|>\n\n"


def test_llama3_system_prefix_has_no_bos():
    markup = markup_from_template(LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")

    assert markup.prefix["system"] == "<|start_header_id|>system<|end_header_id|>\n\n"


def test_template_helpers_are_available():
    template = ("{{ strftime_now('%Y') and '' }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}"
                "{% endif %}[{{ m.role }}]{{ m.content }}[/{{ m.role }}]{% endfor %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}")

    markup = markup_from_template(template)

    assert markup.prefix["user"] == "[user]"
    assert markup.suffix["assistant"] == "[/assistant]"
    assert markup.generation_prompt == "[assistant]"


@pytest.mark.parametrize("template", [None, ""])
def test_no_template_gives_plain_markup(template):
    markup = markup_from_template(template)

    assert markup is PLAIN_MARKUP
    assert not markup.from_template
    assert markup.prefix["user"] == "User: "
    assert markup.generation_prompt == "Assistant:"


@pytest.mark.parametrize("template", [
    "{{ messages[5]['content'] }}",  # IndexError-like: undefined item
    "{{ raise_exception('no chat here') }}",
    "{{ undefined_name.attr }}",
    "static text, no messages",  # renders, but the content never appears
    "{{ ''.__class__.__mro__ }}",  # sandbox refuses it
])
def test_unusable_template_is_a_model_error(template):
    with pytest.raises(ModelError) as info:
        markup_from_template(template)

    assert "the model's chat template cannot be used for PML roles" in str(info.value)
    assert "use a schema without <system>/<user>/<assistant>" in str(info.value)


def test_template_with_a_syntax_error_is_a_model_error():
    with pytest.raises(ModelError, match="cannot be used for PML roles"):
        markup_from_template("{% for %}")
