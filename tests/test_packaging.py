"""pyproject.toml installs what the repo holds and requires what requirements.txt pins."""

import ast
import tomllib

from helpers import ROOT


def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)


def test_pyproject_requires_exactly_the_pinned_requirements():
    project = pyproject()["project"]
    declared = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        declared.extend(extra)
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    pinned = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert sorted(declared) == sorted(pinned)


def test_the_repos_packages_and_the_modules_they_import_are_installed():
    setuptools = pyproject()["tool"]["setuptools"]
    packages = sorted(path.parent.name for path in ROOT.glob("*/__init__.py"))
    assert sorted(setuptools["packages"]) == packages
    root_modules = {path.stem for path in ROOT.glob("*.py")}
    imported = set()
    for package in packages:
        for source in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    imported.add(node.module.split(".")[0])
                elif isinstance(node, ast.Import):
                    imported.update(alias.name.split(".")[0] for alias in node.names)
    assert imported & root_modules == set(setuptools["py-modules"]) == {"user_errors"}
    data = [path for pattern in setuptools["package-data"]["acer_sync"] for path in (ROOT / "acer_sync").glob(pattern)]
    assert (ROOT / "acer_sync" / "data" / "atari_scores.json") in data
