"""Logging: `--log-format text|json`, and the key=value / JSON event lines operators grep for."""

from __future__ import annotations

import json
import logging
import sys
import time

_FORMAT = {"value": "text"}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
                "msg": record.getMessage()}
        fields = getattr(record, "fields", None)
        if fields:
            line.update(fields)
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    _FORMAT["value"] = fmt
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def current_setup() -> tuple[str, str]:
    """(level, format) as setup_logging left them: child processes log the same way."""
    return logging.getLevelName(logging.getLogger().level).lower(), _FORMAT["value"]


def _render(value) -> str:
    text = str(value)
    return json.dumps(text) if (" " in text or "=" in text or not text) else text


def log_event(logger: logging.Logger, event: str, **fields) -> None:
    """One event line: `event k=v k=v` in text mode, a JSON object with `event` in json mode."""
    if _FORMAT["value"] == "json":
        logger.info(event, extra={"fields": {"event": event, **fields}})
    else:
        logger.info("%s %s", event, " ".join(f"{k}={_render(v)}" for k, v in fields.items()))


def now_ms() -> float:
    return time.monotonic() * 1000.0
