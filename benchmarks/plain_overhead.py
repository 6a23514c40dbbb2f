"""GPU: what a plain decode step costs beyond its graph. Random Qwen3-4B shapes, bf16, CTX (default 1024).

Greedy generations of 128 tokens after a CTX-token prompt through the real driver (PlainDecoder, lookahead, graphs):
the wall time per step, as built and with the decode graph's device-side staging of the token id and positions
skipped, a bound on what that staging costs (the tokens are then wrong, and the context stops growing, so that
bound includes less attention); and the same session's decode graph replayed alone, over the same window, then
with what the driver queues around it added step by step (its input staging, the token's read-back for the host,
the step's timing mark), without the host's waits. Since session 39 a greedy decode graph stages its own next inputs
and the driver queues only the replay and its mark (benchmarks/plain_gap.py's `lean` loop): the staging this
script skips and adds back is then the driver's of before.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.step_profile import CTX, plain_session, replay_ms  # noqa: E402
from dflash_cli.engine import graphs as graphs_module  # noqa: E402
from dflash_cli.engine.generation import PlainDecoder, Request, generate  # noqa: E402
from dflash_cli.engine.sampling import SamplingParams  # noqa: E402
from dflash_cli.engine.session import Session, mark, read_later  # noqa: E402

NEW = 128


def walls(session: Session, prompt: list[int], runs: int = 5) -> list[float]:
    """Sorted wall ms per step of `runs` generations (after one that captures)."""
    out = []
    for i in range(runs + 1):
        session.reset()
        res = generate(session, PlainDecoder(), Request(prompt, SamplingParams(), NEW))
        if i:
            out.append(res.decode_s / len(res.steps) * 1000)
    return sorted(out)


def main():
    session, prompt = plain_session(NEW, CTX)
    print(f"device {torch.cuda.get_device_name()}  ctx {CTX}  window {session.max_len}")
    stage_step = graphs_module.stage_step
    try:
        for rnd in range(2):
            for skip in (False, True):
                graphs_module.stage_step = (lambda *a: None) if skip else stage_step
                w = walls(session, prompt)
                print(f"round {rnd}: generation, staging {'skipped' if skip else 'as built'}: wall ms/step median "
                      f"{w[len(w) // 2]:.4f} (all {' '.join(f'{x:.4f}' for x in w)})")
    finally:
        graphs_module.stage_step = stage_step
    decode = next(s for k, s in session.fast.steps.items() if k[0] == 1 and s.graph is not None)
    tok = decode.out.verdict[1:2]  # the graph's own token output, as the driver feeds it back
    start = session.length

    def staged():  # the driver's staging of the graph's inputs, then the replay
        graphs_module.stage_step(decode.ids, tok, decode.positions, start)
        decode.graph.replay()

    def read_back():  # and the token's copy for the host first (read_later), as in PlainDecoder.step
        read_later(tok)
        staged()

    def marked():  # and the step's timing mark
        read_back()
        mark(session.device)

    for rnd in range(2):  # at the last generation's final position
        print(f"round {rnd}: its decode graph replayed alone {replay_ms(decode.graph.replay, 100):.4f} ms, "
              f"after its staging kernels {replay_ms(staged, 100):.4f}, and the token's read-back "
              f"{replay_ms(read_back, 100):.4f}, and the step's mark {replay_ms(marked, 100):.4f}")


if __name__ == "__main__":
    main()
