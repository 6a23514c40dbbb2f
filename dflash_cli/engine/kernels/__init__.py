"""Fast CUDA kernels (Triton). Each has a torch reference in engine/ops.py it is checked against."""
