"""Mutation testing as a habit: named mutations of our own code, each run against the few tests
chosen to notice it; every mutation must be killed (a test fails).

A test suite is only as strong as the changes it would notice. Each entry of MUTATIONS names
one plausible bug (a flipped comparison, an off-by-one page rounding, a victim rule reversed):
the file, its exact original text, the replacement, and the tests to run. The script copies
the tree (the files git tracks or would track) to a temporary directory, applies one mutation
at a time there (the original must be found exactly once, so a list that drifted from the
code fails loudly instead of mutating the wrong place), runs the selected tests in the copy
(PYTHONPATH = the copy, CI=true so Hypothesis is derandomized and a rerun gives the same
answer) and reports killed / survived and the first test that failed.

    python benchmarks/mutations.py                      # all, table on stdout
    python benchmarks/mutations.py --list               # names, files, tests
    python benchmarks/mutations.py --only lru-becomes-mru,buddy-keeps-high-half
    python benchmarks/mutations.py --markdown out/mutations.md --csv out/mutations.csv

Exit status: 0 when every mutation was killed, 1 when one survived, 2 when the list does not
match the code (an original text missing or ambiguous) or the unmutated tests fail.

Editing the list: keep `original` short but unique in its file (a line or two); keep `tests`
to the few test ids that should notice (the whole run takes minutes, not the suite's ten); a
mutation that survives gets a real test of the behaviour it breaks, never one written against
the mutated text. docs/reliability.md keeps the table of the last full run.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    """One named bug: `original` (exactly once in `file`) becomes `replacement`; `tests` are
    pytest node ids (or files) run against it."""

    name: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]


# fmt: off
MUTATIONS: tuple[Mutation, ...] = (
    # -- kvcore ------------------------------------------------------------------------------
    Mutation(
        "state-in-kv-dtype", "kvcore/model/layers.py",
        "        conv_dtype = self.conv_dtype or model_dtype\n",
        "        conv_dtype = kv_dtype\n",  # the KV dtype sizes the conv state (issue 37)
        ("tests/kvcore/test_vllm_rules.py::test_fp8_kv_does_not_shrink_the_states",
         "tests/kvcore/test_hybrid_plan.py::test_fp8_kv_leaves_the_state_dtype_alone")),
    Mutation(
        "legacy-token-formula-everywhere", "kvcore/model/hybrid_plan.py",
        'if rules.token_formula == "blocks":',
        "if True:",  # vLLM's pre-v0.20.1 "GPU KV cache size" for every version
        ("tests/kvcore/test_hybrid_plan.py::test_qwen35_4b_current_and_legacy_report",)),
    Mutation(
        "align-holds-one-state-page", "kvcore/model/vllm_rules.py",
        'base = 2 if mode == "align" else 1',
        "base = 1",  # mode align's worst case of two state pages forgotten
        ("tests/kvcore/test_vllm_rules.py::test_mamba_cache_mode_and_state_pages_by_version",
         "tests/kvcore/test_hybrid_plan.py::test_qwen35_4b_current_and_legacy_report")),
    Mutation(
        "page-rounding-overshoots", "kvcore/sglang/policy.py",
        "return (x + (ps - 1)) // ps * ps",
        "return (x + ps) // ps * ps",  # a length on a page boundary rounds up a whole page
        ("tests/kvcore/test_paged_policy.py::test_worked_example_rounding",
         "tests/kvcore/test_paged_policy.py::test_lengths_on_a_page_boundary_round_to_themselves")),
    Mutation(
        "lru-becomes-mru", "kvcore/sglang/node.py",
        "def _lru(n: TreeNode) -> int:\n    return (n.last_access << 40) | n.id",
        "def _lru(n: TreeNode) -> int:\n    return ((-n.last_access) << 40) | n.id",  # newest first
        ("tests/kvcore/test_radix_cache.py::test_evict_lru_order_and_overshoot",)),
    Mutation(
        "write-through-writes-nothing", "kvcore/sglang/hicache.py",
        "if self.write_on_insert:\n            self.host.store(",
        "if self.write_on_insert:\n            (",
        ("tests/kvcore/test_tiers.py::test_host_hit_is_loaded_not_prefilled",)),
    Mutation(
        "reuse-counts-from-zero", "kvcore/tiers/controller.py",
        "return hits[pages] + 1 >= self.config.write_threshold",
        "return hits[pages] >= self.config.write_threshold",  # entering the cache not counted
        ("tests/kvcore/test_tier_controller.py::test_reused_is_per_page_for_both_policies",)),
    Mutation(
        "host-evicts-whole-leaf", "kvcore/sglang/tier_tree.py",
        "            keep = len(leaf) - want\n",
        "            keep = 0\n",  # not page-granular: the whole leaf goes
        ("tests/kvcore/test_tiers.py::test_host_page_granular_lru_eviction",
         "tests/kvcore/test_tiers.py::test_host_tier_equals_an_lru_model")),
    Mutation(
        "hash-ignores-parent", "kvcore/vllm/block_hash.py",
        "raw = _unmix(np.asarray(parents, dtype=_U64)) * _U64(pow(_BASE, ps, 1 << 64))",
        "raw = np.zeros(len(parents), dtype=_U64)",  # blocks hashed alone: no chaining
        ("tests/kvcore/test_vllm_block.py::test_block_hash_is_deterministic_and_chained",)),
    Mutation(
        "vllm-hit-not-capped", "kvcore/vllm/manager.py",
        "        top = len(ids) - 1\n",
        "        top = len(ids)\n",  # a full-prompt hit leaves nothing to run
        ("tests/kvcore/test_vllm_block.py::test_hit_capped_at_prompt_minus_one",)),
    Mutation(
        "decode-rounding-counted-as-reserved", "kvcore/contract/breakdown.py",
        "    out[:, 2] += new_slots - token_growth - rounding\n    out[:, 3] += rounding\n",
        "    out[:, 2] += new_slots - token_growth\n",  # the parts still sum to the capacity
        ("tests/kvcore/test_paged_policy.py::test_decode_steps_and_profile_equal_stepping",
         "tests/kvcore/test_paged_fast_paths.py::test_page_growth_within_page_equals_general")),
    Mutation(
        "vllm-evicted-state-is-the-state-rule", "kvcore/vllm/coordinator.py",
        "[(h != 0) | ev.kept(rule.gid, hashes)",
        "[(h != 0)",  # a state the pool evicted counted as never kept: capacity misnamed
        ("tests/kvcore/test_vllm_hybrid.py::"
         "test_a_state_block_the_pool_evicted_is_capacity_not_the_state_rule",
         "tests/kvcore/test_vllm_hybrid.py::TestHybridMachine")),
    Mutation(
        "vllm-evicted-state-kept-after-its-content", "kvcore/vllm/state_evictions.py",
        "            dead = set(out).difference(self._full_hashes() if live is None else "
        "live)\n",
        "            dead: set[int] = set()\n",  # the record outlives its full-attention KV
        ("tests/kvcore/test_vllm_hybrid.py::"
         "test_an_evicted_state_is_forgotten_with_its_full_attention_kv",
         "tests/kvcore/test_vllm_hybrid.py::TestHybridMachine")),
    Mutation(
        "vllm-stretch-rounding-counted-as-reserved", "kvcore/vllm/stretch.py",
        "        out[:, _RESERVED] = reserved // g\n        out[:, _INTERNAL] = rounding // g\n",
        "        out[:, _RESERVED] = (reserved + rounding) // g\n",  # the parts still sum
        ("tests/kvcore/test_vllm_block.py::test_decode_steps_equal_stepping",
         "tests/kvcore/test_vllm_hybrid.py::TestHybridMachine")),
    Mutation(
        "short-stretch-rounding-counted-as-reserved", "kvcore/contract/breakdown.py",
        "                    [0, 0, -1, 1, 0, 0]], dtype=np.int64)",
        "                    [0, 0, 0, 0, 0, 0]], dtype=np.int64)",  # the parts still sum
        ("tests/kvcore/test_paged_policy.py::test_decode_steps_and_profile_equal_stepping",)),
    Mutation(
        "plain-short-stretch-rounding-as-reserved", "kvcore/sglang/stretch.py",
        "rows.append((ts + tokens, ca, rs + slots - tokens - rounding, it + rounding, ex,",
        "rows.append((ts + tokens, ca, rs + slots - tokens, it, ex,",  # the parts still sum
        ("tests/kvcore/test_paged_fast_paths.py::test_short_stretch_equals_within_page",
         "tests/kvcore/test_paged_policy.py::test_decode_steps_and_profile_equal_stepping")),
    Mutation(
        "page1-stretch-pops-batch-major", "kvcore/sglang/stretch.py",
        "return pages.reshape(len(steps), len(written))",
        "return pages.reshape(len(written), len(steps)).T",  # request by request, not step
        ("tests/kvcore/test_paged_policy.py::test_decode_steps_and_profile_equal_stepping",)),
    Mutation(
        "decode-fresh-page-a-token-late", "kvcore/sglang/allocator.py",
        "return [i for i, x in enumerate(written) if not x % ps]",
        "return [i for i, x in enumerate(written) if not (x + 1) % ps]",  # the next token's
        ("tests/kvcore/test_paged_fast_paths.py::"
         "test_fresh_page_rows_and_decode_rows_equal_the_mask",)),
    Mutation(
        "insert-below-skips-the-path-touch", "kvcore/sglang/radix_cache.py",
        "                above.last_access = self._clock\n",
        "                pass\n",  # the locked path keeps its old LRU clock
        ("tests/kvcore/test_radix_cache.py::"
         "test_insert_below_a_locked_node_equals_insert_from_the_root",)),
    Mutation(
        "swa-match-ignores-tombstones", "kvcore/sglang/sliding_window.py",
        "since = 0 if node in tombs else since + matched",
        "since = since + matched",  # a hit through a tombstone without its last window
        ("tests/kvcore/test_paged_hybrid.py::test_tombstone_match_needs_the_last_window",)),
    Mutation(
        "swa-window-freed-a-step-late", "kvcore/sglang/sliding_window.py",
        "np.flatnonzero((steps - 1) % self.window == 0)",
        "np.flatnonzero(steps % self.window == 0)",  # SGLang frees on the first step
        ("tests/kvcore/test_paged_hybrid.py::test_decode_frees_swa_out_of_window_by_hand",)),
    Mutation(
        "mamba-hit-not-copied", "kvcore/sglang/mamba_state.py",
        "        if hit:  # copy on write",
        "        if False:  # copy on write",  # a hit runs on a fresh, empty state
        ("tests/kvcore/test_paged_hybrid.py::test_mamba_hit_copies_the_state_and_caps_running",)),
    Mutation(
        "evicted-state-counts-as-the-rule", "kvcore/sglang/mamba_state.py",
        "                self.evicted.add(x)\n",
        "                pass\n",  # a state the pool evicted reads as one never kept
        ("tests/kvcore/test_paged_hybrid.py::test_the_match_rules_cuts_by_hand",)),
    Mutation(
        "rule-cut-counted-as-page-alignment", "kvcore/sglang/policy.py",
        "max(token_hit, cached) if cached == match.cuts[0]\n",
        "max(token_hit, cached) if True\n",  # a window or state cut read as the page's
        ("tests/kvcore/test_paged_hybrid.py::test_the_match_rules_cuts_by_hand",
         "tests/simulator/test_reuse_hybrid.py::"
         "test_the_state_boundary_rule_is_named_where_it_cuts_every_hit")),
    Mutation(
        "dead-leaves-kept-after-eviction", "kvcore/sglang/radix_cache.py",
        "            evicted += self.drop_dead_leaves(parent)\n",
        "            pass\n",  # tombstone / stateless leaves stay after a full eviction
        ("tests/kvcore/test_paged_hybrid.py::"
         "test_full_eviction_deletes_the_tombstone_it_leaves_as_a_leaf",)),
    Mutation(
        "best-fit-takes-largest-hole", "kvcore/contiguous/placement.py",
        "        return self._by_size[i][1] if i < len(self._by_size) else None",
        "        return self._by_size[-1][1] if i < len(self._by_size) else None",  # worst fit
        ("tests/kvcore/test_placement.py::test_first_fit_and_best_fit_choose_differently",)),
    Mutation(
        "buddy-keeps-high-half", "kvcore/contiguous/placement.py",
        "            insort(free[j], start + (1 << j))",
        "            insort(free[j], start)\n            start += 1 << j",
        ("tests/kvcore/test_placement.py::test_buddy_split_and_coalesce",)),
    Mutation(
        "chain-index-youngest-holder", "kvcore/vllm/chain_index.py",
        "                take = (gen[blocks] == g) & (g < view)",  # the lowest generation wins
        "                take = (gen[blocks] == g) & ((g > view) | (view == _NEVER))",
        ("tests/kvcore/test_chain_index.py::TestPool",)),
    Mutation(
        "chain-index-holders-youngest", "kvcore/vllm/chain_index.py",
        "            view = age[s : s + m]\n"
        "            take = (gen[blocks] == g) & (g < view)",
        "            view = age[s : s + m]\n"
        "            take = gen[blocks] == g",  # the last segment read wins, not the oldest
        ("tests/kvcore/test_chain_index.py::TestPool",)),
    # -- the order the vLLM family frees blocks in (what is evicted first) ----------------------
    Mutation(
        "vllm-release-groups-forward", "kvcore/vllm/manager.py",
        "pool.free_blocks(np.concatenate(parts[::-1]),",
        "pool.free_blocks(np.concatenate(parts),",  # group by group, the first group's first
        ("tests/kvcore/test_vllm_free_order.py",)),
    Mutation(
        "vllm-release-blocks-forward", "kvcore/vllm/manager.py",
        "parts = [rule.held(table.blocks)[::-1]",
        "parts = [rule.held(table.blocks)",  # each table from its head: the head goes first
        ("tests/kvcore/test_vllm_free_order.py",)),
    Mutation(
        "vllm-window-frees-first-up", "kvcore/vllm/group_rules.py",
        "                break  # nulled by an earlier call, and so is everything before it\n"
        "            freed.append(b)",
        "                break  # nulled by an earlier call, and so is everything before it\n"
        "            freed.insert(0, b)",  # the oldest block left behind the window goes last
        ("tests/kvcore/test_vllm_free_order.py",)),
    Mutation(
        "vllm-state-frees-first-up", "kvcore/vllm/group_rules.py",
        "            if b:\n                freed.append(b)",
        "            if b:\n                freed.insert(0, b)",
        ("tests/kvcore/test_vllm_free_order.py",)),
    Mutation(
        "vllm-stretch-frees-ascending", "kvcore/vllm/stretch.py",
        "        frees.sort()\n",
        "        frees.sort(key=lambda f: (f[0], f[1], f[2], -f[3]))\n",  # positions ascending
        ("tests/kvcore/test_vllm_free_order.py",)),
    Mutation(
        "vllm-pool-frees-reversed", "kvcore/vllm/block_pool.py",
        "        self.free_block_queue.append_n(idle)\n",
        "        self.free_block_queue.append_n(idle[::-1])\n",  # the caller's order undone
        ("tests/kvcore/test_vllm_free_order.py", "tests/kvcore/test_block_pool.py")),
    Mutation(
        "block-tier-unhold-head-first", "kvcore/vllm/block_tiers.py",
        "            self.pool.free_blocks(chain[::-1])",
        "            self.pool.free_blocks(chain)",  # a landed load's tail the most recent
        ("tests/kvcore/test_vllm_free_order.py",)),
    Mutation(
        "block-tier-selective-head-least-recent", "kvcore/vllm/tiered.py",
        "        rev = chain[::-1]\n",
        "        rev = chain\n",  # a reused chain's head the first evicted
        ("tests/kvcore/test_vllm_free_order.py",)),
    Mutation(
        "block-tier-write-through-head-least-recent", "kvcore/vllm/tiered.py",
        "wheres = [host.store(hashes[::-1], parents[::-1], tokens[::-1], known[::-1],\n"
        "                                 distinct=True).where[::-1]]",
        "wheres = [host.store(hashes, parents, tokens, known,\n"
        "                                 distinct=True).where]",  # stored head first
        ("tests/kvcore/test_vllm_free_order.py",)),
    Mutation(
        "contiguous-prefill-steps-forget-decoders", "kvcore/contiguous/policy.py",
        "grown = np.arange(1, n + 1, dtype=np.int64) * (sum(rooms) + len(dreqs))",
        "grown = np.arange(1, n + 1, dtype=np.int64) * sum(rooms)",  # the chunks' tokens only
        ("tests/kvcore/test_contiguous_steps.py::"
         "test_prefill_steps_equal_extends_and_decodes",)),
    # -- simulator ---------------------------------------------------------------------------
    Mutation(
        "admission-budget-forgets-round", "simulator/admission.py",
        "budget = available - rem * self.ratio - charged",
        "budget = available - rem * self.ratio",  # each admission sees the whole budget
        ("tests/simulator/test_edge_cases.py::"
         "test_one_admission_round_charges_every_request_it_takes",)),
    Mutation(
        "preempt-oldest-not-newest", "simulator/scheduler.py",
        "return max(running, key=lambda r: (r.req.arrival_s, r.req.request_id))",
        "return min(running, key=lambda r: (r.req.arrival_s, r.req.request_id))",
        ("tests/simulator/test_edge_cases.py::"
         "test_decode_out_of_memory_preempts_by_the_engines_rule",)),
    Mutation(
        "retract-most-decoded", "simulator/scheduler.py",
        "return min(running, key=lambda r: (r.decoded, -r.prompt_len, -r.req.request_id))",
        "return max(running, key=lambda r: (r.decoded, -r.prompt_len, -r.req.request_id))",
        ("tests/simulator/test_edge_cases.py::"
         "test_decode_out_of_memory_preempts_by_the_engines_rule",)),
    Mutation(
        "overload-backlog-inverted", "simulator/overload.py",  # the no-rows fallback
        "if backlog > max(th.backlog_min, th.backlog_share * total):",
        "if backlog < max(th.backlog_min, th.backlog_share * total):",
        ("tests/simulator/test_overload.py::test_without_rows_the_backlog_at_the_end_decides",)),
    Mutation(
        "overload-floor-trend-inverted", "simulator/overload.py",  # the steady-state rule
        "growth > th.growth_share * arrival_rate",
        "growth < th.growth_share * arrival_rate",
        ("tests/simulator/test_overload.py::test_sustained_overload_fires_both_signals",
         "tests/simulator/test_overload.py::test_backlog_floor_threshold_both_sides")),
    Mutation(
        "stretch-runs-past-arrival", "simulator/fastforward/planner.py",
        "now, due = e.env.now, e.next_arrival()",
        "now, due = e.env.now, float('inf')",  # the steps after an arrival taken blind
        ("tests/simulator/test_multistep.py::test_stretches_equal_stepping",)),
    Mutation(
        "prefill-stretch-completes-blind", "simulator/fastforward/planner.py",
        "n = min(n, (s.prefill_target - s.written - 1) // room)",
        "n = min(n, (s.prefill_target - s.written) // room)",  # its last chunk in a stretch
        ("tests/simulator/test_prefill_stretch.py::test_prefill_stretches_equal_stepping",)),
    Mutation(
        "sglang-ratio-decays-by-a-product", "simulator/admission.py",
        "            self.ratio = decayed_ratios(self.ratio, n, p.new_token_ratio_decay,\n"
        "                                        p.new_token_ratio_min)[-1]",
        "            self.ratio = max(p.new_token_ratio_min,\n"
        "                             self.ratio - p.new_token_ratio_decay * n)",
        ("tests/simulator/test_ratio_decay.py",)),
    Mutation(
        "sglang-horizon-ratio-by-a-product", "simulator/admission.py",
        "        ratio = np.array(decayed_ratios(self.ratio, k, p.new_token_ratio_decay,\n"
        "                                        p.new_token_ratio_min))",
        "        ratio = np.maximum(p.new_token_ratio_min,\n"
        "                           self.ratio - p.new_token_ratio_decay * j)",
        ("tests/simulator/test_ratio_decay.py::"
         "test_the_horizon_is_the_step_at_which_stepping_admits",)),
    Mutation(
        "prefill-stretch-passes-admissible-head", "simulator/fastforward/planner.py",
        "if not plan or (e.waiting and budget > 0 and not e.admission_stops(e.waiting[0], 0)):",
        "if not plan:",  # a head that memory given back lets in waits out the stretch
        ("tests/simulator/test_prefill_stretch.py::test_prefill_stretches_equal_stepping",)),
    Mutation(
        "short-stretch-over-reservation-per-step", "simulator/metrics.py",
        "                over += over_reservation * w",
        "                over += over_reservation",  # a count, not slot-seconds
        ("tests/simulator/test_short_stretch.py::test_add_steps_is_add_profile",)),
    Mutation(
        "latency-drops-context-pages", "simulator/latency.py",
        "            pre_pages += -(-(new + before) // ps)",
        "            pre_pages += -(-new // ps)",
        ("tests/simulator/test_latency.py::test_page_term_counts_every_page_attended",)),
    Mutation(
        "reuse-gap-ignores-pages", "simulator/reuse_gap.py",
        "ideal_ps = float((hits1 - hits1 % page_size).sum())",
        "ideal_ps = float(hits1.sum())",  # alignment always 0; not-arrived absorbs it
        ("tests/simulator/test_overload.py::test_reuse_gap_matches_a_brute_force_count",)),
    # -- experiments -------------------------------------------------------------------------
    Mutation(
        "table1-tolerance-5pct", "experiments/validation/vllm_paper.py",
        "        ok = ours == pub_k ",
        "        ok = abs(ours - pub_k) <= 0.05 * pub_k ",  # a known miss would pass
        ("tests/experiments/test_validation.py::test_table1_verdicts_need_no_simulation",)),
    Mutation(
        "overload-forgets-unfinished", "simulator/overload.py",  # rows only (issue 38 item 11)
        "    if unfinished.count:\n        arr = np.concatenate",
        "    if False:\n        arr = np.concatenate",
        ("tests/simulator/test_overload.py::"
         "test_requests_the_run_ended_with_count_in_the_verdict",
         "tests/simulator/test_overload.py::"
         "test_a_no_drain_run_that_ends_with_a_queue_is_overloaded")),
    Mutation(
        "recommend-pairs-the-wrong-batches", "experiments/answers/recommend.py",  # issue 38 item 1
        "    d = _differences(x, y, ratio)",
        "    d = _differences(x, np.roll(y, 1), ratio)",
        ("tests/reports/test_recommend.py::test_one_seed_pairs_the_runs_batch_by_batch",)),
    Mutation(
        "calibrate-bound-reads-fitted", "experiments/answers/calibrate.py",  # issue 38 item 9
        "            at_bound.add(k)\n",
        "",
        ("tests/experiments/test_calibrate.py::"
         "test_a_constant_pushed_to_its_bound_is_held_there_and_says_so",)),
    # -- issue 39 item 7: quantized weights, the TP all-reduce, the overload window ---------
    Mutation(
        "mxfp4-scales-forgotten", "kvcore/model/presets.py",
        '"mxfp4": 4.25 / 8',
        '"mxfp4": 4 / 8',  # E2M1 alone: the E8M0 scale per 32 values not counted
        ("tests/kvcore/test_weight_bytes.py::"
         "test_gpt_oss_weights_match_the_model_cards_checkpoint_size",)),
    Mutation(
        "nvfp4-scale-per-32-values", "kvcore/model/presets.py",
        '"nvfp4": 4.5 / 8',
        '"nvfp4": 4.25 / 8',  # MXFP4's block of 32 instead of NVFP4's 16
        ("tests/kvcore/test_weight_bytes.py::test_nvfp4_bytes_match_nvidias_stated_footprint",
         "tests/kvcore/test_weight_bytes.py::"
         "test_an_nvfp4_checkpoint_read_from_its_config_is_3_5x_smaller")),
    Mutation(
        "mxfp4-quantizes-every-parameter", "kvcore/model/presets.py",
        "return self.is_moe and self.weight_dtype.lower() in EXPERTS_ONLY_FORMATS",
        "return False",  # attention, embeddings, head in MXFP4 too
        ("tests/kvcore/test_weight_bytes.py::"
         "test_gpt_oss_weights_match_the_model_cards_checkpoint_size",)),
    Mutation(
        "tp-allreduce-dropped", "simulator/latency.py",
        '        return t + tokens * c["ar_tok"] + c["ar_fixed"]\n\n    def _hybrid_time',
        "        return t\n\n    def _hybrid_time",  # the scalar path iteration_time takes
        ("tests/simulator/test_latency.py::test_tp_allreduce_term_matches_nccl_on_h100",)),
    Mutation(
        "tp-allreduce-doubled", "simulator/latency.py",
        'c["ar_tok"] = (0.0 if tp == 1 else 2 * m.num_layers * 2 * (tp - 1) / tp',
        'c["ar_tok"] = (0.0 if tp == 1 else 4 * m.num_layers * 2 * (tp - 1) / tp',
        ("tests/simulator/test_latency.py::test_tp_allreduce_term_matches_nccl_on_h100",)),
    Mutation(
        "tp-allreduce-message-without-act-bytes", "simulator/latency.py",
        "* m.hidden_size * self.act_bytes / (self.tp_link_gb_s * 1e9))",
        "* m.hidden_size / (self.tp_link_gb_s * 1e9))",  # elements, not bytes
        ("tests/simulator/test_latency.py::test_tp_allreduce_term_matches_nccl_on_h100",)),
    Mutation(
        "tp-allreduce-latency-once-per-layer", "simulator/latency.py",
        'c["ar_fixed"] = 0.0 if tp == 1 else 2 * m.num_layers * self.tp_allreduce_latency_s',
        'c["ar_fixed"] = 0.0 if tp == 1 else m.num_layers * self.tp_allreduce_latency_s',
        ("tests/simulator/test_latency.py::test_tp_allreduce_term_matches_nccl_on_h100",)),
    Mutation(
        "overload-unadmitted-wait-zero", "simulator/overload.py",
        "wait = np.where(np.isfinite(adm), adm, np.maximum(end, arr)) - arr",
        "wait = np.where(np.isfinite(adm), adm, arr) - arr",  # not censored: no wait at all
        ("tests/simulator/test_overload.py::"
         "test_a_request_never_admitted_waits_until_the_window_end",)),
    Mutation(
        "overload-delay-forgets-unfinished", "simulator/overload.py",
        "    arr, adm = _queued(requests, unfinished)\n",
        "    arr, adm = _queued(requests)\n",  # the queueing delay of the completed rows only
        ("tests/simulator/test_overload.py::"
         "test_a_request_never_admitted_waits_until_the_window_end",)),
    Mutation(
        "overload-rate-counts-all-arrivals", "simulator/overload.py",
        "arrival_rate = window_arrivals(arrivals, start, end) / span",
        "arrival_rate = len(arrivals) / span",  # the warmup's arrivals too
        ("tests/simulator/test_overload.py::test_the_arrival_rate_counts_the_window_only",)),
    Mutation(
        "overload-window-end-excluded", "simulator/overload.py",
        "return int(((arrivals >= start) & (arrivals <= end)).sum())",
        "return int(((arrivals >= start) & (arrivals < end)).sum())",
        ("tests/simulator/test_overload.py::test_the_arrival_rate_counts_the_window_only",)),
    Mutation(
        "capacity-bisection-inverted", "experiments/answers/capacity.py",
        "            m = math.sqrt(lo * hi)\n            if probe(m):\n                hi = m",
        "            m = math.sqrt(lo * hi)\n            if not probe(m):\n                hi = m",
        ("tests/experiments/test_capacity.py::"
         "test_the_answer_is_servable_and_within_the_bracket_precision",)),
)
# fmt: on


@dataclass
class Outcome:
    name: str
    file: str
    status: str  # killed / survived / timeout
    killed_by: str
    seconds: float


class ListDrift(RuntimeError):
    """The list no longer matches the code: an original text missing or found twice."""


def copy_tree(dst: Path) -> None:
    """The files git tracks, plus untracked ones it does not ignore (work in progress)."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-co", "--exclude-standard"],
                         check=True, capture_output=True).stdout
    for rel in filter(None, out.decode().split("\0")):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def check_list(root: Path, mutations: tuple[Mutation, ...]) -> None:
    """Every original text exactly once in its file; every named test file present."""
    problems = []
    for m in mutations:
        path = root / m.file
        n = path.read_text().count(m.original) if path.is_file() else -1
        if n != 1:
            where = "file missing" if n < 0 else f"original text found {n} times"
            problems.append(f"{m.name}: {m.file}: {where} (expected exactly once)")
        for t in m.tests:
            if not (root / t.split("::")[0]).is_file():
                problems.append(f"{m.name}: test file {t.split('::')[0]} missing")
    if problems:
        raise ListDrift("\n".join(problems))


