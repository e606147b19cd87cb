"""The device plan (bench/device/call_*.sh), checked here so that a renamed switch, flag or
test file fails CI rather than a device call: device time is scarce and a session may have
none to spare on a typo."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CALLS = sorted((REPO / "bench" / "device").glob("call_*.sh"), key=lambda p: (len(p.name), p.name))


def _call_name(i: int) -> str:
    """The i-th call's name: call_a .. call_z, then call_aa, call_ab, .. (as spreadsheet columns)."""
    letters = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        letters = chr(ord("a") + r) + letters
    return f"call_{letters}.sh"


def _text(script: Path) -> str:
    """A call's lines, continuations joined, one-word variables ($M, the call's own and
    env.sh's, which every call sources) expanded, also where one names another."""
    text = script.read_text().replace("\\\n", "")
    shared = (REPO / "bench" / "device" / "env.sh").read_text()
    assignments = re.findall(r"^(\w+)=(\S+)$", text + "\n" + shared, re.M)
    for _ in range(3):
        for name, value in assignments:
            text = text.replace(f"${name}", value)
    return text


def _steps(script: Path) -> list[list[str]]:
    """Each `step NAME SECONDS CMD...` line of a call as argv, those of the calls it sources
    (one that picks a call by the card that came) among them."""
    steps = []
    for line in _text(script).splitlines():
        sourced = re.fullmatch(r"\s*source (bench/device/call_\w+\.sh)", line)
        if sourced:
            steps += _steps(REPO / sourced.group(1))
        elif line.lstrip().startswith("step "):  # (also inside an if that picks by card)
            steps.append(shlex.split(line.strip())[3:])
    return steps


def test_the_plan_has_its_calls_and_they_parse():
    assert [c.name for c in CALLS] == [_call_name(i) for i in range(len(CALLS))] and CALLS
    assert all(_steps(c) for c in CALLS)
    for script in [*CALLS, REPO / "bench" / "device" / "env.sh", REPO / "bench" / "device" / "prepare.sh"]:
        subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("script", CALLS, ids=lambda p: p.name)
def test_every_step_names_what_exists(script):
    """Each step's script or test files (or the files of its node ids) exist, and each --prefill-switch names module
    attributes that exist, with as many Python literals each."""
    for argv in _steps(script):
        assert argv[0] == "python3", argv
        if argv[1:3] == ["-m", "pytest"]:
            paths = [a for a in argv[3:] if a.startswith("tests/")]
            assert paths and all((REPO / p.split("::")[0]).exists() for p in paths), argv  # a file or a node id in one
            continue
        assert (REPO / argv[1]).exists(), argv
        if "--prefill-switch" in argv:
            spec = argv[argv.index("--prefill-switch") + 1]
            _check_switches(spec)


def _check_switches(spec: str) -> None:
    """module.NAME=v1|v2;...: each attribute exists, each value a literal of its type, as many each."""
    counts = set()
    for one in spec.split(";"):
        path, values = one.split("=", 1)
        module, attribute = path.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), attribute), path
        parsed = [ast.literal_eval(v) for v in values.split("|")]
        assert all(type(v) is type(getattr(importlib.import_module(module), attribute)) for v in parsed), one
        counts.add(len(parsed))
    assert len(counts) == 1, spec  # every switch takes as many values
