"""Request bodies of the OpenAI endpoints. Unknown fields are ignored (as OpenAI does); wrong
types and out-of-range values are rejected with the field named. Chat messages are checked
in detail by chat_encoding, which knows the format."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationInfo, field_validator, model_validator

MAX_CONTEXT_TOKENS = 1_048_576
MAX_STOP_STRINGS = 16
MAX_CHOICES = 64  # a completion request's prompts times n


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, every chunk carries the usage so far


class Thinking(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["enabled", "disabled"]


class SamplingFields(BaseModel):
    """Fields shared by chat and text completions (OpenAI's, plus vLLM/SGLang's usual extras)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_CONTEXT_TOKENS)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, le=2**31 - 1)  # (the worker's field is an int32)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0, le=MAX_CONTEXT_TOKENS)  # EOS and stop_token_ids held off until then
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    conversation_id: str | None = None
    prompt_cache_key: str | None = None  # OpenAI's cache hint: accepted (and echoed); prefixes are matched anyway
    return_token_ids: bool = False  # extension: the generated token ids in each choice
    # vLLM's extension: each prompt token's logprob, rank and this many alternatives (not streamed)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    # OpenAI's: token id (as a string) -> bias in [-100, 100]; validated into {id: bias}
    logit_bias: dict[str, float] | None = None

    @model_validator(mode="before")
    @classmethod
    def _nulls_as_defaults(cls, data):
        """An explicit null is the field's default, as OpenAI's API takes it (clients that build
        bodies from typed objects send `"temperature": null`)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields
                    or cls.model_fields[k].default is None}
        return data

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value):
        if value is None:
            return None
        out: dict[int, float] = {}
        for token, bias in value.items():
            if not re.fullmatch(r"[0-9]{1,10}", token):  # ASCII digits: int() would take "²" or "٣"
                raise ValueError(f"keys are token ids, not {token!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"biases are in [-100, 100], not {bias}")
            if int(token) in out:
                raise ValueError(f"token {int(token)} is named twice")
            out[int(token)] = bias
        return out

    @model_validator(mode="after")
    def _prompt_logprobs_whole(self):
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs are not streamed: ask without stream")
        return self

    @field_validator("stop")
    @classmethod
    def _stop(cls, value):
        return checked_stops(value)

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_ids(cls, value):
        if value is not None and any(not 0 <= t < 2**32 for t in value):
            raise ValueError("token ids are non-negative 32-bit integers")
        return value

    def one_reply_only(self, api: str, reply: str) -> tuple[str, str] | None:
        """(field, why) for what an API answering with one reply and no prompt scores refuses."""
        if self.n != 1:
            return "n", f"n is not part of {api}: send one request {reply}"
        if self.prompt_logprobs is not None:
            return "prompt_logprobs", "prompt_logprobs is not served here: use /v1/completions"
        return None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


def checked_stops(value):
    if isinstance(value, list):
        if len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop sequences")
        if any(not s for s in value):
            raise ValueError("stop sequences must be non-empty strings")
    elif value == "":
        raise ValueError("stop must be a non-empty string")
    return value


class ChatPrompt(BaseModel):
    """What renders a chat into its prompt: a chat completion's, or /tokenize's."""

    model_config = ConfigDict(extra="ignore")

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    thinking: Thinking | None = None
    reasoning_effort: str | int | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's and SGLang's way to the same switches (clients written for them send these):
    # thinking / enable_thinking (true or false), thinking_mode ("thinking" or "chat"),
    # reasoning_effort; the fields above win where both are given
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_switches(cls, value):
        for key in ("thinking", "enable_thinking"):
            if value and key in value and not isinstance(value[key], bool):
                raise ValueError(f"{key} must be true or false")
        if value and value.get("thinking_mode", "thinking") not in ("thinking", "chat"):
            raise ValueError("thinking_mode must be 'thinking' or 'chat'")
        return value

    @property
    def thinking_on(self) -> bool:
        if self.thinking is not None:
            return self.thinking.type == "enabled"
        switches = self.chat_template_kwargs or {}
        for key in ("thinking", "enable_thinking"):
            if key in switches:
                return switches[key]
        return switches.get("thinking_mode", "thinking") == "thinking"  # DeepSeek's default: on

    @property
    def effort(self) -> str | int | None:
        if self.reasoning_effort is not None:
            return self.reasoning_effort
        return (self.chat_template_kwargs or {}).get("reasoning_effort")


class ChatCompletionRequest(SamplingFields, ChatPrompt):
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_CONTEXT_TOKENS)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @model_validator(mode="after")
    def _logprobs(self):
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    # 0 with echo: the prompt alone, scored with logprobs (what older evaluation harnesses send)
    max_tokens: int | None = Field(default=None, ge=0, le=MAX_CONTEXT_TOKENS)
    logprobs: int | None = Field(default=None, ge=0, le=20)  # legacy: top-k per position
    echo: bool = False  # the prompt before the completion (its tokens scored, with logprobs)
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, value, info: ValidationInfo):
        if value is not None and value != info.data.get("n", 1):
            raise ValueError("is not supported (other than n): ask for n choices and pick among them")
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        if isinstance(value, list):
            if not value:
                raise ValueError("prompt must not be empty")
            if isinstance(value[0], list) and any(not p for p in value):
                raise ValueError("token-id prompts must not be empty")
        return value

    @model_validator(mode="after")
    def _unsupported(self):
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens 0 asks for the prompt alone: it needs echo: true")
        return self

    @property
    def prompt_only(self) -> bool:
        return self.max_tokens == 0

    @property
    def limit(self) -> int | None:
        """The workers' max_tokens: one for a prompt alone (they always generate one; it is dropped)."""
        return 1 if self.prompt_only else self.max_tokens


