"""The demo training code: its batched training forwards compute exactly what the engine runs at
inference (so the objectives train the real thing), and the pipeline is deterministic, resumable
and writes checkpoints the loaders (ours and the references) accept."""

import json
import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

from dflash_cli.models.dflash import DFlashDrafter
from dflash_cli.models.dflash2 import DFlash2Drafter
from dflash_cli.models.eagle3 import Eagle3Drafter
from dflash_cli.models.qwen3 import Qwen3Model
from dflash_cli.runtime.drafters.dflash import DFlashProposer
from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
from dflash_cli.training import dflash as dflash_stage
from dflash_cli.training import eagle3 as eagle3_stage
from dflash_cli.training import pipeline, presets
from dflash_cli.training import target as target_stage
from dflash_cli.training.spans import CausalBatch
from tiny import make_dflash, make_eagle3, make_qwen3

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-forward")
    tdir = make_qwen3(root / "t", seed=3, num_hidden_layers=5)
    cfg = json.loads((tdir / "config.json").read_text())
    target = Qwen3Model.load(tdir)
    dflash = DFlashDrafter.load(make_dflash(root / "d", cfg, block_size=5, target_layer_ids=[1, 3]), target)
    eagle = Eagle3Drafter.load(make_eagle3(root / "e", cfg, draft_vocab=384), target)
    return target, dflash, eagle


def test_batched_target_forward_equals_engine_forward(models):
    target = models[0]
    seqs = torch.randint(0, 300, (3, 17), generator=torch.Generator().manual_seed(0))
    out = target.run(seqs.reshape(-1), CausalBatch(3, 17, target.cos, target.sin), (2,), True)
    for i in range(3):
        ref = target.forward(seqs[i], 0, target.new_cache(32), capture=(2,), all_logits=True)
        assert rel_err(out.logits.reshape(3, 17, -1)[i], ref.logits) < 1e-5
        assert rel_err(out.hidden.reshape(3, 17, -1)[i], ref.hidden) < 1e-5


def test_dflash_training_blocks_equal_inference_drafts(models):
    target, drafter = models[0], models[1]
    size = drafter.block_size
    seqs = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    anchors = torch.tensor([[0, 7, 15], [3, 9, 11]])
    logits = dflash_stage.block_logits(drafter, seqs, anchors)
    run = DFlashProposer(drafter)
    for i in range(2):
        hidden = target.forward(seqs[i], 0, target.new_cache(32), capture=drafter.capture).hidden
        for j, a in enumerate(anchors[i].tolist()):
            run.reset(64)
            if a:
                run.absorb(hidden[:a], 0)
            ref = run.draft_logits(int(seqs[i, a]), size - 1)
            assert rel_err(logits[i, j], ref) < 1e-5


def test_eagle3_training_time_test_equals_inference_chain(models):
    target, drafter = models[0], models[2]
    steps = 4
    seqs = torch.randint(0, 300, (2, 22), generator=torch.Generator().manual_seed(2))
    per_step = list(eagle3_stage.step_logits(drafter, seqs, steps))
    run = Eagle3Proposer(drafter)
    for i in range(2):
        hidden = target.forward(seqs[i], 0, target.new_cache(32), capture=drafter.capture).hidden
        for c in (1, 6, 15):  # committed target positions; the chain starts from token c
            run.reset(64)
            run.absorb(hidden[:c], 0, seqs[i, :c].tolist())
            pos, state = run.first_state()
            for j in range(steps):
                # Forced to the sequence's tokens, as when every earlier draft was accepted.
                logits, state = run.chain_step(pos + j, state, int(seqs[i, c + j]))
                assert rel_err(per_step[j][i, c - 1 + j], logits) < 1e-5, (i, c, j)


