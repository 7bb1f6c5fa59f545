"""The public face stays small, sorted, and in step with what the package defines."""

import tensorgate
import tensorgate.errors
import tensorgate.tensor


def test_all_is_sorted_and_complete() -> None:
    for module in (tensorgate, tensorgate.tensor, tensorgate.errors):
        exported = module.__all__
        assert exported == sorted(exported), module.__name__
        for name in exported:
            assert hasattr(module, name), f"{module.__name__}.{name} is exported but missing"


def test_public_classes_live_in_tensorgate() -> None:
    for name in tensorgate.__all__:
        member = getattr(tensorgate, name)
        if isinstance(member, type):
            assert member.__module__.startswith("tensorgate."), name
