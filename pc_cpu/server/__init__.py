"""The HTTP server of pc_cpu: OpenAI-style completions over a PromptCache (needs the `serve` extra)."""

from pc_cpu.server.app import create_app
from pc_cpu.server.run import ServerThread, serve

__all__ = ["ServerThread", "create_app", "serve"]
