"""GPU checks of sampling inside the graphs (temperature > 0): the same seed gives the same text, a step's sampled
token follows the target's filtered distribution, a warmed-up session captures nothing more, and what a sampled
step costs against a greedy one.

Run on a CUDA machine: `python -m pytest -m gpu -s tests/gpu/test_sampling_gpu.py`.
"""

import pytest
import torch

from dflash_cli.runtime.generation import PlainDecoder, Request, generate
from dflash_cli.runtime.drafters.dflash import DFlashProposer
from dflash_cli.runtime.drafters.dflash2 import DFlash2Proposer
from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
from dflash_cli.runtime.sampling import SamplingParams, begin, probabilities
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from dflash_cli.synthetic import random_drafter, random_target

from test_foundation_gpu import report

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

KINDS = ["none", "dflash", "eagle3", "dflash2"]
QWEN3 = SamplingParams(temperature=0.6, top_p=0.95, top_k=20)  # the registry's defaults


@pytest.fixture(scope="module")
def models():
    target = random_target("qwen3-4b", "cuda", torch.bfloat16, seed=0, max_position_embeddings=4096)
    return (target, random_drafter("qwen3-4b", "dflash", target), random_drafter("qwen3-4b", "eagle3", target),
            random_drafter("qwen3-4b", "dflash2", target))


def decoder(models, kind):
    if kind == "none":
        return PlainDecoder()
    make = {"dflash": lambda: DFlashProposer(models[1]), "eagle3": lambda: Eagle3Proposer(models[2]),
            "dflash2": lambda: DFlash2Proposer(models[3])}
    return SpeculativeDecoder(make[kind]())


def with_seed(params: SamplingParams, seed) -> SamplingParams:
    return SamplingParams(params.temperature, params.top_p, params.top_k, seed=seed)


def prompt(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("kind", KINDS)
def test_the_same_seed_gives_the_same_text_and_a_warm_session_captures_nothing(models, kind):
    """Warmed up greedy and sampled (as a load-time warm-up does), a session then samples with other params (same
    mode: other temperature / top-p / top-k) capturing no graph, queued proposals included, and the same seed
    gives the same tokens."""
    target = models[0]
    session, dec = Session(target, 1024, path="graphs"), decoder(models, kind)
    vocab = target.cfg.vocab_size
    for params in (SamplingParams(), with_seed(QWEN3, 0)):  # the warm-up
        generate(session, dec, Request(prompt(12, 1, vocab), params, 48))
        session.reset()
    runs = []
    for seed in (7, 7, 8):
        res = generate(session, dec, Request(prompt(20, 2, vocab), SamplingParams(1.0, 0.9, 40, seed=seed), 64))
        session.reset()
        runs.append(res)
    report(f"gpu_sampling_seed_{kind}", {"captures": [r.graph_captures for r in runs],
                                         "accepted": [sum(s.accepted for s in r.steps) for r in runs]})
    assert [r.graph_captures for r in runs] == [0, 0, 0]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 64
    assert runs[2].tokens != runs[0].tokens


def chi2_stat(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic and degrees of freedom, cells expected below 5 pooled."""
    counts, probs = counts.double(), probs.double() / probs.double().sum()
    assert counts[probs == 0].sum() == 0, "samples of probability-0 tokens"
    keep = probs > 0
    n = counts.sum()
    obs, exp = counts[keep], probs[keep] * n
    small = exp < 5
    if small.any():
        obs = torch.cat([obs[~small], obs[small].sum()[None]])
        exp = torch.cat([exp[~small], exp[small].sum()[None]])
    return float(((obs - exp) ** 2 / exp).sum()), len(exp) - 1


def chi2_critical(df: int) -> float:
    """The 0.999 quantile (Wilson-Hilferty): accurate to a percent for df >= 3."""
    z = 3.090
    return df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3


@pytest.mark.parametrize("kind", KINDS)
def test_a_graphed_step_samples_the_target_distribution(models, kind):
    """The first token of a decode step (plain: the step's graph; speculative: the verify graph's rejection sampling
    of drafts drawn in the drafter's graph) after a fixed context, over many runs, against probabilities() of the
    target's logits there, as that step's own forward computes them (a prefill's bf16 logits differ enough to swap
    the 20th and 21st token: samples of a token the prefill's top-20 leaves out)."""
    target = models[0]
    vocab = target.cfg.vocab_size
    params = SamplingParams(temperature=1.0, top_k=20)
    context, last = prompt(30, 3, vocab), 11
    session, dec = Session(target, 256, path="graphs"), decoder(models, kind)
    dec.prefill(session, context)
    if kind == "none":  # the plain step's forward, and the verify's: [last, drafts...] (row 0 sees only `last`)
        logits = session.forward([last], accept=True).logits[-1]
    else:
        ids = [last] + [0] * dec.draft_len
        logits = session.forward(ids, capture=dec.proposer.capture, all_logits=True, accept=True).logits[0]
    probs = probabilities(logits.float(), params).cpu()
    dec.sync(session)
    counts = torch.zeros(vocab, dtype=torch.long)
    for seed in range(1500):
        session.reset()
        dec.prefill(session, context)
        begin(with_seed(params, seed), session.device)  # the seed, as generate() sets it
        step = dec.step(session, last, 8, params)
        counts[step.emitted[0]] += 1
        dec.sync(session)
    stat, df = chi2_stat(counts, probs)
    report(f"gpu_sampling_chi2_{kind}", {"chi2": round(stat, 2), "df": df, "critical": round(chi2_critical(df), 2)})
    assert df >= 3 and stat < chi2_critical(df)


@pytest.mark.parametrize("kind", KINDS)
def test_a_sampled_step_costs_about_a_greedy_one(models, kind):
    """Per-step device time at the registry's sampling defaults against greedy, on the same warm session (random
    weights: the speculative steps verify the same span either way). Budget: 1.05x plain and DFlash, 1.15x EAGLE-3;
    asserted with room for timing noise, the measured ratio reported."""
    target = models[0]
    session, dec = Session(target, 1024, path="graphs"), decoder(models, kind)
    ids = prompt(64, 4, target.cfg.vocab_size)
    times = {}
    for name, params in (("greedy", SamplingParams()), ("sampled", with_seed(QWEN3, 5))) * 2:
        generate(session, dec, Request(ids, params, 16))  # warm
        session.reset()
        best = []
        for _ in range(3):
            res = generate(session, dec, Request(ids, params, 200))
            session.reset()
            best.append(res.decode_s / len(res.steps))
        times[name] = min(best)
    ratio = times["sampled"] / times["greedy"]
    report(f"gpu_sampling_cost_{kind}", {"device": torch.cuda.get_device_name(),
                                         "greedy_step_ms": round(times["greedy"] * 1e3, 3),
                                         "sampled_step_ms": round(times["sampled"] * 1e3, 3),
                                         "ratio": round(ratio, 4)})
    assert ratio < (1.25 if kind == "eagle3" else 1.10)
