"""A prompt as segments: runs of plain text and special-token ids.

Keeping the two apart is what makes prompt injection impossible: only the renderer decides
where special tokens go; every string from the request is a text run. Adjacent text is merged
so each run is exactly what the official pipeline tokenizes between two special tokens (the
HF tokenizer also cuts its input at added tokens), which keeps the ids identical to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import special_tokens as st


@dataclass(frozen=True)
class Tokens:
    """Ids that stand for `text` as the model produced them: a reply quoted back in the history.
    Re-tokenizing the text can give other ids, and then the prompt would no longer start with
    the tokens the decode worker cached for that turn."""

    ids: tuple[int, ...]
    text: str


Segment = str | int | Tokens

# Only for the renderer's own constant templates, never for request text.
_TEMPLATE_SPECIALS = re.compile("|".join(re.escape(t.text) for t in sorted(st.ALL, key=lambda t: -len(t.text))))


class SegmentBuilder:
    """Appends text and special ids, merging adjacent text runs."""

    def __init__(self) -> None:
        self._segments: list[Segment] = []
        self._text: list[str] = []

    def text(self, text: str) -> SegmentBuilder:
        if text:
            self._text.append(text)
        return self

    def special(self, token: st.SpecialToken) -> SegmentBuilder:
        return self._add(token.id)

    def template(self, trusted: str) -> SegmentBuilder:
        """A constant of ours in which special-token spellings mean the tokens themselves."""
        at = 0
        for match in _TEMPLATE_SPECIALS.finditer(trusted):
            self.text(trusted[at:match.start()])
            self.special(st.BY_TEXT[match.group()])
            at = match.end()
        return self.text(trusted[at:])

    def tokens(self, run: Tokens) -> SegmentBuilder:
        return self._add(run)

    def extend(self, segments: list[Segment]) -> SegmentBuilder:
        """Append built segments as if they were added here one by one (text runs merge)."""
        for segment in segments:
            if isinstance(segment, str):
                self.text(segment)
            else:
                self._add(segment)
        return self

    @property
    def ends_in_text(self) -> bool:
        return bool(self._text)

    def build(self) -> list[Segment]:
        self._flush()
        return list(self._segments)

    def _add(self, segment: int | Tokens) -> SegmentBuilder:
        """A special id or a spliced run: it ends the text run before it."""
        self._flush()
        self._segments.append(segment)
        return self

    def _flush(self) -> None:
        if self._text:
            self._segments.append("".join(self._text))
            self._text = []


def spell(segments: list[Segment]) -> str:
    """The prompt as one string, special tokens in their canonical V4.1 spelling."""
    return "".join(s if isinstance(s, str) else s.text if isinstance(s, Tokens) else st.BY_ID[s].text
                   for s in segments)
