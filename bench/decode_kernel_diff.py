"""Which kernels of a decode step a module switch makes slower or faster: the step profiled at
each value of the switch (one model, new CUDA graphs each value), its kernels grouped by name
and grid, their GPU time a step side by side, largest change first, with each kernel's
registers a thread. For a switch whose step times do not settle (decode_ab.py): the kernels'
sum does. Twenty-fifth session, H200: the lean GEMM K step took 21.55 -> 21.02 ms of kernels
a batch-1 step, in either order, while the step's wall time (host-paced in part, from another
engine each value) read 27.3 against 31.7 ms once and 26.5 against 32.7 with the order turned:
the second value was the slower both times. With one value it profiles the step alone,
its kernels largest first. Programmatic dependent launch is off unless --pdl (or the switch
is pdl.ENABLED): with it a kernel's programs are placed early and wait inside it, so their
wait counts in its time (thirty-second session: 30.6 ms of "kernels" in a 21.9 ms step).

    python bench/decode_kernel_diff.py dsflash.model.kernels.fp4_moe.TWO_PAIRS_BELOW 0.0 1.0 \\
        [--batch 1] [--context 4096] [--steps 3] [--act-quant] [--rows 30]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402


def kernel_times(trace: dict, steps: int) -> dict[tuple[str, str], tuple[float, float, int]]:
    """(kernel name, grid) -> (us a step, launches a step, registers a thread)."""
    found: dict = defaultdict(lambda: [0.0, 0, 0])
    for e in trace["traceEvents"]:
        if e.get("cat") != "kernel":
            continue
        args = e.get("args", {})
        entry = found[(e["name"][:48], "x".join(str(v) for v in args.get("grid", [])))]
        entry[0] += e.get("dur", 0.0) / steps
        entry[1] += 1 / steps
        entry[2] = args.get("registers per thread", 0)
    return {key: tuple(value) for key, value in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("switch", help="module.attribute, e.g. dsflash.model.kernels.fp4_moe.TWO_PAIRS_BELOW")
    parser.add_argument("values", nargs="+", help="Python literals")
    parser.add_argument("--rows", type=int, default=30, help="kernel groups to print")
    parser.add_argument("--pdl", action="store_true", help="keep programmatic dependent launch on")
    h200.engine_arguments(parser, steps=3)
    args = parser.parse_args()
    from torch.profiler import ProfilerActivity, profile

    module, attribute, values = h200.module_switch(args.switch, args.values)
    from dsflash.model.kernels import pdl

    pdl.ENABLED = args.pdl
    h200.DEADLINE[0] = time.monotonic() + 3600
    model, _ = h200.build_model(fast=True, preset=args.preset, act_quant=args.act_quant)
    h200.hold_experts_once(model)
    tables, steps_ms = [], []
    for value in values:
        setattr(module, attribute, value)
        h200.new_graphs(model)
        engine = h200.decode_engine(model, args.batch, args.context, torch.Generator(device="cuda").manual_seed(0))
        steps_ms.append(h200.timed_steps(engine, 4, 6))
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                engine.step()
            h200.sync()
        tables.append(kernel_times(h200.chrome_trace(prof), args.steps))
        for r in list(engine.running):
            engine.abort(r.request_id)
        del engine
        torch.cuda.empty_cache()
    keys = set().union(*tables)

    def change(key):
        times = [t.get(key, (0.0,))[0] for t in tables]
        return max(times) - min(times)

    heads = " | ".join(f"{attribute}={v}" for v in values)
    lines = [f"batch {args.batch}, context {args.context}: step ms " + " | ".join(f"{ms:.2f}" for ms in steps_ms)
             + "; kernel us a step " + " | ".join(f"{sum(e[0] for e in t.values()):.0f}" for t in tables),
             f"kernel, grid: us a step ({heads}), launches a step, registers a thread"]
    def largest(key):  # with one value (a profile of the step alone) change is 0: by time
        return change(key), max(t.get(key, (0.0,))[0] for t in tables)

    for key in sorted(keys, key=largest, reverse=True)[:args.rows]:
        cells = [t.get(key, (0.0, 0, 0)) for t in tables]
        lines.append(f"{key[0]:48s} {key[1]:>12s}: " + " | ".join(f"{c[0]:8.1f}" for c in cells)
                     + f"  x{max(c[1] for c in cells):.0f}  regs " + "/".join(str(c[2]) for c in cells))
    text = "\n".join(lines)
    print(text, flush=True)
    (h200.out_dir() / f"kernel_diff_{attribute}_B{args.batch}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
