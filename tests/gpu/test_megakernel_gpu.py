"""GPU check of the persistent decode step (csrc/megakernel.cu) against the kernel-per-op static forward.

The graphed sessions use it for every plain decode step, so test_graphs_gpu's 128 greedy steps cover it end to
end; here single steps over a random cache at edge positions (the first rows, ranges that leave SMs with no
cached position, beyond one SM's share) compare logits and the KV rows the step writes.
"""

import pytest
import torch

from dflash_cli.engine.graphs import window_for
from dflash_cli.engine.kernels import megakernel
from dflash_cli.synthetic import random_qwen3

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_megakernel_matches_static_forward_at_edge_positions():
    model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0, max_position_embeddings=4096)
    ref_cache, mk_cache = model.new_cache(4096), model.new_cache(4096)
    step = megakernel.decode_step(model, mk_cache)
    if isinstance(step, str):
        pytest.skip(step)
    torch.manual_seed(7)
    ref_cache.k.normal_(), ref_cache.v.normal_()
    mk_cache.k.copy_(ref_cache.k), mk_cache.v.copy_(ref_cache.v)
    for p in (0, 1, 2, step.sms - 1, step.sms, step.sms + 1, 1023, 4095):
        ids = torch.tensor([p * 7919 % model.cfg.vocab_size], device="cuda")
        pos = torch.tensor([p], device="cuda")
        want = model.forward_static(ids, pos, ref_cache, window_for(p + 1, 4096)).logits.float()[0]
        got = step(ids, pos)[0]
        assert step.stall() is None, (p, step.stall())
        assert ((got - want).abs().max() / want.abs().max()).item() < 0.08, p
        ulp = 2.0 ** (torch.log2(want.abs().max()).floor().item() - 7)
        assert (want.max() - want[got.argmax()]).item() <= 4 * ulp, p
        for a, b in ((ref_cache.k, mk_cache.k), (ref_cache.v, mk_cache.v)):
            assert ((a[:, p].float() - b[:, p].float()).abs().max() / a[:, p].float().abs().max()).item() < 0.08, p
