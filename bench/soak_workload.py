"""Gives bench/soak.py's workload: invented texts, two client transports (openai, httpx) and the request mix.

A `Client` is one thread that sends the mix (conversations, questions over documents, PML
completions, document adds and removes, streams it hangs up on, hostile requests) through one
`Transport` until told to stop, and hands each request to a callback as a `RequestRecord`.
Nothing here starts a server or judges a run: bench/soak.py does both.
"""

from __future__ import annotations

import json
import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol
from urllib.parse import quote

import httpx
import openai

from pc_cpu.demo import DOCS as DEMO_DOCS

ROOT = Path(__file__).resolve().parents[1]
MODEL_FIELD = "soak"  # the server serves one model and ignores `model`; OpenAI's client requires one

# --- invented texts ----------------------------------------------------------------------------
# Invented places only, so answers can only come from the prompt; no data leaves the repository.

_SYLLABLES = ("ka", "ro", "vel", "mir", "tan", "os", "ber", "lin", "dra", "qu", "seth", "al", "vor", "ni",
              "pel", "gra", "um", "tor", "ish", "ban")
_FACTS = (
    "{place} lies on the {river} river, {n} kilometres from the coast.",
    "It was founded in {year} by {person}, a {trade} from {other}.",
    "The old {building} in {place} was rebuilt in {year2} after a {disaster}.",
    "About {pop} people live there; most of them work in {industry}.",
    "Every {month} the town holds the {festival} festival, when {custom}.",
    "The {building} has {k} {parts} and a bell cast in {year}.",
    "A {vehicle} leaves for {other} {k} times a day and takes {mins} minutes.",
    "{person} kept the town's records for {k} years and wrote {k2} volumes about the {river}.",
    "The local dish is {dish}, cooked with {ingredient} from the hills above {place}.",
    "In {year2} a flood reached the {building}; a mark on its wall still shows how high the water rose.",
)
_WORDS = {
    "trade": ("miller", "weaver", "ferryman", "clockmaker", "surveyor", "brewer"),
    "building": ("granary", "toll house", "chapel", "watermill", "customs hall", "lighthouse"),
    "disaster": ("fire", "storm", "landslide", "flood", "hard winter"),
    "industry": ("fishing", "the slate quarries", "orchards", "boat building", "wool"),
    "month": ("March", "May", "July", "September", "November"),
    "custom": ("lanterns are floated downstream", "the bakers race barrows", "every door is painted blue",
               "the choir sings from the bridge"),
    "parts": ("arches", "towers", "windows", "chimneys"),
    "vehicle": ("ferry", "bus", "narrow-gauge train", "cable car"),
    "dish": ("smoked eel", "barley cake", "plum dumplings", "river trout pie"),
    "ingredient": ("wild thyme", "juniper", "sorrel", "hazelnuts"),
}


def invented_name(rng: random.Random) -> str:
    """Returns a made-up proper name, e.g. 'Velmirtan'."""
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()


@dataclass(frozen=True)
class InventedDocument:
    """A document about one invented town, and questions its text answers."""

    place: str
    text: str
    questions: tuple[str, ...]


def invented_document(rng: random.Random, sentences: int) -> InventedDocument:
    """Returns a document of `sentences` sentences about one invented town."""
    place = invented_name(rng)
    facts = {"place": place, "river": invented_name(rng), "person": f"{invented_name(rng)} {invented_name(rng)}",
             "other": invented_name(rng), "festival": invented_name(rng)}
    lines = []
    for i in range(sentences):
        fill = {name: rng.choice(words) for name, words in _WORDS.items()}
        fill.update(facts, n=rng.randint(3, 90), year=rng.randint(1200, 1890), year2=rng.randint(1891, 2015),
                    pop=f"{rng.randint(1, 40)},{rng.randint(100, 999)}", k=rng.randint(2, 12),
                    k2=rng.randint(2, 30), mins=rng.randint(10, 95))
        lines.append(_FACTS[i % len(_FACTS)].format(**fill))
    questions = (f"Who founded {place}?", f"On which river does {place} lie?", "What is the local dish?",
                 f"How many people live in {place}?", "What happens at the festival?")
    return InventedDocument(place, " ".join(lines), questions)


