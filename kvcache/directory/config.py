"""`DirectoryConfig`, built once at the entry point from flags (--redis-url and its
DSFLASH_REDIS_URL twin), and `open_directory`, the one place that picks an implementation."""

from __future__ import annotations

from dataclasses import dataclass

from .base import OwnershipDirectory
from .events import DEFAULT_MAX_QUEUED_EVENTS
from .keys import DEFAULT_KEY_PREFIX, KeyLayout
from .local import LocalDirectory
from .records import DEFAULT_EPOCH_RETENTION_S
from .redis_directory import DEFAULT_OP_TIMEOUT_S, RedisDirectory
from .resilient import DEFAULT_RETRY_INITIAL_S, DEFAULT_RETRY_MAX_S, ResilientDirectory


@dataclass(frozen=True)
class DirectoryConfig:
    redis_url: str | None = None  # None: everything in this process (`dsflash serve` alone)
    key_prefix: str = DEFAULT_KEY_PREFIX
    op_timeout_s: float = DEFAULT_OP_TIMEOUT_S  # longest any Redis call may take
    retry_initial_s: float = DEFAULT_RETRY_INITIAL_S  # first reconnect attempt after an outage
    retry_max_s: float = DEFAULT_RETRY_MAX_S  # backoff ceiling between attempts
    epoch_retention_s: float = DEFAULT_EPOCH_RETENTION_S
    max_queued_events: int = DEFAULT_MAX_QUEUED_EVENTS  # per subscriber, before it is cut off

    def __post_init__(self):
        if not 0 < self.op_timeout_s <= 10:
            raise ValueError(f"op_timeout_s must be in (0, 10], got {self.op_timeout_s}")
        if not 0 < self.retry_initial_s <= self.retry_max_s:
            raise ValueError("need 0 < retry_initial_s <= retry_max_s")
        if self.epoch_retention_s <= 0 or self.max_queued_events <= 0:
            raise ValueError("epoch_retention_s and max_queued_events must be positive")


def open_directory(config: DirectoryConfig) -> OwnershipDirectory:
    """A LocalDirectory without a Redis URL, else Redis behind the local fallback. Connects
    lazily: a Redis that is down at start-up just means starting degraded."""
    if config.redis_url is None:
        return LocalDirectory(epoch_retention_s=config.epoch_retention_s, max_queued_events=config.max_queued_events)
    remote = RedisDirectory.from_url(
        config.redis_url,
        keys=KeyLayout(config.key_prefix),
        op_timeout_s=config.op_timeout_s,
        epoch_retention_s=config.epoch_retention_s,
    )
    local = LocalDirectory(epoch_retention_s=config.epoch_retention_s, max_queued_events=config.max_queued_events)
    return ResilientDirectory(
        remote,
        local=local,
        retry_initial_s=config.retry_initial_s,
        retry_max_s=config.retry_max_s,
        max_queued_events=config.max_queued_events,
    )
