"""The one exception for mistakes in the user's input, shared by ``acer_sync`` and ``atari``.

It lives in a module of its own so that the env package ``atari`` can raise it without importing
the trainer package ``acer_sync`` (which imports ``atari``, never the other way round). The
scripts turn it into one ``prog: error: ...`` line and exit code 2 (``acer_sync.errors.run_cli``).
"""


class UserError(Exception):
    """A mistake in the user's input (flags, env id, files). Its message is the whole report."""
