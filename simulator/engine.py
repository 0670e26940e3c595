"""The SimPy serving engine: one process that batches, allocates through a kvcore policy,
advances simulated time by the latency model, and records what memory held.

One iteration (see docs/engine.md for the diagram):

    continue chunked prefills -> admit from the waiting queue (budget, rows, memory)
      -> policy.extend(prefill chunks)          (batched, all-or-nothing)
      -> policy.decode(running)                 (batched; on OOM preempt and retry)
      -> dt = latency(prefill chunks, decode contexts); record breakdown over [now, now+dt)
      -> yield timeout(dt) -> first tokens, decoded tokens, finishes (cache insert, free)

When an iteration would only decode, the engine advances k steps in one go, where k stops at
the next arrival, the first finish, the first step that would need memory that is not free,
or the first step at which admission could take the queue head: the state after the k steps,
and every time-weighted metric, equal k single steps (tests/simulator check this).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import simpy

from kvcore.policies.base import PARTS, KVPolicy, MemoryBreakdown, PrefixPeek
from simulator.config import SimConfig
from simulator.metrics import Recorder
from simulator.scheduler import (
    SGLangRatio,
    order_waiting,
    preempt_victim,
    remaining_new_tokens,
    retract_victim,
)
from workloads.request import Request, Session, Workload


class LivelockError(RuntimeError):
    """The engine kept preempting and re-admitting without any request making progress: a
    bug in admission or preemption, stopped instead of looping forever. The message names the
    requests involved and the memory state."""


class SimRequest:
    """A request's runtime state inside the engine."""

    __slots__ = (
        "admit_s", "cached_tokens", "computed_len", "decoded", "done", "final_len", "finish_s",
        "first_token_s", "ids", "max_new", "output_len", "preemptions", "prefill_target",
        "prompt_len", "recomputed_tokens", "reject_reason", "req", "status", "swap_len",
        "swapped_tokens", "token_hit", "written",
    )  # fmt: skip

    def __init__(self, req: Request, max_context_len: int, env: simpy.Environment) -> None:
        self.req = req
        self.prompt_len = req.prompt_len
        room = max(max_context_len - self.prompt_len, 0)
        self.output_len = max(min(req.output_len, req.max_new_tokens, room), 0)
        self.max_new = max(min(req.max_new_tokens, room), 1)
        self.final_len = self.prompt_len + max(self.output_len, 1) - 1
        self.status = "waiting"
        self.decoded = 0  # tokens sampled so far
        self.written = 0
        self.prefill_target = self.prompt_len
        self.admit_s = self.first_token_s = self.finish_s = float("nan")
        self.cached_tokens = -1
        self.token_hit = 0
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.swapped_tokens = 0
        self.swap_len = 0  # swapped-out KV to copy back at re-admission (tokens)
        self.computed_len = 0  # most tokens it had computed when preempted: below is recompute
        self.reject_reason = ""
        self.ids: np.ndarray | None = None
        self.done = env.event()

    @property
    def rid(self) -> int:
        return self.req.request_id

    def seq_ids(self, n: int) -> np.ndarray:
        """The first n ids of prompt + output, cached while the request is live."""
        if self.ids is None or len(self.ids) < n:
            self.ids = self.req.sequence_ids(max(n, self.prompt_len))
        return self.ids[:n]


