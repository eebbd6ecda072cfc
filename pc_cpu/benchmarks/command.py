"""`pc-cpu bench`: runs the benchmarks with a progress bar; Markdown to stdout, or the raw results with --json.

`bench` holds the subcommands; pc_cpu.cli's `bench` group (and its help text) imports this module only
when one of them is listed or run, so `pc-cpu --help` does not load the benchmarks.
"""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

import click

from pc_cpu.benchmarks.recompute import DEFAULT_POLICIES
from pc_cpu.pml.document_layout import ORDERS
from pc_cpu.pml.encoding import ENCODING_MODES

model_option = click.option("--model", default=None, metavar="NAME|PATH",
                            help="A model name (see `pc-cpu models`) or a GGUF file (default: $PC_CPU_MODEL, "
                                 "else smollm2-135m).")
threads_option = click.option("--threads", type=click.IntRange(1, 512), default=2, show_default=True)
quick_option = click.option("--quick", is_flag=True, help="A size that fits in a few minutes.")
# The small models restate the 36-character key (~30 tokens) before giving the value (~30 more):
# 64 tokens cut most answers off mid-UUID and scored them wrong.
KV_MAX_TOKENS = 128

json_option = click.option("--json", "as_json", is_flag=True, help="Print the raw results as JSON.")


@contextmanager
def _bar(length: int, label: str, quiet: bool):
    """Yields a progress callback; the bar goes to stderr so stdout stays clean for --json."""
    if quiet:
        yield lambda n: None
        return
    with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
        yield bar.update


def _emit(data, markdown: str, as_json: bool) -> None:
    click.echo(json.dumps(data, indent=1, default=str) if as_json else markdown)


bench = click.Group("bench")  # the subcommands of `pc-cpu bench` (pc_cpu.cli.bench lists and runs them)


@bench.command()
@model_option
@threads_option
@quick_option
@json_option
@click.option("--plots", type=click.Path(file_okay=False), default=None, help="Write PNG plots to this directory.")
def latency(model, threads, quick, as_json, plots):
    """TTFT: tiers, length sweep with fits, cache-hit ratio, encoding cost, memory.

    Example: pc-cpu bench latency --quick --threads 2 --plots bench/
    """
    from pc_cpu.benchmarks import latency as lat
    from pc_cpu.benchmarks.plots import plot_latency
    from pc_cpu.benchmarks.report import latency_markdown

    size = "quick" if quick else "full"
    with _bar(lat.steps(size), "latency", as_json) as progress:
        report = lat.run(model, threads, size, progress=progress)
    if plots:
        written = plot_latency(report, plots)
        if not written:
            click.echo("matplotlib is not installed: no plots (pip install '.[bench]')", err=True)
    _emit(report, latency_markdown(report), as_json)


