"""The exceptions shared by ``atari`` and ``acer_sync``: the user's mistakes, and envs that fail.

It lives at the bottom, in the env package, so that ``atari`` can raise it without importing
``acer_sync`` (which imports ``atari``, never the other way round); ``acer_sync.UserError`` is this
class. The scripts turn it into one ``prog: error: ...`` line and exit code 2
(:func:`acer_sync.base.errors.run_cli`).
"""


class UserError(Exception):
    """A mistake in the user's input (flags, env id, files). Its message is the whole report."""


class EnvFailed(RuntimeError):
    """An env failed while a run used it: it raised an exception, returned a non-finite
    observation or reward, or its worker process died (:class:`EnvWorkerDied`). The message names
    the env and what went wrong, in one line."""


class EnvWorkerDied(EnvFailed):
    """A ``subproc`` worker process ended; the message names the env and how it ended."""


class EnvTimedOut(EnvFailed):
    """An env's step or reset did not return in time: past the run's ``env_timeout``, or past
    the grace period after a stop signal came in the middle of it."""


def past_env_timeout(seconds: float) -> str:
    """How an :class:`EnvTimedOut` past ``--env-timeout`` ends: "ENV's step " and this."""
    return f"did not return within --env-timeout {seconds:g} s"
