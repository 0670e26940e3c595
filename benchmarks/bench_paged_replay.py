"""`paged`'s calls, A/B in one process: record every call the engine makes on the `paged`
policy on the first N requests of the Azure trace, then drive the same calls on two trees'
kvcore side by side, each call timed on one tree and then the other (alternating which goes
first), so the drift of a shared machine hits both alike. Prints seconds per method and the
ratio B/A.

    python benchmarks/bench_paged_replay.py record --num-requests 4000 --out calls.pkl
    python benchmarks/bench_paged_replay.py ab TREE_A TREE_B calls.pkl

Why: on a busy 2-core machine two whole runs minutes apart differ by 10-20 %, more than a
change to the policy moves the whole process; here both trees see the same instants. Run it
twice with the trees swapped: the tree loaded second has a small edge of its own. The
recording holds the token ids by reference (about 160 MB for 4,000 requests). The replay
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

#: the engine-facing methods recorded (outermost calls only: a method calling another is
#: timed once)
METHODS = ("admit", "extend", "decode", "decode_steps", "steps_within", "cache_prefix",
           "finish", "release", "breakdown", "peek_admission", "peek_prefix",
           "page_table_entries", "available_tokens", "evictable_tokens", "free_tokens",
           "decode_cost", "decode_profile", "written")


def record(num_requests: int, out: str) -> None:
    """Run bench_e2e's workload with every `METHODS` call of the policy recorded."""
    import bench_e2e

    from kvcore.policies import PolicyConfig, make_policy

    cls = type(make_policy("paged", PolicyConfig(kv_tokens=16)))  # the class a run builds
    calls: list[tuple[str, tuple, Any]] = []
    configs: list[tuple] = []
    depth = [0]
    init = cls.__init__

    def recording_init(self, config, cache_enabled: bool = True) -> None:
        configs.append((config, cache_enabled))
        init(self, config, cache_enabled)

    def recorder(name: str, method):
        def wrapped(self, *args):
            depth[0] += 1
            try:
                result = method(self, *args)
            finally:
                depth[0] -= 1
            if depth[0] == 0:  # lists are copied: the engine reuses its own
                kept = tuple(list(a) if isinstance(a, list) else a for a in args)
                calls.append((name, kept, result if isinstance(result, bool | int) else None))
            return result
        return wrapped

    cls.__init__ = recording_init  # type: ignore[method-assign]
    for name in METHODS:
        setattr(cls, name, recorder(name, getattr(cls, name)))
    sys.argv = ["bench_e2e.py", "--num-requests", str(num_requests)]
    bench_e2e.main()
    with open(out, "wb") as fh:
        pickle.dump((configs[0], calls), fh, protocol=5)
    print(f"{len(calls)} calls -> {out}")


def _build(tree: str, path: str) -> tuple[Any, list]:
    """The recorded run's `paged` policy built from `tree`'s own set of kvcore modules (whatever
    class it builds `paged` from there, and whatever that class imports when first built),
    with the recorded calls."""
    for name in [m for m in sys.modules if m == "kvcore" or m.startswith("kvcore.")]:
        del sys.modules[name]
    sys.path.insert(0, tree)
    try:
        make_policy = importlib.import_module("kvcore.policies").make_policy
        with open(path, "rb") as fh:
            (config, cache_enabled), calls = pickle.load(fh)
        return make_policy("paged" if cache_enabled else "paged-nocache", config), calls
    finally:
        sys.path.remove(tree)


def ab(tree_a: str, tree_b: str, path: str) -> None:
    pa, _ = _build(tree_a, path)
    pb, calls = _build(tree_b, path)
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
            same = (ra == rb).all() if name == "decode_steps" else (
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
    rec = sub.add_parser("record", help="record a run's policy calls")
    rec.add_argument("--num-requests", type=int, default=4000)
    rec.add_argument("--out", default="paged_calls.pkl")
    cmp_ = sub.add_parser("ab", help="replay a recording on two trees in lockstep")
    cmp_.add_argument("tree_a")
    cmp_.add_argument("tree_b")
    cmp_.add_argument("recording")
    args = ap.parse_args()
    if args.cmd == "record":
        record(args.num_requests, args.out)
    else:
        ab(args.tree_a, args.tree_b, args.recording)


if __name__ == "__main__":
    main()
