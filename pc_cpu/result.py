"""Gives the Result of one generation, the record every interface (API, CLI --json) reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Result:
    text: str
    token_ids: list[int]
    ttft_ms: float  # from the call to the first sampled token: parse, plan, assembly, prefill
    total_ms: float
    cached_tokens: int  # prompt tokens whose cells came from encoded modules
    uncached_tokens: int  # prompt tokens computed for this call (arguments, free text)
    finish_reason: str  # "stop" or "length"
    use_cache: bool
    modules: list[str] = field(default_factory=list)  # imported modules, in position order
    # Where each encoding the prompt used came from: "context" (resident), "ram", "disk", or
    # "encoded" (computed for this call). Keys are modules, "#root", or "scaffold:<name>".
    tiers: dict[str, str] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return self.cached_tokens + self.uncached_tokens

    def to_dict(self) -> dict:
        """Returns the fields as plain JSON-ready values."""
        data = asdict(self)
        data["prompt_tokens"] = self.prompt_tokens
        return data
