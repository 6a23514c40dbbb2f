"""Load on `dflash serve`: requests per second and p50 / p95 latency for sequential and concurrent clients.

Starts `dflash serve MODEL` on a free loopback port (or uses --url), then runs, with the same small completion:
  - `sequential`: one client, --requests requests one after another;
  - `concurrent`: --clients clients at once, each sending --per-client requests (they queue: batch size 1);
  - `over queue`: the same clients against a server started with --max-queue SMALL: the excess get 503 at once.
Latency is per successful request, end to end; a 503 is counted, not timed. Prints one table.

    python benchmarks/serve_load.py                     # the demo pair on this machine
    python benchmarks/serve_load.py --url http://HOST:8000 --model NAME --max-tokens 64
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def start(model: str, max_queue: int, extra: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "dflash_cli", "serve", model, "--port", str(port),
                             "--max-queue", str(max_queue), *extra], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
        if proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("error: dflash serve did not start")


def run(url: str, body: dict, clients: int, per_client: int) -> dict:
    latencies: list[float] = []
    codes: dict[int, int] = {}
    lock = threading.Lock()

    def client(i: int) -> None:
        with httpx.Client(timeout=600) as c:
            for j in range(per_client):
                t0 = time.perf_counter()
                r = c.post(f"{url}/v1/completions", json={**body, "prompt": f"{body['prompt']}  # {i}.{j}"})
                dt = time.perf_counter() - t0
                with lock:
                    codes[r.status_code] = codes.get(r.status_code, 0) + 1
                    if r.status_code == 200:
                        latencies.append(dt)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    q = statistics.quantiles(lat, n=20) if len(lat) >= 2 else lat * 19
    return {"sent": clients * per_client, "ok": codes.get(200, 0), "503": codes.get(503, 0), "wall": wall,
            "rps": len(lat) / wall if wall else 0.0, "p50": statistics.median(lat) if lat else float("nan"),
            "p95": q[18] if lat else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--url", help="an already running server (the over-queue row is then skipped)")
    ap.add_argument("--prompt", default="def fibonacci(n):")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--requests", type=int, default=50, help="sequential requests")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=4)
    ap.add_argument("--max-queue", type=int, default=16, help="the server's queue for the first two rows")
    ap.add_argument("--small-queue", type=int, default=3, help="the server's queue for the over-queue row")
    ap.add_argument("--serve-args", default="", help="extra `dflash serve` flags, e.g. '--draft none'")
    a = ap.parse_args()
    body = {"model": a.model, "prompt": a.prompt, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}
    extra = a.serve_args.split()
    rows = []
    proc = None
    try:
        if a.url:
            url = a.url.rstrip("/")
        else:
            proc, url = start(a.model, a.max_queue, extra)
        run(url, body, 1, 3)  # warm-up
        rows.append(("sequential", 1, run(url, body, 1, a.requests)))
        rows.append((f"concurrent, queue {a.max_queue}", a.clients, run(url, body, a.clients, a.per_client)))
        if proc is not None:
            proc.terminate()
            proc.wait()
            proc, url = start(a.model, a.small_queue, extra)
            run(url, body, 1, 2)
            rows.append((f"concurrent, queue {a.small_queue}", a.clients, run(url, body, a.clients, a.per_client)))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait()
    print(f"dflash serve {a.model} · {a.max_tokens} tokens per completion (ignore_eos) · prompt {a.prompt!r}")
    print(f"{'scenario':<22} {'clients':>7} {'sent':>5} {'ok':>5} {'503':>5} {'req/s':>7} {'p50 s':>7} {'p95 s':>7}")
    for name, clients, r in rows:
        print(f"{name:<22} {clients:>7} {r['sent']:>5} {r['ok']:>5} {r['503']:>5} {r['rps']:>7.2f} "
              f"{r['p50']:>7.3f} {r['p95']:>7.3f}")


if __name__ == "__main__":
    main()
