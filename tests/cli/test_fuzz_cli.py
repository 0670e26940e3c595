"""Fuzzing the command line: every option of run / sweep / compare / plan / trace stats and
every trace parser, with invalid values (wrong types, negatives, zero, unknown names, huge
numbers, NaN/inf, empty strings, malformed files) and valid small ones.

The contract under test: invalid input exits 2 with exactly one line on stderr that names the
option (or the file), valid input exits 0, and no Python traceback ever reaches the user.
Simulations are tiny (a few requests, a small pool, constant latency), in process.
"""

from __future__ import annotations

import json
import math
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli import SWEEP_AXES, app
from experiments.options.run_options import OPTIONS
from kvcore.contract.fields import flag
from kvcore.model.presets import ALIASES, get_model

FIXTURES = Path(__file__).resolve().parents[1] / "workloads" / "fixtures"
RUNNER = CliRunner()
FUZZ = settings(deadline=None, derandomize=True, print_blob=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

# the tiny base every simulation starts from; an option under test replaces its entry here
BASE = {"--num-requests": "3", "--kv-tokens": "2048", "--latency": "constant",
        "--max-context-len": "1024", "--input-len": "32", "--output-len": "8",
        "--lengths": "uniform", "--gpu-mem-gib": "4096", "--rate": "4"}
MEMORY = ("--kv-tokens", "--num-pages", "--kv-mem-gib", "--kv-cache-memory-bytes", "--budget",
          "--mem-fraction",
          "--activation-peak-gib", "--non-torch-gib")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    hf = get_model("qwen2.5-7b").to_hf_config()
    hf["_name_or_path"] = "org/fuzz-model"
    (d / "hf.json").write_text(json.dumps(hf))
    (d / "plain.txt").write_text("not a directory\n")
    (d / "garbage.bin").write_bytes(bytes(range(256)))
    return d


def invoke(*args: str):
    return RUNNER.invoke(app, [str(a) for a in args])


def no_traceback(r) -> None:
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)


def assert_ok(r, args) -> None:
    no_traceback(r)
    assert r.exit_code == 0, (args, r.output)


def assert_user_error(r, args, *names: str) -> None:
    """Exit 2, one line on stderr naming one of `names` (a flag, a file), no traceback."""
    no_traceback(r)
    assert r.exit_code == 2, (args, r.output)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, (args, r.stderr)
    assert lines[0].startswith("kvsim: error: "), lines
    assert any(n in lines[0] for n in names), (args, names, lines[0])


def field_type(name: str) -> type:
    return OPTIONS[name].type


def allowed_values(name: str) -> list[str] | None:
    return OPTIONS[name].allowed()


def base_without(*options: str) -> list[str]:
    return [x for kv in BASE.items() if kv[0] not in options for x in kv]


def with_base(option: str, value: str | None) -> list[str]:
    """BASE with `option=value` instead of its entry; a memory option replaces the pool size
    (and a budget rule sizes the pool on the GPU preset, not on the huge --gpu-mem-gib)."""
    drop = (option, *MEMORY) if option in MEMORY else (option,)
    if option in MEMORY and option != "--kv-tokens":
        drop += ("--gpu-mem-gib",)
    args = base_without(*drop)
    if value is None:  # a boolean flag
        return [*args, option]
    return [*args, f"{option}={value}"]  # '=' so values like '-1' or '' stay values


# -- invalid values ----------------------------------------------------------------------------
def _parses(text: str, kind: type) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


NUMERIC = [name for name in OPTIONS if field_type(name) in (int, float)]
CHOICE = [name for name in OPTIONS if allowed_values(name)]
# options whose documented domain excludes 0 (others take 0: a length, a delay, a seed...)
POSITIVE = {"rate", "cv", "rate_scale", "duration_s", "num_requests", "max_new_tokens",
            "input_len", "output_len", "question_len", "num_prefixes", "num_turns",
            "turn_input_min", "turn_input_max", "branching", "num_samples", "page_size",
            "gpu_mem_gib", "tp", "max_context_len", "kv_tokens", "num_pages", "kv_mem_gib",
            "mem_fraction", "max_running_requests", "max_prefill_tokens", "slo_ttft",
            "slo_tpot", "gsp_num_groups", "gsp_prompts_per_group", "gsp_question_len",
            "gsp_output_len", "replicas"}
words = st.text(string.ascii_letters + string.punctuation + " ", min_size=1, max_size=12)
huge = st.sampled_from(["99999999999999999999999", "1" + "0" * 40, "1e400", "-1e400",
                        str(2**64), "1e308"])
