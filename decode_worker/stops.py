"""When does a request stop: EOS, stop token ids, max_tokens, stop strings.

Stop strings are matched on the decoded text, across token boundaries: the request stops at
the first token whose text completes one of them (the gateway trims the text itself). None
ends the request within its first min_tokens tokens (the sampler masks EOS and stop ids there).
"""

from __future__ import annotations

from .request import FinishReason
from .sampling import SamplingParams


class StopStringMatcher:
    """Incremental: decodes only a short tail of recent tokens, so long outputs stay cheap."""

    def __init__(self, decode, stops: tuple[str, ...]):
        self.decode, self.stops = decode, tuple(s for s in stops if s)
        self.tokens: list[int] = []
        self.window = max((len(s) for s in self.stops), default=0) + 8  # tokens of context to re-decode

    def feed(self, token: int) -> bool:
        """Add one token; True if the text now contains a stop string that this token completed."""
        self.tokens.append(token)
        if not self.stops:
            return False
        before = self.decode(self.tokens[-self.window - 1:-1]) if len(self.tokens) > 1 else ""
        after = self.decode(self.tokens[-self.window - 1:])
        # this token's text ends the match (one wholly in the text before was not counted: min_tokens)
        return any(after.find(s, max(0, len(before) - len(s) + 1)) >= 0 for s in self.stops)


def finish_reason(params: SamplingParams, eos_token_id: int, output_len: int, token: int,
                  matcher: StopStringMatcher | None) -> FinishReason | None:
    """Why the request ends at this token (already appended as output[output_len - 1]), if it does."""
    stopped = matcher is not None and matcher.feed(token)  # (fed every token: it keeps their text)
    if output_len > params.min_tokens:
        if (not params.ignore_eos and token == eos_token_id) or token in params.stop_token_ids or stopped:
            return FinishReason.STOP
    if output_len >= params.max_tokens:
        return FinishReason.LENGTH
    return None
