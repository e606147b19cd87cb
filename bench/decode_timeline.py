"""When the GPU waits on the host in a decode step, measured without a profiler.

Marks the entry and exit of the step's phases (DSpark propose and absorb, the forward, each
layer's block, the compressor/indexer work, the head, the host syncs) with a host clock
reading and a CUDA event on the stream. After a sync at the step's start both clocks read the
same instant, so at each mark `lag` = (when the GPU reached it) - (when the host issued it).
A lag near the launch latency means the GPU had nothing queued and waited for the host there;
a lag of milliseconds means the host ran that far ahead. Per phase it sums the host's time
and the GPU's time between marks, and the GPU time spent where the lag had collapsed (the
host set the pace). The events cost the host a few us each: the step is timed without them.

    python bench/decode_timeline.py [--batch 1] [--context 4096] [--steps 3] [--act-quant]
"""
from __future__ import annotations

import argparse
import functools
import pathlib
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import h200  # noqa: E402

CAUGHT_UP_MS = 0.05  # a lag under this: the GPU had drained its queue and waited on the host


class Marks:
    def __init__(self, cuda: bool = True):
        self.rows: list[tuple[str, float, torch.cuda.Event | None]] = []
        self.stack: list[str] = []
        self.on, self.cuda = False, cuda

    def _event(self) -> torch.cuda.Event | None:
        if not self.cuda:  # a CPU smoke run: the GPU column repeats the host's
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def mark(self, label: str) -> None:
        # (a graph captured inside a marked step records no events: a capture cannot hold them)
        if self.on and not (self.cuda and torch.cuda.is_current_stream_capturing()):
            self.rows.append((label, time.perf_counter(), self._event()))

    def wrap(self, owner, name: str, label) -> None:
        """Mark entry and exit of owner.name; label(args) names the phase."""
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def marked(*args, **kwargs):
            phase = label(args) if callable(label) else label
            self.stack.append(phase)
            where = "/".join(self.stack)
            self.mark(where + " >")
            try:
                return inner(*args, **kwargs)
            finally:
                self.mark(where + " <")
                self.stack.pop()

        setattr(owner, name, marked)

    def step(self, fn) -> list[tuple[str, float, float]]:
        """Run fn with marks; [(label, host ms, GPU ms)] from the step's start."""
        h200.sync()
        self.rows, self.on = [], True
        start = self._event()
        t0 = time.perf_counter()
        fn()
        self.on = False
        h200.sync()
        return [(label, (t - t0) * 1e3, start.elapsed_time(event) if self.cuda else (t - t0) * 1e3)
                for label, t, event in self.rows]


def instrument(marks: Marks, engine, fine: bool = False) -> None:
    import dsflash.decode_worker.engine as engine_module
    import dsflash.model.deepseek_v41 as model_module
    import dsflash.model.device as device_module
    import dsflash.model.dspark as dspark_module
    import dsflash.model.engram_hash as engram_hash_module
    from dsflash.model.graphs import GraphCache

    model_cls = model_module.DeepseekV41
    marks.wrap(dspark_module.DSparkDrafter, "propose", "propose")
    marks.wrap(dspark_module.DSparkDrafter, "absorb_many", "absorb")
    marks.wrap(model_cls, "forward", "forward")
    marks.wrap(model_cls, "draft_streams", "stages")
    marks.wrap(engram_hash_module.EngramHasher, "many", "hash")
    marks.wrap(device_module.HostCopy, "get", "host copy")  # the drafts' wait, where the forward needs them
    marks.wrap(model_cls, "_outputs", "head")
    marks.wrap(model_cls, "_engram", "engram")
    marks.wrap(model_cls, "_block", lambda a: ("source" if (a[1].is_kv_source or a[1].is_index_source)
                                              else "block") + str(a[1].index))
    marks.wrap(model_module, "update_sources", "compressor+indexer")
    marks.wrap(GraphCache, "run", lambda a: "graph:" + a[1][0])
    marks.wrap(engine_module, "greedy_targets", "targets")
    marks.wrap(engine, "_ensure_memory", "ensure_memory")
    if fine:  # inside the compressor/indexer layers, where the host spends most of a step
        import dsflash.kvcache.paged as paged_module
        import dsflash.model.layers.attention_kernel as attention_module
        import dsflash.model.layers.compressor as compressor_module
        import dsflash.model.layers.indexer as indexer_module
        from dsflash.model.fast_ops import TritonOps

        marks.wrap(attention_module, "compress", "compress")
        marks.wrap(attention_module, "index_runs", "index_runs")
        marks.wrap(compressor_module, "_complete_groups", "open_groups")
        marks.wrap(paged_module.PagedCache, "entries_append_runs", "entries_append")
        marks.wrap(indexer_module, "index", "index")
        for name in ("indexer_scores", "top_k_ascending", "select_candidate_blocks", "_kernel_scores"):
            marks.wrap(indexer_module, name, name)
        for name in ("linear", "norm_rope_fp4", "compress_pool_norm"):
            marks.wrap(TritonOps, name, name)
        marks.wrap(model_module, "prepare", "prepare")
        marks.wrap(model_module.Rope, "cos_sin", "cos_sin")


