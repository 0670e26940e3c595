"""ReqToTokenPool: rows, the dummy row, writes, and bad input."""

from __future__ import annotations

import pytest
import torch

from tests.kvcore.sglang_api import SGLangReqToTokenPool as ReqToTokenPool


def test_rows_alloc_free_and_dummy_row() -> None:
    p = ReqToTokenPool(3, 8)
    assert p.req_to_token.shape == (4, 8) and p.req_to_token.dtype == torch.int32
    rows = p.alloc(3)
    assert sorted(rows) == [1, 2, 3] and p.available_size() == 0
    assert p.alloc(1) is None and p.available_size() == 0
    p.free(rows[1])
    assert p.alloc(1) == [rows[1]]
    p.free(rows)
    assert p.available_size() == 3
    assert not p.req_to_token[0].any()  # the dummy row stays zero
    p.check_invariants()


def test_write_and_write_batch() -> None:
    p = ReqToTokenPool(4, 16)
    r1, r2 = p.alloc(2)
    p.write(r1, 0, torch.tensor([4, 5, 6]))
    assert p.read(r1, 0, 3).tolist() == [4, 5, 6]
    p.write_batch(torch.tensor([r1, r2]), torch.tensor([3, 0]), torch.tensor([2, 3]),
                  torch.tensor([7, 8, 20, 21, 22]))
    assert p.read(r1, 0, 5).tolist() == [4, 5, 6, 7, 8]
    assert p.read(r2, 0, 3).tolist() == [20, 21, 22]
    assert p.nbytes == 5 * 16 * 4


def test_bad_input_leaves_state_unchanged() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match=f"size must be a positive integer, got {bad!r}"):
            ReqToTokenPool(bad, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_context_len"):
        ReqToTokenPool(2, 0)
    p = ReqToTokenPool(3, 8)
    (r,) = p.alloc(1)
    free_before = list(p._free_rows)
    with pytest.raises(ValueError, match="n must be a non-negative integer, got -1"):
        p.alloc(-1)
    with pytest.raises(ValueError, match="row 2 is not in use"):
        p.free([r, 2])  # nothing is freed when one row is bad
    with pytest.raises(ValueError, match="row 0 is not in use"):
        p.free(0)
    with pytest.raises(ValueError, match=f"row {r} is not in use"):
        p.free([r, r])
    assert p._free_rows == free_before and p.in_use(r)
    with pytest.raises(ValueError, match="outside the page table"):
        p.write(r, 6, torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="outside the page table"):
        p.write(r, -1, torch.tensor([1]))
    with pytest.raises(ValueError, match="row 2 is not in use"):
        p.write(2, 0, torch.tensor([1]))
    with pytest.raises(ValueError, match="past max_context_len"):
        p.write_batch(torch.tensor([r]), torch.tensor([7]), torch.tensor([2]),
                      torch.tensor([1, 2]))
    p.free(r)
    with pytest.raises(ValueError, match="double free"):
        p.free(r)
    p.check_invariants()


@pytest.mark.parametrize("host", [True, False])
def test_host_api_writes_reads_and_checks_bounds(host: bool) -> None:
    """The policies' numpy API, through the host view and (host=None) through the tensor,
    as a device run takes it: same table, same errors, nothing written on an error."""
    import numpy as np

    p = ReqToTokenPool(4, 8)
    if not host:
        p.host = None
    r1, r2 = p.alloc(2)
    p.write_range(r1, 0, np.array([4, 5, 6]))
    p.write_range(r2, 0, torch.tensor([8, 9]))  # a cache match's tensor of slots
    p.write_at(np.array([r1, r2]), np.array([3, 2]), np.array([7, 10]))
    p.write_at(np.array([[r1, r2]]), np.array([[4, 3], [5, 4]]), np.array([[12, 20], [13, 21]]))
    assert p.read(r1, 0, 6).tolist() == [4, 5, 6, 7, 12, 13]
    assert p.read(r2, 0, 5).tolist() == [8, 9, 10, 20, 21]
    assert p.read_at(np.array([r1, r2]), np.array([0, 1])).tolist() == [4, 9]
    assert p.read_at(r1, slice(0, 6, 2)).tolist() == [4, 6, 12]
    assert int(p.read_at(r2, 4)) == 21
    assert p.row_prefix(r1, 3).tolist() == [4, 5, 6]
    before = p.req_to_token.clone()
    with pytest.raises(ValueError, match=r"positions 6\.\.9 outside the page table"):
        p.write_range(r1, 6, np.array([1, 2, 3]))
    with pytest.raises(ValueError, match=r"positions -1\.\.0 outside the page table"):
        p.write_range(r1, -1, np.array([1]))
    with pytest.raises(ValueError, match="row 3 is not in use"):
        p.write_range(3, 0, np.array([1]))
    with pytest.raises(ValueError, match="position -1 outside the page table"):
        p.write_at(np.array([r1, r2]), np.array([2, -1]), np.array([1, 2]))
    with pytest.raises(ValueError, match="position 8 outside the page table"):
        p.write_at(np.array([r1, r2]), np.array([3, 8]), np.array([1, 2]))
    with pytest.raises(ValueError, match=r"positions 8\.\.9 outside the page table"):
        p.write_at(r1, 8, np.array(1))
    rows = np.array([r1, r2])
    with pytest.raises(ValueError, match=r"positions 6\.\.9 outside the page table"):
        p.write_run(rows, np.array([6, 5], dtype=np.int64), 3, np.zeros((3, 2), np.int64))
    with pytest.raises(ValueError, match=r"positions -1\.\.1 outside the page table"):
        p.write_run(rows, np.array([3, -1], dtype=np.int64), 2, np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match=r"positions 8\.\.9 outside the page table"):
        p.write_run(rows, np.array([8, 0], dtype=np.int64), 1, np.zeros(2, np.int64))
    with pytest.raises(ValueError, match=r"positions 7\.\.9 outside the page table"):
        p.write_run(rows, np.array([7, 5], dtype=np.int64), 2, np.zeros((2, 2), np.int64), 7)
    assert torch.equal(p.req_to_token, before)
    # a stretch's next positions per row, and a step's one each
    p.write_run(rows, np.array([6, 5], dtype=np.int64), 2, np.array([[30, 40], [31, 41]]))
    p.write_run(rows, np.array([5, 7], dtype=np.int64), 1, np.array([29, 42]), 7)
    assert p.read(r1, 0, 8).tolist() == [4, 5, 6, 7, 12, 29, 30, 31]
    assert p.read(r2, 0, 8).tolist() == [8, 9, 10, 20, 21, 40, 41, 42]
    p.check_invariants()
