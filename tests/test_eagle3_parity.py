"""Our EAGLE-3 drafter against a reference assembled from transformers' Llama modules.

The reference follows EAGLE-3's inference semantics as EAGLE, SpecForge and
speculators implement them: row p pairs fc(target states at p) with the
embedding of token p+1; inside the first layer the normed embedding and the
normed state are concatenated into q/k/v; chained steps feed the layer's
pre-norm output back as the state at the next position. It recomputes the whole
prefix at every step (no reuse), so it also checks our cached rows and rollback.
"""

import json

import pytest
import torch

from dflash_cli.runtime.generation import Request, generate
from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from dflash_cli.models.eagle3 import Eagle3Config, Eagle3Drafter
from dflash_cli.models.qwen3 import Qwen3Model
from tiny import make_eagle3, make_qwen3

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama as llama  # noqa: E402


class ReferenceEagle3(torch.nn.Module):
    def __init__(self, draft_dir, target_embed):
        super().__init__()
        raw = json.loads((draft_dir / "config.json").read_text())
        self.raw = raw
        cfg = llama.LlamaConfig(**{k: v for k, v in raw.items() if k not in ("architectures", "draft_vocab_size")})
        cfg._attn_implementation = "eager"
        h = cfg.hidden_size
        self.layer = llama.LlamaDecoderLayer(cfg, 0)
        att = self.layer.self_attn
        att.q_proj = torch.nn.Linear(2 * h, cfg.num_attention_heads * cfg.head_dim, bias=False)
        att.k_proj = torch.nn.Linear(2 * h, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        att.v_proj = torch.nn.Linear(2 * h, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.layer.hidden_norm = llama.LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.fc = torch.nn.Linear(3 * h, h, bias=False)
        self.norm = llama.LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.lm_head = torch.nn.Linear(h, raw["draft_vocab_size"], bias=False)
        self.rotary = llama.LlamaRotaryEmbedding(cfg)
        from safetensors.torch import load_file

        sd = load_file(str(draft_dir / "model.safetensors"))
        self.d2t = sd.pop("d2t")
        sd.pop("t2d")
        mine = {k.replace("midlayer.", "layer."): v for k, v in sd.items()}
        missing, unexpected = self.load_state_dict(mine, strict=False)
        assert not unexpected and all(k.startswith("rotary") for k in missing), (missing, unexpected)
        self.embed = target_embed
        self.eval()

    def _layer(self, emb, state, pos, cache, mask):
        lay = self.layer
        x = torch.cat([lay.input_layernorm(emb), lay.hidden_norm(state)], dim=-1)
        pe = self.rotary(x, pos)
        a, _ = lay.self_attn(x, position_embeddings=pe, attention_mask=mask, past_key_values=cache)
        h = state + a
        return h + lay.mlp(lay.post_attention_layernorm(h))

    @torch.no_grad()
    def chain(self, features, tokens, last, k):
        """features [c, 3H] for positions 0..c-1, tokens at 1..c-1 then `last`; k chained drafts (greedy)."""
        from transformers import DynamicCache

        c = features.shape[0]
        ids = torch.tensor(tokens[1:] + [last])
        state = self.fc(features)[None]
        cache = DynamicCache()
        mask = torch.full((c, c), float("-inf")).triu(1)[None, None]
        out = self._layer(self.embed(ids)[None], state, torch.arange(c)[None], cache, mask)[:, -1:]
        logits = []
        for i in range(k):
            row = self.lm_head(self.norm(out))[0, 0]
            logits.append(row)
            tok = int(row.argmax() + self.d2t[row.argmax()])
            out = self._layer(self.embed(torch.tensor([[tok]])), out, torch.tensor([[c + i]]), cache, None)
        return torch.stack(logits)


@pytest.fixture(scope="module", params=[None, 24], ids=["head_dim=h/heads", "head_dim=24"])
def setup(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3")
    target_dir = make_qwen3(root / "target", seed=7, num_hidden_layers=8)
    cfg = json.loads((target_dir / "config.json").read_text())
    draft_dir = make_eagle3(root / "draft", cfg, seed=8, head_dim=request.param)
    ours_t = Qwen3Model.load(target_dir)
    ours_d = Eagle3Drafter.load(draft_dir, ours_t)
    ref_t = transformers.Qwen3ForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    ref_d = ReferenceEagle3(draft_dir, ref_t.model.embed_tokens)
    return ours_t, ours_d, ref_t, ref_d


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_default_aux_layers_are_inputs_of_2_half_and_minus_3(setup):
    _, ours_d, _, _ = setup
    assert ours_d.capture == (2, 4, 5)  # transformers hidden_states indices for L = 8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chained_draft_logits_match_reference_at_every_step(setup, seed):
    ours_t, ours_d, ref_t, ref_d = setup
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 300, (9 + seed,), generator=g).tolist()
    k = 5

    proposer = Eagle3Proposer(ours_d)
    seen = []  # (committed tokens, last, our logits per chained step)
    orig = proposer.chain_step

    def spy(pos, state, token):
        logits, out = orig(pos, state, token)
        seen[-1][2].append(logits)
        return logits, out

    orig_propose = proposer.propose

    def propose(last, n, params):
        seen.append((session_tokens(), last, []))
        return orig_propose(last, n, params)

    session = Session(ours_t, max_len=128)
    history = list(prompt)
    session_tokens = lambda: history[: session.length]  # noqa: E731
    proposer.propose = propose
    proposer.chain_step = spy
    res = generate(session, SpeculativeDecoder(proposer, k),
                   Request(prompt_ids=prompt, max_tokens=30, params=SamplingParams(temperature=0.0)),
                   on_step=lambda step: history.extend(step.emitted))
    assert len(res.tokens) == 30 and len(seen) >= 4
    worst = 0.0
    for tokens, last, ours in seen:
        with torch.no_grad():
            hs = ref_t(torch.tensor([tokens]), output_hidden_states=True).hidden_states
        features = torch.cat([hs[i][0] for i in ours_d.capture], dim=-1)
        ref = ref_d.chain(features, tokens, last, len(ours))
        worst = max(worst, rel_err(torch.stack(ours), ref))
    assert worst <= 1e-4


def test_speculators_layout_and_bin_weights_load(setup, tmp_path):
    """`layers.0.*` names (vLLM/speculators) and a pytorch_model.bin give the same drafter."""
    from safetensors.torch import load_file

    ours_t, ours_d, _, _ = setup
    src = ours_d.c.path.parent
    sd = {k.replace("midlayer.", "layers.0."): v for k, v in load_file(str(src / "model.safetensors")).items()}
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    torch.save(sd, tmp_path / "pytorch_model.bin")
    other = Eagle3Drafter.load(tmp_path, ours_t)
    assert torch.equal(other.qkv, ours_d.qkv) and torch.equal(other.draft_to_target, ours_d.draft_to_target)


def test_drafter_for_another_target_is_refused(setup, tmp_path):
    from dflash_cli.errors import DflashError

    ours_t, ours_d, _, _ = setup
    raw = json.loads((ours_d.c.path).read_text())
    raw["hidden_size"] = 32
    with pytest.raises(DflashError, match="different target|hidden size"):
        Eagle3Config(raw, tmp_path / "config.json", ours_t.cfg)