def run_pytest(root: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, str]:
    """('passed' | 'failed' | 'timeout', the first failing test id or the output's tail)."""
    env = {**os.environ, "PYTHONPATH": str(root), "CI": "true", "PYTHONDONTWRITEBYTECODE": "1"}
    # -n 0: a mutation runs a few tests; the suite's `-n auto` (pyproject addopts) would start
    # a worker per core for each of them (about 20 s a mutation instead of 5)
    cmd = [sys.executable, "-m", "pytest", "-n", "0", "-x", "-q", "-p", "no:cacheprovider",
           "-rfE", "--no-header", *tests]
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", f"no result within {timeout:.0f} s"
    if p.returncode == 0:
        return "passed", ""
    m = re.search(r"^(?:FAILED|ERROR) (\S+)", p.stdout, re.MULTILINE)
    if m:
        return "failed", m.group(1)
    tail = (p.stdout.strip() or p.stderr.strip()).splitlines()
    return "failed", tail[-1] if tail else f"pytest exit status {p.returncode}"


def run_one(root: Path, m: Mutation, timeout: float) -> Outcome:
    path = root / m.file
    text = path.read_text()
    t0 = time.perf_counter()
    path.write_text(text.replace(m.original, m.replacement, 1))
    try:
        result, detail = run_pytest(root, m.tests, timeout)
    finally:
        path.write_text(text)
    status = {"passed": "survived", "failed": "killed", "timeout": "timeout"}[result]
    return Outcome(m.name, m.file, status, detail, time.perf_counter() - t0)