def text_of_tokens(rng: random.Random, tokens: int, chars_per_token: float) -> str:
    """Returns invented prose of about `tokens` tokens, given the tokenizer's characters per token on such text."""
    parts, size, goal = [], 0, int(tokens * chars_per_token)
    while size < goal:
        doc = invented_document(rng, 10)
        parts.append(doc.text)
        size += len(doc.text) + 2
    return "\n\n".join(parts)[:goal]


DEMO_QUESTIONS = {
    "observatory": ("Who founded the observatory?", "How many clear nights per year did the staff measure?",
                    "How do visitors reach the observatory in summer?"),
    "harbor": ("Who kept the Calder Light?", "When was the Calder Light automated?",
               "How long does the ferry to Skerra take?"),
    "railway": ("How long is the Kessel Gorge viaduct?", "When was the line electrified?",
                "What do season tickets cost for residents?"),
}
GENERIC_QUESTIONS = ("What is this text about?", "Summarize it in one sentence.", "Name one place it mentions.")
OPENERS = ("Name a lighthouse keeper.", "Tell me a short story about a fox.", "What is a good name for a boat?",
           "Give me three tips for learning to sail.", "Write a haiku about a harbour.",
           "What should I pack for a week in the mountains?", "Explain what a tide is.",
           "Invent a town and describe it.", "What do cats like to eat?", "Suggest a name for a bakery.")
FOLLOW_UPS = ("And another one?", "Why?", "Make it shorter.", "Tell me more about that.", "Can you give an example?",
              "What would {name} think of it?", "Say it in a different way.", "How many are there?",
              "Is that true for {name} too?", "Thanks. One more question: what is {name} known for?")
SYSTEMS = (None, "You are a helpful assistant.", "Answer in one short sentence.")
TONES = ("plain", "warm", "formal", "brief", "calm")
UNKNOWN_DOCUMENT = "doc-ffffffffffffffff"  # never a real id: ids are hashes of text the soak never sends


# --- records -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    """What the fresh server needs to answer a request again: the route, the body, the documents' texts."""

    kind: str  # "chat", "docs_accurate" or "pml": answers pc_cpu promises do not depend on history
    path: str
    body: dict
    documents: dict[str, str] = field(default_factory=dict)  # name -> text, to add before replaying


@dataclass
class Outcome:
    """What one HTTP request got back, as a transport saw it."""

    status: Optional[int]  # None: no HTTP answer (connection error, timeout)
    text: Optional[str] = None  # the answer's text (what was read of it, when the client hung up)
    json: Optional[dict] = None  # the JSON body of a non-answer route, or of an error
    error: Optional[str] = None  # an error message: the server's, or the transport's
    ttft_client_ms: Optional[float] = None  # streamed: from sending to the first chunk with content
    latency_ms: float = 0.0
    usage: Optional[dict] = None  # the server's usage object (ttft_ms, cached_tokens, ...)
    tiers: Optional[dict] = None  # where each module's cells came from (encoded, context, ram, disk)
    hung_up: bool = False


@dataclass
class RequestRecord:
    """One request of the soak and how it went; `ok` says whether it got what the soak expected."""

    id: int
    client: str
    transport: str
    kind: str  # what the request was for (chat, docs_fast, doc_add, hangup, hostile:<what>, ...)
    path: str
    t_start_s: float  # since the server was ready
    t_end_s: float
    phase: str  # "setup", "long", "warmup" (clients, not judged) or "main"
    status: Optional[int]
    expected: str  # e.g. "200", "200|404", "4xx"
    ok: bool
    streamed: bool = False
    hung_up: bool = False
    error: Optional[str] = None
    text: Optional[str] = None
    ttft_client_ms: Optional[float] = None
    ttft_server_ms: Optional[float] = None
    latency_ms: float = 0.0
    prompt_tokens: Optional[int] = None
    cached_tokens: Optional[int] = None
    tiers: Optional[dict] = None
    not_replayed: Optional[str] = None  # why an answered request is not replayable
    replay: Optional[Replay] = None


def expectation_met(expected: str, outcome: Outcome) -> bool:
    """Returns whether `outcome` is what `expected` ("200", "200|404", "4xx") allows; a 5xx never is."""
    status = outcome.status
    if status is None or status >= 500:
        return False
    if expected == "4xx":
        return 400 <= status < 500
    return str(status) in expected.split("|") and (status != 200 or outcome.error is None)


