"""How a decoder's pre-norm residual stream is carried between its sublayers on this device and row count.

Every sublayer reads RMSNorm(h) and adds its output back into h. Where each norm and each add runs is the fusion
plan's choice (`plan`), made once a forward from the rows and the layers' weights:

- "add": the sublayer's output product writes its result alone; the add runs in one kernel with the norm that
  reads h next (ops.add_rms_norm), or as a plain add at the end.
- "residual": the output product adds h itself (ops.linear's residual); the next product normalises h itself
  (ops.linear's norm: the norm's weight is folded into that product's).
- "squares": as "residual", and the product also leaves the partial sums of squares of what it wrote, which the
  next product's norm uses instead of reading h twice (ops.linear_squares): one row, a decode step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import ops


@dataclass
class Residual:
    """The residual stream h, with a sublayer's output still to add to it (`delta`, under "add") or the partial sums
    of squares its writer left (`squares`, under "squares"). The pending add is done in place by whoever reads the
    stream next, so a layer's output captured before that is complete once read."""

    h: torch.Tensor
    delta: torch.Tensor | None = None
    squares: torch.Tensor | None = None

    def settle(self) -> torch.Tensor:
        """h with any pending add done."""
        if self.delta is not None:
            self.h, self.delta = self.h + self.delta, None
        return self.h


@dataclass(frozen=True)
class Fusion:
    """Where the norms and adds of a forward's sublayers run (see the module's docstring)."""

    norm_in_product: bool  # the products after a norm normalise their input themselves (folded norm weights)
    attention_out: str  # "add" | "residual" | "squares": how the o product's output joins h
    mlp_out: str  # likewise for the down product
    eps: float

    def read(self, s: Residual, weight: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """The input of the product after RMSNorm(h) by `weight`, and the keyword arguments that product takes
        (ops.linear's norm and squares where it normalises itself)."""
        if s.delta is not None:  # the add pending from the sublayer before, fused with this norm
            s.h, x = ops.add_rms_norm(s.h, s.delta, weight, self.eps)
            s.delta = None
            return x, {}
        if self.norm_in_product:
            return s.h, {"norm": self.eps, "squares": s.squares}
        return ops.rms_norm(s.h, weight, self.eps), {}

    def add(self, s: Residual, x: torch.Tensor, weight: torch.Tensor, how: str, then=None) -> Residual:
        """h + x @ weight^T, as `how` says (`then`: the weight read next, as ops.linear's)."""
        if how == "residual":
            return Residual(ops.linear(x, weight, then=then, residual=s.h))
        if how == "squares":
            h, squares = ops.linear_squares(x, weight, s.h, then=then)
            return Residual(h, squares=squares)
        return Residual(s.h, delta=ops.linear(x, weight, then=then))

    def final(self, s: Residual, weight: torch.Tensor | None) -> torch.Tensor | None:
        """RMSNorm(h) by the final norm's `weight` (None: no norm), settling h."""
        if weight is None:
            s.settle()
            return None
        if s.delta is not None:
            return self.read(s, weight)[0]
        return ops.rms_norm(s.h, weight, self.eps)


def plan(h: torch.Tensor, first: torch.Tensor, norms_folded: bool, eps: float) -> Fusion:
    """The fusion of a forward over rows like h through layers whose first product (a qkv, or a Qwen3.5 layer's
    mixer input) is `first`: every norm and add in its own kernel unless the layers' norm weights are folded into
    their products and the GPU's products take such rows (ops.fuses_norms); then one row hands its squares on, from
    ops.fuses_mlp_norm's rows (a verify) every norm and add runs inside the products, and in between the add + norm
    before gate/up keeps its kernel."""
    if not (norms_folded and ops.fuses_norms(h, first)):
        return Fusion(False, "add", "add", eps)
    if ops.fuses_mlp_norm(h):
        return Fusion(True, "residual", "residual", eps)
    if ops.fuses_squares(h):
        return Fusion(True, "squares", "squares", eps)
    return Fusion(True, "add", "residual", eps)
