"""Triton's logging extension: which severities the server logs, how verbosely, and how it
writes the time — read and changed while it runs (HTTP `/v2/logging`, gRPC `LogSettings`).

The settings act through a filter and a formatter on the handlers the server writes to
(`attach`), so they cover every record those handlers see, the models' own included. The
log file cannot be changed from outside: that would let any client choose a file for the
server to write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tensorgate.errors import InvalidArgumentError

__all__ = ["LOG_FORMATS", "LOG_LINE", "LogSettings"]

LOG_FORMATS = ("default", "ISO8601")
LOG_LINE = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_SWITCHES = ("log_info", "log_warning", "log_error")
_KNOWN = ("log_file", *_SWITCHES, "log_verbose_level", "log_format")


class _Severities(logging.Filter):
    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        settings = self.settings
        if record.levelno >= logging.ERROR:
            return settings.log_error
        if record.levelno >= logging.WARNING:
            return settings.log_warning
        if record.levelno >= logging.INFO:
            return settings.log_info
        return settings.log_verbose_level > 0


class LogSettings:
    """The server's log settings, starting from its `--log-level`."""

    def __init__(self, level: str = "INFO", logger: str = "tensorgate",
                 log_file: str = "") -> None:
        """`log_file`: where the server's log goes ("": stderr), reported, never changed."""
        number = logging.getLevelName(level.upper())
        if not isinstance(number, int):
            raise ValueError(f"log level '{level}' is not one of DEBUG, INFO, WARNING, ERROR")
        self.log_info = number <= logging.INFO
        self.log_warning = number <= logging.WARNING
        self.log_error = number <= logging.ERROR
        self.log_verbose_level = 1 if number <= logging.DEBUG else 0
        self.log_format = "default"
        self.log_file = log_file
        self._logger = logging.getLogger(logger)
        self._filter = _Severities(self)
        self._handlers: list[logging.Handler] = []

    def attach(self, handlers: Iterable[logging.Handler]) -> None:
        """Act on these handlers (the server's: `run` sets up the root logger's)."""
        for handler in handlers:
            if handler not in self._handlers:
                handler.addFilter(self._filter)
                self._handlers.append(handler)
        self._apply()

    def detach(self) -> None:
        for handler in self._handlers:
            handler.removeFilter(self._filter)
        self._handlers = []

    def current(self) -> dict[str, bool | int | str]:
        return {"log_file": self.log_file, "log_info": self.log_info, "log_warning": self.log_warning,
                "log_error": self.log_error, "log_verbose_level": self.log_verbose_level,
                "log_format": self.log_format}

    def update(self, changes: Mapping[str, Any]) -> dict[str, bool | int | str]:
        """Check every change, then make them all (none if one is wrong); the settings now."""
        for name, value in changes.items():
            if name not in _KNOWN:
                raise InvalidArgumentError(f"unknown log setting '{name}'; settings are: "
                                           f"{', '.join(_KNOWN)}")
            if name in _SWITCHES and not isinstance(value, bool):
                raise InvalidArgumentError(f"log setting '{name}' must be true or false")
            if name == "log_verbose_level" and (isinstance(value, bool)
                                                or not isinstance(value, int) or value < 0):
                raise InvalidArgumentError("log setting 'log_verbose_level' must be a "
                                           "non-negative integer")
            if name == "log_format" and value not in LOG_FORMATS:
                raise InvalidArgumentError(f"log setting 'log_format' must be one of "
                                           f"{', '.join(LOG_FORMATS)}; got {value!r}")
            if name == "log_file" and value not in ("", self.log_file):
                raise InvalidArgumentError(
                    "log setting 'log_file' cannot be changed over the API (any client could "
                    "choose a file for the server to write); redirect the server's output")
        for name, value in changes.items():
            if name != "log_file":
                setattr(self, name, value)
        self._apply()
        return self.current()

    def _apply(self) -> None:
        lowest = (logging.DEBUG if self.log_verbose_level else logging.INFO if self.log_info
                  else logging.WARNING if self.log_warning else logging.ERROR)
        self._logger.setLevel(lowest)  # records the filter would drop are not even made
        if self.log_format == "ISO8601":
            formatter = logging.Formatter(LOG_LINE, "%Y-%m-%dT%H:%M:%SZ")
            formatter.converter = time.gmtime
        else:
            formatter = logging.Formatter(LOG_LINE)
        for handler in self._handlers:
            handler.setFormatter(formatter)
