"""The embedded emulator: moto in server mode on loopback, Kinesis and DynamoDB at one URL.

* :class:`Emulator` (:mod:`~kinesis_actors.emulator.launcher`): the server in a child
  process of this one, a context manager; ``emu.endpoint`` is its URL.
* :func:`serve` (:mod:`~kinesis_actors.emulator.server`): the same server in the calling
  process (the ``kinesis-actors emulator`` command).
* :class:`KinesisMock` (:mod:`~kinesis_actors.emulator.kinesis_mock`): kinesis-mock
  (npm ``kinesis-local``) on loopback, the Kinesis side of ``Emulator(efo=True)``
  (enhanced fan-out: ``SubscribeToShard``, which moto does not serve).
* :mod:`~kinesis_actors.emulator.patches`: what is patched in moto, and why (lost
  records under concurrent puts, O(n) puts, non-atomic conditional writes).

Tests and demos only: it is not part of the library's read path.
"""

from __future__ import annotations

from .errors import EmulatorError, MotoPatchError
from .kinesis_mock import KinesisMock, install_kinesis_local
from .launcher import Emulator
from .server import DEFAULT_HOST, REQUESTS_PATH, serve

__all__ = ["Emulator", "KinesisMock", "install_kinesis_local",
           "serve", "EmulatorError", "MotoPatchError", "DEFAULT_HOST", "REQUESTS_PATH"]
