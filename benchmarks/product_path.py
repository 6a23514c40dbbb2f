"""GPU: the commands users type, in fresh processes, against `dflash bench` on the same checkpoints (issue: the
product path at engine speed).

Writes random-weight checkpoints of a registry entry's shapes (MODEL, default qwen3-4b; qwen3.5-4b: the hybrid, in its
multimodal layout with its MTP layer) in Hub layout to local folders (the target and every drafter the entry's synthetic
shapes name: DFlash, DFlash 2, EAGLE-3; the demo's tokenizer, whose ids the random model mostly does not emit, so the
text is near empty and only the speed is measured), then, per mode (none / dflash / eagle3 / ...) and temperature (0, and
0.6 with top-p 0.95 and top-k 20), runs `dflash generate --json` of MAX_TOKENS tokens in a fresh process and
`dflash bench` on the same prompt, and prints: command start to first token, TTFT after load, decode tok/s, CUDA
graph captures during the generation, bench tok/s and the ratio. Random drafters: τ about 1; then forced τ
(FORCED_TAU, default 6): `generate` under DFLASH_FORCE_TAU against `dflash bench --synthetic --synthetic-tau` with
the same shapes and prompt length, greedy.

Then a scripted 5-turn `dflash chat` (200 tokens a turn) per mode and temperature: decode tok/s and TTFT by turn.

Env: MODEL (qwen3-4b), ROOT (checkpoint folder, default /tmp/product/MODEL), MAX_TOKENS (512), MODES (none and every
drafter written; mtp for a hybrid), TEMPS (0,0.6),
PROMPT_TOKENS (short prompt: 0; else a prompt of about that many tokens), CHAT (1: the chat table too), FORCED_TAU
(6; 0: no forced rows), PROFILE (1: where a plain greedy `generate`'s start-up goes, by `python -X importtime` and
cProfile; the profile is written to $OUT/startup.prof).
Run: PYTHONUNBUFFERED=1 python benchmarks/product_path.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dflash_cli.loading.config import Qwen35Config  # noqa: E402
from dflash_cli.models.dflash import DFlashConfig, checkpoint_shapes as dflash_shapes  # noqa: E402
from dflash_cli.models.dflash2 import DFlash2Config, checkpoint_shapes as dflash2_shapes  # noqa: E402
from dflash_cli.models.eagle3 import Eagle3Config  # noqa: E402
from dflash_cli.models.mtp import checkpoint_shapes as mtp_shapes  # noqa: E402
from dflash_cli.synthetic import target_config, target_shapes, random_tensors, shipped_configs  # noqa: E402

MODEL = os.environ.get("MODEL", "qwen3-4b")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # where the random weights are drawn
ROOT = Path(os.environ.get("ROOT", f"/tmp/product/{MODEL}"))
MAX_TOKENS = int(os.environ.get("MAX_TOKENS", "512"))
DRAFTERS = [k for k in ("dflash", "dflash2", "eagle3") if k in shipped_configs(MODEL)]
HYBRID = isinstance(target_config(MODEL), Qwen35Config)
MODES = os.environ.get("MODES", ",".join(["none", *DRAFTERS] + (["mtp"] if HYBRID else []))).split(",")
TEMPS = [float(t) for t in os.environ.get("TEMPS", "0,0.6").split(",")]
DEMO = REPO / "dflash_cli" / "demo" / "target"
# Every command runs with its bytecode cached, as after `pip install` (which compiles it): the lent machine's
# site-packages has none, and compiling torch's modules took 2.7 s of each start-up (cProfile, H200, 2026-11-28).
ENV = dict(os.environ, PYTHONPYCACHEPREFIX=str(ROOT / "pycache"))
ENV.pop("PYTHONDONTWRITEBYTECODE", None)


def write(folder: Path, config: dict, tensors: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(folder / "model.safetensors"))


def checkpoints() -> None:
    """The folders, written once (a later run reuses them)."""
    if (ROOT / "written").is_file():
        return
    shipped = shipped_configs(MODEL)
    cfg = target_config(MODEL)
    target = ROOT / "target"
    tensors = random_tensors(target_shapes(cfg), DEVICE, torch.bfloat16, seed=0)
    if HYBRID:  # the published multimodal layout: the text tower under model.language_model., the MTP beside it
        tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
                   for k, v in tensors.items()}
        tensors.update(random_tensors(mtp_shapes(cfg), DEVICE, torch.bfloat16, seed=4))
    write(target, shipped["target"], tensors)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / name, target / name)
    (target / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": [4094]}))
    for seed, kind in enumerate(DRAFTERS, start=1):
        raw = shipped[kind]
        if kind == "eagle3":
            e = Eagle3Config(raw, Path(kind), cfg)
            tensors = random_tensors(e.checkpoint_shapes(), DEVICE, torch.bfloat16, seed=seed)
            tensors.update(e.identity_maps(DEVICE))
        else:
            c = (DFlashConfig if kind == "dflash" else DFlash2Config)(raw, Path(kind))
            shapes = (dflash_shapes if kind == "dflash" else dflash2_shapes)(c)
            tensors = random_tensors(shapes, DEVICE, torch.bfloat16, seed=seed)
        write(ROOT / kind, raw, tensors)
    (ROOT / "written").touch()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def prompt() -> str:
    n = int(os.environ.get("PROMPT_TOKENS", "0"))
    return "def fibonacci(n):" if n == 0 else " ".join(f"x{i % 97}" for i in range(n // 2))


def sampling(temp: float) -> list[str]:
    return ["--temperature", str(temp)] + (["--top-p", "0.95", "--top-k", "20"] if temp > 0 else [])


def draft(mode: str) -> str:
    return mode if mode in ("none", "mtp") else str(ROOT / mode)


def generate(mode: str, temp: float, prompt_file: Path, tau: float | None = None,
             max_tokens: int = MAX_TOKENS) -> dict:
    cmd = [sys.executable, "-m", "dflash_cli", "generate", "--model", str(ROOT / "target"), "--draft", draft(mode),
           "--prompt-file", str(prompt_file), "--max-tokens", str(max_tokens), "--seed", "0", "--json",
           "--no-repeat-guard",
           *sampling(temp)]
    env = dict(ENV, **({"DFLASH_FORCE_TAU": str(tau)} if tau else {}))
    t0 = time.time()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    wall = time.time() - t0
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1:] or ["?"]}
    answer = json.loads(out.stdout.splitlines()[-1])
    stats = answer["stats"]
    return {"start_to_first_s": stats["first_token_unix_s"] - t0, "ttft_s": stats["ttft_s"],
            "tok_s": stats["decode_tok_per_s"], "captures": stats["graph_captures"], "wall_s": wall,
            "prompt_tokens": answer["prompt_tokens"],
            "tau": stats["tau_tokens_per_step"], "load_captures": stats["graph_captures_at_load"],
            "load_capture_s": stats["graph_capture_at_load_s"], "startup": stats.get("startup_s", {})}


def profile_startup(prompt_file: Path) -> None:
    """Where a plain greedy generate's start-up goes: the slowest imports (cumulative), then cProfile's functions by
    cumulative and by own time (the GPU's asynchronous work shows at the first synchronising call)."""
    base = ["-m", "dflash_cli", "generate", "--model", str(ROOT / "target"), "--draft", "none", "--prompt-file",
            str(prompt_file), "--max-tokens", "16", "--json", "--no-repeat-guard"]
    out = subprocess.run([sys.executable, "-X", "importtime", *base], cwd=REPO, capture_output=True, text=True,
                         env=ENV)
    rows = []
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "cumulative" not in line:
            _, cumulative, name = line.split("|")
            rows.append((int(cumulative), name.rstrip()))
    print("\nslowest imports (cumulative ms):", ", ".join(f"{n.strip()} {c / 1e3:.0f}" for c, n in
                                                      sorted(rows, reverse=True)[:20]))
    prof = Path(os.environ.get("OUT", ROOT)) / "startup.prof"
    subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), *base], cwd=REPO, capture_output=True, env=ENV)
    import pstats
    for key in ("cumulative", "tottime"):
        print(f"\ncProfile of a plain generate, by {key}:")
        pstats.Stats(str(prof)).sort_stats(key).print_stats(30 if key == "cumulative" else 20)


