"""The SimPy serving engine: one process that batches, allocates through a kvcore policy,
advances simulated time by the latency model, and records what memory held.

One iteration (see docs/engine.md for the diagram):

    continue chunked prefills -> admit from the waiting queue (rows, admission budget, memory)
      -> policy.extend(prefill chunks)          (batched, all-or-nothing)
      -> policy.decode(running)                 (batched; on OOM preempt and retry)
      -> dt = latency(prefill chunks, decode contexts); record breakdown over [now, now+dt)
      -> yield timeout(dt) -> first tokens, decoded tokens, finishes (cache insert, free)

The rules that differ between the engines imitated (who is admitted, what is charged, whom to
preempt) live in an `Admission` strategy (simulator/admission.py); requests come from
`Arrivals` (simulator/arrivals.py); when the next iterations' outcome is fixed in advance (only
decoding while the queue head waits; a reserving policy's chunked prefills while its head is
refused), `FastForward` (simulator/fastforward/) takes many of them at once with results
identical to stepping.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator
from typing import Any

import simpy

from kvcore.contract.capabilities import LowerTiers, PrefixCache, Reserving
from kvcore.contract.policy import KVPolicy, PrefixPeek
from simulator.admission import make_admission
from simulator.admission_round import AdmissionRound, Plan
from simulator.arrivals import Arrivals
from simulator.config import SimConfig
from simulator.fastforward import FastForward, stretch_rules
from simulator.guard import LivelockError, LivelockGuard
from simulator.latency import LatencyModel
from simulator.metrics import Recorder
from simulator.request import SimRequest
from simulator.running_batch import RunningBatch
from simulator.scheduler import PREEMPTS, SCHEDULES
from simulator.transfers import TierTraffic, TransferModel
from workloads.request import Request, Workload

NO_HIT = PrefixPeek(0, 0)  # what a policy without a prefix cache would find
__all__ = ["Engine", "LivelockError"]


class Engine(AdmissionRound):
    def __init__(self, env: simpy.Environment, workload: Workload, policy: KVPolicy,
                 latency: LatencyModel, config: SimConfig, max_context_len: int,
                 recorder: Recorder, progress: Callable[[int], None] | None = None,
                 transfers: TransferModel | None = None) -> None:
        self.env = env
        self.workload = workload
        self.policy = policy
        self.latency = latency
        self.cfg = config
        self.max_context_len = max_context_len
        self.rec = recorder
        self.progress = progress
        self.admission = make_admission(config.engine.admission, policy,
                                        config.admission_params)
        self.context_limit = self.admission.context_limit(max_context_len)
        self.schedule = SCHEDULES.get(config.engine.schedule)
        self.preempt_mode = PREEMPTS.get(config.engine.preempt)
        self.arrivals = Arrivals(env, workload, self._enqueue,
                                config.engine.max_concurrency)
        self.waiting: list[SimRequest] = []
        self.prefilling: list[SimRequest] = []
        self.running = RunningBatch()  # in order, decode state in columns
        self._wakeup: simpy.Event | None = None
        # A reserving policy refused the head: nothing changes until memory is given back,
        # so the head is not retried (nor a failed allocation counted) until then.
        self._mem_epoch = 0
        self._blocked: tuple[int, int] | None = None
        # A session turn finished: its session process must run (and announce when its next
        # turn is due) before the engine plans a multi-step stretch, or the stretch could run
        # past that release. The engine yields once at the same instant, in both modes.
        self._session_turn_done = False
        self._idle_since: float | None = None
        self._peeked: tuple[SimRequest, PrefixPeek] | None = None  # peek_admission's memo
        # this round's admissions, in order, each with "was it the request's first admission"
        self._admitted: list[tuple[SimRequest, bool]] = []
        # counters (the summary's): preemptions and what they cost, tokens, requests
        self.preemptions = self.recomputed_tokens = self.swapped_tokens = 0
        self.generated_tokens = self.prompt_tokens = self.hit_tokens = self.token_hit_tokens = 0
        # over the recorded rows of admitted requests (the reuse gap's denominator): cached
        # KV a hybrid's window / state rules refused (simulator/reuse_gap.py)
        self.window_lost_tokens = self.state_lost_tokens = 0
        self.completed = self.rejected = self.failed_decode_allocs = 0
        self.last_finish_s = 0.0
        self.guard = LivelockGuard(config.tuning.max_stalled_preemptions)
        self.invariant_checks = 0  # checks run (cfg.check_invariants, every cfg.check_every)
        self._check_countdown = config.tuning.check_every
        # Optional observer (the CLI's --events trace), once per iteration or stretch, never
        # changing the run: event_sink(t0, t1, [(rid, from, to)] chunks, decode_rids, steps)
        self.event_sink: Callable[..., None] | None = None
        # the policy's optional capabilities (kvcore/contract/capabilities.py), asked once
        self.prefix_cache = policy if isinstance(policy, PrefixCache) else None
        self.reserving = policy if isinstance(policy, Reserving) else None
        self.tiered = policy if isinstance(policy, LowerTiers) else None
        # lower KV tiers (a policy with a host tier and a transfer model): traffic and stalls
        self.tier = (TierTraffic(transfers, self.tiered.tier_state())
                     if self.tiered is not None and transfers is not None else None)
        self.fast_forward = FastForward(self, stretch_rules(policy, config, latency,
                                                            self.schedule, self.tier))

    def start(self) -> None:
        self.arrivals.start()
        self.env.process(self.run())

    # -- requests in and out -----------------------------------------------------------------
    def _enqueue(self, req: Request) -> SimRequest:
        sreq = SimRequest(req, self.context_limit, self.env)
        reason = self._never_fits(sreq)
        if reason:  # as engines do at add_request: it never enters the queue
            self._reject(sreq, reason)
            return sreq
        self.waiting.append(sreq)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()
        return sreq

    def _never_fits(self, sreq: SimRequest) -> str:
        if sreq.prompt_len >= self.max_context_len:
            return (f"prompt of {sreq.prompt_len} tokens leaves no room under max context "
                    f"length {self.max_context_len}")
        # a reserving policy's reservation is a function of the request's lengths
        # (Reserving.reservation): asked once here, read as the queue head's on every pass
        sreq.reservation = self._reservation(sreq)
        need = max(sreq.final_len, self.admission.need_alone(sreq), sreq.reservation)
        if need > self.policy.capacity:
            return f"needs {need} KV slots, the pool has {self.policy.capacity}"
        return ""

    def _reject(self, sreq: SimRequest, reason: str) -> None:
        sreq.status = "rejected"
        sreq.reject_reason = reason
        self.rejected += 1
        self.progress_made()
        self._record(sreq)

    def finish(self, sreq: SimRequest) -> None:
        self.progress_made()
        self.policy.finish(sreq.rid, sreq.seq_ids(sreq.written))
        self._mem_epoch += 1
        sreq.status = "completed"
        sreq.finish_s = self.env.now
        if math.isnan(sreq.first_token_s):
            sreq.first_token_s = sreq.finish_s
        self.completed += 1
        self.last_finish_s = sreq.finish_s
        if sreq.req.session_id is not None:
            self._session_turn_done = True
        sreq.ids = None
        self._record(sreq)

    def _record(self, sreq: SimRequest) -> None:
        self.rec.add_request(sreq.result_row())
        if sreq.cached_tokens >= 0:
            self.window_lost_tokens += sreq.rule_lost[0]
            self.state_lost_tokens += sreq.rule_lost[1]
        self.arrivals.done(sreq)
        if self.progress is not None:
            self.progress(1)
        sreq.done.succeed()

    # -- what the fast-forward asks (simulator/fastforward/ StretchHost) ---------------------
    def next_arrival(self) -> float:
        return self.arrivals.next_due()

    def head_admissible(self) -> bool:
        """Admission could take the queue head now (reserving: unless it refused it since)."""
        head = self.waiting[0]
        if self.admission.reserving:
            return self._blocked != (head.rid, self._mem_epoch)
        return self.admission.admissible(head, self.peek_admission(head), 0, self.running,
                                         self.prefilling)

    def admission_horizon(self, k: int) -> int:
        """The decode steps (<= k) before admission could take the queue head."""
        head = self.waiting[0]
        return self.admission.horizon(head, self.peek_admission(head), self.running, k)

    def stretch_applied(self, n: int, decoded: bool) -> None:
        """A stretch applied n iterations (`decoded`: the running batch decoded a token in
        each): what stepping does after an iteration, for all n at once: the policy's checks
        (counted as one iteration's) and the admission's per-step state (`after_steps(n)` is
        n single steps)."""
        self.maybe_check_invariants()
        if decoded:
            self.admission.after_steps(n)

    def head_reservation(self) -> int:
        if not self.waiting:
            return self.max_context_len
        return max(self.waiting[0].reservation, 1)

    def _reservation(self, sreq: SimRequest) -> int:
        """What a reserving policy would reserve for `sreq` (0: memory on demand)."""
        if self.reserving is None:
            return 0
        return self.reserving.reservation(sreq.prompt_len, sreq.final_len, sreq.max_new)

    def peek_admission(self, sreq: SimRequest) -> PrefixPeek:
        """Kept until the pass ends or an admission changes the pool: a pass that admits asks
        about its head twice (the fast-forward, then the admission round), nothing between."""
        if self.prefix_cache is None:
            return NO_HIT
        if self._peeked is None or self._peeked[0] is not sreq:
            self._peeked = (sreq, self.prefix_cache.peek_admission(sreq.prefill_key()))
        return self._peeked[1]

    def _peek(self, sreq: SimRequest) -> int:
        if self.prefix_cache is None:
            return 0
        return self.prefix_cache.peek_prefix(sreq.prefill_key())

    # -- preemption ------------------------------------------------------------------------
    def _preempt(self, victim: SimRequest) -> float:
        """Give back the victim's memory; it goes to the front of the queue. Returns the
        seconds the iteration spends swapping it out (0 for recompute)."""
        self.preemptions += 1
        self._mem_epoch += 1
        victim.preemptions += 1
        self.guard.preempted(victim, self.env.now, self._state)
        cost = 0.0
        if victim in self.running:
            self.running.remove(victim)
        else:
            self.prefilling.remove(victim)
        written = victim.written
        victim.computed_len = max(victim.computed_len, written)
        if self.preempt_mode.swap and written > 0:
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

    def progress_made(self) -> None:
        self.guard.progress()

    def _state(self) -> str:
        """Memory and queues in one line (the livelock error's)."""
        b = self.policy.breakdown(self.head_reservation())
        return (f"memory: capacity {b.capacity}, token states {b.token_states}, cached "
                f"{b.cached}, reserved {b.reserved}, free {b.free_total}, available "
                f"{self.policy.available_tokens()}; running {len(self.running)}, prefilling "
                f"{len(self.prefilling)}, waiting {len(self.waiting)}; policy "
                f"{self.policy.name}, admission {self.admission.name}")

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            self._peeked = None
            if self._session_turn_done:
                self._session_turn_done = False
                yield env.timeout(0)
            if not (self.waiting or self.prefilling or self.running):
                self._idle_since = env.now
                if not self.arrivals.pending():
                    break  # idle for good: close_idle() records the rest of the window
                self._wakeup = env.event()
                yield self._wakeup
                self._wakeup = None
                self.close_idle(env.now)
                continue
            # the head that a stretch must not pass is the head in schedule order (lpm
            # reorders; stepping sorts at the start of every iteration)
            self.waiting = self.schedule.order(self.waiting, self._peek)
            stretch = self.fast_forward.plan()
            if stretch is not None:
                yield from self.fast_forward.run(stretch)
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
            b = self.policy.breakdown(self.head_reservation())
            parts = b.as_array()
            self.rec.add_interval(t0, until, parts, b.frag_index,
                                  self.policy.page_table_entries(), b.over_reservation)
            # the timeline steps down to what is held while idle, at both ends of the gap:
            # without these rows a plot carries the last busy sample across it
            for t in (t0, until):
                self.rec.sample(t, parts, 0, len(self.waiting), 0, force=True)

    def _iteration(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        t0 = env.now
        extra = 0.0
        plan = self._plan_prefill()
        if plan and not self.policy.extend([s.rid for s, _ in plan], [t for _, t in plan]):
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
        running = self.running
        while running and not self.policy.decode(running.rids()):
            self.failed_decode_allocs += 1
            extra += self._preempt(self.admission.victim(running))
            self.admission.after_retraction(running)
        n_dec = len(running)  # everyone still running decodes one token
        running.wrote(n_dec, 1)
        self.maybe_check_invariants()
        if not plan and not n_dec:
            # nothing ran: with an empty engine the head can never be admitted; otherwise
            # everyone running was preempted, and the next iteration retries
            if self.waiting and not (self.running or self.prefilling):
                self._reject(self.waiting.pop(0), "does not fit even in an empty engine")
            return
        dt = self.latency.iteration_time(prefill_info, running.written[:n_dec],
                                         self.policy.page_size) + extra
        if self.tier is not None and self.tiered is not None:
            state = self.tiered.tier_state()
            dt += self.tier.iteration_stall([s for s, _ in plan], dt, state,
                                            self.policy.page_size)
            self.rec.host = (state.host_used, state.host_locked)
        if self.event_sink is not None:
            self.event_sink(t0, t0 + dt, chunks, running.rids(), 1)
        b = self.policy.breakdown(self.head_reservation())
        parts = b.as_array()
        self.rec.add_interval(t0, t0 + dt, parts, b.frag_index,
                              self.policy.page_table_entries(), b.over_reservation)
        batch = n_dec + len(plan)
        self.rec.add_iterations(t0, 1, batch)
        self.rec.sample(t0, parts, batch, len(self.waiting), len(self.running))
        if n_dec:
            self.admission.after_steps(1)
        yield env.timeout(dt)
        self._after_iteration(plan, n_dec)

    def _after_iteration(self, plan: Plan, n_dec: int) -> None:
        """First tokens of finished prefills (they join the batch after its n_dec rows,
        once those are stepped: the whole batch steps, so the batch keeps its smallest
        remaining output and the gaps come as one value; the same rows and gaps)."""
        now = self.env.now
        joined: list[SimRequest] = []
        for sreq, _target in plan:
            sreq.swap_len = 0  # a copy back is done in its one iteration
            if sreq.written < sreq.prefill_target:
                continue  # more chunks to go
            self.prefilling.remove(sreq)
            if sreq.decoded == 0:
                sreq.decoded = 1 if sreq.output_len > 0 else 0
                sreq.first_token_s = sreq.last_token_s = now
                if sreq.output_len > 0:
                    self.generated_tokens += 1
                    self.progress_made()
                if self.prefix_cache is not None:
                    self.prefix_cache.cache_prefix(sreq.rid, sreq.seq_ids(sreq.written))
            if sreq.decoded >= sreq.output_len:
                self.finish(sreq)
            else:
                sreq.status = "running"
                joined.append(sreq)
        if n_dec:
            self.progress_made()
            self.rec.add_gaps(*self.running.stepped(n_dec, 1, now, now))
            self.generated_tokens += n_dec
        for sreq in joined:
            self.running.append(sreq)
        if not n_dec:
            return
        for sreq in self.running.remove_done(n_dec):
            self.finish(sreq)

    def maybe_check_invariants(self) -> None:
        """The policy's checks every cfg.check_every-th iteration or stretch, if asked."""
        if not self.cfg.engine.check_invariants:
            return
        self._check_countdown -= 1
        if self._check_countdown <= 0:
            self._check_countdown = self.cfg.tuning.check_every
            self.invariant_checks += 1
            self.policy.check_invariants()

