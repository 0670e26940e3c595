"""Bad extend/decode arguments: every policy rejects them with the same one-line ValueError
(one implementation in KVPolicy) before anything changes."""

from __future__ import annotations

import numpy as np
import pytest

from kvcore.policies import PolicyConfig, make_policy, policy_names

CTX = 32


def _admitted(name: str):
    pol = make_policy(name, PolicyConfig(kv_tokens=256, page_size=4, max_context_len=CTX,
                                         max_requests=4))
    for rid in (1, 2):
        assert pol.admit(rid, np.arange(6) + 100 * rid, CTX, CTX - 5) is not None
    assert pol.extend([1, 2], [6, 6])
    return pol


def _state(pol) -> tuple:
    return (pol.written(1), pol.written(2), pol.available_tokens(), pol.breakdown(CTX))


@pytest.mark.parametrize("name", policy_names())
@pytest.mark.parametrize(("call", "message"), [
    (lambda p: p.extend([1, 2], [8]), "rids and target_lens differ in length: 2 != 1"),
    (lambda p: p.extend([1, 1], [8, 9]), "extend got the same request twice"),
    (lambda p: p.decode([2, 2]), "decode got the same request twice"),
    (lambda p: p.extend([1], [5]), "target_len 5 of request 1 is below written 6"),
    (lambda p: p.extend([2, 1], [7, 3]), "target_len 3 of request 1 is below written 6"),
    (lambda p: p.extend([9], [8]), "request 9 is not admitted"),
    (lambda p: p.decode([1, 9]), "request 9 is not admitted"),
])
def test_bad_batches_fail_alike_and_change_nothing(name: str, call, message: str) -> None:
    pol = _admitted(name)
    before = _state(pol)
    with pytest.raises(ValueError, match=f"^{message}$"):
        call(pol)
    assert _state(pol) == before
    pol.check_invariants()


@pytest.mark.parametrize("name", policy_names())
def test_past_the_limit_names_the_request_and_the_limit(name: str) -> None:
    pol = _admitted(name)
    before = _state(pol)
    reserving = name.startswith("contiguous")
    limit = "is beyond its reservation" if reserving else f"exceeds max_context_len {CTX}"
    with pytest.raises(ValueError, match=f"^target_len {CTX + 1} of request 2 {limit}"):
        pol.extend([1, 2], [7, CTX + 1])
    assert _state(pol) == before
    if not reserving:
        pol.extend([1], [CTX])
        full = f"^decode of request 1 exceeds max_context_len {CTX}$"
        with pytest.raises(ValueError, match=full):
            pol.decode([2, 1])
        assert pol.written(2) == 6
    pol.check_invariants()