def chat(mode: str, temp: float, turns: int = 5, tokens: int = 200) -> list[tuple[float, float]]:
    """A scripted `dflash chat` of `turns` messages (stdin, not a terminal), each followed by /stats: (decode tok/s,
    TTFT ms) by turn, read from /stats."""
    script = "".join(f"message {i}: {prompt()}\n/stats\n" for i in range(turns))
    cmd = [sys.executable, "-m", "dflash_cli", "chat", str(ROOT / "target"), "--draft", draft(mode),
           "--max-tokens", str(tokens), "--seed", "0", "--no-repeat-guard", *sampling(temp)]
    out = subprocess.run(cmd, cwd=REPO, input=script, capture_output=True, text=True, timeout=300, env=ENV)
    text = out.stdout + out.stderr
    speeds = [float(line.split(" tok/s")[0].split("·")[-1]) for line in text.splitlines() if "last answer:" in line]
    ttfts = [float(line.split("first token ")[1].split(" ms")[0]) for line in text.splitlines()
             if "first token " in line and " ms" in line]
    if out.returncode != 0 or len(speeds) != turns:
        print(f"  chat {mode} T={temp}: rc {out.returncode}, {text.strip().splitlines()[-3:]}")
    return list(zip(speeds, ttfts))


def bench(mode: str, temp: float, prompts: Path) -> float | None:
    return run_bench(mode, ROOT / f"bench_{mode}_{temp}.json", f"T={temp}",
                     ["--model", str(ROOT / "target"), "--draft", draft(mode), "--prompts", str(prompts),
                      *sampling(temp)])


