"""Every command's flags, declared once: each options dataclass field carries its Typer option.

`command(Options, "module:function")` turns a dataclass into a Typer command whose parameters are
the fields that carry a Typer option; the command builds the dataclass by keyword and calls the
function. This module imports only typer (no torch): `dflash --help` stays fast.
"""

import dataclasses
import importlib
import inspect
import os
from pathlib import Path
from typing import Annotated, Callable, Optional, get_args, get_origin, get_type_hints

import typer
from typer.models import ParameterInfo

# Shared option definitions (used by several commands).
Model = Annotated[Optional[str], typer.Option("--model", "-m", help="Registry name, local folder or Hub repo id.")]
Device = Annotated[Optional[str], typer.Option("--device", help="cpu, cuda or cuda:N (default: cuda if available).")]
Dtype = Annotated[Optional[str], typer.Option("--dtype", help="bfloat16, float16 or float32 (default: bf16 on GPU, fp32 on CPU).")]
Temperature = Annotated[Optional[float], typer.Option("--temperature", help="0 = greedy (default: the model's recommended value).")]
TopP = Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling: keep the smallest set of tokens whose probability reaches this (0 < p <= 1).")]
TopK = Annotated[Optional[int], typer.Option("--top-k", help="Sample among the K most likely tokens only (0 = all).")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="Random seed for sampling (same seed, same answer).")]
System = Annotated[Optional[str], typer.Option("--system", help="System prompt placed before the conversation.")]
Think = Annotated[Optional[bool], typer.Option("--think/--no-think", help="Qwen3 thinking mode (default: the template's).")]
Draft = Annotated[Optional[str], typer.Option("--draft", help="none, dflash, dflash2, eagle3, mtp (a Qwen3.5 model's own MTP layer), or a drafter folder / Hub repo (default: dflash if registered).")]
DraftLen = Annotated[Optional[int], typer.Option("--draft-len", help="Draft tokens per step, up to the drafter's maximum (default: the drafter's block or the registry's).")]
ShowDrafts = Annotated[bool, typer.Option("--show-drafts", help="Colour tokens that came from accepted drafts.")]
Threads = Annotated[Optional[int], typer.Option("--threads", help="CPU threads for torch (default: 1 for small models, else the physical cores available).")]
RepeatGuard = Annotated[bool, typer.Option("--repeat-guard/--no-repeat-guard", help="Stop an answer that loops (the same lines or tokens over and over).")]
Url = Annotated[Optional[str], typer.Option("--url", help="Use an OpenAI-compatible server (dflash serve, vLLM, SGLang) at this URL instead of the local engine.")]
ApiKey = Annotated[Optional[str], typer.Option("--api-key", envvar="DFLASH_API_KEY", help="The server's API key (with --url).")]
Context = Annotated[Optional[int], typer.Option("--context", help="KV cache size in tokens (default: the model's context; 4096 at most on CPU for chat).")]


@dataclasses.dataclass
class GenerateOptions:
    """Generate one answer to a prompt (--prompt, --prompt-file or stdin)."""

    model: Model = None
    prompt: Annotated[Optional[str], typer.Option("--prompt", "-p", help="The prompt text.")] = None
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file", "-f", help="Read the prompt from this file ('-': stdin).")] = None
    system: System = None
    raw: Annotated[bool, typer.Option("--raw", help="Tokenize the prompt as is: no template, no special tokens added.")] = False
    think: Think = None
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Longest answer in tokens; an answer also ends where the context is full (finish reason 'context').")] = 512
    stop: Annotated[Optional[list[str]], typer.Option("--stop", metavar="<text>", help="End the answer where this text appears, which is not printed (repeatable).")] = None
    seed: Seed = None
    context: Annotated[Optional[int], typer.Option("--context", help="KV cache size in tokens: prompt and answer together (default: the model's context).")] = None
    device: Device = None
    dtype: Dtype = None
    threads: Threads = None
    json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of the stream.")] = False
    stats: Annotated[bool, typer.Option("--stats", help="Print the final statistics to stderr (the terminal shows them in the footer anyway).")] = False
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Write one JSON line per decoding step.")] = None
    draft: Draft = None
    draft_len: DraftLen = None
    show_drafts: ShowDrafts = False
    repeat_guard: RepeatGuard = True
    url: Url = None
    api_key: ApiKey = None


@dataclasses.dataclass
class ChatOptions:
    """Interactive chat; the conversation stays in the KV cache between turns."""

    model: Annotated[Optional[str], typer.Argument(help="Registry name, local folder or Hub repo id.")] = None
    system: System = None
    think: Think = None
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    max_tokens: Annotated[Optional[int], typer.Option("--max-tokens", "-n", help="Longest single answer (default: half the context, at most 2048).")] = None
    seed: Seed = None
    context: Context = None
    device: Device = None
    dtype: Dtype = None
    threads: Threads = None
    draft: Draft = None
    draft_len: DraftLen = None
    show_drafts: ShowDrafts = False
    repeat_guard: RepeatGuard = True
    history: Annotated[Optional[Path], typer.Option("--history", help="Input history file (default: chat_history in the user's data folder).")] = None
    url: Url = None
    api_key: ApiKey = None
    # generate and bench take --model: the same words work here.
    model_option: Annotated[Optional[str], typer.Option("--model", "-m", help="The same as MODEL.")] = None

    def __post_init__(self):
        if self.model_option is not None:
            if self.model is not None and self.model != self.model_option:
                from .errors import DflashError

                raise DflashError(f"two models given: {self.model} and --model {self.model_option}")
            self.model = self.model_option


SYNTHETIC_PROMPT_LEN = 128  # bench --synthetic's default prompt: a short chat turn's length


