"""PML and the prompts built from it, as pure Python: parse, layout, plan (the tokenizer is passed in).

Data flows one way: a schema's text is parsed (schema, xmltree) and laid out at fixed positions
(layout); a prompt is parsed (prompt) and planned against that layout (plan): which cells to copy
and which tokens to compute. Documents (document_layout) and conversations (chat) are laid out
here too, and every cached run of tokens is a Segment (segment) keyed by its content (encoding).
Imports nothing of pc_cpu but errors and result: no llama.cpp, no store.
"""
