"""A worker split over several ranks (`--gpus 0,1,...`): the worker process is rank 0, and
ranks 1..W-1 are child processes that each load their share of the checkpoint (parallel.py),
keep a KV pool shaped like rank 0's, and run the calls rank 0 announces (model/lockstep.py).

A rank that dies takes the worker with it: rank 0 would otherwise wait forever in its next
collective. The watchdog ends the process, so health checks and the directory's TTL let the
gateway and peers route around it (a recompute elsewhere, never a hang). Children die with
rank 0 (PR_SET_PDEATHSIG, and the pipe's end).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import threading
import time

import torch

from ..kvcache.layout import CacheLayout
from ..kvcache.pool import CachePool, plain_allocator
from ..logs import current_setup, log_event, setup_logging
from ..model.deepseek_v41 import DeepseekV41
from ..model.lockstep import Leader, follow
from ..model.parallel import Parallel, check_divisible, check_fits, init_parallel
from ..model.weights import Checkpoint
from .kernel_warm_ups import warm_up_kernels

log = logging.getLogger("dsflash.ranks")
LOST_RANK_EXIT = 70  # the worker's exit status when one of its ranks died


class Ranks:
    def __init__(self, devices: list[str], checkpoint: str, tier: str, act_quant: bool = False,
                 weight_cache_bytes: int = 0):
        """Start ranks 1..W-1 on devices[1:] and join their process group as rank 0 (blocks
        until every rank joined)."""
        from .worker import free_port

        world = len(devices)
        ckpt = Checkpoint(checkpoint)
        check_divisible(ckpt.config, world)  # before any child loads anything
        # rank 0's GPU as well (each child checks its own too): a refusal here is this
        # process's error, not a child's death the watchdog reports as a lost rank
        check_fits(ckpt.config, world, tier, torch.device(devices[0]), ckpt.spec_bytes)
        ctx = mp.get_context("spawn")  # CUDA cannot be forked
        rendezvous = f"tcp://127.0.0.1:{free_port()}"
        self.processes, conns = [], []
        self._closing = False
        self.model: DeepseekV41 | None = None
        for rank in range(1, world):
            ours, theirs = ctx.Pipe()
            process = ctx.Process(target=_rank_main, name=f"dsflash-rank{rank}", daemon=True,
                                  args=(rank, world, rendezvous, devices[rank], checkpoint, tier, act_quant,
                                        weight_cache_bytes, theirs, current_setup()))
            process.start()
            theirs.close()
            self.processes.append(process)
            conns.append(ours)
        threading.Thread(target=self._watch, name="rank-watchdog", daemon=True).start()
        device = torch.device(devices[0])
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.parallel: Parallel = init_parallel(0, world, rendezvous, device)
        self.leader = Leader(conns, device, on_failure=lambda: self._end("rank0", "a call failed on rank 0"))

    def attach(self, model: DeepseekV41, pool: CachePool) -> None:
        """The ranks allocate pools shaped like `pool`; from now on the model announces its calls.
        Returns once every rank is ready (loaded, pool allocated): the worker serves after."""
        for conn in self.leader.conns:
            conn.send((pool.layout.page_entries, pool.num_pages, pool.num_slots, pool.name))
        for conn in self.leader.conns:
            conn.recv()  # "ready"; a rank that dies first ends this process (the watchdog)
        self.leader.attach(pool)
        model.leader = self.leader
        self.model = model

    def close(self, timeout_s: float = 10.0) -> None:
        self._closing = True
        self.leader.stop()
        for process in self.processes:
            process.join(timeout_s)
            if process.is_alive():
                process.kill()
        if self.model is not None:
            self.model.release_graphs()  # NCCL's teardown at exit waits on collectives they captured

    def _watch(self) -> None:
        sentinels = {p.sentinel: p for p in self.processes}
        ready = mp.connection.wait(list(sentinels))
        if self._closing:
            return
        process = sentinels[ready[0]]
        process.join(1.0)
        self._end(process.name, f"exit code {process.exitcode}")

    def _end(self, rank: str, why: str) -> None:
        """The ranks are out of step for good: end the worker rather than let it hang."""
        log_event(log, "rank_lost", rank=rank, why=why, action="exiting: the model cannot run without every rank")
        logging.shutdown()
        os._exit(LOST_RANK_EXIT)


def load_model(checkpoint: str, tier: str, device: str | torch.device, parallel: Parallel,
               progress: bool = False, act_quant: bool = False, weight_cache_bytes: int = 0) -> DeepseekV41:
    """One rank's share of the checkpoint, on the Triton fast path on a GPU: loaded straight
    onto it, the experts stacked and their per-expert tensors freed (no host copy is kept);
    with weight_cache_bytes, that much of its weights kept re-encoded for faithful prefill
    (TritonOps.keep_encoded_weights)."""
    model = DeepseekV41.from_checkpoint(checkpoint, tier=tier, device=device, progress=progress, parallel=parallel,
                                        act_quant=act_quant)
    if model.device.type == "cuda":
        model.use_kernels(keep_unpacked=False)
        model.ops.keep_encoded_weights(weight_cache_bytes)
    return model


def _rank_main(rank: int, world: int, rendezvous: str, device: str, checkpoint: str, tier: str, act_quant: bool,
               weight_cache_bytes: int, conn, logging_setup: tuple[str, str]) -> None:
    _die_with_parent()
    setup_logging(*logging_setup)
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = load_model(checkpoint, tier, device, init_parallel(rank, world, rendezvous, device), act_quant=act_quant,
                       weight_cache_bytes=weight_cache_bytes)
    try:
        page_entries, num_pages, num_slots, name = conn.recv()
    except EOFError:
        return
    layout = CacheLayout.for_model(model.config, page_entries=page_entries)
    pool = CachePool(layout, num_pages, num_slots, plain_allocator(device), name=name)  # same segment names
    pool.follows_rank0 = True
    log_event(log, "rank_ready", rank=rank, world=world, device=device, pool_pages=num_pages)
    conn.send("ready")
    if device.type == "cuda":  # beside rank 0's own warm-ups: its first announced call waits on these
        began = time.monotonic()
        warm_up_kernels(model, layout, tier)
        log_event(log, "rank_kernels_warmed_up", rank=rank, seconds=round(time.monotonic() - began, 2))
    follow(model, pool, conn)
    logging.shutdown()
    os._exit(0)  # rank 0 is done with us: skip the process group's teardown (see Ranks.close)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when rank 0 dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
