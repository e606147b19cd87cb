"""Where a served model's weights live after loading: host memory against device memory.

A worker's rank loads its share straight onto its GPU (model/weights.py: Checkpoint.load with
the device), stacks the routed experts and frees their per-expert tensors (TritonOps
.stack_all_experts), so host memory should grow by far less than the weights (the Engram
tables are mapped from the shards, not copied, and counted apart). Each figure is printed
beside its limit: the host's growth and the device's beside the weight bytes (a host copy
would add them once more; the device should hold them once), the load time beside the
weights' bytes at the measured host-to-device copy rate.

    python bench/load_memory.py [--preset small] [--checkpoint DIR] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

import torch


def rss_bytes() -> tuple[int, int]:
    """This process's resident memory: anonymous pages (what a host copy of the weights costs
    for real) and file pages (shards read through their maps, the mapped Engram tables: page
    cache, reclaimable, shared between ranks)."""
    fields = dict(line.split(":", 1) for line in pathlib.Path("/proc/self/status").read_text().splitlines()
                  if ":" in line)
    return tuple(int(fields[name].split()[0]) * 1024 for name in ("RssAnon", "RssFile"))


def host_loaded(path: pathlib.Path, device: torch.device):
    """The way workers loaded before: weights in host memory, each copied to the GPU by the fast
    path when first used (one forward uses them all)."""
    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.runner import prompt_logits
    from dsflash.model.weights import Checkpoint

    model = DeepseekV41(Checkpoint(path).load(progress=False), tokenizer_json=path / "tokenizer.json", device=device)
    model.use_kernels()
    with torch.inference_mode():
        prompt_logits(model, torch.arange(3, 40))
    return model


def h2d_rate(device: torch.device) -> float:
    """Bytes per second of a 1 GiB pageable host-to-device copy (what loading a shard does)."""
    host = torch.empty(1 << 30, dtype=torch.uint8)
    host.fill_(1)
    torch.empty(1, device=device).copy_(torch.ones(1))
    began = time.perf_counter()
    host.to(device)
    torch.cuda.synchronize(device)
    return host.numel() / (time.perf_counter() - began)


def main() -> None:
    from dsflash.model.checkpoint_writer import write_checkpoint
    from dsflash.model.parallel import SINGLE
    from dsflash.model.tensor_spec import ROWS_FP8
    from dsflash.model.weights import Checkpoint
    from dsflash.serving.ranks import load_model

    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--checkpoint", help="an existing checkpoint directory (else one of --preset is written)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--host-loaded", action="store_true", help="load the way workers did before (host copy)")
    args = parser.parse_args()
    device = torch.device(args.device)
    path = pathlib.Path(args.checkpoint or tempfile.mkdtemp(prefix="dsflash-load-"))
    if not args.checkpoint:
        write_checkpoint(path, args.preset)
    ckpt = Checkpoint(path)
    sizes = {"weights": 0, "engram": 0}
    for spec in ckpt.specs():
        for key in spec.stored(ckpt.config.quant.weight_block):
            sizes["engram" if spec.fmt == ROWS_FP8 else "weights"] += ckpt.stored_bytes(key)
    rate = h2d_rate(device) if device.type == "cuda" else float("inf")
    host0 = rss_bytes()
    gpu0 = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    began = time.perf_counter()
    model = host_loaded(path, device) if args.host_loaded else load_model(str(path), "all", device, SINGLE)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - began
    host, page_cache = (after - before for after, before in zip(rss_bytes(), host0))
    gpu = (torch.cuda.memory_allocated(device) - gpu0) if device.type == "cuda" else 0
    gib = 2 ** 30
    report = {
        "preset": args.preset if not args.checkpoint else str(path),
        "path": "host-loaded (before)" if args.host_loaded else "served (load_model)",
        "weights_GiB": sizes["weights"] / gib, "engram_tables_GiB (mapped)": sizes["engram"] / gib,
        "host_anon_growth_GiB": host / gib, "host_anon_vs_weights": host / sizes["weights"],
        "host_file_pages_growth_GiB": page_cache / gib,
        "device_GiB": gpu / gib, "device_vs_weights": gpu / sizes["weights"] if gpu else None,
        "load_s": seconds, "h2d_limit_s": sizes["weights"] / rate,
        "per_expert_tensors_left": sum(".ffn.experts." in n for n in model.ops.weights.names()),
    }
    for key, value in report.items():
        print(f"{key:32s} {value if not isinstance(value, float) else round(value, 3)}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
