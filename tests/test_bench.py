"""`dflash bench` on tiny models: all three modes, table + JSON, and --synthetic at the two exact τ ends."""

import json
import re

import pytest

from dflash_cli import tuning

from tiny import make_dflash, make_dflash2, make_eagle3, make_qwen3

BLOCK = 6  # DFlash block: 5 drafts per step
CHAIN = 4  # EAGLE-3 chain length from the registry


@pytest.fixture(scope="module")
def tiny_registry(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target = make_qwen3(root / "target", seed=3, num_hidden_layers=6)
    cfg = json.loads((target / "config.json").read_text())
    make_dflash(root / "dflash", cfg, seed=4, layers=2, block_size=BLOCK, target_layer_ids=[1, 4])
    make_eagle3(root / "eagle3", cfg, seed=5)
    make_dflash2(root / "dflash2", cfg, seed=6, layers=1, block_size=BLOCK, target_layer_ids=[1, 4],
                 layout="speculators")
    (root / "models.toml").write_text(f"""
default = "tiny"
[models.tiny]
target = "./target"
context = 512
draft_len = {CHAIN}
drafters = {{ dflash = "./dflash", dflash2 = "./dflash2", eagle3 = "./eagle3" }}
""")
    # --synthetic reads shapes shipped per registry name: give it the tiny ones.
    synth = root / "synthetic"
    synth.mkdir()
    draft_cfg = json.loads((root / "dflash" / "config.json").read_text())
    eagle_cfg = json.loads((root / "eagle3" / "config.json").read_text())
    dflash2_cfg = json.loads((root / "dflash2" / "config.json").read_text())
    (synth / "tiny.json").write_text(json.dumps({"target": cfg, "dflash": draft_cfg, "dflash2": dflash2_cfg,
                                                 "eagle3": eagle_cfg}))
    (root / "prompts.jsonl").write_text('{"prompt": "def fibonacci(n):", "category": "code"}\n'
                                        '{"prompt": "What is two plus two?"}\n')
    return root


@pytest.fixture
def registry(tiny_registry, monkeypatch):
    monkeypatch.setenv("DFLASH_REGISTRY", str(tiny_registry / "models.toml"))
    monkeypatch.setattr(tuning, "KNOBS", tuning.read())  # for the tests that call the bench directly
    monkeypatch.setattr("dflash_cli.synthetic.CONFIG_DIR", tiny_registry / "synthetic")
    return tiny_registry


def test_bench_all_three_modes_table_and_json(cli, registry, tmp_path):
    out = tmp_path / "bench.json"
    plot = tmp_path / "bench.png"
    r = cli("bench", "--draft", "dflash,eagle3,dflash2", "--prompts", registry / "prompts.jsonl", "--max-tokens",
            "12", "--json", out, "--plot", plot)
    assert r.code == 0, r.err
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for word in ("dflash bench", "tok/s", "speedup", "τ", "draft ms/step", "verify ms/step", "none", "dflash", "eagle3"):
        assert word in r.out
    rep = json.loads(out.read_text())
    assert [m["mode"] for m in rep["modes"]] == ["none", "dflash", "eagle3", "dflash2"]
    assert [m["draft_kind"] for m in rep["modes"]] == ["none", "dflash", "eagle3", "dflash2"]
    assert rep["device_type"] == "cpu" and rep["dtype"] == "float32" and "torch" in rep["versions"]
    assert rep["synthetic"] is False and len(rep["prompts"]) == 2
    for m in rep["modes"]:
        assert m["runs"] == 2 and m["decode_tok_per_s"] > 0 and m["speedup"] > 0
        assert m["generated_tokens"] > 0
    dflash, eagle = rep["modes"][1], rep["modes"][2]
    assert len(dflash["accepted_drafts_hist"]) == BLOCK  # 0..5 accepted drafts
    assert len(eagle["accepted_drafts_hist"]) == CHAIN + 1
    assert dflash["draft_ms_per_step"] > 0 and eagle["verify_ms_per_step"] > 0
    # Lossless: the same greedy tokens in every mode.
    per = rep["per_run"]
    assert [x["tokens"] for x in per["none"]] == [x["tokens"] for x in per["dflash"]] == [x["tokens"] for x in per["eagle3"]]
    assert [x["tokens"] for x in per["none"]] == [x["tokens"] for x in per["dflash2"]]
    assert len(rep["modes"][3]["accepted_drafts_hist"]) == BLOCK


@pytest.mark.parametrize("tau", [1.0, None])
def test_synthetic_forced_tau_is_what_the_label_says(cli, registry, tmp_path, tau):
    """τ = 1: every draft rejected; τ = block size: every draft accepted (30 tokens after the first = whole spans)."""
    full = BLOCK  # drafts + bonus
    tau = tau or full
    out = tmp_path / "synthetic.json"
    r = cli("bench", "--synthetic", "--synthetic-tau", tau, "--draft", "dflash,eagle3,dflash2", "--prompts",
            registry / "prompts.jsonl", "--max-tokens", "31", "--json", out)
    assert r.code == 0, r.err
    assert "SYNTHETIC" in r.out
    rep = json.loads(out.read_text())
    assert rep["synthetic"] is True and rep["synthetic_tau"] == tau
    dflash, eagle, dflash2 = rep["modes"][1], rep["modes"][2], rep["modes"][3]
    assert dflash2["draft_kind"] == "dflash2"
    if tau == 1.0:
        assert dflash["tau"] == 1.0 and eagle["tau"] == 1.0 and dflash2["tau"] == 1.0
        assert dflash["accepted_drafts_hist"][0] == sum(dflash["accepted_drafts_hist"])
    else:
        assert dflash["tau"] == float(BLOCK) and dflash2["tau"] == float(BLOCK)
        assert dflash["accepted_drafts_hist"][-1] == sum(dflash["accepted_drafts_hist"])
        assert eagle["tau"] == float(CHAIN + 1)  # forced τ is capped by the chain length


@pytest.mark.parametrize("draft", ["dflash", "eagle3"])
def test_generate_at_a_forced_tau_commits_it_through_the_product_path(cli, registry, monkeypatch, draft):
    """DFLASH_FORCE_TAU: `generate` itself at the bench's forced τ (whole spans here), its text the plain greedy one."""
    plain = cli("generate", "-p", "def fibonacci(n):", "-n", "31", "--temperature", "0", "--draft", "none", "--json")
    monkeypatch.setenv("DFLASH_FORCE_TAU", "100")
    r = cli("generate", "-p", "def fibonacci(n):", "-n", "31", "--temperature", "0", "--draft", draft, "--json")
    assert plain.code == 0 and r.code == 0, r.err
    out = json.loads(r.out)
    assert out["tokens"] == json.loads(plain.out)["tokens"]
    assert out["stats"]["tau_tokens_per_step"] == float(BLOCK if draft == "dflash" else CHAIN + 1)
    assert out["stats"]["forced_tau"] == 100.0  # marked: not the drafter's own acceptance
    plain_forced = cli("generate", "-p", "x", "-n", "2", "--draft", "none")
    assert plain_forced.code == 1 and "needs a drafter" in plain_forced.err
    monkeypatch.setenv("DFLASH_FORCE_TAU", "inf")
    bad = cli("generate", "-p", "x", "-n", "2", "--draft", draft)
    assert bad.code != 0 and "DFLASH_FORCE_TAU" in bad.err and "Traceback" not in bad.err


@pytest.mark.parametrize("draft", ["dflash", "eagle3"])
def test_the_forced_generate_times_no_first_launch(registry, draft):
    """DFLASH_FORCE_TAU: the run `generate` times launches no op (and no argmax of a shape) that its process has not
    run before, as the bench's timed runs follow its warm-up run. On a GPU a first launch loads a kernel or a Triton
    specialisation, milliseconds inside a timed decode of a few hundred (issue 47: the forced acceptance's one-row
    argmax and the forcing's remainder were first met there)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from dflash_cli.bench.forced import forced_generate
    from dflash_cli.layers import ops
    from dflash_cli.models.qwen3 import Qwen3Model
    from dflash_cli.runtime.drafters import load as load_drafter
    from dflash_cli.runtime.generation import Request, generate
    from dflash_cli.runtime.sampling import SamplingParams
    from dflash_cli.runtime.session import Session
    from dflash_cli.runtime.speculative import SpeculativeDecoder
    from dflash_cli.runtime.warmup import capture_all

    seen: dict[str, set] = {"before": set(), "timed": set()}
    phase = ["before"]

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen[phase[0]].add((func.overloadpacket.__name__, tuple(str(a.dtype) for a in args if torch.is_tensor(a))))
            return func(*args, **(kwargs or {}))

    def shaped(name, real, rows):  # the shape picks a GPU kernel's specialisation
        def run(*args):
            seen[phase[0]].add((name, tuple(args[rows].shape), tuple(a is None for a in args)))
            return real(*args)
        return run

    target = Qwen3Model.load(registry / "target")
    decoder = SpeculativeDecoder(load_drafter(draft, registry / draft, target), CHAIN if draft == "eagle3" else None)
    prompt, n = [5, 9, 2, 7, 11, 3, 8, 4, 6], 40
    with pytest.MonkeyPatch.context() as mp, Ops():
        mp.setattr(ops, "argmax_rows", shaped("argmax_rows", ops.argmax_rows, 0))
        mp.setattr(ops, "greedy_verdict", shaped("greedy_verdict", ops.greedy_verdict, 1))
        session = Session(target, len(prompt) + n + 32, path="static")  # generate's order: capture at load,
        capture_all(session, decoder, [SamplingParams()])  # then forced_generate's pre-runs, then the timed run
        forced = forced_generate(session, decoder, prompt, n, 4.0)
        phase[0] = "timed"
        res = generate(session, forced, Request(prompt, SamplingParams(), n))
    assert (len(res.tokens) - 1) / len(res.steps) > 3  # forced spans were timed
    assert seen["timed"] <= seen["before"], seen["timed"] - seen["before"]


def test_bench_bad_input_is_one_line(cli, registry, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    r = cli("bench", "--prompts", bad)
    assert r.code == 1 and r.err.startswith("error:") and r.err.count("\n") == 1
    r = cli("bench", "--synthetic-tau", "3")
    assert r.code == 1 and "--synthetic" in r.err
    r = cli("bench", "--synthetic", "--draft", "nope")
    assert r.code == 1 and r.err.startswith("error:")


def test_flags_that_cannot_work_are_refused_before_any_run(cli, registry, tmp_path, monkeypatch):
    """Before: --draft-len above the drafter's block ran clamped in silence (generate refuses it), a --plot suffix
    matplotlib cannot write failed after the whole bench, --synthetic-prompt-len without --synthetic did nothing, and
    an empty prompt in --prompts was 'the prompt is empty' without the line."""
    from dflash_cli.bench import run as bench_run

    monkeypatch.setattr(bench_run, "_run_mode", lambda *a: (_ for _ in ()).throw(AssertionError("bench ran")))
    prompts = ("--prompts", registry / "prompts.jsonl")
    for flags, needle in ((["--draft", "none,eagle3", "--draft-len", "99"], "at most"),
                          (["--plot", tmp_path / "plot.txt"], "cannot write .txt"),
                          (["--synthetic-prompt-len", "64"], "needs --synthetic")):
        r = cli("bench", *prompts, *flags)
        assert r.code == 1 and r.err.startswith("error:") and r.err.count("\n") == 1 and needle in r.err, r.err
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"prompt": "def f():"}\n{"prompt": "  "}\n')
    r = cli("bench", "--prompts", empty)
    assert r.code == 1 and r.err == f"error: {empty}:2: the prompt is empty\n"


def test_draft_len_with_plain_decoding_alone_is_a_warning(cli, registry):
    r = cli("bench", "--prompts", registry / "prompts.jsonl", "--draft", "none", "--draft-len", "3", "-n", "2")
    assert r.code == 0 and r.err.startswith("warning: --draft-len 3 is ignored"), r.err


def test_timed_runs_reuse_the_warm_up_decoders_and_graphs(registry, tmp_path, monkeypatch):
    """2 prompts × 2 repeats: one decoder (one drafter load, one set of graphs) per mode, and the
    warm-up covers every prompt, so no graph shape is first met inside a timed run. The second
    prompt ends past the first's 256-row attention window: a prompt-0-only warm-up would miss it."""
    import dflash_cli.runtime.decoders as drafters
    from dflash_cli.bench import run as bench_run
    from dflash_cli.runtime import graphs as graphs_mod
    from dflash_cli.runtime.session import Session

    made, loads, graphs_built = [], [], []
    real_make = drafters.make_decoder

    def counting_make(bundle, draft, draft_len=None):
        made.append(draft)
        return real_make(bundle, draft, draft_len)

    monkeypatch.setattr(drafters, "make_decoder", counting_make)
    real_load = drafters.load_drafter
    monkeypatch.setattr(drafters, "load_drafter", lambda kind, path, target:
                        loads.append(kind) or real_load(kind, path, target))
    real_init = graphs_mod.Graphs.__init__

    def counting_init(self, *a, **k):
        graphs_built.append(self)
        real_init(self, *a, **k)

    monkeypatch.setattr(graphs_mod.Graphs, "__init__", counting_init)
    # The static path runs the graphs' device-position forward eagerly: graph keys are built as on CUDA.
    monkeypatch.setattr(bench_run, "Session", lambda model, max_len: Session(model, max_len, path="static"))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "def fibonacci(n):"}) + "\n"
                       + json.dumps({"prompt": "count: " + " ".join(str(i) for i in range(120))}) + "\n")
    rep = bench_run.run_modes(bench_run.BenchOptions(drafts=["none", "dflash", "eagle3"], prompts=prompts,
                                                     max_tokens=12, repeat=2))
    assert sorted(made) == ["dflash", "eagle3"] and sorted(loads) == ["dflash", "eagle3"]
    assert len(graphs_built) == 1 + 2 + 2  # target; per drafter (DFlash, EAGLE-3): proposal + absorb
    lengths = [p["prompt_tokens"] for p in rep["prompts"]]
    assert lengths[0] + 12 + BLOCK < 256 < lengths[1]
    eng = rep["engine"]
    assert eng["path"] == "static"
    assert eng["graph_shapes_timed"] == 0 and eng["graph_captures_timed"] == 0 and eng["graph_captures"] == 0
    assert all(m["runs"] == 4 and m["graph_captures_timed"] == 0 for m in rep["modes"])
    per = rep["per_run"]
    assert [x["tokens"] for x in per["none"]] == [x["tokens"] for x in per["dflash"]] == [x["tokens"] for x in per["eagle3"]]


