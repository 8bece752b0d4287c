"""The emulator's errors (both in the ``KinesisError`` family)."""

from __future__ import annotations

from ..errors import KinesisError

__all__ = ["EmulatorError", "MotoPatchError"]


class EmulatorError(KinesisError, RuntimeError):
    """The emulator could not be started, reached or reset.

    Raised by :meth:`Emulator.start` when the child process exits early or does not
    answer HTTP within ``startup_timeout_s``, by :meth:`Emulator.reset` when the
    server does not accept the reset, and by :attr:`Emulator.endpoint` before the
    first :meth:`Emulator.start`.
    """


class MotoPatchError(EmulatorError):
    """moto's internals no longer look like the ones :mod:`kinesis_actors.emulator` patches.

    Raised at emulator startup (in the server process) instead of serving an emulator
    that could lose records; pin ``moto`` to a tested 5.2.x release or update the patch.
    """
