"""Streaming detokenizer: token ids in, text out as soon as it is final.

Text is held back for two reasons only:
- the bytes of an unfinished UTF-8 character (byte-level BPE splits characters across tokens);
- an end of the text that may still grow into a stop string (stop strings span tokens).
A special token is emitted whole, in its V4.1 spelling, and is a barrier for stop strings: none
matches across or inside one (they are markup, not text), so no special token is ever split.
On a stop string the text is cut just before it and everything after is ignored.

In thinking mode, `stop_after_token=THINK_END.id` keeps stop strings off the reasoning, so that
a stop like "\\n\\n" ends the answer and not the thinking. With `min_tokens` a stop string counts
only where a later token completes it (as vLLM counts them; the worker holds off EOS and stop
ids alike): one that starts in the first min_tokens tokens' text and ends after it does.
"""

from __future__ import annotations

import codecs
from collections.abc import Collection, Iterable, Sequence

from . import special_tokens as st
from .text_match import find_first, partial_suffix_len
from .tokenizer import Tokenizer


class StreamingDetokenizer:
    def __init__(self, tokenizer: Tokenizer, stop: Sequence[str] = (), *,
                 hidden_ids: Collection[int] = st.HIDDEN_IDS, stop_after_token: int | None = None,
                 min_tokens: int = 0):
        self._tokenizer = tokenizer
        self._stops = [s for s in stop if s]
        self._hidden = hidden_ids
        self._stop_after_token = stop_after_token
        self._past_stop_after = stop_after_token is None
        self._held_off = min_tokens  # below 0: past the first min_tokens tokens, whose text no stop ends
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""  # decoded, not yet emitted: may be the start of a stop string
        self.matched_stop: str | None = None
        self.is_stopped = False

    @property
    def _stops_active(self) -> bool:
        return self._past_stop_after and self._held_off < 0

    def push(self, token_id: int) -> str:
        """Add one generated token; return the text that became final."""
        self._held_off -= 1
        if self.is_stopped or token_id in self._hidden:
            return ""
        data = self._tokenizer.token_bytes(token_id)
        if not self._tokenizer.is_special(token_id):
            self._pending += self._utf8.decode(data)
            return self._release(at_barrier=False)
        out = self._release(at_barrier=True)
        if self.is_stopped:
            return out
        if token_id == self._stop_after_token:
            self._past_stop_after = True
        return out + data.decode("utf-8")

    def push_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.push(t) for t in token_ids)

    def finish(self) -> str:
        """End of generation: release what was held back (a broken character becomes U+FFFD)."""
        return "" if self.is_stopped else self._release(at_barrier=True)

    def _release(self, *, at_barrier: bool) -> str:
        if at_barrier:
            self._pending += self._utf8.decode(b"", final=True)  # also resets the decoder
        text = self._pending
        if self._stops_active:
            hit = find_first(text, self._stops)
            if hit is not None:
                self.is_stopped, self.matched_stop, self._pending = True, hit[1], ""
                return text[:hit[0]]
        # (Held off by min_tokens, the start of a possible stop is held back too: a later token may end it.)
        hold = 0 if at_barrier or not self._past_stop_after else partial_suffix_len(text, self._stops)
        self._pending = text[len(text) - hold:]
        return text[:len(text) - hold]
