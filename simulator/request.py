"""`SimRequest`: one request's runtime state inside the engine.

Kept apart from the engine so that the scheduler, the admission strategies and the metrics can
name it without importing the engine. Invariants while a request is live:

    0 <= written <= final_len,   decoded <= output_len,
    running  =>  written == prompt_len + decoded - 1   (the last sampled token is not written)
"""

from __future__ import annotations

import numpy as np
import simpy

from workloads.request import Request

#: SGLang clips each request's remaining max_new_tokens at this when it budgets admission
CLIP_MAX_NEW_TOKENS = 4096


class SimRequest:
    """A request as the engine tracks it: where it is (waiting, prefill, running, completed,
    rejected), what it has written and decoded, and its statistics."""

    __slots__ = (
        "admit_s", "cached_tokens", "computed_len", "decoded", "done", "final_len", "finish_s",
        "first_token_s", "host_hit", "ids", "last_token_s", "load_stall_s", "load_tokens",
        "max_new",
        "output_len", "preemptions", "prefill_target", "prompt_len", "recomputed_tokens",
        "reject_reason", "req", "reservation", "rid", "rule_lost", "status", "storage_hit",
        "storage_wait",
        "swap_len", "swapped_tokens", "token_hit", "written",
    )  # fmt: skip

    def __init__(self, req: Request, max_context_len: int, env: simpy.Environment) -> None:
        self.req = req
        self.rid = req.request_id  # read on every step: an attribute, not a property
        self.prompt_len = req.prompt_len
        room = max(max_context_len - self.prompt_len, 0)
        self.output_len = max(min(req.output_len, req.max_new_tokens, room), 0)
        self.max_new = max(min(req.max_new_tokens, room), 1)
        self.final_len = self.prompt_len + max(self.output_len, 1) - 1
        self.status = "waiting"
        self.reservation = 0  # what a reserving policy reserves for it (the engine sets it)
        self.decoded = 0  # tokens sampled so far
        self.written = 0
        self.prefill_target = self.prompt_len
        self.admit_s = self.first_token_s = self.finish_s = float("nan")
        self.last_token_s = float("nan")  # when its latest token came out (inter-token gaps)
        self.cached_tokens = -1
        self.token_hit = 0
        # a hybrid's first admission: cached KV its window / state rules refused (AdmitResult)
        self.rule_lost = (0, 0)
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.swapped_tokens = 0
        self.swap_len = 0  # swapped-out KV to copy back at re-admission (tokens)
        self.computed_len = 0  # most tokens it had computed when preempted: below is recompute
        self.reject_reason = ""
        # lower KV tiers (simulator/transfers.py): tokens of the first admission's hit loaded
        # from host / storage, a load still to charge, and the stall it was charged
        self.host_hit = self.storage_hit = self.load_tokens = 0
        self.storage_wait = self.load_stall_s = 0.0
        self.ids: np.ndarray | None = None
        self.done = env.event()

    def seq_ids(self, n: int) -> np.ndarray:
        """The first n ids of prompt + output, cached while the request is live. Built once,
        to the final length (`Request.sequence_ids` is prefix-consistent): admission asks
        for the prompt, the cache insert and finish for prompt + output, which otherwise
        built the ids twice per request."""
        if self.ids is None or len(self.ids) < n:
            self.ids = self.req.sequence_ids(max(n, self.final_len))
        return self.ids[:n]

    def result_row(self) -> tuple:
        """The request's row of the results (simulator.metrics.REQUEST_COLUMNS order). A
        one-token output has no time per output token (engines' benchmarks leave it out)."""
        arrival = self.req.arrival_s
        ttft = self.first_token_s - arrival
        e2e = self.finish_s - arrival
        tpot = ((self.finish_s - self.first_token_s) / (self.output_len - 1)
                if self.output_len > 1 else float("nan"))
        norm = e2e / self.output_len if self.output_len > 0 else e2e
        if self.status != "completed":
            tpot = norm = float("nan")
        return (
            self.rid, self.req.session_id, self.req.turn, self.status, self.reject_reason,
            arrival, self.admit_s, self.first_token_s, self.finish_s, ttft, tpot, e2e, norm,
            self.prompt_len, self.output_len, self.final_len, max(self.cached_tokens, 0),
            self.token_hit, self.preemptions, self.recomputed_tokens, self.swapped_tokens,
            self.host_hit, self.storage_hit, self.load_stall_s,
        )

    def prefill_key(self) -> np.ndarray:
        """The ids admission matches: what it will prefill, less the last token (always
        computed, for its logits)."""
        n = self.prefill_target
        return self.seq_ids(n)[: max(n - 1, 0)]


def remaining_new_tokens(r: SimRequest) -> int:
    """SGLang's estimate of the tokens a request may still generate: its remaining
    max_new_tokens, clipped at 4096. One expression for the running requests, the queue head
    in the budget check and the head in the fast-forward's admission horizon."""
    return min(max(r.max_new - r.decoded, 0), CLIP_MAX_NEW_TOKENS)
