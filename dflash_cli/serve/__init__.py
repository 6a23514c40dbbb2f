"""`dflash serve`: an OpenAI-compatible HTTP server on our engine, and launch commands for vLLM / SGLang."""