def summarize(steps: list[list[tuple[str, float, float]]]) -> list[str]:
    """Per innermost phase: host ms, GPU ms between its marks, and GPU ms where the GPU had
    caught up with the host (the interval ends with a lag under CAUGHT_UP_MS)."""
    totals = defaultdict(lambda: [0.0, 0.0, 0.0, 0])
    for rows in steps:
        for (label, host_a, gpu_a), (_, host_b, gpu_b) in zip(rows, rows[1:]):
            after = label.endswith(" <")
            phase = label[:-2].rsplit("/", 1)[0] if after and "/" in label else label[:-2]
            phase = "/".join(part.rstrip("0123456789") for part in phase.split("/"))  # layers pooled
            phase += " (between)" if after else ""
            t = totals[phase]
            t[0] += host_b - host_a
            t[1] += gpu_b - gpu_a
            if gpu_b - host_b < CAUGHT_UP_MS:
                t[2] += gpu_b - gpu_a
            t[3] += 1
    n = len(steps)
    lines = ["host ms | GPU ms | GPU ms caught up | intervals | phase (per step; layers pooled)"]
    for phase, (host, gpu, caught, count) in sorted(totals.items(), key=lambda kv: -kv[1][2]):
        lines.append(f"{host / n:7.3f} | {gpu / n:7.3f} | {caught / n:7.3f} | {count / n:6.1f} | {phase}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    h200.engine_arguments(parser, steps=3)
    parser.add_argument("--fine", action="store_true", help="also mark the compressor's and indexer's parts")
    args = parser.parse_args()
    engine, step_ms = h200.warm_engine(args)
    marks = Marks(cuda=args.device.startswith("cuda"))
    instrument(marks, engine, args.fine)
    with torch.inference_mode():
        steps = [marks.step(engine.step) for _ in range(args.steps)]
    last = steps[-1]
    lines = [f"batch {args.batch}, context {args.context}{', faithful' if args.act_quant else ''}: step "
             f"{step_ms:.2f} ms unmarked, {last[-1][1]:.2f} ms host / {last[-1][2]:.2f} ms GPU to the last mark "
             f"(marked, {len(last)} marks)"]
    lines += summarize(steps)
    lines += ["", "the last step's marks: host ms | GPU ms | lag ms | mark"]
    lines += [f"{host:8.3f} | {gpu:8.3f} | {gpu - host:7.3f} | {label}" for label, host, gpu in last]
    text = "\n".join(lines)
    print(text, flush=True)
    name = f"timeline_B{args.batch}{'_act_quant' if args.act_quant else ''}{'_fine' if args.fine else ''}.txt"
    (h200.out_dir() / name).write_text(text + "\n")


if __name__ == "__main__":
    main()
