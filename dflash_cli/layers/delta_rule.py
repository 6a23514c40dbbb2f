"""The gated delta rule over a long span in chunks (prefill): the same recurrence as the model's row-by-row form,

    S_t = e^{g_t} S_{t-1} + k_t δ_tᵀ,   δ_t = β_t (v_t - (e^{g_t} S_{t-1})ᵀ k_t),   o_t = S_tᵀ q_t,

with the rows of a chunk solved together (the UT transform of DeltaNet: a unit lower-triangular system per chunk)
and only the chunks scanned in order. Decays stay in log space as differences inside a chunk, so strong decays do
not overflow. float32 throughout; per value head (q, k already repeated to the value heads)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            S: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [T, H, d_k] (normalised, q scaled), v [T, H, d_v], g, beta [T, H], S [H, d_k, d_v] (the state before)
    -> (o [T, H, d_v], the state after the last row)."""
    t = q.shape[0]
    pad = (-t) % chunk  # padding rows (k = v = β = g = 0) change neither the outputs kept nor the state
    q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)).transpose(0, 1) for x in (q, k, v))  # [H, T', d]
    g, beta = (F.pad(x, (0, 0, 0, pad)).t() for x in (g, beta))  # [H, T']
    h, n = q.shape[0], q.shape[1] // chunk
    q, k, v = (x.reshape(h, n, chunk, -1) for x in (q, k, v))
    kb, vb = k * beta.reshape(h, n, chunk, 1), v * beta.reshape(h, n, chunk, 1)
    c = g.reshape(h, n, chunk).cumsum(-1)  # log of the decay from the chunk's start through each row
    later = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).triu(1)
    decay = (c[..., :, None] - c[..., None, :]).masked_fill(later, float("-inf")).exp()  # e^{c_i - c_j}, j <= i
    system = (kb @ k.transpose(-1, -2)) * decay  # its strict lower triangle: rows' writes seen by later rows
    values = torch.linalg.solve_triangular(system, vb, upper=False, unitriangular=True)
    reads = torch.linalg.solve_triangular(system, kb * c.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * decay
    q_in = q * c.exp()[..., None]  # reads of the state the chunk starts from
    k_out = k * (c[..., -1:] - c).exp()[..., None]  # writes, decayed to the chunk's end
    span = c[..., -1].exp()  # [H, N]
    out = []
    for i in range(n):
        fresh = values[:, i] - reads[:, i] @ S  # the corrections δ of the chunk's rows
        out.append(q_in[:, i] @ S + attn[:, i] @ fresh)
        S = S * span[:, i, None, None] + k_out[:, i].transpose(-1, -2) @ fresh
    o = torch.cat(out, dim=1)[:, :t].transpose(0, 1)  # [T, H, d_v]
    return o, S