def test_eagle3_taps_of_a_preset_are_written_where_the_loader_reads_them(models, tmp_path):
    from dataclasses import replace

    from dflash_cli.models.eagle3 import Eagle3Config

    target = models[0]
    for taps, expect in (((), [2, 2, 2]), ((1, 3, 4), [1, 3, 4])):  # () is the paper's 2, L/2, L-3 (L = 5)
        raw = eagle3_stage.config(replace(presets.TINY, hidden=target.cfg.hidden_size, vocab_size=target.cfg.vocab_size,
                                           eagle3_layers=taps))
        assert Eagle3Config(raw, tmp_path / "config.json", target.cfg).aux_layers == expect


def small_corpus(tmp: Path) -> Path:
    """A few stdlib packages copied aside: the tests' training data."""
    root = tmp / "data"
    for pkg in ("json", "email"):
        shutil.copytree(STDLIB / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return root


FAST = ("tokenizer", "target", "distill", "dflash", "eagle3")  # no timed stages: the block choice and evaluation


def run_tiny(out: Path, data: Path, report=lambda *a: None, stages=pipeline.STAGES, time_limit=None,
             note=lambda msg: None):
    preset = presets.TINY
    return pipeline.train_demo(out, preset, [data], torch.device("cpu"), 0, report, note, stages, time_limit)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train-pipeline")
    data = small_corpus(tmp)
    info = run_tiny(tmp / "a", data)
    return tmp, data, info


def test_pipeline_writes_published_layouts_that_load(trained):
    tmp, _, info = trained
    out = tmp / "a"
    for d in ("target", "dflash", "dflash2", "eagle3"):
        assert (out / d / "config.json").is_file() and (out / d / "model.safetensors").is_file()
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / "target" / f).is_file()
    target = Qwen3Model.load(out / "target")
    DFlashDrafter.load(out / "dflash", target)
    DFlash2Drafter.load(out / "dflash2", target)
    Eagle3Drafter.load(out / "eagle3", target)
    # The selector stage's drafter is the shipped DFlash drafter with identity convolutions and a selector: loaded as
    # DFlash (its block drafter alone) it is that drafter, tensor for tensor.
    from dflash_cli.models.dflash2 import load_block_drafter
    from dflash_cli.training.params import dflash_tensors

    block = dflash_tensors(DFlashDrafter.load(out / "dflash", target))
    with_selector = dflash_tensors(load_block_drafter(out / "dflash2", target))
    assert block.keys() == with_selector.keys() and all(torch.equal(block[k], with_selector[k]) for k in block)
    saved = json.loads((out / "training_info.json").read_text())
    assert saved["data"]["files"] > 10
    # Every stage says how long it took and where; the evaluation ran on the demo's one CPU thread.
    assert set(saved["stages"]) == {"data", "target", "distill", "dflash-b4", "dflash-b3", "block", "selector", "eagle3",
                                    "evaluate"}
    assert all(s["finished"] and s["seconds"] >= 0 and s["device"] for s in saved["stages"].values())
    assert saved["stages"]["evaluate"]["device"] == "cpu (1 thread)"
    # The block size is chosen between the candidates and the chosen drafter ships with it.
    choice = saved["block_choice"]
    assert set(choice["candidates"]) == {"4", "3"} and choice["chosen"] in (4, 3)
    assert json.loads((out / "dflash" / "config.json").read_text())["block_size"] == choice["chosen"]
    assert (out / "dflash" / "model.safetensors").read_bytes() == \
        (out / "work" / f"dflash-b{choice['chosen']}" / "model.safetensors").read_bytes()
    # τ per category, greedy and at T 0.6, for both drafters; greedy speculation equals plain decoding.
    ev = info["evaluation"]
    assert set(ev["temperatures"]) == {"T=0.0", "T=0.6"} and ev["threads"] == 1
    assert set(ev["categories"]) >= {"function body", "class body", "file start"}
    for t, modes in ev["temperatures"].items():
        assert set(modes) == {"none", "dflash", "dflash2", "eagle3"}
        for kind in ("dflash", "dflash2", "eagle3"):
            assert set(modes[kind]["by_category"]) == set(ev["categories"])
            assert modes[kind]["mean_accepted"] >= 1
            if t == "T=0.0":
                assert modes[kind]["lossless"]