def test_synthetic_empty_prompt_is_one_error_line(cli, registry):
    r = cli("bench", "--synthetic", "--synthetic-prompt-len", "0", "--max-tokens", "2", "--draft", "dflash")
    assert r.code == 1 and r.err.startswith("error:") and r.err.count("\n") == 1 and "--synthetic-prompt-len" in r.err, r.err


def test_forced_proposals_are_the_sequence_then_one_wrong_token():
    """The synthetic bench's forcing, sliced on the device: n tokens of the known continuation, then that
    continuation's next token + 1 (mod the vocabulary), then the drafter's own; cut short where the sequence
    ends."""
    from types import SimpleNamespace

    import torch

    from dflash_cli.bench.forced import ForcedAcceptance

    seq, vocab = [5, 9, 2, 7, 0, 3, 8], 10
    inner = SimpleNamespace(kind="dflash", capture=(1,), max_draft=4, prefix_drafts=False)
    forced = ForcedAcceptance(inner, seq, tau=1.0, vocab_size=vocab)
    drafts = torch.tensor([40, 41, 42, 43])
    for pos, n in ((0, 0), (0, 2), (1, 4), (3, 3), (4, 2), (5, 4), (6, 1)):
        forced._n_right = lambda k, n=n: n
        got, _ = forced._force(pos, 4, drafts, None)
        truth = seq[pos + 1 : pos + 1 + min(n + 1, 4)]
        head = truth[:n] + [(t + 1) % vocab for t in truth[n:]]
        assert got.tolist() == head + drafts.tolist()[len(head):], (pos, n)
        assert forced.forced == n