# --- transports ----------------------------------------------------------------------------------


class Transport(Protocol):
    """One client's way to the server. Every method returns an Outcome and never raises for HTTP or network errors."""

    name: str

    def answer(self, path: str, body: dict, hang_up_after: Optional[int] = None) -> Outcome:
        """POSTs a chat or completion body; streamed when body["stream"]; closes after `hang_up_after` pieces."""

    def add_document(self, text: str, name: Optional[str]) -> Outcome: ...

    def remove_document(self, id_or_name: str) -> Outcome: ...

    def close(self) -> None: ...


def _took_chunk(path: str, chunk: dict, pieces: list[str], outcome: "Outcome", t0: float,
                hang_up_after: Optional[int]) -> bool:
    """Returns True when the client hangs up after this streamed chunk; keeps its piece, usage and tiers in `outcome`."""
    piece = _answer_piece(path, chunk)
    if piece:
        if outcome.ttft_client_ms is None:
            outcome.ttft_client_ms = _ms_since(t0)
        pieces.append(piece)
    outcome.usage = chunk.get("usage") or outcome.usage
    outcome.tiers = chunk.get("tiers") or outcome.tiers
    if hang_up_after is not None and len(pieces) >= hang_up_after:
        outcome.hung_up = True
        return True
    return False


def _answer_piece(path: str, chunk: dict) -> str:
    """Returns the text a streamed chunk carries ('' for the role chunk and the last one)."""
    choice = (chunk.get("choices") or [{}])[0]
    if path.endswith("/chat/completions"):
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def _answer_text(path: str, body: dict) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if path.endswith("/chat/completions") else choice["text"]


def _error_message(response_text: str) -> str:
    try:
        return json.loads(response_text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response_text[:300]


class HttpxTransport:
    """Plain HTTP: what a client without an SDK sends, and the only one that can send broken bodies."""

    name = "httpx"

    def __init__(self, base_url: str, timeout_s: float):
        self._http = httpx.Client(base_url=base_url, timeout=httpx.Timeout(timeout_s, connect=10.0))

    def answer(self, path: str, body: dict, hang_up_after: Optional[int] = None) -> Outcome:
        t0 = time.perf_counter()
        try:
            if body.get("stream"):
                return self._stream(path, body, hang_up_after, t0)
            response = self._http.post(path, json=body)
        except httpx.HTTPError as exc:
            return Outcome(None, error=f"{type(exc).__name__}: {exc}", latency_ms=_ms_since(t0))
        outcome = Outcome(response.status_code, latency_ms=_ms_since(t0))
        if response.status_code != 200:
            outcome.error = _error_message(response.text)
            return outcome
        payload = response.json()
        outcome.text, outcome.usage = _answer_text(path, payload), payload.get("usage")
        outcome.tiers = payload.get("tiers")
        return outcome

    def _stream(self, path: str, body: dict, hang_up_after: Optional[int], t0: float) -> Outcome:
        with self._http.stream("POST", path, json=body) as response:
            outcome = Outcome(response.status_code)
            if response.status_code != 200:
                outcome.error = _error_message(response.read().decode("utf-8", "replace"))
                outcome.latency_ms = _ms_since(t0)
                return outcome
            pieces: list[str] = []
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: "):])
                if "error" in chunk:  # failed after the first piece: the server says so inside the 200 stream
                    outcome.error = chunk["error"].get("message", str(chunk["error"]))
                    break
                if _took_chunk(path, chunk, pieces, outcome, t0, hang_up_after):
                    break  # leaving the `with` closes the connection mid-answer
        outcome.text, outcome.latency_ms = "".join(pieces), _ms_since(t0)
        return outcome

    def add_document(self, text: str, name: Optional[str]) -> Outcome:
        return self.send("POST", "/v1/documents", json_body={"text": text, **({"name": name} if name else {})})

    def remove_document(self, id_or_name: str) -> Outcome:
        return self.send("DELETE", f"/v1/documents/{quote(id_or_name, safe='')}")

    def send(self, method: str, path: str, *, json_body=None, content: Optional[bytes] = None) -> Outcome:
        """Returns the Outcome of any request; `content` is sent as it is, with a JSON content type."""
        t0 = time.perf_counter()
        headers = {"Content-Type": "application/json"} if content is not None else None
        try:
            response = self._http.request(method, path, json=json_body, content=content, headers=headers)
        except httpx.HTTPError as exc:
            return Outcome(None, error=f"{type(exc).__name__}: {exc}", latency_ms=_ms_since(t0))
        outcome = Outcome(response.status_code, latency_ms=_ms_since(t0))
        try:
            outcome.json = response.json()
        except ValueError:
            outcome.error = response.text[:300]
        if response.status_code != 200:
            outcome.error = _error_message(response.text)
        return outcome

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "HttpxTransport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_OPENAI_FIELDS = {"/v1/chat/completions": ("messages", "max_tokens", "temperature", "stream"),
                  "/v1/completions": ("prompt", "max_tokens", "temperature", "stream")}


