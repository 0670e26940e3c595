"""The engine's admission round and its undoing: which prefill chunks run this iteration
(continuing chunked prefills, then admissions from the queue head while the budget, the batch
limit, the admission rule and the pool allow), and, when the batched `extend` fails, taking
this round's admissions back one at a time.

A mixin of `Engine` (simulator/engine.py), kept in its own module so that each stays small:
it reads and writes the engine's queues, counters and policy exactly as the engine's own
methods do.
"""

from __future__ import annotations

from simulator.request import SimRequest

Plan = list[tuple[SimRequest, int]]  # (request, prefill target) chunks of one iteration


class AdmissionRound:
    """`_plan_prefill`, `_shrink_plan`, `_unadmit` of the engine (its attributes: `cfg`,
    `waiting`, `prefilling`, `running`, `policy`, `admission`, `schedule`, `tier`, the
    counters; not typed here, since the engine imports this module)."""

    def continuing_chunks(self) -> tuple[Plan, int]:
        """This iteration's chunks of the prefills under way (in order, while the prefill
        budget lasts) and the budget they leave for admissions; read-only (the prefill
        stretch plans from it too, simulator/fastforward/)."""
        budget = self.cfg.engine.max_prefill_tokens
        chunk = self.cfg.engine.chunked_prefill_size or None
        plan: Plan = []
        for sreq in self.prefilling:
            if budget <= 0:
                break
            room = min(budget, chunk) if chunk else budget
            target = min(sreq.prefill_target, sreq.written + room)
            plan.append((sreq, target))
            budget -= target - sreq.written
        return plan, budget

    def admission_stops(self, sreq: SimRequest, charged: int) -> bool:
        """The admission loop stops at `sreq`, the queue head, before asking the policy: a
        full batch, the admission rule, or a reserving policy that refused it since memory
        was last given back (read-only)."""
        if len(self.running) + len(self.prefilling) >= self.cfg.engine.max_running_requests:
            return True
        if not self.admission.admissible(sreq, self.peek_admission(sreq), charged,
                                         self.running, self.prefilling):
            return True
        return self._blocked == (sreq.rid, self._mem_epoch)

    def _plan_prefill(self) -> Plan:
        """Chunks to run this iteration: continuing chunked prefills, then admissions."""
        plan, budget = self.continuing_chunks()
        chunk = self.cfg.engine.chunked_prefill_size or None
        charged = 0
        self._admitted = []
        self.waiting = self.schedule.order(self.waiting, self._peek)
        while self.waiting and budget > 0:
            sreq = self.waiting[0]
            if self.admission_stops(sreq, charged):
                break
            target_ids = sreq.seq_ids(sreq.prefill_target)
            if self.tier is not None and self.tiered is not None:
                # at most what the storage prefetch delivered while it waited
                res = self.tiered.admit_prefetched(
                    sreq.rid, target_ids, sreq.final_len, sreq.max_new,
                    self.tier.model.allowance(self.env.now - sreq.req.arrival_s,
                                              self.policy.page_size))
            else:
                res = self.policy.admit(sreq.rid, target_ids, sreq.final_len, sreq.max_new)
            self._peeked = None
            if res is None:
                self._blocked = (sreq.rid, self._mem_epoch)
                break
            self.waiting.pop(0)
            charged += self.admission.charge(sreq, res.cached_len)
            self._admitted.append((sreq, sreq.cached_tokens < 0))
            if sreq.cached_tokens < 0:  # first admission: the prefix-hit statistics
                sreq.cached_tokens = res.cached_len
                sreq.token_hit = res.unaligned_hit
                sreq.admit_s = self.env.now
                self.prompt_tokens += sreq.prompt_len
                self.hit_tokens += res.cached_len
                self.token_hit_tokens += res.unaligned_hit
            if self.tier is not None:
                self.tier.admitted(sreq, res.host_hit, res.storage_hit,
                                   self.env.now - sreq.req.arrival_s, self.policy.page_size,
                                   self._admitted[-1][1])
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

    def _shrink_plan(self, plan: Plan) -> Plan:
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
        if self.tier is not None:
            self.tier.unadmitted(sreq, first)
        if first:
            self.prompt_tokens -= sreq.prompt_len
            self.hit_tokens -= sreq.cached_tokens
            self.token_hit_tokens -= sreq.token_hit
            sreq.cached_tokens = -1
            sreq.token_hit = 0
            sreq.admit_s = float("nan")
