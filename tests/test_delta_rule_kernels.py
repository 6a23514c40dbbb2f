"""The Gated DeltaNet kernels (kernels/delta_rule.py) against their torch references (layers/delta_rule.py,
RecurrentState.fold), on CPU through Triton's interpreter: the recurrent rows for T in {1, 2, 7, 16, 32}, small and
Qwen3.5-like head layouts, weak to strong decays, held and not; the fold for every n of a forward; the short conv
and the gated output norm; the model with them dispatched.
float32, relative error <= 1e-5. Runs in a subprocess because TRITON_INTERPRET must be set before kernels are
defined; the GPU timings are benchmarks/delta_rule_bench.py's."""

import os
import sys
import textwrap

import pytest

from interpret import run_interpreted

pytest.importorskip("triton")

SETUP = textwrap.dedent("""
    import torch
    from dflash_cli.kernels import delta_rule as kernel
    from dflash_cli.layers import delta_rule as ref
    from dflash_cli.layers.recurrent_state import RecurrentState
    torch.manual_seed(0)
    def rel(a, b):
        return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()
    def inputs(t, hk, hv, dk, dv, decay, dtype=torch.float32):
        # The conv's output rows [T, C] (q, k, v are strided views of it, as in the model), the projection's a, b
        # (views of a wider row), and decay parameters from weak (g ~ -0.001) to strong (g ~ -20).
        conv = torch.randn(t, 2 * hk * dk + hv * dv).to(dtype)
        q, k, v = conv.split([hk * dk, hk * dk, hv * dv], dim=-1)
        q, k, v = q.reshape(t, hk, dk), k.reshape(t, hk, dk), v.reshape(t, hv, dv)
        proj = torch.randn(t, 3 * hv).to(dtype)
        b, a = proj[:, hv:2 * hv], proj[:, 2 * hv:]
        neg_a = -torch.rand(hv) * decay
        dt_bias = torch.randn(hv)
        S0 = torch.randn(hv, dk, dv)
        return q, k, v, a, b, neg_a, dt_bias, S0
""")

ROWS = SETUP + textwrap.dedent("""
    # Every T with every decay strength, held and not, over the head layouts (a case each: the interpreter is slow).
    layouts = ((2, 4, 16, 16), (2, 4, 32, 32), (1, 2, 16, 8), (2, 2, 32, 16), (2, 4, 24, 12))
    for i, (hk, hv, dk, dv) in enumerate(layouts):
        for j, t in enumerate((1, 2, 7, 16, 32)):
            decay, held = (0.001, 1.0, 20.0)[(i + j) % 3], (i + j) % 2 == 1
            q, k, v, a, b, neg_a, dt_bias, S0 = inputs(t, hk, hv, dk, dv, decay)
            want_S, want_keep = torch.empty_like(S0), (torch.zeros(32, hk, dk), torch.zeros(32, hv, dv),
                                                       torch.zeros(32, hv))
            want = ref.rows(q, k, v, a, b, neg_a, dt_bias, S0, want_S, keep=want_keep)
            S = torch.full_like(S0, 7.0)
            keep = tuple(torch.full_like(x, 7.0) for x in want_keep)
            o = kernel.recurrent(q, k, v, a, b, neg_a, dt_bias, S0, None if held else S, keep)
            case = (hk, hv, dk, dv, t, decay, held)
            assert o.shape == want.shape and rel(o, want) <= 1e-5, (case, rel(o, want))
            if held:
                assert torch.equal(S, torch.full_like(S0, 7.0)), case  # the state untouched
            else:
                assert rel(S, want_S) <= 1e-5, (case, rel(S, want_S))
            for got, w in zip(keep, want_keep):  # the rows kept for the fold; the rows after T untouched
                assert rel(got[:t], w[:t]) <= 1e-5 and (got[t:] == 7.0).all(), case
    # In place (S is S0), without keeping, o in a half dtype: the state after the rows, o rounded once.
    q, k, v, a, b, neg_a, dt_bias, S0 = inputs(16, 2, 4, 32, 32, 1.0)
    want_S = torch.empty_like(S0)
    want = ref.rows(q, k, v, a, b, neg_a, dt_bias, S0, want_S)
    o = kernel.recurrent(q, k, v, a, b, neg_a, dt_bias, S0, S0, out_dtype=torch.float16)
    assert o.dtype == torch.float16 and rel(o, want) <= 1e-3 and rel(S0, want_S) <= 1e-5
    # Half-precision inputs (a GPU model's): β rounded in their dtype as torch's sigmoid rounds it, the rest in
    # float32. float16: the interpreter does not round to bf16 as the GPU does (tests/test_kernels_interpret.py).
    q, k, v, a, b, neg_a, dt_bias, S0 = inputs(7, 2, 4, 16, 16, 1.0, torch.float16)
    assert rel(kernel.recurrent(q, k, v, a, b, neg_a, dt_bias, S0), ref.rows(q, k, v, a, b, neg_a, dt_bias, S0)) <= 1e-5
    # The output's gated norm: o rows, z a strided view of the projection's output; float32 and float16.
    for dtype, tol in ((torch.float32, 1e-6), (torch.float16, 1e-3)):
        x, zz = torch.randn(5, 4, 24).to(dtype), torch.randn(5, 4 * 24 + 8).to(dtype)
        z, w = zz[:, :96].reshape(5, 4, 24), (1 + 0.1 * torch.randn(24)).to(dtype)
        got, want = kernel.gated_rms_norm(x, z, w, 1e-6), ref.gated_rms_norm(x, z, w, 1e-6)
        assert got.dtype == dtype and rel(got, want) <= tol, (dtype, rel(got, want))
    print("ok")
""")