def test_pipeline_is_deterministic_and_resumes_exactly(trained):
    tmp, data, _ = trained

    class Stop(Exception):
        pass

    def stop_at_step_4(stage, step, total, metrics):
        if stage == "target" and step == 4:
            raise Stop

    with pytest.raises(Stop):
        run_tiny(tmp / "b", data, report=stop_at_step_4, stages=FAST)
    assert not (tmp / "b" / "target" / "model.safetensors").exists()
    # Then a zero time limit: every run stops after one step (or one distillation part) of the first unfinished
    # stage, saved, and the next run resumes there.
    pauses = []
    for _ in range(40):
        info = run_tiny(tmp / "b", data, stages=FAST, time_limit=0)
        if "paused" not in info:
            break
        pauses.append(info["paused"]["stage"])
    assert "paused" not in info
    assert {"target", "distill", "dflash-b4", "dflash-b3", "eagle3"} <= set(pauses)
    # The selector over the drafter run a's block stage chose (that choice is timed, so not rerun here), paused
    # after every step too.
    shutil.copytree(tmp / "a" / "dflash", tmp / "b" / "dflash")
    for _ in range(10):
        info = run_tiny(tmp / "b", data, stages=("selector",), time_limit=0)
        if "paused" not in info:
            break
        assert info["paused"]["stage"] == "selector"
    assert "paused" not in info
    for f in ("target", "work/dflash-b4", "work/dflash-b3", "dflash2", "eagle3"):
        a = (tmp / "a" / f / "model.safetensors").read_bytes()
        b = (tmp / "b" / f / "model.safetensors").read_bytes()
        assert a == b, f
    for part in sorted((tmp / "a" / "work" / "distill").iterdir()):
        a, b = torch.load(part, weights_only=True), torch.load(tmp / "b" / "work" / "distill" / part.name, weights_only=True)
        assert torch.equal(a["tokens"], b["tokens"]) and a["first"] == b["first"]


def test_distillation_holds_varied_continuations_of_training_and_target_written_prompts(trained):
    tmp, data, _ = trained
    p = presets.TINY
    from dflash_cli.training import corpus

    parts = [torch.load(f, weights_only=True) for f in sorted((tmp / "a" / "work" / "distill").iterdir())]
    assert sum(len(x["tokens"]) for x in parts) == p.distill_sequences
    shapes = {tuple(x["tokens"].shape[1:]) + (x["first"],) for x in parts}
    assert len(shapes) > 1  # varied prompt and continuation lengths
    temps = torch.cat([x["temperature"] for x in parts])
    assert (temps == 0).any() and (temps > 0).any()
    assert set(temps[temps > 0].tolist()) <= set(torch.tensor(p.sample_temperatures).tolist())
    # Prompts: windows of the training stream, or written by the target from a file start (the separator).
    stream = torch.load(next((tmp / "a" / "work").glob("tokens-*.pt")), weights_only=True)["train"].long()
    from tokenizers import Tokenizer

    eos = Tokenizer.from_file(str(tmp / "a" / "target" / "tokenizer.json")).token_to_id(corpus.SEPARATOR)
    synth = 0
    for x in parts:
        windows = stream.unfold(0, x["first"], 1)
        for row, s in zip(x["tokens"].long(), x["synth"]):
            prompt = row[: x["first"]]
            if s:
                synth += 1
                assert prompt[0] == eos
            else:
                assert (windows == prompt).all(1).any()
    assert synth > 0
    # Held-out files (evaluation prompts) are never training files.
    c = corpus.collect([data], p.max_corpus_bytes)
    assert not set(c.held_out) & set(c.train)


