"""The serving benchmarks' grouped shared-prefix datasets: G groups of P prompts, each prompt a
group's system prompt followed by its own question, as the cache-aware routing results were
measured with.

Two harnesses define it, with the same five parameters (groups, prompts per group, system
prompt length, question length, output length) and different request orders:

* **llm-d's `shared_prefix`** (the data generator of inference-perf, which llm-d-benchmark
  drives; kubernetes-sigs/inference-perf at commit aa3fd7f, 2025-09-17,
  inference_perf/datagen/shared_prefix_datagen.py, unchanged in tag v0.2.0). It builds the
  G x P prompts once (for each group a system prompt of random tokens, then each of its P
  questions of random tokens), shuffles the list, and request n of a load stage sends prompt
  n mod (G x P): the list is replayed over and over, so a prompt's question is cached from
  its previous send (the 73-capacity report counts it resident: "cached per user"), and
  the index restarts at 0 in every stage (loadgen/load_generator.py `run_stage` numbers a
  stage's requests from 0; the worker calls `get_request(n)`). `max_tokens` is the output
  length; the llm-d reports set `ignore_eos: true`.
* **SGLang's `generated-shared-prefix`** (bench_serving in SGLang v0.4.0, the release of the
  v0.4 blog, python/sglang/bench_serving.py `sample_generated_shared_prefix_requests`; its
  flags were `--gen-*` then, `--gsp-*` since, same defaults and, at their defaults, the same
  rule in sglang 0.5.23, python/sglang/benchmark/datasets/generated_shared_prefix.py). It
  builds the same G x P prompts, shuffles them, and sends each exactly once (the dataset is
  G x P requests whatever --num-prompts says); `ignore_eos` is on unless
  `--disable-ignore-eos`.

What kvsim keeps: the token structure (a group's system prompt is one run of ids shared by its
P prompts, every question its own run, a resent prompt the same ids), the lengths, the order
rule and the output length. What it leaves out: both harnesses decode random token ids to
text, join system prompt and question with a separator (" " in inference-perf, a blank line in
SGLang) and let the server tokenize the text again, so a served prompt is a few per cent longer
than the nominal S + Q and the seam token differs; kvsim's prompts are exactly S + Q tokens
(as SGLang's later `--tokenize-prompt` mode sends). The harnesses' shuffles are unseeded
(inference-perf) or seeded by `--seed` through Python's `random` (SGLang); kvsim draws one
permutation from its own seed, so the order is as random, not the same one.

Without ignore-eos an answer ends at the model's end-of-sequence token, which no harness
controls: kvsim then draws each request's true output length from the workload's output length
model (`--lengths`, ShareGPT's answers by default), capped at the output length, which stays
what the scheduler sees as `max_new_tokens` (its reservation and its new-token estimate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workloads.errors import WorkloadError
from workloads.generators import OutputLimits
from workloads.lengths import LengthDist
from workloads.request import (
    QUESTION_TAG,
    SHARED_TAG,
    PromptSpec,
    Request,
    Workload,
    namespace_of,
)

ORDERS = ("cycle-per-stage", "once")  # inference-perf's replay rule, SGLang's one pass


@dataclass(frozen=True)
class PromptGroups:
    """The dataset's shape: `num_groups` x `prompts_per_group` prompts of `system_prompt_len`
    + `question_len` tokens, each answered with `output_len` tokens (the harness's
    max_tokens; with `ignore_eos` also the true length)."""

    num_groups: int
    prompts_per_group: int
    system_prompt_len: int
    question_len: int
    output_len: int
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        for name in ("num_groups", "prompts_per_group", "question_len", "output_len"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise WorkloadError(f"{name} must be an integer >= 1, got {v!r}")
        if not isinstance(self.system_prompt_len, (int, np.integer)) or self.system_prompt_len < 0:
            raise WorkloadError(f"system_prompt_len must be an integer >= 0, got "
                                f"{self.system_prompt_len!r}")

    @property
    def num_prompts(self) -> int:
        return self.num_groups * self.prompts_per_group

    @property
    def prompt_len(self) -> int:
        return self.system_prompt_len + self.question_len

    @property
    def resident_tokens(self) -> int:
        """Distinct prompt tokens of the whole set: G x (S + P x Q), the llm-d reports'
        'resident' working set (73-capacity: 150 x (6,000 + 5 x 1,200) = 1,800,000)."""
        return self.num_groups * (self.system_prompt_len + self.prompts_per_group
                                  * self.question_len)

    def prompt(self, seed: int, k: int) -> PromptSpec:
        """Prompt k (group k // P): the group's system prompt, then the prompt's question."""
        g = k // self.prompts_per_group
        segs: tuple = ()
        if self.system_prompt_len:
            segs = (("unique", namespace_of(seed, g, SHARED_TAG), self.system_prompt_len, 0),)
        segs += (("unique", namespace_of(seed, k, QUESTION_TAG), self.question_len, 0),)
        return PromptSpec(segs)


def shuffled_prompts(groups: PromptGroups, seed: int) -> np.ndarray:
    """The harness's list after its shuffle: position -> prompt index (group-major before)."""
    return np.random.default_rng([seed, 0x6A]).permutation(groups.num_prompts)


def prompt_slots(order: str, groups: PromptGroups, seed: int,
                 stage_local: np.ndarray) -> np.ndarray:
    """Prompt index of each request. `cycle-per-stage` (inference-perf): request n of a stage
    (`stage_local`, its index within its stage) sends list[n mod G x P]. `once` (SGLang): the
    list in order, each prompt once."""
    perm = shuffled_prompts(groups, seed)
    n = len(stage_local)
    if order == "cycle-per-stage":
        return perm[np.asarray(stage_local, dtype=np.int64) % groups.num_prompts]
    if order == "once":
        if n > groups.num_prompts:
            raise WorkloadError(
                f"{n:,} requests asked, but generated-shared-prefix sends each of its "
                f"{groups.num_groups} x {groups.prompts_per_group} = {groups.num_prompts:,} "
                "prompts once (raise --gsp-num-groups or --gsp-prompts-per-group)")
        return perm[:n]
    raise WorkloadError(f"unknown prompt order {order!r} (choose from {', '.join(ORDERS)})")


def grouped_requests(
    arrivals: np.ndarray,
    groups: PromptGroups,
    order: str,
    seed: int = 0,
    stage_local: np.ndarray | None = None,
    eos_lengths: LengthDist | None = None,
    limits: OutputLimits = OutputLimits(),
    name: str = "shared-prefix",
) -> Workload:
    """One request per arrival (sorted times), request id = arrival index, prompt by `order`
    (`stage_local`: each request's index within its load stage; default one stage). With
    `ignore_eos` off, true output lengths come from `eos_lengths`, capped at the output
    length (the max_tokens the scheduler sees)."""
    t = np.asarray(arrivals, dtype=np.float64)
    local = np.arange(len(t)) if stage_local is None else np.asarray(stage_local)
    if len(local) != len(t):
        raise WorkloadError("stage_local must give one index per arrival")
    slots = prompt_slots(order, groups, seed, local)
    if groups.ignore_eos:
        outs = np.full(len(t), groups.output_len, dtype=np.int64)
    else:
        if eos_lengths is None:
            raise WorkloadError("without ignore-eos the true output lengths need a length model")
        draws = eos_lengths.sample(np.random.default_rng([seed, 0xE0]), len(t))
        outs = np.clip(draws, 1, groups.output_len).astype(np.int64)
    prompts: dict[int, PromptSpec] = {}
    reqs = []
    for rid, (at, k, o) in enumerate(zip(t.tolist(), slots.tolist(), outs.tolist(),
                                         strict=True)):
        prompt = prompts.get(k)
        if prompt is None:
            prompt = prompts[k] = groups.prompt(seed, k)
        # the harness sends max_tokens = the output length (a --max-new-tokens caps it)
        mnt = groups.output_len if limits.max_new_tokens is None else min(
            groups.output_len, limits.max_new_tokens)
        o2 = min(o, mnt)
        reqs.append(Request(rid, at, prompt, o2, mnt, seed=seed,
                            meta={"group": k // groups.prompts_per_group, "prompt": k}))
    return Workload(name, reqs, seed=seed)


__all__ = ["ORDERS", "PromptGroups", "grouped_requests", "prompt_slots", "shuffled_prompts"]
