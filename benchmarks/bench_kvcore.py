"""Speed of the kvcore hot paths, on one CPU thread; prints one table.

    python benchmarks/bench_kvcore.py [--requests 3000] [--repeat 3]

Rows:
* alloc_decode: one decode step for a batch of 256 requests (us per step). Requests finish
  after 100-2000 tokens and are replaced by fresh ones, so the pool reaches a steady state.
  `us/call` times alloc_decode alone; `us/step incl. frees` adds the frees of finished requests.
* alloc_extend: one call for 16 prompts of 100-2000 tokens (us per call).
* free (16 seqs): freeing those 16 sequences' slots in one call (us per call).
* radix match+insert: match_prefix(prompt) then insert(prompt, slots) for each of the first
  N requests of the Mooncake conversation trace (token id = hash_id * 512 + offset, last block
  partial); requests/s (best of --repeat runs, each on a fresh tree after a gc.collect()) and
  hit rate = matched tokens / prompt tokens. Unbounded memory: the slots are a dummy arange
  (the tree is measured, not the allocator).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from kvcore.sglang.radix_cache import RadixCache

# SGLang's tensor-shaped allocator calls (alloc_extend / alloc_decode / free by slots) live
# beside the tests that alone call them (tests/kvcore/sglang_api.py); the allocator rows time
# them there, over the same host forms production calls
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.kvcore.sglang_api import SGLangPagedAllocator

ROOT = Path(__file__).resolve().parents[1]
TRACE_CANDIDATES = [
    ROOT / "workloads" / "data" / "mooncake_conversation_trace.jsonl",
    ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl",
]
BLOCK = 512


def load_prompts(n: int) -> list[np.ndarray]:
    path = next((p for p in TRACE_CANDIDATES if p.exists()), None)
    if path is None:
        raise SystemExit("Mooncake conversation trace not found in " + ", ".join(
            str(p) for p in TRACE_CANDIDATES))
    prompts = []
    with path.open() as f:
        for line in f:
            if len(prompts) >= n:
                break
            rec = json.loads(line)
            length, ids = int(rec["input_length"]), rec["hash_ids"]
            toks = (np.asarray(ids, dtype=np.int64)[:, None] * BLOCK
                    + np.arange(BLOCK, dtype=np.int64)[None, :]).reshape(-1)
            prompts.append(np.ascontiguousarray(toks[:length]))
    return prompts


def bench_radix(prompts: list[np.ndarray], page_size: int) -> tuple[float, float]:
    """match_prefix + insert per request, as an engine does it: the matched slots and freshly
    allocated ones go into the request's page-table row (a reused buffer, as engines reuse
    rows), and the row is inserted."""
    tree = RadixCache(page_size)
    total = sum(len(k) for k in prompts)
    slots = torch.arange(total, dtype=torch.int64)  # the allocator's slots, handed out in order
    row = torch.empty(max(len(k) for k in prompts), dtype=torch.int64)
    matched = 0
    next_slot = 0
    t0 = time.perf_counter()
    for key in prompts:
        m = tree.match_prefix(key)
        hit = len(m.indices)
        n = len(key)
        row[:hit] = m.indices
        row[hit:n] = slots[next_slot : next_slot + n - hit]
        next_slot += n - hit
        tree.insert(key, row[:n])
        matched += hit
    dt = time.perf_counter() - t0
    return len(prompts) / dt, matched / total


def _lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(100, 2001, size=n)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bench_decode(page_size: int, batch: int = 256, steps: int = 2000,
                 device: str = "cpu") -> tuple[float, float]:
    """Returns (us per alloc_decode call, us per step including frees)."""
    rng = np.random.default_rng(0)
    pages = batch * (2000 // page_size + 2) + 16
    alloc = SGLangPagedAllocator(pages, page_size, device)
    target = _lengths(rng, batch)
    lens = np.zeros(batch, dtype=np.int64)
    slots: list[list[torch.Tensor]] = [[] for _ in range(batch)]
    last = torch.full((batch,), -1, dtype=torch.int64, device=device)
    t_alloc = t_free = 0.0
    warm = steps // 4
    for step in range(steps + warm):
        lens += 1
        seq = torch.from_numpy(lens).to(device)
        _sync(device)
        t0 = time.perf_counter()
        out = alloc.alloc_decode(seq, last)
        _sync(device)
        t1 = time.perf_counter()
        assert out is not None
        last = out
        # bookkeeping (not timed): remember slots, finish requests at their target length
        for i in range(batch):
            slots[i].append(out[i : i + 1])
        done = np.nonzero(lens >= target)[0]
        t2 = time.perf_counter()
        if len(done):
            alloc.free(torch.cat([torch.cat(slots[i]) for i in done]))
        _sync(device)
        t3 = time.perf_counter()
        for i in done:
            slots[i] = []
            lens[i] = 0
            target[i] = rng.integers(100, 2001)
            last[i] = -1
        if step >= warm:
            t_alloc += t1 - t0
            t_free += t3 - t2
    return t_alloc / steps * 1e6, (t_alloc + t_free) / steps * 1e6


def bench_extend(page_size: int, reps: int = 200, device: str = "cpu") -> tuple[float, float]:
    """Returns (us per alloc_extend of 16 prompts, us per free of those 16 sequences)."""
    rng = np.random.default_rng(1)
    pages = 16 * (2000 // page_size + 2) + 16
    alloc = SGLangPagedAllocator(pages, page_size, device)
    t_ext = t_free = 0.0
    for r in range(reps + 10):
        seq = torch.from_numpy(_lengths(rng, 16))
        pre = torch.zeros(16, dtype=torch.int64)
        last = torch.full((16,), -1, dtype=torch.int64)
        t0 = time.perf_counter()
        out = alloc.alloc_extend(pre, seq, last)
        _sync(device)
        t1 = time.perf_counter()
        assert out is not None
        alloc.free(out)
        _sync(device)
        t2 = time.perf_counter()
        if r >= 10:
            t_ext += t1 - t0
            t_free += t2 - t1
    return t_ext / reps * 1e6, t_free / reps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--repeat", type=int, default=5, help="best of N for the radix rows")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (allocator rows)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    rows: list[tuple[str, int, str, str]] = []
    for ps in (1, 16, 64):
        us, us_step = bench_decode(ps, device=args.device)
        rows.append(("alloc_decode (256 reqs)", ps, f"{us:8.1f} us/call",
                     f"{us_step:8.1f} us/step incl. frees"))
    for ps in (1, 16, 64):
        us_ext, us_free = bench_extend(ps, device=args.device)
        rows.append(("alloc_extend (16 prompts)", ps, f"{us_ext:8.1f} us/call", ""))
        rows.append(("free (16 seqs)", ps, f"{us_free:8.1f} us/call", ""))
    prompts = load_prompts(args.requests)
    for ps in (1, 16, 64, 512):
        best, hit = 0.0, 0.0
        for _ in range(args.repeat):
            gc.collect()  # free the previous tree first, so its teardown is not timed
            rps, hit = bench_radix(prompts, ps)
            best = max(best, rps)
        rows.append((f"radix match+insert ({len(prompts)} reqs)", ps, f"{best:8.0f} req/s",
                     f"hit rate {hit:.4f}"))

    w0 = max(len(r[0]) for r in rows)
    print(f"{'operation':<{w0}}  {'page':>4}  {'speed':>16}  note")
    print(f"{'-' * w0}  {'-' * 4}  {'-' * 16}  {'-' * 28}")
    for name, ps, speed, note in rows:
        print(f"{name:<{w0}}  {ps:>4}  {speed:>16}  {note}")


if __name__ == "__main__":
    main()
