"""Test options: slow tests are deselected unless --runslow is given or the test is named."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def _named_on_command_line(nodeid: str, args: list[str]) -> bool:
    """Whether an argument like ``tests/test_x.py::test_name`` selects this test by name."""
    item_file, item_name = nodeid.split("::", 1)
    for arg in args:
        if "::" in arg:
            arg_file, arg_name = arg.split("::", 1)
            if Path(arg_file).name == Path(item_file).name and item_name.startswith(arg_name):
                return True
    return False


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    keep, drop = [], []
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        (drop if slow and not _named_on_command_line(item.nodeid, config.args) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