non_finite = st.sampled_from(["nan", "inf", "-inf", "NaN", "+inf", "Infinity"])


@st.composite
def invalid_numeric(draw):
    name = draw(st.sampled_from(NUMERIC))
    kind = field_type(name)
    kinds = ["word", "negative", "huge", "empty"] + (["zero"] if name in POSITIVE else [])
    kinds += ["fraction", "non_finite"] if kind is int else ["non_finite"]
    what = draw(st.sampled_from(kinds))
    if what == "word":
        value = draw(words.filter(lambda s: not _parses(s, kind)))
    elif what == "negative":
        value = str(-draw(st.integers(1, 10**6)))
    elif what == "huge":  # for floats only the non-finite ones: 1e308 s is silly, not wrong
        value = draw(huge if kind is int else st.sampled_from(["1e400", "1" + "0" * 400]))
    elif what == "empty":
        value = ""
    elif what == "zero":
        value = draw(st.sampled_from(["0", "0.0", "-0"])) if kind is float else "0"
    elif what == "fraction":
        value = draw(st.sampled_from(["1.5", "0.5", "2e3", "1e-3"]))
    else:
        value = draw(non_finite)
    return name, value


@st.composite
def invalid_choice(draw):
    name = draw(st.sampled_from(CHOICE))
    allowed = {a.lower() for a in allowed_values(name)} | set(ALIASES)
    value = draw(st.one_of(st.just(""), words, st.sampled_from(["PAGED ", "none", "null",
                                                                 "0", "-1", "h100x"])))
    assume(value.lower() not in allowed and value not in allowed_values(name))
    return name, value


@given(case=st.one_of(invalid_numeric(), invalid_choice()),
       command=st.sampled_from(["run", "sweep", "compare", "plan"]))
@settings(FUZZ, max_examples=400)
def test_invalid_option_values_exit_2_naming_the_option(case, command, tmp_path_factory):
    name, value = case
    opt = flag(name)
    extra = []
    if command in ("sweep", "compare"):
        out = tmp_path_factory.mktemp(command)
        extra = ["--out", str(out)] + (["--no-plot", "--no-progress"] if command == "sweep"
                                       else [])
    args = [command, *with_base(opt, value), *extra]
    r = invoke(*args)
    assert_user_error(r, args, opt)


@given(option=st.sampled_from(["--trace", "--model-config", "--out", "--config"]),
       kind=st.sampled_from(["missing", "empty", "directory", "garbage", "file"]))
@settings(FUZZ, max_examples=30)
def test_invalid_paths_exit_2(option, kind, files):
    value = {"missing": str(files / "no" / "such.csv"), "empty": "", "directory": str(files),
             "garbage": str(files / "garbage.bin"), "file": str(files / "plain.txt")}[kind]
    assume(not (option == "--out" and kind in ("missing", "directory")))  # those are valid
    args = ["run", *with_base(option, value)]
    r = invoke(*args)
    assert_user_error(r, args, option, value or "''")


# -- valid values ------------------------------------------------------------------------------
def _f(lo: float, hi: float):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False).map(lambda x: f"{x:.4g}")


def _i(lo: int, hi: int):
    return st.integers(lo, hi).map(str)


VALID: dict[str, st.SearchStrategy] = {
    "--rate": _f(0.1, 100), "--cv": _f(0.1, 4), "--rate-scale": _f(0.1, 10),
    "--duration-s": _f(1, 100), "--num-requests": _i(1, 5), "--max-new-tokens": _i(1, 64),
    "--input-len": _i(1, 64), "--output-len": _i(1, 64), "--spread": _f(0, 1),
    "--sigma": _f(0, 2), "--prefix-len": _i(0, 64), "--question-len": _i(1, 64),
    "--num-prefixes": _i(1, 4), "--num-turns": _i(1, 4), "--turn-input-min": _i(1, 256),
    "--turn-input-max": _i(256, 600), "--think-time-s": _f(0, 10), "--system-len": _i(0, 64),
    "--depth": _i(0, 3), "--branching": _i(1, 3), "--level-interval-s": _f(0, 5),
    "--num-samples": _i(1, 4), "--page-size": st.sampled_from(["1", "2", "16", "64", "256"]),
    "--gpu-mem-gib": _f(80, 4096), "--tp": st.sampled_from(["1", "2", "4", "8"]),
    "--max-context-len": _i(64, 4096), "--kv-tokens": _i(256, 8192),
    "--num-pages": _i(16, 512), "--kv-mem-gib": _f(0.01, 1), "--mem-fraction": _f(0.5, 0.95),
    "--activation-peak-gib": _f(0, 8), "--non-torch-gib": _f(0, 4),
    "--max-running-requests": _i(1, 64), "--max-prefill-tokens": _i(1, 4096),
    "--chunked-prefill-size": _i(0, 4096), "--warmup-s": _f(0, 10),
    "--timeline-interval-s": st.sampled_from(["0", "0.01", "0.5"]), "--seed": _i(0, 2**32),
    "--slo-ttft": _f(0.01, 10),
    "--slo-tpot": _f(0.01, 10), "--slo-percentile": _f(1, 100), "--device": st.just("cpu"),
    "--page-head-overhead-s": _f(0, 1e-6), "--iteration-overhead-s": _f(0, 0.05),
    # host KV tier (docs/tiers.md): sizes that hold a page; storage needs a host tier, so alone
    # only its 0 is valid
    "--hicache-size": st.sampled_from(["0", "0.05", "0.5"]),
    "--hicache-ratio": st.sampled_from(["0", "1", "4"]), "--storage-size": st.just("0"),
    "--hicache-prefetch-timeout-s": _f(0, 10), "--host-link-gbps": _f(0, 900),
    "--storage-gbps": _f(0.1, 100), "--storage-latency-us": _f(0, 1e4),
}
for _name in CHOICE:
    VALID[flag(_name)] = st.sampled_from(allowed_values(_name))
