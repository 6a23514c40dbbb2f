"""A byte-level BPE tokenizer trained with `tokenizers`, written in the Hugging Face layout."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .corpus import SEPARATOR

# End of file (also the generation stop) and the mask token DFlash fills its blocks with.
MASK = "<|mask|>"
SPECIALS = [SEPARATOR, MASK]

# A code-completion model: the template passes each message through (no role markers), earlier messages
# ending with a newline; the last one (the prompt) does not, so `generate --prompt "def f():"` completes the
# line it was given instead of starting a new definition, and chat turns simply append.
CHAT_TEMPLATE = ("{%- for message in messages %}{{- message.content }}"
                 "{%- if not loop.last or not add_generation_prompt %}{{- '\\n' }}{%- endif %}{%- endfor %}")


def train(texts: list[str], vocab_size: int, out: Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens(SPECIALS)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "eos_token": SEPARATOR,
        "pad_token": SEPARATOR,
        "bos_token": None,
        "model_max_length": 1 << 20,
        "added_tokens_decoder": {str(i): {"content": s, "special": True, "lstrip": False, "rstrip": False,
                                          "normalized": False, "single_word": False} for s, i in ids.items()},
    }, indent=1))
    return tok


def encode(tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    """One token stream: every file followed by the end-of-text separator."""
    sep = tok.token_to_id(SEPARATOR)
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(sep)
    return torch.tensor(ids, dtype=torch.int32)
