"""Every error has exactly one HTTP code and one gRPC code."""

import grpc
import pytest

import tensorgate.errors as errors
from tensorgate.errors import Status, TensorgateError
from tensorgate.protocol.status import STATUS_CODES, codes_for


def _error_classes() -> list[type[TensorgateError]]:
    found = []
    pending = [TensorgateError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def test_every_status_has_codes() -> None:
    assert set(STATUS_CODES) == set(Status)
    for http, grpc_name in STATUS_CODES.values():
        assert 400 <= http < 600
        assert hasattr(grpc.StatusCode, grpc_name)


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_every_error_class_maps(cls: type[TensorgateError]) -> None:
    assert cls.status in STATUS_CODES
    assert cls.__name__ in errors.__all__


def test_expected_codes() -> None:
    assert codes_for(errors.InvalidArgumentError("x")) == (400, "INVALID_ARGUMENT")
    assert codes_for(errors.NotFoundError("x")) == (404, "NOT_FOUND")
    assert codes_for(errors.PoolExhaustedError(1, 2, 3)) == (503, "UNAVAILABLE")
    assert codes_for(RuntimeError("boom")) == (500, "INTERNAL")