# Issue 43: Ctrl-C, output paths, --synthetic's memory and progress, the demo's own prompt set.

def test_ctrl_c_stops_the_bench_and_no_cut_short_run_is_tabled(cli, registry, tmp_path, monkeypatch):
    """Before: Ctrl-C ended one generation; the bench went on, exited 0 and tabled the cut-short runs."""
    from dflash_cli.bench import run as bench_run

    real, calls = bench_run.generate, []

    def ctrl_c_on_third(session, decoder, req, on_step=None):
        calls.append(1)
        if len(calls) == 3:
            def on_step(step):
                raise KeyboardInterrupt
        return real(session, decoder, req, on_step=on_step)

    monkeypatch.setattr(bench_run, "generate", ctrl_c_on_third)
    out = tmp_path / "b.json"
    r = cli("bench", "--prompts", registry / "prompts.jsonl", "--max-tokens", "4", "--repeat", "3", "--json", out)
    assert r.code == 130 and r.err.strip() == "interrupted" and len(calls) == 3
    assert "tok/s" not in r.out and not out.exists()


def test_ctrl_c_keeps_the_modes_that_finished(cli, registry, tmp_path, monkeypatch):
    """Before: Ctrl-C during the third mode printed only `interrupted` and threw away the two modes measured."""
    from dflash_cli.bench import run as bench_run

    real, calls = bench_run.generate, []

    def ctrl_c_in_eagle3(session, decoder, req, on_step=None):
        calls.append(decoder.kind)
        if calls.count("eagle3") == 3:  # its warm-up (2 prompts) done, in its first timed run
            def on_step(step):
                raise KeyboardInterrupt
        return real(session, decoder, req, on_step=on_step)

    monkeypatch.setattr(bench_run, "generate", ctrl_c_in_eagle3)
    out = tmp_path / "b.json"
    r = cli("bench", "--draft", "dflash,eagle3", "--prompts", registry / "prompts.jsonl", "--max-tokens", "4",
            "--json", out)
    assert r.code == 130, r.err
    assert r.err.strip() == ("interrupted during eagle3 (0 of 2 timed runs done): the figures are the modes that "
                             "finished")
    table = r.out.split("engine:")[0]
    assert re.search(r"│ none ", table) and re.search(r"│ dflash ", table) and "eagle3" not in table
    rep = json.loads(out.read_text())
    assert [m["mode"] for m in rep["modes"]] == ["none", "dflash"]
    assert rep["interrupted"] == {"mode": "eagle3", "timed_runs_done": 0, "timed_runs": 2}


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_output_paths_are_checked_before_the_first_run(cli, registry, tmp_path, monkeypatch, flag):
    """Before: an unwritable --json/--plot path failed only after the whole bench."""
    from dflash_cli.bench import run as bench_run

    monkeypatch.setattr(bench_run, "BenchTarget", lambda o: (_ for _ in ()).throw(AssertionError("bench ran")))
    r = cli("bench", flag, tmp_path / "missing" / "out.x")
    assert r.code == 1 and r.err.startswith("error: cannot write " + flag) and "no such folder" in r.err
    r = cli("bench", flag, tmp_path)
    assert r.code == 1 and "is a folder" in r.err


