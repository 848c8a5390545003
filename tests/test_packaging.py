"""Every data file the packages read is installed by a non-editable ``pip install .``.

A file outside ``[tool.setuptools.package-data]`` works from a checkout (and in the editable install
the test suite uses) but is missing from a wheel: ``pip install . && muonsim predict`` then ran
without the shipped model × system defaults. This test matches every non-Python file under each
package directory against the declared globs.
"""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("topologies", "workloads", "costmodel", "reference", "cli")


def _package_data() -> dict[str, list[str]]:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["setuptools"]["package-data"]


def _declared(package: str, relative: str, globs: dict[str, list[str]]) -> bool:
    """Whether ``relative`` (a path under top-level ``package``) matches a glob of its package or
    of a sub-package (setuptools applies a sub-package's globs relative to its own directory)."""
    parts = relative.split("/")
    for depth in range(len(parts)):
        owner = ".".join([package, *parts[:depth]])
        rest = "/".join(parts[depth:])
        if any(fnmatch.fnmatch(rest, g) and rest.count("/") == g.count("/") for g in globs.get(owner, [])):
            return True
    return False


def test_every_data_file_is_package_data() -> None:
    globs = _package_data()
    missing = []
    for package in PACKAGES:
        base = ROOT / package
        for path in base.rglob("*"):
            if path.is_dir() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            relative = path.relative_to(base).as_posix()
            if not _declared(package, relative, globs):
                missing.append(f"{package}/{relative}")
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