@bench.command()
@model_option
@threads_option
@quick_option
@json_option
@click.option("--n", "count", type=click.IntRange(1), default=None, help="Items per task (default 60, quick 10).")
@click.option("--task", type=click.Choice(["nq5", "nq10", "kv"]), multiple=True, help="Tasks (default all).")
@click.option("--kv-keys", type=click.IntRange(2, 75), default=5, show_default=True)
@click.option("--gap", "gaps", type=click.IntRange(1), multiple=True, help="Gap sizes for NQ N=5 (repeatable).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Append records as JSON lines here.")
@click.option("--plain", is_flag=True, help="Plain-text prompts without chat roles (base models, e.g. Gemma 3 270M).")
@click.option("--start", type=click.IntRange(0), default=0, help="Skip the first START items (resume a cut-off run).")
def accuracy(model, threads, quick, as_json, count, task, kv_keys, gaps, out, plain, start):
    """Exact match and agreement of cached vs full-prefill answers on NQ and KV retrieval.

    Example: pc-cpu bench accuracy --task nq5 --n 60 --gap 5 --out /tmp/nq5.jsonl
    """
    from pc_cpu import PromptCache
    from pc_cpu.benchmarks import accuracy as acc, evaldata
    from pc_cpu.benchmarks.report import accuracy_markdown
    from pc_cpu.benchmarks.summary import summarize

    count = count or (10 if quick else 60)
    tasks = task or ("nq5", "nq10", "kv")
    chat = not plain
    plans = {"nq5": (acc.nq_task(5, chat=chat), lambda: evaldata.doc_items(evaldata.load_nq(), 5, count, seed=0),
                     gaps, 32),
             "nq10": (acc.nq_task(10, chat=chat), lambda: evaldata.doc_items(evaldata.load_nq(), 10, count, seed=1),
                      (), 32),
             "kv": (acc.kv_task(kv_keys, 1, chat=chat),
                    lambda: evaldata.kv_items(evaldata.load_kv(), kv_keys, count), (), KV_MAX_TOKENS)}
    caches = {m: PromptCache(model, threads=threads, n_ctx=4096, store=False, encoding=m, ram_bytes=256 << 20)
              for m in acc.ENCODINGS}
    records = []
    sink = open(out, "a", encoding="utf-8") if out else None
    try:
        with _bar(max(count - start, 0) * len(tasks), "accuracy", as_json) as progress:
            for name in tasks:
                t, items, g, max_tokens = plans[name]
                records += acc.run(caches, t, items(), gaps=g, max_tokens=max_tokens, out=sink,
                                   progress=progress, start=start)
    finally:
        if sink:
            sink.close()
        for c in caches.values():
            c.close()
    rows = summarize(records)
    _emit([r.__dict__ for r in records], accuracy_markdown(rows, records), as_json)


@bench.command()
@model_option
@threads_option
@quick_option
@json_option
@click.option("--llama-server", "llama_server", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A llama-server binary: llama.cpp's own server joins the peers, its cache on (python "
                   "bench/llama_server_peer.py builds one from llama-cpp-python's sdist).")
def peers(model, threads, quick, as_json, llama_server):
    """pc_cpu vs llama-cpp-python's Llama (prefix reuse), LlamaRAMCache and llama-server on the same tokens.

    Example: pc-cpu bench peers --quick --threads 2 [--llama-server ~/.cache/pc_cpu/llama-server/build/bin/llama-server]
    """
    from pathlib import Path

    from pc_cpu.benchmarks import peers as prs
    from pc_cpu.benchmarks.report import peers_markdown

    with _bar(3 + (llama_server is not None), "peers", as_json) as progress:
        report = prs.run(model, threads, doc_tokens=600 if quick else 1500, repeats=3 if quick else 5,
                         llama_server=Path(llama_server) if llama_server else None, progress=progress)
    _emit(report, peers_markdown(report), as_json)


policies_option = click.option(
    "--policy", "policies", multiple=True,
    help=f"Recompute policy to measure (repeatable; default: {' '.join(DEFAULT_POLICIES)}; forms: pc-cpu run --help).")


@bench.group()
def recompute() -> None:
    """Recompute policies: exact match and agreement vs the full prefill (NQ or KV, paired), TTFT at long prompts.

    `run` answers the questions and summarizes its answers; `summarize` and `compare` read answer files.
    """


versus_option = click.option(
    "--versus", "versus_files", type=click.Path(exists=True, dir_okay=False), multiple=True,
    help="Answers of another run on the same questions (repeatable): adds each policy's paired difference to it.")


@recompute.command("run")
@model_option
@threads_option
@quick_option
@json_option
@click.option("--n", "count", type=click.IntRange(0), default=None,
              help="Questions (default 200, quick 10; 0: only the TTFT run). The NQ items are drawn "
                   "together, so their passages depend on N: resume or split a run with --start/--stop, "
                   "never with a smaller N.")
@click.option("--task", type=click.Choice(["nq", "kv"]), default="nq", show_default=True,
              help="NaturalQuestions with --docs passages, or key-value retrieval with --docs pairs.")
@click.option("--docs", type=click.IntRange(2, 20), default=5, show_default=True,
              help="Modules per item, one passage (nq) or one key-value pair (kv) each.")
@policies_option
@click.option("--start", type=click.IntRange(0), default=0, help="Skip the first START questions (resume a run).")
@click.option("--stop", type=click.IntRange(0), default=None,
              help="Stop before question STOP of the N (split a run across processes: --stop K, then --start K).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Append every answer as a JSON line here.")
