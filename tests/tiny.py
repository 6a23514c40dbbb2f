"""Build tiny checkpoints in the exact Hugging Face layout, for tests that never download."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# A compact Qwen3-style template: same roles, thinking switch and generation prompt.
CHAT_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if message.role != 'system' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

CORPUS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. Hello world! héllo wörld, naïve café — ünïcödé 日本語 テキスト",
    "import torch\nfor i in range(10):\n    print(i * i)\n",
    "user assistant system: what is two plus two? It is four.",
]


def make_tokenizer(out: Path, vocab_size: int = 320) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.add_special_tokens(SPECIALS)
    tok.save(str(out / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": CHAT_TEMPLATE,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "bos_token": None,
                "added_tokens_decoder": {str(i): {"content": s, "special": True} for s, i in ids.items()},
            }
        )
    )
    return tok


def qwen3_config(**over) -> dict:
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 384,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": None,
    }
    cfg.update(over)
    return cfg


def random_qwen3_tensors(cfg: dict, seed: int = 0, std: float = 0.08) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, d, inter = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    t = {"model.embed_tokens.weight": rnd(cfg["vocab_size"], h) * 10, "model.norm.weight": norm(h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update(
            {
                p + "self_attn.q_proj.weight": rnd(nh * d, h),
                p + "self_attn.k_proj.weight": rnd(nkv * d, h),
                p + "self_attn.v_proj.weight": rnd(nkv * d, h),
                p + "self_attn.o_proj.weight": rnd(h, nh * d),
                p + "self_attn.q_norm.weight": norm(d),
                p + "self_attn.k_norm.weight": norm(d),
                p + "mlp.gate_proj.weight": rnd(inter, h),
                p + "mlp.up_proj.weight": rnd(inter, h),
                p + "mlp.down_proj.weight": rnd(h, inter),
                p + "input_layernorm.weight": norm(h),
                p + "post_attention_layernorm.weight": norm(h),
            }
        )
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = rnd(cfg["vocab_size"], h) * 10
    return t


def make_qwen3(out: Path, seed: int = 0, shards: int = 1, with_tokenizer: bool = True, **over) -> Path:
    """Write a random-weight Qwen3 checkpoint (config, safetensors, tokenizer, generation config)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = qwen3_config(**over)
    if with_tokenizer:
        tok = make_tokenizer(out)
        im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
        cfg["eos_token_id"] = im_end
        (out / "generation_config.json").write_text(
            json.dumps({"eos_token_id": [im_end, eot], "pad_token_id": eot, "temperature": 0.6, "top_p": 0.95, "top_k": 20})
        )
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    save_sharded(random_qwen3_tensors(cfg, seed), out, shards)
    return out


