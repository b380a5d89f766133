"""The federation: the round loop every driver shares, checkpoints, and the drivers.

* :mod:`.loop` -- :func:`run_federation` (server) and :class:`ClientRuntime` (client)
* :mod:`.checkpoint` -- save / resume of the server's and every client's state
* :mod:`.inprocess` -- the in-process driver (every client an object in this process)
* :mod:`.flower` -- the Flower driver (ServerApp, ClientApp, loopback launcher); needs ``flwr``
"""

from fedsonmf.federation.inprocess import InProcessTransport, run_inprocess
from fedsonmf.federation.loop import ClientRuntime, Transport, run_federation

__all__ = ["ClientRuntime", "Transport", "run_federation", "InProcessTransport", "run_inprocess"]
