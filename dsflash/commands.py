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

    out = write_checkpoint(args.out, args.preset, args.seed)
    Checkpoint(out).validate()
    log.info("wrote %s checkpoint (seed %d) to %s", args.preset, args.seed, out)
    return 0


def logits(args) -> int:
    import torch
    from safetensors.torch import save_file

    from dsflash.model.deepseek_v41 import DeepseekV41
    from dsflash.model.runner import parse_mode, prompt_logits

    try:
        ids = [int(x) for x in args.ids.split(",") if x.strip()]
        parse_mode(args.mode)
    except ValueError as exc:
        print(f"dsflash logits: {exc}", file=sys.stderr)
        return 2
    if not ids:
        print("dsflash logits: --ids is empty", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("dsflash logits: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    model = DeepseekV41.from_checkpoint(args.checkpoint, device=args.device, act_quant=args.act_quant, progress=True)
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


def _not_yet(what: str, issue: int):
    def handler(args) -> int:
        print(f"dsflash {what}: not implemented yet (issue {issue})", file=sys.stderr)
        return 2

    return handler


serve = _not_yet("serve", 7)
gateway = _not_yet("gateway", 7)
prefill = _not_yet("prefill", 6)
decode = _not_yet("decode", 6)
