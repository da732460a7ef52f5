"""User-facing errors: one line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import sys
from typing import Callable

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake in the user's input (flags, env id, files). Its message is the whole report."""


def run_cli(main: Callable[[], int | None], prog: str) -> None:
    """Run ``main`` and turn a :class:`UserError` into ``prog: error: message`` and exit 2."""
    try:
        code = main()
    except UserError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    sys.exit(code or 0)
