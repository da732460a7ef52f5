"""The docs: the README stays short and its links land, and the flag tables of docs/training.md are
train's own ``--help`` (``tools/docs_hooks.py``). ``mkdocs build --strict`` in ``.ci/run`` checks the
site's links and references."""

import importlib.util
import re

from acer_sync.base.config import RESUMABLE_CHANGES, fields
from acer_sync.cli.args import FLAG_GROUPS
from helpers import ROOT


def docs_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "tools" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_is_short_and_its_links_land():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    targets = re.findall(r"\]\(((?!https?:|#)[^)#\s]+)", readme)
    assert any(target.startswith("docs/") for target in targets)
    assert [target for target in targets if not (ROOT / target).exists()] == []
    assert "pip install -r requirements.txt" in readme and "python train.py --env PongNoFrameskip-v4" in readme


def test_the_flag_tables_are_trains_help_group_by_group():
    hooks = docs_hooks()
    page = (ROOT / "docs" / "training.md").read_text()
    assert [match["group"] for match in hooks.FLAGS.finditer(page)] == list(FLAG_GROUPS)
    rendered = hooks.on_page_markdown(page, None, None, None)
    assert "<!-- flags" not in rendered
    for f in fields():
        flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
        assert f"| `{flag}" in rendered, flag
    for flag in ("--run-dir", "--resume", "--config", "--stop-at-reward", "--no-progress"):
        assert f"| `{flag}" in rendered, flag
    table = hooks.flag_table(hooks.build_parser(), "replay")
    assert "| `--buffer-size N` | 50000; classic-control preset: 5000; continuous preset: 5000 | replay capacity" in table
    run_table = hooks.flag_table(hooks.build_parser(), "run and logging")
    assert "| `--run-dir RUN_DIR` |  | output directory (default: runs/&lt;env&gt;\\_\\_&lt;seed&gt;\\_\\_&lt;time&gt;)" in run_table


def test_the_list_of_what_a_resume_may_change_is_written_in_the_page():
    # it was filled in when the site was built: on GitHub the sentence ended on nothing
    page = (ROOT / "docs" / "training.md").read_text()
    resumable = ", ".join(f"`--{name.replace('_', '-')}`" for name in RESUMABLE_CHANGES)
    assert f"may change on a resume:\n\n{resumable}\n" in page
