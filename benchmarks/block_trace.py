"""GPU: a step's kernels block by block, from %globaltimer records (kernels/block_trace.py).

Runs the traced build (DFLASH_BLOCK_TRACE=1, set here: the CUDA GEMM is built with -DTRACE=1), captures the decode graph
at CTX and 8*CTX and the 16-row verify at CTX, replays each once with its record buffers zeroed, and prints, per
kernel of a layer (mean over the middle layers), when its blocks started, were released from their wait and ended,
in microseconds after the last block of the kernel before it ended:
  start: the first block's start (negative: launched early, programmatic dependent launch);
  release: the first and the median block's time after its wait (its start where it has none);
  end: the median block's end and the last one's (the kernel's marginal time in the step);
  tail: the last block's end after the median's.
Products also show their weight bytes over (last end - first release). Tracing adds a few stores per block.
TRACE_OUT=dir also saves the records (`save`).
"""

import os
import statistics
import sys
from collections import defaultdict

os.environ["DFLASH_BLOCK_TRACE"] = "1"  # read at import

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.step_profile import prefilled_graphs  # noqa: E402
from dflash_cli.kernels import block_trace  # noqa: E402
from dflash_cli.synthetic import random_target  # noqa: E402

CTX = int(os.environ.get("CTX", "1024"))
ROLES = ("qkv", "o", "gate_up", "down")


def traced_replay(fn) -> list[tuple[str, torch.Tensor]]:
    """fn's graph (captured on its first call) replayed once with zeroed records: its launches, in graph order,
    as (kind, records [blocks, 5] on the host, blocks that did not record dropped)."""
    block_trace.clear()  # the earlier graphs keep their buffers (block_trace.clear)
    fn()  # warm-up and capture: the graph's launches are among these
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    launches = block_trace.launches()
    for _, rec in launches:
        rec.zero_()
    fn()
    torch.cuda.synchronize()
    out = []
    for kind, rec in launches:
        rec = rec.cpu()
        # A block's record names its own row; rows no block wrote keep zeros, or whatever a graph temporary that
        # shares the memory left there (the capture may place a buffer where a freed temporary was).
        ok = ((rec[:, 4] == torch.arange(len(rec))) & (rec[:, 0] > 0) & (rec[:, 0] <= rec[:, 1])
              & (rec[:, 1] <= rec[:, 2]))
        if ok.any():
            out.append((kind, rec[ok]))
    return out


def named(launches, model) -> list[tuple[str, int, torch.Tensor]]:
    """(role, layer, records): products by their weight, the other kernels by kind, each given the layer of
    the product before it."""
    owner = {}
    for i, layer in enumerate(model.layers):
        for role in ROLES:
            owner[getattr(layer, role).data_ptr()] = (role, i)
    out, layer, product = [], -1, ""
    for kind, rec in launches:
        if kind.startswith("gemm:"):
            product, layer = owner.get(int(kind[5:]), ("head", layer))
            role = product
        else:
            role = kind if kind != "norm" else f"norm/{product}"  # the add + norm after the o or the down product
        out.append((role, layer, rec))
    return out


def in_us(rows):
    """The rows with their records as float64: start, release and end in us from the replay's first start (the
    difference taken in int64: ns since 1970 as float64 step by 256 ns), then SM and block."""
    origin = min(rec[:, 0].min().item() for _, _, rec in rows)
    out = []
    for role, layer, rec in rows:
        r = rec.double()
        r[:, :3] = (rec[:, :3] - origin).double() / 1e3
        out.append((role, layer, r))
    return out


def save(rows, label: str) -> None:
    """TRACE_OUT=dir: the rows (`in_us`) as [(role, layer, float64 [blocks, 5])] in dir/<label>.pt."""
    folder = os.environ.get("TRACE_OUT")
    if folder:
        torch.save(rows, os.path.join(folder, label.replace(" ", "_") + ".pt"))


def timeline(launches, model, label: str) -> None:
    rows = in_us(named(launches, model))
    save(rows, label)
    nbytes = {role: getattr(model.layers[0], role).numel() * 2 for role in ROLES}
    layers = len(model.layers)
    keep = range(4, layers - 4)
    stats = defaultdict(lambda: defaultdict(list))
    order = []
    prev_end = None
    for role, layer, rec in rows:
        t0, t1, t2 = rec[:, 0], rec[:, 1], rec[:, 2]
        if prev_end is not None and layer in keep:
            if role not in order:
                order.append(role)
            s = stats[role]
            s["start"].append(t0.min().item() - prev_end)
            s["release"].append(t1.min().item() - prev_end)
            s["release50"].append(t1.median().item() - prev_end)
            s["end50"].append(t2.median().item() - prev_end)
            s["end"].append(t2.max().item() - prev_end)
            s["tail"].append(t2.max().item() - t2.median().item())
            s["busy"].append(t2.max().item() - t1.min().item())
            sms = defaultdict(int)
            for sm in rec[:, 3].tolist():
                sms[sm] += 1
            s["sms"].append(len(sms))
            s["per_sm"].append(max(sms.values()))
            s["blocks"].append(len(rec))
        prev_end = t2.max().item() if prev_end is None else max(prev_end, t2.max().item())
    print(f"\n{label}: {len(rows)} traced launches, layers {keep.start}-{keep.stop - 1} averaged; "
          f"us after the previous kernel's last block")
    print(f"  {'kernel':9s} {'blocks':>6s} {'SMs':>4s} {'max/SM':>6s} {'start':>7s} {'release':>8s} "
          f"{'rel.50%':>8s} {'end 50%':>8s} {'end':>7s} {'tail':>6s} {'GB/s':>6s}")
    total = 0.0
    for role in order:
        s = stats[role]
        m = {k: statistics.mean(v) for k, v in s.items()}
        total += m["end"]
        gbs = f"{nbytes[role] / m['busy'] / 1e3:6.0f}" if role in nbytes else ""
        print(f"  {role:9s} {m['blocks']:6.0f} {m['sms']:4.0f} {m['per_sm']:6.1f} {m['start']:7.2f} "
              f"{m['release']:8.2f} {m['release50']:8.2f} {m['end50']:8.2f} {m['end']:7.2f} {m['tail']:6.2f} {gbs:>6s}")
    print(f"  layer: {total:.2f} us")


def main():
    torch.manual_seed(0)
    model = random_target("qwen3-4b", "cuda", torch.bfloat16, seed=0)
    _, _, graphs = prefilled_graphs(model, CTX)
    print(f"device {torch.cuda.get_device_name()}, traced build")
    for label, fn in ((f"decode ctx {CTX}", lambda: graphs([5], CTX, (), False, True)),
                      (f"decode ctx {8 * CTX}", lambda: graphs([5], 8 * CTX, (), False, True)),
                      (f"verify 16 rows ctx {CTX}", lambda: graphs(list(range(16)), CTX, (), True, True))):
        timeline(traced_replay(fn), model, label)


if __name__ == "__main__":
    main()
