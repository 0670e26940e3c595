from __future__ import annotations

from pathlib import Path

import pytest

from workloads.traces import load_trace

FIXTURES = Path(__file__).parent / "fixtures"
DATA = Path(__file__).resolve().parents[2] / "workloads" / "data"


@pytest.fixture(scope="session")
def mooncake():
    return load_trace(DATA / "mooncake_conversation_trace.jsonl")


@pytest.fixture(scope="session")
def azure():
    return load_trace(DATA / "AzureLLMInferenceTrace_conv.csv")


@pytest.fixture(scope="session")
def sharegpt_real():
    return load_trace(DATA / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv", rate=2.0)
