"""Training the embedded demo: a byte-level BPE tokenizer, a small Qwen3 target on Python source,
and its DFlash and EAGLE-3 drafters distilled from the target's own outputs and hidden states.

Models are the inference classes themselves with their tensors made trainable, run through
batched training spans (spans.py), so what is trained is exactly what the engine runs.
"""
