"""`dflash serve`: our engine behind an OpenAI-compatible API, or the launch command of vLLM / SGLang."""

from __future__ import annotations

import importlib.util
import os
import shlex
import socket
import sys

from ..options import ServeOptions
from ..errors import DflashError
from ..registry import Registry

ENGINES = ("dflash", "vllm", "sglang")


def run_serve(o: ServeOptions, console=None) -> None:
    if o.engine not in ENGINES:
        raise DflashError(f"unknown --engine '{o.engine}' (use {', '.join(ENGINES)})")
    if not 0 < o.port < 65536:
        raise DflashError(f"--port must be in 1..65535 (got {o.port})")
    if o.engine != "dflash":
        return _external(o)
    if o.max_queue < 0:
        raise DflashError(f"--max-queue must be >= 0 (got {o.max_queue})")
    if o.tensor_parallel != 1 or o.print_only:
        raise DflashError("--tensor-parallel and --print go with --engine vllm or sglang")
    if not serve_deps_installed():
        # Not on PyPI as dflash-cli: the extra installs from a clone; the two packages install anywhere.
        raise DflashError("dflash serve needs FastAPI and uvicorn: pip install fastapi uvicorn "
                          "(from a clone: pip install -e '.[serve]')")
    _check_port(o.host, o.port)  # before the weights load
    import uvicorn

    from ..serve.app import create_app
    from ..runtime.decoders import unused_draft_len
    from ..serve.engine_bridge import Engine
    from .common import warn

    served = o.model or Registry.load().default
    engine = Engine(served, o.draft, o.draft_len, o.device, o.dtype, o.context)
    if unused := unused_draft_len(engine.decoder, o.draft_len):
        warn(unused)
    app = create_app(engine, served, api_key=o.api_key, max_queue=o.max_queue)
    print(f"dflash serve · {served} on {engine.bundle.device} · draft {engine.draft_kind} · context "
          f"{engine.context} · http://{o.host}:{o.port}/v1", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=o.host, port=o.port, log_level="warning",
                                           timeout_graceful_shutdown=5))
    app.state.stopping = lambda: server.should_exit  # Ctrl-C: streams end at their next poll, then the server
    server.run()


def _check_port(host: str, port: int) -> None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise DflashError(f"cannot resolve --host {host}: {exc.strerror}") from None
    family, *_rest, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            raise DflashError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def serve_deps_installed() -> bool:
    return all(importlib.util.find_spec(m) for m in ("fastapi", "uvicorn"))


def _external(o: ServeOptions) -> None:
    from ..serve.external import installed, launch_command

    entry = Registry.load().resolve(o.model)
    argv = launch_command(o.engine, entry, draft=o.draft, draft_len=o.draft_len, tensor_parallel=o.tensor_parallel,
                          host=o.host, port=o.port, api_key=o.api_key, context=o.context)
    if o.print_only:
        print(shlex.join(argv))
        return
    if not installed(o.engine):
        how = "pip install vllm" if o.engine == "vllm" else "pip install 'sglang[all]'"
        raise DflashError(f"{o.engine} is not installed here ({how}); --print shows the command without running it")
    os.execvp(argv[0], argv)
