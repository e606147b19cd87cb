"""Per-request sampling: logit bias, penalties, temperature, top-k / top-p / min-p, min_tokens,
seeds, logprobs.

Each request owns a `RequestSampler` with its own seeded generator, so its random draws
depend only on its own tokens (reproducible, and the same alone or in a batch). The
processed distribution of a position can be asked for with tokens that are not committed
yet (`extra`): speculative verification scores row i with the drafts accepted before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..model.logprobs import MAX_TOP, TokenLogprob, token_logprobs


class SamplingError(ValueError):
    """A sampling parameter out of range (the client's mistake)."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    min_tokens: int = 0  # EOS (unless ignore_eos) and stop_token_ids are masked out before this many
    prompt_logprobs: int | None = None  # score the prompt's tokens, this many alternatives each (None: off)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) added to its logit before sampling

    def __post_init__(self):
        checks = [
            (self.max_tokens >= 1, "max_tokens", "must be >= 1"),
            (0.0 <= self.temperature <= 100.0, "temperature", "must be in [0, 100]"),
            (0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]"),
            (self.top_k >= 0 or self.top_k == -1, "top_k", "must be >= 0 (or -1 for off)"),
            (0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]"),
            (0.0 < self.repetition_penalty <= 10.0, "repetition_penalty", "must be in (0, 10]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]"),
            (0 <= self.top_logprobs <= MAX_TOP, "top_logprobs", f"must be in [0, {MAX_TOP}]"),
            (0 <= self.min_tokens <= self.max_tokens, "min_tokens", "must be in [0, max_tokens]"),
            (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_TOP, "prompt_logprobs",
             f"must be in [0, {MAX_TOP}]"),
            (all(t >= 0 and math.isfinite(b) and -100.0 <= b <= 100.0 for t, b in self.logit_bias),
             "logit_bias", "takes token ids to biases in [-100, 100]"),
        ]
        for ok, name, msg in checks:
            if not ok:
                raise SamplingError(f"{name} {msg}")
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise SamplingError(f"{name} must be finite")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """A penalty changes the logits by the tokens seen."""
        return self.repetition_penalty != 1.0 or bool(self.presence_penalty) or bool(self.frequency_penalty)

    @property
    def plain_greedy(self) -> bool:
        """Greedy on the logits as they are (no penalty or bias changes them): a batch's tokens
        can then be taken with one argmax over all its rows."""
        return self.greedy and not self.penalized and not self.logit_bias


class RequestSampler:
    def __init__(self, params: SamplingParams, prompt_tokens: list[int], vocab_size: int,
                 eos_token_id: int | None = None):
        self.params = params
        self.vocab = vocab_size
        self.generated = 0  # output tokens recorded so far
        # What min_tokens holds off: the tokens that would end the request.
        ends = params.stop_token_ids + (() if params.ignore_eos or eos_token_id is None else (eos_token_id,))
        ends = sorted({t for t in ends if 0 <= t < vocab_size})
        self.held_off = torch.tensor(ends, dtype=torch.long) if params.min_tokens and ends else None
        biased = [(t, b) for t, b in params.logit_bias if t < vocab_size]
        self.bias_ids = torch.tensor([t for t, _ in biased], dtype=torch.long) if biased else None
        self.bias = torch.tensor([b for _, b in biased], dtype=torch.float32) if biased else None
        self.generator = torch.Generator()
        self.generator.manual_seed(params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item()))
        # The penalties' state, kept only where a penalty reads it: recording a token costs the
        # host ~13 us (CPU tensor ops), after the targets' sync while the GPU waits.
        self.counts = self.seen = None
        if params.penalized:
            self.counts = torch.zeros(vocab_size, dtype=torch.float32)  # generated-token counts
            self.seen = torch.zeros(vocab_size, dtype=torch.bool)  # prompt or generated (repetition penalty)
            ids = torch.tensor([t for t in prompt_tokens if 0 <= t < vocab_size], dtype=torch.long)
            if ids.numel():
                self.seen[ids] = True

    @property
    def plain_greedy(self) -> bool:
        """params.plain_greedy, and min_tokens masks nothing at any row of the next block."""
        return self.params.plain_greedy and (self.held_off is None or self.generated >= self.params.min_tokens)

    def record(self, tokens: list[int]) -> None:
        """Tokens are now part of the output (counted by min_tokens and the penalties)."""
        self.generated += len(tokens)
        if not self.params.penalized:
            return
        for t in tokens:
            self.counts[t] += 1
            self.seen[t] = True

    def processed(self, logits: torch.Tensor, extra: list[int] = ()) -> torch.Tensor:
        """Logits after min_tokens, penalties, temperature and the top-k/top-p/min-p masks (masked
        = -inf), for the output token after the recorded ones and `extra`."""
        p = self.params
        x = logits.float().clone()
        if self.bias_ids is not None:
            if self.bias_ids.device != x.device:  # once, as the penalty state below
                self.bias_ids, self.bias = self.bias_ids.to(x.device), self.bias.to(x.device)
            x[self.bias_ids] += self.bias
        if self.held_off is not None and self.generated + len(extra) < p.min_tokens:
            if self.held_off.device != x.device:  # once, as the penalty state below
                self.held_off = self.held_off.to(x.device)
            x[self.held_off] = float("-inf")
        if p.penalized:
            if self.counts.device != x.device:  # once: the penalty state follows the logits' device
                self.counts, self.seen = self.counts.to(x.device), self.seen.to(x.device)
            counts, seen = self.counts, self.seen
            if extra:
                counts, seen = counts.clone(), seen.clone()
                for t in extra:
                    counts[t] += 1
                    seen[t] = True
            if p.repetition_penalty != 1.0:
                x = torch.where(seen, torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty), x)
            x = x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()
        if p.greedy:
            return x
        x = x / p.temperature
        if p.top_k > 0 and p.top_k < x.numel():
            kth = torch.topk(x, p.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if p.top_p < 1.0:
            order = torch.sort(x, descending=True)
            probs = torch.softmax(order.values, dim=-1)
            cut = probs.cumsum(-1) - probs > p.top_p  # drop tokens once the mass before them exceeds top_p
            x = x.masked_fill(torch.zeros_like(cut).scatter(0, order.indices, cut), float("-inf"))
        if p.min_p > 0.0:
            probs = torch.softmax(x, dim=-1)
            x = x.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
        return x

    def distribution(self, logits: torch.Tensor, extra: list[int] = ()) -> torch.Tensor:
        """The probabilities this request samples from (one-hot at the argmax when greedy)."""
        x = self.processed(logits, extra)
        if self.params.greedy:
            return torch.nn.functional.one_hot(torch.argmax(x), self.vocab).float()
        return torch.softmax(x, dim=-1)

    def choose(self, logits: torch.Tensor, extra: list[int] = ()) -> tuple[int, torch.Tensor]:
        """Draw a token; returns it with the distribution it was drawn from."""
        dist = self.distribution(logits, extra)
        if self.params.greedy:
            return int(torch.argmax(dist)), dist
        return self.draw(dist), dist

    def draw(self, dist: torch.Tensor) -> int:
        # the request's own CPU generator keeps seeded sampling identical on every device
        return int(torch.multinomial(dist.float().cpu(), 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))

    def logprob(self, logits: torch.Tensor, token: int) -> TokenLogprob:
        """Log-probability of `token` under the model's own distribution (before sampling knobs)."""
        return token_logprobs(logits[None], [token], self.params.top_logprobs)[0]