FOLD = SETUP + textwrap.dedent("""
    # A verify of `rows` rows over 3 layers from a state, then the state after each row n: the kernel's fold equals
    # RecurrentState.fold (the torch closed form) and the state a forward of rows 0..n leaves.
    L, hk, hv, dk, dv, C, K = 3, 2, 4, 16, 16, 40, 4
    for rows, decay in ((1, 1.0), (7, 20.0), (16, 1.0), (32, 0.001)):
        st = RecurrentState(L, C, K, hk, hv, dk, dv, 32, torch.float32, "cpu")
        st.S.copy_(torch.randn_like(st.S))
        st.conv.copy_(torch.randn_like(st.conv))
        st.begin(0)
        x = torch.randn(L, rows, C)
        weight = torch.randn(C, K)
        ends = []
        for layer in range(L):
            q, k, v, a, b, neg_a, dt_bias, _ = inputs(rows, hk, hv, dk, dv, decay)
            ref.short_conv(x[layer], st.conv0[layer], weight, keep=st.x[layer])
            ref.rows(q, k, v, a, b, neg_a, dt_bias, st.S0[layer], None,
                     keep=(st.k[layer], st.delta[layer], st.g[layer]))
            S_n = []
            for n in range(rows):  # the state a forward of rows 0..n leaves
                S = torch.empty_like(st.S0[layer])
                ref.rows(q[:n + 1], k[:n + 1], v[:n + 1], a[:n + 1], b[:n + 1], neg_a, dt_bias, st.S0[layer], S)
                S_n.append(S)
            ends.append(S_n)
        for n in range(rows):
            st.fold(n, rows)  # the torch reference
            want_S, want_conv = st.S.clone(), st.conv.clone()
            st.S.fill_(7.0)
            st.conv.fill_(7.0)
            kernel.fold(st.S0, st.S, st.k, st.delta, st.g, st.conv0, st.conv, st.x, torch.tensor([n]), rows)
            assert rel(st.S, want_S) <= 1e-5, (rows, n, rel(st.S, want_S))
            assert torch.equal(st.conv, want_conv), (rows, n)
            for layer in range(L):
                assert rel(st.S[layer], ends[layer][n]) <= 1e-5, (rows, n, layer)
            window = torch.cat([st.conv0, x], dim=1)[:, n + 1:n + K]
            assert torch.equal(st.conv, window), (rows, n)
        kernel.fold(st.S0, st.S, st.k, st.delta, st.g, st.conv0, st.conv, st.x, torch.tensor([rows + 5]), rows)
        assert rel(st.S, torch.stack([e[-1] for e in ends])) <= 1e-5  # n past the rows: clamped to the last
    # The short conv: rows 1, 2 (inside the old window), 7, 33; window and kept rows written; a strided x (a view of
    # the projection's output, as in the model).
    for t in (1, 2, 7, 33):
        for C, K in ((40, 4), (300, 3)):
            proj = torch.randn(t, C + 9)
            x, conv0, weight = proj[:, :C], torch.randn(K - 1, C), torch.randn(C, K)
            want_win, want_keep = torch.empty(K - 1, C), torch.zeros(40, C)
            want = ref.short_conv(x, conv0, weight, want_win, want_keep)
            win, keep = torch.full_like(want_win, 7.0), torch.full_like(want_keep, 7.0)
            got = kernel.short_conv(x, conv0, weight, win, keep)
            assert rel(got, want) <= 1e-5 and torch.equal(win, want_win), (t, C, K)
            assert torch.equal(keep[:t], x) and (keep[t:] == 7.0).all()
            assert rel(kernel.short_conv(x, conv0, weight), want) <= 1e-5
    print("ok")
""")