class OpenAITransport:
    """The `openai` Python client, retries off: a retried 5xx or dropped connection would hide a failure."""

    name = "openai"

    def __init__(self, base_url: str, timeout_s: float):
        # A plain number: this openai build wraps its own httpx fork, which refuses httpx.Timeout objects.
        self._client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=timeout_s)

    def answer(self, path: str, body: dict, hang_up_after: Optional[int] = None) -> Outcome:
        standard = {key: body[key] for key in _OPENAI_FIELDS[path] if key in body}
        extra = {key: value for key, value in body.items() if key not in standard}
        create = (self._client.chat.completions.create if path.endswith("/chat/completions")
                  else self._client.completions.create)
        t0 = time.perf_counter()
        outcome = Outcome(200)
        try:
            answer = create(model=MODEL_FIELD, extra_body=extra or None, **standard)
            if not body.get("stream"):
                payload = answer.model_dump()
                outcome.text, outcome.usage = _answer_text(path, payload), payload.get("usage")
                outcome.tiers = payload.get("tiers")
            else:
                self._read_stream(path, answer, hang_up_after, outcome, t0)
        except openai.APIStatusError as exc:
            outcome.status, outcome.error = exc.status_code, _error_message(exc.response.text)
        except openai.APIConnectionError as exc:  # timeouts included
            outcome.status, outcome.error = None, f"{type(exc).__name__}: {exc}"
        except openai.APIError as exc:  # an error event inside a 200 stream
            outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.latency_ms = _ms_since(t0)
        return outcome

    @staticmethod
    def _read_stream(path: str, stream, hang_up_after: Optional[int], outcome: Outcome, t0: float) -> None:
        pieces: list[str] = []
        try:
            for chunk in stream:
                if _took_chunk(path, chunk.model_dump(), pieces, outcome, t0, hang_up_after):
                    break
        finally:
            stream.close()  # mid-answer when hanging up: the server sees the connection go
            outcome.text = "".join(pieces)

    def add_document(self, text: str, name: Optional[str]) -> Outcome:
        return self._call(lambda: self._client.post("/documents", cast_to=object,
                                                    body={"text": text, **({"name": name} if name else {})}))

    def remove_document(self, id_or_name: str) -> Outcome:
        return self._call(lambda: self._client.delete(f"/documents/{quote(id_or_name, safe='')}", cast_to=object))

    def post_json(self, path: str, body: dict) -> Outcome:
        """Returns the Outcome of POSTing `body` to a route of /v1 (e.g. "/schemas")."""
        return self._call(lambda: self._client.post(path, cast_to=object, body=body))

    @staticmethod
    def _call(send: Callable[[], object]) -> Outcome:
        t0 = time.perf_counter()
        try:
            payload = send()
        except openai.APIStatusError as exc:
            return Outcome(exc.status_code, error=_error_message(exc.response.text), latency_ms=_ms_since(t0))
        except openai.APIConnectionError as exc:
            return Outcome(None, error=f"{type(exc).__name__}: {exc}", latency_ms=_ms_since(t0))
        return Outcome(200, json=payload if isinstance(payload, dict) else None, latency_ms=_ms_since(t0))

    def close(self) -> None:
        self._client.close()


def _ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


# --- the documents the clients share -------------------------------------------------------------


