"""Kernels compiled for sm_90 without a GPU, as bench/kernel_resources.py does, for the forms
the interpreter cannot check (Gluon; bf16 dots, which it computes wrong). Run apart from the
test process: under TRITON_INTERPRET (CI) the language's helpers are interpreter objects,
which the compiler cannot take."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def assert_compiles_for_hopper(kernel: str, variants: str, pipelined: bool = False) -> None:
    """Every variant (';'-separated, '' the shipped launch) of bench/kernel_resources.py's
    `kernel` compiles for sm_90 and reports its registers; `pipelined`: and ptxas serializes
    none of its wgmmas (a form that leaves one in flight gains nothing where it does)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "bench/kernel_resources.py", "--kernel", kernel, "--variants", variants,
                           *(["--serialized"] if pipelined else [])],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    compiled = [line for line in done.stdout.splitlines() if line.startswith(f"[resources] {kernel} ")]
    assert done.returncode == 0 and len(compiled) == len(variants.split(";")), done.stderr[-3000:]
    assert all("REG:" in line for line in compiled), compiled
    notes = [line for line in done.stdout.splitlines() if "wgmma serialized by:" in line]
    assert not pipelined or (len(notes) == len(compiled) and all(line.endswith(": none") for line in notes)), notes
