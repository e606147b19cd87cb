"""OpenAI response objects: chat completions, text completions, their stream chunks, usage
and logprobs, built from the relayed choices."""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from typing import Any

from ..v1 import worker_pb2
from .generation import Choice
from .tokenizer import Tokenizer


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def typed_sse(event: dict) -> str:
    """An event of a typed stream (the Responses and Messages APIs): its type on the event line."""
    return f"event: {event['type']}\n{sse(event)}"
SSE_KEEPALIVE = ": keep-alive\n\n"


def cached_tokens(choices: list[Choice], n: int = 1) -> int:
    """The prompt tokens the workers already held, as each prompt's first choice (of n) reports
    them (its siblings do not keep the conversation)."""
    return sum(c.finished.usage.cached_tokens for c in choices if c.index % n == 0 and c.finished is not None)


def usage(prompt_tokens: int, choices: list[Choice], n: int = 1) -> dict[str, Any]:
    completion = sum(len(c.token_ids) for c in choices)
    cached = cached_tokens(choices, n)
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion,
           "prompt_tokens_details": {"cached_tokens": cached}}
    reasoning = sum(c.reasoning_tokens for c in choices)
    if any(c.starts_in_reasoning for c in choices):
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return out


def _token_text(tokenizer: Tokenizer, token: int) -> tuple[str, list[int]]:
    data = tokenizer.token_bytes(token)
    return data.decode("utf-8", errors="replace"), list(data)


def token_text(tokenizer: Tokenizer, token: int) -> str:
    """A token's own text (a piece of a character split over tokens as U+FFFD)."""
    return _token_text(tokenizer, token)[0]


def chat_logprobs(tokenizer: Tokenizer, items: list[worker_pb2.TokenLogprob]) -> dict:
    content = []
    for lp in items:
        text, raw = _token_text(tokenizer, lp.token_id)
        top = []
        for t in lp.top:
            t_text, t_raw = _token_text(tokenizer, t.token_id)
            top.append({"token": t_text, "logprob": t.logprob, "bytes": t_raw})
        content.append({"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top})
    return {"content": content}


@dataclass(frozen=True)
class Echo:
    """A completion's prompt, which `echo` puts before its text (and its logprobs)."""
    text: str
    token_ids: list[int]


class TextOffsets:
    """Where each token's text starts in a completion's text (the legacy logprobs' text_offset):
    the characters decoded before it, a character split over tokens counted where it completes,
    so a stream's offsets and its whole reply's agree."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chars = 0

    def take(self, token_id: int) -> int:
        at = self._chars
        self._chars += len(self._decoder.decode(self.tokenizer.token_bytes(token_id)))
        return at

    def end_text(self) -> None:
        """The echoed prompt ends here: its text was decoded alone, a character it left split as
        U+FFFD, and the completion's text starts afresh."""
        self._chars += len(self._decoder.decode(b"", final=True))
        self._decoder.reset()


def completion_logprobs(tokenizer: Tokenizer, items: list[worker_pb2.TokenLogprob], offsets: TextOffsets,
                        top: int | None = None, echo: Echo | None = None,
                        scored: list[worker_pb2.TokenLogprob] = ()) -> dict:
    """The legacy logprobs object of `items`, with `top` alternatives each (default: all the
    workers sent); where `echo` is given, the prompt's come first: its first token unscored
    (nothing came before it), the others `scored`."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def add(token: int, logprob: float | None, alternatives) -> None:
        out["tokens"].append(token_text(tokenizer, token))
        out["token_logprobs"].append(logprob)
        out["top_logprobs"].append(None if alternatives is None else
                                   {token_text(tokenizer, t.token_id): t.logprob for t in alternatives[:top]})
        out["text_offset"].append(offsets.take(token))

    if echo is not None:
        add(echo.token_ids[0], None, None)
        for lp in scored:
            add(lp.token_id, lp.logprob, lp.top)
        offsets.end_text()
    for lp in items:
        add(lp.token_id, lp.logprob, lp.top)
    return out


def name_reasoning(out: dict, field: str) -> dict:
    """A message's or delta's reasoning under the name the gateway answers with: DeepSeek's and
    SGLang's `reasoning_content`, vLLM's `reasoning`, or both (clients of either kind)."""
    if field == "reasoning_content" or "reasoning_content" not in out:
        return out
    out = dict(out)
    text = out["reasoning_content"] if field == "both" else out.pop("reasoning_content")
    out["reasoning"] = text
    return out


def chat_message(choice: Choice, tokenizer: Tokenizer, want_logprobs: bool, want_ids: bool,
                 reasoning_field: str = "reasoning_content") -> dict:
    message = choice.message.to_openai() if choice.message is not None else {"role": "assistant", "content": ""}
    message = name_reasoning(message, reasoning_field)
    out = {"index": choice.index, "message": message,
           "logprobs": chat_logprobs(tokenizer, choice.logprobs) if want_logprobs else None,
           "finish_reason": choice.finish_reason}
    if want_ids:
        out["token_ids"] = choice.token_ids
    return out


def prompt_logprobs(tokenizer: Tokenizer, scored: list[worker_pb2.TokenLogprob], top: int) -> list[dict | None]:
    """vLLM's prompt_logprobs: None for the first token, then for each token a map from token id
    to its logprob, rank and text: the prompt's token first, then the `top` most likely."""
    out: list[dict | None] = [None]
    for lp in scored:
        entry = {str(lp.token_id): {"logprob": lp.logprob, "rank": lp.rank,
                                    "decoded_token": token_text(tokenizer, lp.token_id)}}
        for rank, t in enumerate(lp.top[:top], 1):
            entry.setdefault(str(t.token_id), {"logprob": t.logprob, "rank": rank,
                                               "decoded_token": token_text(tokenizer, t.token_id)})
        out.append(entry)
    return out


def completion_choice(choice: Choice, tokenizer: Tokenizer, logprobs_top: int | None, want_ids: bool,
                      echo: Echo | None = None) -> dict:
    """logprobs_top: the request's `logprobs` (None: none asked for)."""
    before = echo.text if echo is not None else ""
    logprobs = None
    if logprobs_top is not None:
        logprobs = completion_logprobs(tokenizer, choice.logprobs, TextOffsets(tokenizer), logprobs_top, echo,
                                       choice.prompt_logprobs)
    out = {"index": choice.index, "text": before + "".join(choice.text), "finish_reason": choice.finish_reason,
           "logprobs": logprobs}
    if want_ids:
        out["token_ids"] = choice.token_ids
    return out