class DocumentPool:
    """The documents of the soak: pinned ones (added once, never removed) and churned ones (added and removed).

    Thread-safe. `present` is what the clients believe the library holds of the churned ones;
    another client's remove can make it stale, which is why requests over churned documents
    accept a 404.
    """

    def __init__(self, pinned: dict[str, str], churned: dict[str, str], combos: list[tuple[str, ...]],
                 questions: dict[str, tuple[str, ...]]):
        self.pinned = pinned  # name -> text
        self.churned = churned
        self.combos = combos  # documents asked about together (pinned names), so questions repeat combinations
        self.questions = questions  # name -> questions its text answers
        self.ids: dict[str, str] = {}  # name -> id, learnt from the server's answers
        self._present: set[str] = set()
        self._lock = threading.Lock()

    def text(self, name: str) -> str:
        return self.pinned.get(name) or self.churned[name]

    def learn(self, name: str, doc_id: str, present: bool = True) -> None:
        with self._lock:
            self.ids[name] = doc_id
            if name in self.churned:
                (self._present.add if present else self._present.discard)(name)

    def forget(self, name: str) -> None:
        with self._lock:
            self._present.discard(name)

    def present_churned(self) -> list[str]:
        with self._lock:
            return sorted(self._present)


# --- the clients ---------------------------------------------------------------------------------


@dataclass
class Conversation:
    """One user's conversation as a client keeps it: the messages so far, oldest first."""

    messages: list[dict]
    after_edit: str = "recompute"  # "reuse" once the user's client opted in (then never replayed)
    documents: Optional[list[str]] = None  # a conversation over documents (never replayed: history-dependent)
    turns_left: int = 4


# Relative weights of a client's actions; hostile requests are rarer, as on a real server.
ACTIONS = {"chat": 30, "docs_question": 18, "docs_conversation": 6, "pml": 14, "doc_add": 8, "doc_remove": 4,
           "doc_too_long": 1, "hangup": 6, "hostile": 3}


@dataclass(frozen=True)
class Lulls:
    """Pauses every client together for the last `seconds` of every `every_s`: the idle time a real server gets.

    Without them four clients sending back to back leave the server no idle moment, and the work
    it defers to one (conversation repairs, which store tips; exact prefixes) never runs.
    """

    start: float  # time.monotonic() when the clients started
    every_s: float
    seconds: float  # 0: no lulls

    def wait_out(self, stop: threading.Event) -> None:
        """Returns at once outside a lull; inside one, once it ends (or `stop` is set)."""
        if self.seconds <= 0:
            return
        into = (time.monotonic() - self.start) % self.every_s
        if into >= self.every_s - self.seconds:
            stop.wait(self.every_s - into)


@dataclass
class ClientSettings:
    """What every client shares: the server, its limits, the tokenizer's characters per token, the lulls."""

    base_url: str
    n_ctx: int
    max_body_bytes: int
    chars_per_token: float
    timeout_s: float
    lulls: Lulls