class TokenizeChat(ChatPrompt):
    """vLLM's /tokenize of a chat: the prompt a chat completion of these messages would send."""
    model: str | None = None
    return_token_strs: bool = False


class TokenizeText(BaseModel):
    """vLLM's /tokenize of a text: the prompt a completion of it would send."""
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int]


class ReasoningOptions(BaseModel):
    """The Responses API's `reasoning`: its effort (summaries are not made: the reasoning itself
    comes back)."""
    model_config = ConfigDict(extra="ignore")
    effort: str | StrictInt | None = None  # (an integer 1-100: DeepSeek's scale, as in chat)
    summary: str | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="allow")  # json_schema's name, schema, strict, description
    type: Literal["text", "json_object", "json_schema"] = "text"


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat | None = None


class ResponsesRequest(SamplingFields):
    """POST /v1/responses (OpenAI's Responses API): `input` (a text, or message, reasoning,
    function_call and function_call_output items), `instructions`, flat function `tools`, and
    `previous_response_id` to continue a stored response. The sampling extras of the other
    endpoints (top_k, seed, stop, ...) are accepted as vLLM's Responses endpoint accepts them."""

    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=128)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_CONTEXT_TOKENS)
    reasoning: ReasoningOptions | None = None
    thinking: Thinking | None = None  # DeepSeek's switch, as in chat completions
    text: TextOptions | None = None
    store: bool = True
    include: list[str] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    max_tool_calls: int | None = Field(default=None, ge=1)  # (it bounds hosted tools' calls: none here)
    metadata: dict[str, str] | None = None
    truncation: Literal["disabled", "auto"] | None = None
    background: bool = False
    conversation: Any = None
    prompt: Any = None  # (the Responses API's stored prompt templates)

    @field_validator("input")
    @classmethod
    def _input(cls, value):
        if isinstance(value, list) and not value:
            raise ValueError("input must not be empty")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value):
        if value is not None and (len(value) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in value.items())):
            raise ValueError("at most 16 pairs, keys of at most 64 characters, values of at most 512")
        return value

    def unsupported(self) -> tuple[str, str] | None:
        """(field, why) for the first field set that this server does not serve, else None."""
        for name, why in (("background", "responses are answered while the request is open"),
                          ("conversation", "continue a response with previous_response_id"),
                          ("prompt", "stored prompt templates are not kept: send the input itself")):
            if getattr(self, name) not in (None, False):
                return name, f"{name} is not supported: {why}"
        if self.truncation == "auto":
            return "truncation", "truncation 'auto' is not supported: a prompt past the context gets a 400"
        return self.one_reply_only("the Responses API", "a response")

    @property
    def limit(self) -> int | None:
        return self.max_output_tokens or self.max_tokens

    @property
    def wants_logprobs(self) -> bool:
        return "message.output_text.logprobs" in (self.include or [])

    @property
    def seals_reasoning(self) -> bool:
        """Reasoning items carry `encrypted_content`, for a client that keeps the history itself
        (store: false) and sends them back."""
        return "reasoning.encrypted_content" in (self.include or [])


class MessagesPrompt(BaseModel):
    """What renders an Anthropic Messages request into its prompt: a request's, or
    count_tokens'."""

    model_config = ConfigDict(extra="ignore")

    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # its effort (thinking's) and format (a JSON schema)


class MessagesRequest(SamplingFields, MessagesPrompt):
    """POST /v1/messages (Anthropic's Messages API): `system`, `messages` of content blocks
    (text, tool_use, tool_result, thinking), tools with an `input_schema`, `tool_choice`,
    `thinking`, `stop_sequences`; `max_tokens` is required, as Anthropic's API has it."""

    max_tokens: int = Field(ge=1, le=MAX_CONTEXT_TOKENS)
    stop_sequences: list[str] | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stop_sequences(cls, value):
        return checked_stops(value)

    @model_validator(mode="after")
    def _stops(self):
        if self.stop_sequences:
            self.stop = self.stop_sequences
        return self

    def unsupported(self) -> tuple[str, str] | None:
        return self.one_reply_only("the Messages API", "a reply")


class CountTokensRequest(MessagesPrompt):
    """POST /v1/messages/count_tokens: what a Messages request's prompt would take."""
    model: str | None = None