class Engine:
    def __init__(
        self,
        env: simpy.Environment,
        workload: Workload,
        policy: KVPolicy,
        latency,
        config: SimConfig,
        max_context_len: int,
        recorder: Recorder,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.env = env
        self.workload = workload
        self.policy = policy
        self.latency = latency
        self.cfg = config
        self.max_context_len = max_context_len
        self.rec = recorder
        self.progress = progress
        self.waiting: list[SimRequest] = []
        self.prefilling: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.ratio = SGLangRatio(
            config.new_token_ratio_init, config.new_token_ratio_min, config.new_token_ratio_decay
        )
        self.reserving = policy.reservation(1, 1, 1) > 0  # contiguous policies reserve up front
        self._wakeup: simpy.Event | None = None
        self._stretch_times: np.ndarray | None = None
        # A reserving policy refused the head: nothing changes until memory is given back,
        # so the head is not retried (nor a failed allocation counted) until then.
        self._mem_epoch = 0
        # A session turn finished: its session process must run (and announce when its next
        # turn is due) before the engine plans a multi-step stretch, or the stretch could run
        # past that release. The engine yields once at the same instant, in both modes.
        self._session_turn_done = False
        self._idle_since: float | None = None
        self._blocked: tuple[int, int] | None = None
        # this round's admissions, in order, each with "was it the request's first admission"
        self._admitted: list[tuple[SimRequest, bool]] = []
        self._open = sorted(workload.requests, key=lambda r: (r.arrival_s, r.request_id))
        self._next_open = 0
        self._session_releases: list[tuple[float, int]] = []
        self._sessions_left = len(workload.sessions)
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.swapped_tokens = 0
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.hit_tokens = 0
        self.token_hit_tokens = 0
        self.completed = 0
        self.rejected = 0
        self.failed_decode_allocs = 0
        # livelock guard: preemptions since a request last made progress (a new token, a finish
        # or a rejection: a re-prefill only restores what a victim had), and the latest victims
        self._stalled_preemptions = 0
        self._recent_victims: list[SimRequest] = []
        self.last_finish_s = 0.0
        self.invariant_checks = 0  # checks run (cfg.check_invariants, every cfg.check_every)
        self._check_countdown = config.check_every
        # Optional observer (the CLI's --events trace): called as
        # event_sink(t0, t1, prefill_chunks [(rid, from_token, to_token)], decode_rids, steps)
        # once per iteration or decode stretch. Never changes the simulation.
        self.event_sink: Callable[..., None] | None = None

    # -- arrivals --------------------------------------------------------------------------
    def start(self) -> None:
        self.env.process(self._open_loop())
        for s in self.workload.sessions:
            self.env.process(self._session(s))
        self.env.process(self.run())

    def _enqueue(self, req: Request) -> SimRequest:
        # SGLang caps max_new_tokens by its max_req_len = min(context length, pool size), so a
        # request that fits is not refused for an output budget the pool could never hold.
        limit = self.max_context_len
        if self.cfg.admission == "sglang":
            limit = min(limit, self.policy.capacity)
        sreq = SimRequest(req, limit, self.env)
        reason = self._never_fits(sreq)
        if reason:  # as engines do at add_request: it never enters the queue
            self._reject(sreq, reason)
            return sreq
        self.waiting.append(sreq)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()
        return sreq

    def _open_loop(self):
        while self._next_open < len(self._open):
            req = self._open[self._next_open]
            if req.arrival_s > self.env.now:
                yield self.env.timeout(req.arrival_s - self.env.now)
            self._next_open += 1
            self._enqueue(req)

    def _release_at(self, due: float, session_id: int):
        """Wait until `due`, announcing the release so that decode stretches stop there."""
        if due <= self.env.now:
            return
        entry = (due, session_id)
        heapq.heappush(self._session_releases, entry)
        yield self.env.timeout(due - self.env.now)
        self._session_releases.remove(entry)
        heapq.heapify(self._session_releases)

    def _session(self, s: Session):
        yield from self._release_at(s.start_s, s.session_id)
        previous = None
        for k, turn in enumerate(s.turns):
            if k > 0:
                yield from self._release_at(self.env.now + turn.think_time_s, s.session_id)
            req = s.request_for_turn(k, self.env.now, previous)
            sreq = self._enqueue(req)
            yield sreq.done
            if sreq.status != "completed":
                break  # a rejected turn ends its conversation
            previous = req
        self._sessions_left -= 1

    def _next_arrival(self) -> float:
        t = self._open[self._next_open].arrival_s if self._next_open < len(self._open) else np.inf
        if self._session_releases:
            t = min(t, self._session_releases[0][0])
        return t

    def _arrivals_pending(self) -> bool:
        return self._next_open < len(self._open) or self._sessions_left > 0

    # -- bookkeeping -----------------------------------------------------------------------
    def _head_reservation(self) -> int:
        if not self.waiting:
            return self.max_context_len
        h = self.waiting[0]
        return max(self.policy.reservation(h.prompt_len, h.final_len, h.max_new), 1)

    def _breakdown(self) -> MemoryBreakdown:
        return self.policy.breakdown(self._head_reservation())

    def _parts(self, b: MemoryBreakdown) -> np.ndarray:
        return np.array([b.parts()[p] for p in PARTS], dtype=np.int64)

    def _reject(self, sreq: SimRequest, reason: str) -> None:
        sreq.status = "rejected"
        sreq.reject_reason = reason
        self.rejected += 1
        self._progress()
        self._record_request(sreq)
        sreq.done.succeed()

    def _never_fits(self, sreq: SimRequest) -> str:
        cap = self.policy.capacity
        if sreq.prompt_len >= self.max_context_len:
            return (f"prompt of {sreq.prompt_len} tokens leaves no room under max context "
                    f"length {self.max_context_len}")
        need = max(sreq.final_len, self.policy.reservation(
            sreq.prompt_len, sreq.final_len, sreq.max_new))
        if self.cfg.admission == "reserve" and not self.reserving:
            need = max(need, sreq.prompt_len + sreq.max_new)
        elif self.cfg.admission == "sglang":  # the budget keeps room for one new token
            need = max(need, sreq.prompt_len + 1)
        elif self.cfg.admission == "vllm":  # admission takes the pages of prompt + 1
            ps = self.policy.page_size
            need = max(need, -(-(sreq.prompt_len + 1) // ps) * ps)
        if need > cap:
            return f"needs {need} KV slots, the pool has {cap}"
        return ""

    # -- admission -------------------------------------------------------------------------
    def _budget_ok(self, sreq: SimRequest, peek: PrefixPeek, admitted_charge: int) -> bool:
        """Whether admission may take `sreq` now. The evictable part of its own cached prefix
        is left out of what is available: admitting locks it (counting it as free memory and
        as prefix already there would admit what cannot run, then preempt it, forever)."""
        mode = self.cfg.admission
        cached = peek.hit
        extend = sreq.prefill_target - cached
        if self.reserving:
            return True  # the contiguous policy's placement decides
        available = self.policy.available_tokens() - peek.evictable
        if mode == "sglang":
            rem = sum(remaining_new_tokens(r) for r in self.running)
            budget = available - rem * self.ratio.value - admitted_charge
            return extend + remaining_new_tokens(sreq) <= budget
        if mode == "vllm":
            ps = self.policy.page_size
            total_pages = self.policy.capacity // ps
            need = -(-(sreq.prefill_target + 1) // ps) - cached // ps
            free_pages = available // ps - admitted_charge // ps
            # whole pages, as vLLM counts it: a pool under 100 pages keeps no watermark, so a
            # request that fits the empty pool is admitted
            return free_pages - need >= int(self.cfg.vllm_watermark * total_pages)
        # reserve: everyone holds prompt + max_new_tokens
        held = sum(max(r.prompt_len + r.max_new - r.written, 0)
                   for r in self.running + self.prefilling)
        want = sreq.prompt_len + sreq.max_new - cached
        return want + held + admitted_charge <= available

    def _charge(self, sreq: SimRequest, cached: int) -> int:
        extend = sreq.prefill_target - cached
        if self.cfg.admission == "sglang":
            return extend + remaining_new_tokens(sreq)
        if self.cfg.admission == "vllm":
            ps = self.policy.page_size
            return (-(-(sreq.prefill_target + 1) // ps)) * ps - cached
        return sreq.prompt_len + sreq.max_new - cached

    def _plan_prefill(self) -> list[tuple[SimRequest, int]]:
        """Chunks to run this iteration: continuing chunked prefills, then admissions."""
        budget = self.cfg.max_prefill_tokens
        chunk = self.cfg.chunked_prefill_size or None
        plan: list[tuple[SimRequest, int]] = []
        for sreq in self.prefilling:
            if budget <= 0:
                break
            room = min(budget, chunk) if chunk else budget
            target = min(sreq.prefill_target, sreq.written + room)
            plan.append((sreq, target))
            budget -= target - sreq.written
        admitted_charge = 0
        self._admitted = []
        self.waiting = order_waiting(self.waiting, self.cfg.schedule, self._peek)
        while self.waiting and budget > 0:
            sreq = self.waiting[0]
            if len(self.running) + len(self.prefilling) >= self.cfg.max_running_requests:
                break
            if not self._budget_ok(sreq, self._peek_admission(sreq), admitted_charge):
                break
            if self._blocked == (sreq.rid, self._mem_epoch):
                break
            target_ids = sreq.seq_ids(sreq.prefill_target)
            res = self.policy.admit(sreq.rid, target_ids, sreq.final_len, sreq.max_new)
            if res is None:
                self._blocked = (sreq.rid, self._mem_epoch)
                break
            self.waiting.pop(0)
            admitted_charge += self._charge(sreq, res.cached_len)
            self._admitted.append((sreq, sreq.cached_tokens < 0))
            if sreq.cached_tokens < 0:  # first admission: the prefix-hit statistics
                sreq.cached_tokens = res.cached_len
                sreq.token_hit = res.unaligned_hit
                sreq.admit_s = self.env.now
                self.prompt_tokens += sreq.prompt_len
                self.hit_tokens += res.cached_len
                self.token_hit_tokens += res.unaligned_hit
            sreq.written = res.cached_len
            sreq.status = "prefill"
            self.prefilling.append(sreq)
            if sreq.swap_len > sreq.written:  # swapped out earlier: copy back what it had
                plan.append((sreq, sreq.swap_len))  # computed, in one go (no prefill budget)
                continue
            sreq.swap_len = 0  # nothing to copy back: the prefix cache holds all of it
            room = min(budget, chunk) if chunk else budget
            if not plan:
                room = max(room, 1)
            target = min(sreq.prefill_target, sreq.written + room)
            if chunk is None and target < sreq.prefill_target and plan:
                self._unadmit(*self._admitted.pop())  # no chunking: it waits for a round
                break
            if chunk is None:
                target = sreq.prefill_target
            plan.append((sreq, target))
            budget -= target - sreq.written
        return plan

    def _prefill_key(self, sreq: SimRequest) -> np.ndarray:
        """The ids admission matches: what it will prefill, less the last token (always
        computed, for its logits)."""
        n = sreq.prefill_target
        return sreq.seq_ids(n)[: max(n - 1, 0)]

    def _peek(self, sreq: SimRequest) -> int:
        return self.policy.peek_prefix(self._prefill_key(sreq))

    def _peek_admission(self, sreq: SimRequest) -> PrefixPeek:
        return self.policy.peek_admission(self._prefill_key(sreq))

    # -- preemption ------------------------------------------------------------------------
    def _preempt(self, victim: SimRequest) -> float:
        """Give back the victim's memory; it goes to the front of the queue. Returns the
        seconds the iteration spends swapping it out (0 for recompute)."""
        self.preemptions += 1
        self._mem_epoch += 1
        victim.preemptions += 1
        self._check_livelock(victim)
        cost = 0.0
        if victim in self.running:
            self.running.remove(victim)
        else:
            self.prefilling.remove(victim)
        written = victim.written
        victim.computed_len = max(victim.computed_len, written)
        if self.cfg.preempt == "swap" and written > 0:
            # only what was computed: a victim in the middle of its prefill prefills the rest
            # after the copy back, and still samples its first token then
            victim.swap_len = written
            victim.swapped_tokens += written
            self.swapped_tokens += written
            cost = self.latency.swap_tokens_time(written, self.policy.page_size)
        self.policy.release(victim.rid)
        victim.written = 0
        victim.status = "waiting"
        victim.prefill_target = max(victim.prompt_len + victim.decoded - 1, victim.prompt_len) \
            if victim.decoded else victim.prompt_len
        self.waiting.insert(0, victim)
        return cost

    def _progress(self) -> None:
        self._stalled_preemptions = 0
        self._recent_victims.clear()

    def _check_livelock(self, victim: SimRequest) -> None:
        """Raise LivelockError once `cfg.max_stalled_preemptions` preemptions in a row have
        passed with no request making progress."""
        self._stalled_preemptions += 1
        self._recent_victims = [*self._recent_victims[-7:], victim]
        if self._stalled_preemptions <= self.cfg.max_stalled_preemptions:
            return
        b = self._breakdown()
        who = ", ".join(
            f"request {r.rid} (prompt {r.prompt_len}, written {r.written}, decoded "
            f"{r.decoded}, preempted {r.preemptions}x)" for r in self._recent_victims)
        raise LivelockError(
            f"livelock at t={self.env.now:.6f} s: {self._stalled_preemptions} preemptions with "
            f"no request making progress; latest victims: {who}; memory: capacity "
            f"{b.capacity}, token states {b.token_states}, cached {b.cached}, reserved "
            f"{b.reserved}, free {b.free_total}, available {self.policy.available_tokens()}; "
            f"running {len(self.running)}, prefilling {len(self.prefilling)}, waiting "
            f"{len(self.waiting)}; policy {self.policy.name}, admission {self.cfg.admission}")

    def _victim(self, pool: list[SimRequest]) -> SimRequest:
        if self.cfg.admission == "sglang":
            return retract_victim(pool)
        return preempt_victim(pool)

    # -- the loop --------------------------------------------------------------------------
    def run(self):
        env = self.env
        while True:
            if self._session_turn_done:
                self._session_turn_done = False
                yield env.timeout(0)
            if not (self.waiting or self.prefilling or self.running):
                self._idle_since = env.now
                if not self._arrivals_pending():
                    break  # idle for good: close_idle() records the rest of the window
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
                self.close_idle(env.now)
                continue
            # the head that a stretch must not pass is the head in schedule order (lpm
            # reorders; stepping sorts at the start of every iteration)
            self.waiting = order_waiting(self.waiting, self.cfg.schedule, self._peek)
            if self._stretch_possible():
                k = self._stretch_length()
                if k >= 2:
                    yield from self._decode_stretch(k)
                    continue
            yield from self._iteration()

    def close_idle(self, until: float) -> None:
        """Record the idle stretch that began at `_idle_since` (only cache and free memory)
        up to `until`. Called on wakeup, and by `simulate` at the end of a run that stopped
        while idle (all done, or --no-drain), so that idle time counts in the window too."""
        if self._idle_since is None:
            return
        t0, self._idle_since = self._idle_since, None
        if until > t0:
            b = self._breakdown()
            self.rec.add_interval(t0, until, self._parts(b), b.frag_index,
                                  self.policy.page_table_entries(), b.over_reservation)

    def _iteration(self):
        env = self.env
        t0 = env.now
        extra = 0.0
        plan = self._plan_prefill()
        if plan:
            rids = [s.rid for s, _ in plan]
            targets = [t for _, t in plan]
            if not self.policy.extend(rids, targets):
                plan = self._shrink_plan(plan)
        prefill_info = [(t - s.written, s.written) for s, t in plan if not s.swap_len]
        chunks = ([(s.rid, s.written, t) for s, t in plan]
                  if self.event_sink is not None else None)
        for sreq, target in plan:
            if sreq.swap_len:
                extra += self.latency.swap_tokens_time(target - sreq.written,
                                                       self.policy.page_size)
            elif sreq.computed_len > sreq.written:  # re-prefill of a preempted request
                redo = min(target, sreq.computed_len) - sreq.written
                self.recomputed_tokens += redo
                sreq.recomputed_tokens += redo
            sreq.written = target
        decoding = list(self.running)
        while decoding and not self.policy.decode([s.rid for s in decoding]):
            self.failed_decode_allocs += 1
            victim = self._victim(decoding)
            extra += self._preempt(victim)
            decoding.remove(victim)
            if self.cfg.admission == "sglang":
                self.ratio.after_retract(
                    sum(r.decoded for r in self.running), len(self.running),
                    sum(r.max_new for r in self.running))
        for s in decoding:
            s.written += 1
        self._maybe_check_invariants()
        if not plan and not decoding:
            # nothing ran: with an empty engine the head can never be admitted; otherwise
            # everyone running was preempted, and the next iteration retries
            if self.waiting and not (self.running or self.prefilling):
                self._reject(self.waiting.pop(0), "does not fit even in an empty engine")
            return
        contexts = np.fromiter((s.written for s in decoding), dtype=np.int64,
                               count=len(decoding))
        dt = self.latency.iteration_time(prefill_info, contexts, self.policy.page_size) + extra
        if self.event_sink is not None:
            self.event_sink(t0, t0 + dt, chunks, [s.rid for s in decoding], 1)
        b = self._breakdown()
        parts = self._parts(b)
        self.rec.add_interval(t0, t0 + dt, parts, b.frag_index,
                              self.policy.page_table_entries(), b.over_reservation)
        batch = len(decoding) + len(plan)
        self.rec.add_iterations(t0, 1, batch)
        self.rec.sample(t0, parts, batch, len(self.waiting), len(self.running))
        if decoding and self.cfg.admission == "sglang":
            self.ratio.step()
        yield env.timeout(dt)
        self._after_iteration(plan, decoding)

    def _shrink_plan(self, plan: list[tuple[SimRequest, int]]) -> list[tuple[SimRequest, int]]:
        """extend failed: undo this round's admissions one at a time, latest first (back to
        the queue front, in order), retrying after each: token budgets do not see page
        rounding, so a round can admit more than the pages hold, and the admissions that fit
        must stay (else a request that fits an empty engine could be rejected). Then retry
        the continuing chunks, preempting them if even that fails."""
        fresh = list(self._admitted)
        keep = list(plan)
        while keep:
            if fresh:
                sreq, first = fresh.pop()
                keep = [(s, t) for s, t in keep if s is not sreq]
                self._unadmit(sreq, first)
            else:
                victim, _ = keep.pop()
                self._preempt(victim)
            if keep and self.policy.extend([s.rid for s, _ in keep], [t for _, t in keep]):
                return keep
        return []

    def _unadmit(self, sreq: SimRequest, first: bool) -> None:
        """Take back an admission of this round: the request waits at the queue front again,
        and a first admission's statistics are counted when it is really admitted."""
        self.prefilling.remove(sreq)
        self.policy.release(sreq.rid)
        sreq.written = 0
        sreq.status = "waiting"
        self.waiting.insert(0, sreq)
        if first:
            self.prompt_tokens -= sreq.prompt_len
            self.hit_tokens -= sreq.cached_tokens
            self.token_hit_tokens -= sreq.token_hit
            sreq.cached_tokens = -1
            sreq.token_hit = 0
            sreq.admit_s = float("nan")

    def _after_iteration(self, plan, decoding) -> None:
        now = self.env.now
        for sreq, _target in plan:
            sreq.swap_len = 0  # a copy back is done in its one iteration
            if sreq.written < sreq.prefill_target:
                continue  # more chunks to go
            self.prefilling.remove(sreq)
            if sreq.decoded == 0:
                sreq.decoded = 1 if sreq.output_len > 0 else 0
                sreq.first_token_s = now
                if sreq.output_len > 0:
                    self.generated_tokens += 1
                    self._progress()
                self.policy.cache_prefix(sreq.rid, sreq.seq_ids(sreq.written))
            if sreq.decoded >= sreq.output_len:
                self._finish(sreq)
            else:
                sreq.status = "running"
                self.running.append(sreq)
        if decoding:
            self._progress()
        for sreq in decoding:
            sreq.decoded += 1
            self.generated_tokens += 1
            if sreq.decoded >= sreq.output_len:
                self.running.remove(sreq)
                self._finish(sreq)

    def _finish(self, sreq: SimRequest) -> None:
        self._progress()
        self.policy.finish(sreq.rid, sreq.seq_ids(sreq.written))
        self._mem_epoch += 1
        sreq.status = "completed"
        sreq.finish_s = self.env.now
        if np.isnan(sreq.first_token_s):
            sreq.first_token_s = sreq.finish_s
        self.completed += 1
        self.last_finish_s = sreq.finish_s
        if sreq.req.session_id is not None:
            self._session_turn_done = True
        sreq.ids = None
        self._record_request(sreq)
        sreq.done.succeed()

    def _record_request(self, s: SimRequest) -> None:
        arrival = s.req.arrival_s
        ttft = s.first_token_s - arrival
        e2e = s.finish_s - arrival
        # one-token outputs have no time per output token (engines' benchmarks leave them out)
        tpot = ((s.finish_s - s.first_token_s) / (s.output_len - 1) if s.output_len > 1
                else float("nan"))
        norm = e2e / s.output_len if s.output_len > 0 else e2e
        if s.status != "completed":
            tpot = norm = float("nan")
        self.rec.add_request((
            s.rid, s.req.session_id, s.req.turn, s.status, s.reject_reason, arrival, s.admit_s,
            s.first_token_s, s.finish_s, ttft, tpot, e2e, norm, s.prompt_len, s.output_len,
            s.final_len, max(s.cached_tokens, 0), s.token_hit, s.preemptions,
            s.recomputed_tokens, s.swapped_tokens,
        ))
        if self.progress is not None:
            self.progress(1)

    def _maybe_check_invariants(self) -> None:
        """With cfg.check_invariants, run the policy's checks every cfg.check_every-th
        iteration or decode stretch (long runs check sparsely; tests check every one)."""
        if not self.cfg.check_invariants:
            return
        self._check_countdown -= 1
        if self._check_countdown <= 0:
            self._check_countdown = self.cfg.check_every
            self.invariant_checks += 1
            self.policy.check_invariants()

    # -- multi-step decode ---------------------------------------------------------------------
    def _stretch_possible(self) -> bool:
        if not self.running or self.prefilling:
            return False
        if not self.waiting:
            return True
        # a queue head that is admissible now makes this a normal iteration
        head = self.waiting[0]
        if len(self.running) >= self.cfg.max_running_requests:
            return True
        if self.reserving:
            return self._blocked == (head.rid, self._mem_epoch)
        return not self._budget_ok(head, self._peek_admission(head), 0)

    def _stretch_length(self) -> int:
        running = self.running
        rids = [s.rid for s in running]
        k = min(self.cfg.max_steps_per_stretch,
                min(s.output_len - s.decoded for s in running))
        if k < 2:
            return k
        k = max(self._steps_within(rids, k, self.policy.available_tokens()), 1)
        if k < 2:
            return k
        if self.cfg.schedule == "lpm" and len(self.waiting) > 1:
            # a step that evicts cache can change the prefix hits LPM orders the queue by, and
            # stepping re-sorts before the next step: such a step ends the stretch
            k = min(k, self._steps_within(rids, k, self.policy.fresh_tokens()) + 1)
        if k < 2:
            return k
        if self.waiting and not self.reserving:
            k = min(k, self._admission_horizon(k))
        if k < 2:
            return k
        times = self._step_times(k)
        self._stretch_times = times  # reused by _decode_stretch (same contexts, a prefix)
        next_arrival = self._next_arrival()
        if np.isfinite(next_arrival):
            ends = _step_ends(self.env.now, times)
            hit = np.nonzero(ends >= next_arrival)[0]
            if len(hit):
                k = min(k, int(hit[0]) + 1)
        return k

    def _steps_within(self, rids: list[int], k: int, slots: int) -> int:
        """The most decode steps (<= k) of `rids` whose new memory fits in `slots` (the cost
        grows with the steps: a binary search)."""
        if self.policy.decode_cost(rids, k) <= slots:
            return k
        lo, hi = 0, k - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.policy.decode_cost(rids, mid) <= slots:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _admission_horizon(self, k: int) -> int:
        """Steps before admission could possibly take the head (an upper bound on the budget:
        running requests' remaining reservations shrink as they decode)."""
        if len(self.running) >= self.cfg.max_running_requests:
            return k
        head = self.waiting[0]
        peek = self._peek_admission(head)
        cached = peek.hit
        avail = self.policy.available_tokens() - peek.evictable
        j = np.arange(1, k + 1, dtype=np.int64)
        mode = self.cfg.admission
        if mode == "vllm":
            return k  # free pages only shrink while decoding
        if mode == "sglang":
            rem = np.array([remaining_new_tokens(r) for r in self.running])
            ratio = np.maximum(self.ratio.floor, self.ratio.value - self.ratio.decay * j)
            left = np.clip(rem[None, :] - j[:, None], 0, None).sum(axis=1)
            need = head.prefill_target - cached + remaining_new_tokens(head)
            ok = avail - left * ratio >= need
        else:
            held = np.array([r.prompt_len + r.max_new - r.written for r in self.running])
            left = np.clip(held[None, :] - j[:, None], 0, None).sum(axis=1)
            ok = avail - left >= head.prompt_len + head.max_new - cached
        hit = np.nonzero(ok)[0]
        return int(hit[0]) + 1 if len(hit) else k

    def _step_times(self, k: int) -> np.ndarray:
        contexts = np.fromiter((s.written + 1 for s in self.running), dtype=np.int64,
                               count=len(self.running))
        fn = getattr(self.latency, "decode_step_times", None)
        if fn is not None:
            return np.asarray(fn(contexts, self.policy.page_size, k), dtype=float)
        return np.array([self.latency.iteration_time((), contexts + j, self.policy.page_size)
                         for j in range(k)])

    def _decode_stretch(self, k: int):
        env = self.env
        running = list(self.running)
        rids = [s.rid for s in running]
        cached_times = self._stretch_times
        self._stretch_times = None
        times = cached_times[:k] if cached_times is not None and len(cached_times) >= k \
            else self._step_times(k)
        head = self._head_reservation()
        b0 = self.policy.breakdown(head)
        profile = self.policy.decode_steps(rids, k, head)
        for s in running:
            s.written += k
        self._maybe_check_invariants()
        ends = _step_ends(env.now, times)
        starts = np.concatenate([[env.now], ends[:-1]])
        ps = self.policy.page_size
        w0 = np.fromiter((s.written - k for s in running), dtype=np.int64, count=len(running))
        other = self.policy.page_table_entries() - int((-(-(w0 + k) // ps)).sum())
        entries = other + (-(-(w0[None, :] + np.arange(1, k + 1)[:, None]) // ps)).sum(axis=1)
        self.rec.add_profile(starts, ends, profile, b0.frag_index, entries, b0.over_reservation)
        if self.event_sink is not None:
            self.event_sink(float(starts[0]), float(ends[-1]), [], rids, k)
        self.rec.add_iterations(starts, k, len(running))
        self.rec.sample(env.now, profile[0], len(running), len(self.waiting), len(running))
        if self.cfg.admission == "sglang":
            self.ratio.step(k)
        yield from _wait_until(env, float(ends[-1]))
        self._progress()
        for s in running:
            s.decoded += k
            self.generated_tokens += k
        for s in running:
            if s.decoded >= s.output_len:
                self.running.remove(s)
                self._finish(s)


def _step_ends(now: float, times: np.ndarray) -> np.ndarray:
    """End times of consecutive steps, accumulated left to right from `now` exactly as SimPy
    accumulates one timeout after another (now + t0, then + t1, ...), so that a stretch ends at
    bit-for-bit the same instant as stepping."""
    return np.add.accumulate(np.concatenate([[now], np.asarray(times, dtype=float)]))[1:]


def _wait_until(env: simpy.Environment, end: float):
    """Advance the clock to exactly `end` (a generator to `yield from`).

    SimPy schedules a timeout at now + delay, and for some (now, end) no float delay lands
    exactly on `end` (the sums skip it under round-half-even). Then a first hop lands on the
    last instant below `end` and a second hop of end - that instant, which is exact (the two
    are a few ulps apart: Sterbenz), lands on `end` itself."""
    now = env.now
    d = max(end - now, 0.0)
    while now + d < end:
        d = float(np.nextafter(d, np.inf))
    while d > 0 and now + d > end:
        d = float(np.nextafter(d, -np.inf))
    yield env.timeout(d)
    if env.now < end:
        yield env.timeout(end - env.now)
