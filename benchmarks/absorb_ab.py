"""GPU: the DFlash context update (absorbing the accepted rows' target states), one stacked k/v product over
every drafter layer vs one product per layer, as graph replays. Random Qwen3-4B / DFlash-b16 shapes, bf16."""

import os
import sys

# The per-layer path reads the layers' own k/v rows, which a folded drafter's context rows do not use.
os.environ.setdefault("DFLASH_DRAFTER_FOLD", "0")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_profile import replay_ms  # noqa: E402

from dflash_cli.models.dflash import DFlashDrafter  # noqa: E402
from dflash_cli.synthetic import random_drafter, random_qwen3  # noqa: E402

CTX = 1024


def main():
    model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
    drafter = random_drafter("qwen3-4b", "dflash", model)
    cache = model.new_cache(CTX + 64)
    out = model.forward(torch.randint(0, 1000, (CTX,), device="cuda"), 0, cache, capture=drafter.capture)
    line = []
    for stacked in (False, True):
        if not stacked:
            drafter.context_rows = lambda h, span, stacked=False: DFlashDrafter.context_rows(drafter, h, span)
        else:
            del drafter.context_rows
        drafter.graphs = None
        drafter.reset(CTX + 64, "graphs")
        drafter.absorb(out.hidden, 0)
        for rows in (1, 7, 16):
            h = out.hidden[:rows]

            def step():
                drafter.rollback(CTX - 16)
                drafter.absorb(h, CTX - 16)  # noqa: B023

            line.append(f"{'stacked' if stacked else 'per layer'} {rows} rows {replay_ms(step):.3f}")
    print("DFlash context update, graph replay (ms): " + ", ".join(line))


if __name__ == "__main__":
    main()
