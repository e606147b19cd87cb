"""Handlers of the `dsflash` subcommands; each takes the parsed arguments."""

from __future__ import annotations

import logging
import os
import pathlib
import sys

log = logging.getLogger("dsflash")


def cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "dsflash"


def default_checkpoint() -> pathlib.Path:
    """The cached random `tiny` checkpoint `dsflash serve` uses when none is given (made once)."""
    from dsflash.model.checkpoint_writer import write_checkpoint

    path = cache_dir() / "checkpoints" / "tiny-seed0"
    if not (path / "model.safetensors.index.json").exists():
        log.info("creating the default tiny checkpoint in %s", path)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        write_checkpoint(tmp, "tiny", seed=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            tmp.rename(path)
        except OSError:  # another process made it first
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return path


def make_checkpoint(args) -> int:
    from dsflash.model.checkpoint_writer import write_checkpoint
    from dsflash.model.weights import Checkpoint

    out = write_checkpoint(args.out, args.preset, args.seed, device=args.device)
    Checkpoint(out).validate()
    log.info("wrote %s checkpoint (seed %d) to %s", args.preset, args.seed, out)
    return 0


def logits(args) -> int:
    import torch
    from safetensors.torch import save_file

    from dsflash.model import deepseek_v41
    from dsflash.model.runner import parse_mode, prompt_logits

    try:
        ids = [int(x) for x in args.ids.split(",") if x.strip()]
        kind, size = parse_mode(args.mode)
    except ValueError as exc:
        print(f"dsflash logits: {exc}", file=sys.stderr)
        return 2
    if not ids:
        print("dsflash logits: --ids is empty", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("dsflash logits: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    most = deepseek_v41.MAX_KERNEL_ROWS
    if args.device == "cuda" and (len(ids) if kind == "full" else size) > most:
        print(f"dsflash logits: the GPU kernels take at most {most} tokens a forward: use --mode chunked:N "
              f"with N <= {most}", file=sys.stderr)
        return 2
    model = deepseek_v41.DeepseekV41.from_checkpoint(args.checkpoint, device=args.device, act_quant=args.act_quant,
                                                     progress=True)
    vocab = model.config.vocab_size
    bad = [i for i in ids if not 0 <= i < vocab]
    if bad:
        print(f"dsflash logits: token ids out of range [0, {vocab}): {bad[:10]}", file=sys.stderr)
        return 2
    with torch.inference_mode():
        out = prompt_logits(model, torch.tensor(ids), args.mode)
    save_file({"logits": out.float().cpu().contiguous()}, args.out)
    log.info("wrote logits %s to %s", list(out.shape), args.out)
    return 0


def _list(text: str | None) -> tuple[str, ...]:
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def fault_plan(text: str | None):
    """'corrupt:100,count:2' -> FaultPlan (tests inject transport faults through the CLI)."""
    if not text:
        return None
    from dsflash.kvcache.transport import FaultPlan

    fields = dict(part.split(":", 1) for part in _list(text))
    names = {"corrupt": ("corrupt_at_byte", int), "delay": ("delay_s", float), "drop": ("drop_after_bytes", int),
             "count": ("max_faults", int)}
    unknown = set(fields) - set(names)
    if unknown:
        raise SystemExit(f"--inject-kv-fault: unknown fault {sorted(unknown)}")
    return FaultPlan(**{names[k][0]: names[k][1](v) for k, v in fields.items()})


def worker_settings(args, role: str):
    """WorkerSettings from the parsed flags (the edge where configuration is read)."""
    from dsflash.serving.worker import WorkerSettings

    devices = tuple(f"cuda:{gpu}" for gpu in _list(args.gpus)) if args.gpus else ("cpu",) * (args.ranks or 1)
    if args.gpus and args.ranks and args.ranks != len(devices):
        raise SystemExit(f"--ranks {args.ranks} with {len(devices)} --gpus: give one rank per GPU")
    if args.drain_grace_s < 0:
        raise SystemExit(f"--drain-grace-s {args.drain_grace_s}: a time to wait, at least 0")
    if args.prefill_token_budget < 1:
        raise SystemExit(f"--prefill-token-budget {args.prefill_token_budget}: at least 1 token a step")
    if args.gpus:
        from dsflash.model.deepseek_v41 import MAX_KERNEL_ROWS

        if args.prefill_token_budget > MAX_KERNEL_ROWS:
            raise SystemExit(f"--prefill-token-budget {args.prefill_token_budget}: the GPU kernels take at most "
                             f"{MAX_KERNEL_ROWS} tokens a step")
    extra = {}
    if role == "prefill":
        extra.update(ced=args.ced, weight_cache_bytes=args.weight_cache_bytes)
    else:
        extra.update(spec_tokens=args.spec_tokens, host_cache_bytes=args.host_cache_bytes,
                     prefill_workers=_list(args.prefill))
    return WorkerSettings(role=role, checkpoint=args.checkpoint, host=args.host, port=args.port,
                          metrics_port=args.metrics_port,
                          advertise=args.advertise, redis_url=args.redis_url, device=devices[0],
                          devices=devices if len(devices) > 1 else (),
                          kv_transports=_list(args.kv_transports), kv_pool=args.kv_pool, pool_bytes=args.pool_bytes,
                          max_requests=args.max_requests, prefill_token_budget=args.prefill_token_budget,
                          act_quant=args.act_quant, drain_grace_s=args.drain_grace_s,
                          faults=fault_plan(args.inject_kv_fault), **extra)


def prefill(args) -> int:
    import asyncio

    from dsflash.prefill_worker.server import serve as serve_prefill

    asyncio.run(serve_prefill(worker_settings(args, "prefill")))
    return 0


def decode(args) -> int:
    import asyncio

    from dsflash.decode_worker.server import serve as serve_decode

    asyncio.run(serve_decode(worker_settings(args, "decode")))
    return 0


def serve(args) -> int:
    from dsflash.serve_all import main as serve_main

    return serve_main(args)


def gateway(args) -> int:
    import asyncio

    from dsflash.gateway.endpoints import GatewaySettings
    from dsflash.gateway.server import run

    keys = _list(args.api_key or os.environ.get("DSFLASH_API_KEYS"))
    asyncio.run(run(args, GatewaySettings(model_name=args.model_name, api_keys=keys,
                                          reasoning_field=args.reasoning_field)))
    return 0
