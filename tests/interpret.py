"""Kernel checks through Triton's interpreter on CPU: the script runs in a fresh Python, because TRITON_INTERPRET
must be set before kernels are defined; and a kernels module whose calls are counted, for dispatch checks."""

import os
import subprocess
import sys


def run_interpreted(script: str, *argv: str, timeout: int = 600) -> None:
    """Run `script` (python -c) with its args under the interpreter; it must exit 0 having printed "ok"."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]


def counting(kernels, counted, passed, calls: dict):
    """A stand-in for the module `kernels` (what ops.model_kernels returns): the functions named in `counted` count
    their calls into `calls`; those in `passed` are kernels' own."""
    def count(name):
        fn = getattr(kernels, name)

        def run(*args, **kw):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args, **kw)
        return run

    return type("Kernels", (), {**{n: staticmethod(count(n)) for n in counted},
                                **{n: staticmethod(getattr(kernels, n)) for n in passed}})