def save_sharded(tensors: dict[str, torch.Tensor], out: Path, shards: int = 1) -> None:
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def make_dflash(out: Path, target_cfg: dict, seed: int = 1, layers: int = 2, block_size: int = 8,
                target_layer_ids=None, mask_token_id=None, std: float = 0.08, **extra) -> Path:
    """A random DFlash drafter in z-lab's layout (Qwen3 layers + fc + hidden_norm + norm). extra: more config fields
    (e.g. layer_types, sliding_window, use_sliding_window for sliding-window layers)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    n_target = target_cfg["num_hidden_layers"]
    ids = target_layer_ids if target_layer_ids is not None else [0, n_target - 2][:layers]
    cfg = dict(target_cfg, architectures=["DFlashDraftModel"], num_hidden_layers=layers, num_target_layers=n_target,
               block_size=block_size,
               dflash_config={"mask_token_id": mask_token_id if mask_token_id is not None else target_cfg["vocab_size"] - 1,
                              "target_layer_ids": ids}, **extra)
    g = torch.Generator().manual_seed(seed)
    layer_tensors = random_qwen3_tensors(dict(cfg, vocab_size=1, tie_word_embeddings=True), seed, std)
    t = {k[len("model."):]: v for k, v in layer_tensors.items() if k.startswith("model.layers.")}
    h = cfg["hidden_size"]
    t["fc.weight"] = torch.randn(h, len(ids) * h, generator=g) * std
    t["hidden_norm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    t["norm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=g)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    save_sharded(t, out)
    return out


def make_dflash2(out: Path, target_cfg: dict, seed: int = 1, layers: int = 2, block_size: int = 8,
                 target_layer_ids=None, mask_token_id=None, std: float = 0.08, kernel_size: int = 2,
                 group_size: int = 16, rank: int = 8, top_k: int = 4, layout: str = "z-lab") -> Path:
    """A random DFlash 2 drafter: make_dflash's body plus the two convolutions of every layer and the candidate
    selector, in z-lab's layout (Qwen3 fields + dflash_config; codebooks without `.weight`) or the speculators one
    (transformer_layer_config, aux_hidden_state_layer_ids = target layer ids + 1, sizes at the top level, the
    verifier's embeddings and head copied in)."""
    out = Path(out)
    make_dflash(out, target_cfg, seed, layers, block_size, target_layer_ids, mask_token_id, std)
    cfg = json.loads((out / "config.json").read_text())
    from safetensors.torch import load_file

    t = load_file(str(out / "model.safetensors"))
    g = torch.Generator().manual_seed(seed + 1000)
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    groups = h // group_size
    for i in range(layers):
        for conv in ("attention_conv", "mlp_conv"):
            base = 0.3 * torch.randn(2, kernel_size, h, generator=g)
            base[:, 0] += 1.0  # near the identity, as trained ones start
            t[f"layers.{i}.{conv}.base_kernel"] = base
            t[f"layers.{i}.{conv}.kernel_projection.weight"] = torch.randn(2 * kernel_size * groups, h, generator=g) * std
    t["candidate_selector.predecessor_codebook"] = torch.randn(v, rank, generator=g)
    t["candidate_selector.successor_codebook"] = torch.randn(v, rank, generator=g)
    t["candidate_selector.hidden_projection.weight"] = torch.randn(rank, h, generator=g) * 0.5
    sizes = {"conv_kernel_size": kernel_size, "conv_group_size": group_size, "selector_rank": rank,
             "selector_top_k": top_k}
    if layout == "z-lab":
        cfg["architectures"] = ["DFlash2DraftModel"]
        cfg["dflash_config"].update(sizes, block_size=block_size)
    else:
        block = cfg.pop("dflash_config")
        for k in ("architectures", "block_size", "num_target_layers"):
            cfg.pop(k)
        cfg = {"speculators_model_type": "dflash2", "architectures": ["DFlash2DraftModel"],
               "transformer_layer_config": cfg, "draft_vocab_size": v, "block_size": block_size,
               "mask_token_id": block["mask_token_id"],
               "aux_hidden_state_layer_ids": [i + 1 for i in block["target_layer_ids"]], **sizes,
               "speculators_config": {"algorithm": "dflash2", "default_proposal_method": "greedy",
                                      "proposal_methods": [{"proposal_type": "greedy",
                                                            "speculative_tokens": block_size - 1}]}}
        t["embed_tokens.weight"] = torch.zeros(v, h)
        t["lm_head.weight"] = torch.zeros(v, h)
        for name in ("predecessor_codebook", "successor_codebook"):  # the nn.Embedding variant's names
            t[f"candidate_selector.{name}.weight"] = t.pop(f"candidate_selector.{name}")
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    save_sharded(t, out)
    return out


def make_eagle3(out: Path, target_cfg: dict, seed: int = 2, draft_vocab: int = 200, head_dim: int | None = None,
                layout: str = "midlayer.", std: float = 0.08, **extra) -> Path:
    """A random EAGLE-3 drafter in the native EAGLE/SpecForge layout (midlayer.*, d2t offsets, t2d mask)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    h, v = target_cfg["hidden_size"], target_cfg["vocab_size"]
    heads, kv = target_cfg["num_attention_heads"], target_cfg["num_key_value_heads"]
    d = head_dim or target_cfg.get("head_dim") or h // heads
    inter = target_cfg["intermediate_size"]
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
           "hidden_size": h, "intermediate_size": inter, "head_dim": d, "num_attention_heads": heads,
           "num_key_value_heads": kv, "rms_norm_eps": 1e-6, "rope_theta": target_cfg.get("rope_theta", 10000.0),
           "vocab_size": v, "draft_vocab_size": draft_vocab, "hidden_act": "silu", "tie_word_embeddings": False,
           **extra}
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=g) * std  # noqa: E731
    norm = lambda n: 1.0 + 0.1 * torch.randn(n, generator=g)  # noqa: E731
    p, a = layout, layout + "self_attn."
    t = {"fc.weight": rnd(h, 3 * h), a + "q_proj.weight": rnd(heads * d, 2 * h), a + "k_proj.weight": rnd(kv * d, 2 * h),
         a + "v_proj.weight": rnd(kv * d, 2 * h), a + "o_proj.weight": rnd(h, heads * d),
         p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
         p + "mlp.down_proj.weight": rnd(h, inter), p + "hidden_norm.weight": norm(h),
         p + "input_layernorm.weight": norm(h), p + "post_attention_layernorm.weight": norm(h),
         "norm.weight": norm(h), "lm_head.weight": rnd(draft_vocab, h) * 4}
    used = torch.randperm(v, generator=g)[:draft_vocab].sort().values
    t["d2t"] = used - torch.arange(draft_vocab)  # stored as offsets, as EAGLE's training script writes them
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[used] = True
    t["t2d"] = t2d
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    save_sharded(t, out)
    return out


def qwen35_text_config(**over) -> dict:
    """A tiny Qwen3.5 text tower: 3 Gated DeltaNet layers then 1 gated-attention layer, repeated."""
    layers = over.pop("num_hidden_layers", 4)
    cfg = {
        "model_type": "qwen3_5_text", "vocab_size": 384, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512, "attention_bias": False, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "eos_token_id": None,
    }
    cfg.update(over)
    return cfg


def random_qwen35_tensors(text: dict, seed: int = 0, std: float = 0.08) -> dict[str, torch.Tensor]:
    """Text-tower tensors under model.language_model. (the published multimodal layout), lm_head at the top."""
    g = torch.Generator().manual_seed(seed)
    h, inter, v = text["hidden_size"], text["intermediate_size"], text["vocab_size"]
    d, nh, nkv = text["head_dim"], text["num_attention_heads"], text["num_key_value_heads"]
    hk, hv = text["linear_num_key_heads"], text["linear_num_value_heads"]
    kd, vd = hk * text["linear_key_head_dim"], hv * text["linear_value_head_dim"]
    conv_dim = 2 * kd + vd

    def rnd(*shape, s=std):
        return torch.randn(*shape, generator=g) * s

    def zc(n):  # a (1 + w) norm's w
        return 0.1 * torch.randn(n, generator=g)

    p0 = "model.language_model."
    t = {p0 + "embed_tokens.weight": rnd(v, h, s=1.0), p0 + "norm.weight": zc(h)}
    for i, kind in enumerate(text["layer_types"]):
        p = f"{p0}layers.{i}."
        t.update({p + "input_layernorm.weight": zc(h), p + "post_attention_layernorm.weight": zc(h),
                  p + "mlp.gate_proj.weight": rnd(inter, h), p + "mlp.up_proj.weight": rnd(inter, h),
                  p + "mlp.down_proj.weight": rnd(h, inter)})
        if kind == "full_attention":
            a = p + "self_attn."
            t.update({a + "q_proj.weight": rnd(2 * nh * d, h), a + "k_proj.weight": rnd(nkv * d, h),
                      a + "v_proj.weight": rnd(nkv * d, h), a + "o_proj.weight": rnd(h, nh * d),
                      a + "q_norm.weight": zc(d), a + "k_norm.weight": zc(d)})
        else:
            a = p + "linear_attn."
            # Decay rates from weak to very strong, as transformers initialises them (A in U(0.01, 16)).
            A = torch.empty(hv).uniform_(0.01, 16, generator=g)
            t.update({a + "in_proj_qkv.weight": rnd(conv_dim, h, s=0.2), a + "in_proj_z.weight": rnd(vd, h),
                      a + "in_proj_b.weight": rnd(hv, h, s=0.3), a + "in_proj_a.weight": rnd(hv, h, s=0.3),
                      a + "conv1d.weight": rnd(conv_dim, 1, text["linear_conv_kernel_dim"], s=0.5),
                      a + "A_log": A.log(), a + "dt_bias": 1.0 + rnd(hv, s=0.5),
                      a + "norm.weight": 1.0 + zc(text["linear_value_head_dim"]),
                      a + "out_proj.weight": rnd(h, vd)})
    if not text["tie_word_embeddings"]:
        t["lm_head.weight"] = rnd(v, h, s=1.0)
    return t


def random_mtp_tensors(text: dict, seed: int = 0, std: float = 0.08, prefix: str = "mtp.") -> dict[str, torch.Tensor]:
    """The multi-token-prediction layer every Qwen3.5 checkpoint ships: fc [H, 2H], the two pre-fc (1 + w) norms, a
    full-attention decoder layer (mtp.layers.0.*) and its final norm; `prefix` "model.mtp." as some exports write it."""
    one = random_qwen35_tensors(dict(text, layer_types=["full_attention"], tie_word_embeddings=True), seed, std)
    layer = "model.language_model.layers.0."
    t = {prefix + "layers.0." + k[len(layer):]: v for k, v in one.items() if k.startswith(layer)}
    g = torch.Generator().manual_seed(seed + 1)
    h = text["hidden_size"]
    t[prefix + "fc.weight"] = torch.randn(h, 2 * h, generator=g) * std
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        t[prefix + name + ".weight"] = 0.1 * torch.randn(h, generator=g)
    return t


def make_qwen35(out: Path, seed: int = 0, shards: int = 1, with_tokenizer: bool = True, extras: bool = True,
                mtp_prefix: str = "mtp.", **over) -> Path:
    """A random-weight Qwen3.5 checkpoint as the Hub publishes them (Qwen3_5ForConditionalGeneration: text tower
    under model.language_model.), with dummy vision (model.visual.*) and a random MTP layer (mtp.*, under
    `mtp_prefix`) that a text target must ignore, where `extras` (without: a checkpoint with neither)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = qwen35_text_config(**over)
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
           "tie_word_embeddings": text["tie_word_embeddings"], "text_config": text,
           "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32},
           "image_token_id": 248056, "video_token_id": 248057}
    if with_tokenizer:
        tok = make_tokenizer(out)
        im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
        text["eos_token_id"] = im_end
        (out / "generation_config.json").write_text(
            json.dumps({"eos_token_id": [im_end, eot], "pad_token_id": eot, "temperature": 0.6, "top_p": 0.95,
                        "top_k": 20}))
    if extras:
        text.update(mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    tensors = random_qwen35_tensors(text, seed)
    if extras:
        tensors.update({"model.visual.patch_embed.proj.weight": torch.zeros(32, 3, 2, 4, 4),
                        "model.visual.blocks.0.attn.qkv.weight": torch.zeros(96, 32)})
        tensors.update(random_mtp_tensors(text, seed + 100, prefix=mtp_prefix))
    save_sharded(tensors, out, shards)
    return out


def make_predictable_qwen35(out: Path, damp: float = 0.5, head: float = 1.0, **kw) -> Path:
    """make_qwen35 whose MTP drafts are often right: the target's layers are damped (their output projections times
    `damp`), so that its next token depends mostly on the last one, and the MTP's fc passes the token's normed
    embedding through (its layer adds little), so that it predicts what the target predicts from that token alone.
    Speculative runs then accept every count of drafts, not only none. head: scales the (untied) head, < 1 for
    flatter next-token distributions."""
    from safetensors.torch import load_file

    out = make_qwen35(out, **kw)
    tensors = load_file(str(out / "model.safetensors"))
    for name in list(tensors):
        if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            tensors[name] = tensors[name] * damp
    if "lm_head.weight" in tensors:
        tensors["lm_head.weight"] = tensors["lm_head.weight"] * head
    fc = next(n for n in tensors if n.endswith("mtp.fc.weight"))
    h = tensors[fc].shape[0]
    tensors[fc] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
    save_sharded(tensors, out)
    return out