class Client(threading.Thread):
    """Sends the request mix through one transport until `stop` is set; each request goes to `record`."""

    def __init__(self, name: str, transport: Transport, pool: DocumentPool, settings: ClientSettings,
                 seed: int, record: Callable[..., RequestRecord], stop: threading.Event, stream_share: float):
        super().__init__(name=name, daemon=True)
        self.transport = transport
        self.pool = pool
        self.settings = settings
        self.stream_share = stream_share  # answers asked for as streams (read to the end)
        self.hostile = http_hostile_requests(settings.max_body_bytes)
        self.rng = random.Random(seed)
        self.record = record
        self.stop = stop
        self.conversations: list[Conversation] = []
        self.too_long_text = text_of_tokens(random.Random(seed), int(settings.n_ctx * 1.5), settings.chars_per_token)
        self.crashed: Optional[str] = None
        self.last_status: Optional[int] = 200

    def run(self) -> None:
        try:
            self._every_hostile_request()
            while not self.stop.is_set():
                self.settings.lulls.wait_out(self.stop)
                if self.stop.is_set():
                    break
                action = self.rng.choices(list(ACTIONS), weights=list(ACTIONS.values()))[0]
                getattr(self, f"_{action}")()
                if self.last_status is None:
                    time.sleep(1)  # no HTTP answer (recorded as a failure): do not spin against a dead server
        except Exception as exc:  # a bug of the soak itself: say so, never let a thread die silently
            self.crashed = "".join(traceback.format_exception(exc))
        finally:
            self.transport.close()

    # -- answers --

    def _body(self, **fields) -> dict:
        return {"max_tokens": self.rng.choice((16, 24, 32, 48)), "temperature": 0,
                "stream": self.rng.random() < self.stream_share, **fields}

    def _send_answer(self, kind: str, path: str, body: dict, *, expected: str = "200",
                     replay: Optional[Replay] = None, not_replayed: Optional[str] = None) -> RequestRecord:
        t0 = time.monotonic()
        outcome = self.transport.answer(path, body)
        return self.record(self, kind, path, outcome, expected, t0, replay=replay, not_replayed=not_replayed,
                           streamed=bool(body.get("stream")))

    def _chat(self) -> None:
        plain = [c for c in self.conversations if c.documents is None]
        if not plain or (len(plain) < 2 and self.rng.random() < 0.3):
            system = self.rng.choice(SYSTEMS)
            conversation = Conversation(([{"role": "system", "content": system}] if system else []),
                                        turns_left=self.rng.randint(2, 7))
            conversation.messages.append({"role": "user", "content": self.rng.choice(OPENERS)})
            self.conversations.append(conversation)
        else:
            conversation = self.rng.choice(plain)
            if self._user_turns(conversation) >= 2 and self.rng.random() < 0.3:
                self._edit(conversation)
            else:
                conversation.messages.append({"role": "user", "content": self._follow_up()})
        self._conversation_turn(conversation)

    def _edit(self, conversation: Conversation) -> None:
        """Changes an earlier user message (the turns after it stay) and asks a new question after them."""
        users = [i for i, m in enumerate(conversation.messages) if m["role"] == "user"][:-1]
        index = self.rng.choice(users)
        edited = dict(conversation.messages[index])
        edited["content"] = self.rng.choice((edited["content"] + " Please be brief.", self.rng.choice(OPENERS)))
        conversation.messages[index] = edited
        if self.rng.random() < 0.5:
            conversation.after_edit = "reuse"  # the user's client opted in; it stays so for this conversation
        conversation.messages.append({"role": "user", "content": self._follow_up()})

    def _conversation_turn(self, conversation: Conversation) -> None:
        body = self._body(messages=[dict(m) for m in conversation.messages])
        if conversation.documents is not None:
            body["documents"] = list(conversation.documents)
            kind, replay, why = "docs_chat", None, "a conversation over documents: its first turn's cells depend on history"
        elif conversation.after_edit == "reuse":
            body["after_edit"] = "reuse"
            kind, replay, why = "chat_reuse", None, 'after_edit="reuse": documented as not exact'
        else:
            kind, why = "chat", None
            replay = Replay("chat", "/v1/chat/completions", body)
        record = self._send_answer(kind, "/v1/chat/completions", body, replay=replay, not_replayed=why)
        conversation.turns_left -= 1
        if not record.ok or conversation.turns_left <= 0 or self.rng.random() < 0.12:  # 0.12: abandoned midway
            self.conversations.remove(conversation)
        else:
            conversation.messages.append({"role": "assistant", "content": record.text})

    def _user_turns(self, conversation: Conversation) -> int:
        return sum(m["role"] == "user" for m in conversation.messages)

    def _follow_up(self) -> str:
        return self.rng.choice(FOLLOW_UPS).format(name=invented_name(self.rng))

    def _documents_asked(self, allow_churned: bool = True) -> tuple[list[str], list[str], bool]:
        """Returns (names asked about, as sent: names or ids, whether a churned document is among them)."""
        names = list(self.rng.choice(self.pool.combos))
        churned = self.pool.present_churned() if allow_churned else []
        with_churned = bool(churned) and self.rng.random() < 0.25
        if with_churned:
            names.insert(self.rng.randrange(len(names) + 1), self.rng.choice(churned))
        sent = [self.pool.ids.get(name, name) if self.rng.random() < 0.5 else name for name in names]
        return names, sent, with_churned

    def _docs_question(self) -> None:
        names, sent, with_churned = self._documents_asked()
        question = self.rng.choice(self.pool.questions.get(names[0], ()) + GENERIC_QUESTIONS)
        system = self.rng.choice(SYSTEMS)
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
        body = self._body(messages=messages, documents=sent)
        expected = "200|404" if with_churned else "200"
        if self.rng.random() < 0.5:
            body["setting"] = "accurate"
            replay = Replay("docs_accurate", "/v1/chat/completions", body,
                            {name: self.pool.text(name) for name in names})
            self._send_answer("docs_accurate", "/v1/chat/completions", body, expected=expected, replay=replay)
        else:
            self._send_answer("docs_fast", "/v1/chat/completions", body, expected=expected,
                              not_replayed='setting "fast": a new combination answers from documents encoded '
                                           'after stand-ins the library held (history-dependent by design)')

    def _docs_conversation(self) -> None:
        ongoing = [c for c in self.conversations if c.documents is not None]
        if ongoing:
            conversation = ongoing[0]
            conversation.messages.append({"role": "user", "content": self._follow_up()})
            self._conversation_turn(conversation)
            return
        # Pinned documents only: a conversation must not lose its documents to another client's remove midway.
        names, sent, _ = self._documents_asked(allow_churned=False)
        question = self.rng.choice(self.pool.questions.get(names[0], ()) + GENERIC_QUESTIONS)
        conversation = Conversation([{"role": "user", "content": question}], documents=sent,
                                    turns_left=self.rng.randint(2, 4))
        body = self._body(messages=[dict(m) for m in conversation.messages], documents=sent)
        record = self._send_answer("docs_fast", "/v1/chat/completions", body,
                                   not_replayed="setting \"fast\" (the first turn of a conversation over documents)")
        if record.ok:
            conversation.messages.append({"role": "assistant", "content": record.text})
            self.conversations.append(conversation)

    def _pml(self) -> None:
        doc = self.rng.choice(sorted(DEMO_QUESTIONS))
        question = self.rng.choice(DEMO_QUESTIONS[doc])
        if self.rng.random() < 0.3:
            # A param's argument is computed in the library context after whatever it holds: history-dependent.
            prompt = f'<prompt schema="demo"><style tone="{self.rng.choice(TONES)}"/><{doc}/><user>{question}</user></prompt>'
            self._send_answer("pml_param", "/v1/completions", self._body(prompt=prompt),
                              not_replayed="a <param> argument is computed in the library context (history-dependent)")
            return
        body = self._body(prompt=f'<prompt schema="demo"><{doc}/><user>{question}</user></prompt>')
        self._send_answer("pml", "/v1/completions", body, replay=Replay("pml", "/v1/completions", body))

    def _hangup(self) -> None:
        """Asks for a long streamed answer and closes the connection after a few pieces."""
        if self.rng.random() < 0.6:
            path = "/v1/chat/completions"
            body = {"messages": [{"role": "user", "content": self.rng.choice(OPENERS)}]}
        else:
            doc = self.rng.choice(sorted(DEMO_QUESTIONS))
            path = "/v1/completions"
            body = {"prompt": f'<prompt schema="demo"><{doc}/><user>{self.rng.choice(DEMO_QUESTIONS[doc])}</user></prompt>'}
        body.update(max_tokens=48, temperature=0, stream=True)
        t0 = time.monotonic()
        outcome = self.transport.answer(path, body, hang_up_after=self.rng.randint(1, 4))
        self.record(self, "hangup", path, outcome, "200", t0, not_replayed="hung up mid-answer", streamed=True)

    # -- documents --

    def _doc_add(self) -> None:
        name = self.rng.choice(sorted(self.pool.churned))
        text = self.pool.churned[name]
        known = name in self.pool.present_churned()
        t0 = time.monotonic()
        outcome = self.transport.add_document(text, name)
        doc_id = (outcome.json or {}).get("id") if outcome.status == 200 else None
        earlier = self.pool.ids.get(name)
        problem = None
        if outcome.status == 200 and (doc_id is None or (earlier is not None and doc_id != earlier)):
            problem = f"the same text got id {doc_id}, and {earlier} before"  # ids are the text's hash
        self.record(self, "doc_add_again" if known else "doc_add", "/v1/documents", outcome, "200", t0,
                    problem=problem)
        if doc_id is not None:
            self.pool.learn(name, doc_id)

    def _doc_remove(self) -> None:
        present = self.pool.present_churned()
        name = self.rng.choice(present or sorted(self.pool.churned))
        target = self.pool.ids.get(name, name) if self.rng.random() < 0.5 else name
        t0 = time.monotonic()
        outcome = self.transport.remove_document(target)
        self.pool.forget(name)
        self.record(self, "doc_remove", "/v1/documents/{id or name}", outcome,
                    "200|404", t0)  # 404: another client removed it first

    def _doc_too_long(self) -> None:
        t0 = time.monotonic()
        outcome = self.transport.add_document(self.too_long_text, None)
        message = (outcome.error or "").lower()
        named = "n_ctx" in message or "context" in message
        self.record(self, "doc_too_long", "/v1/documents", outcome, "4xx", t0,
                    problem=None if named else "the refusal does not name the context as the problem")

    # -- hostile --

    def _every_hostile_request(self) -> None:
        """Sends each hostile request once, so that even a short run sees every kind refused."""
        count = len(self.hostile) if isinstance(self.transport, HttpxTransport) else len(self._openai_hostile_requests())
        for index in range(count):
            self._hostile(index)

    def _hostile(self, index: Optional[int] = None) -> None:
        """Sends hostile request `index` of this transport's list, a random one when None; each must be a 4xx."""
        if isinstance(self.transport, HttpxTransport):
            what, method, path, payload = self.hostile[index] if index is not None else self.rng.choice(self.hostile)
            t0 = time.monotonic()
            if isinstance(payload, bytes):
                outcome = self.transport.send(method, path, content=payload)
            else:
                outcome = self.transport.send(method, path, json_body=payload)
        else:
            requests = self._openai_hostile_requests()
            what, path, send = requests[index] if index is not None else self.rng.choice(requests)
            t0 = time.monotonic()
            outcome = send()
        self.record(self, f"hostile:{what}", path, outcome, "4xx", t0)

    def _openai_hostile_requests(self) -> list[tuple[str, str, Callable[[], Outcome]]]:
        transport = self.transport
        question = [{"role": "user", "content": "What is this about?"}]
        return [
            ("unknown document", "/v1/chat/completions", lambda: transport.answer("/v1/chat/completions", {
                "messages": question, "documents": [UNKNOWN_DOCUMENT], "max_tokens": 8})),
            ("after_edit of a wrong type", "/v1/chat/completions", lambda: transport.answer("/v1/chat/completions", {
                "messages": question, "after_edit": 3, "max_tokens": 8})),
            ("PML prompt that does not parse", "/v1/completions", lambda: transport.answer("/v1/completions", {
                "prompt": '<prompt schema="demo"><harbor>', "max_tokens": 8})),
            ("schema that does not parse", "/v1/schemas",
             lambda: transport.post_json("/schemas", {"pml": "<schema name='x'><module"})),
            ("remove an unknown document", "/v1/documents/{id}", lambda: transport.remove_document(UNKNOWN_DOCUMENT)),
        ]


