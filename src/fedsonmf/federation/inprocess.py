"""The in-process engine: every client is a :class:`ClientRuntime` in this process.

Each client object holds only its own view and state, the server loop holds
only the global matrices, and what passes between them is an explicit
:class:`~fedsonmf.protocol.messages.Message` -- exactly what the Flower driver sends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fedsonmf._validation import check_n_jobs, check_seed
from fedsonmf.core.masks import held_columns
from fedsonmf.exceptions import ParameterError
from fedsonmf.federation.budget import resolve_budget
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import FitResult
from fedsonmf.protocol.messages import Message

__all__ = ["InProcessTransport", "run_inprocess"]


class InProcessTransport:
    """Deliver messages by calling the clients' handlers directly.

    ``n_jobs > 1`` runs clients in threads (NumPy/BLAS release the GIL in the
    large products); results do not depend on it.

    ``available(round) -> iterable of client indices`` simulates clients that
    are down in a round (partial participation, §15.2): they get no message
    and keep their state, like a node that is off and restarts later from its
    saved state.  None: every client is up.
    """

    def __init__(self, clients: Sequence[ClientRuntime], n_jobs: int | None = 1, available=None):
        self.clients = list(clients)
        self.n_clients = len(self.clients)
        self.n_jobs = min(check_n_jobs(n_jobs), max(self.n_clients, 1))
        self.available = available
        self.log: list[tuple[str, int, Message]] | None = None  # set to [] to record traffic

    def exchange_some(self, messages: dict) -> dict:
        """Deliver ``{client: message}`` to the clients that are up; ``{client: reply}``."""
        up = set(range(self.n_clients))
        if self.available is not None:
            s = next(iter(messages.values())).round if messages else 0
            up = {int(p) for p in self.available(s)}
        out = {}
        for p in sorted(messages):
            if p in up:
                out[p] = self.clients[p].handle(messages[p])
                if self.log is not None:
                    self.log.append(("down", p, messages[p]))
                    self.log.append(("up", p, out[p]))
        return out

    def exchange(self, messages: Sequence[Message]) -> list[Message]:
        """Deliver one message to every client (in threads if ``n_jobs > 1``); the replies in client order."""
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
    max_rounds: int | None = None,
    tol: float | None = None,
    seed: int | None = None,
    callback=None,
    n_jobs: int = 1,
    checkpoint_dir=None,
    resume: bool = False,
    masks=None,
    participation=None,
    available=None,
    stop_rule=None,
    residuals: bool = True,
) -> FitResult:
    """Run a federation of ``len(views_dn)`` clients in this process.

    Parameters
    ----------
    views_dn : list of {ndarray, sparse matrix} of shape (d_p, n_samples)
        Validated views in the internal orientation (:func:`fedsonmf._validation.check_views`).
    cfg : FedConfig
        The algorithm's parameters.
    algorithm : str, default="fedsonmf"
        A name of :data:`fedsonmf.algorithms.ALGORITHMS`.
    max_rounds : int >= 1 or None, default=None
        Communication rounds at most; None = the parameter table's default
        (``cfg.dp_rounds`` in a private run; :func:`~fedsonmf.federation.budget.resolve_budget`).
    tol : float >= 0 or None, default=None
        Stop when R/R1 <= tol; None = the table's default, 0 without diagnostics.
    seed : int or None, default=None
        The run seed (None: drawn, and recorded in the result).
    callback : callable or None, default=None
        ``callback(row)`` after every round with the history row.
    n_jobs : int, default=1
        Clients run in this many threads (results do not depend on it).
    checkpoint_dir : path or None, default=None
        After every round, save the server state + history and every client's
        state there (:mod:`fedsonmf.federation.checkpoint`).
    resume : bool, default=False
        Continue the run saved in ``checkpoint_dir`` (same views, config,
        algorithm; the saved seed is used); it ends with the same V as an
        uninterrupted run.
    masks : list or None, default=None
        Incomplete views (docs/algorithm.md §15.1): one entry per view, each None, a
        boolean array of length n (True = the client holds the sample) or an int
        array of sample ids; a sample no view holds raises
        :class:`~fedsonmf.exceptions.InputError`.  All-True masks run the
        complete-data code (bit-identical to ``masks=None``).
    participation : Participation or None, default=None
        Partial participation (docs/algorithm.md §15.2).
    available : callable or None, default=None
        ``available(round) -> clients up``: simulated dropouts (needs ``participation``).

    stop_rule : callable or None, default=None
        A server-side stopping rule on V (see :func:`~fedsonmf.federation.loop.run_federation`).
    residuals : bool, default=True
        Whether the clients compute and send the diagnostic arrays R/R1 needs (always, when
        ``tol`` > 0; see :func:`~fedsonmf.federation.loop.run_federation`).

    Returns
    -------
    FitResult
        V, the history, the stopping reason, the seed, the config; ``bases``
        holds every client's final U_p (d_p, r).
    """
    if masks is None:
        masks = [None] * len(views_dn)
    if len(masks) != len(views_dn):
        raise ValueError(f"{len(masks)} masks for {len(views_dn)} views")
    if participation is None and available is not None:
        raise ValueError("available= simulates dropouts and needs participation=Participation(...)")
    on_round_end, resume_from = None, None
    max_rounds, tol = resolve_budget(cfg, max_rounds, tol)
    n_jobs = check_n_jobs(n_jobs)
    seed = check_seed(seed)
    if resume and checkpoint_dir is None:
        raise ParameterError("resume=True needs checkpoint_dir")
    if seed is None and cfg.dp_enabled and not resume:
        import secrets

        seed = secrets.randbits(32)  # the recorded seed then reproduces the noise too
    # DP noise seeds: in a simulation the run seed derives them (reproducible); a deployment node draws
    # its own secret one (ClientRuntime's dp_seed=None).  On resume each client's seed is in its state.
    dp_seeds = [None if seed is None else [int(seed), 3, p] for p in range(len(views_dn))]
    if checkpoint_dir is not None:
        from fedsonmf.federation import checkpoint as ckpt
        from fedsonmf.federation.loop import _algorithm

        alg = _algorithm(algorithm)
        alg_name = alg.name
        if resume:
            saved = ckpt.load_server_checkpoint(checkpoint_dir)
            if seed is None:
                seed = saved.run.get("seed")
            run_info = {"algorithm": alg_name, "config": cfg.to_dict(), "seed": seed, "n_clients": len(views_dn)}
            ckpt.check_resume_matches(saved, run_info)
            # each client checks its own saved state against its own view (the fingerprint never leaves it);
            # with partial participation a client that missed the last rounds resumes from its newest state (§15.2)
            load: Callable[..., Any]
            if participation is None:
                load = ckpt.load_client_state
            else:
                from fedsonmf.federation.rejoin import load_latest_client_state as load
            fingerprints = [ckpt.view_fingerprint(X) for X in views_dn]
            states: list[Any] = []
            for p, (X, mk) in enumerate(zip(views_dn, masks)):
                st, meta = load(checkpoint_dir, p, saved.completed_rounds)
                held = held_columns(mk, X.shape[1], client=p)
                ckpt.verify_client_resume(p, X, st, meta, cfg.n_components, fingerprints[p],
                                          n_cols=None if held is None else held.size)
                states.append(st)
            # the server's arrays against this run's algorithm and n (the load checked them against r and m;
            # other data, n included, the clients have refused above, naming themselves)
            ckpt.verify_server_state(saved.state, run_info, Path(checkpoint_dir) / ckpt.SERVER_FILE,
                                     n_samples=int(views_dn[0].shape[1]) if views_dn else None, algorithm=alg)
            resume_from = (saved.state, saved.history)
        else:
            states = [None for _ in views_dn]
            fingerprints = [ckpt.view_fingerprint(X) for X in views_dn]
            if seed is None:
                import secrets

                seed = secrets.randbits(32)
            run_info = {"algorithm": alg_name, "config": cfg.to_dict(), "seed": seed, "n_clients": len(views_dn)}
        clients = [ClientRuntime(X, algorithm, cfg, state=st, mask=mk, dp_seed=ds, signer=sg)
                   for X, st, mk, ds, sg in zip(views_dn, states, masks, dp_seeds,
                                                _signers(cfg, len(views_dn), resume=resume))]

        def on_round_end(state, history):
            for p, c in enumerate(clients):  # clients first: the server file commits the round
                ckpt.save_client_state(checkpoint_dir, p, c.state, ckpt.client_resume_meta(c.X, fingerprints[p]))
            ckpt.save_server_checkpoint(checkpoint_dir, state, history, run_info)
    else:
        clients = [ClientRuntime(X, algorithm, cfg, mask=mk, dp_seed=ds, signer=sg)
                   for X, mk, ds, sg in zip(views_dn, masks, dp_seeds, _signers(cfg, len(views_dn)))]
    _check_masks(clients)
    transport = InProcessTransport(clients, n_jobs=n_jobs, available=available)
    result = run_federation(
        transport, algorithm, cfg, max_rounds=max_rounds, tol=tol, seed=seed, callback=callback,
        on_round_end=on_round_end, resume=resume_from, participation=participation, stop_rule=stop_rule,
        residuals=residuals,
    )
    result.bases = [_final_basis(c) for c in clients]
    return result


def _signers(cfg: FedConfig, m: int, resume: bool = False) -> list:
    """Secure aggregation's signing keys: each simulated client its own Ed25519 key, every client
    given all of their public halves at construction (one trust domain here, but the same
    verification runs as on a deployment node: every relayed key and key-list echo is checked).

    A resumed run has agreed its keys already (the saved states hold the pair keys and the checked
    key-list digest); the keys of this process are new, so it gets none (a client absent from
    every round before the checkpoint then skips its echo check)."""
    if not cfg.secure_aggregation or m < 2 or resume:
        return [None] * m
    from fedsonmf.federation.secagg import KeySigner

    return list(KeySigner.group(m))


def _final_basis(client: ClientRuntime):
    """Client ``client``'s U_p after the run (every client has set up, so its state exists)."""
    assert client.state is not None
    return client.state.arrays["U"].copy()


def _check_masks(clients) -> None:
    """Every sample held by some client (the server checks it again at setup)."""
    if all(c.cols is None for c in clients):
        return
    from fedsonmf.core.masks import check_coverage, column_counts

    check_coverage(column_counts([c.cols for c in clients], clients[0].n))
