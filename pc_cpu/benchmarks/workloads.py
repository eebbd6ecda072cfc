"""Latency workloads shaped like the paper's: multi-document QA, a system template with a param, code.

Each workload is a (schema, prompt) pair of PML; the text comes from real sources read in place
(NQ passages when ../shared/evaldata is present, else the demo documents; pc_cpu's own source as code).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pc_cpu.pml.text import escape_text


@dataclass(frozen=True)
class Workload:
    name: str
    schema: str
    prompt: str


def passages(count: int) -> list[str]:
    """Returns `count` document texts: NQ gold passages if the evaluation data is there, else demo documents."""
    from pc_cpu.benchmarks.evaldata import load_nq
    from pc_cpu.errors import DataMissingError

    try:
        qs = load_nq()
        return [f"{q.gold.title}. {q.gold.text}\n" for q in qs[:count]]
    except DataMissingError:
        from pc_cpu.demo import DOCS

        texts = list(DOCS.values())
        return [texts[i % len(texts)] + "\n" for i in range(count)]


def fill(tokenize, texts: list[str], target_tokens: int) -> list[str]:
    """Returns the first texts whose token counts add up to at least `target_tokens` (cycling if short)."""
    out, total, i = [], 0, 0
    while total < target_tokens:
        text = texts[i % len(texts)]
        out.append(text)
        total += len(tokenize(text))
        i += 1
    return out


def multidoc(tokenize, target_tokens: int, name: str = "docs") -> Workload:
    """Documents as modules after a system message; the question is uncached."""
    docs = fill(tokenize, passages(400), target_tokens)
    body = "".join(f'<module name="d{i}">{escape_text(t)}</module>' for i, t in enumerate(docs))
    schema = (f'<schema name="{name}"><system>Answer from the documents.</system><user>{body}</user></schema>')
    imports = "".join(f"<d{i}/>" for i in range(len(docs)))
    return Workload("multi-doc QA", schema, f'<prompt schema="{name}">{imports}<user>Who is mentioned first?</user></prompt>')


def template(tokenize, target_tokens: int, name: str = "tmpl") -> Workload:
    """A long system template with one param; the user's message is uncached."""
    rules = fill(tokenize, passages(400), target_tokens)
    policy = escape_text("Reference material:\n" + "".join(rules))
    schema = (f'<schema name="{name}"><system><module name="persona">You are a helpful '
              f'<param name="role" len="8"/> assistant. {policy}</module></system></schema>')
    prompt = f'<prompt schema="{name}"><persona role="travel"/><user>Summarise the rules.</user></prompt>'
    return Workload("system template + param", schema, prompt)


def code(tokenize, target_tokens: int, name: str = "code") -> Workload:
    """pc_cpu's own Python source, 12 lines per module; the request is uncached."""
    root = Path(__file__).resolve().parents[1]
    lines = [line for p in sorted(root.rglob("*.py")) for line in p.read_text(encoding="utf-8").splitlines()]
    blocks = ["\n".join(lines[i:i + 12]) + "\n" for i in range(0, len(lines), 12)]  # ~100-token modules
    sources = fill(tokenize, blocks, target_tokens)
    body = "".join(f'<module name="f{i}">{escape_text(t)}</module>' for i, t in enumerate(sources))
    schema = f'<schema name="{name}"><system>You review Python code.</system><user>{body}</user></schema>'
    imports = "".join(f"<f{i}/>" for i in range(len(sources)))
    return Workload("code context", schema, f'<prompt schema="{name}">{imports}<user>Find a bug.</user></prompt>')


def hit_ratio(tokenize, total_tokens: int, fraction: float, name: str = "hit") -> Workload:
    """A prompt of ~total_tokens of documents; `fraction` of them imported as modules, the rest free text."""
    docs = fill(tokenize, passages(400), total_tokens)
    counts = [len(tokenize(t)) for t in docs]
    cached, acc = 0, 0
    while cached < len(docs) and acc + counts[cached] <= fraction * sum(counts) + counts[cached] / 2:
        acc += counts[cached]
        cached += 1
    body = "".join(f'<module name="d{i}">{escape_text(t)}</module>' for i, t in enumerate(docs[:cached]))
    schema = f'<schema name="{name}"><system>Answer from the documents.</system><user>{body}</user></schema>'
    free = escape_text("".join(docs[cached:]) + "Who is mentioned first?")
    imports = "".join(f"<d{i}/>" for i in range(cached))
    return Workload(f"hit {fraction:.0%}", schema, f'<prompt schema="{name}">{imports}<user>{free}</user></prompt>')
