"""The kernel warm-ups of a GPU worker that no warm-up prompt reaches, which each rank runs for
itself: the indexer's top-k and score tiles for long prompts (both tiers) and the route plan's
every batch size (prefill). A worker's first rank runs them before its prompts' warm-ups; the
other ranks of a multi-GPU worker (ranks.py) run them beside those, before they follow its
first call. Without them a follower met these kernels first inside a user's long prompt (a
disk-cache load each, where rank 0 had compiled them; a compile where not), with rank 0 waiting
on it at the next collective."""

from __future__ import annotations

import torch

from ..kvcache.layout import CacheLayout
from ..model.kernels.compile_threads import launch_all
from ..model.layers import indexer, moe

TIERS = ("prefill", "decode")


def warm_up_kernels(model, layout: CacheLayout, tier: str) -> None:
    """Compile (or load) `tier`'s rank-local kernels on the model's GPU; nothing on a CPU."""
    assert tier in TIERS, tier
    if model.device.type != "cuda":
        return
    with torch.cuda.device(model.device):
        indexer.warm_up(model.device, model.config, layout, faithful=model.ops.act_quant)
        if tier == "prefill":  # any prompt's route plan (a decode worker's graphs capture its own)
            launch_all(model.device, moe.warm_up_launches(model.ops, model.config))
