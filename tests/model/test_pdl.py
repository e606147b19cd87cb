"""Programmatic dependent launch (model/kernels/pdl.py): every kernel launched with it waits
for the kernels ahead before it touches their memory (checked in the source of every kernel
and launch), and decode steps replayed from graphs with it equal eager steps without it, bit
for bit (GPU)."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from dsflash.model.graphs import GraphCache
from dsflash.model.kernels import pdl

from .test_cuda_graphs import _twins, _verify_steps

KERNELS = pathlib.Path(pdl.__file__).parent
MEMORY_OPS = {"load", "store", "atomic_add", "atomic_xchg", "atomic_cas", "atomic_max", "atomic_min", "make_block_ptr",
              "load_tensor_descriptor", "store_tensor_descriptor"}


def _sources():
    return [(path.name, ast.parse(path.read_text())) for path in sorted(KERNELS.glob("*.py"))]


def _pdl_kernels() -> dict[str, ast.FunctionDef]:
    return {f"{name}:{fn.name}": fn for name, tree in _sources() for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef) and any(arg.arg == "PDL" for arg in fn.args.args)
            and fn.name != "wait_for_inputs"}


def _calls(node: ast.AST) -> set[str]:
    return {call.func.attr for call in ast.walk(node) if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)}


def test_every_pdl_kernel_waits_before_it_touches_memory():
    kernels = _pdl_kernels()
    assert len(kernels) >= 25, sorted(kernels)
    for name, fn in kernels.items():
        body = fn.body[1:] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) \
            else fn.body
        waits = [i for i, statement in enumerate(body) if "wait_for_inputs" in _calls(statement)]
        assert waits, f"{name} takes PDL but never calls pdl.wait_for_inputs"
        for statement in body[:waits[0]]:  # what may run before: index arithmetic
            assert not _calls(statement) & MEMORY_OPS, f"{name} reads or writes memory before it waits"
            assert not isinstance(statement, ast.Return), f"{name} can return before it waits"


def test_every_launch_with_pdl_options_is_of_a_kernel_that_waits():
    """A launch names its kernel, or (quantize._launch) takes it as an argument: then every
    kernel its file passes to a call must take PDL."""
    kernels = {key.split(":")[1] for key in _pdl_kernels()}
    launched = set()
    for name, tree in _sources():
        defined = {fn.name for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef)}
        passed = {arg.id for call in ast.walk(tree) if isinstance(call, ast.Call)
                  for arg in call.args if isinstance(arg, ast.Name) and arg.id.endswith("_kernel")}
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Subscript)):
                continue
            with_pdl = any(kw.arg is None and "options" in _calls(kw.value) and "pdl" in ast.unparse(kw.value)
                           for kw in call.keywords)
            if with_pdl:
                kernel = ast.unparse(call.func.value)
                named = [kernel] if kernel in defined else sorted(passed)
                assert named, f"{name}: launches {kernel}, a kernel it neither defines nor is passed"
                for each in named:
                    assert each in kernels, f"{name}: {each} is launched with pdl.options but takes no PDL"
                launched.update(named)
    assert launched == kernels, f"kernels taking PDL that no launch passes it to: {kernels - launched}"


def test_dsflash_pdl_0_turns_it_off():
    """The escape hatch for drivers that cannot capture programmatic edges into graphs."""
    import os
    import subprocess
    import sys

    code = "from dsflash.model.kernels import pdl; print(pdl.ENABLED)"
    for value, want in (("0", "False"), ("1", "True")):
        env = dict(os.environ, DSFLASH_PDL=value)
        assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                              check=True).stdout.strip() == want


def test_the_interpreter_and_the_cpu_launch_without_pdl(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.options(torch.device("cuda", 0)) == {"PDL": False}
    monkeypatch.delenv("TRITON_INTERPRET")
    assert pdl.options(torch.device("cpu")) == {"PDL": False}
    monkeypatch.setattr(pdl, "ENABLED", False)
    assert pdl.options(torch.device("cpu")) == {"PDL": False}


@pytest.mark.gpu
def test_graph_steps_with_pdl_equal_eager_steps_without(golden_dir, golden, monkeypatch):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs Hopper or newer")
    model, twins = _twins(golden_dir, golden, 2)
    graphs = GraphCache()

    def each_mode(mode):
        monkeypatch.setattr(pdl, "ENABLED", mode == "graphs")
        assert pdl.options(torch.device("cuda", 0))["PDL"] == (mode == "graphs")
    got = _verify_steps(model, twins, graphs, 3, torch.Generator().manual_seed(5), each_mode)  # eager, capture, replay
    assert graphs.captured() > 0
    for eager, replayed in zip(got["eager"], got["graphs"]):
        assert torch.equal(eager, replayed)
    graphs.release()