@dataclasses.dataclass
class BenchOptions:
    """Compare plain decoding and drafters on the same prompts."""

    model: Model = None
    draft: Annotated[str, typer.Option("--draft", help="Comma-separated modes: none, dflash, dflash2, eagle3, mtp, drafter paths/repos.")] = "none,dflash"
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="JSONL file, one {\"prompt\": ...} per line (default: the model's own set, else a built-in mix).")] = None
    max_tokens: Annotated[int, typer.Option("--max-tokens", "-n", help="Tokens generated per prompt and run.")] = 256
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy (bench default).")] = 0.0
    top_p: TopP = None
    top_k: TopK = None
    repeat: Annotated[int, typer.Option("--repeat", help="Timed runs per prompt (after one untimed warm-up run).")] = 1
    device: Device = None
    dtype: Dtype = None
    threads: Threads = None
    json: Annotated[Optional[Path], typer.Option("--json", help="Write all figures to this JSON file.")] = None
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Draw tok/s and accepted-length histograms (PNG).")] = None
    synthetic: Annotated[bool, typer.Option("--synthetic", help="Random weights with the entry's exact shapes; no download.")] = False
    synthetic_tau: Annotated[Optional[float], typer.Option("--synthetic-tau", help="Force this mean committed length.")] = None
    draft_len: DraftLen = None
    synthetic_prompt_len: Annotated[Optional[int], typer.Option("--synthetic-prompt-len", help=f"Prompt length (tokens) with --synthetic (default: {SYNTHETIC_PROMPT_LEN}).")] = None
    # Not flags: set by callers (tests, scripts).
    drafts: Optional[list] = None  # parsed --draft; plain decoding first
    seed: int = 0

    def __post_init__(self):
        if self.drafts is None:
            from .errors import DflashError

            from .registry import draft_kind

            items = [draft_kind(t) or t.strip() for t in self.draft.split(",") if t.strip()]  # NONE is none
            if not items:
                raise DflashError("--draft needs at least one mode (none, dflash, dflash2, eagle3, or a drafter path/repo)")
            # Plain decoding is the baseline every speedup is measured against: always run it first.
            self.drafts = ["none"] + [d for d in dict.fromkeys(items) if d != "none"]


@dataclasses.dataclass
class ServeOptions:
    """OpenAI-compatible server (/v1/completions, /v1/chat/completions, /metrics), one request at a time."""

    model: Annotated[Optional[str], typer.Argument(help="Registry name, local folder or Hub repo id.")] = None
    draft: Draft = None
    draft_len: DraftLen = None
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1"
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8000
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="Require 'Authorization: Bearer KEY'.")] = None
    max_queue: Annotated[int, typer.Option("--max-queue", help="Requests that may wait behind the running one; more get 503.")] = 16
    device: Device = None
    dtype: Dtype = None
    context: Annotated[Optional[int], typer.Option("--context", help="KV cache size in tokens.")] = None
    engine: Annotated[str, typer.Option("--engine", help="dflash (this engine), or vllm / sglang: launch that server.")] = "dflash"
    tensor_parallel: Annotated[int, typer.Option("--tensor-parallel", help="GPUs (vllm, sglang).")] = 1
    print_only: Annotated[bool, typer.Option("--print", help="Print the vllm / sglang command instead of running it.")] = False


@dataclasses.dataclass
class TrainOptions:
    """Train the demo pair: a tokenizer, a small Qwen3 target on Python source, and its DFlash and EAGLE-3 drafters."""

    out: Annotated[Path, typer.Argument(help="Output folder (rerun to resume).")] = Path("dflash-demo")
    preset: Annotated[str, typer.Option("--preset", help="demo (what ships, wants a GPU) or tiny (seconds on a CPU).")] = "demo"
    data: Annotated[list[Path], typer.Option("--data", metavar="<path>", help="A folder of Python source; repeat for more (default: this Python's standard library).")] = dataclasses.field(default_factory=list)
    device: Device = None
    seed: Annotated[int, typer.Option("--seed", help="Random seed for data order and initial weights.")] = 0
    stages: Annotated[Optional[str], typer.Option("--stages", help="Comma-separated subset of: tokenizer,target,distill,dflash,block,eagle3,evaluate.")] = None
    time_limit: Annotated[Optional[float], typer.Option("--time-limit", help="Seconds after which training stops at its next resumable point (rerun to resume).")] = None


def _flags_show_no_value() -> None:
    """typer's rich help (0.2x) prints a value type beside flags, which take none (`--json <bool>`, `--help <bool>`):
    flags show none."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "flags_show_none", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.flags_show_none = True
    TyperOption.display_type_rich = display_type_rich


_flags_show_no_value()


def _typer_info(annotation) -> bool:
    return get_origin(annotation) is Annotated and any(isinstance(a, ParameterInfo) for a in get_args(annotation)[1:])


def command(options_cls, runner: str, console: Callable) -> Callable:
    """A Typer command function for `options_cls`: its flags are the dataclass fields that carry a Typer option;
    it builds the options by keyword and calls `runner` ("module:function", imported on use) with them and a console."""
    hints = get_type_hints(options_cls, include_extras=True)
    params, annotations = [], {}
    for f in dataclasses.fields(options_cls):
        if not _typer_info(hints[f.name]):
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[f.name]))
        annotations[f.name] = hints[f.name]

    def run(**kwargs):
        module, name = runner.split(":")
        fn = getattr(importlib.import_module(module), name)
        return fn(options_cls(**kwargs), console())

    run.__signature__ = inspect.Signature(params)
    run.__annotations__ = annotations
    run.__doc__ = options_cls.__doc__
    run.__name__ = options_cls.__name__
    return run


def data_dir() -> Path:
    """The user's data folder for dflash ($XDG_DATA_HOME/dflash, ~/.local/share/dflash)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "dflash"
