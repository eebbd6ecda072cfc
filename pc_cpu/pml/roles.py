"""Gives the text a model's chat template puts around each role (<system>, <user>, <assistant>).

One schema serves any model because role tags are rendered by the model's own
template (GGUF `tokenizer.chat_template`). PML needs the template as pieces, a
prefix and a suffix per role, since a role's content may hold modules that are
tokenized on their own. We get the pieces by rendering small conversations with a
marker as content and cutting around it; differences between two renderings
isolate one turn, so templates that inject a default system message into the
first turn (SmolLM2) or fold the system message into the first user turn (Gemma)
still give the right pieces for later turns.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pc_cpu.errors import ModelError

log = logging.getLogger(__name__)

_MARK = "PCMARK7f3a"  # content that no template rewrites (no spaces to trim)
_FILLER_USER = "PCFILLU"
_FILLER_ASSISTANT = "PCFILLA"


@dataclass(frozen=True)
class RoleMarkup:
    """Prefix and suffix text of each chat role, and the text that asks for the assistant's turn."""

    prefix: dict[str, str]
    suffix: dict[str, str]
    generation_prompt: str
    from_template: bool  # False: the plain fallback for models without a chat template


PLAIN_MARKUP = RoleMarkup(
    prefix={"system": "System: ", "user": "User: ", "assistant": "Assistant: "},
    suffix={"system": "\n", "user": "\n", "assistant": "\n"},
    generation_prompt="Assistant:",
    from_template=False,
)


def markup_from_template(template: str | None, *, bos_token: str = "", eos_token: str = "") -> RoleMarkup:
    """Returns the RoleMarkup of a Jinja chat template, or PLAIN_MARKUP when there is none.

    Raises:
        ModelError: the template cannot be rendered for a simple conversation.
    """
    if not template:
        return PLAIN_MARKUP
    try:
        # BOS is the layout's job (Tokenizer.bos_id at position 0), so templates render it as nothing.
        render = _renderer(template, bos_token="", eos_token=eos_token)
        user = _turn(render, "user")
        assistant = _turn(render, "assistant")
        base = render([_msg("user", _FILLER_USER)], False)
        generation = _after(render([_msg("user", _FILLER_USER)], True), base, "generation prompt")
        system = _system_turn(render, user)
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as exc:
        raise ModelError(f"the model's chat template cannot be used for PML roles ({exc}); "
                         "use a schema without <system>/<user>/<assistant>") from None
    prefix = {"system": system[0], "user": user[0], "assistant": assistant[0]}
    suffix = {"system": system[1], "user": user[1], "assistant": assistant[1]}
    return RoleMarkup(prefix, suffix, generation, from_template=True)


def template_renderer(template: str, *, eos_token: str = ""):
    """Returns render(messages, add_generation_prompt) -> str of a Jinja chat template, BOS rendered as nothing.

    BOS is the layout's job (Tokenizer.bos_id at position 0), as for PML roles.
    """
    return _renderer(template, bos_token="", eos_token=eos_token)


def _msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def _tojson(value, indent=None, separators=None, sort_keys=False, ensure_ascii=False) -> str:
    return json.dumps(value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii)


def _renderer(template: str, *, bos_token: str, eos_token: str):
    env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])

    def raise_exception(message: str):
        raise jinja2.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    # Templates' `tojson` is json.dumps as Hugging Face's and llama.cpp's renderers have it: keys in their
    # order, text as it is. Jinja's own sorts keys and escapes <, > and &: tools would read otherwise.
    env.filters["tojson"] = _tojson
    compiled = env.from_string(template)

    def render(messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None) -> str:
        more = {"tools": tools} if tools else {}
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **more)

    return render


def _split(segment: str, what: str) -> tuple[str, str]:
    if segment.count(_MARK) != 1:
        raise ValueError(f"the {what} turn does not contain its content exactly once")
    before, after = segment.split(_MARK)
    return before, after


def _after(longer: str, shorter: str, what: str) -> str:
    if not longer.startswith(shorter):
        raise ValueError(f"adding the {what} changes earlier turns")
    return longer[len(shorter):]


def _turn(render, role: str) -> tuple[str, str]:
    """Returns (prefix, suffix) of a `role` turn that follows earlier turns."""
    history = [_msg("user", _FILLER_USER), _msg("assistant", _FILLER_ASSISTANT)]
    if role == "assistant":
        history = [_msg("user", _FILLER_USER)]
    longer = render(history + [_msg(role, _MARK)], False)
    return _split(_after(longer, render(history, False), role), role)


def _system_turn(render, user: tuple[str, str]) -> tuple[str, str]:
    """Returns (prefix, suffix) of a leading system turn, or the user turn's when the template folds it."""
    rendered = render([_msg("system", _MARK), _msg("user", _FILLER_USER)], False)
    user_turn = user[0] + _FILLER_USER + user[1]
    if rendered.count(_MARK) == 1 and rendered.endswith(user_turn):
        prefix, rest = rendered.split(_MARK)
        return prefix, rest[: len(rest) - len(user_turn)]
    log.warning("the chat template has no separate system turn; <system> is rendered as a user turn")
    return user
