"""Writes a store with the pc_cpu checked out here (an older commit), for tests/store/test_store_compat.py."""
import json, pathlib, shutil, sys
sys.path.insert(0, ".")
from tests.tiny_gguf import write_tiny_llama_gguf
from pc_cpu.cache import PromptCache

out = pathlib.Path(sys.argv[1])
shutil.rmtree(out, ignore_errors=True)
model = write_tiny_llama_gguf(pathlib.Path("/tmp/oldstore/tiny.gguf"))
SCHEMA = '<schema name="compat"><system>You answer briefly.</system><module name="harbor">The Calder Light stands on a rock in the harbor and was automated in 1987.</module><user></user></schema>'
DOC = "The Morrow Archive keeps 4,200 maps of the northern coast, the oldest drawn in 1721."
MESSAGES = [{"role": "user", "content": "Name a colour."}]
with PromptCache(model=str(model), store=out / "store", n_ctx=512, threads=1) as pc:
    pc.load_schema(SCHEMA)
    doc = pc.add_document(DOC, name="archive.txt")
    asked = pc.ask("How many maps?", documents=[doc], max_tokens=8)
    generated = pc.generate('<prompt schema="compat"><harbor/><user>When was it automated?</user></prompt>', max_tokens=8)
    turn = pc.chat(MESSAGES, max_tokens=8)
    pc.wait_idle(timeout=60)
    expected = {"schema": SCHEMA, "document": DOC, "document_id": str(doc), "messages": MESSAGES,
                "ask": asked.token_ids, "generate": generated.token_ids, "chat": turn.token_ids, "chat_text": turn.text}
(out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
print(json.dumps(expected)[:300])