def test_dflash_recipe_is_the_published_one():
    from dflash_cli.training.distill import Distilled

    demo = presets.DEMO
    assert demo.dflash_layers == 5 and demo.dflash_target_layers == (1, 2, 3, 4, 5)  # z-lab's spread over 8 layers
    assert [presets.loss_gamma(b) for b in (16, 8)] == [7.0, 4.0]
    assert set(demo.block_sizes) == {8, 16}
    assert sum(demo.shipped_bytes().values()) + 400_000 <= presets.SHIPPED_LIMIT  # with tokenizer and configs
    assert demo.distill_sequences >= 10 * 6144 and len(set(demo.distill_continuations)) > 1
    # Distinct anchors whose whole block lies in the target's own tokens.
    tokens = torch.zeros(3, 40, dtype=torch.long)
    data = Distilled(tokens, torch.tensor([5, 10, 2]), torch.tensor([30, 40, 9]))
    at, keep = dflash_stage.anchors(data, 4, 6, torch.Generator().manual_seed(0))
    for i in range(3):
        a = at[i][keep[i]]
        assert len(set(a.tolist())) == len(a) and (a >= data.first[i] - 1).all() and (a <= data.length[i] - 4).all()
    assert keep[:2].all() and keep[2].sum() == 9 - 4 - (2 - 1) + 1  # row 2 has only 6 valid anchors


