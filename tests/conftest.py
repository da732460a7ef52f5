"""Test options: slow tests are deselected unless --runslow is given or the test is named; with pytest-xdist's
``-n 2`` (the README's and CI's command) the suite runs in two workers, a test file at a time, the files
that start Ray in one worker one after the other.

Many tests wait on a train.py process, a signal or a timeout with a core idle, so two workers take about
0.6 of the time one takes on two cores. A file is one unit of work, so a module's fixtures are built once;
no two Ray clusters start at once: each counts the machine's cores as its own, and a ``ray.init()``
without an address joins the latest cluster that ``ray start`` began on the machine. Plain ``pytest`` (the
GPU box's image has no pytest-xdist) runs the suite in this process, as before.
"""

import sys
from pathlib import Path

import pytest

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


RAY_FILES = {"test_bench.py", "test_cluster.py", "test_sweep.py"}


def work_unit(nodeid: str) -> str:
    """A test's unit of work in pytest-xdist: its file, or "ray" for the files that start Ray."""
    path = nodeid.split("::", 1)[0]
    return "ray" if Path(path).name in RAY_FILES else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's file-by-file scheduling, with the files that start Ray as one unit."""
    from xdist.scheduler import LoadFileScheduling

    class FilesWithRayTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return FilesWithRayTogether(config, log)
