"""Builds the PML schemas and prompts of the accuracy tasks (the lost-in-the-middle prompt wording).

Layouts of the passages (kept apart in every table):
- "single": all passages in ONE module (prefix-like reuse, the paper's own LongBench setting);
- "modular": each passage its own module, encoded apart;
- "scaffold": modular, plus a scaffold over all passages, so importing them all uses the joint encoding.
`gap` puts that many filler passages (modules a prompt leaves out) before the passages a prompt imports.
"""

from __future__ import annotations

from pc_cpu.benchmarks.evaldata import DocItem, KVItem, Passage
from pc_cpu.pml.text import escape_text

LAYOUTS = ("single", "modular", "scaffold")
QA_SYSTEM = ("Write a high-quality answer for the given question using only the provided search results "
             "(some of which might be irrelevant).")
KV_SYSTEM = "Extract the value corresponding to the specified key in the JSON object below."


def document_text(number: int, passage: Passage) -> str:
    """Returns one search result as the model reads it (1-based `number`)."""
    return f"Document [{number}](Title: {passage.title}) {passage.text}\n"


def _modules(texts: list[str], layout: str, gap_texts: list[str]) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    gap = "".join(f'<module name="g{i}">{escape_text(t)}</module>' for i, t in enumerate(gap_texts))
    if layout == "single":
        return gap + f'<module name="docs">{escape_text("".join(texts))}</module>'
    body = "".join(f'<module name="d{i}">{escape_text(t)}</module>' for i, t in enumerate(texts))
    if layout == "scaffold":
        body = f'<scaffold name="all">{body}</scaffold>'
    return gap + body


def _imports(count: int, layout: str) -> str:
    return "<docs/>" if layout == "single" else "".join(f"<d{i}/>" for i in range(count))


def _schema(name: str, system: str, modules: str, chat: bool) -> str:
    if chat:
        return f'<schema name="{name}"><system>{escape_text(system)}</system><user>{modules}</user></schema>'
    # Base models (Gemma 3 270M): plain text, no chat template.
    return f'<schema name="{name}">{escape_text(system + chr(10) + chr(10))}{modules}</schema>'


def _prompt(name: str, imports: str, question: str, chat: bool) -> str:
    text = escape_text(question)
    body = f"<user>{text}</user>" if chat else escape_text("\n") + text
    return f'<prompt schema="{name}">{imports}{body}</prompt>'


def qa_schema(name: str, item: DocItem, layout: str, *, gap: tuple[Passage, ...] = (), chat: bool = True) -> str:
    """Returns the schema of one N-document question: instruction (system message), then the passages.

    chat=False renders plain text for base models; chat=True uses the model's chat roles.
    """
    texts = [document_text(i + 1, p) for i, p in enumerate(item.passages)]
    gap_texts = [document_text(0, p) for p in gap]
    return _schema(name, QA_SYSTEM, _modules(texts, layout, gap_texts), chat)


def qa_prompt(name: str, item: DocItem, layout: str, *, chat: bool = True) -> str:
    """Returns the prompt importing every passage of the item and asking its question (uncached)."""
    return _prompt(name, _imports(len(item.passages), layout), f"Question: {item.question}\nAnswer:", chat)


def kv_chunks(item: KVItem, chunk: int) -> list[str]:
    """Returns the JSON object's lines, `chunk` pairs per piece; the pieces concatenate to valid JSON."""
    lines = [f'"{k}": "{v}"' for k, v in item.pairs]
    pieces = []
    for start in range(0, len(lines), chunk):
        part = lines[start:start + chunk]
        last = start + chunk >= len(lines)
        text = ",\n".join(part) + ("\n}\n" if last else ",\n")
        pieces.append(("{\n" if start == 0 else "") + text)
    return pieces


def kv_schema(name: str, item: KVItem, layout: str, *, chunk: int, chat: bool = True) -> str:
    """Returns the schema of one retrieval item: the pairs in modules of `chunk` pairs."""
    return _schema(name, KV_SYSTEM, _modules(kv_chunks(item, chunk), layout, []), chat)


def kv_prompt(name: str, item: KVItem, layout: str, *, chunk: int, chat: bool = True) -> str:
    """Returns the prompt importing every chunk and asking for the queried key's value."""
    count = len(kv_chunks(item, chunk))
    return _prompt(name, _imports(count, layout), f'Key: "{item.key}"\nCorresponding value:', chat)
