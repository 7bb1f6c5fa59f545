"""The logging extension's settings act on the handlers they are attached to: each severity
can be switched off on its own, debug records pass only when verbose, the time format
changes, and a wrong change changes nothing."""

from __future__ import annotations

import logging
import re

import pytest

from tensorgate.errors import InvalidArgumentError
from tensorgate.log_settings import LogSettings


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def attached() -> tuple[LogSettings, _Lines, logging.Logger]:
    handler = _Lines()
    logger = logging.getLogger("tensorgate.test_log_settings")
    logger.addHandler(handler)
    logger.propagate = False
    settings = LogSettings("INFO", logger="tensorgate.test_log_settings")
    settings.attach([handler])
    yield settings, handler, logger
    settings.detach()
    logger.removeHandler(handler)


def _log_each(logger: logging.Logger) -> None:
    logger.debug("d")
    logger.info("i")
    logger.warning("w")
    logger.error("e")


def _messages(handler: _Lines) -> list[str]:
    return [line.rsplit(": ", 1)[1] for line in handler.lines]


def test_each_severity_switches_on_its_own(attached) -> None:
    settings, handler, logger = attached
    _log_each(logger)
    assert _messages(handler) == ["i", "w", "e"]
    handler.lines.clear()
    settings.update({"log_warning": False})  # warnings off, info and errors on
    _log_each(logger)
    assert _messages(handler) == ["i", "e"]
    handler.lines.clear()
    settings.update({"log_verbose_level": 2, "log_error": False, "log_warning": True})
    _log_each(logger)
    assert _messages(handler) == ["d", "i", "w"]


def test_the_time_format_changes(attached) -> None:
    settings, handler, logger = attached
    logger.info("before")
    settings.update({"log_format": "ISO8601"})
    logger.info("after")
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO ", handler.lines[0])
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ INFO ", handler.lines[1])


@pytest.mark.parametrize(("changes", "message"), [
    ({"log_info": False, "log_info_": True},
     "unknown log setting 'log_info_'; settings are: log_file, log_info, log_warning, "
     "log_error, log_verbose_level, log_format"),
    ({"log_info": False, "log_warning": 1}, "log setting 'log_warning' must be true or false"),
    ({"log_info": False, "log_verbose_level": -1},
     "log setting 'log_verbose_level' must be a non-negative integer"),
    ({"log_info": False, "log_verbose_level": True},
     "log setting 'log_verbose_level' must be a non-negative integer"),
    ({"log_info": False, "log_format": "glog"},
     "log setting 'log_format' must be one of default, ISO8601; got 'glog'"),
    ({"log_info": False, "log_file": "/etc/passwd"},
     "log setting 'log_file' cannot be changed over the API (any client could choose a file "
     "for the server to write); redirect the server's output"),
])
def test_a_wrong_change_changes_nothing(attached, changes: dict, message: str) -> None:
    settings, _, _ = attached
    before = settings.current()
    with pytest.raises(InvalidArgumentError, match=f"^{re.escape(message)}$"):
        settings.update(changes)
    assert settings.current() == before


def test_settings_start_from_the_log_level() -> None:
    assert LogSettings("WARNING").current() == {
        "log_file": "", "log_info": False, "log_warning": True, "log_error": True,
        "log_verbose_level": 0, "log_format": "default"}
    assert LogSettings("debug").current()["log_verbose_level"] == 1
    with pytest.raises(ValueError, match="log level 'LOUD'"):
        LogSettings("LOUD")