VALID["--arrival"] = st.sampled_from(["poisson", "gamma", "fixed"])  # 'trace' needs a trace
VALID["--max-concurrency"] = _i(1, 4)
VALID["--latency-profile"] = st.sampled_from(["vllm-paper-2023", "vllm-hopper", "sglang-hopper"])
VALID["--peak-to-trough"] = _f(1, 10)  # read by --arrival diurnal only
# the grouped shared-prefix workloads' options and the ladder's (workloads/prompt_groups.py,
# ladder.py): read by those workloads / that arrival process only (_where_used moves them)
VALID.update({"--gsp-num-groups": _i(1, 3), "--gsp-prompts-per-group": _i(1, 3),
              "--gsp-system-prompt-len": _i(0, 64), "--gsp-question-len": _i(1, 32),
              "--gsp-output-len": _i(1, 8), "--ladder": st.sampled_from(["2x1", "3x1,1x2"]),
              "--ladder-gap-s": _f(0, 5)})
# hybrid models' options (simulator/hybrid.py): each is read on a hybrid model by the policy
# whose layout it sizes, and is an error elsewhere; SGLang's Mamba cache runs page 1, and its
# state pool needs a pool of a few GiB to run one request (3 slots per running request)
VALID["--swa-full-tokens-ratio"] = _f(0.1, 1)
VALID["--mamba-full-memory-ratio"] = _f(0.1, 4)
VALID["--max-mamba-cache-size"] = _i(3, 64)
VALID["--vllm-version"] = st.sampled_from(["0.11.0", "0.19", "0.20.1rc1", "0.24.0", "0.31.0"])
VALID["--kv-cache-memory-bytes"] = _i(2**24, 2**30)
_SGLANG_MAMBA = ["--model", "qwen3.5-4b", "--policy", "paged", "--page-size", "1",
                 "--kv-tokens", "65536"]
HYBRID_CONTEXT = {
    "--swa-full-tokens-ratio": ["--model", "gpt-oss-20b", "--policy", "paged"],
    "--kv-layout": ["--model", "gpt-oss-20b"],
    "--mamba-full-memory-ratio": _SGLANG_MAMBA,
    "--max-mamba-cache-size": _SGLANG_MAMBA,
    "--mamba-cache-mode": ["--model", "qwen3.5-4b", "--policy", "vllm", "--kv-tokens", "65536"],
    **{o: ["--model", "qwen3.5-4b", "--policy", "vllm", "--kv-tokens", "65536"]
       for o in ("--vllm-version", "--mamba-cache-dtype", "--mamba-ssm-cache-dtype")},
}
# fleets (docs/fleet.md): a router's options need two replicas or more; the KV event delay
# a router that reads events
VALID["--replicas"] = _i(1, 3)
VALID["--router-args"] = st.sampled_from(["cache-threshold=0.5", "balance-abs-threshold=8",
                                          "cache-threshold=0.1,max-tree-size=64"])