@click.option("--plain", is_flag=True, help="Plain-text prompts without chat roles (base models, e.g. Gemma 3 270M).")
@click.option("--ttft-tokens", type=click.IntRange(0), default=4000, show_default=True,
              help="Also time every policy on one prompt of this many cached tokens (0: skip).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write the Pareto plot (PNG) here.")
@click.option("--gap", type=click.IntRange(0), default=0, show_default=True,
              help="NQ: declare this many other passages as modules before the imported ones, left out.")
@click.option("--encoding", "encodings", type=click.Choice(ENCODING_MODES), multiple=True,
              help="How modules are encoded (pc_cpu.pml.encoding; default preamble). Repeat it to answer "
                   "each item in every mode from one full prefill; --out then gets the mode before its "
                   "extension (a_chain.jsonl).")
@versus_option
def recompute_run(model, threads, quick, as_json, count, task, docs, policies, start, stop, out, plain, ttft_tokens,
                  plot, gap, encodings, versus_files):
    """Answer questions under each policy and by the full prefill, paired; print the summary of the answers.

    Example: pc-cpu bench recompute run --n 200 --docs 5 --policy 0 --policy 20% --policy select:20% --out a.jsonl
    """
    from pc_cpu.benchmarks import accuracy as acc, evaldata

    _check_policies(policies)  # a bad policy fails here, before the model loads
    encodings = tuple(dict.fromkeys(encodings)) or ("preamble",)
    chosen = list(policies) or list(DEFAULT_POLICIES)
    count = (10 if quick else 200) if count is None else count
    if task == "kv" and gap:
        raise click.UsageError("--gap is for NQ (--task nq): key-value items have no passages to leave out")
    if stop is not None and not start < stop <= count:
        raise click.UsageError(f"--stop {stop}: must lie after --start {start} and at most --n {count}")
    if task == "kv":
        spec, max_tokens = acc.kv_task(docs, 1, chat=not plain), KV_MAX_TOKENS
    else:
        spec, max_tokens = acc.nq_task(docs, chat=not plain), 24
    items = evaldata.run_items(task, docs, count)[start:stop]
    runs = _recompute_runs(model, threads, encodings, items, chosen, spec, max_tokens, gap, out, as_json,
                           ttft_tokens, quick)
    reports = {mode: _recompute_report(answers, chosen, ttft, _path_for(plot, mode, encodings), mode, versus_files)
               for mode, (answers, ttft) in runs.items()}
    if len(reports) == 1:
        text, data = reports[encodings[0]]
        _emit(data, text, as_json)
    else:
        _emit({"by_encoding": {mode: data for mode, (_, data) in reports.items()}},
              "\n\n".join(f"## {mode} encoding\n\n{text}" for mode, (text, _) in reports.items()), as_json)


@recompute.command("summarize")
@click.argument("answer_files", type=click.Path(exists=True, dir_okay=False), nargs=-1, required=True,
                metavar="ANSWERS...")
@click.option("--policy", "policies", multiple=True,
              help="Policy to show (repeatable; default: every policy the files hold).")
@click.option("--ttft-json", type=click.Path(exists=True, dir_okay=False), default=None,
              help="A TTFT result saved by an earlier `run --json`: adds each policy's speedup at long prompts.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write the Pareto plot (PNG) here (needs --ttft-json).")
@click.option("--encoding", type=click.Choice(ENCODING_MODES), default="preamble", show_default=True,
              help="The plot's label: how the answers' modules were encoded.")
@versus_option
@json_option
def recompute_summarize(answer_files, policies, ttft_json, plot, encoding, versus_files, as_json):
    """Summarize answer files of `run` (several runs' files together): one row per policy, paired.

    A question answered twice (by two runs) counts once.

    Example: pc-cpu bench recompute summarize a.jsonl b.jsonl --ttft-json ttft.json --plot pareto.png
    """
    from pc_cpu.benchmarks import recompute as rc

    answers = rc.read_answers(answer_files)
    ttft = json.loads(Path(ttft_json).read_text())["ttft"] if ttft_json else None
    text, data = _recompute_report(answers, list(policies) or rc.policies_in(answers), ttft, plot, encoding,
                                   versus_files)
    _emit(data, text, as_json)


