"""GPU: dflash vs its peers on the same random Qwen3-4B(-DFlash-b16)-shaped weights, bf16.

- transformers' Qwen3ForCausalLM, plain greedy decoding with its static cache (`generate`,
  cache_implementation="static"), no torch.compile;
- z-lab's reference loop `dflash.model.dflash_generate` (its plain mode is block_size=1);
- ours (`Session` + PlainDecoder / SpeculativeDecoder, CUDA graphs + Triton kernels).
The drafter is random, so acceptance is what random weights give (τ ≈ 1) in both DFlash loops:
the per-step costs (draft, verify+rest) are what is compared. Prints one table; writes peers.json to $OUT.
"""

import json
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.runtime.generation import PlainDecoder, Request, generate  # noqa: E402
from dflash_cli.runtime.drafters.dflash import DFlashProposer  # noqa: E402
from dflash_cli.runtime.sampling import SamplingParams  # noqa: E402
from dflash_cli.runtime.session import Session  # noqa: E402
from dflash_cli.runtime.speculative import SpeculativeDecoder  # noqa: E402
from dflash_cli.models.dflash import DFlashConfig, DFlashDrafter, checkpoint_shapes as draft_shapes  # noqa: E402
from dflash_cli.models.qwen3 import Qwen3Model, checkpoint_shapes  # noqa: E402
from dflash_cli.synthetic import target_config, random_tensors, shipped_configs  # noqa: E402

PROMPT, NEW = 128, 128
dev, bf = "cuda", torch.bfloat16


def sync_time():
    torch.cuda.synchronize()
    return time.perf_counter()


def main():
    import transformers
    from dflash import model as zlab
    from safetensors.torch import save_file

    raw = shipped_configs("qwen3-4b")
    cfg = target_config("qwen3-4b")
    weights = random_tensors(checkpoint_shapes(cfg), dev, bf, seed=0)
    prompt = torch.randint(0, cfg.vocab_size, (PROMPT,), generator=torch.Generator().manual_seed(1)).tolist()
    rows = []

    # transformers, static cache
    hf_cfg = transformers.Qwen3Config(**{k: v for k, v in raw["target"].items() if k != "architectures"})
    torch.set_default_dtype(bf)
    with torch.device(dev):
        hf = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    torch.set_default_dtype(torch.float32)
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
    ids = torch.tensor([prompt], device=dev)

    def hf_run(n):
        # disable_compile: generate would otherwise torch.compile the static-cache step on its own.
        t0 = sync_time()
        out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, cache_implementation="static",
                          disable_compile=True)
        return sync_time() - t0, out[0, PROMPT:].tolist()

    hf_run(8)
    hf_run(1)
    t1, _ = hf_run(1)
    tn, hf_tokens = hf_run(NEW)
    rows.append({"system": "transformers static cache", "mode": "plain", "ms_per_token": (tn - t1) / (NEW - 1) * 1e3,
                 "ttft_ms": t1 * 1e3})

    # z-lab reference loop, with our drafter shapes saved in z-lab's layout
    dcfg = DFlashConfig(raw["dflash"], "<peers>")
    dweights = random_tensors(draft_shapes(dcfg), dev, bf, seed=1)
    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(raw["dflash"], f)
    save_file({k: v.contiguous() for k, v in dweights.items()}, os.path.join(tmp, "model.safetensors"))
    zd = zlab.DFlashDraftModel.from_pretrained(tmp, dtype=bf).to(dev).eval()
    draft_s = [0.0]
    real_forward = zd.forward

    def timed_forward(*a, **k):
        t0 = sync_time()
        out = real_forward(*a, **k)
        draft_s[0] += sync_time() - t0
        return out

    for block, mode in ((1, "plain"), (None, "dflash")):
        zlab.dflash_generate(zd, hf, ids, 16, None, block_size=block)
        st = zlab.dflash_generate(zd, hf, ids, NEW, None, block_size=block, return_stats=True)
        steps = len(st.acceptance_lengths)
        decode = st.time_per_output_token * st.num_output_tokens
        row = {"system": "z-lab dflash_generate", "mode": mode, "ms_per_token": st.time_per_output_token * 1e3,
               "ttft_ms": st.time_to_first_token * 1e3, "step_ms": decode / steps * 1e3,
               "tau": st.num_output_tokens / steps}
        if mode == "dflash":
            zd.forward = timed_forward
            draft_s[0] = 0.0
            st2 = zlab.dflash_generate(zd, hf, ids, NEW, None, return_stats=True)
            zd.forward = real_forward
            row["draft_ms"] = draft_s[0] / len(st2.acceptance_lengths) * 1e3
            row["verify_and_rest_ms"] = row["step_ms"] - row["draft_ms"]
        rows.append(row)
    del hf, zd
    torch.cuda.empty_cache()

    # ours
    target = Qwen3Model(cfg, dict(weights), dev, bf)
    drafter = DFlashDrafter(dcfg, dict(dweights), target, "<peers>")
    session = Session(target, PROMPT + NEW + 64)
    # As `dflash bench` does: the prompt's prefill graph is captured on its first use, so the timed run replays it
    # (otherwise its first use runs uncaptured and the timed run's TTFT includes the capture: 280 ms, session 39).
    session.fast.capture_prefills = True
    for mode, decoder in (("plain", PlainDecoder()), ("dflash", SpeculativeDecoder(DFlashProposer(drafter)))):
        for _ in range(2):  # the first run captures the graphs
            session.reset()
            r = generate(session, decoder, Request(prompt, SamplingParams(), NEW))
        steps = max(len(r.steps), 1)
        row = {"system": "dflash (ours)", "mode": mode, "ms_per_token": 1e3 / r.decode_tok_per_s,
               "ttft_ms": r.ttft_s * 1e3, "step_ms": r.decode_s / steps * 1e3, "tau": (len(r.tokens) - 1) / steps}
        if mode == "dflash":
            row["draft_ms"] = sum(s.draft_s for s in r.steps) / steps * 1e3
            row["verify_and_rest_ms"] = row["step_ms"] - row["draft_ms"]
        else:
            row["same_tokens_as_transformers"] = sum(a == b for a, b in zip(r.tokens, hf_tokens))
        rows.append(row)

    print(f"\n{torch.cuda.get_device_name()} · Qwen3-4B / DFlash-b16 shapes, random weights, bf16, "
          f"prompt {PROMPT}, {NEW} new tokens")
    print(f"{'system':28s} {'mode':7s} {'ms/token':>9s} {'step ms':>8s} {'draft ms':>9s} {'verify+rest':>11s} {'tau':>5s} {'TTFT ms':>8s}")
    for r in rows:
        f = lambda k: f"{r[k]:.2f}" if k in r else "—"  # noqa: E731
        print(f"{r['system']:28s} {r['mode']:7s} {f('ms_per_token'):>9s} {f('step_ms'):>8s} {f('draft_ms'):>9s} "
              f"{f('verify_and_rest_ms'):>11s} {f('tau'):>5s} {f('ttft_ms'):>8s}")
    with open(os.path.join(os.environ.get("OUT", "."), "peers.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "transformers": transformers.__version__, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
