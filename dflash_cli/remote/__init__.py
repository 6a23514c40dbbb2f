"""`dflash generate --url` and `dflash chat --url`: the same commands against any OpenAI-compatible server
(`dflash serve`, vLLM, SGLang), with our statistics when the server sends them, else from its /metrics. The client and the statistics; the
commands themselves are commands/remote.py."""
