"""The parts every worker has: settings, identity, KV pool and transfer engine, the directory
registration with heartbeats, gRPC health and reflection, and the drain on SIGTERM.

Life cycle: open() loads the model and allocates the pool (health NOT_SERVING) -> start()
serves, registers and heartbeats (SERVING) -> drain(): NOT_SERVING, refuse new requests,
let running ones finish (bounded), unregister, stop the server, close the transports.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import pathlib
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..kvcache.directory import (DirectoryConfig, DirectoryUnavailable, OwnershipDirectory, WorkerInfo, WorkerLoad,
                                 WorkerRole, new_incarnation, open_directory)
from ..kvcache.layout import CacheLayout
from ..kvcache.pool import CachePool
from ..kvcache.transport import FaultPlan, MultiTransferEngine, TransportConfig, make_compatibility_hash, open_engines
from ..logs import log_event
from ..metrics import Metrics
from ..model.deepseek_v41 import DeepseekV41
from ..model.kernels.compile_watch import kernel_name, variant, watch
from ..model.layers.mhc import stream_dtype
from ..model.parallel import SINGLE
from .ranks import Ranks, load_model

log = logging.getLogger("dsflash.worker")
# one compile hook a process (`dsflash serve` runs its tiers in one) and its warm-ups under way
_COMPILES = {"watched": False, "warming": 0}


@contextlib.contextmanager
def warming_up():
    """Around a GPU worker's warm-up. From the first one's end each Triton compile is logged
    (kernel_compiled_while_serving, its kernel and seconds): a wait inside some request that the
    warm-ups should have spared it; not while a worker of the process is still warming up."""
    _COMPILES["warming"] += 1
    try:
        yield
    finally:
        _COMPILES["warming"] -= 1
        if not _COMPILES["watched"]:
            _COMPILES["watched"] = True
            watch(_log_compile)


def _log_compile(seconds: float, launch: str, compile: dict) -> None:
    if not _COMPILES["warming"]:  # the thread (engine-prefill, engine-decode) and variant: what a warm-up missed
        log_event(log, "kernel_compiled_while_serving", kernel=kernel_name(launch), seconds=round(seconds, 3),
                  thread=threading.current_thread().name, variant=variant(compile))

MAX_MESSAGE_BYTES = 64 << 20  # logits + DSpark taps of a handoff exceed gRPC's 4 MiB default
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    # Dead peers surface within seconds, not at the TCP timeout.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Server side: accept those pings on idle connections (the default, one per 5 minutes,
    # answers them with GOAWAY "too_many_pings").
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
]
# A worker's port is its own. With grpc's default SO_REUSEPORT a second server binds a port that
# one already listens on, and the kernel then splits the connections between the two (in a
# parallel test run a gateway's call reached another run's worker: "Method not found!"). Off,
# that bind fails.
SERVER_OPTIONS = GRPC_OPTIONS + [("grpc.so_reuseport", 0)]


KV_POOL_PLACES = ("auto", "device", "host")


@dataclass(frozen=True)
class WorkerSettings:
    role: str  # "prefill" | "decode"
    checkpoint: str
    host: str = "0.0.0.0"
    port: int = 0
    metrics_port: int = 0  # 0: no separate /metrics endpoint (dsflash serve renders one registry)
    advertise: str | None = None
    redis_url: str | None = None
    device: str = "cpu"
    devices: tuple[str, ...] = ()  # several: one rank each (tensor/expert parallel, ranks.py); [0] is `device`
    kv_transports: tuple[str, ...] = ("shm", "tcp")
    kv_pool: str = "auto"  # auto | device | host: where the model's KV buffers live (pool_device)
    pool_bytes: int = 256 << 20
    max_requests: int = 32
    page_entries: int = 64
    host_cache_bytes: int = 128 << 20  # decode: conversation caches kept after a turn
    heartbeat_s: float = 1.0
    worker_ttl_s: float = 5.0
    conversation_lease_s: float = 3600.0
    drain_grace_s: float = 30.0
    ced: bool = False  # prefill: bounded replay of the decoder layers
    weight_cache_bytes: int = 0  # prefill: weights kept re-encoded for the FP8 tensor cores
    act_quant: bool = False  # faithful mode: FP8-rounded GEMM inputs (ReferenceOps)
    spec_tokens: int = 5  # decode: DSpark drafts per step
    prefill_token_budget: int = 8192
    prefill_workers: tuple[str, ...] = ()  # decode: static prefill addresses (without Redis)
    prefill_timeout_s: float = 600.0
    transfer_timeout_s: float = 30.0
    faults: FaultPlan | None = field(default=None, compare=False)  # tests: inject transport faults

    def __post_init__(self):
        if self.kv_pool not in KV_POOL_PLACES:
            raise ValueError(f"kv_pool must be one of {KV_POOL_PLACES}, not {self.kv_pool!r}")
        if self.devices and self.devices[0] != self.device:
            raise ValueError(f"devices[0] ({self.devices[0]}) must be the worker's device ({self.device})")

    @property
    def advertise_host(self) -> str:
        if self.advertise:
            return self.advertise
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host


class WorkerRuntime:
    """Model, pool, transfer engine and directory for one worker process."""

    def __init__(self, settings: WorkerSettings, directory: OwnershipDirectory | None = None,
                 metrics: Metrics | None = None):
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.role = settings.role
        self.incarnation = new_incarnation()
        self.directory = directory or open_directory(DirectoryConfig(redis_url=settings.redis_url))
        self.health = health.aio.HealthServicer()
        self.model: DeepseekV41 | None = None
        self.pool: CachePool | None = None
        self.transfer: MultiTransferEngine | None = None
        self.layout: CacheLayout | None = None
        self.ranks: Ranks | None = None
        self.address = ""
        self.worker_id = ""
        self.draining = False
        self._heartbeat: asyncio.Task | None = None
        self.started_s = time.monotonic()
        # why the worker's engine thread died, or None (the worker points it at its EngineLoop)
        self.engine_failure: Callable[[], BaseException | None] = lambda: None

    def open(self, tier: str, model: DeepseekV41 | None = None) -> None:
        """Load the model (or share one already loaded in this process) and allocate the KV pool:
        in transfer-engine memory, or on the model's device with that memory as its host
        staging copy (pool_device; blocking)."""
        s = self.settings
        began = time.monotonic()
        if model is None:
            model = self._load(tier)
        self.model = model
        self.layout = CacheLayout.for_model(self.model.config, page_entries=s.page_entries)
        # Peers share caches only when they computed them alike: faithful mode's rounded GEMM
        # inputs give other bytes than the exact products (a mixed pair recomputes instead), and
        # so do its streams stored in bf16 (mhc.BF16_STREAMS).
        precision = "act-quant" if model.ops.act_quant else "exact"
        if stream_dtype(model.ops.act_quant) == torch.bfloat16:
            precision += "/bf16-streams"
        config = TransportConfig(compatibility_hash=make_compatibility_hash(
            self.layout.model_fingerprint, f"fp8-window/fp4-global/{precision}", self.layout.fingerprint()))
        self.transfer = open_engines(config, s.kv_transports, tcp_host=_bind_host(s.host),
                                     advertise_host=s.advertise_host, faults=s.faults)
        device = pool_device(s.kv_pool, self.model.device, s.pool_bytes)
        # A pool on the device seals no pages: a seal would need a device -> host copy of its
        # own, which costs more than the sums it saves (a send sums the staged bytes as it goes).
        self.pool = CachePool.sized(self.layout, s.pool_bytes, s.max_requests, self.transfer.allocate_segment,
                                    name=f"{s.role}-kv", sealed=None if device else self.transfer.sealed,
                                    device=device)
        if self.ranks is not None:
            self.ranks.attach(model, self.pool)
        m, pool = self.metrics, self.pool
        m.kv_free_bytes.labels(s.role).set_function(lambda: pool.free_page_count * pool.layout.page_bytes)
        m.degraded.labels(s.role).set_function(lambda: float(bool(getattr(self.directory, "is_degraded", False))))
        if s.metrics_port:
            m.serve(s.metrics_port, _bind_host(s.host))
        log_event(log, "worker_loaded", role=s.role, checkpoint=s.checkpoint, seconds=round(time.monotonic() - began, 2),
                  pool_pages=self.pool.num_pages, pool_slots=self.pool.num_slots, pool_device=self.pool.device,
                  pool_staging="host" if self.pool.is_mirrored else "none",
                  staging_pinned=bool(self.pool.mirror is not None and self.pool.mirror.pinned),
                  transports=",".join(s.kv_transports), ranks=len(s.devices) or 1, precision=precision,
                  ops="kernels" if model.ops.fast else "reference")

    def _load(self, tier: str) -> DeepseekV41:
        """This rank's share of the model; with several devices, the other ranks start first."""
        s, parallel = self.settings, SINGLE
        if len(s.devices) > 1:
            self.ranks = Ranks(list(s.devices), s.checkpoint, tier, s.act_quant, s.weight_cache_bytes)
            parallel = self.ranks.parallel
        return load_model(s.checkpoint, tier, s.device, parallel, progress=True, act_quant=s.act_quant,
                          weight_cache_bytes=s.weight_cache_bytes)

    def add_standard_services(self, server: grpc.aio.Server, service_names: list[str]) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = service_names + [health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, server)

    async def start(self, server: grpc.aio.Server, port: int, service_names: list[str]) -> None:
        host = self.settings.advertise_host
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # IPv6 pod IPs
        self.worker_id = f"{self.settings.role}@{self.address}"
        for name in service_names + [""]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        await self._register()
        self._heartbeat = asyncio.create_task(self._heartbeat_loop())
        log_event(log, "worker_ready", role=self.settings.role, worker_id=self.worker_id, address=self.address,
                  incarnation=self.incarnation)

    def info(self, load: WorkerLoad) -> WorkerInfo:
        return WorkerInfo(worker_id=self.worker_id, role=WorkerRole(self.settings.role), address=self.address,
                          incarnation=self.incarnation, transports=tuple(self.settings.kv_transports), load=load)

    def directory_degraded(self) -> bool:
        """True while Redis is unreachable and the directory answers from local state."""
        return bool(getattr(self.directory, "is_degraded", False))

    def load(self) -> WorkerLoad:  # replaced by the worker
        return WorkerLoad()

    def record_transfer(self, nbytes: int, seconds: float, transport: str) -> None:
        self.metrics.transfer_bytes.labels(self.role, transport).inc(nbytes)
        self.metrics.transfer_seconds.labels(self.role, transport).observe(seconds)

    def record_transfer_failure(self) -> None:
        self.metrics.transfer_failures.labels(self.role).inc()

    async def _register(self) -> None:
        try:
            await self.directory.register_worker(self.info(self.load()), self.settings.worker_ttl_s)
        except DirectoryUnavailable as exc:
            log.warning("directory unavailable at registration (%s); retrying with the heartbeats", exc)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            failure = self.engine_failure()
            if failure is not None:
                await self._retire(failure)
                return
            try:
                alive = await self.directory.heartbeat(self.worker_id, self.load(), incarnation=self.incarnation)
                if not alive:
                    await self._register()
            except DirectoryUnavailable:
                pass  # ResilientDirectory degrades by itself; a bare one retries next beat
            except Exception:
                log.exception("heartbeat failed")

    async def _retire(self, failure: BaseException) -> None:
        """The engine thread is gone (its calls fail at once): stop heartbeating, answer
        NOT_SERVING (a liveness probe restarts the pod) and leave the registry, so that
        gateways and decode workers stop choosing this worker."""
        log_event(log, "worker_engine_stopped", role=self.settings.role, worker_id=self.worker_id,
                  reason=str(failure))
        await self.health.enter_graceful_shutdown()
        await self._unregister()

    async def _unregister(self) -> None:
        try:
            await self.directory.unregister_worker(self.worker_id, self.incarnation)
        except Exception as exc:  # the registration expires by its TTL anyway
            log.warning("unregister failed: %s", exc)

    async def drain(self, server: grpc.aio.Server, in_flight, service_names: list[str]) -> None:
        """SIGTERM: stop taking work, let `in_flight()` reach 0 (bounded), unregister, stop."""
        if self.draining:
            return
        self.draining = True
        log_event(log, "worker_drain", role=self.settings.role, worker_id=self.worker_id, in_flight=in_flight())
        await self.health.enter_graceful_shutdown()
        # Leave the registry first, so gateways stop routing here while running work finishes.
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        await self._unregister()
        deadline = time.monotonic() + self.settings.drain_grace_s
        while in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await server.stop(grace=1.0)
        log_event(log, "worker_stopped", role=self.settings.role, worker_id=self.worker_id)

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        if self.ranks is not None:
            self.ranks.close()
        if self.transfer is not None:
            self.transfer.close()
        await self.directory.close()


