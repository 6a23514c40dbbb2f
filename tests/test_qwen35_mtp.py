"""`--draft mtp`: the multi-token-prediction layer every Qwen3.5 checkpoint ships, as a chained drafter.

1. One MTP step against a reference built from transformers' own Qwen3_5Attention / Qwen3_5MLP / Qwen3_5RMSNorm
   modules following vLLM's formula (qwen3_5_mtp.py): logits of every step of a chain, and the mtp. / model.mtp.
   layouts.
2. Lossless in float32: greedy speculative tokens equal plain greedy tokens over prompts, checkpoints and chain
   lengths, on the eager and the static (graph-capturable) paths, and over two chat turns.
3. Temperature > 0: the joint distribution of the first tokens equals the plain sampler's exact one (chi-square).
4. `dflash generate --draft mtp` on a local folder; a clear error for a target without MTP weights.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from dflash_cli.models.mtp import MtpDrafter
from dflash_cli.models.qwen35 import Qwen35Model
from dflash_cli.runtime.drafters.mtp import MtpProposer
from dflash_cli.runtime.generation import PlainDecoder, Request, generate
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from dflash_cli.loading.weights import tensor_files
from test_speculative_lossless import assert_same, check_steps
from test_speculative_sampling import VOCAB as SMALL_VOCAB, assert_joint_fits, exact_joint, sampled_joint
from tiny import make_predictable_qwen35, make_qwen3, make_qwen35

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: thousands of tiny forwards

GREEDY = SamplingParams()
MAX_LEN = 160
VOCAB = 384
LENGTHS = [1, 3, 8, 17, 40]  # 40: a prefill longer than a step's rows


def load(folder) -> tuple[Qwen35Model, MtpDrafter]:
    target = Qwen35Model.load(folder)
    return target, MtpDrafter.load(folder, target)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """Two predictable checkpoints (every accepted count occurs) and prompts."""
    root = tmp_path_factory.mktemp("mtp")
    made = [load(make_predictable_qwen35(root / f"t{seed}", seed=seed, with_tokenizer=False)) for seed in (7, 8)]
    rng = random.Random(3)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in LENGTHS]
    return {"pairs": made, "prompts": prompts, "plain": {}}


def plain(pairs, i, prompt, max_tokens):
    key = (i, tuple(prompt), max_tokens)
    if key not in pairs["plain"]:
        session = Session(pairs["pairs"][i][0], MAX_LEN)
        pairs["plain"][key] = generate(session, PlainDecoder(), Request(list(prompt), GREEDY, max_tokens))
    return pairs["plain"][key]


# ---------------------------------------------------------------------------------------------
# 1. parity with a transformers-built reference

transformers = pytest.importorskip("transformers")
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402
from transformers.models.qwen3_5.modeling_qwen3_5 import (  # noqa: E402
    Qwen3_5Attention, Qwen3_5MLP, Qwen3_5RMSNorm, Qwen3_5TextRotaryEmbedding)


class ReferenceMTP(torch.nn.Module):
    """vLLM's Qwen3_5MultiTokenPredictor (one layer) out of transformers' modules, without a cache: every call runs
    all rows so far under a causal mask. Rows: (state H_t, the token at t+1), at positions 0, 1, ..."""

    def __init__(self, cfg: Qwen3_5TextConfig, embed: torch.nn.Embedding, head: torch.nn.Linear):
        super().__init__()
        h = cfg.hidden_size
        self.embed, self.head = embed, head
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(h, cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(h, cfg.rms_norm_eps)
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.input_layernorm = Qwen3_5RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = Qwen3_5Attention(cfg, layer_idx=0)
        self.post_attention_layernorm = Qwen3_5RMSNorm(h, cfg.rms_norm_eps)
        self.mlp = Qwen3_5MLP(cfg, cfg.intermediate_size)
        self.norm = Qwen3_5RMSNorm(h, cfg.rms_norm_eps)
        self.rotary = Qwen3_5TextRotaryEmbedding(cfg)

    def forward(self, states: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """states [T, H] (normed), next_ids [T] -> normed outputs [T, H]."""
        t = states.shape[0]
        x = torch.cat([self.pre_fc_norm_embedding(self.embed(next_ids)), self.pre_fc_norm_hidden(states)], -1)
        h = self.fc(x)[None]
        pos = torch.arange(t)[None]
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        attn, _ = self.self_attn(self.input_layernorm(h), self.rotary(h, pos), mask)
        h = h + attn
        h = h + self.mlp(self.post_attention_layernorm(h))
        return self.norm(h)[0]


def reference(folder, prefix="mtp."):
    """transformers' target (its final normed states: last_hidden_state) and the reference MTP, same weights."""
    text = json.loads((folder / "config.json").read_text())["text_config"]
    cfg = Qwen3_5TextConfig(**{k: v for k, v in text.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    weights = {}
    for name, path in tensor_files(folder).items():
        weights[name] = load_file(str(path))[name]
    target = Qwen3_5ForCausalLM(cfg).eval()
    target.load_state_dict({n.replace("model.language_model.", "model."): w for n, w in weights.items()
                            if n.startswith("model.language_model.") or n == "lm_head.weight"})
    mtp = ReferenceMTP(cfg, target.model.embed_tokens, target.lm_head).eval()
    own = {n[len(prefix):].replace("layers.0.", ""): w for n, w in weights.items() if n.startswith(prefix)}
    missing, unexpected = mtp.load_state_dict(own, strict=False)
    assert not unexpected and {n.split(".")[0] for n in missing} == {"embed", "head"}  # shared with the target
    return target, mtp


@pytest.mark.parametrize("path,prefix", [("eager", "mtp."), ("static", "model.mtp.")])
def test_mtp_chain_matches_a_transformers_reference(tmp_path, path, prefix):
    """Logits of every step of a 6-step chain after a prompt: the first step from the target's own normed state,
    later ones from the MTP's normed output, each fed the token drafted before."""
    folder = make_qwen35(tmp_path / "t", seed=5, with_tokenizer=False, mtp_prefix=prefix)
    ref_target, ref_mtp = reference(folder, prefix)
    target, mtp = load(folder)
    prompt = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    proposer = MtpProposer(mtp)
    session = Session(target, 64, path=path)
    decoder = SpeculativeDecoder(proposer, 6)
    logits = decoder.prefill(session, prompt)
    last = int(logits.argmax())
    with torch.no_grad():
        states = ref_target.model(torch.tensor([prompt])).last_hidden_state[0]  # after the final norm
        tokens = prompt[1:] + [last]
        pos, state = proposer.first_state()
        token = last
        for step in range(6):
            ref = ref_mtp.head(ref_mtp(states, torch.tensor(tokens)))[-1]
            ours, state = proposer.chain_step(pos + step, state, token)
            err = ((ours - ref).abs().max() / ref.abs().max()).item()
            assert err <= 1e-4, (step, err)
            token = int(ours.argmax())
            assert token == int(ref.argmax())
            states = torch.cat([states, ref_mtp(states, torch.tensor(tokens))[-1:]])  # the chained state
            tokens.append(token)


def test_the_target_skips_what_the_mtp_loads(tmp_path):
    """The MTP loads exactly the mtp.* tensors (the target loader skips them), and shares the target's embedding
    and head; a checkpoint without them, or a Qwen3 target, is refused with a clear error."""
    from dflash_cli.errors import DflashError

    folder = make_qwen35(tmp_path / "t", seed=5, with_tokenizer=False, tie_word_embeddings=True)
    target, mtp = load(folder)
    assert mtp.embed is target.embed and mtp.lm_head is target.lm_head and mtp.capture == (4,)
    bare = make_qwen35(tmp_path / "bare", seed=5, with_tokenizer=False, extras=False)
    with pytest.raises(DflashError, match="no multi-token-prediction weights"):
        MtpDrafter.load(bare, Qwen35Model.load(bare))


# ---------------------------------------------------------------------------------------------
# 2. lossless


def spec(model, mtp, prompt, max_tokens, path, draft_len=None, stops=()):
    decoder = SpeculativeDecoder(MtpProposer(mtp), draft_len)
    res = generate(Session(model, MAX_LEN, path=path), decoder, Request(list(prompt), GREEDY, max_tokens, stops))
    check_steps(res, len(prompt), max_tokens, MAX_LEN, decoder.draft_len)
    return res


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("draft_len", [1, None, 6])
def test_greedy_mtp_equals_plain(pairs, path, draft_len):
    accepted = set()
    for i, (model, mtp) in enumerate(pairs["pairs"]):
        for j, prompt in enumerate(pairs["prompts"]):
            m = 24 + 3 * j
            res = spec(model, mtp, prompt, m, path, draft_len)
            assert_same(res, plain(pairs, i, prompt, m))
            accepted |= {s.accepted for s in res.steps}
    k = draft_len or MtpProposer(pairs["pairs"][0][1]).default_draft
    assert accepted == set(range(k + 1))  # every accepted count, from none to the whole chain


@pytest.mark.parametrize("path", ["eager", "static"])
def test_two_chat_turns_with_mtp(pairs, path):
    """A second turn on the same session (its pending token, the recurrent state and the MTP's cache continued)
    answers as plain decoding's second turn does."""
    model, mtp = pairs["pairs"][1]
    a, b = pairs["prompts"][2], pairs["prompts"][1]
    results = []
    for make in (PlainDecoder, lambda: SpeculativeDecoder(MtpProposer(mtp), 4)):
        session, decoder = Session(model, MAX_LEN, path=path), make()
        results.append([generate(session, decoder, Request(list(p), GREEDY, 20)).tokens for p in (a, b)])
    assert results[0] == results[1]


# ---------------------------------------------------------------------------------------------
# 3. sampling: the target's distribution


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A hybrid target over 8 tokens (one linear, one attention layer) with its MTP: distributions with several
    likely tokens (a flatter head), drafts often but not always accepted."""
    folder = make_predictable_qwen35(tmp_path_factory.mktemp("small") / "t", damp=0.5, head=0.2, seed=4,
                                     with_tokenizer=False, vocab_size=SMALL_VOCAB,
                                     hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     layer_types=["linear_attention", "full_attention"], num_attention_heads=2,
                                     num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
                                     linear_num_value_heads=2)
    return load(folder)


CONFIGS = {  # (params, draft length, runs)
    "T1-k2": (SamplingParams(temperature=1.0), 2, 1000),
    "topk-topp-k1": (SamplingParams(temperature=0.8, top_k=3, top_p=0.8), 1, 800),
}


@pytest.mark.parametrize("path,config", [("eager", "T1-k2"), ("static", "topk-topp-k1"), ("static", "T1-k2")])
def test_sampled_mtp_keeps_the_target_distribution(small, path, config):
    target, mtp = small
    params, draft_len, runs = CONFIGS[config]
    decoder = SpeculativeDecoder(MtpProposer(mtp), draft_len)
    counts, accepted, drafted = sampled_joint(target, decoder, params, runs, path)
    assert 0.02 < accepted / drafted < 0.95, accepted / drafted  # both branches of the rejection sampler
    assert_joint_fits(counts, exact_joint(target, params), config)


# ---------------------------------------------------------------------------------------------
# 4. the CLI


def test_generate_cli_with_draft_mtp(tmp_path, cli):
    """`dflash generate --draft mtp` on a local Qwen3.5 folder: the greedy tokens of --draft none; a Qwen3 target and
    a Qwen3.5 checkpoint without mtp.* tensors get one error line."""
    target = make_predictable_qwen35(tmp_path / "target", seed=8)
    runs = {}
    for draft in ("none", "mtp"):
        r = cli("generate", "-m", target, "-p", "import torch", "--raw", "--temperature", "0", "--json", "-n", "24",
                "--draft", draft, "--device", "cpu")
        assert r.code == 0, r.err
        runs[draft] = r.json()
    assert runs["mtp"]["tokens"] == runs["none"]["tokens"] and runs["mtp"]["stats"]["draft_kind"] == "mtp"
    for folder, says in ((make_qwen3(tmp_path / "qwen3"), "needs a Qwen3.5 model"),
                         (make_qwen35(tmp_path / "bare", extras=False), "no multi-token-prediction weights")):
        r = cli("generate", "-m", folder, "-p", "hi", "--raw", "-n", "4", "--draft", "mtp", "--device", "cpu")
        assert r.code != 0 and "error:" in r.err and says in r.err and "Traceback" not in r.err, r.err


def test_synthetic_mtp_drafter():
    """--synthetic --draft mtp: a random MTP of a Qwen3.5 entry's shapes drafts losslessly; a Qwen3 entry has none."""
    from dflash_cli.errors import DflashError
    from dflash_cli.synthetic import random_drafter, random_target

    model = random_target("qwen3.5-4b", "cpu", torch.float32, vocab_size=512, hidden_size=64, intermediate_size=96,
                          num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                          head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16, max_position_embeddings=128)
    mtp = random_drafter("qwen3.5-4b", "mtp", model)
    req = Request([5, 6, 7, 8], GREEDY, 12)
    res = generate(Session(model, 64, path="static"), SpeculativeDecoder(MtpProposer(mtp)), req)
    assert res.tokens == generate(Session(model, 64), PlainDecoder(), req).tokens
    qwen3 = random_target("qwen3-4b", "cpu", torch.float32, vocab_size=256, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    with pytest.raises(DflashError, match="no multi-token-prediction layer"):
        random_drafter("qwen3-4b", "mtp", qwen3)
