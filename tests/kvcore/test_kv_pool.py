"""KV pools: paged attention read-back through the page table, MLA and fp8 round trips, and
shape-only (store=False) byte accounting."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvcore.kv_pool import MHATokenToKVPool, MLATokenToKVPool
from tests.kvcore.sglang_api import SGLangPagedAllocator as PagedAllocator
from tests.kvcore.sglang_api import SGLangReqToTokenPool as ReqToTokenPool


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_paged_attention_readback(ps: int) -> None:
    torch.manual_seed(ps)
    layers, heads, kv_heads, dim = 2, 4, 2, 8
    alloc = PagedAllocator(64, ps)
    table = ReqToTokenPool(4, 64)
    pool = MHATokenToKVPool(64, ps, layers, kv_heads, dim, dtype="fp32", store=True)
    lens = [5, 17, 33]
    rows = table.alloc(len(lens))
    # prefill in two chunks so the second starts inside a partial page
    first = [n // 2 for n in lens]
    out = alloc.alloc_extend([0] * 3, first, [-1] * 3)
    table.write_batch(torch.tensor(rows), torch.zeros(3, dtype=torch.int64),
                      torch.tensor(first), out)
    last = [int(table.read(r, f - 1, f)[0]) for r, f in zip(rows, first, strict=True)]
    out2 = alloc.alloc_extend(first, lens, last)
    table.write_batch(torch.tensor(rows), torch.tensor(first),
                      torch.tensor([n - f for n, f in zip(lens, first, strict=True)]), out2)
    contiguous = []
    for r, n in zip(rows, lens, strict=True):
        slots = table.read(r, 0, n).long()
        per_layer = []
        for layer in range(layers):
            k, v = torch.randn(n, kv_heads, dim), torch.randn(n, kv_heads, dim)
            pool.set_kv(layer, slots, k, v)
            per_layer.append((k, v))
        contiguous.append(per_layer)
    for i, (r, n) in enumerate(zip(rows, lens, strict=True)):
        slots = table.read(r, 0, n).long()
        for layer in range(layers):
            q = torch.randn(1, heads, n, dim)
            k, v = pool.get_kv(layer, slots)  # gathered through the page table
            k0, v0 = contiguous[i][layer]

            def attn(k, v, q=q):
                kk = k.transpose(0, 1).repeat_interleave(heads // kv_heads, 0)[None]
                vv = v.transpose(0, 1).repeat_interleave(heads // kv_heads, 0)[None]
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)

            torch.testing.assert_close(attn(k, v), attn(k0, v0))


def test_mla_round_trip() -> None:
    pool = MLATokenToKVPool(8, 4, 2, kv_lora_rank=16, qk_rope_head_dim=4, dtype="bf16")
    slots = torch.tensor([4, 5, 9, 31])
    lat = torch.randn(4, 1, 20, dtype=torch.bfloat16)
    pool.set_kv(1, slots, lat)
    assert torch.equal(pool.get_kv(1, slots), lat)
    assert not pool.get_kv(0, slots).any()
    assert pool.bytes_per_token == 2 * 20 * 2  # layers x latent x bf16, no K/V pair
    with pytest.raises(ValueError, match="v=None"):
        pool.set_kv(0, slots, lat, lat)


def test_fp8_round_trip_stored_as_bytes() -> None:
    pool = MHATokenToKVPool(4, 2, 1, 2, 4, dtype="fp8")
    assert pool.buffer is not None and pool.buffer.dtype == torch.uint8
    slots = torch.tensor([2, 3, 6])
    k = torch.randn(3, 2, 4)
    v = torch.randn(3, 2, 4)
    pool.set_kv(0, slots, k, v)
    k8, v8 = pool.get_kv(0, slots)
    assert k8.dtype == torch.float8_e4m3fn
    assert torch.equal(k8.float(), k.to(torch.float8_e4m3fn).float())
    assert torch.equal(v8.float(), v.to(torch.float8_e4m3fn).float())
    assert pool.bytes_per_token == 2 * 1 * 2 * 4 * 1


@pytest.mark.parametrize("dtype,nbytes", [("bf16", 2), ("fp32", 4), ("fp8", 1)])
def test_store_false_byte_accounting(dtype: str, nbytes: int) -> None:
    pages, ps, layers, heads, dim = 1000, 16, 40, 8, 128
    pool = MHATokenToKVPool(pages, ps, layers, heads, dim, dtype=dtype, store=False)
    assert pool.buffer is None
    assert pool.bytes_per_token == 2 * layers * heads * dim * nbytes
    assert pool.size_bytes == 2 * layers * heads * dim * nbytes * (pages + 1) * ps
    slots = torch.tensor([16, 17])
    pool.set_kv(0, slots, torch.zeros(2, heads, dim), torch.zeros(2, heads, dim))  # no-op
    with pytest.raises(RuntimeError, match="store=False"):
        pool.get_kv(0, slots)
    mla = MLATokenToKVPool(pages, ps, 61, 512, 64, dtype="bf16", store=False)
    assert mla.size_bytes == 61 * 576 * 2 * (pages + 1) * ps


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="page_size must be a positive integer, got 0"):
        MHATokenToKVPool(4, 0, 1, 1, 1)
    with pytest.raises(ValueError, match="page_size must be a positive integer, got True"):
        MHATokenToKVPool(4, True, 1, 1, 1)
    with pytest.raises(ValueError, match="unknown kv dtype 'int4'"):
        MHATokenToKVPool(4, 2, 1, 1, 1, dtype="int4")
    pool = MHATokenToKVPool(4, 2, 1, 2, 4, dtype="fp32")
    with pytest.raises(ValueError, match="slot index out of range"):
        pool.set_kv(0, torch.tensor([10]), torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="layer 1 out of range"):
        pool.get_kv(1, torch.tensor([2]))
    with pytest.raises(ValueError, match="k/v must be"):
        pool.set_kv(0, torch.tensor([2]), torch.zeros(1, 3, 4), torch.zeros(1, 3, 4))
    assert not pool.buffer.any()
