"""Where things are in a Triton-layout repository: models, versions, artifact files.

    <repo>/<model>/config.pbtxt
    <repo>/<model>/configs/<name>.pbtxt      (with Triton's --model-config-name <name>)
    <repo>/<model>/<version>/model.pt | model.pt2 | model.py

A server may serve several repositories (Triton's --model-repository, repeated): their
models share one namespace, so a name that two of them hold is served from neither, as in
Triton ("not unique across all model repositories"), until one of them is removed.

Version directories are decimal numbers not starting with 0; anything else is ignored, as
Triton does. The version policy of the config picks which versions are served. A Python
model (`model.py`) may come without config.pbtxt, as in Triton: its `auto_complete_config`
says what the config would (the `complete` step of load_source, which the caller supplies).

A server told a config name (Triton's --model-config-name, for one repository shared by
machines that need different settings: `h100`, `cpu`) reads a model's
`configs/<name>.pbtxt` where the model has one, and its config.pbtxt where it has not.
"""

from __future__ import annotations

import difflib
import os
import pathlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as pb

from tensorgate.errors import InvalidArgumentError, NotFoundError
from tensorgate.repository.checksum_agent import file_checksums, verify_checksums
from tensorgate.repository.model_config import (ModelConfigError, ModelSpec, check_file_name,
                                                model_config_from_json, model_spec,
                                                read_model_config, version_policy)

__all__ = ["ARTIFACT_KINDS", "CompleteConfig", "ModelRepositories", "ModelSource",
           "artifact_file", "artifact_path", "check_config_name", "check_repository_folders",
           "config_file", "discover_models", "load_source",
           "model_fingerprints", "select_versions"]

MAX_FINGERPRINT_FILES = 10_000  # per model: a scan of a runaway directory stays bounded

# artifact file → kind; a config's platform/backend may choose between them.
ARTIFACT_KINDS = {"model.pt": "torchscript", "model.pt2": "pt2", "model.py": "python"}
_PLATFORM_KINDS = {"pytorch_libtorch": "torchscript", "torch_aoti": "pt2",
                   "pytorch_export": "pt2", "python": "python", "pytorch": None}


@dataclass(frozen=True)
class ModelSource:
    """A model's config and the version directories its policy selects; `config_source`
    names where the config came from (a file, or a load request's override)."""

    spec: ModelSpec
    directory: pathlib.Path
    versions: tuple[int, ...]
    config_source: str


# A loader's step between reading a config and checking it: (config, the folder of the
# version to serve last) → the config completed (a Python model's auto_complete_config).
CompleteConfig = Callable[[pb.ModelConfig, pathlib.Path], pb.ModelConfig]


_REMOTE = ("s3:/", "gs:/", "as:/", "http:/", "https:/")  # (a Path keeps one slash of two)


def check_repository_folders(paths: Iterable[pathlib.Path]) -> None:
    """ValueError naming a repository that is not a local folder, before the server starts
    (it was a traceback from the first model scan): cloud storage, as Triton reads it, is
    said to be so."""
    for path in paths:
        text = str(path)
        if text.startswith(_REMOTE):
            scheme = text.split(":", 1)[0]
            raise ValueError(f"model repository '{scheme}://{text.split(':/', 1)[1]}': cloud "
                             "storage is not read here; copy the repository to a local "
                             "folder (KServe's storage initializer does) and serve that")
        if not path.is_dir():
            raise ValueError(f"model repository '{path}' is not a directory")


def check_config_name(name: str) -> str:
    """`name` as a config name (--model-config-name), or ValueError saying why not: it
    names a file in each model's configs/ folder, so a word, not a path (Triton: no
    spaces)."""
    if name in (".", "..") or any(c in name for c in "/\\\0") \
            or any(c.isspace() for c in name):
        raise ValueError(f"model config name '{name}' must be a file name without spaces "
                         "or slashes: the server reads <model>/configs/<name>.pbtxt")
    return name


