"""Loading a schema after an edit: what is encoded again, how long it takes, and whether answers change.

A schema of `--modules` document modules is loaded once into a store (another
process, in effect: the PromptCache is closed). Then each case loads a changed
schema into a fresh PromptCache on a copy of that store, and a cold PromptCache
(empty store) loads the same changed schema:

- unchanged: the same schema again;
- edit_first / edit_middle: one module's text lengthened (every module after it moves);
- append: one module added at the end.

Reported per case: modules encoded and load seconds, warm and cold, and whether a
prompt importing every module gets the same greedy tokens from both (same tokens,
same answer, whatever the store held before).

    python bench/edits.py --model smollm2-135m --threads 2 [--modules 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from pc_cpu import PromptCache
from pc_cpu.opening import cache_ropes

from pc_cpu.demo import DOCS

EXTRA = " A later note adds that the keeper's log for that winter was found in 1990 in a loft in Leith."


def numbered_modules(count: int) -> list[tuple[str, str]]:
    """Returns `count` (name, text) modules, each a demo document under a number of its own (no two alike)."""
    texts = list(DOCS.values())
    return [(f"part{i}", f"Note {i}. {texts[i % len(texts)]}") for i in range(count)]


def schema(modules: list[tuple[str, str]]) -> str:
    body = "".join(f'<module name="{n}">{t}</module>' for n, t in modules)
    return f'<schema name="lib"><system>Answer from the documents.</system><user>{body}</user></schema>'


def prompt(modules: list[tuple[str, str]]) -> str:
    imports = "".join(f"<{n}/>" for n, _ in modules)
    return f'<prompt schema="lib">{imports}<user>When was the Calder Light automated?</user></prompt>'


def cases(modules: list[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    def lengthened(i: int) -> list[tuple[str, str]]:
        return [(n, t + EXTRA if k == i else t) for k, (n, t) in enumerate(modules)]

    return {"unchanged": modules, "edit_first": lengthened(0), "edit_middle": lengthened(len(modules) // 2),
            "append": numbered_modules(len(modules) + 1)}


def load(model: str | None, threads: int, store: Path, modules: list[tuple[str, str]]) -> dict:
    """Returns the load's seconds, encodings computed, and the greedy answer of a prompt importing every module."""
    with PromptCache(model, threads=threads, n_ctx=8192, store=store) as pc:
        start = time.perf_counter()
        pc.load_schema(schema(modules))
        seconds = time.perf_counter() - start
        answer = pc.generate(prompt(modules), max_tokens=12)
        return {"seconds": seconds, "encoded": pc.schemas.encoded, "tokens": answer.token_ids,
                "at_home": cache_ropes(pc.model) is not None}  # the relocator moves its cells: computed at home


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modules", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        base = numbered_modules(args.modules)
        first = load(args.model, args.threads, root / "base", base)
        rows = {}
        for name, changed in cases(base).items():
            shutil.copytree(root / "base", root / name)
            warm = load(args.model, args.threads, root / name, changed)
            cold = load(args.model, args.threads, root / f"{name}_cold", changed)
            rows[name] = {"warm_seconds": warm["seconds"], "warm_encoded": warm["encoded"],
                          "cold_seconds": cold["seconds"], "cold_encoded": cold["encoded"],
                          "same_answer": warm["tokens"] == cold["tokens"]}
        result = {"model": args.model, "threads": args.threads, "modules": args.modules,
                  "at_home": first["at_home"], "first_load_seconds": first["seconds"], "cases": rows}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{args.modules} modules, modules computed at home and moved: {result['at_home']}")
    print("| case | encoded (warm / cold) | load s (warm / cold) | warm / cold | same answer |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['warm_encoded']} / {r['cold_encoded']} | {r['warm_seconds']:.2f} / "
              f"{r['cold_seconds']:.2f} | {r['warm_seconds'] / r['cold_seconds']:.2f} | {r['same_answer']} |")


if __name__ == "__main__":
    main()