def test_reference_implementations_load_the_trained_checkpoints(trained):
    transformers = pytest.importorskip("transformers")
    zlab = pytest.importorskip("dflash.model")
    out = trained[0] / "a"
    ours = Qwen3Model.load(out / "target")
    ref = transformers.Qwen3ForCausalLM.from_pretrained(out / "target", dtype=torch.float32).eval()
    ids = torch.randint(0, 300, (12,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref_logits = ref(ids[None]).logits[0]
    assert rel_err(ours.forward(ids, 0, ours.new_cache(16), all_logits=True).logits, ref_logits) < 1e-4
    # z-lab's reference generates with the trained drafter what we generate, with the same accepted lengths.
    import time

    from dflash_cli.runtime.generation import Request, generate
    from dflash_cli.runtime.sampling import SamplingParams
    from dflash_cli.runtime.session import Session
    from dflash_cli.runtime.speculative import SpeculativeDecoder

    ref_d = zlab.DFlashDraftModel.from_pretrained(out / "dflash", dtype=torch.float32).eval()
    prompt = torch.randint(0, 300, (10,), generator=torch.Generator().manual_seed(1))
    saved, zlab._cuda_time = zlab._cuda_time, time.perf_counter  # the reference times with CUDA syncs
    try:
        r = zlab.dflash_generate(ref_d, ref, prompt[None], 24, stop_token_ids=None, return_stats=True)
    finally:
        zlab._cuda_time = saved
    session = Session(ours, max_len=10 + 24 + 1)
    res = generate(session, SpeculativeDecoder(DFlashProposer(DFlashDrafter.load(out / "dflash", ours))),
                   Request(prompt.tolist(), SamplingParams(), max_tokens=24))
    assert res.tokens == r.output_ids[0, 10:].tolist()
    assert [len(s.emitted) for s in res.steps] == r.acceptance_lengths


def test_cli_train_refuses_another_preset_or_seed_in_a_started_folder(cli, tmp_path):
    data = small_corpus(tmp_path)
    out = tmp_path / "run"
    first = cli("train", out, "--preset", "tiny", "--data", data, "--stages", "tokenizer", "--device", "cpu")
    assert first.code == 0, first.err
    assert "nothing yet" in first.out and (out / "target" / "tokenizer.json").is_file()
    assert "\n\n" not in first.out  # no empty line from a progress display that showed no step
    for flags in (["--preset", "demo"], ["--preset", "tiny", "--seed", "1"]):
        res = cli("train", out, *flags, "--data", data, "--device", "cpu")
        assert res.code == 1 and res.err.count("\n") == 1 and "resume it with the same" in res.err, res.err
    bad = cli("train", out, "--preset", "tiny", "--data", data, "--stages", "tokenizer,bogus")
    assert bad.code == 1 and "unknown stage(s) bogus" in bad.err
    neg = cli("train", out, "--preset", "tiny", "--data", data, "--time-limit", "-1")
    assert neg.code == 1 and neg.err.count("\n") == 1 and "--time-limit" in neg.err


# A newcomer's trial: Ctrl-C went back to the last checkpoint (every 250 steps); the demo preset on a CPU started
# silently for days; the command to copy at the end was wrapped at 80 columns when piped.

def test_ctrl_c_in_a_training_loop_saves_at_the_step_boundary_and_the_rerun_resumes_exactly(trained):
    import os
    import signal

    tmp, data, _ = trained

    def ctrl_c_at_step_3(stage, step, total, metrics):
        if stage == "target" and step == 3:  # not a checkpoint step (tiny saves every 2)
            os.kill(os.getpid(), signal.SIGINT)

    notes = []
    info = run_tiny(tmp / "c", data, report=ctrl_c_at_step_3, stages=FAST, note=notes.append)
    assert info["paused"] == {"stage": "target", "done": 3, "total": presets.TINY.target_steps, "by": "Ctrl-C"}
    assert torch.load(tmp / "c" / "work" / "target.ckpt.pt", weights_only=True)["step"] == 3
    assert any(n.startswith("Ctrl-C: stopping after this step") for n in notes), notes
    assert any(n.startswith("Ctrl-C: target paused at 3/") and "run the same command again" in n for n in notes)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and signal.set_wakeup_fd(-1) == -1
    reports = []
    info = run_tiny(tmp / "c", data, stages=FAST, report=lambda *r: reports.append(r))
    assert "paused" not in info
    # The distillation's readout counts the rows written, not its parts' capacity (it said 12.000 of 10 rows).
    assert [r[3]["rows"] for r in reports if r[0] == "distill"][-1] == presets.TINY.distill_sequences
    for f in ("target", "work/dflash-b4", "eagle3"):
        assert (tmp / "a" / f / "model.safetensors").read_bytes() == (tmp / "c" / f / "model.safetensors").read_bytes()


def test_a_second_ctrl_c_stops_at_once(tmp_path):
    """Even inside a long call (a demo step's backward takes tens of seconds on a CPU), with exit status 130."""
    import subprocess
    import sys
    import time

    script = """if True:
        import os, signal, time
        from dflash_cli.training.stop import Stop
        stop = Stop()
        with stop.on_ctrl_c(lambda msg: print(msg, flush=True)):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
            assert stop.interrupted
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
        print("not reached")"""
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 130 and time.monotonic() - t0 < 20, (res.returncode, res.stdout, res.stderr)
    assert res.stdout.startswith("Ctrl-C: stopping after this step") and "not reached" not in res.stdout
    assert "interrupted: stopped at once" in res.stderr


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    """`dflash train` with the pipeline replaced: what it returns and leaves, and the arguments it was given."""
    calls = {}

    def train_demo(out, preset, roots, device, seed, report, note, stages, time_limit):
        calls.update(preset=preset.name, device=device.type)
        (out / "dflash").mkdir(parents=True, exist_ok=True)
        (out / "dflash" / "model.safetensors").write_bytes(b"")
        report("target", 1, 3000, {"loss": 8.0})
        return calls.get("info", {})

    monkeypatch.setattr(pipeline, "train_demo", train_demo)
    monkeypatch.setattr(target_stage, "step_seconds", lambda p, device: 88.0)
    return calls


def test_demo_preset_on_a_cpu_says_up_front_how_long_and_what_else(cli, fake_run, tmp_path):
    """Before: the data stage took 80 s, then one target step 88 s of 3000 planned, and nothing said it would take
    days."""
    data = tmp_path / "src"
    data.mkdir()
    (data / "a.py").write_text("x = 1\n")
    res = cli("train", tmp_path / "run", "--device", "cpu", "--data", data)
    assert res.code == 0, res.err
    first = res.out.splitlines()[0]
    assert first.startswith("note: the demo preset is sized for a GPU") and "3 days (3000 steps of ~88 s" in first
    assert "--preset tiny" in first and "--device cuda" in first and fake_run["preset"] == "demo"  # warned, not refused
    tiny = cli("train", tmp_path / "tiny", "--device", "cpu", "--data", data, "--preset", "tiny")
    assert tiny.code == 0 and "sized for a GPU" not in tiny.out


def test_commands_to_copy_are_never_wrapped(cli, fake_run, tmp_path):
    """Before: piped output wrapped at 80 columns, splitting the final `try: dflash generate ...` mid-command."""
    data = tmp_path / "some" / "rather long folder name" / "of python sources"
    data.mkdir(parents=True)
    (data / "a.py").write_text("x = 1\n")
    out = tmp_path / "a run folder whose name is long enough to wrap"
    res = cli("train", out, "--preset", "tiny", "--data", data)
    assert res.code == 0, res.err
    tried = [line for line in res.out.splitlines() if line.startswith("try: ")]
    assert tried == [f"try: dflash generate --model '{out}' --prompt \"def fibonacci(n):\""]
    assert len(tried[0]) > 80

    fake_run["info"] = {"paused": {"stage": "target", "done": 3, "total": 6, "by": "Ctrl-C"}}
    res = cli("train", out, "--preset", "tiny", "--data", data, "--seed", "2", "--time-limit", "60")
    assert res.code == 130, res.err  # as any command Ctrl-C ended
    paused = [line for line in res.out.splitlines() if line.startswith("paused: ")]
    assert paused == [f"paused: target at 3/6 (Ctrl-C); resume: dflash train '{out}' --preset tiny --seed 2 "
                      f"--time-limit 60 --data '{data}'"]


def test_ctrl_c_in_a_stages_last_step_stops_before_the_evaluation(trained):
    """A Ctrl-C in EAGLE-3's last step: that stage ends (nothing left to pause at), and the run pauses before the
    evaluation rather than running it (it ran whole, and the run ended as if never interrupted)."""
    import os
    import shutil
    import signal

    tmp, data, _ = trained
    run = tmp / "last"
    shutil.copytree(tmp / "a", run)
    shutil.rmtree(run / "eagle3")
    (run / "work" / "eagle3.ckpt.pt").unlink()  # its finished checkpoint: the stage would not run again

    def ctrl_c_at_the_last_step(stage, step, total, metrics):
        if stage == "eagle3" and step == total:
            os.kill(os.getpid(), signal.SIGINT)

    info = run_tiny(run, data, report=ctrl_c_at_the_last_step, stages=("eagle3", "evaluate"))
    assert info["paused"] == {"stage": "evaluate", "done": 0, "total": 1, "by": "Ctrl-C"}
    assert (run / "eagle3" / "model.safetensors").is_file()


def test_the_trained_folder_is_a_model_whose_drafters_are_found(trained, cli, tmp_path):
    """Before: `dflash generate --model OUT` said 'model config not found: OUT/config.json', and `--model OUT/target`
    found no drafter (`--draft dflash` was an error naming the registry)."""
    from dflash_cli.registry import Registry

    tmp, _, _ = trained
    out = tmp / "a"
    entry = Registry.load().resolve(str(out))
    assert entry.target.ref == str(out / "target") and set(entry.drafters) == {"dflash", "dflash2", "eagle3"}
    assert entry.draft_len == presets.TINY.draft_len and entry.bench_prompts.is_file()  # the chain it was evaluated at
    for flags, kind in (([], "dflash"), (["--draft", "dflash2"], "dflash2"), (["--draft", "eagle3"], "eagle3")):
        res = cli("generate", "--model", out, *flags, "-p", "def f(x):", "-n", "8", "--json")
        assert res.code == 0, res.err
        stats = json.loads(res.out)["stats"]
        assert stats["draft_kind"] == kind
    assert len(stats["accept_rate_by_position"]) == presets.TINY.draft_len  # EAGLE-3's chain, not its default 7
    (tmp_path / "started" / "target").mkdir(parents=True)  # a run paused in its target stage
    res = cli("generate", "--model", tmp_path / "started", "-p", "x")
    assert res.code == 1 and "without a trained target yet" in res.err and res.err.count("\n") == 1


# A demanding user's trial: each of these was a Python exception's one line (NotADirectoryError, ValueError, a
# FileNotFoundError from the other run's checkpoint), ran on (--time-limit nan, --stages ''), or failed only after
# the data stage had left a folder that refused the next run with another seed.

@pytest.mark.parametrize("case", ["empty data", "no python", "no stages", "no tokenizer", "no target", "seed",
                                  "nan limit", "under a file", "in the package"])
def test_bad_input_is_one_error_line_before_any_folder_is_made(cli, tmp_path, case):
    import dflash_cli

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("x")
    (tmp_path / "file").write_text("x")
    out = tmp_path / "run"
    args = {"empty data": ["--data", tmp_path / "empty"], "no python": ["--data", tmp_path / "docs"],
            "no stages": ["--stages", " , "], "no tokenizer": ["--stages", "target"],
            "no target": ["--stages", "tokenizer,dflash"], "seed": ["--seed", str(2**64)],
            "nan limit": ["--time-limit", "nan"]}.get(case, [])
    if case == "under a file":
        out = tmp_path / "file" / "run"
    if case == "in the package":
        out = Path(dflash_cli.__file__).parent / "demo"
    res = cli("train", out, "--preset", "tiny", "--data", src, *args)
    assert res.code == 1 and res.err.startswith("error: ") and res.err.count("\n") == 1, res.err
    assert "Error:" not in res.err and res.out == "", res.err  # no exception's name, no empty progress display
    assert not (tmp_path / "run").exists()


def test_a_second_run_in_the_same_folder_is_refused_while_the_first_runs(cli, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    out = tmp_path / "run"
    with pipeline.only_run(out):
        res = cli("train", out, "--preset", "tiny", "--data", src)
    assert res.code == 1 and "another dflash train is running in" in res.err and res.err.count("\n") == 1, res.err
    with pipeline.only_run(out):  # the lock went with its holder
        pass


def test_a_folder_on_a_filesystem_without_locks_still_trains(monkeypatch, tmp_path):
    """Lustre without its flock option answers ENOSYS: the run goes on without the lock (it crashed on an OSError)."""
    import errno
    import fcntl

    def no_locks(f, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    ran = False
    with pipeline.only_run(tmp_path / "run"):
        ran = True
    assert ran


def test_ctrl_c_outside_a_training_loop_says_how_to_resume(cli, fake_run, monkeypatch, tmp_path):
    """The data stage, the block choice and the evaluation stop at once on Ctrl-C; the run said only 'interrupted'."""
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "train_demo", interrupted)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    res = cli("train", tmp_path / "run", "--preset", "tiny", "--data", src)
    assert res.code == 130 and res.err.startswith("interrupted: ") and \
        f"resume: dflash train {tmp_path / 'run'} --preset tiny --data {src}" in res.err, res.err


def test_the_token_cache_is_never_left_half_written(monkeypatch, tmp_path):
    """A Ctrl-C while it was saved left a truncated tokens-*.pt that every later run failed to load."""
    from types import SimpleNamespace

    def cut_short(obj, f):
        Path(f).write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.bpe, "encode", lambda tok, texts: torch.zeros(3, dtype=torch.int32))
    monkeypatch.setattr(pipeline.torch, "save", cut_short)
    data = SimpleNamespace(train=["x"], held_out=["y"], digest="d")
    with pytest.raises(KeyboardInterrupt):
        pipeline._tokens(tmp_path, None, data)
    assert not (tmp_path / "tokens-d.pt").exists()


def test_a_stage_resumed_on_another_device_names_both(tmp_path):
    """training_info.json kept only the last run's device for a stage's seconds summed over runs on two machines."""
    run = pipeline._Run(tmp_path, tmp_path / "work", presets.TINY, [], torch.device("cpu"), 0, None,
                        lambda msg: None, pipeline.STAGES, None)
    for where in ("NVIDIA H200", "cpu", "NVIDIA H200"):
        with run.timed("target", where):
            pass
    saved = json.loads((tmp_path / "training_info.json").read_text())["stages"]["target"]
    assert saved["device"] == "NVIDIA H200 + cpu" and saved["finished"]


def test_the_chosen_drafter_is_copied_whole_or_not_at_all(monkeypatch, tmp_path):
    import shutil

    src = tmp_path / "work" / "dflash-b4"
    src.mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"weights")

    def cut_short(a, b, **kw):
        Path(b).write_bytes(b"we")
        raise KeyboardInterrupt

    monkeypatch.setattr(shutil, "copyfile", cut_short)
    with pytest.raises(KeyboardInterrupt):
        pipeline._copy_whole(src, tmp_path / "dflash")
    assert not pipeline._done(tmp_path / "dflash")
    monkeypatch.undo()
    pipeline._copy_whole(src, tmp_path / "dflash")
    assert (tmp_path / "dflash" / "model.safetensors").read_bytes() == b"weights"


def test_a_folder_that_cannot_be_written_is_one_error_line(cli, monkeypatch, tmp_path):
    """As root the tests cannot make a folder unwritable: the lock file's open is refused instead."""
    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(pipeline, "open", denied, raising=False)
    res = cli("train", tmp_path / "run", "--preset", "tiny", "--data", src)
    assert res.code == 1 and res.err == f"error: cannot write to {tmp_path / 'run'}: Permission denied\n", res.err


def test_a_paused_loop_reports_the_step_it_paused_at(tmp_path):
    """A stage of over 100 steps reports every tenth: paused at 2/3000, its bar and log said 1/3000."""
    from dflash_cli.training.loop import Paused, optimise
    from dflash_cli.training.stop import Stop

    w = torch.nn.Parameter(torch.zeros(2, 2))
    reports = []
    calls = iter(range(100))

    class AfterTwo(Stop):  # due after the second step
        def __call__(self):
            return next(calls) >= 1

    with pytest.raises(Paused) as e:
        optimise("toy", [w], lambda g: ((w ** 2).sum() + 1, {}), 300, 1e-3, tmp_path, 0, torch.device("cpu"),
                 lambda *r: reports.append(r), stop=AfterTwo())
    assert e.value.done == 2 and reports[-1][:3] == ("toy", 2, 300)


def test_too_little_source_says_what_was_skipped(tmp_path):
    from dflash_cli.errors import DflashError
    from dflash_cli.training import corpus

    (tmp_path / "big.py").write_text("x = 1\n" * 40_000)
    (tmp_path / "small.py").write_text("x = 1\n")
    with pytest.raises(DflashError, match="two files or more .those over 200 KB, empty or not UTF-8 are skipped"):
        corpus.collect([tmp_path], 10**6)


def test_a_finished_run_rerun_keeps_its_evaluation_unless_asked(trained):
    """The same command again on a finished folder: nothing trains, so the evaluation (minutes on the demo) is kept;
    --stages evaluate measures again."""
    import shutil

    tmp, data, _ = trained
    run = tmp / "rerun"
    shutil.copytree(tmp / "a", run)
    before = json.loads((run / "training_info.json").read_text())
    notes = []
    info = pipeline.train_demo(run, presets.TINY, [data], torch.device("cpu"), 0, lambda *a: None, notes.append)
    assert any(n.startswith("evaluate: done before") for n in notes), notes
    assert info["evaluation"] == before["evaluation"] and info["stages"]["evaluate"] == before["stages"]["evaluate"]
    notes.clear()
    info = run_tiny(run, data, note=notes.append, stages=("evaluate",))
    assert info["stages"]["evaluate"]["seconds"] >= before["stages"]["evaluate"]["seconds"]
    assert any(n.startswith("evaluate: ") and "on cpu" in n for n in notes), notes