@recompute.command("compare")
@click.argument("answer_files", type=click.Path(exists=True, dir_okay=False), nargs=-1, required=True,
                metavar="ANSWERS...")
@click.option("--versus", "versus_files", type=click.Path(exists=True, dir_okay=False), multiple=True, required=True,
              help="Answers of another run on the same questions (repeatable), e.g. with another encoding.")
@click.option("--policy", "policies", multiple=True,
              help="Policy to compare (repeatable; default: every policy the ANSWERS files hold).")
@json_option
def recompute_compare(answer_files, versus_files, policies, as_json):
    """Each policy's exact match in ANSWERS minus in the --versus run's, paired by question.

    Each run keeps its own full prefill; `summarize` gives each run against it.

    Example: pc-cpu bench recompute compare chain_a.jsonl chain_b.jsonl --versus preamble.jsonl
    """
    from pc_cpu.benchmarks import recompute as rc

    answers = rc.read_answers(answer_files)
    rows = rc.versus(answers, rc.read_answers(versus_files), list(policies) or rc.policies_in(answers))
    _emit(rows, "Against the other run (--versus), paired by question:\n\n" + rc.versus_markdown(rows), as_json)


def _check_policies(policies) -> None:
    """Raises (before any model loads) for a recompute policy that does not parse."""
    from pc_cpu.pml.recompute import parse_policy

    for policy in policies:
        parse_policy(policy)


def _recompute_report(answers, policies, ttft: dict | None, plot: str | None, encoding: str,
                      versus_files=()) -> tuple[str, dict]:
    """Returns the Markdown and the data of a summary of answers: rows per policy, by gold position, TTFT,
    and the paired difference to the answers of `versus_files` when given.

    Writes the Pareto plot to `plot` when given and there is a TTFT result to plot against.
    """
    from pc_cpu.benchmarks import recompute as rc
    from pc_cpu.benchmarks.plots import plot_pareto

    rows = rc.summarize(answers, policies, ttft)
    if plot and ttft and not plot_pareto(rows, ttft, plot, encoding=encoding):
        click.echo("matplotlib is not installed: no plot (pip install '.[bench]')", err=True)
    text = rc.markdown(rows, ttft) + "\n\nExact matches by gold position:\n\n" + rc.by_position_markdown(
        answers, policies) if rows else ""
    if ttft:
        text += ("\n\n" if text else "") + rc.ttft_markdown(ttft)
    data = {"rows": rows, "ttft": ttft}
    if versus_files:
        data["versus"] = rc.versus(answers, rc.read_answers(versus_files), policies)
        text += "\n\nAgainst the other run (--versus), paired by question:\n\n" + rc.versus_markdown(data["versus"])
    return text, data


def _recompute_runs(model, threads, encodings, items, policies, spec, max_tokens, gap, out, as_json, ttft_tokens,
                    quick) -> dict:
    """Returns {encoding: (answers, ttft)}: one PromptCache per encoding, each item's full prefill computed once."""
    from pc_cpu import PromptCache
    from pc_cpu.benchmarks import recompute as rc

    with ExitStack() as stack:
        sinks = {mode: stack.enter_context(open(_path_for(out, mode, encodings), "a", encoding="utf-8"))
                 for mode in encodings} if out else None
        # n_ctx: the model's training context, at most 8192 (8192 on every packaged model).
        caches = {mode: stack.enter_context(PromptCache(model, threads=threads, store=False, encoding=mode))
                  for mode in encodings}
        answers: dict[str, list] = {mode: [] for mode in encodings}
        with _bar(len(items), "recompute", as_json) as progress:
            for mode, answer in rc.run_encodings(caches, items, policies, task=spec, max_tokens=max_tokens,
                                                 gap=gap, outs=sinks, progress=progress):
                answers[mode].append(answer)
        return {mode: (answers[mode], rc.ttft_by_policy(cache, policies, target_tokens=ttft_tokens,
                                                        repeats=1 if quick else 3) if ttft_tokens else None)
                for mode, cache in caches.items()}


