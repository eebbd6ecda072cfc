"""The three prompt kinds as the scheduler runs them, each with the cells it keeps.

    schema_cells, schema_prompt      a PML prompt: a schema's encodings (ModuleCache) assembled
    document_cells, document_prompt  a question over documents: their cells moved into place
    chat_prompt                      a conversation: its earlier turns' cells reused

Each *_prompt module gives a PromptWork (engine.runtime.prompt_work) the scheduler runs.
May import: every other engine room, pc_cpu.pml, pc_cpu.kvstate, pc_cpu.store, pc_cpu.result.
"""
