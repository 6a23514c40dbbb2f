"""The gated delta rule of a Gated DeltaNet layer (models/qwen35.py), per value head with a scalar decay:

    S_t = e^{g_t} S_{t-1} + k_t δ_tᵀ,   δ_t = β_t (v_t - (e^{g_t} S_{t-1})ᵀ k_t),   o_t = S_tᵀ q_t.

* `short_conv`: the causal depthwise conv + SiLU before it, over [the previous K-1 inputs ; the rows].
* `gates`: q, k l2-normalised (q also scaled by 1/sqrt(d_k)), v, β = sigmoid(b) and g = -e^{A_log} softplus(a +
  dt_bias) in float32 from the conv output and the projection's rows.
* `rows`: a forward of at most 32 rows (decode, verify), row by row, keeping each row's k_t, δ_t, g_t for a rewind
  (layers/recurrent_state.fold).
* `gated_rms_norm`: the layer's output norm, w * rms_norm(o) * silu(z).
* `chunked`: a long span (prefill), the rows of a chunk solved together (the UT transform of DeltaNet: a unit
  lower-triangular system per chunk) and only the chunks scanned in order. Decays stay in log space as differences
  inside a chunk, so strong decays do not overflow. float32 throughout; q, k already repeated to the value heads.

The torch code here is the reference; on CUDA `short_conv`, `rows` and `gated_rms_norm` run as Triton kernels
(kernels/delta_rule.py), one launch each per layer, inside the steps' CUDA graphs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import ops

CHUNK = 64  # rows of a long prefill's chunk: fla's and transformers' chunked form use 64 (their tested size)


def short_conv(x: torch.Tensor, conv0: torch.Tensor, weight: torch.Tensor, window: torch.Tensor | None = None,
               keep: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, C] (pre-conv rows), conv0 [K-1, C] (the inputs before them), weight [C, K] (depthwise, no bias) ->
    silu(conv) [T, C] in x's dtype. window: gets the last K-1 rows of [conv0 ; x] (the next forward's conv0);
    keep [R >= T, C]: gets x (for a rewind). None: not written."""
    if (kernel := ops.model_kernels(x, "delta_rule")) and x.stride(-1) == 1:
        return kernel.short_conv(x, conv0, weight, window, keep)
    full = torch.cat([conv0, x], dim=0)  # [K - 1 + T, C]
    y = F.silu(F.conv1d(full.t()[None], weight[:, None, :], groups=x.shape[1])[0].t())
    if window is not None:
        window.copy_(full[-conv0.shape[0]:])
    if keep is not None:
        keep[: x.shape[0]].copy_(x)
    return y


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gates(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, neg_a: torch.Tensor,
          dt_bias: torch.Tensor):
    """The conv's q, k [T, H_k, d_k] and v [T, H_v, d_v], the projection's a, b [T, H_v], -exp(A_log) and dt_bias
    (float32 [H_v]) -> float32 (q normalised and scaled, k normalised, v, g <= 0, β)."""
    q = l2norm(q.float()) * q.shape[-1] ** -0.5
    k = l2norm(k.float())
    return q, k, v.float(), neg_a * F.softplus(a.float() + dt_bias), torch.sigmoid(b).float()


def rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, neg_a: torch.Tensor,
         dt_bias: torch.Tensor, S0: torch.Tensor, S: torch.Tensor | None = None, keep=None,
         out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A forward's T rows (at most 32) row by row from the state S0 [H_v, d_k, d_v] (float32); arguments as `gates`;
    value head j reads key head j // (H_v / H_k). Returns o [T, H_v, d_v] in out_dtype. S: gets the state after the
    last row (None: held, a verify). keep: (k [R, H_k, d_k], δ [R, H_v, d_v], g [R, H_v]) float32, R >= T: get
    each row's normalised key, correction and log-decay (RecurrentState's, for `fold`). Capturable: fixed shapes,
    no host sync. One Triton launch on CUDA."""
    if (kernel := ops.model_kernels(S0, "delta_rule")) and all(x.stride(-1) == 1 for x in (q, k, v, a, b)):
        return kernel.recurrent(q, k, v, a, b, neg_a, dt_bias, S0, S, keep, out_dtype)
    q, k, v, g, beta = gates(q, k, v, a, b, neg_a, dt_bias)
    group = v.shape[1] // k.shape[1]
    qv, kv = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)  # value head j: key head j // group
    state, outs, deltas = S0, [], []
    for i in range(q.shape[0]):
        state = state * g[i].exp()[:, None, None]
        delta = (v[i] - torch.einsum("hkv,hk->hv", state, kv[i])) * beta[i][:, None]
        state = state + kv[i][:, :, None] * delta[:, None, :]
        outs.append(torch.einsum("hkv,hk->hv", state, qv[i]))
        deltas.append(delta)
    if S is not None:
        S.copy_(state)
    if keep is not None:
        t = q.shape[0]
        for buf, row in zip(keep, (k, torch.stack(deltas), g)):
            buf[:t].copy_(row)
    return torch.stack(outs).to(out_dtype)  # [T, H_v, d_v]


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """w * rms_norm(x) * silu(z) per head vector (x, z [T, H, D], weight [D]: plain w): normed in float32, rounded to
    x's dtype, scaled, then gated in float32. One Triton launch on CUDA."""
    if (kernel := ops.model_kernels(x, "delta_rule")) and weight.dtype == x.dtype and x.stride(-1) == z.stride(-1) == 1:
        return kernel.gated_rms_norm(x, z, weight, eps)
    y = weight * ops.unit_rms_norm(x, eps)
    return (y * F.silu(z.float())).to(x.dtype)


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
