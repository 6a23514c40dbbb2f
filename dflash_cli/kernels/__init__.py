"""Fast CUDA kernels (Triton). Each has a torch reference in layers/ops.py it is checked against."""