VALID["--kv-event-delay-s"] = _f(0, 1)
# a fleet's shared KV tier (docs/fleet.md): FLEET_CONTEXT gives it two replicas, each with a
# host tier
VALID["--shared-tier-size"] = st.sampled_from(["0", "0.5", "4"])
VALID["--shared-tier-gbps"] = _f(0.1, 100)
VALID["--shared-tier-latency-us"] = _f(0, 1e4)
FLEET_CONTEXT = {
    "--router": ["--replicas", "2"],
    "--router-args": ["--replicas", "2", "--router", "cache-aware"],
    "--kv-event-delay-s": ["--replicas", "2", "--router", "llm-d-precise"],
    # a shared KV tier: two replicas or more, each with a host tier
    "--shared-tier-size": ["--replicas", "2", "--hicache-ratio", "1"],
}
# options read only under another option (experiments/options/option_rules.py RULES): the context
# that reads them (BASE's paged policy reads the eviction, admission and order options)
_HOST_TIER = ["--hicache-ratio", "1"]
_STORAGE_TIER = [*_HOST_TIER, "--storage-size", "0.5"]
RULE_CONTEXT = {
    "--placement": ["--policy", "contiguous-max"], "--eviction": [], "--admission": [],
    "--schedule": [], "--preempt": [], "--activation-peak-gib": ["--budget", "vllm"],
    "--non-torch-gib": [], "--gpu": ["--latency", "roofline"], "--workload": [], "--model": [],
    "--hicache-write-policy": _HOST_TIER, "--hicache-load": _HOST_TIER,
    "--host-link-gbps": _HOST_TIER, "--hicache-prefetch-policy": _STORAGE_TIER,
    "--hicache-prefetch-timeout-s": [*_STORAGE_TIER, "--hicache-prefetch-policy", "timeout"],
    "--storage-gbps": _STORAGE_TIER, "--storage-latency-us": _STORAGE_TIER,
    "--slo-percentile": ["--slo-ttft", "1"],
    # BASE sizes no pool by rule once --budget replaces --kv-tokens; BASE's lengths draw
    "--budget": [], "--seed": [],
    # HYBRID_CONTEXT gives them a model with state layers
    "--mamba-cache-dtype": [], "--mamba-ssm-cache-dtype": [],
    **{o: [*FLEET_CONTEXT["--shared-tier-size"], "--shared-tier-size", "0.5"]
       for o in ("--shared-tier-gbps", "--shared-tier-latency-us")},
}


def _has_states(model: str | None) -> bool:
    from kvcore.model.hybrid_presets import hybrid_layout

    layout = hybrid_layout(str(model))
    return layout is not None and bool(layout.state_groups())


# options of the roofline model (BASE runs the constant one)
ROOFLINE_ONLY = ("--page-head-overhead-s", "--iteration-overhead-s", "--attention-backend",
                 "--latency-profile")
BOOLS = [flag(name) for name in OPTIONS if field_type(name) is bool]


def test_every_rule_bound_option_has_a_context():
    """An option read only under another (option_rules.RULES) is fuzzed where it is read."""
    from experiments.options.option_rules import RULES

    assert {flag(r.option) for r in RULES} == set(RULE_CONTEXT)


def test_every_option_is_fuzzed():
    """A new option must get a valid strategy here (and is then fuzzed both ways)."""
    names = {flag(name) for name in OPTIONS}
    covered = set(VALID) | set(BOOLS) | {"--trace", "--model-config", "--out"}
    assert names <= covered, names - covered


@given(option=st.sampled_from(sorted(VALID) + BOOLS + ["--trace", "--model-config", "--out"]),
       data=st.data())
@settings(FUZZ, max_examples=200)
def test_valid_option_values_exit_0(option, data, files, tmp_path_factory):
    if option in BOOLS:
        name = option.removeprefix("--")
        value = None
        option = data.draw(st.sampled_from([option, f"--no-{name}"]))
    elif option == "--trace":
        value = str(FIXTURES / data.draw(st.sampled_from(["vidur_sample.csv",
                                                          "burstgpt_sample.csv"])))
    elif option == "--model-config":
        value = str(files / "hf.json")
    elif option == "--out":
        value = str(tmp_path_factory.mktemp("out") / "run")
    else:
        value = data.draw(VALID[option])
    extra = []
    if option in ("--mem-fraction",):
        extra = ["--budget", "vllm"]
    if option in ROOFLINE_ONLY:
        extra = ["--latency", "roofline"]
    if option == "--peak-to-trough":
        extra = ["--arrival", "diurnal"]
    extra += HYBRID_CONTEXT.get(option, []) + RULE_CONTEXT.get(option, [])
    extra += FLEET_CONTEXT.get(option, [])
    if option == "--model" and _has_states(value):  # SGLang's Mamba cache runs page 1 only,
        extra += _SGLANG_MAMBA[2:]  # and its state pool needs a few GiB (above)
    if option == "--attention-backend" and value == "fa2":
        extra += ["--page-size", "256"]  # upstream FA2 runs only multiples of 256
    args = ["run", *_where_used(option, value, with_base(option, value)), *extra]
    r = invoke(*args)
    assert_ok(r, args)


