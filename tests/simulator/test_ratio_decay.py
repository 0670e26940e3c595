"""SGLang's decayed new_token_ratio is the same float whether a stretch takes n decode steps at
once or the engine steps them one by one (simulator/admission.py `decayed_ratios`): after n
steps, and at every step the admission horizon looks at. The cases are chosen where the closed
form `ratio - decay * n` differs from n subtractions in the last bit, so putting it back fails
here. Well under a second.
"""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcore.contract.policy import PrefixPeek
from simulator.admission import AdmissionParams, SGLangAdmission, decayed_ratios
from simulator.config import SimConfig
from simulator.request import SimRequest
from simulator.run import build_policy
from workloads.request import PromptSpec, Request

DEFAULT = AdmissionParams()
_ENV = simpy.Environment()


def _admission(kv_tokens: int = 1024, params: AdmissionParams = DEFAULT) -> SGLangAdmission:
    cfg = SimConfig.of(policy="paged", page_size=16, kv_tokens=kv_tokens, max_context_len=4096)
    return SGLangAdmission(build_policy(cfg, 4096), params)


def _stepped(ratio: float, n: int, decay: float, floor: float) -> list[float]:
    """The ratio after each of n single steps, as SGLang's scheduler lowers it."""
    out = []
    for _ in range(n):
        ratio = max(ratio - decay, floor)
        out.append(ratio)
    return out


def _request(rid: int, prompt: int, max_new: int) -> SimRequest:
    req = Request(rid, 0.0, PromptSpec((("unique", 100 + rid, prompt, 0),)), max_new, max_new)
    return SimRequest(req, 4096, _ENV)


def test_the_default_decay_differs_from_the_product_at_step_61() -> None:
    """The premise: 61 subtractions of 0.001 from 0.7 are not 0.7 - 0.061 as doubles; one
    call for 61 steps gives the subtractions' value, bit for bit."""
    p = DEFAULT
    stepped = _stepped(p.new_token_ratio_init, 61, p.new_token_ratio_decay,
                       p.new_token_ratio_min)[-1]
    closed = max(p.new_token_ratio_min, p.new_token_ratio_init - p.new_token_ratio_decay * 61)
    assert stepped != closed  # 0.6389999999999999 against 0.639
    once, single = _admission(), _admission()
    once.after_steps(61)
    for _ in range(61):
        single.after_steps(1)
    assert once.ratio.hex() == single.ratio.hex() == stepped.hex()


@settings(max_examples=200, deadline=None)
@given(ratio=st.floats(0.0, 1.0), decay=st.sampled_from([0.001, 0.0010033333333333333, 0.0]) |
       st.floats(0.0, 0.05), floor=st.floats(0.0, 1.0), n=st.integers(1, 900))
def test_n_steps_at_once_are_n_single_steps(ratio: float, decay: float, floor: float,
                                            n: int) -> None:
    """Any start (also below the floor, as after a retraction), decay and floor: the ratios
    `decayed_ratios` gives for each step, and `after_steps(n)`, are the single steps' floats."""
    want = _stepped(ratio, n, decay, floor)
    assert [x.hex() for x in decayed_ratios(ratio, n, decay, floor)] == [x.hex() for x in want]
    params = AdmissionParams(new_token_ratio_decay=decay, new_token_ratio_min=floor)
    adm = _admission(params=params)
    adm.ratio = ratio
    adm.after_steps(n)
    assert adm.ratio.hex() == want[-1].hex()


# From this ratio, step 400's ratio times 997 remaining tokens is 148.99999999999974 after 400
# subtractions but 149.00000000000009 as 0.5494483450351054 - 0.001 * 400: a budget of
# available - 149 decides between the two.
START = 0.5494483450351054
STEP = 400
LEFT = 997


def test_the_horizon_is_the_step_at_which_stepping_admits() -> None:
    """The admission horizon (how far a stretch may go) ends at exactly the step at which the
    stepping engine's budget check first lets the head in: here step 400, where only the
    ratio's last bit makes the budget reach the head's need (the closed form says 401)."""
    adm = _admission(kv_tokens=1024)
    avail = adm.policy.available_tokens()
    assert avail == 1024
    head = _request(0, 1024 - 149 - 75, 75)  # needs its prompt + 75 new tokens: avail - 149
    running = [_request(1, 10, STEP + LEFT)]
    adm.ratio = START
    p = DEFAULT
    closed = START - p.new_token_ratio_decay * STEP
    stepped = _stepped(START, STEP, p.new_token_ratio_decay, p.new_token_ratio_min)[-1]
    need = head.prefill_target + 75
    assert avail - LEFT * stepped >= need > avail - LEFT * closed  # the bit decides

    horizon = adm.horizon(head, PrefixPeek(0, 0), running, 600)
    # stepping: one decode step at a time, the budget asked before each next iteration
    admitted_at = 0
    for j in range(1, 601):
        for r in running:
            r.decoded += 1
        adm.after_steps(1)
        if adm.admissible(head, PrefixPeek(0, 0), 0, running, []):
            admitted_at = j
            break
    assert (horizon, admitted_at) == (STEP, STEP)
