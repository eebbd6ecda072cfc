"""A store written before the engine moved into rooms (commit 27da793) serves after it, without computing.

tests/data/store_2026-12-06/ holds what that commit wrote with the tiny model (seed 0, n_ctx 512,
threads 1; its make.py, run from a checkout of that commit, writes it again): a schema's
encodings, a document and its preamble, and a conversation's stored turn. Content keys, the disk
format and the document library must read it as they wrote it: every cell comes from the disk
tier, nothing is encoded, and each answer is the current full prefill's.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from pc_cpu.cache import PromptCache
from tests.tiny_gguf import write_tiny_llama_gguf

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "store_2026-12-06"
EXPECTED = json.loads((DATA / "expected.json").read_text())
PROMPT = '<prompt schema="compat"><harbor/><user>When was it automated?</user></prompt>'


@pytest.fixture
def old_store(tmp_path: pathlib.Path) -> pathlib.Path:
    """Returns a copy of the store written before (a test must not change the checked-in one)."""
    return pathlib.Path(shutil.copytree(DATA / "store", tmp_path / "store"))


@pytest.fixture
def seed0_model(tmp_path: pathlib.Path) -> pathlib.Path:
    """Returns the tiny model the store was written with: seed 0 gives the same bytes, so the same model key."""
    return write_tiny_llama_gguf(tmp_path / "tiny.gguf")


def test_a_store_written_before_serves_every_cell_from_disk(old_store, seed0_model):
    with PromptCache(model=str(seed0_model), store=old_store, n_ctx=512, threads=1) as pc:
        pc.load_schema(EXPECTED["schema"])
        assert pc.schemas.encoded == 0  # every encoding of the schema came from the store
        assert [d.id for d in pc.list_documents()] == [EXPECTED["document_id"]]
        added = pc.add_document(EXPECTED["document"], name="archive.txt")
        assert added == EXPECTED["document_id"] and added.tiers[added] == "disk"

        asked = pc.ask("How many maps?", documents=[added], max_tokens=8)
        assert set(asked.tiers.values()) == {"disk"} and pc.documents.encoded == 0
        generated = pc.generate(PROMPT, max_tokens=8)
        turn = pc.chat(EXPECTED["messages"] + [{"role": "assistant", "content": EXPECTED["chat_text"]},
                                               {"role": "user", "content": "Another one."}], max_tokens=8)
        assert turn.tiers["#conversation"] == "disk"  # the stored turn, found by its tokens

        # Served from the old bytes, each answer is the full prefill's of the same tokens, here.
        assert asked.token_ids == pc.ask("How many maps?", documents=[added], max_tokens=8,
                                         use_cache=False).token_ids
        assert generated.token_ids == pc.generate(PROMPT, max_tokens=8, use_cache=False).token_ids
