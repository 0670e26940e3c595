"""Latency profiles: named sets of the roofline's constants, one per engine generation.

The roofline (simulator/latency.py) is only as right as its efficiencies and fixed costs, and
those moved a lot between the vLLM paper's 2023 setup (A100, the original PagedAttention
kernel) and today's engines on Hopper (FlashAttention-3, CUDA graphs, overlapped scheduling).
A profile names one calibration so that every result can say which one it used:

* `vllm-paper-2023`: the constants the vLLM paper's figures were reproduced with (Fig. 13
  batch sizes, Fig. 18b block sizes); the validation suite's paper rows use it.
* `vllm-hopper`: vLLM >= 0.24 with its default backend on Hopper (FLASH_ATTN running FA3),
  fitted to vLLM v0.19.1's published batch-1 inter-token latency line.
* `sglang-hopper`: SGLang >= 0.5 with its default backend on Hopper (fa3), fitted to SGLang
  PR #4832's figures.

docs/latency.md derives every constant. A run's profile comes from its budget rule (the vLLM
rule -> `vllm-hopper`, every other rule -> `sglang-hopper`) unless `--latency-profile` names one
or a profile file (`kvsim calibrate` writes them). A bare `SimConfig` (tests, benchmarks, the
validation suite) knows no budget rule and keeps `vllm-paper-2023`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import tomllib

from simulator.attention_backends import ENGINES, get_backend

# the roofline constants a profile sets (simulator/latency.py RooflineLatency fields)
PROFILE_CONSTANTS = ("mfu", "mbu", "request_overhead_s", "iteration_overhead_s")


@dataclass(frozen=True)
class LatencyProfile:
    """One calibration: the engine it imitates, its default attention backend and the
    roofline's constants; `page_head_overhead_s` / `prefill_attention_factor` override the
    backend's page cost when a calibration fitted them (None: the backend's)."""

    name: str
    engine: str
    attention_backend: str
    mfu: float
    mbu: float
    request_overhead_s: float
    iteration_overhead_s: float
    page_head_overhead_s: float | None = None
    prefill_attention_factor: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        where = f"latency profile {self.name!r}"
        if self.engine not in ENGINES:
            raise ValueError(f"{where}: engine must be one of {', '.join(ENGINES)}, got "
                             f"{self.engine!r}")
        get_backend(self.attention_backend)
        for k in ("mfu", "mbu"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and 0 < v <= 1):
                raise ValueError(f"{where}: {k} must be in (0, 1], got {v!r}")
        for k in ("request_overhead_s", "iteration_overhead_s", "page_head_overhead_s",
                  "prefill_attention_factor"):
            v = getattr(self, k)
            if v is not None and not (isinstance(v, int | float) and math.isfinite(v)
                                      and v >= 0):
                raise ValueError(f"{where}: {k} must be a number >= 0, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


# -- the published figures the modern profiles are fitted to (docs/latency.md) ---------------
# vLLM blog "fp8 KV cache" (2026-04-22): Llama-3.1-8B bf16, one H100, vLLM v0.19.1 (FA3,
# block 16), batch 1: ITL = 6.44 ms + 4.37e-5 ms x input length, inputs 256 to 125k
VLLM_ITL_INTERCEPT_S = 6.44e-3
VLLM_ITL_SLOPE_S = 4.37e-8
# SGLang PR #4832 (FA3, Llama-3-8B-Instruct, bench_one_batch, batch 16, 1024 in / 512 out):
# prefill s and median decode step s at pages 1 / 64 / 128 (the GPU is not stated)
SGLANG_PR4832 = {1: (0.377, 8.96e-3), 64: (0.370, 7.71e-3), 128: (0.375, 7.77e-3)}

PROFILES: dict[str, LatencyProfile] = {p.name: p for p in (
    LatencyProfile(
        "vllm-paper-2023", "vllm", "paged-attention-v1-2023", mfu=0.5, mbu=0.6,
        request_overhead_s=20e-6, iteration_overhead_s=5e-3,
        source="vLLM paper (SOSP 2023) Fig. 13 (OPT-13B, A100-40GB: ~45 ms per iteration) and "
               "Fig. 18b; docs/latency.md 'Calibration'"),
    LatencyProfile(
        # mbu: the ITL slope less FA3's page cost at block 16 (0.12 ns x 8 heads x 32 layers /
        # 16 = 1.92 ns per token) is 41.78 ns per KV token of 128 KiB -> 3.137 TB/s of 3.35;
        # iteration: the intercept less 16.06 GB of weights at that bandwidth (5.12 ms) and one
        # request's 20 us; mfu: as sglang-hopper (the only published prefill figure)
        "vllm-hopper", "vllm", "fa3", mfu=0.734, mbu=0.936,
        request_overhead_s=20e-6, iteration_overhead_s=1.30e-3,
        source="vLLM blog 'fp8 KV cache' (2026-04-22), vLLM v0.19.1 on H100: ITL 6.44 ms + "
               "4.37e-5 ms x input length; mfu from SGLang PR #4832's prefill"),
    LatencyProfile(
        # mbu: vllm-hopper's (same FA3 kernel, same GPU class); iteration: PR #4832's page-64
        # decode step (7.71 ms) less 18.74 GB read at that bandwidth (5.98 ms), 16 requests'
        # 20 us and 320 pages' cost; mfu: its page-64 prefill (0.370 s) as 2.675e14 FLOPs
        # after 1.72 ms of fixed costs, over the H100's 989 TFLOPS
        "sglang-hopper", "sglang", "fa3", mfu=0.734, mbu=0.936,
        request_overhead_s=20e-6, iteration_overhead_s=1.40e-3,
        source="SGLang PR #4832 (FA3, Llama-3-8B, batch 16, 1024/512) decode and prefill at "
               "page 64; HBM efficiency from vLLM v0.19.1's ITL line"),
)}

DEFAULT_BY_RULE = {"vllm": "vllm-hopper"}  # any other budget rule or a direct pool size:
FALLBACK_PROFILE = "sglang-hopper"  # the default budget rule's engine
SIMULATOR_DEFAULT = "vllm-paper-2023"  # a bare SimConfig, which knows no budget rule


def profile_for_rule(rule: str | None) -> str:
    """The profile a run gets from its budget rule (None: the simulator's own default)."""
    if rule is None:
        return SIMULATOR_DEFAULT
    return DEFAULT_BY_RULE.get(rule, FALLBACK_PROFILE)


def is_profile_file(name: str) -> bool:
    return name.endswith((".toml", ".json")) or "/" in name or "\\" in name


def load_profile(name: str) -> LatencyProfile:
    """A profile by name, or from a TOML / JSON file (`kvsim calibrate` writes them); errors
    name the file and the field."""
    if name in PROFILES:
        return PROFILES[name]
    if not is_profile_file(name):
        raise ValueError(f"unknown --latency-profile {name!r}; known: {', '.join(PROFILES)} "
                         "(or a .toml / .json profile file)")
    path = Path(name)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"--latency-profile {name}: cannot read ({e.strerror})") from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--latency-profile {name}: not valid {path.suffix[1:]} ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"--latency-profile {name}: expected a table of constants")
    known = {f.name for f in fields(LatencyProfile)}
    bad = sorted(set(data) - known)
    if bad:
        raise ValueError(f"--latency-profile {name}: unknown field(s) {', '.join(bad)}; known: "
                         f"{', '.join(sorted(known))}")
    missing = [f.name for f in fields(LatencyProfile)
               if f.name not in data and f.name not in
               ("name", "page_head_overhead_s", "prefill_attention_factor", "source")]
    if missing:
        raise ValueError(f"--latency-profile {name}: missing field(s) {', '.join(missing)}")
    data.setdefault("name", path.stem)
    try:
        return LatencyProfile(**data)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--latency-profile {name}: {e}") from None


def roofline_constants(profile: LatencyProfile, backend_name: str | None,
                       page_size: int) -> dict[str, Any]:
    """The roofline's keyword constants for `profile` with `backend_name` (None: the
    profile's), after checking that the engine's backend runs `page_size`."""
    backend = get_backend(backend_name or profile.attention_backend)
    backend.check_page_size(profile.engine, page_size)
    page = (profile.page_head_overhead_s if profile.page_head_overhead_s is not None
            else backend.decode_page_head_s)
    factor = (profile.prefill_attention_factor if profile.prefill_attention_factor is not None
              else backend.prefill_attention_factor)
    return {**{k: getattr(profile, k) for k in PROFILE_CONSTANTS},
            "page_head_overhead_s": page, "prefill_attention_factor": factor,
            "prefill_pages": backend.prefill_pages,
            "kernel_page_one": profile.engine in backend.page_one_engines}


__all__ = ["FALLBACK_PROFILE", "PROFILES", "PROFILE_CONSTANTS", "SGLANG_PR4832",
           "SIMULATOR_DEFAULT", "VLLM_ITL_INTERCEPT_S", "VLLM_ITL_SLOPE_S", "LatencyProfile",
           "is_profile_file", "load_profile", "profile_for_rule", "roofline_constants"]
