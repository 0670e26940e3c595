"""Attention backends: what a KV page costs each kernel, and which page sizes it can run.

The page size is a memory choice (rounding, the prefix cache's granularity) and a kernel
choice (how many page-table entries attention walks). How much the second matters depends on
the kernel, so the roofline's page terms are a backend's constants, and a page size the
backend cannot run is refused before a simulation starts.

A backend's page cost has two parts, measured separately by the sources below:

* decode: seconds per KV page touched, per KV head on a rank, per layer
  (`decode_page_head_s`);
* prefill: a multiplier on attention time over the dense kernel (`prefill_attention_factor`),
  or, for the 2023 kernel only, the same per-page cost as decode (`prefill_pages`), as that
  kernel was calibrated.

Which page sizes run depends on the engine as well as the kernel: vLLM checks the block size
against its backend class, SGLang's FlashInfer and Triton backends expand pages to token
indices and so run page 1 inside the kernel whatever `--page-size` says (`page_one_engines`):
there the page size is a memory-only choice.
"""

from __future__ import annotations

from dataclasses import dataclass

ENGINES = ("vllm", "sglang")  # the engines whose page-size rules are modelled


@dataclass(frozen=True)
class PageRule:
    """The page sizes one engine's backend accepts: a multiple of `multiple_of`, or one of
    `sizes` when given."""

    multiple_of: int = 1
    sizes: tuple[int, ...] = ()
    source: str = ""

    def allows(self, page_size: int) -> bool:
        if self.sizes:
            return page_size in self.sizes
        return page_size % self.multiple_of == 0

    def describe(self) -> str:
        if self.sizes:
            return ", ".join(str(s) for s in self.sizes)
        return "any" if self.multiple_of == 1 else f"multiples of {self.multiple_of}"


ANY = PageRule()


@dataclass(frozen=True)
class AttentionBackend:
    """One attention kernel's page cost and page-size rules."""

    name: str
    decode_page_head_s: float  # per KV page touched, per KV head on a rank, per layer
    prefill_attention_factor: float = 1.0  # paged prefill attention time / dense kernel's
    prefill_pages: bool = False  # prefill pays decode_page_head_s per page (the 2023 kernel)
    rules: tuple[tuple[str, PageRule], ...] = ()  # engine -> rule (absent: any page size)
    page_one_engines: tuple[str, ...] = ()  # engines that run page 1 inside this kernel
    source: str = ""

    def rule(self, engine: str) -> PageRule:
        return dict(self.rules).get(engine, ANY)

    def kernel_page_size(self, engine: str, page_size: int) -> int:
        """The page size the kernel walks: 1 where the engine expands pages to tokens."""
        return 1 if engine in self.page_one_engines else page_size

    def check_page_size(self, engine: str, page_size: int, where: str = "--page-size") -> None:
        """ValueError naming the allowed sizes when this engine's backend cannot run it."""
        rule = self.rule(engine)
        if not rule.allows(page_size):
            raise ValueError(f"{where} {page_size}: {engine}'s {self.name} attention backend "
                             f"runs {rule.describe()} ({rule.source})")


_VLLM16 = PageRule(16, source="vllm/v1/attention/backends/flash_attn.py and triton_attn.py: "
                   "get_supported_kernel_block_sizes -> MultipleOf(16)")

# FA3 decode page cost: SGLang PR #4832 (FA3, Llama-3-8B, batch 16, 1024 in / 512 out)
# measured a median decode step of 8.96 ms at page 1 and 7.71 ms at page 64; with ~1,280
# tokens per request mid-run that is 20,160 more pages x 8 KV heads x 32 layers for 1.25 ms,
# at most 0.24 ns per page, head and layer. PR #4855 then sped page 1 up, so the true cost lies
# between 0 and that bound: we take the midpoint, 0.12 ns (docs/latency.md).
FA3_DECODE_PAGE_HEAD_S = 0.12e-9
# FlashInfer v0.2 blog (2024-12): causal prefill at page 1 reaches about 90 % of dense
# attention's throughput on an H100: 1 / 0.9 = 1.11 on attention time.
FLASHINFER_PREFILL_FACTOR = 1.11

BACKENDS: dict[str, AttentionBackend] = {b.name: b for b in (
    AttentionBackend(
        "fa3", FA3_DECODE_PAGE_HEAD_S, 1.0,
        rules=(("vllm", _VLLM16),),
        source="FlashAttention-3 (hopper/flash_api.cpp: any page size, TMA when the page is a "
               "multiple of its tile); decode page cost bounded by SGLang PR #4832; prefill "
               "within 2 % across pages 1/64/128 in the same PR"),
    AttentionBackend(
        "fa2", FA3_DECODE_PAGE_HEAD_S, 1.0,
        rules=(("vllm", _VLLM16),
               ("sglang", PageRule(256, source="upstream flash-attention "
                                   "csrc/flash_attn/flash_api.cpp: paged KV block size must "
                                   "be divisible by 256"))),
        source="FlashAttention-2; vLLM runs its own fork (multiples of 16), upstream needs 256; "
               "page cost taken as FA3's (no separate measurement)"),
    AttentionBackend(
        "flashinfer", 0.0, FLASHINFER_PREFILL_FACTOR,
        rules=(("vllm", PageRule(sizes=(16, 32, 64), source="vllm/v1/attention/backends/"
                                 "flashinfer.py: get_supported_kernel_block_sizes")),),
        page_one_engines=("sglang",),
        source="FlashInfer launch blog (2024-01): decode bandwidth equal at pages 1, 4, 8, 16 "
               "and to the page-table-free kernel; v0.2 blog (2024-12): prefill at page 1 about "
               "90 % of dense; SGLang docs advanced_features/attention_backend.md: page 1 inside "
               "the kernel"),
    AttentionBackend(
        "triton", 2 * FA3_DECODE_PAGE_HEAD_S, FLASHINFER_PREFILL_FACTOR,
        rules=(("vllm", _VLLM16),),
        page_one_engines=("sglang",),
        source="no published page-size measurement: decode at FA3's upper bound (0.24 ns), "
               "prefill at FlashInfer's factor; SGLang docs advanced_features/"
               "attention_backend.md: page 1 inside the kernel"),
    AttentionBackend(
        "paged-attention-v1-2023", 1.5e-9, 1.0, prefill_pages=True,
        source="vLLM paper (SOSP 2023) kernel: 1.5 ns per page, head and layer in prefill and "
               "decode, calibrated on Fig. 13 and Fig. 18b (docs/latency.md)"),
)}


def get_backend(name: str) -> AttentionBackend:
    key = name.strip().lower()
    if key not in BACKENDS:
        raise ValueError(f"unknown --attention-backend {name!r}; known: {', '.join(BACKENDS)}")
    return BACKENDS[key]


__all__ = ["BACKENDS", "ENGINES", "AttentionBackend", "PageRule", "get_backend"]
