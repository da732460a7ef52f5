"""The command line: ``train``, ``play``, ``plot`` and ``sweep``, each a module with
``main(argv, prog)`` that returns an exit code, run by :func:`acer_sync.base.errors.run_cli`.

They are reached as ``python -m acer_sync COMMAND`` (:mod:`acer_sync.__main__`), as the console
scripts that ``pip install .`` puts on the PATH (``acer-sync COMMAND``, ``acer-train``, ...), and
from a clone as the thin scripts ``train.py``, ``play.py``, ``plot.py`` and ``sweep.py``.
:mod:`acer_sync.cli.args` holds their shared parsing.
"""
