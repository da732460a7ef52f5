"""The package layout is a staircase: each floor of ``acer_sync`` imports only the floors below it.

Read from the sources' ``import`` statements (``ast``), so a change that sends an arrow up a floor
or closes a circle fails here, before it shows as a slow import or a circular-import error.
"""

import ast
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

#: The floors of ``acer_sync``, bottom first: a module may import its own floor and those below.
FLOORS = ("math", "base", "nets", "replay", "rollout", "training", "api", "sweeps", "cli")
#: Scripts at the top level: nothing in a package imports them.
SCRIPTS = {path.stem for path in ROOT.glob("*.py")}
#: What the pure math never imports: envs, command lines, files, processes.
NOT_IN_MATH = {"gymnasium", "ale_py", "atari", "argparse", "os", "sys", "io", "pathlib", "csv", "json", "pickle",
               "tempfile", "shutil", "subprocess", "tqdm", "yaml", "numpy"}


def imports_of(path: Path) -> set[str]:
    """The absolute module names ``path`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules() -> dict[str, set[str]]:
    sources = [*(ROOT / "acer_sync").rglob("*.py"), *(ROOT / "atari").rglob("*.py")]
    return {module_name(path): imports_of(path) for path in sources}


def floor_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] == ["acer_sync", "__main__"]:
        return "cli"  # ``python -m acer_sync`` and the console scripts: the command line's door
    return parts[1] if parts[0] == "acer_sync" and len(parts) > 1 and parts[1] in FLOORS else None


def test_every_module_of_acer_sync_sits_on_a_floor():
    loose = [m for m in package_modules() if m.startswith("acer_sync.") and floor_of(m) is None]
    assert loose == []


def test_each_floor_imports_only_the_floors_below_it():
    arrows_up = []
    for module, imported in package_modules().items():
        floor = floor_of(module)
        if floor is None:
            continue
        for name in imported:
            target = floor_of(name)
            if target is not None and FLOORS.index(target) > FLOORS.index(floor):
                arrows_up.append(f"{module} -> {name}")
            if name.split(".")[0] == "atari" and floor == "math":
                arrows_up.append(f"{module} -> {name}")
    assert arrows_up == []


def test_the_package_face_imports_nothing_until_a_name_is_used():
    assert imports_of(ROOT / "acer_sync" / "__init__.py") <= {"__future__", "__future__.annotations", "importlib"}


def test_no_module_imports_a_circle():
    graph = package_modules()
    edges = {m: {n for n in imported if n in graph and n != m} for m, imported in graph.items()}
    # A package's __init__ is not an edge of its modules: they import the package implicitly.
    done, stack, circles = set(), [], []

    def visit(module):
        if module in stack:
            circles.append(stack[stack.index(module):] + [module])
            return
        if module in done:
            return
        stack.append(module)
        for target in sorted(edges[module]):
            visit(target)
        stack.pop()
        done.add(module)

    for module in sorted(edges):
        visit(module)
    assert circles == []


def test_the_rules_between_parts():
    modules = package_modules()
    for module, imported in modules.items():
        tops = {name.split(".")[0] for name in imported}
        if module.startswith("atari"):
            assert "acer_sync" not in tops, f"{module} imports acer_sync"
        if floor_of(module) == "math":
            assert not tops & NOT_IN_MATH, f"{module} imports {tops & NOT_IN_MATH}"
            assert not {name for name in imported if name.startswith("acer_sync.")} - {
                name for name in imported if floor_of(name) == "math"}, f"{module} imports outside the math"
        if floor_of(module) != "sweeps":
            assert "ray" not in tops, f"{module} imports Ray"
        assert not tops & SCRIPTS, f"{module} imports the scripts {tops & SCRIPTS}"
        if floor_of(module) in ("math", "base", "nets", "replay", "rollout", "training"):
            assert not tops & {"matplotlib", "argparse"}, f"{module} imports plotting or CLI code"


def test_loading_a_policy_imports_no_training_loop():
    code = (
        "import sys, acer_sync, numpy\n"
        f"policy = acer_sync.load({str(ROOT / 'tests' / 'data' / 'format1' / 'cartpole_mlp')!r})\n"
        "policy.predict(numpy.zeros(4, dtype=numpy.float32))\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('acer_sync'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "acer_sync.api.policy" in loaded
    for loop in ("acer_sync.training.trainer", "acer_sync.training.acer", "acer_sync.rollout.runner",
                 "acer_sync.replay.buffer", "acer_sync.api.runs", "acer_sync.sweeps"):
        assert loop not in loaded
