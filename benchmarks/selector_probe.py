"""On a CPU: a DFlash 2 candidate selector trained over a frozen DFlash drafter of the demo (issue 44's lead,
docs/demo-training.md "A candidate selector on the shipped block drafter"), written as a DFlash 2 checkpoint whose
convolutions are the identity, so that the engine drafts with it.

Examples: the frozen drafter's block rows at random anchors of the distillation rows (training/dflash.block_states),
each with its final-norm state, its top-K candidates and logits, the target's token and the token before it (the
anchor's for the block's first row). Teacher forcing is the condition acceptance needs: a draft counts only where the
one before it was accepted, that is, equals the target's token. The loss is the cross-entropy over the K candidates
of score(p -> c) = logit[c] + < A[p] * (W h), B[c] > (models/dflash2.CandidateSelector), on the positions whose
target token is among them; AdamW with a one-cycle schedule.

    python benchmarks/selector_probe.py OUT --distill TRAIN_FOLDER/work/distill [--drafter DIR] [--top-k 8]
        [--rank 16] [--batches 80] [--steps 1000]
    python benchmarks/demo_acceptance.py selector=OUT --per-category 16 --half select

The distillation parts come from a `dflash train --preset demo` folder (benchmarks/train_demo_gpu.sh CALL=1 makes
them). About 6 minutes for 80 batches of 64 rows x 6 anchors on one core, 15 s for the selector's 1,000 steps."""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.layers import ops  # noqa: E402
from dflash_cli.training import bpe, corpus, distill, presets  # noqa: E402
from dflash_cli.training import dflash as dflash_stage  # noqa: E402
from dflash_cli.training.params import save  # noqa: E402
from dflash_cli.training.pipeline import _load_target, _rows  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "dflash_cli" / "demo"
TAPS, GROUP = 2, 16  # the identity convolutions' taps and channel group (DFlash 2's published two-tap form)


def examples(drafter, seqs, batches: int, rows: int, anchors: int, top_k: int, gen: torch.Generator) -> dict:
    """The frozen drafter's block rows whose target token is among their top-K candidates."""
    acc = {k: [] for k in ("x", "cand", "unary", "idx", "prev", "row")}
    seen = 0
    size = drafter.block_size
    for _ in range(batches):
        r = _rows(seqs, rows, gen)
        width = int(r.length.max())
        data = distill.Distilled(r.tokens[:, :width], r.first, r.length)
        at, keep = dflash_stage.anchors(data, size, anchors, gen)
        with torch.no_grad():
            h = dflash_stage.block_states(drafter, data.tokens, at)
            x = ops.rms_norm(h, drafter.norm, drafter.cfg.rms_norm_eps)
            unary, cand = torch.topk(drafter.normed_logits(x.reshape(-1, x.shape[-1])), top_k, dim=-1)
        b, n = at.shape
        tokens = data.tokens.gather(1, (at[:, :, None] + torch.arange(size)).reshape(b, -1)).reshape(b, n, size)
        hit = cand == tokens[:, :, 1:].reshape(-1, 1)
        ok = hit.any(1) & keep[:, :, None].expand(-1, -1, size - 1).reshape(-1)
        seen += int(keep.sum()) * (size - 1)
        acc["x"].append(x.reshape(-1, x.shape[-1])[ok])
        acc["cand"].append(cand[ok])
        acc["unary"].append(unary[ok])
        acc["idx"].append(hit[ok].float().argmax(1))
        acc["prev"].append(tokens[:, :, :-1].reshape(-1)[ok])
        acc["row"].append(torch.arange(size - 1).repeat(b * n)[ok])
    out = {k: torch.cat(v) for k, v in acc.items()}
    print(f"{len(out['idx'])} block positions of {seen} have the target's token among their top {top_k}", flush=True)
    return out