def table(outcomes: list[Outcome]) -> str:
    """The Markdown table docs/reliability.md keeps."""
    lines = ["| mutation | file | result | killed by | s |", "| --- | --- | --- | --- | ---: |"]
    lines += [f"| `{o.name}` | `{o.file}` | {o.status} | `{o.killed_by or '-'}` | "
              f"{o.seconds:.0f} |" for o in outcomes]
    return "\n".join(lines) + "\n"


def as_csv(outcomes: list[Outcome]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["mutation", "file", "result", "killed_by", "seconds"])
    for o in outcomes:
        w.writerow([o.name, o.file, o.status, o.killed_by, f"{o.seconds:.1f}"])
    return buf.getvalue()


def select(names: str | None) -> tuple[Mutation, ...]:
    if not names:
        return MUTATIONS
    known = {m.name: m for m in MUTATIONS}
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"--only: unknown mutation(s) {', '.join(unknown)}; known: "
                         f"{', '.join(known)}")
    return tuple(known[n] for n in wanted)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated mutation names (default: all)")
    ap.add_argument("--list", action="store_true", help="print the mutations and exit")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="seconds per mutation's test run (a hang counts as killed: timeout)")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip running the selected tests on the unmutated copy first")
    ap.add_argument("--markdown", type=Path, help="also write the table to this Markdown file")
    ap.add_argument("--csv", type=Path, help="also write the results to this CSV file")
    args = ap.parse_args(argv)
    mutations = select(args.only)
    if args.list:
        for m in mutations:
            print(f"{m.name:34} {m.file:40} {' '.join(m.tests)}")
        return 0
    sys.path.insert(0, str(REPO))
    from reports.io import atomic_write_text, check_writable

    for flag, path in (("--markdown", args.markdown), ("--csv", args.csv)):
        if path is not None:
            try:
                check_writable(path.parent, flag)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
    with tempfile.TemporaryDirectory(prefix="kvsim-mutations-") as tmp:
        root = Path(tmp)
        copy_tree(root)
        try:
            check_list(root, mutations)
        except ListDrift as e:
            print(f"the mutation list does not match the code:\n{e}", file=sys.stderr)
            return 2
        if not args.no_baseline:
            tests = tuple(dict.fromkeys(t for m in mutations for t in m.tests))
            t0 = time.perf_counter()
            result, detail = run_pytest(root, tests, args.timeout * len(mutations))
            if result != "passed":
                print(f"the unmutated tests do not pass ({result}: {detail})", file=sys.stderr)
                return 2
            print(f"baseline: {len(tests)} test selections pass unmutated "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
        outcomes = []
        for m in mutations:
            o = run_one(root, m, args.timeout)
            print(f"{o.status:8} {o.name:34} {o.killed_by} ({o.seconds:.0f} s)", flush=True)
            outcomes.append(o)
    text = table(outcomes)
    print()
    print(text, end="")
    killed = sum(o.status != "survived" for o in outcomes)
    print(f"\n{killed} of {len(outcomes)} killed; "
          f"{sum(o.seconds for o in outcomes):.0f} s of test runs")
    if args.markdown is not None:
        atomic_write_text(args.markdown, text)
    if args.csv is not None:
        atomic_write_text(args.csv, as_csv(outcomes))
    return 0 if killed == len(outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
