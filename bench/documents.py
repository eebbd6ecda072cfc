"""Documents: the RAG workload and relocation (pc_cpu.benchmarks.documents; also `pc-cpu bench documents`).

    python bench/documents.py rag --docs 500 --prompts 100 [--model NAME] [--threads 2] [--no-peers]
    python bench/documents.py relocation --n 200 [--model NAME] [--timing-only]
"""

from __future__ import annotations

import argparse
import json

from pc_cpu.benchmarks.documents import DocumentsBench, rag, relocation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["rag", "relocation"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--docs", type=int, default=500)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--timing-only", action="store_true", help="relocation: speed only (run on a quiet machine)")
    parser.add_argument("--no-peers", action="store_true",
                        help="rag: skip llama-cpp-python's Llama on the same prompts (two more full prefills each)")
    args = parser.parse_args()
    job = DocumentsBench(model=args.model, threads=args.threads, docs=args.docs, prompts=args.prompts, n=args.n,
                         timing_only=args.timing_only, peers=not args.no_peers)
    print(json.dumps(rag(job) if args.what == "rag" else relocation(job), indent=1))


if __name__ == "__main__":
    main()