def _path_for(path, mode: str, encodings) -> str | None:
    """Returns the file for one encoding's output: the path itself when one encoding runs, else a_<mode>.ext."""
    if path is None or len(encodings) == 1:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}_{mode}{p.suffix}"))


@bench.group()
def documents() -> None:
    """Documents: the RAG workload, relocation, and accuracy against the full prefill (see each command)."""


@documents.command()
@model_option
@threads_option
@quick_option
@json_option
@click.option("--docs", type=click.IntRange(6), default=None,
              help="Documents in the library (default 500, about 7x the 8K context on SmolLM2; quick 60).")
@click.option("--prompts", type=click.IntRange(1), default=None,
              help="Questions over 5 documents at the full library (default 100, quick 10).")
@click.option("--no-peers", is_flag=True, help="Skip llama-cpp-python's Llama on the same prompts.")
@click.option("--recompute", "policies", multiple=True,
              help="Also ask every prompt with this recompute policy (repeatable; e.g. relevant:1, 10%), "
                   "paired with the full prefill.")
def rag(model, threads, quick, as_json, docs, prompts, no_peers, policies):
    """The RAG workload: TTFT, adding one document, library growth, bytes.

    Example: pc-cpu bench documents rag --docs 500 --prompts 100 --threads 2
    """
    from pc_cpu.benchmarks import documents as dc

    _check_document_policies(policies)
    job = dc.DocumentsBench(model=model, threads=threads, docs=docs or (60 if quick else 500),
                            prompts=prompts or (10 if quick else 100), peers=not no_peers, recompute=tuple(policies))
    result = dc.rag(job)
    _emit(result, dc.markdown("rag", result), as_json)


@documents.command()
@model_option
@threads_option
@quick_option
@json_option
@click.option("--n", "count", type=click.IntRange(1), default=None,
              help="Questions answered three ways, paired (default 200, quick 10).")
@click.option("--timing-only", is_flag=True, help="Speed only (run on a quiet machine).")
def relocation(model, threads, quick, as_json, count, timing_only):
    """Relocation: the speed of moving documents' cells, and its cost to answers.

    Example: pc-cpu bench documents relocation --n 200 --threads 2
    """
    from pc_cpu.benchmarks import documents as dc

    job = dc.DocumentsBench(model=model, threads=threads, n=count or (10 if quick else 200), timing_only=timing_only)
    result = dc.relocation(job)
    _emit(result, dc.markdown("relocation", result), as_json)


@documents.command("accuracy")
@click.option("--model", "models", multiple=True, metavar="NAME|PATH",
              help="A model name (see `pc-cpu models`) or a GGUF file; repeatable (default: $PC_CPU_MODEL, "
                   "else smollm2-135m).")
@threads_option
@click.option("--policy", "policies", multiple=True,
              help="A recompute policy to ask with the cache (repeatable; default 0): 0, relevant:1, tail:32, 10%...")
@click.option("--order", "orders", multiple=True, type=click.Choice(ORDERS),
              help="Where the document most like the question goes (repeatable; default given). Each order "
                   "gets its own full prefill.")
@click.option("--task", type=click.Choice(["nq", "kv"]), default="nq", show_default=True,
              help="NaturalQuestions passages, or key-value retrieval (one pair per document).")
@click.option("--split", type=click.Choice(["odd", "even", "all"]), default="odd", show_default=True,
              help="Questions whose line in the data file is odd (report) or even (tune).")
@click.option("--n", "count", type=click.IntRange(1), default=300, show_default=True, help="Items per model.")
@click.option("--docs", type=click.IntRange(2, 20), default=5, show_default=True, help="Documents per question.")
@click.option("--per-document", type=click.IntRange(1, 20), default=1, show_default=True,
              help="NQ passages or KV pairs in each document, one per line (6: NQ prompts of ~4K tokens).")
