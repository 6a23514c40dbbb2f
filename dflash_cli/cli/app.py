"""The `dflash` command line: each command parses its flags and calls one function."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ..errors import DflashError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Local LLM inference with speculative decoding (DFlash, EAGLE-3).")

MODEL = typer.Option(None, "--model", "-m", help="Registry name, local folder or Hub repo id.")
DEVICE = typer.Option(None, help="cpu, cuda or cuda:N (default: cuda if available).")
DTYPE = typer.Option(None, help="bfloat16, float16 or float32 (default: bf16 on GPU, fp32 on CPU).")
TEMP = typer.Option(None, help="0 = greedy (default: the model's recommended value).")
TOP_P = typer.Option(None, "--top-p")
TOP_K = typer.Option(None, "--top-k")
DRAFT = typer.Option(None, "--draft", help="none, dflash, eagle3, or a drafter folder / Hub repo (default: dflash if registered).")
DRAFT_LEN = typer.Option(None, "--draft-len", help="Draft tokens per step (default: the drafter's block or the registry's).")
SHOW_DRAFTS = typer.Option(False, "--show-drafts", help="Colour tokens that came from accepted drafts.")
THINK = typer.Option(None, "--think/--no-think", help="Qwen3 thinking mode (default: the template's).")
URL = typer.Option(None, "--url", help="Use an OpenAI-compatible server (dflash serve, vLLM, SGLang) at this URL.")
API_KEY = typer.Option(None, "--api-key", envvar="DFLASH_API_KEY", help="The --url server's API key.")


def _console(min_width: int | None = None) -> Console:
    console = Console(highlight=False)
    if min_width and not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = max(console.width, min_width)  # a table saved to a file should not wrap its columns
    return console


@app.command()
def generate(
    model: Optional[str] = MODEL,
    prompt: Optional[str] = typer.Option(None, "--prompt", "-p"),
    prompt_file: Optional[Path] = typer.Option(None, "--prompt-file", "-f"),
    system: Optional[str] = typer.Option(None, "--system"),
    raw: bool = typer.Option(False, "--raw", help="Tokenize the prompt as is: no template, no special tokens added."),
    think: Optional[bool] = THINK,
    temperature: Optional[float] = TEMP,
    top_p: Optional[float] = TOP_P,
    top_k: Optional[int] = TOP_K,
    max_tokens: int = typer.Option(512, "--max-tokens", "-n"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = DTYPE,
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of the stream."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write one JSON line per decoding step."),
    draft: Optional[str] = DRAFT,
    draft_len: Optional[int] = DRAFT_LEN,
    show_drafts: bool = SHOW_DRAFTS,
    url: Optional[str] = URL,
    api_key: Optional[str] = API_KEY,
):
    """Generate one answer to a prompt (--prompt, --prompt-file or stdin)."""
    from ..commands.generate import GenerateOptions, run_generate

    run_generate(GenerateOptions(model, prompt, prompt_file, system, raw, think, temperature, top_p, top_k,
                                 max_tokens, seed, device, dtype, json_out, trace, draft, draft_len,
                                 show_drafts, url=url, api_key=api_key), _console())


@app.command()
def chat(
    model: Optional[str] = typer.Argument(None, help="Registry name, local folder or Hub repo id."),
    system: Optional[str] = typer.Option(None, "--system"),
    think: Optional[bool] = THINK,
    temperature: Optional[float] = TEMP,
    top_p: Optional[float] = TOP_P,
    top_k: Optional[int] = TOP_K,
    max_tokens: int = typer.Option(2048, "--max-tokens", "-n", help="Longest single answer."),
    seed: Optional[int] = typer.Option(None, "--seed"),
    context: Optional[int] = typer.Option(None, "--context", help="KV cache size in tokens."),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = DTYPE,
    draft: Optional[str] = DRAFT,
    draft_len: Optional[int] = DRAFT_LEN,
    show_drafts: bool = SHOW_DRAFTS,
    url: Optional[str] = URL,
    api_key: Optional[str] = API_KEY,
):
    """Interactive chat; the conversation stays in the KV cache between turns."""
    from ..commands.chat import ChatOptions, run_chat

    run_chat(ChatOptions(model, system, think, temperature, top_p, top_k, max_tokens, seed, context, device, dtype,
                         draft, draft_len, show_drafts, url=url, api_key=api_key),
             _console())


@app.command()
def models():
    """List registry entries and what is downloaded."""
    from ..commands.models import list_models

    list_models(_console())


@app.command()
def pull(
    model: Optional[str] = typer.Argument(None, help="Registry name or Hub repo id (default: the registry's default)."),
    drafters: bool = typer.Option(True, "--drafters/--no-drafters", help="Also download the drafters."),
):
    """Download a model and its drafters (resumes interrupted downloads)."""
    from ..commands.models import pull as do_pull

    do_pull(model, drafters, _console())


@app.command()
def bench(
    model: Optional[str] = MODEL,
    draft: str = typer.Option("none,dflash", "--draft", help="Comma-separated modes: none, dflash, eagle3, drafter paths/repos."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="JSONL file, one {\"prompt\": ...} per line (default: built-in set)."),
    max_tokens: int = typer.Option(256, "--max-tokens", "-n"),
    temperature: float = typer.Option(0.0, "--temperature"),
    repeat: int = typer.Option(1, "--repeat"),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = DTYPE,
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write all figures to this JSON file."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw tok/s and accepted-length histograms (PNG)."),
    synthetic: bool = typer.Option(False, "--synthetic", help="Random weights with the entry's exact shapes; no download."),
    synthetic_tau: Optional[float] = typer.Option(None, "--synthetic-tau", help="Force this mean committed length."),
    draft_len: Optional[int] = DRAFT_LEN,
    synthetic_prompt_len: int = typer.Option(128, "--synthetic-prompt-len", help="Prompt length (tokens) with --synthetic."),
):
    """Compare plain decoding and drafters on the same prompts."""
    from ..commands.bench import run_bench
    from ..bench.run import BenchOptions, parse_drafts

    run_bench(BenchOptions(model, parse_drafts(draft), prompts, max_tokens, temperature, repeat, device, dtype,
                           json_file, plot, synthetic, synthetic_tau, draft_len=draft_len, synthetic_prompt_len=synthetic_prompt_len),
              _console(min_width=160))


@app.command()
def train(
    out: Path = typer.Argument(Path("dflash-demo"), help="Output folder (rerun to resume)."),
    preset: str = typer.Option("demo", "--preset", help="demo (what ships, wants a GPU) or tiny (seconds on a CPU)."),
    data: list[Path] = typer.Option([], "--data", help="Folders of Python source (default: this Python's standard library)."),
    device: Optional[str] = DEVICE,
    seed: int = typer.Option(0, "--seed"),
    stages: Optional[str] = typer.Option(None, "--stages", help="Comma-separated subset of: tokenizer,target,distill,dflash,eagle3,evaluate."),
):
    """Train the demo pair: a tokenizer, a small Qwen3 target on Python source, and its DFlash and EAGLE-3 drafters."""
    from ..commands.train import TrainOptions, run_train

    run_train(TrainOptions(out, preset, list(data), device, seed, stages), _console())


@app.command()
def serve(
    model: Optional[str] = typer.Argument(None, help="Registry name, local folder or Hub repo id."),
    draft: Optional[str] = DRAFT,
    draft_len: Optional[int] = DRAFT_LEN,
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8000, "--port"),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require 'Authorization: Bearer KEY'."),
    max_queue: int = typer.Option(16, "--max-queue", help="Requests that may wait behind the running one; more get 503."),
    context: Optional[int] = typer.Option(None, "--context", help="KV cache size in tokens."),
    device: Optional[str] = DEVICE,
    dtype: Optional[str] = DTYPE,
    engine: str = typer.Option("dflash", "--engine", help="dflash (this engine), or vllm / sglang: launch that server."),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", help="GPUs (vllm, sglang)."),
    print_only: bool = typer.Option(False, "--print", help="Print the vllm / sglang command instead of running it."),
):
    """OpenAI-compatible server (/v1/completions, /v1/chat/completions, /metrics), one request at a time."""
    from ..commands.serve import ServeOptions, run_serve

    run_serve(ServeOptions(model, draft, draft_len, host, port, api_key, max_queue, device, dtype, context, engine,
                           tensor_parallel, print_only))


def main() -> None:
    """Entry point: user-facing errors become one line on stderr and exit 1; Ctrl-C exits 130."""
    # torch warns at import where NumPy is not installed (the CPU wheel does not require it); nothing here uses NumPy.
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    try:
        code = app(standalone_mode=False)
    except DflashError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors and anything unforeseen: still one line
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # click usage errors (typer may vendor click)
            if exc.format_message():
                print(f"error: {exc.format_message()}", file=sys.stderr)
            sys.exit(exc.exit_code)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        if os.environ.get("DFLASH_DEBUG"):
            raise
        print(f"error: {type(exc).__name__}: {exc} (set DFLASH_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(1)
    # Without standalone mode typer returns, not raises, the exit code of a Ctrl-C (130) or typer.Exit.
    if isinstance(code, int) and code:
        if code == 130:
            print("\ninterrupted", file=sys.stderr)
        sys.exit(code)