def test_synthetic_says_what_memory_it_needs_and_shows_warm_up_progress(cli, registry, tmp_path, monkeypatch):
    """Before: --synthetic on CPU allocated 16-18 GB without a word and showed nothing during its warm-up."""
    from dflash_cli.bench import run as bench_run
    from dflash_cli.commands import bench as bench_cmd

    r = cli("bench", "--synthetic", "--draft", "dflash", "--prompts", registry / "prompts.jsonl", "--max-tokens", "3")
    assert r.code == 0, r.err
    assert re.search(r"random float32 weights of the target need [\d.]+ GB of cpu memory", r.out)
    monkeypatch.setattr(bench_cmd, "_available_memory", lambda: 1000)
    r = cli("bench", "--synthetic", "--draft", "dflash", "--prompts", registry / "prompts.jsonl", "--max-tokens", "3")
    assert r.code == 1 and "only 0.0 GB is available" in r.err
    seen = []
    bench_run.run_modes(bench_run.BenchOptions(draft="dflash", synthetic=True, prompts=registry / "prompts.jsonl",
                                               max_tokens=3), on_progress=lambda *a: seen.append(a))
    assert ("none warm-up", 1, 2) in seen and ("dflash warm-up", 2, 2) in seen and ("dflash", 2, 2) in seen


