"""Fault injection, passed to an engine's constructor (never read from the environment).

A plan applies to batches the engine *initiates* (its write_batch and read_batch calls), in
both directions, and to at most `max_faults` of them, so a test can check that the retry after
a fault succeeds. Each kind imitates a real failure at the point it would happen:
- `fail_with`: the call raises this error before moving any byte (a refused request);
- `delay_s`: the engine stalls this long before moving payload (a slow or overloaded peer);
  the batch deadline still applies, so a long delay ends in TransferTimeout;
- `corrupt_at_byte`: one payload byte is flipped after the sender's checksum was taken, as a
  bad NIC, cable or memory would (the receiving side must raise ChecksumMismatch);
- `drop_after_bytes`: the connection is cut once this many payload bytes have moved (a crash
  or link loss mid-transfer); the initiator raises PeerUnreachable.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from .errors import TransferError, TransferTimeout
from .wire import Deadline


@dataclass(frozen=True)
class FaultPlan:
    fail_with: type[TransferError] | None = None
    delay_s: float = 0.0
    corrupt_at_byte: int | None = None
    drop_after_bytes: int | None = None
    max_faults: int = 1

    def __post_init__(self):
        if self.delay_s < 0 or self.max_faults < 0:
            raise ValueError("delay_s and max_faults must be >= 0")


@dataclass
class BatchFaults:
    """The faults one batch will suffer (all inactive when the plan is spent)."""

    fail_with: type[TransferError] | None = None
    delay_s: float = 0.0
    corrupt_at_byte: int | None = None
    drop_after_bytes: int | None = None

    def stall(self, deadline: Deadline) -> None:
        """The injected delay, cut short (with TransferTimeout) by the batch deadline."""
        if self.delay_s <= 0:
            return
        wait_s = min(self.delay_s, deadline.remaining())
        time.sleep(wait_s)
        if wait_s < self.delay_s:
            raise TransferTimeout("batch deadline passed during an injected delay")

    def corrupt_offset(self, start: int, length: int) -> int | None:
        """Index inside the payload piece [start, start+length) to flip, if any."""
        at = self.corrupt_at_byte
        if at is not None and start <= at < start + length:
            return at - start
        return None

    def drop_within(self, start: int, length: int) -> int | None:
        """How many bytes of this piece may still move before the drop, if it falls here."""
        at = self.drop_after_bytes
        if at is not None and at < start + length:
            return max(0, at - start)
        return None


    def shifted(self, offset: int) -> BatchFaults:
        """The same faults as seen by a stripe whose bytes start `offset` into the batch."""
        if self is NO_FAULTS or offset == 0:
            return self
        return BatchFaults(self.fail_with, self.delay_s,
                           None if self.corrupt_at_byte is None else self.corrupt_at_byte - offset,
                           None if self.drop_after_bytes is None else self.drop_after_bytes - offset)


NO_FAULTS = BatchFaults()


@dataclass
class FaultInjector:
    """Hands out one plan's faults to successive batches, thread-safely."""

    plan: FaultPlan | None = None
    _used: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def next_batch(self) -> BatchFaults:
        plan = self.plan
        if plan is None:
            return NO_FAULTS
        with self._lock:
            if self._used >= plan.max_faults:
                return NO_FAULTS
            self._used += 1
        return BatchFaults(plan.fail_with, plan.delay_s, plan.corrupt_at_byte, plan.drop_after_bytes)