def forced_bench(mode: str, tau: float, prompt_tokens: int) -> float | None:
    """`dflash bench --synthetic` at a forced τ: MODEL's shapes and random weights, as the local checkpoints, on
    prompts of generate's length (its default, 128, would run each step over more context)."""
    return run_bench(mode, ROOT / f"bench_{mode}_tau{tau}.json", f"--synthetic τ {tau}",
                     ["--model", MODEL, "--synthetic", "--synthetic-tau", str(tau), "--draft", mode,
                      "--synthetic-prompt-len", str(prompt_tokens)])


def run_bench(mode: str, report: Path, label: str, args: list[str]) -> float | None:
    """`dflash bench ARGS` of MAX_TOKENS tokens: the mode's decode tok/s from its JSON report (None: it failed)."""
    cmd = [sys.executable, "-m", "dflash_cli", "bench", *args, "--max-tokens", str(MAX_TOKENS), "--json", str(report)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400, env=ENV)
    if out.returncode != 0:
        print(f"  bench {mode} {label}: {out.stderr.strip().splitlines()[-1:]}")
        return None
    modes = json.loads(report.read_text())["modes"]
    return next(m["decode_tok_per_s"] for m in modes if m["draft_kind"] == mode)


def stages(startup: dict) -> str:
    return " / ".join(f"{startup[k]:.2f}" for k in ("imports", "tokenizer", "weights", "graphs", "prefill")
                      if k in startup)


def main() -> None:
    t0 = time.time()
    checkpoints()
    print(f"device {torch.cuda.get_device_name()}  checkpoints in {time.time() - t0:.1f} s at {ROOT}")
    text = prompt()
    prompt_file = ROOT / "prompt.txt"
    prompt_file.write_text(text)
    prompts = ROOT / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": text}) + "\n")
    first = generate("none", 0.0, prompt_file)  # the bare machine's first run: it compiles the kernels
    print(f"first run (kernel caches cold): {first}")
    # Every mode's kernels compiled and its bytecode written once, at the table's length: after 16-token warm-ups a
    # DFlash row's graphs took 3.6 s, not 1.4 (kernels for the table's context compiled then, presumably)
    for temp in TEMPS:
        for mode in MODES:
            generate(mode, temp, prompt_file)
    if os.environ.get("PROFILE") == "1":
        profile_startup(prompt_file)
    rows = []
    for temp in TEMPS:
        for mode in MODES:
            g = generate(mode, temp, prompt_file)
            b = bench(mode, temp, prompts)
            rows.append((mode, temp, g, b))
            print(f"  {mode} T={temp}: generate {g}  bench {b}")
    print("\n| mode | T | start→first token s (imports / tokenizer / weights / graphs / prefill) | captures at load (s) | TTFT after load ms | generate tok/s | "
          "captures during | bench tok/s | generate / bench |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, temp, g, b in rows:
        if "error" in g:
            print(f"| {mode} | {temp} | error: {g['error']} | | | | | | |")
            continue
        ratio = f"{g['tok_s'] / b:.2f}" if b else "—"
        print(f"| {mode} | {temp} | {g['start_to_first_s']:.2f} ({stages(g['startup'])}) | "
              f"{g['load_captures']} ({g['load_capture_s']:.2f}) | "
              f"{1000 * g['ttft_s']:.0f} | {g['tok_s']:.1f} | {g['captures']} | {b or '—'} | {ratio} |")

    tau = float(os.environ.get("FORCED_TAU", "6"))
    if tau:
        print(f"\n| forced τ {tau:g}: mode | generate τ | generate tok/s | captures during | bench --synthetic tok/s "
              f"| generate / bench |")
        print("|---|---|---|---|---|---|")
        for mode in (m for m in MODES if m != "none"):
            g = generate(mode, 0.0, prompt_file, tau)
            if "error" in g:
                print(f"| {mode} | error: {g['error']} | | | | |")
                continue
            b = forced_bench(mode, tau, g["prompt_tokens"])
            ratio = f"{g['tok_s'] / b:.2f}" if b else "—"
            print(f"| {mode} | {g['tau']:.2f} | {g['tok_s']:.1f} | {g['captures']} | {b or '—'} | {ratio} |")

    if os.environ.get("CHAT", "1") == "1":
        print("\n| chat: mode | T | decode tok/s by turn | TTFT ms by turn | slowest / fastest turn |")
        print("|---|---|---|---|---|")
        for temp in TEMPS:
            for mode in MODES:
                turns = chat(mode, temp)
                speeds = [v for v, _ in turns]
                spread = f"{min(speeds) / max(speeds):.3f}" if speeds and max(speeds) > 0 else "—"
                print(f"| {mode} | {temp} | {', '.join(f'{v:.1f}' for v in speeds)} | "
                      f"{', '.join(f'{t:.0f}' for _, t in turns)} | {spread} |")


if __name__ == "__main__":
    main()
