"""`tensorgate check` (check.py): a repository loaded as serve loads it, a line a model, and
the exit status a deploy pipeline reads; no port is opened."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from tests.pipeline import repo_builder as rb


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("check") / "models"
    rb.add_torchscript(root, "good", rb.Identity(), [4], [4])
    rb.add_torchscript(root, "pickled", rb.Identity(), [4], [4])
    torch.save(rb.Identity(), root / "pickled" / "1" / "model.pt")  # over the TorchScript
    return root


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tensorgate", "check", *args],
                          capture_output=True, text=True, timeout=120)


def test_a_repository_with_a_model_that_does_not_load_fails_the_check(
        repo: pathlib.Path) -> None:
    done = _check("--model-repository", str(repo), "--placement", "none")
    assert done.returncode == 1, done.stderr
    pickled = repo / "pickled" / "1" / "model.pt"
    assert done.stdout.splitlines() == [
        "READY        good v1",
        f"UNAVAILABLE  pickled v1: {pickled}: model.pt is a pickled tests.pipeline.repo_builder."
        "Identity written by torch.save, not a model tensorgate loads (it does not unpickle "
        "models: that runs whatever code the file names). Save TorchScript as model.pt "
        "(torch.jit.script(module).save(path), or torch.jit.trace), a torch.export program as "
        "model.pt2 (torch.export.save), or load the weights in a model.py "
        "(ModelContext.load_weights)",
        f"1 of 2 models ready ({repo})"]
    assert "failed to load" not in done.stderr  # said once, in the table


def test_the_models_named_are_checked_and_one_not_there_is_said_so(
        repo: pathlib.Path) -> None:
    done = _check("--model-repository", str(repo), "--load-model", "good",
                  "--placement", "none")
    assert (done.returncode, done.stdout.splitlines()) == (
        0, ["READY  good v1", f"1 of 1 model ready ({repo})"]), done.stderr
    done = _check("--model-repository", str(repo), "--load-model", "good",
                  "--load-model", "missing", "--placement", "none")
    assert (done.returncode, done.stdout.splitlines()) == (1, [
        "READY        good v1", f"UNAVAILABLE  missing: no model 'missing' in {repo}",
        f"1 of 2 models ready ({repo})"]), done.stderr


def test_a_repository_that_is_not_there_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    done = _check("--model-repository", str(tmp_path / "nothing"))
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"tensorgate: model repository '{tmp_path / 'nothing'}' is not a directory\n")
    done = _check("--model-repository", str(tmp_path), "--model-repository", str(tmp_path))
    assert (done.returncode, done.stderr) == (
        2, f"tensorgate: model_repository names '{tmp_path}' and '{tmp_path}', the same "
           "folder: every model of it would be in two repositories\n")


def test_without_the_flag_it_checks_the_repository_serve_would_read(
        repo: pathlib.Path) -> None:
    """TENSORGATE_MODEL_REPOSITORY, as serve reads it: a pipeline that sets only that must
    not pass by checking the built-in repository."""
    done = subprocess.run([sys.executable, "-m", "tensorgate", "check", "--placement", "none"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TENSORGATE_MODEL_REPOSITORY": str(repo)})
    assert (done.returncode, done.stdout.splitlines()[-1]) == (
        1, f"1 of 2 models ready ({repo})"), done.stderr
