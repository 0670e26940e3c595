"""`vllm`'s calls, A/B in one process: record every engine-facing call of the `vllm` policy on
a bench_policies.py cell (the first N requests of the bundled Mooncake conversation trace,
Llama-3.1-8B on an H100, vLLM budget rule), then drive the same calls on two trees' kvcore
side by side, each call timed on one tree and then the other (alternating which goes first),
so the drift of a shared machine hits both alike. Prints seconds per method and the ratio B/A.

    python benchmarks/bench_vllm_replay.py record --page-size 1 --chunk 64 --out calls.pkl
    python benchmarks/bench_vllm_replay.py ab TREE_A TREE_B calls.pkl

Why: on a busy machine two whole runs minutes apart differ by 10-20 %, more than a change to
the policy moves the run; here both trees see the same instants. Each tree builds its own
policy through its own `make_policy`, so trees whose `vllm` classes differ compare too. The
recording keeps every token-id array once (the prompt memo keys on the array), and the replay
checks that both trees return the same booleans, ints and stretch profiles.
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib
import pickle
import sys
import time
from typing import Any

from bench_paged_replay import METHODS


def record(page_size: int, chunk: int, num_requests: int, out: str) -> None:
    """Run the bench_policies.py cell with every `METHODS` call of the policy recorded."""
    from bench_policies import config

    from kvcore import policies
    from simulator.run import simulate
    from workloads.registry import build_workload
    from workloads.spec import WorkloadSpec

    calls: list[tuple[str, tuple, Any]] = []
    configs: list[Any] = []
    build = policies.make_policy
    depth = [0]

    def recorder(name: str, method: Any) -> Any:
        def wrapped(*args: Any) -> Any:
            depth[0] += 1
            try:
                result = method(*args)
            finally:
                depth[0] -= 1
            if depth[0] == 0:  # lists are copied: the engine reuses its own
                kept = tuple(list(a) if isinstance(a, list) else a for a in args)
                calls.append((name, kept, result if isinstance(result, bool | int) else None))
            return result
        return wrapped

    def recording(name: str, pconfig: Any) -> Any:
        configs.append(pconfig)
        policy = build(name, pconfig)
        for method in METHODS:
            fn = getattr(policy, method, None)
            if fn is not None:
                setattr(policy, method, recorder(method, fn))
        return policy

    # the engine looks the factory up by name at run time (simulator/run.py)
    for module in [m for m in list(sys.modules.values())
                   if m is not None and getattr(m, "make_policy", None) is build]:
        module.make_policy = recording  # type: ignore[attr-defined]
    wl = build_workload(WorkloadSpec(name="mooncake-conv", num_requests=num_requests))
    simulate(wl, config("vllm", page_size, chunk))
    with open(out, "wb") as fh:
        pickle.dump((configs[0], calls), fh, protocol=5)
    print(f"{len(calls)} calls -> {out}")


def _make_policy(tree: str) -> Any:
    """`make_policy` of `tree`, as its own set of kvcore modules."""
    for name in [m for m in sys.modules if m == "kvcore" or m.startswith("kvcore.")]:
        del sys.modules[name]
    sys.path.insert(0, tree)
    try:
        return importlib.import_module("kvcore.policies").make_policy
    finally:
        sys.path.remove(tree)


def ab(tree_a: str, tree_b: str, path: str) -> None:
    make_a, make_b = _make_policy(tree_a), _make_policy(tree_b)
    with open(path, "rb") as fh:
        config, calls = pickle.load(fh)
    pa, pb = make_a("vllm", config), make_b("vllm", config)
    spent_a: collections.Counter[str] = collections.Counter()
    spent_b: collections.Counter[str] = collections.Counter()
    clock = time.perf_counter
    gc.collect()
    gc.disable()
    try:
        for i, (name, args, _) in enumerate(calls):
            fa, fb = getattr(pa, name), getattr(pb, name)
            first, second = (fa, fb) if i & 1 else (fb, fa)
            t0 = clock()
            r1 = first(*args)
            t1 = clock()
            r2 = second(*args)
            t2 = clock()
            ra, rb = (r1, r2) if i & 1 else (r2, r1)
            spent_a[name] += t1 - t0 if i & 1 else t2 - t1
            spent_b[name] += t2 - t1 if i & 1 else t1 - t0
            same = (ra == rb).all() if name in ("decode_steps", "decode_profile") else (
                not isinstance(ra, bool | int) or ra == rb)
            if not same:
                raise SystemExit(f"call {i} ({name}): the trees disagree")
    finally:
        gc.enable()
    total_a, total_b = sum(spent_a.values()), sum(spent_b.values())
    print(f"A {tree_a}  B {tree_b}  ({len(calls)} calls)")
    print(f"{'total':20s} A {total_a * 1e3:8.1f} ms  B {total_b * 1e3:8.1f} ms  "
          f"B/A {total_b / total_a:.3f}")
    for name in sorted(spent_a, key=lambda k: -spent_a[k]):
        print(f"{name:20s} A {spent_a[name] * 1e3:8.1f} ms  B {spent_b[name] * 1e3:8.1f} ms  "
              f"B/A {spent_b[name] / spent_a[name]:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="record a cell's policy calls")
    rec.add_argument("--page-size", type=int, default=1)
    rec.add_argument("--chunk", type=int, default=0, help="--chunked-prefill-size (0: default)")
    rec.add_argument("--num-requests", type=int, default=300)
    rec.add_argument("--out", default="vllm_calls.pkl")
    cmp_ = sub.add_parser("ab", help="replay a recording on two trees in lockstep")
    cmp_.add_argument("tree_a")
    cmp_.add_argument("tree_b")
    cmp_.add_argument("recording")
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.page_size, args.chunk, args.num_requests, args.out)
    else:
        ab(args.tree_a, args.tree_b, args.recording)


if __name__ == "__main__":
    main()
