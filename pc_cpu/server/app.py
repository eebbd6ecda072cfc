"""Gives the FastAPI app of `pc-cpu serve`: OpenAI-style completions over one PromptCache.

Routes: POST /v1/completions (a PML prompt), POST /v1/chat/completions (a conversation, its
history reused between turns; or messages importing a schema's modules; or a question over `documents`), POST|GET /v1/schemas, DELETE /v1/schemas/{name},
POST|GET /v1/documents, DELETE /v1/documents/{id or name}, GET /v1/models, GET /v1/stats, GET /health.
`stream: true` answers with server-sent events (`data: {chunk}`, then `data: [DONE]`).

Errors are JSON `{"error": {"message", "type"}}`: a PromptCacheError is 400 with its class name as
type (ContextOverflowError included); a body that does not validate is 422 (text UTF-8 cannot
encode and sampling options out of range included); an unknown schema name in DELETE is 404, and
so is an unknown document anywhere (UnknownDocumentError); a missing or wrong API key is 401, a
body over the limit 413, and a new schema beyond `max_schemas` 409 (pc_cpu.server.guard). A store
that cannot be written is 507 and anything unexpected 500, with a request id and no detail: the
server log has it (pc_cpu.server.http_errors, which also keeps filesystem paths out of messages).
The PromptCache is called only from worker threads (see feed.py), never on the event loop; the app
owns those threads and cancels them when it shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from pc_cpu.errors import PromptCacheError, UnknownSchemaError
from pc_cpu.pml.layout import ROOT
from pc_cpu.pml.schema import parse_schema
from pc_cpu.server import openai_api as api
from pc_cpu.server.chat import messages_to_pml, naming_messages
from pc_cpu.server.feed import Done, Failed, Feed, Text
from pc_cpu.server.guard import BearerAuth, BodyLimit, check_api_key
from pc_cpu.server.http_errors import http_error, validation_message
from pc_cpu.server.json_body import JSONBodyRoute
from pc_cpu.server.process import process_stats

log = logging.getLogger(__name__)

MAX_WORKERS = 64  # streams generating or waiting for the context at once; more queue for a worker
DEFAULT_MAX_BODY_BYTES = 1 << 20  # a 1 MiB prompt or schema is ~250k tokens, more than any context holds
DEFAULT_MAX_SCHEMAS = 32  # each holds KV cells, RAM and disk; a stranger's loop must not fill them
DISCONNECT_POLL_S = 0.5  # how often a request waiting for its next piece checks its client


def create_app(cache, *, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               max_schemas: int = DEFAULT_MAX_SCHEMAS) -> FastAPI:
    """Returns the app serving `cache` (a PromptCache). The caller keeps ownership of the cache.

    Args:
        cache: a PromptCache; its schemas already loaded are served as they are.
        api_key: when given, every route but /health needs `Authorization: Bearer <api_key>`; spaces
            around it are stripped (pc_cpu.server.guard.check_api_key).
        max_body_bytes: larger request bodies are refused (413).
        max_schemas: schemas the server holds at most; POST /v1/schemas of another is refused (409).

    Raises:
        ConfigError: an api_key no client could send (empty, or with whitespace, control or non-ASCII characters).
    """
    if api_key is not None:
        api_key = check_api_key(api_key)  # here, not in BearerAuth: middleware is built on the first request
    feeds = Feeds(ThreadPoolExecutor(max_workers=MAX_WORKERS, thread_name_prefix="pc-cpu-stream"))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        feeds.close()  # every stream closed before the caller may close the cache

    app = FastAPI(title="pc_cpu", summary="Prompt Cache on llama.cpp, OpenAI-style", lifespan=lifespan)
    app.router.route_class = JSONBodyRoute  # before any route: refusals of unreadable bodies name the problem
    app.state.cache = cache
    app.state.feeds = feeds
    _add_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    if api_key is not None:
        app.add_middleware(BearerAuth, api_key=api_key)  # added last, so it runs first: no body read for strangers
    _add_status_routes(app, cache, feeds)
    _add_schema_routes(app, cache, max_schemas)
    _add_document_routes(app, cache)
    _add_completion_routes(app, cache, feeds)
    return app


class Feeds:
    """The answers being streamed, each from a worker thread of one pool; closing cancels them all."""

    def __init__(self, executor: ThreadPoolExecutor):
        self._executor = executor
        self._feeds: set[Feed] = set()

    def open(self, open_stream: Callable[[], object]) -> Feed:
        """Returns a new feed of the stream `open_stream()` opens in a worker thread."""
        self._feeds.difference_update([f for f in self._feeds if f.finished.is_set()])
        feed = Feed(open_stream, self._executor)
        self._feeds.add(feed)
        return feed

    @property
    def active(self) -> int:
        """Returns the streams not yet closed by their worker."""
        return sum(not feed.finished.is_set() for feed in self._feeds)

    def close(self) -> None:
        """Cancels every stream, then waits for the workers to finish."""
        for feed in list(self._feeds):
            feed.cancel()
        self._executor.shutdown(wait=True)


def _add_status_routes(app: FastAPI, cache, feeds: Feeds) -> None:
    model_name = cache.model.path.name
    memory = cache.memory()  # fixed once the contexts are open

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": model_name, "schemas": cache.schemas.names, "active_streams": feeds.active}

    @app.get("/v1/stats")
    def stats() -> dict:
        # What a host running for days watches: the cache's tiers, indexes and queues, this process's memory.
        return {"object": "stats", **cache.stats().to_dict(), "active_streams": feeds.active,
                "memory": memory.to_dict(), "process": process_stats()}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "pc_cpu"}]}


def _add_schema_routes(app: FastAPI, cache, max_schemas: int) -> None:
    adding_schema = asyncio.Lock()  # the limit is checked and the schema loaded as one step

    @app.get("/v1/schemas")
    def list_schemas() -> dict:
        return {"object": "list", "data": [_schema_json(cache, name) for name in cache.schemas.names]}

    @app.post("/v1/schemas", status_code=201)
    async def add_schema(body: api.SchemaRequest, request: Request):
        async with adding_schema:
            name = parse_schema(body.pml).name
            if name not in cache.schemas.names and len(cache.schemas.names) >= max_schemas:
                return JSONResponse(api.error_json(
                    f"this server already holds {len(cache.schemas.names)} schemas, its limit; delete one "
                    "(DELETE /v1/schemas/{name}) or restart the server with a higher --max-schemas",
                    "LimitExceeded"), status_code=409)
            events = []  # a few per module: one per decode batch and one when it is done
            cancel = threading.Event()  # set if the client leaves: the load stops after its current batch
            schema = await until_disconnected(
                request, lambda: cache.load_schema(body.pml, progress=events.append, cancel=cancel), cancel)
        log.info("loaded %s", events[-1].summary())  # load_schema always reports the finished state
        return _schema_json(cache, schema.name)

    @app.delete("/v1/schemas/{name}")
    async def delete_schema(name: str):
        try:
            await run_in_threadpool(cache.unload_schema, name)
        except UnknownSchemaError as exc:
            return JSONResponse(api.error_json(str(exc), type(exc).__name__), status_code=404)
        return {"name": name, "object": "schema", "deleted": True}


def _add_document_routes(app: FastAPI, cache) -> None:
    def document_json(doc) -> dict:  # in a worker thread: tokenizing a long document takes a while
        return api.document_json(doc, len(cache.documents.tokens(doc.text)))

    @app.get("/v1/documents")
    async def list_documents() -> dict:
        def listing():
            return [document_json(doc) for doc in cache.list_documents()]

        return {"object": "list", "data": await run_in_threadpool(listing)}

    @app.post("/v1/documents")
    async def add_document(body: api.DocumentRequest, request: Request):
        # Stripped, as chat's system messages are (ChatRequest.question): the same text, the same preamble.
        system = (body.system or "").strip() or None
        cancel = threading.Event()

        def add():  # encodes the document unless a tier holds it already: slow
            doc_id = cache.add_document(body.text, name=body.name, system=system, cancel=cancel)
            return document_json(cache.documents.library.resolve(doc_id))

        return await until_disconnected(request, add, cancel)

    @app.delete("/v1/documents/{id_or_name:path}")  # :path: a name may hold a slash
    async def delete_document(id_or_name: str):
        # UnknownDocumentError: 404 (pc_cpu.server.http_errors)
        doc = await run_in_threadpool(cache.remove_document, id_or_name)
        return {"id": doc.id, "object": "document", "names": list(doc.names), "deleted": True}


def _add_completion_routes(app: FastAPI, cache, feeds: Feeds) -> None:
    model_name = cache.model.path.name

    @app.post("/v1/completions")
    async def completions(body: api.CompletionRequest, request: Request):
        id_ = api.new_id("cmpl")
        prompt = body.prompt_pml()
        if body.n > 1:
            results = await _choices(feeds, request, lambda options: cache.stream(prompt, options),
                                     body.choice_options())
            return results if isinstance(results, JSONResponse) else api.completion_json(id_, model_name, *results)
        options = body.options()
        feed = feeds.open(lambda: cache.stream(prompt, options))
        sent = [0]  # characters streamed so far: where the next piece's tokens start (text_offset)

        def chunk(text, result=None, logprobs=()):
            piece = api.completion_chunk(id_, model_name, text, result, logprobs, offset=sent[0])
            sent[0] += len(text)
            return piece

        return await _answer(feed, request, body.stream,
                             whole=lambda result: api.completion_json(id_, model_name, result), chunk=chunk,
                             usage=(lambda result: api.usage_chunk(id_, model_name, result, chat=False))
                             if body.include_usage() else None)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: api.ChatRequest, request: Request):
        if body.documents is not None and not body.is_question():
            messages, documents = body.conversation(), list(body.documents)

            def answer(options):
                return cache.stream_chat(messages, options, documents=documents, after_edit=body.after_edit,
                                         **body.tool_arguments())
        elif body.documents is not None:
            question, system = body.question()
            documents = list(body.documents)

            def answer(options):
                return cache.stream_ask(question, options, documents=documents, system=system, setting=body.setting,
                                        order=body.order, prefix=body.prefix, encoding=body.encoding)
        elif body.schema_name is None:
            messages = body.conversation()

            def answer(options):
                return cache.stream_chat(messages, options, after_edit=body.after_edit, **body.tool_arguments())
        else:
            layout = cache.schemas.layout(body.schema_name)  # UnknownSchemaError names the loaded ones
            names = [name for name in layout.modules if name != ROOT] + list(layout.scaffolds)
            prompt = messages_to_pml(body.schema_name, [m.message(i) for i, m in enumerate(body.messages)],
                                     import_names=names)

            def answer(options):
                return naming_messages(lambda: cache.stream(prompt, options))
        id_ = api.new_id("chatcmpl")
        if body.n > 1:
            results = await _choices(feeds, request, answer, body.choice_options())
            return results if isinstance(results, JSONResponse) else api.chat_json(id_, model_name, *results)

        def chunk(text, result=None, logprobs=()):
            return api.chat_chunk(id_, model_name, {"content": text} if text else {}, result, logprobs)

        options = body.options()
        return await _answer(feeds.open(lambda: answer(options)), request, body.stream,
                             whole=lambda result: api.chat_json(id_, model_name, result), chunk=chunk,
                             first=api.chat_chunk(id_, model_name, {"role": "assistant", "content": ""}),
                             calls=lambda result: api.tool_call_chunks(id_, model_name, result),
                             usage=(lambda result: api.usage_chunk(id_, model_name, result, chat=True))
                             if body.include_usage() else None)


async def _choices(feeds: Feeds, request: Request, answer: Callable, options: list):
    """Returns the Results of one prompt answered once per options (n > 1), one after another; or the 499 of a client gone.

    Each answer after the first finds the prompt's cells in the stream the one before left (all but
    its last decode call, which is computed again so that every choice answers as a full prefill would).
    """
    results = []
    for choice in options:
        result = await _answer(feeds.open(lambda choice=choice: answer(choice)), request, False, whole=lambda r: r,
                               chunk=None)
        if isinstance(result, JSONResponse):
            return result
        results.append(result)
    return results


async def _answer(feed: Feed, request: Request, stream: bool, *, whole: Callable, chunk: Callable,
                  first: dict | None = None, usage: Callable | None = None, calls: Callable | None = None):
    """Returns the JSON answer, or the SSE response once the first piece exists.

    Waiting for the first piece before answering lets an error in the prompt (bad PML, overflow)
    still be a 400 rather than an error inside a 200 event stream.
    """
    try:
        event = await _next_event(feed, request)
        while not stream and isinstance(event, Text):
            event = await _next_event(feed, request)
    except BaseException:
        feed.cancel()  # the request was cancelled while waiting: free the sequence
        raise
    if event is None:
        feed.cancel()
        return JSONResponse(api.error_json("client disconnected", "ClientDisconnect"), status_code=499)
    if isinstance(event, Failed):
        raise event.error  # the worker has closed the stream already
    if not stream:
        return whole(event.result)
    events = _sse(feed, request, event, chunk, first, usage, calls)
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                             background=BackgroundTask(feed.cancel))


async def _sse(feed: Feed, request: Request, event, chunk: Callable, first: dict | None,
               usage: Callable | None = None, calls: Callable | None = None) -> AsyncIterator[str]:
    """Yields `data: {chunk}` events from `event` on, then `data: [DONE]`; closes the feed however it ends.

    `usage`: the usage-only chunk's maker, sent after the last one when the client asked (include_usage).
    `calls`: the maker of the tool calls' chunks, sent before the finishing one.
    """
    try:
        if first is not None:
            yield _data(first)
        while isinstance(event, Text):
            yield _data(chunk(event.text, logprobs=event.logprobs))
            event = await _next_event(feed, request)
        if isinstance(event, Done):
            for call in calls(event.result) if calls is not None else ():
                yield _data(call)
            yield _data(chunk("", event.result))
            if usage is not None:
                yield _data(usage(event.result))
        elif isinstance(event, Failed):
            yield _data(http_error(event.error, _where(request)).json())
        else:
            return  # the client left: nobody to send [DONE] to
        yield "data: [DONE]\n\n"
    finally:
        feed.cancel()


async def until_disconnected(request: Request, work: Callable[[], object], cancel: threading.Event):
    """Returns what `work` returns, run in a worker thread; sets `cancel` if the client leaves meanwhile.

    An add that nobody waits for any more stops after its current batch (PromptCache.add_document),
    so a client that gives up does not leave minutes of encoding behind it.
    """
    task = asyncio.ensure_future(run_in_threadpool(work))
    while not task.done():
        await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
        if not task.done() and not cancel.is_set() and await request.is_disconnected():
            cancel.set()
    return task.result()


async def _next_event(feed: Feed, request: Request):
    """Returns the feed's next event, or None once the client has disconnected."""
    while True:
        event = await feed.next(timeout=DISCONNECT_POLL_S)
        if await request.is_disconnected():
            return None
        if event is not None:
            return event


def _data(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _schema_json(cache, name: str) -> dict:
    layout = cache.schemas.layout(name)
    return {"name": name, "object": "schema", "length": layout.length,
            "modules": [module for module in layout.modules if module != ROOT],
            "scaffolds": list(layout.scaffolds)}


def _where(request: Request) -> str:
    return f"{request.method} {request.url.path}"


def _add_error_handlers(app: FastAPI) -> None:
    # PromptCacheError and OSError have handlers of their own although Exception's would do: Starlette
    # re-raises what reaches the Exception handler, and uvicorn then logs it as a crash.
    @app.exception_handler(PromptCacheError)
    @app.exception_handler(OSError)
    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception):
        return http_error(exc, _where(request)).response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        message = validation_message(exc.errors(), request.headers.get("content-type"))
        return JSONResponse(api.error_json(message, "RequestValidationError"), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_exception(request: Request, exc: StarletteHTTPException):
        return JSONResponse(api.error_json(str(exc.detail), "HTTPException"), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))