# options read by only some workloads (workloads/registry.py check_options_used): a valid
# value is valid where it is used, and an error elsewhere (test_an_ignored_option_is_an_error)
_READ_BY = {"--prefix-len": "kshot", "--num-prefixes": "kshot", "--question-len": "kshot",
            "--num-turns": "chat", "--turn-input-min": "chat", "--turn-input-max": "chat",
            "--think-time-s": "chat", "--system-len": "chat", "--depth": "tot",
            "--branching": "tot", "--level-interval-s": "tot", "--num-samples":
            "parallel-sampling"}
_LENGTH_FLAGS = ("--input-len", "--output-len", "--lengths", "--spread", "--sigma")
_GROUPED = ("--gsp-num-groups", "--gsp-prompts-per-group", "--gsp-system-prompt-len",
            "--gsp-question-len", "--gsp-output-len", "--ignore-eos", "--no-ignore-eos")
_GROUPED_WORKLOADS = ("shared-prefix", "generated-shared-prefix", "llmd-73-capacity",
                      "llmd-37-capacity", "sglang-v04-router")
_LADDER = ("--ladder", "--ladder-type", "--ladder-gap-s", "--ladder-drain", "--no-ladder-drain")
_TRACE_ONLY = ("--rate-scale", "--format", "--skip-bad-rows", "--trace")

# generators whose prompts are their own (workloads/registry.py `prompts`): no --input-len
_OWN_PROMPTS = ("kshot", "chat")


def _where_used(option: str, value: str | None, args: list[str]) -> list[str]:
    """`args` (BASE with the option) moved to a workload that reads the option."""
    moved = _moved(option, value, args)
    workload = next((a.split("=", 1)[1] if "=" in a else moved[i + 1]
                     for i, a in enumerate(moved) if a.split("=", 1)[0] == "--workload"), None)
    if workload in _OWN_PROMPTS and option != "--input-len":  # k-shot, chat draw their own
        moved = _without(moved, "--input-len")
    if option == "--lengths" and value not in ("fixed", "uniform", "lognormal"):
        moved = _without(_without(moved, "--input-len"), "--output-len")  # no mean to take
    if option == "--sigma":  # lognormal's knob
        moved = [*_without(moved, "--lengths"), "--lengths", "lognormal"]
    return moved


def _without(args: list[str], name: str) -> list[str]:
    """`args` less flag `name` and its value (as `--name value` or `--name=value`)."""
    return [a for i, a in enumerate(args)
            if a.split("=", 1)[0] != name and (i == 0 or args[i - 1] != name)]


def _moved(option: str, value: str | None, args: list[str]) -> list[str]:
    from workloads import list_workloads
    from workloads.registry import _TRACES

    def drop(flags: tuple[str, ...]) -> list[str]:
        out: list[str] = []
        skip = False
        for a in args:
            if skip:
                skip = False
                continue
            if a in flags:
                skip = True
                continue
            if a.split("=", 1)[0] in flags and a.split("=", 1)[0] != option:
                continue
            out.append(a)
        return out

    if option in _READ_BY:
        return [*args, "--workload", _READ_BY[option]]
    if option in _GROUPED or (option == "--workload" and value in _GROUPED_WORKLOADS):
        args = drop((*_LENGTH_FLAGS, "--rate"))  # with ignore-eos no length model is read
        if option == "--workload":
            return args
        eos_off = ["--lengths", "uniform", "--output-len", "8"]  # the true output lengths
        return [*args, "--workload", "shared-prefix", "--rate", "4",
                *(eos_off if option == "--no-ignore-eos" else [])]
    if option in _LADDER:
        args = drop(("--rate",))
        # a gap is read between stages only: give --ladder-gap-s a two-stage ladder
        stages = "2x1,1x2" if option == "--ladder-gap-s" else "2x1"
        return [*args, "--arrival", "ladder", *([] if option == "--ladder" else
                                                 ["--ladder", stages])]
    if option == "--cv":
        return [*args, "--arrival", "gamma"]
    if option in _TRACE_ONLY:
        args = drop((*_LENGTH_FLAGS, "--rate"))
        if option == "--format":  # the fixture is in one format: auto-detect it
            args = [a for a in args if not a.startswith("--format")] + ["--format=auto"]
        return args if option == "--trace" else [*args, "--trace",
                                                  str(FIXTURES / "vidur_sample.csv")]
    if option == "--workload" and value in _TRACES:
        assert value in list_workloads()
        return drop((*_LENGTH_FLAGS, "--rate"))  # 3 rows of a 3-s bucket span no time
    return args


