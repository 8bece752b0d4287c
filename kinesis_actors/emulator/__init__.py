"""The embedded emulator: moto in server mode on loopback, Kinesis and DynamoDB at one URL.

* :class:`Emulator` (:mod:`~kinesis_actors.emulator.launcher`): the server in a child
  process of this one, a context manager; ``emu.endpoint`` is its URL.
* :func:`serve` (:mod:`~kinesis_actors.emulator.server`): the same server in the calling
  process (the ``kinesis-actors emulator`` command).
* :mod:`~kinesis_actors.emulator.patches`: what is patched in moto, and why (lost
  records under concurrent puts, O(n) puts, non-atomic conditional writes).

Tests and demos only: it is not part of the library's read path.
"""

from __future__ import annotations

from .errors import EmulatorError, MotoPatchError
from .launcher import Emulator
from .server import DEFAULT_HOST, REQUESTS_PATH, serve

__all__ = ["Emulator", "serve", "EmulatorError", "MotoPatchError", "DEFAULT_HOST", "REQUESTS_PATH"]
