"""The commands users run, with their defaults, timed as whole processes: the README's main
command (`kvsim run`), its quick start's first line, and the default run on the whole bundled
Azure conversation trace (`paged`, page 16, the `sglang` budget and the `sglang-hopper`
latency profile: the options a user does not give), and two SGLang hybrid runs of the same
trace's first 1,000 requests under `paged`: `swa` (gpt-oss-20b, sliding-window layers beside
full attention, page 16) and `mamba` (qwen3.5-4b, gated-delta-net state beside full
attention, page 1, the only page SGLang's Mamba radix cache runs), named with `--commands`.

With `--base DIR` (another checkout, e.g. `git worktree add ../base 2436db8`) each command runs
in pairs, base then this tree, the order swapped every other pair so both sides see the same
machine load; each pair's ratio (this / base) and the median of the pairs are printed, for
wall seconds and for CPU seconds (user + system of the process), the steadier figure on a
shared machine.

    python benchmarks/bench_commands.py [--commands main,quick,azure] [--pairs 5]
                                        [--base DIR]
    python benchmarks/bench_commands.py --commands azure-vllm,hybrid-vllm --base DIR
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: name -> the `kvsim` arguments ({out}: a fresh temporary directory)
COMMANDS: dict[str, list[str]] = {
    "main": ["run"],
    "quick": ["run", "--workload", "azure-conv", "--num-requests", "500", "--out", "{out}"],
    "azure": ["run", "--workload", "azure-conv"],
    "swa": ["run", "--model", "gpt-oss-20b", "--policy", "paged", "--workload", "azure-conv",
            "--num-requests", "1000", "--out", "{out}"],
    "mamba": ["run", "--model", "qwen3.5-4b", "--policy", "paged", "--page-size", "1",
              "--workload", "azure-conv", "--num-requests", "1000", "--out", "{out}"],
    # the vLLM family: the default run under `vllm`, and a hybrid model (sliding window and
    # full attention groups over one block pool) on a trace with shared prefixes
    "azure-vllm": ["run", "--workload", "azure-conv", "--policy", "vllm"],
    "hybrid-vllm": ["run", "--model", "gpt-oss-20b", "--policy", "vllm", "--workload",
                    "mooncake-conv", "--num-requests", "400", "--kv-mem-gib", "8"],
    # gated delta net state groups beside full attention (Mamba cache mode "align")
    "state-vllm": ["run", "--model", "qwen3.5-4b", "--policy", "vllm", "--workload",
                   "mooncake-conv", "--num-requests", "400", "--kv-mem-gib", "8"],
}


def run_once(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `python cli.py ARGS` run in `tree` as its own process."""
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-") as tmp:
        argv = [a.replace("{out}", str(Path(tmp) / "out")) for a in args]
        env = {**os.environ, "PYTHONPATH": str(tree)}
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "cli.py", *argv], cwd=tree, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read().decode() if proc.stderr else ""
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            raise SystemExit(f"{tree}: kvsim {' '.join(argv)} exited {proc.returncode}:\n{err}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commands", default="main,quick,azure",
                    help=f"comma-separated, of {', '.join(COMMANDS)} (default: the README's)")
    ap.add_argument("--pairs", type=int, default=3, help="runs (pairs with --base) each")
    ap.add_argument("--base", type=Path, default=None, help="a checkout to compare against")
    args = ap.parse_args()
    names = [n for n in args.commands.split(",") if n]
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        raise SystemExit(f"--commands: unknown {', '.join(unknown)} "
                         f"(known: {', '.join(COMMANDS)})")
    if args.base is not None and not (args.base / "cli.py").is_file():
        raise SystemExit(f"--base {args.base}: no cli.py there")
    for name in names:
        cmd = "kvsim " + " ".join(COMMANDS[name]).replace("{out}", "TMP")
        print(f"\n{cmd}")
        if args.base is None:
            runs = [run_once(ROOT, COMMANDS[name]) for _ in range(args.pairs)]
            for i, (w, c) in enumerate(runs, 1):
                print(f"  run {i}: wall {w:.2f} s, cpu {c:.2f} s", flush=True)
            print(f"  median: wall {statistics.median(w for w, _ in runs):.2f} s, "
                  f"cpu {statistics.median(c for _, c in runs):.2f} s")
            continue
        ratios_w, ratios_c, base_runs, this_runs = [], [], [], []
        for i in range(args.pairs):
            order = ((args.base, ROOT) if i % 2 == 0 else (ROOT, args.base))
            got = {tree: run_once(tree, COMMANDS[name]) for tree in order}
            (bw, bc), (tw, tc) = got[args.base], got[ROOT]
            base_runs.append((bw, bc))
            this_runs.append((tw, tc))
            ratios_w.append(tw / bw)
            ratios_c.append(tc / bc)
            print(f"  pair {i + 1}: base wall {bw:.2f} cpu {bc:.2f} | this wall {tw:.2f} "
                  f"cpu {tc:.2f} | ratio wall {tw / bw:.3f} cpu {tc / bc:.3f}", flush=True)
        print(f"  medians: base wall {statistics.median(w for w, _ in base_runs):.2f} cpu "
              f"{statistics.median(c for _, c in base_runs):.2f} | this wall "
              f"{statistics.median(w for w, _ in this_runs):.2f} cpu "
              f"{statistics.median(c for _, c in this_runs):.2f} | ratio of pairs wall "
              f"{statistics.median(ratios_w):.3f} cpu {statistics.median(ratios_c):.3f}")


if __name__ == "__main__":
    main()
