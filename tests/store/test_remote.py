"""RemoteStore: the shared Redis tier keeps the disk tier's contract, and a Redis that fails costs a miss, never an error."""

from __future__ import annotations

import logging
import time

import pytest

from pc_cpu.errors import ConfigError, EntryTooLargeError, StoreUnavailableError, UnknownEntryError
from pc_cpu.opening import open_store
from pc_cpu.store import remote as remote_module
from pc_cpu.store.base import ModuleStore
from pc_cpu.store.disk_format import encode_header
from pc_cpu.store.ram import RamStore
from pc_cpu.store.redis_link import REMOTE_STORE_ENV, remote_url, shown_url
from pc_cpu.store.remote import NAMESPACE, RemoteStore, entry_name
from pc_cpu.store.tiers import TieredStore
from tests.store.conftest import blob_entry, key, name as name_of

PAYLOAD = 1000


def size_of(k, e) -> int:
    """Returns the bytes an entry counts against the budget: its header and payload, as a disk file."""
    return len(encode_header(k, e)) + e.nbytes


def warnings_of(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.fixture
def remote(redis_url):
    store = RemoteStore(redis_url)
    yield store
    store.close()


def test_is_a_module_store(remote):
    assert isinstance(remote, ModuleStore) and remote.name == "remote"


def test_round_trip_and_byte_totals(remote):
    a, b = blob_entry(PAYLOAD), blob_entry(2 * PAYLOAD, fill=1)
    assert remote.put(key("a"), a) == [] and remote.put(key("b"), b) == []
    assert remote.get(key("a")) == a and remote.get(key("b")) == b
    assert remote.contains(key("a")) and not remote.contains(key("c")) and remote.get(key("c")) is None
    assert remote.bytes_used == size_of(key("a"), a) + size_of(key("b"), b) and len(remote) == 2
    assert remote.remove(key("a")) and not remote.remove(key("a"))
    assert remote.bytes_used == size_of(key("b"), b) and [name_of(k) for k in remote.keys()] == ["b"]


def test_a_second_server_sees_the_same_entries_and_the_same_count(remote, redis_url):
    remote.put(key("a"), blob_entry(PAYLOAD))
    other = RemoteStore(redis_url)
    assert other.get(key("a")) == blob_entry(PAYLOAD) and other.bytes_used == remote.bytes_used
    other.put(key("b"), blob_entry(PAYLOAD, fill=2))
    assert remote.get(key("b")) == blob_entry(PAYLOAD, fill=2)
    other.close()


def test_replacing_an_entry_keeps_the_total_and_leaves_no_old_chunk(remote, redis_server):
    remote.put(key("a"), blob_entry(PAYLOAD))
    remote.put(key("a"), blob_entry(3 * PAYLOAD, fill=5))
    assert remote.get(key("a")) == blob_entry(3 * PAYLOAD, fill=5)
    assert remote.bytes_used == size_of(key("a"), blob_entry(3 * PAYLOAD, fill=5))
    client = redis_server.client()
    assert len(list(client.scan_iter(match=NAMESPACE + "c:*"))) == 1  # the replaced write's chunk is gone


def test_budget_evicts_least_recently_used_exact_trace(redis_url):
    one = size_of(key("a"), blob_entry(PAYLOAD))
    remote = RemoteStore(redis_url, budget_bytes=3 * one)
    for module in "abc":
        assert remote.put(key(module), blob_entry(PAYLOAD)) == []
    assert remote.get(key("a")) is not None  # a is now the most recently used (the LRU clock is a counter)
    evicted = remote.put(key("d"), blob_entry(PAYLOAD))
    assert [e.key.content for e in evicted] == [key("b").content] and all(e.entry is None for e in evicted)
    assert [name_of(k) for k in remote.keys()] == ["c", "a", "d"] and remote.bytes_used == 3 * one
    assert remote.get(key("b")) is None


def test_servers_with_one_budget_evict_across_each_other(redis_url):
    one = size_of(key("a"), blob_entry(PAYLOAD))
    first, second = RemoteStore(redis_url, budget_bytes=2 * one), RemoteStore(redis_url, budget_bytes=2 * one)
    first.put(key("a"), blob_entry(PAYLOAD))
    second.put(key("b"), blob_entry(PAYLOAD))
    second.put(key("c"), blob_entry(PAYLOAD))  # the budget is the servers' together: a, the oldest, goes
    assert not first.contains(key("a")) and first.contains(key("b")) and first.bytes_used == 2 * one


def test_entry_larger_than_budget_is_refused(redis_url):
    remote = RemoteStore(redis_url, budget_bytes=PAYLOAD)
    with pytest.raises(EntryTooLargeError, match="--remote-bytes"):
        remote.put(key("a"), blob_entry(2 * PAYLOAD))
    assert len(remote) == 0


def test_an_entry_larger_than_a_chunk_is_split_and_read_back_whole(remote, redis_server, monkeypatch):
    monkeypatch.setattr(remote_module, "CHUNK_BYTES", 300)
    monkeypatch.setattr(remote_module, "CHUNKS_PER_CALL", 2)
    big = blob_entry(5 * PAYLOAD, fill=9)
    remote.put(key("a"), big)
    assert len(list(redis_server.client().scan_iter(match=NAMESPACE + "c:*"))) == -(-big.nbytes // 300)
    assert remote.get(key("a")) == big


def test_foreign_models_are_other_names(remote):
    remote.put(key("a", model="model-A"), blob_entry(PAYLOAD))
    assert remote.get(key("a", model="model-B")) is None
    assert entry_name(key("a", model="model-A")).startswith("model-A:")


# --- bytes from Redis are untrusted -------------------------------------------------------------

def flip_payload_byte(client, name: str) -> None:
    chunk = next(iter(client.scan_iter(match=f"{NAMESPACE}c:{name}:*")))
    value = bytearray(client.get(chunk))
    value[len(value) // 2] ^= 0x01
    client.set(chunk, bytes(value))


def cut_payload(client, name: str) -> None:
    chunk = next(iter(client.scan_iter(match=f"{NAMESPACE}c:{name}:*")))
    client.set(chunk, client.get(chunk)[:-10])


def garbage_header(client, name: str) -> None:
    client.hset(f"{NAMESPACE}e:{name}", "meta", b"not a header at all")


def header_of_another_key(client, name: str) -> None:
    client.hset(f"{NAMESPACE}e:{name}", "meta", encode_header(key("other"), blob_entry(PAYLOAD)))


def garbage_fields(client, name: str) -> None:
    client.hset(f"{NAMESPACE}e:{name}", "n", b"many")


CORRUPTIONS = [flip_payload_byte, cut_payload, garbage_header, header_of_another_key, garbage_fields]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_a_bad_entry_is_a_miss_deleted_with_one_warning(remote, redis_server, caplog, corrupt):
    remote.put(key("a"), blob_entry(PAYLOAD))
    remote.put(key("b"), blob_entry(PAYLOAD, fill=2))
    corrupt(redis_server.client(), entry_name(key("a")))
    (bad,) = remote.verify()  # verify names it, and deletes nothing unasked
    assert bad.id == key("a").digest()
    caplog.set_level(logging.WARNING)
    assert remote.get(key("a")) is None
    (warning,) = warnings_of(caplog)
    assert "unusable" in warning.getMessage() and "computed again" in warning.getMessage()
    assert not remote.contains(key("a")) and [name_of(k) for k in remote.keys()] == ["b"]
    assert remote.get(key("b")) == blob_entry(PAYLOAD, fill=2)
    assert remote.bytes_used == size_of(key("b"), blob_entry(PAYLOAD, fill=2))


def test_an_entry_with_impossible_cells_is_a_miss(remote, caplog):
    remote.put(key("a"), blob_entry(PAYLOAD, cells=(3, 4, 5, 5, 7, 8, 9)))  # sealed by the writer
    caplog.set_level(logging.WARNING)
    assert remote.get(key("a")) is None
    assert "two cells at position 5" in warnings_of(caplog)[0].getMessage()
    assert not remote.contains(key("a"))


def test_verify_deletes_only_when_asked(remote, redis_server):
    remote.put(key("a"), blob_entry(PAYLOAD))
    remote.put(key("b"), blob_entry(PAYLOAD, fill=2))
    flip_payload_byte(redis_server.client(), entry_name(key("a")))
    assert [(b.reason, b.deleted) for b in remote.verify()] == [("checksum", False)]
    assert [(b.reason, b.deleted) for b in remote.verify(delete=True)] == [("checksum", True)]
    assert remote.verify() == [] and [name_of(k) for k in remote.keys()] == ["b"]


def test_a_value_of_another_type_under_our_name_is_a_miss(remote, redis_server, caplog):
    redis_server.client().set(f"{NAMESPACE}e:{entry_name(key('a'))}", b"a string, not a hash")
    caplog.set_level(logging.WARNING)
    assert remote.get(key("a")) is None
    assert "refused" in warnings_of(caplog)[0].getMessage()


def test_a_write_killed_before_its_commit_leaves_chunks_that_expire(remote, redis_server, monkeypatch):
    monkeypatch.setattr(remote, "_commit", lambda **_: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        remote.put(key("a"), blob_entry(PAYLOAD))
    client = redis_server.client()
    (chunk,) = client.scan_iter(match=NAMESPACE + "c:*")
    assert 0 < client.ttl(chunk) <= remote_module.PENDING_TTL_S
    assert not remote.contains(key("a")) and remote.bytes_used == 0


def test_a_commit_whose_chunks_expired_writes_nothing(remote, redis_server, monkeypatch):
    client = redis_server.client()
    real_execute = type(client.pipeline()).execute

    def then_expire(pipe, *args, **kwargs):
        result = real_execute(pipe, *args, **kwargs)
        for chunk in client.scan_iter(match=NAMESPACE + "c:*"):
            client.delete(chunk)  # as if the writer stalled past PENDING_TTL_S
        return result

    monkeypatch.setattr(type(client.pipeline()), "execute", then_expire)
    assert remote.put(key("a"), blob_entry(PAYLOAD)) == []  # refused by the commit: logged, not raised
    monkeypatch.undo()
    assert not remote.contains(key("a")) and remote.bytes_used == 0


def test_clear_and_ls(remote, redis_server):
    remote.put(key("a"), blob_entry(PAYLOAD))
    remote.put(key("b"), blob_entry(PAYLOAD))
    redis_server.client().hset("pc_cpu:library", "doc-x", b"{}")  # the library is not an entry
    listing = remote.ls()
    assert [item.key.label for item in listing] == ["trip/a", "trip/b"] and listing[0].n_tokens == 7
    assert remote.entry_with_id(listing[1].id[:10]).key == key("b")
    with pytest.raises(UnknownEntryError):
        remote.entry_with_id("zzz")
    assert remote.clear() == 2 and len(remote) == 0 and remote.bytes_used == 0
    assert redis_server.client().hexists("pc_cpu:library", "doc-x")


# --- the tier among the others ---------------------------------------------------------------

def test_a_remote_hit_is_promoted_to_ram_and_reported_as_remote(redis_url):
    first = TieredStore([RamStore(1 << 20), RemoteStore(redis_url)])
    assert first.put(key("a"), blob_entry(PAYLOAD)) == ("ram", "remote")
    second = TieredStore([RamStore(1 << 20), RemoteStore(redis_url)])  # another server: its RAM is empty
    hit = second.get(key("a"))
    assert hit.tier == "remote" and hit.entry == blob_entry(PAYLOAD)
    assert second.get(key("a")).tier == "ram"


# --- a Redis that fails ----------------------------------------------------------------------

def test_redis_down_at_start_is_an_error_naming_the_url_without_its_password(tmp_path):
    from tests.redis_server import free_port

    url = f"redis://user:secret@127.0.0.1:{free_port()}/0"
    with pytest.raises(StoreUnavailableError) as caught:
        open_store(False, ram_bytes=1 << 20, disk_bytes=0, remote=url)
    message = str(caught.value)
    assert "127.0.0.1" in message and "secret" not in message and "--store-fallback local" in message


def test_redis_down_at_start_with_fallback_local_serves_locally_and_connects_when_it_comes(own_redis, caplog):
    own_redis.stop()
    caplog.set_level(logging.WARNING)
    store = open_store(False, ram_bytes=1 << 20, disk_bytes=0, remote=own_redis.url, fallback="local")
    assert any("store_fallback" in r.getMessage() for r in warnings_of(caplog))
    assert store.put(key("a"), blob_entry(PAYLOAD)) == ("ram", "remote")  # skipped there: it is down
    own_redis.start()
    remote = store.tier("remote")
    remote.link._retry_at = 0  # the pause is over
    store.put(key("b"), blob_entry(PAYLOAD))
    assert remote.contains(key("b")) and not remote.contains(key("a"))


def test_a_wrong_password_is_refused_at_start(tmp_path):
    from tests.redis_server import RedisServer

    server = RedisServer(tmp_path, password="right").start()
    try:
        with pytest.raises(StoreUnavailableError, match="refused"):
            open_store(False, ram_bytes=1 << 20, disk_bytes=0, remote=server.url.replace("right", "wrong"))
        store = open_store(False, ram_bytes=1 << 20, disk_bytes=0, remote=server.url)  # AUTH in the URL
        store.put(key("a"), blob_entry(PAYLOAD))
        assert store.tier("remote").get(key("a")) == blob_entry(PAYLOAD)
    finally:
        server.stop()


def test_redis_killed_mid_run_costs_misses_then_it_is_used_again(own_redis, caplog):
    remote = RemoteStore(own_redis.url)
    store = TieredStore([RamStore(1 << 20), remote])
    store.put(key("a"), blob_entry(PAYLOAD))
    own_redis.stop()
    caplog.set_level(logging.WARNING)
    started = time.monotonic()
    assert store.put(key("b"), blob_entry(PAYLOAD)) == ("ram", "remote")  # no error: kept in RAM
    assert store.get(key("c")) is None and not store.contains(key("c")) and not remote.remove(key("a"))
    for _ in range(100):  # while it is down, each call returns at once
        remote.get(key("c"))
    assert time.monotonic() - started < 2.0
    assert len([r for r in warnings_of(caplog) if "failed" in r.getMessage()]) == 1  # one warning an outage
    assert store.get(key("b")).tier == "ram"
    own_redis.start()  # empty again: what it held was in memory
    remote.link._retry_at = 0
    store.put(key("d"), blob_entry(PAYLOAD))
    assert remote.contains(key("d")) and any("is back" in r.getMessage() for r in warnings_of(caplog))


def test_a_read_slower_than_computing_is_abandoned(remote, monkeypatch, caplog):
    remote.put(key("a"), blob_entry(PAYLOAD))
    monkeypatch.setattr(remote_module, "MIN_READ_S", 0.05)
    real_hmget = remote._client.hmget

    def slow_hmget(*args):
        time.sleep(0.1)  # a congested link: the header alone takes longer than 7 tokens' compute
        return real_hmget(*args)

    monkeypatch.setattr(remote._client, "hmget", slow_hmget)
    caplog.set_level(logging.WARNING)
    assert remote.get(key("a")) is None
    assert "longer than computing it" in warnings_of(caplog)[0].getMessage()
    monkeypatch.setattr(remote._client, "hmget", real_hmget)
    assert remote.get(key("a")) == blob_entry(PAYLOAD)  # abandoned, not deleted


def test_the_deadline_grows_with_the_cells():
    assert remote_module.read_deadline_s(10) == remote_module.MIN_READ_S
    assert remote_module.read_deadline_s(30_000) == 30_000 / remote_module.FAST_PREFILL_TOKENS_S


# --- the URL ---------------------------------------------------------------------------------

def test_the_url_comes_from_the_argument_or_the_environment():
    assert remote_url(None, {}) is None and remote_url(False, {REMOTE_STORE_ENV: "redis://h"}) is None
    assert remote_url(None, {REMOTE_STORE_ENV: "redis://h:1/0"}) == "redis://h:1/0"
    assert remote_url("rediss://h:6380/1", {}) == "rediss://h:6380/1"
    with pytest.raises(ConfigError, match="redis://host:6379/0"):
        remote_url("http://h", {})


def test_a_shown_url_hides_the_password():
    assert shown_url("redis://alice:s3cret@h:6379/0") == "redis://alice:***@h:6379/0"
    assert shown_url("redis://h:6379/0") == "redis://h:6379/0"
