"""The ownership directory: which decode worker holds each conversation's KV cache, which
workers are alive, and which conversation holds the longest cached prefix of a prompt.
Contract in `base.py`, Redis key layout in `keys.py`."""

from .base import DirectoryUnavailable, OwnershipDirectory, Subscription, SubscriptionLost
from .config import DirectoryConfig, open_directory
from .keys import KeyLayout
from .local import LocalDirectory
from .records import (
    EventKind,
    LiveOwner,
    OwnershipEvent,
    OwnershipRecord,
    PrefixEntry,
    PrefixMatch,
    WorkerInfo,
    WorkerLoad,
    WorkerRole,
    new_incarnation,
)
from .redis_directory import RedisDirectory
from .resilient import ResilientDirectory

__all__ = [
    "DirectoryConfig",
    "DirectoryUnavailable",
    "EventKind",
    "KeyLayout",
    "LiveOwner",
    "LocalDirectory",
    "OwnershipDirectory",
    "OwnershipEvent",
    "OwnershipRecord",
    "PrefixEntry",
    "PrefixMatch",
    "RedisDirectory",
    "ResilientDirectory",
    "Subscription",
    "SubscriptionLost",
    "WorkerInfo",
    "WorkerLoad",
    "WorkerRole",
    "new_incarnation",
    "open_directory",
]