def train(ex: dict, val: dict, vocab: int, rank: int, steps: int, lr: float, decay: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    hidden = ex["x"].shape[1]
    a = (0.1 * torch.randn(vocab, rank, generator=g)).requires_grad_()
    b = (0.1 * torch.randn(vocab, rank, generator=g)).requires_grad_()
    w = (torch.randn(rank, hidden, generator=g) / hidden ** 0.5).requires_grad_()
    opt = torch.optim.AdamW([a, b, w], lr=lr, weight_decay=decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=steps, pct_start=0.05)

    def scores(d, i):
        context = a[d["prev"][i]] * (d["x"][i] @ w.T)
        return d["unary"][i] + torch.einsum("nr,nkr->nk", context, b[d["cand"][i]])

    t0 = time.time()
    for step in range(steps):
        i = torch.randint(len(ex["idx"]), (4096,), generator=g)
        loss = F.cross_entropy(scores(ex, i), ex["idx"][i])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 250 == 0 or step == steps - 1:
            with torch.no_grad():
                picked = (scores(val, slice(None)).argmax(1) == val["idx"]).float()
                alone = (val["unary"].argmax(1) == val["idx"]).float()
                rows = " ".join(f"{int(r)}: {alone[val['row'] == r].mean():.3f} -> {picked[val['row'] == r].mean():.3f}"
                                for r in (0, 1, 2, 4, 8, 14))
            print(f"step {step} ({time.time() - t0:.0f} s): loss {loss.item():.3f}; on other rows, pick = target "
                  f"{alone.mean():.3f} -> {picked.mean():.3f} (by block row {rows})", flush=True)
    return a.detach(), b.detach(), w.detach()


def export(drafter_dir: Path, out: Path, a, b, w, top_k: int) -> None:
    """The DFlash drafter's tensors, identity convolutions (base kernel 1 then 0, no correction), the selector."""
    from safetensors.torch import load_file

    cfg = json.loads((drafter_dir / "config.json").read_text())
    tensors = load_file(str(drafter_dir / "model.safetensors"))
    hidden = cfg["hidden_size"]
    for i in range(cfg["num_hidden_layers"]):
        for conv in ("attention_conv", "mlp_conv"):
            base = torch.zeros(2, TAPS, hidden)
            base[:, 0] = 1.0
            tensors[f"layers.{i}.{conv}.base_kernel"] = base
            tensors[f"layers.{i}.{conv}.kernel_projection.weight"] = torch.zeros(2 * TAPS * hidden // GROUP, hidden)
    tensors["candidate_selector.predecessor_codebook"] = a
    tensors["candidate_selector.successor_codebook"] = b
    tensors["candidate_selector.hidden_projection.weight"] = w
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["dflash_config"].update(conv_kernel_size=TAPS, conv_group_size=GROUP, selector_rank=a.shape[1],
                                selector_top_k=top_k)
    out.mkdir(parents=True, exist_ok=True)
    save(tensors, out / "model.safetensors", torch.bfloat16)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    print(f"wrote {out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--distill", type=Path, required=True, help="a demo training folder's work/distill")
    ap.add_argument("--drafter", type=Path, default=DEMO / "dflash")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--rank", type=int, default=16)  # 32 and 64 overfit 5,120 rows
    ap.add_argument("--batches", type=int, default=80)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--anchors", type=int, default=6)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    p = presets.DEMO
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(DEMO / "target" / "tokenizer.json"))
    eos, mask = tok.token_to_id(corpus.SEPARATOR), tok.token_to_id(bpe.MASK)
    target = _load_target(DEMO / "target", torch.device("cpu"))
    drafter, _ = dflash_stage.build(p, target, eos, mask, args.seed, p.block_size, args.drafter)
    seqs = distill.load(args.distill, p, eos)
    gen = torch.Generator().manual_seed(args.seed)
    ex = examples(drafter, seqs, args.batches, args.rows, args.anchors, args.top_k, gen)
    val = examples(drafter, seqs, max(1, args.batches // 10), args.rows, args.anchors, args.top_k, gen)
    a, b, w = train(ex, val, drafter.cfg.vocab_size, args.rank, args.steps, args.lr, args.weight_decay, args.seed)
    export(args.drafter, args.out, a, b, w, args.top_k)


if __name__ == "__main__":
    main()
