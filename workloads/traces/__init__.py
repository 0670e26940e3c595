"""Trace loaders: real request streams from files, in the canonical `Workload` form."""

from workloads.traces.formats import PARSERS, TRACE_FORMATS, azure_timestamp_ns, detect_format
from workloads.traces.load import (
    DEFAULT_MAX_CONTEXT_LEN,
    load_trace,
    load_trace_bytes,
    resolve_max_new_tokens,
)

__all__ = [
    "DEFAULT_MAX_CONTEXT_LEN",
    "PARSERS",
    "TRACE_FORMATS",
    "azure_timestamp_ns",
    "detect_format",
    "load_trace",
    "load_trace_bytes",
    "resolve_max_new_tokens",
]