@pytest.mark.parametrize("args, named", [
    (["--workload", "chat", "--prefix-len", "8"], "--prefix-len"),
    (["--rate-scale", "2"], "--rate-scale"),  # drawn arrivals: nothing to speed up
    (["--cv", "2"], "--cv"),  # Poisson arrivals have no cv
    (["--workload", "azure-conv", "--input-len", "64"], "--input-len"),
    (["--trace", str(FIXTURES / "vidur_sample.csv"), "--rate", "4", "--rate-scale", "2"],
     "--rate-scale"),
])
def test_an_ignored_option_is_an_error(args, named):
    """An option the workload would not read is a one-line error, never a silent no-op
    (tens of milliseconds each: the error comes before any simulation)."""
    base = ["--num-requests", "3", "--kv-tokens", "2048", "--latency", "constant",
            "--max-context-len", "1024", "--gpu-mem-gib", "4096"]
    r = invoke("run", *base, *args)
    assert_user_error(r, ["run", *args], named)


# -- sweep / compare / plan / trace stats own options ------------------------------------------
def _list(values: list[str]):
    return st.lists(st.sampled_from(values), min_size=1, max_size=2, unique=True).map(",".join)


SWEEP_VALID = {
    "--page-sizes": st.one_of(_list(["1", "16", "64"]), st.just("8..16")),
    "--policies": _list(allowed_values("policy")), "--placements": _list(["first-fit", "buddy"]),
    "--rates": _list(["0.5", "4", "20"]), "--kv-tokens": _list(["1024", "4096"]),
    "--seeds": _list(["0", "7"]), "--workloads": _list(["sharegpt", "kshot", "chat"]),
    "--jobs": st.just("1"), "--executor": st.just("local"),
}
SWEEP_INVALID = {
    "--page-sizes": ["", ",", "0", "1,x", "8..2", "-4", "nan", "1.5", "1..", str(2**40)],
    "--policies": ["", "nope", "paged,nope", ","], "--placements": ["", "worst-fit"],
    "--rates": ["", "0", "-1", "nan", "inf", "x", "4,-inf"], "--kv-tokens": ["", "0", "-8",
                                                                             "1e3", "x"],
    "--seeds": ["", "-1", "1.5", "x", str(2**70)], "--workloads": ["", "nope", "kshot,x"],
    "--jobs": ["0", "-1", "x", "", "1.5", str(2**70), "100000"],
    "--executor": ["", "nope", "LOCAL"], "--scheduler-address": ["tcp://127.0.0.1:1"],
}


@given(option=st.sampled_from(sorted(SWEEP_INVALID)), data=st.data())
@settings(FUZZ, max_examples=60)
def test_sweep_invalid_grid_options(option, data, tmp_path_factory):
    value = data.draw(st.sampled_from(SWEEP_INVALID[option]))
    out = tmp_path_factory.mktemp("sw")
    args = ["sweep", *base_without(option), f"{option}={value}", "--out", str(out),
            "--no-plot", "--no-progress"]
    r = invoke(*args)
    singular = {v: "--" + k.replace("_", "-") for k, v in SWEEP_AXES.items()}
    assert_user_error(r, args, option, singular.get(option, option))
    assert not (out / "summary.csv").exists()  # rejected before any cell ran


@given(option=st.sampled_from(sorted(SWEEP_VALID)), data=st.data())
@settings(FUZZ, max_examples=18)
def test_sweep_valid_grid_options(option, data, tmp_path_factory):
    value = data.draw(SWEEP_VALID[option])
    out = tmp_path_factory.mktemp("sw")
    base = [*base_without(option, "--num-requests"), "--num-requests", "2"]
    grid = [] if option == "--page-sizes" else ["--page-sizes", "16"]
    args = ["sweep", *base, f"{option}={value}", *grid, "--out", str(out), "--no-plot",
            "--no-progress"]
    r = invoke(*args)
    assert_ok(r, args)
    import pandas as pd

    df = pd.read_csv(out / "summary.csv")
    assert len(df) >= 1 and df.config_hash.is_unique


@given(value=st.one_of(st.sampled_from(["", ",", "nope", "paged,nope", "PAGED"]), words),
       ok=st.booleans(), data=st.data())
