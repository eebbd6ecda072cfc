"""Saved KV state: the blob format llama.cpp writes, its C twin (libpc_native), and the RoPE facts that move cells."""
