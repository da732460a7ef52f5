"""The suite's own setup (tests/conftest.py): the files that start Ray share one pytest-xdist worker."""

import re

from conftest import RAY_FILES, work_unit

from helpers import ROOT

# A test file starts Ray where it runs sweep.py, bench_sweep.py or the test cluster (a path under ROOT), or
# imports ray itself.
STARTS_RAY = re.compile(r'/ "(?:bench_)?sweep\.py"|/ "ray_cluster\.py"|^\s*(?:import ray|from ray)\b', re.MULTILINE)


def test_the_files_that_start_ray_are_the_ones_run_one_after_the_other():
    starting = {path.name for path in (ROOT / "tests").glob("test_*.py") if STARTS_RAY.search(path.read_text())}
    assert starting == RAY_FILES


def test_each_file_is_one_unit_of_work_and_the_ray_files_are_one_together():
    assert work_unit("tests/test_plot.py::test_a[1]") == work_unit("tests/test_plot.py::test_b") == "tests/test_plot.py"
    assert work_unit("tests/test_api.py::test_a") == "tests/test_api.py"
    assert {work_unit(f"tests/{name}::test_a") for name in RAY_FILES} == {"ray"}