@settings(FUZZ, max_examples=16)
def test_compare_policies(value, ok, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp")
    if ok:
        value = data.draw(_list(["paged", "vllm", "contiguous-pow2"]))
    else:
        names = [p.strip() for p in value.split(",") if p.strip()]
        assume(not names or any(n not in allowed_values("policy") for n in names))
    args = ["compare", *with_base("--num-requests", "2"), f"--policies={value}", "--out",
            str(out)]
    r = invoke(*args)
    if ok:
        assert_ok(r, args)
    else:
        assert_user_error(r, args, "--policies", "--policy")


PLAN_INVALID = {
    "--context-len": ["0", "-1", "x", "", "1.5", str(2**70)],
    "--tolerance": ["nan", "inf", "-0.1", "x", ""],
    "--page-sizes": ["", "0", "x", "-16", "4..1"], "--jobs": ["0", "-3", "x", str(2**70)],
}
PLAN_VALID = {"--context-len": _i(1, 131072), "--tolerance": _f(0, 0.5),
              "--page-sizes": _list(["1", "16", "256"]), "--jobs": st.just("1")}


@given(option=st.sampled_from(sorted(PLAN_INVALID)), ok=st.booleans(), data=st.data())
@settings(FUZZ, max_examples=60)
def test_plan_options(option, ok, data):
    value = data.draw(PLAN_VALID[option]) if ok else data.draw(st.sampled_from(
        PLAN_INVALID[option]))
    args = ["plan", f"{option}={value}", "--json"]
    r = invoke(*args)
    if ok and option != "--context-len":  # the page-size study's flags, with no study
        assert_user_error(r, args, option)
        assert "silent no-op" in r.stderr
    elif ok:
        assert_ok(r, args)
        json.loads(r.stdout)
    else:
        assert_user_error(r, args, option, option.removesuffix("s"))


STATS_INVALID = {"--page-size": ["0", "-1", "x", "", str(2**70)],
                 "--num-requests": ["0", "-5", "x", ""],
                 "--format": ["", "nope", "CSV"]}


@given(option=st.sampled_from(sorted(STATS_INVALID)), ok=st.booleans(),
       file=st.sampled_from(["kshot", str(FIXTURES / "vidur_sample.csv")]), data=st.data())
@settings(FUZZ, max_examples=40)
def test_trace_stats_options(option, ok, file, data):
    if ok:
        value = data.draw({"--page-size": _i(1, 512), "--num-requests": _i(1, 20),
                           "--format": st.sampled_from(["auto"])}[option])
    else:
        value = data.draw(st.sampled_from(STATS_INVALID[option]))
    args = ["trace", "stats", file, f"{option}={value}", "--json"]
    r = invoke(*args)
    if ok:
        assert_ok(r, args)
        assert json.loads(r.stdout)["rows"] >= 1
    else:
        assert_user_error(r, args, option)


# -- trace parsers -----------------------------------------------------------------------------
def _azure_ts(t: float) -> str:
    whole = int(t)
    return f"2023-11-16 18:{whole // 60 % 60:02d}:{whole % 60:02d}.{int((t % 1) * 1e7):07d}"


HEADERS = {
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
    "vidur": "arrived_at,num_prefill_tokens,num_decode_tokens",
    "sharegpt": "num_prefill_tokens,num_decode_tokens",
    "generic": "arrival_s,prompt_ids,output_len",
    "mooncake": None,
}


def _row(fmt: str, t: float, n: int, m: int) -> str:
    if fmt == "azure":
        return f"{_azure_ts(t)},{n},{m}"
    if fmt == "burstgpt":
        return f"{t:.3f},ChatGPT,{n},{m},{n + m},Conversation log"
    if fmt == "vidur":
        return f"{t:.3f},{n},{m}"
    if fmt == "sharegpt":
        return f"{n},{m}"
    if fmt == "generic":
        return f"{t:.3f},\"{' '.join(str(7 + i) for i in range(n))}\",{m}"
    hashes = list(range(math.ceil(n / 512)))
    return json.dumps({"timestamp": int(t * 1000), "input_length": n, "output_length": m,
                       "hash_ids": hashes})


@st.composite
def trace_text(draw, fmt: str):
    rows = draw(st.lists(st.tuples(st.floats(0, 5), st.integers(1, 600), st.integers(1, 40)),
                         min_size=1, max_size=6))
    t = 0.0
    lines = [] if HEADERS[fmt] is None else [HEADERS[fmt]]
    for dt, n, m in rows:
        t += dt
        lines.append(_row(fmt, t, n, m))
    return "\n".join(lines) + "\n"


FORMATS = sorted(HEADERS)
TRACE_BASE = ["--num-requests", "3", "--kv-tokens", "4096", "--latency", "constant",
              "--max-context-len", "2048", "--rate", "2", "--gpu-mem-gib", "4096"]


def _run_trace(path: Path, fmt: str):
    args = ["run", *TRACE_BASE, "--trace", str(path), "--format", fmt]
    return args, invoke(*args)


@given(fmt=st.sampled_from(FORMATS), data=st.data(), auto=st.booleans())
@settings(FUZZ, max_examples=80)
def test_valid_traces_run(fmt, data, auto, tmp_path_factory):
    path = tmp_path_factory.mktemp("tr") / f"t.{'jsonl' if fmt == 'mooncake' else 'csv'}"
    path.write_text(data.draw(trace_text(fmt)))
    args, r = _run_trace(path, "auto" if auto else fmt)
    assert_ok(r, args)
    if fmt != "sharegpt":  # no timestamps: `trace stats` has no --rate to pair it with
        r = invoke("trace", "stats", path, "--format", fmt, "--json")
        assert_ok(r, ["trace", "stats", path])


def _mutate(draw, text: str, fmt: str) -> tuple[str | bytes, bool]:
    """(new content, surely_bad): surely_bad when no parser could accept it."""
    lines = text.splitlines()
    how = draw(st.sampled_from(["bytes", "not_utf8", "wrong_header", "no_header", "field",
                                "truncate", "extra_field", "empty", "backwards"]))
    if how == "bytes":
        return draw(st.binary(min_size=1, max_size=200)), False
    if how == "not_utf8":
        return text.encode() + b"\xff\xfe" + draw(st.binary(max_size=20)), True
    if how == "empty":
        return draw(st.sampled_from(["", "\n", "  \n\n"])), True
    if how == "wrong_header":
        return "\n".join(["foo,bar,baz", *lines[1:]]) + "\n", fmt != "mooncake"
    if how == "no_header":
        return "\n".join(lines[1:] or ["1,2,3"]) + "\n", fmt != "mooncake"
    if how == "truncate":
        cut = draw(st.integers(0, max(len(text) - 1, 0)))
        return text[:cut], False
    if how == "backwards" and len(lines) >= 3 and fmt not in ("sharegpt",):
        data = lines[1:] if HEADERS[fmt] else lines
        head = lines[:1] if HEADERS[fmt] else []
        return "\n".join([*head, *data[::-1]]) + "\n", False  # equal times are fine
    i = draw(st.integers(1 if HEADERS[fmt] else 0, max(len(lines) - 1, 0)))
    if how == "extra_field" or i >= len(lines):
        return text + "\n" + draw(st.sampled_from([",,,", "1,2", '{"a": 1}', "[1]"])), False
    bad = draw(st.sampled_from(["-1", "x", "nan", "inf", "", "1e999", "1.5", "99999999999",
                                '"', "[", "{", "\x00"]))
    if fmt == "mooncake":
        obj = json.loads(lines[i])
        key = draw(st.sampled_from(sorted(obj)))
        obj[key] = draw(st.sampled_from([-1, "x", None, 1.5, [], {}, 10**30, [-1], True]))
        lines[i] = json.dumps(obj)
    else:
        cells = lines[i].split(",")
        j = draw(st.integers(0, len(cells) - 1))
        cells[j] = bad
        lines[i] = ",".join(cells)
    return "\n".join(lines) + "\n", False


@given(fmt=st.sampled_from(FORMATS), data=st.data(), skip=st.booleans())
@settings(FUZZ, max_examples=250)
def test_malformed_traces_never_crash(fmt, data, skip, tmp_path_factory):
    """A malformed file either still parses (exit 0) or is rejected with one line that points
    at the file (file:line where there is a line); --skip-bad-rows never turns it into a
    crash."""
    content, surely_bad = _mutate(data.draw, data.draw(trace_text(fmt)), fmt)
    path = tmp_path_factory.mktemp("bad") / "trace.txt"
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
    args = ["run", *TRACE_BASE, "--trace", str(path), "--format", fmt]
    if skip:
        args.append("--skip-bad-rows")
    r = invoke(*args)
    no_traceback(r)
    if surely_bad and not skip:
        assert r.exit_code == 2, (args, content, r.output)
    if r.exit_code != 0:
        assert_user_error(r, args, str(path))
    r = invoke("trace", "stats", str(path), "--format", fmt, "--json")
    no_traceback(r)
    if r.exit_code != 0:
        assert_user_error(r, ["trace", "stats", path], str(path))