def test_demo_bench_uses_its_own_python_prompts(cli, tmp_path):
    """Before: the demo (it only knows Python) was benched on chat/math/summarisation prompts."""
    from dflash_cli.bench.run import BUILTIN_PROMPTS, load_prompts
    from dflash_cli.registry import Registry

    demo = Registry.load().entries["demo"]
    assert demo.bench_prompts and demo.bench_prompts.is_file() and demo.bench_prompts != BUILTIN_PROMPTS
    assert Registry.load().entries["qwen3-4b"].bench_prompts is None  # general models: the built-in mix
    out = tmp_path / "demo.json"
    r = cli("bench", "--max-tokens", "2", "--json", out)
    assert r.code == 0, r.err
    rep = json.loads(out.read_text())
    assert [p["category"] for p in rep["prompts"]] == [p["category"] for p in load_prompts(demo.bench_prompts)]
    assert "chat" not in {p["category"] for p in rep["prompts"]}


def test_draft_kinds_in_any_case_run_once():
    """`--draft NONE,EAGLE3,eagle3` is plain decoding once, then EAGLE-3 once (NONE ran plain decoding twice)."""
    from dflash_cli.options import BenchOptions

    assert BenchOptions(draft="NONE,EAGLE3,eagle3,dflash").drafts == ["none", "eagle3", "dflash"]


def test_a_reader_gone_before_the_table_costs_no_file_and_no_exit_code(tmp_path):
    """Before: `dflash bench --json F | head -1` exited 1 without a word (Rich's answer to a closed pipe) before
    writing F."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f():"}\n')
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-m", "dflash_cli", "bench", "--prompts", prompts, "-n", "2", "--draft",
                              "none", "--device", "cpu", "--json", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env)
    child.stdout.close()  # the reader is gone before the table comes
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == 0 and err == "", err
    assert json.loads(out.read_text())["modes"][0]["mode"] == "none"
