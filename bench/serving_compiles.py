"""Which Triton kernels `dsflash serve` compiles while serving a checkpoint on a GPU: the
warm-ups should have compiled every variant its requests take (the GPU worker tests do the
same on the tiny preset, whose 64-channel heads never take some of the release shapes' forms,
the faithful prefill's queries in halves among them).

    python bench/serving_compiles.py --make bench /tmp/bench-ckpt --act-quant
    python bench/serving_compiles.py --checkpoint DIR [--act-quant] [--lengths 37,1000,9001]

--make writes a random checkpoint of that preset first, drawn on the GPU. Then, after the
warm-ups: one prompt of each length alone (a prompt past the prefill budget goes in chunks,
each past the last's prefix), the first conversation's next turn (the prefill worker extends
the decode worker's cache), and three prompts at once (a decode batch of 3). Prints each
request's seconds and usage and every kernel_compiled_while_serving line; exits 1 on any.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import pathlib
import re
import sys
import time

import httpx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from tests.support.gateway_harness import ServeProcess  # noqa: E402


# what sets a preset's depth and which layer is of which kind
LAYER_KEYS = ("num_hidden_layers", "compress_ratios", "kv_source_layer_ids", "index_source_layer_ids",
              "candidate_source_layer_id", "engram_layer_ids", "dspark_target_layer_ids")


def shallow_config(preset: str) -> dict:
    from dsflash.model.checkpoint_writer import PRESETS, preset_config

    config = preset_config(preset)
    config["text_config"].update({key: PRESETS["tiny"][key] for key in LAYER_KEYS})
    return config


def prompt_of(length: int, seed: int) -> list[int]:
    return [(7919 * i + 104729 * seed) % 120000 + 3 for i in range(length)]


def complete(url: str, prompt: list[int], conversation: str, max_tokens: int = 4) -> dict:
    began = time.monotonic()
    reply = httpx.post(f"{url}/v1/completions", timeout=600,
                       json={"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                             "ignore_eos": True, "return_token_ids": True, "user": conversation})
    reply.raise_for_status()
    body = reply.json()
    usage = body["usage"]
    print(f"request {conversation}: prompt {len(prompt)} tokens, {time.monotonic() - began:.2f} s, "
          f"cached {usage['prompt_tokens_details']['cached_tokens']}, completion {usage['completion_tokens']}",
          flush=True)
    return body


def main() -> int:
    parser = argparse.ArgumentParser()
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint")
    source.add_argument("--make", nargs=2, metavar=("PRESET", "DIR"))
    parser.add_argument("--shallow", action="store_true",
                        help="with --make: the preset's widths at the tiny preset's depth and layer kinds (12 "
                             "layers: a fraction of the bytes to write and load, every kind of layer still)")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (nothing compiles)")
    parser.add_argument("--act-quant", action="store_true")
    parser.add_argument("--lengths", default="37,40,45,300,400,513,700,1000,1025,2000,5000,9001")
    parser.add_argument("--log", default="serve.log")
    parser.add_argument("--ready-timeout-s", type=float, default=600)
    args = parser.parse_args()

    checkpoint = args.checkpoint
    if args.make:
        from dsflash.model.checkpoint_writer import write_checkpoint

        began = time.monotonic()
        checkpoint = write_checkpoint(args.make[1], args.make[0], device=args.device,
                                      config_dict=shallow_config(args.make[0]) if args.shallow else None)
        print(f"wrote the {args.make[0]} checkpoint in {time.monotonic() - began:.1f} s", flush=True)
    log = pathlib.Path(args.log)
    began = time.monotonic()
    serve = ServeProcess(checkpoint, log, ready_timeout_s=args.ready_timeout_s,
                         extra=["--device", args.device] + (["--act-quant"] if args.act_quant else []))
    try:
        print(f"serve ready in {time.monotonic() - began:.1f} s", flush=True)
        for line in re.findall(r".*(?:prefill_warm_up|warmed up).*", log.read_text()):
            print(line[:300])
        lengths = [int(n) for n in args.lengths.split(",")]
        prompts = [prompt_of(n, i) for i, n in enumerate(lengths)]
        first = complete(serve.url, prompts[0], "c0")
        for i, prompt in enumerate(prompts[1:], 1):
            complete(serve.url, prompt, f"c{i}")
        held = prompts[0] + first["choices"][0]["token_ids"]
        complete(serve.url, held + prompt_of(23, 99), "c0")
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda i: complete(serve.url, prompt_of(50 + 17 * i, 200 + i), f"b{i}", 24), range(3)))
    finally:
        serve.close()
    compiles = re.findall(r".*kernel_compiled_while_serving.*", log.read_text())
    print(f"{len(compiles)} kernel compiles while serving")
    for line in compiles:
        print(line[:600])
    return 1 if compiles else 0


if __name__ == "__main__":
    sys.exit(main())