def config_file(directory: pathlib.Path, config_name: str = "") -> pathlib.Path:
    """The config file of the model in `directory`: configs/<config_name>.pbtxt when a name
    is given and the model has that file, else config.pbtxt (which may not exist)."""
    if config_name:
        custom = directory / "configs" / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    return directory / "config.pbtxt"


def discover_models(repository: pathlib.Path, config_name: str = "") -> list[str]:
    """Names of the model directories holding a config (config_file), or a Python model
    without one, or a model file without one (which fails its load saying so), sorted."""
    if not repository.is_dir():
        raise NotFoundError(f"model repository '{repository}' is not a directory")
    return sorted(p.name for p in repository.iterdir() if _model_folder(p, config_name))


def _python_model(directory: pathlib.Path) -> bool:
    """Whether a version directory of `directory` holds a model.py."""
    try:
        return any((directory / str(v) / "model.py").is_file()
                   for v in _numeric_versions(directory))
    except OSError:
        return False


def model_fingerprints(repository: pathlib.Path, config_name: str = ""
                       ) -> dict[str, tuple[object, ...]]:
    """Each model directory's files as (path, size, mtime) tuples: equal fingerprints, the
    same model on disk (its configs/ folder included: a config added there, or removed, is
    a change). What a poll compares to find models added, changed or removed. Reads the
    file system: call it off the event loop."""
    prints: dict[str, tuple[object, ...]] = {}
    for name in discover_models(repository, config_name):
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


@dataclass(frozen=True)
class ModelRepositories:
    """The repositories a server serves from, in the order given: one namespace of model
    names; `config_name`, the config each model's configs/ folder gives where it has one
    (config_file). Every method reads the file system: call them off the event loop."""

    paths: tuple[pathlib.Path, ...]
    config_name: str = ""

    @classmethod
    def of(cls, given: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
           config_name: str = "") -> ModelRepositories:
        """From one path or several; ValueError for none, one folder named twice (every
        model of it would be in two repositories), or a config name that is not a file
        name."""
        if isinstance(given, (str, os.PathLike)):
            given = [given]
        paths = tuple(pathlib.Path(p) for p in given)
        if not paths:
            raise ValueError("no model repository given")
        seen: dict[pathlib.Path, pathlib.Path] = {}
        for path in paths:
            same = seen.setdefault(path.resolve(), path)
            if same is not path:
                raise ValueError(f"'{same}' and '{path}', the same folder: every model of it "
                                 "would be in two repositories")
        return cls(paths, check_config_name(config_name))

    def __str__(self) -> str:
        return ", ".join(map(str, self.paths))

    def names(self) -> list[str]:
        """Every model name any repository holds (a name held twice once), sorted."""
        return sorted({name for path in self.paths
                       for name in discover_models(path, self.config_name)})

    def holder(self, name: str) -> pathlib.Path:
        """The repository that holds model `name`; NotFoundError when none does, and an
        InvalidArgumentError naming each of its folders when more than one does."""
        holders = [] if _not_a_name(name) else [
            path for path in self.paths if _model_folder(path / name, self.config_name)]
        if len(holders) == 1:
            return holders[0]
        if holders:
            raise InvalidArgumentError(
                f"model '{name}' is not unique across the model repositories: it is in "
                + ", ".join(f"'{path / name}'" for path in holders)
                + "; remove or rename all but one")
        if len(self.paths) == 1:
            raise NotFoundError(f"no model '{name}' in repository '{self.paths[0]}'")
        raise NotFoundError(f"no model '{name}' in any of the repositories "
                            + ", ".join(f"'{path}'" for path in self.paths))

    def fingerprints(self) -> dict[str, tuple[object, ...]]:
        """model_fingerprints of every repository together: a model's name held by two
        has both folders' files, so removing either one changes it."""
        prints: dict[str, tuple[object, ...]] = {}
        for path in self.paths:
            for name, entries in model_fingerprints(path, self.config_name).items():
                prints[name] = prints.get(name, ()) + entries
        return prints


def _not_a_name(name: str) -> bool:
    """Whether `name` would lead anywhere but to a folder of a repository."""
    return "/" in name or name in ("", ".", "..")


