"""Drivers that move :class:`~fedsonmf.messages.Message` objects between the
server loop (:func:`fedsonmf.federation.run_federation`) and the clients."""

from .inprocess import InProcessTransport, run_inprocess

__all__ = ["InProcessTransport", "run_inprocess"]
