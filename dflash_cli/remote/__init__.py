"""`dflash generate --url` and `dflash chat --url`: the same commands against any OpenAI-compatible server
(`dflash serve`, vLLM, SGLang), with our statistics when the server sends them, else from its /metrics."""

from .commands import remote_chat, remote_generate

__all__ = ["remote_chat", "remote_generate"]
