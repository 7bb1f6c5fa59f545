"""Where things are in a Triton-layout repository: models, versions, artifact files.

    <repo>/<model>/config.pbtxt
    <repo>/<model>/<version>/model.pt | model.pt2 | model.py

Version directories are decimal numbers not starting with 0; anything else is ignored, as
Triton does. The version policy of the config picks which versions are served.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

from tensorgate.errors import NotFoundError
from tensorgate.repository.model_config import (ModelConfigError, ModelSpec, load_model_config,
                                                parse_model_config_json)

__all__ = ["ARTIFACT_KINDS", "ModelSource", "artifact_path", "discover_models", "load_source",
           "model_fingerprints", "select_versions"]

MAX_FINGERPRINT_FILES = 10_000  # per model: a scan of a runaway directory stays bounded

# artifact file → kind; a config's platform/backend may choose between them.
ARTIFACT_KINDS = {"model.pt": "torchscript", "model.pt2": "pt2", "model.py": "python"}
_PLATFORM_KINDS = {"pytorch_libtorch": "torchscript", "torch_aoti": "pt2",
                   "pytorch_export": "pt2", "python": "python", "pytorch": None}


@dataclass(frozen=True)
class ModelSource:
    """A model's config and the version directories its policy selects."""

    spec: ModelSpec
    directory: pathlib.Path
    versions: tuple[int, ...]


def discover_models(repository: pathlib.Path) -> list[str]:
    """Names of the model directories holding a config.pbtxt, sorted."""
    if not repository.is_dir():
        raise NotFoundError(f"model repository '{repository}' is not a directory")
    return sorted(p.name for p in repository.iterdir()
                  if p.is_dir() and (p / "config.pbtxt").is_file())


def model_fingerprints(repository: pathlib.Path) -> dict[str, tuple[object, ...]]:
    """Each model directory's files as (path, size, mtime) tuples: equal fingerprints, the
    same model on disk. What a poll compares to find models added, changed or removed.
    Reads the file system: call it off the event loop."""
    prints: dict[str, tuple[object, ...]] = {}
    for name in discover_models(repository):
        entries: list[tuple[str, int, int]] = []
        for folder, _, files in os.walk(repository / name):  # symbolic links not followed
            for path in [folder, *(os.path.join(folder, f) for f in files)]:
                try:
                    status = os.stat(path)
                except OSError:  # removed while we looked: the next poll sees the rest
                    continue
                entries.append((path, status.st_size, status.st_mtime_ns))
            if len(entries) >= MAX_FINGERPRINT_FILES:
                break
        prints[name] = tuple(sorted(entries))
    return prints


def _numeric_versions(directory: pathlib.Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir()
                  if p.is_dir() and p.name.isdecimal() and not p.name.startswith("0"))


def select_versions(spec: ModelSpec, available: list[int]) -> tuple[int, ...]:
    kind, numbers = spec.version_policy
    if kind == "latest":
        return tuple(available[-numbers[0]:])
    if kind == "all":
        return tuple(available)
    return tuple(v for v in numbers if v in available)


def load_source(repository: pathlib.Path, name: str, config: str | None = None) -> ModelSource:
    """Read `<repository>/<name>`: its config and the versions to serve. `config`, a JSON
    config (a load request's override), stands in for the directory's config.pbtxt."""
    directory = repository / name
    if "/" in name or name in ("", ".", "..") or not (
            directory.is_dir() if config is not None else (directory / "config.pbtxt").is_file()):
        raise NotFoundError(f"no model '{name}' in repository '{repository}'")
    if config is not None:
        spec = parse_model_config_json(config, f"the load request's 'config' of model '{name}'",
                                       name)
    else:
        spec = load_model_config(directory / "config.pbtxt", expected_name=name)
    versions = select_versions(spec, _numeric_versions(directory))
    if not versions:
        raise ModelConfigError(str(directory), "no version directory matches the version "
                                               f"policy {spec.version_policy[0]} "
                                               f"{list(spec.version_policy[1])}")
    return ModelSource(spec, directory, versions)


def artifact_path(source: ModelSource, version: int) -> tuple[pathlib.Path, str]:
    """(file, kind) of the artifact for `version`, chosen by filename, platform and backend."""
    folder = source.directory / str(version)
    spec = source.spec
    wanted = _PLATFORM_KINDS.get(spec.platform) or _PLATFORM_KINDS.get(spec.backend)
    names = [spec.default_model_filename] if spec.default_model_filename else list(ARTIFACT_KINDS)
    for filename in names:
        path = folder / filename
        kind = ARTIFACT_KINDS.get(path.suffix and "model" + path.suffix, "")
        if path.is_file() and (wanted is None or kind == wanted):
            return path, kind
    raise ModelConfigError(str(folder), f"no model artifact found; looked for "
                                        f"{', '.join(names)} (platform '{spec.platform}', "
                                        f"backend '{spec.backend}')")