@click.option("--max-tokens", type=click.IntRange(1), default=None, help="Answer length (default 24 NQ, 128 KV).")
@click.option("--encoding", "encodings", multiple=True, type=click.Choice(["library", "preamble"]),
              help="What each document is encoded after besides the system message (ask(encoding=...); "
                   "repeatable; default library).")
@click.option("--library", type=click.Choice(["shuffled", "item"]), default="shuffled", show_default=True,
              help="shuffled: every item's documents are added first, in a random order (a question is then a "
                   "new combination); item: each item's documents are added just before it, in its order.")
@click.option("--block", type=click.IntRange(0), default=0, show_default=True,
              help="shuffled: add the documents of this many items at a time, then answer them (0: all items "
                   "first). A stopped run then resumes without adding the answered items' documents again.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="JSON-lines file of every answer; a run with the same file resumes where it stopped.")
@click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None,
              help="Keep the documents' encodings in this directory (default: a temporary one), so that a later "
                   "run over the same items, e.g. a new policy added to a finished --out file, restores them "
                   "instead of computing them.")
@click.option("--summary", "summaries", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Summarize these answer files instead of running (repeatable).")
@click.option("--results", type=click.Path(dir_okay=False), default=None,
              help="Also write the table, the command and a plot into this Markdown file (e.g. bench/RESULTS.md), "
                   "replacing this bench's section.")
@quick_option
@json_option
def documents_accuracy(models, threads, policies, orders, task, split, count, docs, per_document, max_tokens,
                       encodings, library, block, out, store_dir, summaries, results, quick, as_json):
    """Documents against the full prefill: `ask` variants paired with use_cache=False, accuracy and TTFT.

    Example: pc-cpu bench documents accuracy --model qwen2.5-coder-0.5b --policy 0 --policy relevant:1 --n 300
    """
    import tempfile

    from pc_cpu.benchmarks import document_accuracy as da

    _check_document_policies(policies)
    if summaries:
        records = [r for path in summaries for r in da.read_records(Path(path))]
    else:
        job = da.AccuracyJob(models=tuple(models) or (None,), policies=tuple(policies) or ("0",),
                             orders=tuple(orders) or ("given",), task=task, split=split,
                             n=10 if quick else count, docs=docs, threads=threads, max_tokens=max_tokens or 0,
                             encodings=tuple(encodings) or ("library",), library=library,
                             per_document=per_document, block=block, store=store_dir)
        with ExitStack() as stack:
            path = Path(out) if out else Path(stack.enter_context(tempfile.TemporaryDirectory())) / "answers.jsonl"
            with _bar(len(job.models) * job.n, "documents accuracy", as_json) as progress:
                records = da.run(job, path, progress=progress)
    rows = da.summarize(records)
    table = da.markdown(rows)
    if results:
        results_path = Path(results)
        image = da.plot(rows, results_path.with_name("documents_accuracy.png"))
        da.write_results(results_path, table, "pc-cpu " + " ".join(sys.argv[1:]), image)
    _emit([row.__dict__ for row in rows], table, as_json)


def _check_document_policies(policies) -> None:
    """Raises (before any model loads) for a recompute policy documents cannot use, naming the ones they can."""
    from pc_cpu.pml.document_layout import check_document_policy
    from pc_cpu.pml.recompute import parse_policy

    from pc_cpu.benchmarks.document_accuracy import REPEATED

    for policy in policies:
        if policy not in REPEATED:  # a question asked again (document_accuracy): not a recompute policy
            check_document_policy(parse_policy(policy))


@bench.command()
@click.argument("records", type=click.Path(exists=True, dir_okay=False), nargs=-1, required=True)
def summary(records):
    """Tables from accuracy JSON-lines files (complete items only).

    Example: pc-cpu bench summary /tmp/nq5.jsonl
    """
    from pc_cpu.benchmarks.accuracy import read_records
    from pc_cpu.benchmarks.report import accuracy_markdown
    from pc_cpu.benchmarks.summary import complete_items, summarize

    data = complete_items([r for path in records for r in read_records(Path(path))])
    click.echo(accuracy_markdown(summarize(data), data))