async def admit_tokens(runtime: WorkerRuntime, token_ids, context: grpc.aio.ServicerContext) -> list[int]:
    """The common gate of a worker RPC: not while draining, and only ids the model knows."""
    if runtime.draining:
        await context.abort(grpc.StatusCode.UNAVAILABLE, f"{runtime.role} worker is draining")
    tokens = list(token_ids)
    vocab = runtime.model.config.vocab_size
    if not tokens or any(t >= vocab for t in tokens):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"token_ids must be a non-empty list in [0, {vocab})")
    return tokens


def pool_device(kv_pool: str, model_device: torch.device, pool_bytes: int) -> torch.device | None:
    """Where the pool's buffers go: the model's device (the transfer segments then are their
    host staging copy), or None, the segments themselves. `auto` puts a GPU model's pool on its
    GPU, whose kernels read it in place; with a host pool every layer would copy the cache over
    per step. `device` on a CPU worker keeps a second host copy: a test of the staging only."""
    if kv_pool == "host" or (kv_pool == "auto" and model_device.type != "cuda"):
        return None
    if model_device.type == "cuda":
        free_bytes, _ = torch.cuda.mem_get_info(model_device)
        if pool_bytes > free_bytes:
            raise RuntimeError(f"a {pool_bytes}-byte KV pool does not fit in the {free_bytes} bytes free on "
                               f"{model_device}: lower --pool-bytes, or pass --kv-pool host")
    return model_device


