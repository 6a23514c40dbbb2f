"""GPU: what a plain decode step costs beyond its graph. Random Qwen3-4B shapes, bf16, CTX (default 1024).

Prints, in ms a step: the decode graph replayed alone (no input staging), replayed after the host copy of its
inputs (step_profile's replay figure), and the wall time per step of greedy generations through the real driver
(PlainDecoder, lookahead), as built and with the decode graph's device-side staging of the token id and of the
positions skipped (SKIP: wrong tokens, a bound on what staging costs).
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.step_profile import CTX, generation_runner, prefilled_graphs, replay_ms  # noqa: E402
from dflash_cli.engine import graphs as graphs_module  # noqa: E402
from dflash_cli.engine.generation import PlainDecoder  # noqa: E402
from dflash_cli.synthetic import random_qwen3  # noqa: E402


def walls(model, runs=5, new=128) -> list[float]:
    run = generation_runner(model, PlainDecoder(), new)
    run()  # captures
    out = []
    for _ in range(runs):
        res = run()
        out.append(res.decode_s / len(res.steps) * 1000)
    return sorted(out)


def main():
    torch.manual_seed(0)
    model = random_qwen3("qwen3-4b", "cuda", torch.bfloat16, seed=0)
    cache, _, graphs = prefilled_graphs(model, CTX)
    one = lambda: graphs([5], CTX, (), False, True)  # noqa: E731
    one()
    step = next(s for k, s in graphs.steps.items() if k[0] == 1)
    print(f"device {torch.cuda.get_device_name()}  ctx {CTX}")
    for rnd in range(2):
        print(f"round {rnd}: replay alone {replay_ms(step.graph.replay, 100):.4f} ms, "
              f"with the host copy of its inputs {replay_ms(one, 100):.4f} ms")
    stage, stage_positions = graphs_module.stage, graphs_module.stage_positions
    for rnd in range(2):
        for skip in ("", "ids", "ids,positions"):
            graphs_module.stage = (lambda d, s: None) if "ids" in skip else stage
            graphs_module.stage_positions = (lambda d, s: None) if "positions" in skip else stage_positions
            w = walls(model)
            print(f"round {rnd}: generation, staging skipped: {skip or 'none':14s} wall ms/step median {w[2]:.4f} "
                  f"(all {' '.join(f'{x:.4f}' for x in w)})")
    graphs_module.stage, graphs_module.stage_positions = stage, stage_positions


if __name__ == "__main__":
    main()
