"""Per-call cost of `paged`'s engine-facing hot paths on a batch the size of the Azure run's
(median 25 running requests, median stretch 5 steps at page size 16): one `breakdown`, one
`decode_steps` stretch and one single `decode` per round. Prints microseconds per call, the
best of --repeat fresh policies. Run it from each of two checkouts, alternating, to compare.

    python benchmarks/bench_paged_calls.py [--batch 25] [--steps 5] [--page-size 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from kvcore.policies import PolicyConfig, make_policy


def one_run(batch: int, steps: int, ps: int, rounds: int) -> dict[str, float]:
    """us per call of breakdown / decode_steps / decode over `rounds` rounds."""
    ctx = 2000 + rounds * (steps + 1) + 1
    cfg = PolicyConfig(kv_tokens=batch * (ctx // ps + 2) * ps, page_size=ps,
                       max_context_len=ctx, max_requests=256)
    p = make_policy("paged", cfg)
    rng = np.random.default_rng(1)
    rids = list(range(batch))
    lens = rng.integers(100, 2000, batch)
    for r in rids:
        assert p.admit(r, np.arange(lens[r]) + 10_000 * r, ctx, ctx) is not None
        assert p.extend([r], [int(lens[r])])
    spent = {"breakdown": 0.0, "decode_steps": 0.0, "decode": 0.0}
    for _ in range(rounds):
        a = time.perf_counter()
        p.breakdown(0)
        b = time.perf_counter()
        p.decode_steps(rids, steps, 0)
        c = time.perf_counter()
        assert p.decode(rids)
        d = time.perf_counter()
        spent["breakdown"] += b - a
        spent["decode_steps"] += c - b
        spent["decode"] += d - c
    p.check_invariants()
    return {k: v / rounds * 1e6 for k, v in spent.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=25)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for k, v in one_run(args.batch, args.steps, args.page_size, args.rounds).items():
            best[k] = min(best.get(k, v), v)
    print(" ".join(f"{k} {v:.1f} us" for k, v in best.items()))


if __name__ == "__main__":
    main()
