"""The in-process engine: every client is a :class:`ClientRuntime` in this process.

Each client object holds only its own view and state, the server loop holds
only the global matrices, and what passes between them is an explicit
:class:`~fedsonmf.protocol.messages.Message` -- exactly what the Flower driver sends.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from fedsonmf._validation import check_n_jobs, check_seed
from fedsonmf.exceptions import ParameterError
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import FitResult
from fedsonmf.protocol.messages import Message

__all__ = ["InProcessTransport", "run_inprocess"]


class InProcessTransport:
    """Deliver messages by calling the clients' handlers directly.

    ``n_jobs > 1`` runs clients in threads (NumPy/BLAS release the GIL in the
    large products); results do not depend on it.
    """

    def __init__(self, clients: Sequence[ClientRuntime], n_jobs: int | None = 1):
        self.clients = list(clients)
        self.n_clients = len(self.clients)
        self.n_jobs = min(check_n_jobs(n_jobs), max(self.n_clients, 1))
        self.log: list[tuple[str, int, Message]] | None = None  # set to [] to record traffic

    def exchange(self, messages: Sequence[Message]) -> list[Message]:
        if len(messages) != self.n_clients:
            raise ValueError(f"{len(messages)} messages for {self.n_clients} clients")
        if self.n_jobs > 1:
            with ThreadPoolExecutor(self.n_jobs) as pool:
                replies = list(pool.map(lambda cm: cm[0].handle(cm[1]), zip(self.clients, messages)))
        else:
            replies = [c.handle(m) for c, m in zip(self.clients, messages)]
        if self.log is not None:
            for p, (m, r) in enumerate(zip(messages, replies)):
                self.log.append(("down", p, m))
                self.log.append(("up", p, r))
        return replies


def run_inprocess(
    views_dn: Sequence,
    cfg: FedConfig,
    algorithm: str = "fedsonmf",
    *,
    max_rounds: int = 100,
    tol: float = 0.0,
    seed: int | None = None,
    callback=None,
    n_jobs: int = 1,
    checkpoint_dir=None,
    resume: bool = False,
) -> FitResult:
    """Run a federation of ``len(views_dn)`` clients in this process.

    ``views_dn`` are validated views in the internal orientation (d_p, n).
    The result's ``bases`` holds every client's final U_p (d_p, r).

    ``checkpoint_dir``: after every round, save the server state + history and
    every client's state there (:mod:`fedsonmf.federation.checkpoint`).  ``resume=True``
    continues the run saved in ``checkpoint_dir`` (same views, config,
    algorithm; the saved seed is used) and ends with the same V as an
    uninterrupted run.
    """
    on_round_end, resume_from = None, None
    n_jobs = check_n_jobs(n_jobs)
    seed = check_seed(seed)
    if resume and checkpoint_dir is None:
        raise ParameterError("resume=True needs checkpoint_dir")
    if checkpoint_dir is not None:
        from fedsonmf.federation import checkpoint as ckpt
        from fedsonmf.federation.loop import _algorithm

        alg_name = _algorithm(algorithm).name
        if resume:
            saved = ckpt.load_server_checkpoint(checkpoint_dir)
            if seed is None:
                seed = saved.run.get("seed")
            run_info = {"algorithm": alg_name, "config": cfg.to_dict(), "seed": seed, "n_clients": len(views_dn)}
            ckpt.check_resume_matches(saved, run_info)
            # each client checks its own saved state against its own view (the fingerprint never leaves it)
            fingerprints = [ckpt.view_fingerprint(X) for X in views_dn]
            states = []
            for p, X in enumerate(views_dn):
                st, meta = ckpt.load_client_state(checkpoint_dir, p, saved.completed_rounds)
                ckpt.verify_client_resume(p, X, st, meta, cfg.n_components, fingerprints[p])
                states.append(st)
            resume_from = (saved.state, saved.history)
        else:
            states = [None] * len(views_dn)
            fingerprints = [ckpt.view_fingerprint(X) for X in views_dn]
            if seed is None:
                import secrets

                seed = secrets.randbits(32)
            run_info = {"algorithm": alg_name, "config": cfg.to_dict(), "seed": seed, "n_clients": len(views_dn)}
        clients = [ClientRuntime(X, algorithm, cfg, state=st) for X, st in zip(views_dn, states)]

        def on_round_end(state, history):
            for p, c in enumerate(clients):  # clients first: the server file commits the round
                ckpt.save_client_state(checkpoint_dir, p, c.state, ckpt.client_resume_meta(c.X, fingerprints[p]))
            ckpt.save_server_checkpoint(checkpoint_dir, state, history, run_info)
    else:
        clients = [ClientRuntime(X, algorithm, cfg) for X in views_dn]
    transport = InProcessTransport(clients, n_jobs=n_jobs)
    result = run_federation(
        transport, algorithm, cfg, max_rounds=max_rounds, tol=tol, seed=seed, callback=callback,
        on_round_end=on_round_end, resume=resume_from,
    )
    result.bases = [c.state.arrays["U"].copy() for c in clients]
    return result
