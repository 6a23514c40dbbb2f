"""The torch reference semantics of every operation (ops: the one dispatcher to the kernels), spans and the KV cache."""
