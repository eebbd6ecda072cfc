"""Questions over documents asked back to back, against each asked once the cache is idle: TTFT medians.

`ask` computes a new combination's exact prefix in the background, for the next question over
it (prefix="background"). A question asked while that work runs waits for it. This measures
how long, per flash-attention setting: 30 NQ passages are added, then `--questions` questions
over 5 random ones each are asked back to back, then as many again each after `wait_idle()`.

    python bench/back_to_back.py --threads 2 --questions 8
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from pc_cpu import PromptCache
from pc_cpu.benchmarks.documents import SYSTEM, passage_text
from pc_cpu.benchmarks.evaldata import load_nq


def measure(model: str | None, threads: int, flash_attn: bool | None, questions: int) -> dict:
    """Returns the TTFT medians of back-to-back and idle-first questions with one flash-attention setting."""
    nq = load_nq()
    rng = random.Random(0)
    chosen = rng.sample(range(len(nq)), 30)
    with PromptCache(model, threads=threads, store=False, flash_attn=flash_attn) as pc:
        ids = [pc.add_document(passage_text(nq[i].gold), system=SYSTEM) for i in chosen]
        pc.ask("warm up", documents=[], system=SYSTEM, max_tokens=1)
        times: dict[str, list[float]] = {"back_to_back": [], "after_wait_idle": []}
        for setting, ms in times.items():
            for k in range(questions):
                docs = rng.sample(ids, 5)
                if setting == "after_wait_idle":
                    pc.wait_idle()
                ms.append(pc.ask(nq[chosen[k]].question, documents=docs, system=SYSTEM, max_tokens=24).ttft_ms)
        return {"flash_attn": pc.flash_attn,
                **{f"{setting}_p50_ms": round(statistics.median(ms), 1) for setting, ms in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--questions", type=int, default=8)
    args = parser.parse_args()
    for flash_attn in (True, None):  # on, then pc_cpu's default
        print(json.dumps(measure(args.model, args.threads, flash_attn, args.questions)), flush=True)


if __name__ == "__main__":
    main()
