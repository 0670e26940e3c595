"""Beam search KV memory: how much a paged cache saves when beams share blocks (vLLM Fig. 15).

Why a separate model rather than a workload for the engine: the engine runs requests whose
token sequences are fixed when they arrive, while beams are created and destroyed *during*
decoding (each step the top-k candidates survive, so some beams die and others fork). Faking
that with child requests (the depth-1 tree this replaces) shares only what the children were
given up front and saved 10-27 % where the paper reports 37.6-55.2 %. The memory question here
needs no latency, admission or preemption, only block tables, so this module models exactly
that and nothing else.

What is modelled, as vLLM (v0, the paper's version) does it:
* pages come from the project's `kvcore.sglang.allocator.PagedAllocator`; the reference count per
  page lives here (the allocator only knows free versus taken);
* the prompt is prefilled once; its last-token logits give the first k beams, which share the
  prompt's pages;
* every decode step each beam writes one token's KV. A full last page means a fresh page; a
  partial last page still shared with another beam is copied first (copy-on-write), and the
  last beam left holding it writes in place;
* after the step the survivors are chosen; a beam with no surviving child releases its pages
  (a page returns to the allocator when its last reference goes), a beam with c children is
  forked c - 1 times (its pages gain c - 1 references, nothing is copied).

Memory saved = 1 - (pages held with sharing) / (pages held if every beam had its own copy of
its whole sequence, prompt included), each summed over every decode step of every group. With
equal iteration times that is the ratio of the two time averages, and concurrency does not
change it (nothing here competes for memory), so groups run one after another.

Which beams survive is a modelling assumption: the paper does not publish its prompts or
model, and the saving depends on how often beams fork and die. `survivors="top-k"` (the
default, used for the validation rows) is beam search over a random language model: at each
step a beam's next-token logits are i.i.d. standard normal over OPT's 50,272-token vocabulary,
and the k best cumulative log-likelihoods over all beams' candidates survive. Only each beam's
k best tokens can matter, so they are drawn directly as the top order statistics of the
vocabulary (exact, O(k)); the softmax normaliser is the same for every beam up to a
negligible term and cancels in the ranking. `survivors="uniform"` (each survivor's parent
drawn uniformly among the current beams: a neutral Wright-Fisher process) is a second,
parameter-free assumption kept to show how much the answer depends on the choice. Neither was
tuned to the paper. Beams never stop early: every beam of a group runs the group's output
length. Two deterministic extremes bracket every process: `"coalesced"` (all survivors are
children of beam 0, so beams share everything but their last page) and `"independent"` (each
beam is its parent's only child, so only the prompt is shared); `sharing_bounds` gives both in
closed form, which the tests hold the page-level model to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from kvcore.contract.validation import InvariantError, cdiv
from kvcore.sglang.allocator import PagedAllocator

Survivors = Literal["top-k", "uniform", "coalesced", "independent"]
SURVIVORS: tuple[str, ...] = ("top-k", "uniform", "coalesced", "independent")
OPT_VOCAB = 50_272  # OPT's vocabulary size (the paper's Fig. 15 model is OPT-13B)


@dataclass(frozen=True)
class BeamConfig:
    """One beam-search measurement: width k, page size, survivor process, seed."""

    width: int
    page_size: int = 16
    survivors: Survivors = "top-k"
    vocab: int = OPT_VOCAB
    seed: int = 0

    def __post_init__(self) -> None:
        if self.width < 1 or self.page_size < 1 or self.vocab <= self.width:
            raise ValueError(f"BeamConfig needs width >= 1, page_size >= 1 and vocab > width, "
                             f"got {self}")
        if self.survivors not in SURVIVORS:
            raise ValueError(f"survivors must be one of {', '.join(SURVIVORS)}, "
                             f"got {self.survivors!r}")


@dataclass(frozen=True)
class BeamMemory:
    """Page-steps summed over every decode step of every group (see the module notes)."""

    held_page_steps: int  # distinct pages held, with sharing
    own_page_steps: int  # pages if every beam had its own copy
    steps: int  # decode steps measured
    groups: int  # beam-search requests

    @property
    def saved_pct(self) -> float:
        if not self.own_page_steps:
            return float("nan")
        return (1.0 - self.held_page_steps / self.own_page_steps) * 100.0


class BeamGroup:
    """One beam-search request's block tables over a shared allocator and refcount array.

    `refs[p]` is the number of beams whose table holds page p; the allocator hands out and
    takes back pages, so `refs[p] > 0` exactly when the allocator has p taken (for pages this
    group owns)."""

    def __init__(self, alloc: PagedAllocator, refs: np.ndarray, prompt_len: int) -> None:
        if prompt_len < 1:
            raise ValueError(f"prompt_len must be >= 1, got {prompt_len}")
        self.alloc = alloc
        self.refs = refs
        self.ps = alloc.page_size
        self.kv_len = prompt_len  # every beam of a group has the same length
        pages = self._take(cdiv(prompt_len, self.ps))
        self.tables: list[list[int]] = [pages]  # the prompt sequence, before the first fork
        self.held = len(pages)

    # -- pages ---------------------------------------------------------------------------------
    def _take(self, n: int) -> list[int]:
        got = self.alloc.pop_host(n)
        if got is None:
            raise InvariantError(f"beam model pool too small: {n} page(s) wanted, "
                                 f"{self.alloc.free_page_count()} free")
        pages = got.tolist()
        self.refs[got] = 1
        return pages

    def _drop(self, page: int) -> None:
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self.alloc.free_page(page)
            self.held -= 1

    # -- the three operations --------------------------------------------------------------------
    def fork(self, parents: Sequence[int]) -> None:
        """Replace the beams by survivors, survivor i a child of current beam `parents[i]`:
        beams without a child release their pages first, then each parent's table goes to its
        first child and is shared (one more reference per page) by the others."""
        n = len(self.tables)
        if not parents or any(not 0 <= p < n for p in parents):
            raise ValueError(f"parents must be indices into the {n} current beam(s), "
                             f"got {list(parents)}")
        children = np.bincount(np.asarray(parents, dtype=np.int64), minlength=n)
        for b in range(n):
            if children[b] == 0:
                for page in self.tables[b]:
                    self._drop(page)
        new: list[list[int]] = []
        given = np.zeros(n, dtype=bool)
        for p in parents:
            table = self.tables[p]
            if given[p]:
                table = list(table)
                self.refs[table] += 1
            given[p] = True
            new.append(table)
        self.tables = new

    def append(self) -> None:
        """Every beam writes one token's KV: a fresh page when the last is full, a private
        copy of a shared partial last page (copy-on-write), else in place."""
        full = self.kv_len % self.ps == 0
        for table in self.tables:
            if full:
                table.append(self._take(1)[0])
                self.held += 1
            elif self.refs[table[-1]] > 1:
                (copy,) = self._take(1)
                self.refs[table[-1]] -= 1  # still held by another beam: never freed here
                table[-1] = copy
                self.held += 1
        self.kv_len += 1

    def release(self) -> None:
        """The request finished: every beam's pages go back."""
        for table in self.tables:
            for page in table:
                self._drop(page)
        self.tables = []

    # -- measurements and checks ----------------------------------------------------------------
    def own_pages(self) -> int:
        """Pages if every beam had its own copy of its whole sequence."""
        return len(self.tables) * cdiv(self.kv_len, self.ps)

    def check_invariants(self) -> None:
        """Each page's refcount is the number of beams holding it; no page is both free and
        held; `held` counts the distinct pages; every table covers the sequence exactly."""
        counts: dict[int, int] = {}
        for table in self.tables:
            if len(set(table)) != len(table):
                raise InvariantError(f"a beam's table holds a page twice: {table}")
            if len(table) != cdiv(self.kv_len, self.ps):
                raise InvariantError(f"table of {len(table)} pages for {self.kv_len} tokens")
            for page in table:
                counts[page] = counts.get(page, 0) + 1
        held = np.flatnonzero(self.refs)
        if set(held.tolist()) != set(counts):
            raise InvariantError("pages with a reference differ from the pages in the tables")
        for page, c in counts.items():
            if self.refs[page] != c:
                raise InvariantError(f"page {page}: refcount {self.refs[page]}, held by {c}")
        if len(held) and bool(self.alloc.is_page_free(torch.from_numpy(held)).any()):
            raise InvariantError("a held page is on the allocator's free list")
        if self.held != len(counts):
            raise InvariantError(f"held counter {self.held} != {len(counts)} distinct pages")
        if self.alloc.free_page_count() != self.alloc.num_pages - len(counts):
            raise InvariantError("the allocator's free count disagrees with the held pages")