def test_recurrent_rows_match_the_torch_loop():
    run_interpreted(ROWS)


def test_fold_and_conv_match_the_torch_reference():
    run_interpreted(FOLD)


MODEL = textwrap.dedent("""
    import sys
    import torch
    from dflash_cli.layers import ops
    from dflash_cli.models.qwen35 import Qwen35Model
    # The model's calls with the kernels dispatched as on CUDA (the interpreter runs them on CPU tensors): a 40-row
    # prefill (chunked rule, the conv kernel), 5-row and 1-row forwards (the row kernel), a held verify of 6 rows and
    # its fold at n = 2 (device n), then a rollback inside the next forward (host n), against the torch reference.
    model = Qwen35Model.load(sys.argv[1])
    ids = torch.randint(0, model.cfg.vocab_size, (60,), generator=torch.Generator().manual_seed(0))
    from dflash_cli.kernels import delta_rule as module
    reference = ops.model_kernels
    runs = []
    for kernels in (False, True):
        ops.model_kernels = (lambda x, name: module if name == "delta_rule" else None) if kernels else reference
        cache, out = model.new_cache(128), []
        out.append(model.forward(ids[:40], 0, cache, all_logits=True).logits)
        out.append(model.forward(ids[40:45], 40, cache, all_logits=True).logits)
        out.append(model.forward(ids[45:46], 45, cache).logits)
        out.append(model.forward(ids[46:52], 46, cache, all_logits=True, hold=True).logits)
        model.commit_rows(cache, torch.tensor([2]), 6)
        out.append(model.forward(ids[49:53], 49, cache, all_logits=True).logits)
        cache.state.fold(1, 4)  # back to after row 1 of that forward (a rollback: Session's settle)
        out.append(model.forward(ids[51:52], 51, cache).logits)
        runs.append((out, cache.state.S.clone(), cache.state.conv.clone()))
    (want, want_S, want_conv), (got, S, conv) = runs
    rel = lambda a, b: ((a - b).abs().max() / b.abs().max()).item()
    for i, (g, w) in enumerate(zip(got, want)):
        assert rel(g, w) <= 1e-5, (i, rel(g, w))
    assert rel(S, want_S) <= 1e-5 and rel(conv, want_conv) <= 1e-6
    print("ok")
""")


def test_model_with_the_kernels_matches_the_reference(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from tiny import make_qwen35

    d = make_qwen35(tmp_path / "t", seed=5, with_tokenizer=False, extras=False)
    run_interpreted(MODEL, str(d), timeout=600)
