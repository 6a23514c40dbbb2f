"""The persistent decode step's host tables (engine/kernels/megakernel.py), pure Python: how each product is cut
into ring-slot tiles and how the tiles are shared out among SMs."""

import pytest

from dflash_cli.engine.kernels.megakernel import MAX_ROWS, SLOT, balance, tile_rows

# (inner size, outputs, gated) of Qwen3-4B's products: qkv, o, gate_up, down, head.
QWEN3_4B = [(2560, 6144, False), (4096, 2560, False), (2560, 9728, True), (9728, 2560, False), (2560, 151936, False)]


@pytest.mark.parametrize("k,n,gated", QWEN3_4B + [(1024, 4096, False), (1024, 3072, True), (3072, 1024, False)])
def test_tiles_fit_a_slot_and_cover_the_outputs(k, n, gated):
    rows = tile_rows(k, n, gated)
    assert 1 <= rows <= MAX_ROWS and rows * k * 2 <= SLOT
    assert n % (rows // 2 if gated else rows) == 0 and (not gated or rows % 2 == 0)


def test_qwen3_4b_tile_rows():
    assert [tile_rows(k, n, g) for k, n, g in QWEN3_4B] == [4, 2, 4, 1, 4]


def test_rows_over_a_slot_do_not_fit():
    assert tile_rows(12288, 4096) is None  # Qwen3-8B's down: 24 KB a row
    assert tile_rows(8192, 4096, gated=True) is None  # a gate row and its up row: 32 KB
    assert tile_rows(12, 3) is None  # not whole 16-byte vectors


@pytest.mark.parametrize("sms", [1, 7, 132])
def test_balance_covers_each_product_once_and_evens_the_bytes(sms):
    products = [(1536, 20480), (1280, 16384), (2432, 20480), (2560, 19456)] * 3 + [(37984, 20480)]
    table = balance(sms, products)
    load = [0] * sms
    for (tiles, nbytes), offsets in zip(products, table):
        assert len(offsets) == sms + 1 and offsets[0] == 0 and offsets[-1] == tiles
        assert all(a <= b for a, b in zip(offsets, offsets[1:]))
        for b in range(sms):
            load[b] += (offsets[b + 1] - offsets[b]) * nbytes
        assert max(load) - min(load) <= max(n for _, n in products)  # within one tile after every product