def http_hostile_requests(max_body_bytes: int) -> list[tuple[str, str, str, object]]:
    """Returns (what, method, path, JSON body or raw bytes) of requests that must get a 4xx."""
    user = [{"role": "user", "content": "hi"}]
    return [
        ("not JSON", "POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"'),
        ("messages not a list", "POST", "/v1/chat/completions", {"messages": "hi"}),
        ("max_tokens a word", "POST", "/v1/chat/completions", {"messages": user, "max_tokens": "many"}),
        ("documents a string", "POST", "/v1/chat/completions", {"messages": user, "documents": "harbor"}),
        ("prompt a number", "POST", "/v1/completions", {"prompt": 5}),
        ("body over the limit", "POST", "/v1/documents",
         {"text": "word " * (max_body_bytes // 5 + 1000), "name": "too-big"}),
        ("unknown document", "POST", "/v1/chat/completions", {"messages": user, "documents": [UNKNOWN_DOCUMENT]}),
        ("remove an unknown document", "DELETE", f"/v1/documents/{UNKNOWN_DOCUMENT}", None),
        ("schema that does not parse", "POST", "/v1/schemas", {"pml": '<schema name="broken"><module name="a">'}),
        ("PML prompt for an unknown module", "POST", "/v1/completions",
         {"prompt": '<prompt schema="demo"><lighthouse/><user>hi</user></prompt>', "max_tokens": 8}),
    ]


def demo_documents() -> dict[str, str]:
    """Returns the repository's invented documents by name: examples/*.txt and the demo's observatory."""
    docs = {name: (ROOT / "examples" / f"{name}.txt").read_text() for name in ("harbor", "railway")}
    docs["observatory"] = DEMO_DOCS["observatory"]
    return docs
