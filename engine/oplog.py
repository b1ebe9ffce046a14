"""Operator log lines: one structured line when the engine dead-letters an input, raises an
alert or decides a repair. Each names the session, the reason and the source record
(topic/partition/offset), never item content, so logs can be shipped anywhere.

Text form (default): `dead_letter session=s-1 reason=BAD_MAGIC source=reconciler.intents/0/17`.
JSON form (`log_format = "json"`): every log line, these and the others, is one JSON object
with `time`, `level`, `logger`, `message` and, for these, `event` plus the same fields.
"""

from __future__ import annotations

import json
import logging
from typing import Literal

LOGGER = "reconciler.ops"
LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_log = logging.getLogger(LOGGER)


def _text(value: object) -> str:
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() or c in '"=' for c in text) else text


def emit(event: str, level: int = logging.WARNING, **fields: object) -> None:
    """One line for `event` with `fields` (key=value in text, keys of the JSON object)."""
    message = " ".join([event, *(f"{k}={_text(v)}" for k, v in fields.items())])
    _log.log(level, message, extra={"ops_event": event, "ops_fields": fields})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, "ops_event", None)
        if event is not None:
            line["event"] = event
            line.update({k: str(v) for k, v in getattr(record, "ops_fields", {}).items()})
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(log_format: LogFormat) -> None:
    """Root logging for `reconciler run`: INFO and up, in the chosen format, on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