def _bind_host(host: str) -> str:
    return "0.0.0.0" if host in ("", "::") else host


def listening_server(settings: WorkerSettings) -> tuple[grpc.aio.Server, int]:
    """A worker's gRPC server, bound to its settings' host and port (0: one the kernel picks),
    and the port bound. A port another server holds is an OSError that says so."""
    server = grpc.aio.server(options=SERVER_OPTIONS)
    try:
        return server, server.add_insecure_port(f"{settings.host}:{settings.port}")
    except RuntimeError as e:  # grpc says only "Failed to bind"
        raise OSError(errno.EADDRINUSE, f"the {settings.role} worker cannot listen on {settings.host}:{settings.port}:"
                                        " the port is taken, or the host is not this machine's") from e


def free_port() -> int:
    """A port to listen on, chosen below the kernel's ephemeral range: a port the kernel hands
    out (an outgoing connection, another server's port 0) can then never take it between our
    choosing it and the server binding it."""
    low = _ephemeral_low()
    for port in random.sample(range(max(1024, low - 10000), low), 64):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # crowded: fall back to any free port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


async def serve_until_signal(server: grpc.aio.Server, drain) -> None:
    """Run until SIGTERM/SIGINT, then call drain() once."""
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.create_task(server.wait_for_termination())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        await drain()
    waiter.cancel()