# -- survivor processes ------------------------------------------------------------------------
def top_logits(rng: np.random.Generator, shape: tuple[int, ...], k: int, vocab: int
               ) -> np.ndarray:
    """The k largest of `vocab` i.i.d. standard normal logits, in decreasing order, for each
    index of `shape`: 1 - U_(vocab-j+1) of uniforms is S_j / S_(vocab+1) (S: sums of unit
    exponentials), so the top k cost O(k), not O(vocab)."""
    s = np.cumsum(rng.exponential(size=(*shape, k)), axis=-1)
    total = s[..., -1] + rng.gamma(vocab + 1 - k, size=shape)
    u = torch.from_numpy(s / total[..., None])
    return (-torch.special.ndtri(u)).numpy()


def _group_parents(cfg: BeamConfig, rng: np.random.Generator, selections: int
                   ) -> list[list[int]]:
    """Parent indices for each selection of one group; the first is from the prompt (one
    sequence), so all of its survivors are children of beam 0."""
    k = cfg.width
    out: list[list[int]] = [[0] * k] if selections else []
    if selections <= 1:
        return out
    if cfg.survivors == "uniform":
        return out + rng.integers(0, k, size=(selections - 1, k)).tolist()
    if cfg.survivors == "coalesced":
        return out + [[0] * k for _ in range(selections - 1)]
    if cfg.survivors == "independent":
        return out + [list(range(k)) for _ in range(selections - 1)]
    logits = top_logits(rng, (selections, k), k, cfg.vocab)
    scores = logits[0, 0].copy()  # the first k beams: the prompt's k best tokens
    for s in range(1, selections):
        cand = (scores[:, None] + logits[s]).ravel()
        best = np.argsort(-cand, kind="stable")[:k]
        out.append((best // k).tolist())
        scores = cand[best]
    return out


def beam_memory(prompts: Sequence[int] | np.ndarray, outputs: Sequence[int] | np.ndarray,
                cfg: BeamConfig, check: bool = False) -> BeamMemory:
    """Run one beam-search group per (prompt, output) pair and sum the pages held with and
    without sharing over every decode step. A group of output length O samples its first
    token from the prefill, then runs O - 1 decode steps (KV for prompt + O - 1 tokens, as
    `Request.final_len`). `check=True` checks the invariants after every operation (tests)."""
    prompts = np.asarray(prompts, dtype=np.int64)
    outputs = np.asarray(outputs, dtype=np.int64)
    if prompts.shape != outputs.shape or len(prompts) == 0:
        raise ValueError("prompts and outputs must be equally long and non-empty")
    if (prompts < 1).any() or (outputs < 1).any():
        raise ValueError("prompt and output lengths must be >= 1")
    k, ps = cfg.width, cfg.page_size
    longest = int((prompts + outputs).max())
    alloc = PagedAllocator(k * cdiv(longest, ps), ps)
    refs = np.zeros(alloc.num_pages + 1, dtype=np.int64)
    rng = np.random.default_rng([cfg.seed, k, 0xBEA])
    held = own = steps = 0
    for p, o in zip(prompts.tolist(), outputs.tolist(), strict=True):
        group = BeamGroup(alloc, refs, p)
        parents = _group_parents(cfg, rng, o - 1)
        for s in range(o - 1):
            group.fork(parents[s])
            if check:
                group.check_invariants()
            group.append()
            if check:
                group.check_invariants()
            held += group.held
            own += group.own_pages()
            steps += 1
        group.release()
        if check:
            group.check_invariants()
    return BeamMemory(held, own, steps, len(prompts))


def sharing_bounds(prompts: Sequence[int] | np.ndarray, outputs: Sequence[int] | np.ndarray,
                   width: int, page_size: int = 16) -> tuple[float, float]:
    """Memory saved (%) by the two extremes, in closed form, over the same decode steps as
    `beam_memory`: (beams share only the prompt's full pages, beams share all but their last
    page). At KV length L with prompt P, k beams and page size b, every beam alone holds
    ceil(L/b) pages; prompt-only sharing holds floor(P/b) + k (ceil(L/b) - floor(P/b)); full
    coalescence holds floor((L-1)/b) + k."""
    held_lo = held_hi = own = 0
    k, b = width, page_size
    for p, o in zip(np.asarray(prompts).tolist(), np.asarray(outputs).tolist(), strict=True):
        lens = np.arange(p + 1, p + o, dtype=np.int64)  # KV length after each decode step
        pages = -(-lens // b)
        own += int(k * pages.sum())
        held_lo += int((p // b + k * (pages - p // b)).sum())
        held_hi += int(((lens - 1) // b + k).sum())
    if not own:
        return float("nan"), float("nan")
    return (1 - held_lo / own) * 100.0, (1 - held_hi / own) * 100.0


__all__ = ["SURVIVORS", "BeamConfig", "BeamGroup", "BeamMemory", "beam_memory", "sharing_bounds",
           "top_logits"]
