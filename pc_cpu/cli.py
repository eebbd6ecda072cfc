"""The pc-cpu command line: thin commands over the library; errors become one line and exit code 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from pc_cpu.errors import PromptCacheError

EXIT_USAGE = 2


def _read_source(value: str, what: str) -> str:
    """Returns PML from '-' (stdin), a file path, or the argument itself when it starts with '<'."""
    if value == "-":
        return sys.stdin.read()
    if value.lstrip().startswith("<"):
        return value
    path = Path(value)
    if not path.is_file():
        raise PromptCacheError(f"{what} {value!r} is neither a file nor PML text (PML starts with '<')")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptCacheError(f"cannot read {what} file {value!r}: {exc}") from None


def _open_cache(model, n_ctx, threads, encoding, verbose):
    from pc_cpu.cache import PromptCache  # imported late: loading llama.cpp is not needed for --help

    return PromptCache(model, n_ctx=n_ctx, threads=threads, encoding=encoding, verbose=verbose)


model_option = click.option("--model", type=click.Path(dir_okay=False), default=None,
                            help="GGUF model file (default: $PC_CPU_MODEL, else the installed SmolLM2-135M).")
threads_option = click.option("--threads", type=click.IntRange(1, 512), default=None, help="CPU threads (default: all).")
ctx_option = click.option("--n-ctx", type=click.IntRange(64, 1 << 20), default=None,
                          help="KV cells for schemas and prompts (default: model's, at most 8192).")
verbose_option = click.option("--verbose", is_flag=True, help="Show llama.cpp's own log.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Prompt Cache on llama.cpp: reuse encoded prompt modules for fast time-to-first-token on CPUs."""


@cli.command()
@click.argument("prompt")
@click.option("--schema", "schemas", multiple=True, required=True, help="Schema PML file (repeatable).")
@model_option
@click.option("--max-tokens", type=click.IntRange(1, 1 << 20), default=256, show_default=True)
@click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-k", type=click.IntRange(0), default=0, help="0: off.")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, help="1: off.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--stop", multiple=True, help="Stop when this text appears (repeatable).")
@click.option("--no-cache", is_flag=True, help="Baseline: full prefill of the same tokens.")
@click.option("--encoding", type=click.Choice(["preamble", "independent"]), default="preamble", show_default=True)
@ctx_option
@threads_option
@click.option("--json", "as_json", is_flag=True, help="Print the Result as one JSON object.")
@verbose_option
def run(prompt, schemas, model, max_tokens, temperature, top_k, top_p, seed, stop, no_cache, encoding, n_ctx,
        threads, as_json, verbose):
    """Answer PROMPT (a PML file, PML text, or - for stdin) using the modules of --schema files.

    Example: pc-cpu run '<prompt schema="demo"><harbor/><user>Who kept the light?</user></prompt>' --schema demo.pml
    """
    prompt_pml = _read_source(prompt, "prompt")
    with _open_cache(model, n_ctx, threads, encoding, verbose) as pc:
        for schema in schemas:
            pc.load_schema(_read_source(schema, "schema"))
        stream = pc.stream(prompt_pml, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                           seed=seed, stop=stop, use_cache=not no_cache)
        for piece in stream:
            if not as_json:
                click.echo(piece, nl=False)
        result = stream.result
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        click.echo()
        click.echo(f"[ttft {result.ttft_ms:.0f} ms | {result.cached_tokens} cached + {result.uncached_tokens} "
                   f"computed prompt tokens | {len(result.token_ids)} tokens in {result.total_ms:.0f} ms]", err=True)


@cli.command()
@click.argument("schema")
@model_option
@click.option("--json", "as_json", is_flag=True, help="Print {schema, length, nodes} as JSON.")
@verbose_option
def inspect(schema, model, as_json, verbose):
    """Show the layout of SCHEMA (a PML file, PML text, or -): each node's positions.

    Example: pc-cpu inspect trip.pml --json
    """
    from pc_cpu.inspect import kv_bytes_per_token, layout_json, layout_table

    with _open_cache(model, 512, 1, "preamble", verbose) as pc:
        layout = pc.inspect_schema(_read_source(schema, "schema"))
        info = pc.model.info
    bytes_per_token = kv_bytes_per_token(info.n_layer, info.n_head_kv, info.n_embd_head)
    click.echo(json.dumps(layout_json(layout)) if as_json else layout_table(layout, bytes_per_token))


@cli.command()
@model_option
@threads_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per question.")
@verbose_option
def demo(model, threads, as_json, verbose):
    """Ask the built-in demo questions with and without the cache; show answers and TTFTs.

    Example: pc-cpu demo --threads 2
    """
    from pc_cpu.demo import QUESTIONS, demo_prompt, demo_schema

    with _open_cache(model, None, threads, "preamble", verbose) as pc:
        pc.load_schema(demo_schema())
        for doc, question in QUESTIONS:
            prompt = demo_prompt(doc, question)
            cached = pc.generate(prompt, max_tokens=48)
            baseline = pc.generate(prompt, max_tokens=48, use_cache=False)
            if as_json:
                click.echo(json.dumps({"question": question, "cached": cached.to_dict(),
                                       "baseline": baseline.to_dict()}))
                continue
            click.echo(f"Q: {question}  [{doc}: {cached.prompt_tokens} prompt tokens, {cached.cached_tokens} cached]")
            click.echo(f"  cached    ttft {cached.ttft_ms:7.0f} ms : {cached.text.strip()}")
            click.echo(f"  baseline  ttft {baseline.ttft_ms:7.0f} ms : {baseline.text.strip()}")
            click.echo(f"  speedup   {baseline.ttft_ms / cached.ttft_ms:.1f}x")


def main(argv: list[str] | None = None) -> None:
    """Runs the CLI; a PromptCacheError becomes 'error: ...' on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="pc-cpu", standalone_mode=False)
    except PromptCacheError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
