"""Request streams: synthetic generators and real trace loaders, in one canonical form."""

from workloads.errors import WorkloadError
from workloads.registry import DEFAULT_WORKLOAD, build_workload, list_workloads
from workloads.request import PromptSpec, Request, Session, Turn, Workload
from workloads.reuse import ideal_reuse, ideal_reuse_hits
from workloads.spec import WorkloadSpec
from workloads.stats import trace_stats
from workloads.traces import TRACE_FORMATS, detect_format, load_trace, load_trace_bytes

__all__ = [
    "DEFAULT_WORKLOAD",
    "TRACE_FORMATS",
    "PromptSpec",
    "Request",
    "Session",
    "Turn",
    "Workload",
    "WorkloadError",
    "WorkloadSpec",
    "build_workload",
    "detect_format",
    "ideal_reuse",
    "ideal_reuse_hits",
    "list_workloads",
    "load_trace",
    "load_trace_bytes",
    "trace_stats",
]
