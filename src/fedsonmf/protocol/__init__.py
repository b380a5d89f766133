"""What the server and the clients agree on: the run configuration
(:class:`~.config.FedConfig`), the messages and states that cross between them
(:mod:`.messages`), and the per-round history and result of a run (:mod:`.history`)."""

from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import FitResult, History
from fedsonmf.protocol.messages import ClientState, Message, ServerState

__all__ = ["FedConfig", "FitResult", "History", "ClientState", "Message", "ServerState"]
