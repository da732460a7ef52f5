"""The one exception for mistakes in the user's input, shared by ``atari`` and ``acer_sync``.

It lives at the bottom, in the env package, so that ``atari`` can raise it without importing
``acer_sync`` (which imports ``atari``, never the other way round); ``acer_sync.UserError`` is this
class. The scripts turn it into one ``prog: error: ...`` line and exit code 2
(:func:`acer_sync.base.errors.run_cli`).
"""


class UserError(Exception):
    """A mistake in the user's input (flags, env id, files). Its message is the whole report."""
