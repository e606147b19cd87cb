"""The one error a chat request can fail rendering with, shaped for an OpenAI 400."""

from __future__ import annotations

from typing import Any


class ChatEncodingError(ValueError):
    """The client's messages or options cannot be rendered; `param` names the offending field
    the way OpenAI does ("messages[2].content[0].type", "reasoning_effort")."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def to_openai(self) -> dict[str, Any]:
        """The body of the HTTP 400 response."""
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param,
                          "code": self.code}}
