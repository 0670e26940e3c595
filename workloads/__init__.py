"""Request streams: synthetic generators and real trace loaders, in one canonical form."""

from workloads.request import PromptSpec, Request, Session, Turn, Workload

__all__ = ["PromptSpec", "Request", "Session", "Turn", "Workload"]
