"""Finding markers in text that arrives in pieces."""

from __future__ import annotations

from collections.abc import Iterable


def partial_suffix_len(text: str, markers: Iterable[str]) -> int:
    """Length of the longest end of `text` that is the start (not the whole) of a marker.

    That much text must be held back: the next piece may complete the marker.
    """
    best = 0
    for marker in markers:
        for n in range(min(len(text), len(marker) - 1), best, -1):
            if marker.startswith(text[-n:]):
                best = n
                break
    return best


def find_first(text: str, markers: Iterable[str]) -> tuple[int, str] | None:
    """(position, marker) of the earliest marker in `text`; the longer one on a tie."""
    found: tuple[int, str] | None = None
    for marker in markers:
        at = text.find(marker)
        if at >= 0 and (found is None or at < found[0] or (at == found[0] and len(marker) > len(found[1]))):
            found = (at, marker)
    return found
