"""A worker's indexer warm-up (indexer.warm_up: the top-k's and the scoring tiles' variants) on
the bench preset, timed on the Triton cache it is given, with its launches on --threads
threads (compile_threads.launch_all; 1: one after another, as before the forty-third
session). Run each in a fresh process; --empty-cache gives it a new, empty Triton cache:

    python bench/indexer_warm_up.py --empty-cache --threads 1
    python bench/indexer_warm_up.py --empty-cache --threads 8
"""
import argparse
import os
import sys
import tempfile
import time

if "--empty-cache" in sys.argv:  # before triton is imported
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton-empty-")

import torch

from dsflash.kvcache.layout import CacheLayout
from dsflash.model.checkpoint_writer import preset_config
from dsflash.model.config import ModelConfig
from dsflash.model.kernels import compile_threads
from dsflash.model.layers import indexer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=compile_threads.COMPILE_THREADS)
    parser.add_argument("--empty-cache", action="store_true", help="a new, empty Triton cache")
    parser.add_argument("--plain", action="store_true", help="a plain worker's (faithful: also the FP8 tiles)")
    args = parser.parse_args()
    compile_threads.COMPILE_THREADS = args.threads
    config = ModelConfig.from_dict(preset_config("bench"))
    layout = CacheLayout.for_model(config, page_entries=256)
    device = torch.device("cuda")
    torch.zeros(1, device=device)  # the CUDA context, not timed
    began = time.perf_counter()  # indexer.warm_up, its launch list kept to count
    launches = indexer.warm_up_launches(device, config, layout, faithful=not args.plain)
    compile_threads.launch_all(device, launches)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    cached = len(os.listdir(os.environ["TRITON_CACHE_DIR"])) if "TRITON_CACHE_DIR" in os.environ else "?"
    print(f"[indexer warm-up] {len(launches)} launches on {args.threads} threads ({os.cpu_count()} CPUs): "
          f"{seconds:.2f} s, {cached} entries in the Triton cache", flush=True)


if __name__ == "__main__":
    main()
