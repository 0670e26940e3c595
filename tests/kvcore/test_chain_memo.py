"""The `vllm` manager's prompt memo (kvcore/vllm/chain_memo.py) across a release in the middle of
a prefill: the released request's chain goes back to the memo, so the next peek at the same
prompt buffer hashes nothing and answers as a fresh hashing does; a buffer rewritten since is
hashed again."""

from __future__ import annotations

import numpy as np

from kvcore.vllm.manager import VLLMManager
from tests.kvcore.test_vllm_block import make


def count_hashings(pol: VLLMManager) -> list[int]:
    """The lengths of the token arrays `pol` hashes from now on (its hasher's `chain`
    wrapped): an empty list after a peek means the memo answered without hashing."""
    hashed: list[int] = []
    chain = pol.hasher.chain

    def counting(parent: int, ids: np.ndarray) -> np.ndarray:
        hashed.append(len(ids))
        return chain(parent, ids)

    pol.hasher.chain = counting  # type: ignore[method-assign]
    return hashed


def test_a_request_released_mid_prefill_hands_its_chain_back() -> None:
    pol = make(256, 2)
    toks = np.arange(40, dtype=np.int64) + 1000
    assert pol.peek_prefix(toks[:-1]) == 0
    assert pol.admit(0, toks, 45, 5) is not None
    assert pol.extend([0], [11])  # 5 full blocks cached, the prompt not written yet
    hashed = count_hashings(pol)
    pol.release(0)
    assert pol.peek_prefix(toks[:-1]) == 10 and hashed == []  # the kept chain, no hashing
    assert pol.peek_prefix(toks[:-1].copy()) == 10 and hashed  # a fresh hashing agrees
    pol.check_invariants()
    hashed.clear()
    toks[:4] = 7  # the same buffer rewritten: compared, found changed, hashed again
    assert pol.peek_prefix(toks[:-1]) == 0 and hashed


def test_a_finished_request_leaves_no_entry() -> None:
    pol = make(256, 2)
    toks = np.arange(12, dtype=np.int64) + 1000
    pol.admit(0, toks, 14, 3)
    pol.extend([0], [12])
    pol.decode([0])
    pol.finish(0, np.concatenate([toks, [5]]))
    assert len(pol.memo) == 0