def _model_folder(directory: pathlib.Path, config_name: str = "") -> bool:
    """Whether `directory` is a model's folder, as discover_models counts them: one that
    holds a model file but no config is too (not a hidden one), so that its load says what
    is missing rather than the model not being there at all."""
    return directory.is_dir() and (config_file(directory, config_name).is_file()
                                   or _python_model(directory)
                                   or (not directory.name.startswith(".")
                                       and bool(_model_files(directory))))


def _model_files(directory: pathlib.Path) -> list[pathlib.Path]:
    """The model files (ARTIFACT_KINDS) in `directory` itself and in its version folders."""
    try:
        folders = [directory] + [directory / str(v) for v in _numeric_versions(directory)]
        return [folder / name for folder in folders for name in ARTIFACT_KINDS
                if (folder / name).is_file()]
    except OSError:
        return []


def _misplaced(directory: pathlib.Path) -> str:
    """Where a model file lies in the model's folder itself, where it should go."""
    files = [name for name in ARTIFACT_KINDS if (directory / name).is_file()]
    if not files:
        return ""
    return (f"; {files[0]} lies in the model's folder itself: move it into a version "
            f"folder ({directory / '1' / files[0]})")


def _numeric_versions(directory: pathlib.Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir()
                  if p.is_dir() and p.name.isdecimal() and not p.name.startswith("0"))


def select_versions(policy: tuple[str, tuple[int, ...]], available: list[int]
                    ) -> tuple[int, ...]:
    kind, numbers = policy
    if kind == "latest":
        return tuple(available[-numbers[0]:])
    if kind == "all":
        return tuple(available)
    return tuple(v for v in numbers if v in available)


def load_source(repository: pathlib.Path, name: str, config: str | None = None,
                complete: CompleteConfig | None = None, config_name: str = "",
                rename: bool = False, checksums: bool = False) -> ModelSource:
    """Read `<repository>/<name>`: its config and the versions to serve. The config is the
    directory's config_file (configs/<config_name>.pbtxt where it has one, else
    config.pbtxt); `config`, a JSON config (a load request's override), stands in for it;
    without either, a Python model's config is `backend: "python"` until `complete`
    completes it. `complete` may import the model's code: call it off the event loop.
    `rename`: the model is `name` whatever its config's name field says (a folder served
    under a name given at its load: SageMaker's multi-model endpoints). `checksums`: the
    files its checksum agent names are read and checked (repository/checksum_agent.py),
    before `complete` runs any of its code: a load's, not a look at its config."""
    directory = repository / name
    if rename:  # a link to the folder (link_folder): errors name the folder itself
        directory = directory.resolve()
    file = config_file(directory, config_name)
    unconfigured = config is None and not file.is_file()  # a Python model's code says it
    if _not_a_name(name) or not directory.is_dir():
        raise NotFoundError(f"no model '{name}' in repository '{repository}'")
    if unconfigured and not _python_model(directory):
        files = {path.name for path in _model_files(directory)}
        if not files:
            raise NotFoundError(f"no model '{name}' in repository '{repository}'")
        if files == {"model.py"}:
            raise ModelConfigError(str(directory), "has no version folder holding its "
                                                   "model.py" + _misplaced(directory))
        raise ModelConfigError(str(directory), "has no config.pbtxt: a TorchScript or "
                                               "torch.export model needs one giving its "
                                               "inputs, outputs and max_batch_size, which "
                                               "the file does not say (as on Triton's PyTorch "
                                               "backend); only a model.py may come without it"
                                               + _misplaced(directory))
    if config is not None:
        source = f"the load request's 'config' of model '{name}'"
        message = model_config_from_json(config, source)
        named_by = "the model being loaded"
    elif not unconfigured:
        source, message, named_by = str(file), read_model_config(file), "the model directory"
    else:  # as Triton: a model.py and no config is a Python model whose code says the rest
        source, named_by = str(directory), "the model directory"
        message = pb.ModelConfig(name=name, backend="python")
    if rename:
        message.name = name
    policy = version_policy(message, source)
    versions = select_versions(policy, _numeric_versions(directory))
    if not versions:
        raise ModelConfigError(str(directory), "no version directory matches the version "
                                               f"policy {policy[0]} {list(policy[1])}"
                                               + _misplaced(directory))
    agreed = file_checksums(message, source)  # (its form checked at every look)
    if checksums:
        verify_checksums(directory, agreed)
    if complete is not None and message.platform != "ensemble":
        _check_default_file(message, source)
        if not message.name:  # as the model's code will see it (model_spec checks a given one)
            message.name = name
        message = complete(message, directory / str(versions[-1]))
    if unconfigured and not (message.input or message.output):
        raise ModelConfigError(str(directory), "has no config.pbtxt, and nothing said what "
                                               "the model's inputs and outputs are: give a "
                                               "config.pbtxt, or an auto_complete_config in "
                                               "its TritonPythonModel (called unless the "
                                               "server runs with "
                                               "--disable-auto-complete-config)")
    return ModelSource(model_spec(message, source, name, named_by), directory, versions,
                       source)


