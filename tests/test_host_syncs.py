"""One host synchronisation per decoder step: the read of the accepted count (with the bonus and drafts).

On a GPU, every read of a tensor's values on the host (tolist, item, int(), bool(), ...) waits for the
device, as do now() and torch.cuda.synchronize. On CPU nothing waits, but the same calls are made: the
test counts them during each step, so a proposer that hands back a list or a step that times itself
with now() is caught here without a GPU.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from dflash_cli.bench.forced import ForcedAcceptance, ForcedDecoder
from dflash_cli.runtime import session as session_module
from dflash_cli.runtime.generation import PlainDecoder, Request, generate
from dflash_cli.runtime.drafters.dflash import DFlashProposer
from dflash_cli.runtime.drafters.dflash2 import DFlash2Proposer
from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from dflash_cli.models.dflash import DFlashDrafter
from dflash_cli.models.dflash2 import DFlash2Drafter
from dflash_cli.models.eagle3 import Eagle3Drafter
from dflash_cli.models.qwen3 import Qwen3Model
from tiny import make_dflash, make_dflash2, make_eagle3, make_qwen3

READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")
PROMPT = [5, 9, 2, 7, 11, 3, 8]


class SyncCounter:
    """Counts, while a decoder step runs, the calls that synchronise the host with the device."""

    def __init__(self, monkeypatch):
        self.active, self.calls = False, []
        for name in READS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, getattr(torch.Tensor, name)))
        monkeypatch.setattr(torch.cuda, "synchronize", self._counted("cuda.synchronize", torch.cuda.synchronize))
        real_now = session_module.now
        for mod in list(sys.modules.values()):  # wherever now() was imported
            if getattr(mod, "__name__", "").startswith("dflash_cli") and getattr(mod, "now", None) is real_now:
                monkeypatch.setattr(mod, "now", self._counted("now", real_now))

    def _counted(self, name, fn):
        def counted(*args, **kwargs):
            if self.active:
                self.calls.append(name)
            return fn(*args, **kwargs)

        return counted

    def per_step(self, decoder) -> list[list[str]]:
        """Wrap decoder.step; returns the list that receives each step's counted calls."""
        steps, real = [], decoder.step

        def step(*args, **kwargs):
            self.calls, self.active = [], True
            try:
                return real(*args, **kwargs)
            finally:
                self.active = False
                steps.append(self.calls)

        decoder.step = step
        return steps


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("syncs")
    target_dir = make_qwen3(root / "t", seed=3, num_hidden_layers=3, with_tokenizer=False)
    cfg = json.loads((target_dir / "config.json").read_text())
    target = Qwen3Model.load(target_dir)
    dflash = DFlashDrafter.load(make_dflash(root / "d", cfg, seed=4, block_size=5, target_layer_ids=[0, 2]), target)
    eagle = Eagle3Drafter.load(make_eagle3(root / "e", cfg, seed=5), target)
    dflash2 = DFlash2Drafter.load(make_dflash2(root / "d2", cfg, seed=6, block_size=5, target_layer_ids=[0, 2]),
                                  target, selector=True)
    return target, dflash, eagle, dflash2


def proposer(models, kind: str):
    _, dflash, eagle, dflash2 = models
    if kind == "dflash2":  # the selector's walk, greedy and sampled, inside the proposal
        return DFlash2Proposer(dflash2)
    return DFlashProposer(dflash) if kind == "dflash" else Eagle3Proposer(eagle)


def run_counted(monkeypatch, models, decoder, params: SamplingParams, path: str, max_tokens: int = 14):
    counter = SyncCounter(monkeypatch)
    steps = counter.per_step(decoder)
    res = generate(Session(models[0], 64, path=path), decoder, Request(PROMPT, params, max_tokens))
    assert len(steps) == len(res.steps) >= 3
    return res, steps


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("kind", ["dflash", "eagle3", "dflash2"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_speculative_step_reads_the_device_once(monkeypatch, models, kind, path, temperature):
    params = SamplingParams(temperature=temperature, seed=1)
    res, steps = run_counted(monkeypatch, models, SpeculativeDecoder(proposer(models, kind), 4), params, path)
    assert steps == [["tolist"]] * len(steps)
    assert all(s.draft_s >= 0 and s.verify_s > 0 for s in res.steps)  # timed without waiting, read afterwards


def test_the_forced_acceptance_of_the_synthetic_bench_reads_once(monkeypatch, models):
    seq = PROMPT + list(range(40))
    forced = ForcedAcceptance(proposer(models, "dflash"), seq, tau=2.5, vocab_size=models[0].cfg.vocab_size)
    res, steps = run_counted(monkeypatch, models, ForcedDecoder(forced, 4), SamplingParams(), "static")
    assert steps == [["tolist"]] * len(steps)
    assert {s.accepted for s in res.steps} <= {1, 2}  # the forced counts (tau 2.5: one or two drafts)


@pytest.mark.parametrize("queue_ahead", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_plain_step_reads_its_token_once(monkeypatch, models, temperature, queue_ahead):
    params = SamplingParams(temperature=temperature, top_k=20 * int(queue_ahead), seed=1)
    res, steps = run_counted(monkeypatch, models, PlainDecoder(queue_ahead), params, "static")
    assert steps == [["tolist"]] * len(steps)
    assert all(s.draft_s == 0 and s.verify_s > 0 for s in res.steps)


def test_the_counter_sees_each_kind_of_sync(monkeypatch, models):
    counter = SyncCounter(monkeypatch)
    t = torch.tensor([3])
    counter.active = True
    t.tolist(), t.item(), int(t), float(t), bool(t), [0, 1, 2, 3][t], t.cpu(), t.numpy()
    session_module.now(t.device)
    from dflash_cli.runtime import generation

    generation.now(t.device)
    assert counter.calls == [*READS, "now", "now"]
