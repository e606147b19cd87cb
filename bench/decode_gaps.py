"""Where a decode step leaves the GPU idle, and which host code it was waiting on.

Profiles a few decode steps of the bench preset (torch profiler with Python stacks), then
walks the GPU's timeline: every stretch with no kernel, copy or set running is a gap, and
the gap is charged to the host code that launched the work ending it (the innermost three
dsflash frames around that launch). A host-bound step shows its gaps in the code that issues
work too slowly; a GPU-bound one shows few. The Python tracer slows the host several times
over, so the gaps' sizes are relative: which code, not how many milliseconds. Prints the
step's wall time, the GPU's busy time and the gaps by place, and writes the same to
$OUT/gaps_<batch>.txt.

    python bench/decode_gaps.py [--batch 1] [--context 4096] [--steps 2] [--act-quant]
"""
from __future__ import annotations

import argparse
import bisect
import pathlib
import sys
from collections import defaultdict

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402

def gaps(trace: dict) -> tuple[float, float, list[tuple[float, str]]]:
    """(GPU busy us, span us, [(gap us, place)]) of a Chrome trace from torch.profiler."""
    launches = {e["args"]["correlation"]: e for e in trace["traceEvents"]  # runtime calls, and Triton's driver ones
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    frames = defaultdict(list)  # host thread -> its Python frames (start, end, name), by start
    for e in trace["traceEvents"]:
        if e.get("cat") == "python_function":
            frames[e["tid"]].append((e["ts"], e["ts"] + e.get("dur", 0), e["name"]))
    for stack in frames.values():
        stack.sort()
    starts = {tid: [f[0] for f in stack] for tid, stack in frames.items()}
    busy, span, found = h200.gpu_gaps(trace)
    return busy, span, [(us, _place(e, launches, frames, starts)) for us, e in found]


def _place(kernel: dict, launches: dict, frames: dict, starts: dict) -> str:
    """The innermost three dsflash frames around the launch of `kernel` (its runtime call)."""
    launch = launches.get(kernel.get("args", {}).get("correlation"))
    if launch is None:
        return "(launch not traced)"
    stack, t = frames.get(launch["tid"], []), launch["ts"]
    # frames nest: the enclosing ones are those started before t and ending after it; scan
    # back from the last start before t (a few hundred frames at most in a step)
    enclosing = []
    for i in range(bisect.bisect_right(starts.get(launch["tid"], []), t) - 1, -1, -1):
        start, stop, name = stack[i]
        if stop >= t and "dsflash" in name:
            enclosing.append(name.split("dsflash/")[-1])
            if len(enclosing) == 3:
                break
        if t - start > 5e6:  # 5 s: past any frame of these steps
            break
    return " < ".join(enclosing) or f"({launch['name']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    h200.engine_arguments(parser, steps=2)
    args = parser.parse_args()
    from torch.profiler import ProfilerActivity, profile

    engine, step_ms = h200.warm_engine(args)
    with torch.inference_mode():
        config = torch._C._profiler._ExperimentalConfig(verbose=True)
        activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * args.device.startswith("cuda")
        with profile(activities=activities, with_stack=True,
                     experimental_config=config) as prof:
            for _ in range(args.steps):
                engine.step()
            h200.sync()
    busy, span, found = gaps(h200.chrome_trace(prof))
    by_place = defaultdict(lambda: [0.0, 0])
    for us, place in found:
        by_place[place][0] += us
        by_place[place][1] += 1
    n = args.steps
    lines = [f"batch {args.batch}, context {args.context}{', faithful' if args.act_quant else ''}: "
             f"step {step_ms:.2f} ms unprofiled; profiled, per step: GPU busy {busy / n / 1e3:.2f} ms, "
             f"first to last GPU work {span / n / 1e3:.2f} ms, idle gaps over {h200.MIN_GAP_US:g} us "
             f"{sum(us for us, _ in found) / n / 1e3:.2f} ms in {len(found) / n:.0f} gaps",
             "gap ms per step | gaps per step | launched from (the innermost dsflash frames)"]
    for place, (us, count) in sorted(by_place.items(), key=lambda kv: -kv[1][0])[:40]:
        lines.append(f"{us / n / 1e3:8.3f} | {count / n:6.1f} | {place}")
    text = "\n".join(lines)
    print(text, flush=True)
    (h200.out_dir() / f"gaps_B{args.batch}{'_act_quant' if args.act_quant else ''}.txt").write_text(text + "\n")


if __name__ == "__main__":
    main()
