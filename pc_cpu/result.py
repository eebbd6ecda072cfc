"""Gives the Result of one generation, the record every interface (API, CLI --json) reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum


PREAMBLE = "#preamble"  # the key of a question's preamble (its system message's cells) in a Result's tiers


class Tier(str, Enum):
    """Where an encoding a prompt used came from: the values of Result.tiers.

    A str, so a member equals, prints and serialises to JSON as its value ("ram").
    """

    CONTEXT = "context"  # resident in the context already
    RAM = "ram"  # restored from the RAM tier (pc_cpu.store.ram)
    DISK = "disk"  # restored from the disk tier (pc_cpu.store.disk)
    REMOTE = "remote"  # read from a Redis shared with other servers (pc_cpu.store.remote)
    ENCODED = "encoded"  # computed for this call

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class AddedDocument(str):
    """A document's id, as PromptCache.add_document gives it, with where its cells came from.

    A str (the id itself), so code that keeps the id keeps working. `tiers`: {the document id:
    the Tier that served its cells, and "#preamble" (PREAMBLE): the tier of the system message's
    cells when they were needed to compute the document}. ENCODED means this call computed them;
    a document found in a tier needed no preamble.
    """

    tiers: dict[str, Tier]

    def __new__(cls, doc_id: str, tiers: dict[str, Tier]) -> "AddedDocument":
        added = super().__new__(cls, doc_id)
        added.tiers = tiers
        return added


@dataclass(frozen=True)
class Result:
    text: str
    token_ids: list[int]
    ttft_ms: float  # from the call to the first sampled token: parse, plan, assembly, prefill
    total_ms: float
    cached_tokens: int  # prompt tokens whose cells came from encoded modules
    uncached_tokens: int  # prompt tokens computed for this call (arguments, free text)
    finish_reason: str  # "stop", "length", or "tool_calls" (an answer that called tools)
    use_cache: bool
    modules: list[str] = field(default_factory=list)  # imported modules, in position order
    # Where each encoding the prompt used came from (a Tier: "context", "ram", "disk", "remote" or "encoded").
    # Keys are modules, "#root", or "scaffold:<name>"; for documents their ids and "#preamble".
    tiers: dict[str, Tier] = field(default_factory=dict)
    # With logprobs asked for: one dict per generated token, {"token_id", "bytes", "logprob", "top": [{"token_id",
    # "bytes", "logprob"}, ...]}, the model's own distribution (before a grammar, penalties or biases). Else None.
    logprobs: list[dict] | None = None
    # A chat answer given tools: the calls it made, in OpenAI's shape ({"id", "type": "function", "function":
    # {"name", "arguments": JSON text}}), `text` then the answer without them and finish_reason "tool_calls".
    tool_calls: list[dict] | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.cached_tokens + self.uncached_tokens

    def to_dict(self) -> dict:
        """Returns the fields as plain JSON-ready values."""
        data = asdict(self)
        data["prompt_tokens"] = self.prompt_tokens
        return data