def _check_default_file(config: pb.ModelConfig, source: str) -> None:
    """The file is looked for (and may be imported to complete the config) before the config
    is checked as a whole: its name must not lead out of the version's folder."""
    if config.default_model_filename:
        check_file_name(config.default_model_filename, "default_model_filename",
                        "each version's directory", source)


def artifact_file(folder: pathlib.Path, config: pb.ModelConfig, filename: str = ""
                  ) -> tuple[pathlib.Path, str]:
    """(file, kind) of the artifact in `folder`, chosen by filename, platform and backend:
    `filename` where given (cc_model_filenames' for the instances' GPUs, checked by
    model_spec), else the config's default_model_filename, which stays in `folder`."""
    _check_default_file(config, str(folder))
    wanted = _PLATFORM_KINDS.get(config.platform) or _PLATFORM_KINDS.get(config.backend)
    chosen = filename or config.default_model_filename
    names = [chosen] if chosen else list(ARTIFACT_KINDS)
    for name in names:
        path = folder / name
        kind = ARTIFACT_KINDS.get(path.suffix and "model" + path.suffix, "")
        if path.is_file() and (wanted is None or kind == wanted):
            for field, value in (("platform", config.platform), ("backend", config.backend)):
                if value and value not in _PLATFORM_KINDS:
                    raise ModelConfigError(str(folder), _unknown_platform(field, value, path))
            return path, kind
    for field, value in (("platform", config.platform), ("backend", config.backend)):
        if value and value not in _PLATFORM_KINDS:  # another framework's model, likely
            raise ModelConfigError(str(folder), f"no model artifact found, and {field} "
                                                f"'{value}' is not served here: tensorgate "
                                                "serves PyTorch models (pytorch_libtorch: "
                                                "model.pt; torch_aoti or pytorch_export: "
                                                "model.pt2; the python backend: model.py) and "
                                                "ensembles")
    raise ModelConfigError(str(folder), f"no model artifact found; looked for "
                                        f"{', '.join(names)} (platform '{config.platform}', "
                                        f"backend '{config.backend}')")


def _unknown_platform(field: str, name: str, found: pathlib.Path) -> str:
    """Why a model file is not loaded under a platform or backend no one serves by that name
    (a typo of ours, or another framework's: Triton refuses an unknown one too)."""
    known = [*_PLATFORM_KINDS, "ensemble"] if field == "platform" else ["python", "pytorch"]
    close = difflib.get_close_matches(name, known, n=1)
    guess = f" (did you mean '{close[0]}'?)" if close else ""
    return (f"{field} '{name}' is not one tensorgate serves{guess}, so {found.name} is "
            "not loaded by it: pytorch_libtorch serves model.pt, torch_aoti or pytorch_export "
            "model.pt2, backend python model.py, and platform ensemble its steps")


def artifact_path(source: ModelSource, version: int, filename: str = ""
                  ) -> tuple[pathlib.Path, str]:
    """(file, kind) of the artifact for `version`: `filename`, where given."""
    return artifact_file(source.directory / str(version), source.spec.config, filename)
