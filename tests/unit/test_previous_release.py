"""tools/previous_release.py without building anything: which release it picks, and the error
a clone without that release gets."""

from __future__ import annotations

import subprocess

import pytest

from tools import previous_release
from tools.previous_release import PREVIOUS_RELEASE, RELEASE_ENV, ReleaseBuildError


def test_the_ref_comes_from_the_argument_then_the_environment_then_the_constant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(RELEASE_ENV, raising=False)
    assert previous_release.wanted_ref() == PREVIOUS_RELEASE
    monkeypatch.setenv(RELEASE_ENV, "v0.0.9")
    assert previous_release.wanted_ref() == "v0.0.9"
    assert previous_release.wanted_ref("abc123") == "abc123"


def test_a_release_missing_from_the_clone_is_an_error_that_says_what_to_do() -> None:
    with pytest.raises(ReleaseBuildError, match=r"not in this clone.*Fix: `git fetch --unshallow`"):
        previous_release.resolve("no-such-release-tag")


def test_the_pinned_release_is_a_commit_of_this_clone_and_an_ancestor_of_head() -> None:
    commit = previous_release.resolve(PREVIOUS_RELEASE)
    assert commit == PREVIOUS_RELEASE
    ancestor = subprocess.run(
        ["git", "-C", str(previous_release.REPO), "merge-base", "--is-ancestor", commit, "HEAD"],
        timeout=30,
        check=False,
    )
    assert ancestor.returncode == 0, "the previous release must be in this branch's history"


def test_the_cache_folder_is_keyed_by_commit() -> None:
    folder = previous_release.release_dir(PREVIOUS_RELEASE)
    assert folder.name == f"reconciler-release-{PREVIOUS_RELEASE[:12]}"
    assert previous_release.python_of(folder) == folder / "venv" / "bin" / "python"
