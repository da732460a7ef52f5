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


def test_the_repos_packages_are_installed_and_import_no_top_level_script():
    setuptools = pyproject()["tool"]["setuptools"]
    top_level = sorted(path.parent.name for path in ROOT.glob("*/__init__.py"))
    assert top_level == ["acer_sync", "atari"]  # a pip install adds no other top-level name
    include = setuptools["packages"]["find"]["include"]
    assert include == ["acer_sync", "acer_sync.*", "atari"]
    assert "py-modules" not in setuptools
    root_modules = {path.stem for path in ROOT.glob("*.py")}
    imported = set()
    for package in top_level:
        for source in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0:
                    imported.add(node.module.split(".")[0])
                elif isinstance(node, ast.Import):
                    imported.update(alias.name.split(".")[0] for alias in node.names)
    assert imported & root_modules == set()
    data = [path for pattern in setuptools["package-data"]["acer_sync"] for path in (ROOT / "acer_sync").glob(pattern)]
    assert (ROOT / "acer_sync" / "data" / "atari_scores.json") in data
    # the tuned settings per env, which an installed acer_sync applies as a clone does
    assert set((ROOT / "acer_sync" / "data" / "envs").glob("*.yaml")) <= set(data) and len(data) > 5
