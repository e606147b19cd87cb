"""The values the ownership directory stores and announces, and their wire form.

All of them are frozen dataclasses so a reader can hand them around without copying. Times
are wall-clock seconds (`time.time()` here, Redis `TIME` there) because they travel between
hosts; durations are `*_s`.
"""

from __future__ import annotations

import enum
import json
import secrets
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import NamedTuple


class WorkerRole(str, enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"


class EventKind(str, enum.Enum):
    CLAIMED = "claimed"
    UPDATED = "updated"
    RELEASED = "released"
    # A record re-published from a worker's local copy after the directory was unreachable.
    RESTORED = "restored"


def new_incarnation() -> str:
    """A fresh id per process start: a worker restarted at the same address gets a new one,
    so its peers can tell that the old process (and the KV it held in host memory) is gone."""
    return secrets.token_hex(8)


def check_conversation_id(conversation_id: str) -> None:
    if not isinstance(conversation_id, str) or not conversation_id or len(conversation_id) > 512:
        raise ValueError("conversation id must be a non-empty string of at most 512 characters")


def lease_ms(duration_s: float) -> int:
    """A lease or TTL in whole milliseconds, the unit both implementations store."""
    if duration_s <= 0:
        raise ValueError(f"leases and TTLs must be positive, got {duration_s}")
    return max(1, round(duration_s * 1000))


# How long the last epoch of a conversation is remembered after its last claim; past that, a
# new claim's epoch is just the current time, which is still larger unless clocks step back.
DEFAULT_EPOCH_RETENTION_S = 86_400.0


def next_epoch(last_epoch: int, now_ms: int) -> int:
    """The fencing token after `last_epoch`: the current time in ms, or last + 1 if that is not
    larger. Time-based rather than 1, 2, 3 so that epochs stay ordered when Redis restarts
    without its data, and so that a claim made locally while Redis was unreachable compares
    sensibly with claims made in Redis meanwhile (later claim = larger epoch, up to clock skew)."""
    return max(last_epoch + 1, now_ms)


@dataclass(frozen=True)
class WorkerLoad:
    """What a worker reports on each heartbeat, for load-based routing."""

    num_queued_prefill_tokens: int = 0
    num_running_requests: int = 0
    free_kv_bytes: int = 0


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    role: WorkerRole
    address: str  # gRPC host:port
    incarnation: str
    transports: tuple[str, ...] = ()  # KV transports it speaks: "rdma", "tcp", "shm"
    started_at: float = field(default_factory=time.time)
    load: WorkerLoad = WorkerLoad()

    def __post_init__(self):
        if not self.worker_id or not self.incarnation:
            raise ValueError("worker_id and incarnation must be non-empty")
        object.__setattr__(self, "role", WorkerRole(self.role))
        object.__setattr__(self, "transports", tuple(self.transports))
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"address must be host:port, got {self.address!r}")

    def with_load(self, load: WorkerLoad) -> WorkerInfo:
        return replace(self, load=load)

    # Wire form: the static part and the load are stored apart, so a heartbeat rewrites
    # only the load.
    def static_json(self) -> str:
        fields = asdict(self)
        del fields["load"]
        fields["role"] = self.role.value
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, static_json: str, load_json: str | None) -> WorkerInfo:
        load = _known_fields(WorkerLoad, json.loads(load_json)) if load_json else {}
        return cls(**_known_fields(cls, json.loads(static_json)), load=WorkerLoad(**load))


def _known_fields(cls, values: dict) -> dict:
    """Drops fields this version does not know, so a newer worker that reports more does not
    break an older gateway during a rolling upgrade."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in values.items() if k in names}


def load_json(load: WorkerLoad) -> str:
    return json.dumps(asdict(load), separators=(",", ":"))


@dataclass(frozen=True)
class OwnershipRecord:
    """Who holds a conversation's KV cache. `epoch` is the fencing token of the claim that
    produced this record; only `(owner_id, epoch)` may update or release it."""

    conversation_id: str
    owner_id: str
    owner_incarnation: str
    epoch: int
    num_cached_tokens: int
    prefix_hash: str  # prefix_hash.prefix_hash() of the cached token ids; "" right after a claim
    lease_expires_at: float

    @classmethod
    def from_fields(cls, conversation_id: str, fields: dict[str, str]) -> OwnershipRecord:
        """From the Redis hash / event payload (all values strings, times in ms)."""
        return cls(
            conversation_id=conversation_id,
            owner_id=fields["owner"],
            owner_incarnation=fields["incarnation"],
            epoch=int(fields["epoch"]),
            num_cached_tokens=int(fields["num_cached_tokens"]),
            prefix_hash=fields["prefix_hash"],
            lease_expires_at=int(fields["lease_expires_ms"]) / 1000,
        )


@dataclass(frozen=True)
class OwnershipEvent:
    """One announced change. For RELEASED, `record` is the record as it was just before."""

    kind: EventKind
    record: OwnershipRecord

    def to_json(self) -> str:
        r = self.record
        return json.dumps(
            {
                "kind": self.kind.value,
                "conversation_id": r.conversation_id,
                "owner": r.owner_id,
                "incarnation": r.owner_incarnation,
                "epoch": str(r.epoch),
                "num_cached_tokens": str(r.num_cached_tokens),
                "prefix_hash": r.prefix_hash,
                "lease_expires_ms": str(round(r.lease_expires_at * 1000)),
            }
        )

    @classmethod
    def from_json(cls, payload: str) -> OwnershipEvent:
        fields = json.loads(payload)
        return cls(EventKind(fields["kind"]), OwnershipRecord.from_fields(fields["conversation_id"], fields))


class PrefixMatch(NamedTuple):
    conversation_id: str
    num_matched_blocks: int


@dataclass(frozen=True)
class PrefixEntry:
    """One prefix-index entry, as kept locally and re-published after an outage."""

    block_hash: str
    conversation_id: str
    expires_at: float


@dataclass(frozen=True)
class LiveOwner:
    """An ownership record whose owner is registered now under the same incarnation."""

    record: OwnershipRecord
    worker: WorkerInfo
