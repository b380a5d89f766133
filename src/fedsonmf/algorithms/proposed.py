"""The proposed method: federated alternating minimisation with variable
splitting and drift correction (docs/algorithm.md §4–§6).

Downlink: Vbar^s (r x n, pre-proximal).  Uplink: Vhat_p^{s,tau} (r x n).
Each client recomputes V^s = P_{eta_tilde mu}(Vbar^s) and its correction C_p^s
itself; C_p^1 = 0 [C].  ``FedConfig.correction = False`` gives the
"no correction" ablation (C_p^s = 0 in every round).

Incomplete views (§15.1, [C]): a client holding only the samples ``cols``
sends its sample indices once (setup: the server learns membership in the
clear; the content only through the uploads, see docs/privacy.md), receives the weights m/c_j with
every broadcast, and uploads the r x |Omega_p| block of its held columns; the server averages column j over
the clients holding it.  Complete data takes exactly the code of §4–§6.

Partial participation (§15.2, [C]): ``server_round(..., clients=...)``
averages over the clients that replied; a client that missed round s-1
gets ``V_prev`` = V^{s-1} and the scalar ``rejoin`` (its correction rule,
:data:`REJOIN_RULES`) with its next message.
"""

from __future__ import annotations

import numpy as np

from fedsonmf.algorithms.base import FederatedAlgorithm
from fedsonmf.core._linalg import ut_x
from fedsonmf.core.init import batch_rng
from fedsonmf.core.masks import check_coverage, column_counts, column_mean
from fedsonmf.core.objective import grad_v_orth
from fedsonmf.core.prox import shared_prox
from fedsonmf.core.residuals import RESIDUALS_KEY, client_diagnostics
from fedsonmf.core.server import server_step_from_mean
from fedsonmf.core.vstep import draw_batches, drift_correction, local_round, resolve_batch
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import Aggregate, ClientState, Message, ServerState

__all__ = ["FedSONMFAlgorithm", "REJOIN_RULES"]

#: correction of a client returning after missed rounds (§15.2); the measured choice ("server",
#: the default of Participation) is in docs/incomplete-and-partial.md.  "refresh" (a): local term
#: from one gradient at V^s with the client's current U (free: U^T X is in its state); "server" (b):
#: SCAFFOLD-style, the server keeps every client's last G_p and broadcasts their mean after a partial
#: round; "drop" (c): C = 0 for the returning round; "stale": the client's old G_p (no special handling).
REJOIN_RULES = ("refresh", "server", "drop", "stale")


class FedSONMFAlgorithm(FederatedAlgorithm):
    name = "fedsonmf"
    uplink_keys = ("Vhat",)
    downlink_keys = ("Vbar",)
    server_v_nonnegative = True  # V = P(Vbar); Vbar itself may be negative
    summed_uplink_keys = ("Vhat",)

    supports_masks = True
    supports_partial = True
    supports_dp = True
    dp_clear_arrays = ("cols",)  # incomplete views: which samples a client holds (membership, not content)

    def dp_references(self, msg: Message, cfg: FedConfig, cols=None) -> dict:
        """Round s: Vhat_p is clipped around V^s = P(Vbar^s), which the server knows,
        so the noise covers the client's change of V (its held columns with masks)."""
        if msg.kind == "setup":
            return super().dp_references(msg, cfg, cols)
        V = shared_prox(msg.arrays["Vbar"], cfg.eta_tilde * cfg.mu_value)
        return {"Vhat": V if cols is None else V[:, cols]}

    def dp_released(self, state: ClientState, sent: Message, released: Message, cfg: FedConfig) -> ClientState:
        """Under DP the drift correction remembers the gradient the server *received*.

        The server's step is V-bar^{s+1} = V^s - eta_tilde * mean_p G~_p with the released
        G~_p = (V^s - Vhat~_p) / (alpha tau) - C_p (Vhat~_p: the clipped, noised upload), so
        C_p^{s+1} = (V^s - V-bar^{s+1}) / eta_tilde - G~_p keeps sum_p C_p = 0 (§4.2) only with G~_p.
        With the computed G_p instead, a clipped upload (at the default step a round's change is
        2-8 times ``dp_clip``) leaves the global term shrunk by the clip and the own term whole, so C_p
        cancels most of the client's own gradient and the fit stalls (docs/privacy.md, "Differential
        privacy"). G~_p = G_p + (Vhat_p - Vhat~_p) / (alpha tau). The state is local and never sent,
        so this is post-processing of the client's own data: the guarantee does not change."""
        if sent.kind != "round" or "G_prev" not in state.arrays:
            return state
        step = cfg.alpha * cfg.tau
        G = state.arrays["G_prev"] + (np.asarray(sent.arrays["Vhat"]) - np.asarray(released.arrays["Vhat"])) / step
        return ClientState(state.round, {**state.arrays, "G_prev": G})

    def summed_items(self, cfg: FedConfig, kind: str, **options) -> dict[str, tuple[str, int]]:
        """As the base class; ``kept_sum=True`` (rule (b) under secure aggregation) adds the
        upload ``dG`` = G_p^s minus the G_p this client last had counted (r x n, summed)."""
        items = super().summed_items(cfg, kind)
        if kind == "round" and options.get("kept_sum"):
            items["dG"] = ("arrays", 1)
        return items

    def client_setup(self, X, x_sqnorm: float, msg: Message, cfg: FedConfig, cols=None, n=None):
        if cols is None:
            b = resolve_batch(cfg.batch_size, X.shape[1], cfg.tau)  # refused before the bases are drawn
            state, reply = super().client_setup(X, x_sqnorm, msg, cfg)
            if b is not None:  # stochastic local steps (§16): the run's seed and b, kept locally
                state.arrays["batch"] = np.array([int(msg.scalars["seed"]), b], dtype=np.int64)
            return state, reply
        state, reply = super().client_setup(X, x_sqnorm, msg, cfg)
        # membership (sample indices, not content) is what the server learns (§15.1)
        arrays = {**reply.arrays, "cols": np.asarray(cols, dtype=np.int64)}
        return state, Message("setup", 0, arrays, {**reply.scalars, "n": int(n)})

    def client_round(self, X, x_sqnorm, state: ClientState, msg: Message, cfg: FedConfig, cols=None):
        eta = cfg.eta_tilde
        Vbar = msg.arrays["Vbar"]
        V = shared_prox(Vbar, eta * cfg.mu_value)  # in one process, the server's own V^s
        st = state.arrays
        rejoin = msg.scalars.get("rejoin")
        sel = (lambda A: A) if cols is None else (lambda A: A[:, cols])
        C = None
        if cfg.correction and "G_prev" in st:
            if "Gk" in msg.arrays:  # (b): the server's mean of the kept G_q over all clients
                C = sel(msg.arrays["Gk"]) - st["G_prev"]
            elif not rejoin:
                C = drift_correction(st["V_prev"], sel(Vbar), eta, st["G_prev"])
            elif rejoin in ("refresh", "stale", "server") and "V_prev" in msg.arrays:
                local = grad_v_orth(_carried_utx(st, X), sel(V)) if rejoin == "refresh" else st["G_prev"]
                C = drift_correction(sel(msg.arrays["V_prev"]), sel(Vbar), eta, local)
            # "drop" (c): no correction in the returning round
        if cols is None:
            batches = None
            if "batch" in st:  # the same blocks on every client: one stream per round (§16)
                seed, b = (int(v) for v in st["batch"])
                batches = draw_batches(X.shape[1], cfg.tau, b, batch_rng(seed, msg.round))
            res = local_round(
                X, st["U"], V, C, alpha=cfg.alpha, mu=cfg.mu_value, tau=cfg.tau, rho1=cfg.rho1, ustep=cfg.ustep,
                batches=batches,
            )
        else:
            w = np.asarray(msg.arrays["w"], dtype=np.float64)[cols]
            res = local_round(X, st["U"], V, C, alpha=cfg.alpha, mu=cfg.mu_value, tau=cfg.tau, rho1=cfg.rho1,
                              ustep=cfg.ustep, cols=cols, weights=w)
        diag = {}
        if cfg.diagnostics:
            # the gradient grad0 (r x n) only when the server computes R/R1 from it
            arrays = msg.scalars.get(RESIDUALS_KEY, True) is not False
            if cols is None:
                diag = client_diagnostics(x_sqnorm, st["U"], V, res.U, res.XVt0, res.VVt0,
                                          UtX0=_carried_utx(st, X) if arrays else None)
            else:
                xsq_w = float(np.dot(_col_sqnorms(X), w))
                Vc = V[:, cols]
                diag = client_diagnostics(xsq_w, st["U"], Vc, res.U, res.XVt0, res.VVt0)
                if arrays:  # unweighted; the server divides by c_j
                    diag["grad0"] = grad_v_orth(_carried_utx(st, X), Vc)
        new_state = ClientState(msg.round, {"U": res.U, "G_prev": res.G_avg, "V_prev": sel(V)})
        if res.UtX is not None:  # U^T X of the round's last basis, when the steps made it anyway
            new_state.arrays["UtX"] = res.UtX
        if "batch" in st:
            new_state.arrays["batch"] = st["batch"]
        up = {"Vhat": res.Vhat}
        if msg.scalars.get("kept_sum"):
            # rule (b) from sums (§15.2 under secure aggregation): the change of this client's kept G_p;
            # "G_contrib" (what the server holds for it) advances only when the server confirms it
            # counted this upload (the unmask step: ".pending" is committed then)
            have = st.get("G_contrib")
            up["dG"] = res.G_avg - have if have is not None else np.array(res.G_avg, copy=True)
            if have is not None:
                new_state.arrays["G_contrib"] = have
            new_state.arrays["G_contrib.pending"] = res.G_avg
        return new_state, Message("round", msg.round, up, {}, diag)

    # ------------------------------------------------------------------ server side
    def server_setup(self, replies: list[Message], cfg: FedConfig, seed: int,
                     agg: Aggregate | None = None) -> ServerState:
        cols_list = [rep.arrays.get("cols") for rep in replies]
        if all(c is None for c in cols_list):
            return super().server_setup(replies, cfg, seed, agg=agg)
        r, n = cfg.n_components, int(replies[0].scalars["n"])
        counts = column_counts(cols_list, n)
        check_coverage(counts)
        if cfg.init_v == "projection":
            if agg is not None and "Vproj" in agg.sums:  # column sums (blocks scattered) / public counts
                Vbar1 = _mean_from_sums(agg.sums["Vproj"], counts, np.zeros((r, n)))
            else:
                Vbar1, _ = column_mean([rep.arrays["Vproj"] for rep in replies], cols_list, (r, n),
                                       fill=np.zeros((r, n)))
            state = self.state_from_vbar1(Vbar1, cfg)
        else:
            state = super().server_setup(replies, cfg, seed, agg=agg)
        member = np.zeros((len(replies), n), dtype=bool)
        for p, c in enumerate(cols_list):
            member[p, slice(None) if c is None else c] = True
        state.arrays["membership"] = member
        return state

    def broadcast(self, state: ServerState) -> Message:
        msg = super().broadcast(state)
        if bool(state.arrays.get("partial_prev", False)):  # rule (b) after a partial round
            kept = self.kept_mean(state)
            assert kept is not None  # a partial round kept the clients' corrections
            msg = Message(msg.kind, msg.round, {**msg.arrays, "Gk": kept}, msg.scalars)
        member = state.arrays.get("membership")
        if member is None:
            return msg
        # weights m / c_j of the weighted objective (§15.1); clients learn the holder counts c_j
        w = member.shape[0] / member.sum(axis=0)
        return Message(msg.kind, msg.round, {**msg.arrays, "w": w.astype(np.float64)}, msg.scalars)

    def reply_columns(self, state: ServerState, clients):
        """Sample indices of each replying client's blocks (None: all samples)."""
        member = state.arrays.get("membership")
        if member is None:
            return None
        return [None if member[p].all() else np.flatnonzero(member[p]) for p in clients]

    def rejoin_message(self, state: ServerState, base: Message, rule: str, has_rounds: bool) -> Message:
        """The round message of a client that missed round s-1 (§15.2)."""
        arrays = dict(base.arrays)
        if has_rounds and rule != "drop" and "V_prev" in state.arrays:
            arrays["V_prev"] = state.arrays["V_prev"]
        return Message(base.kind, base.round, arrays, {**base.scalars, "rejoin": rule})

    def server_round(self, state: ServerState, replies: list[Message], cfg: FedConfig, agg: Aggregate | None = None,
                     *, clients=None, keep_g: bool = False, n_clients: int | None = None) -> ServerState:
        """Server step; ``clients`` (indices of the replies, None = every client in order)
        for a partial round; ``keep_g`` maintains the server-kept G_p of rule (b) (it needs
        every client's own upload, so it cannot run on an aggregate alone); ``agg``: the
        sum of the uploads ``Vhat`` (the replies then need not carry them)."""
        member = state.arrays.get("membership")
        V = state.arrays["V"]
        kept_sum = agg is not None and "dG" in agg.sums
        if keep_g and not kept_sum and any("Vhat" not in rep.arrays for rep in replies):
            raise ValueError("the server-kept correction (rejoin='server') needs each client's own upload, "
                             "or the sum of their kept-G changes dG")
        if member is None and clients is None and not keep_g:
            Vbar, Vn = server_step_from_mean(V, self.mean_of("Vhat", replies, agg), cfg.eta_g, cfg.eta_tilde,
                                             cfg.mu_value)
            return state.next({"Vbar": Vbar, "V": Vn})
        idx = list(range(len(replies))) if clients is None else list(clients)
        if member is None:
            Vbar, Vn = server_step_from_mean(V, self.mean_of("Vhat", replies, agg), cfg.eta_g, cfg.eta_tilde,
                                             cfg.mu_value)
        else:
            # column j: mean over the (replying) clients holding j; a column no one sent keeps V_j
            if agg is not None and "Vhat" in agg.sums:
                mean = _mean_from_sums(agg.sums["Vhat"], member[idx].sum(axis=0), V)
            else:
                mean, _ = column_mean([rep.arrays["Vhat"] for rep in replies], self.reply_columns(state, idx),
                                      V.shape, fill=V)
            Vbar, Vn = server_step_from_mean(V, mean, cfg.eta_g, cfg.eta_tilde, cfg.mu_value)
        arrays = {"Vbar": Vbar, "V": Vn}
        if member is not None:
            arrays["membership"] = member
        if clients is not None or keep_g:
            arrays["V_prev"] = V  # V^{s}: for clients returning later, and rule (b)'s bookkeeping
        if keep_g:
            if kept_sum:
                assert agg is not None  # kept sums come from secure aggregation's aggregate
                arrays.update(self._kept_sum(state, agg, idx, n_clients or len(replies)))
            else:
                arrays.update(self._kept_g(state, replies, idx, cfg, n_clients or len(replies)))
            arrays["partial_prev"] = np.array(clients is not None)
        return state.next(arrays)

    def _kept_g(self, state: ServerState, replies, idx, cfg: FedConfig, n_clients: int) -> dict:
        """Rule (b): every client's last G_p, reconstructed from its upload (no extra message).

        Client p moved by alpha tau (G_p + C_p) = V^s - Vhat_p, and the server
        knows the C_p it used (T^s - G_p^old with T^s the broadcast mean of
        kept G's after a partial round, else (V^{s-1} - Vbar^s)/eta_tilde), so
        G_p = (V^s - Vhat_p)/(alpha tau) - C_p, bit for bit the client's value.
        """
        V = state.arrays["V"]
        r, n = V.shape
        member = state.arrays.get("membership")
        m = int(state.arrays["G_have"].shape[0]) if "G_have" in state.arrays else n_clients
        Gk = np.array(state.arrays["G_kept"]) if "G_kept" in state.arrays else np.zeros((m, r, n))
        have = np.array(state.arrays["G_have"]) if "G_have" in state.arrays else np.zeros(m, dtype=bool)
        T = self.kept_mean(state) if bool(state.arrays.get("partial_prev", False)) else None
        if T is None and "V_prev" in state.arrays:
            T = (state.arrays["V_prev"] - state.arrays["Vbar"]) / cfg.eta_tilde
        for p, rep in zip(idx, replies):
            sel = slice(None) if member is None or member[p].all() else np.flatnonzero(member[p])
            G = (V[:, sel] - rep.arrays["Vhat"]) * (1.0 / (cfg.alpha * cfg.tau))
            if cfg.correction and have[p] and T is not None:
                G -= T[:, sel] - Gk[p][:, sel]
            Gk[p][:, sel] = G
            have[p] = True
        return {"G_kept": Gk, "G_have": have}

    def _kept_sum(self, state: ServerState, agg: Aggregate, idx, n_clients: int) -> dict:
        """Rule (b) from sums: ``G_sum`` = sum over the clients of their last counted G_p, kept by
        adding the round's sum of the changes dG (secure aggregation: no client's G_p is seen)."""
        V = state.arrays["V"]
        G_sum = np.array(state.arrays["G_sum"]) if "G_sum" in state.arrays else np.zeros(V.shape)
        have = np.array(state.arrays["G_have"]) if "G_have" in state.arrays else np.zeros(n_clients, dtype=bool)
        G_sum += agg.sums["dG"]
        have[list(idx)] = True
        return {"G_sum": G_sum, "G_have": have}

    def kept_mean(self, state: ServerState) -> np.ndarray | None:
        """Rule (b): mean over every client with a kept G_p (per column over holders)."""
        if "G_sum" in state.arrays:  # kept as a sum (secure aggregation)
            have, member = state.arrays["G_have"], state.arrays.get("membership")
            counts = np.full(state.arrays["G_sum"].shape[1], int(have.sum())) if member is None \
                else member[have].sum(axis=0)
            return _mean_from_sums(state.arrays["G_sum"], counts, np.zeros(state.arrays["G_sum"].shape))
        if "G_kept" not in state.arrays:
            return None
        Gk, have = state.arrays["G_kept"], state.arrays["G_have"]
        member = state.arrays.get("membership")
        ps = np.flatnonzero(have)
        blocks = [Gk[p] if member is None else Gk[p][:, member[p]] for p in ps]
        cols = [None if member is None or member[p].all() else np.flatnonzero(member[p]) for p in ps]
        mean, _ = column_mean(blocks, cols, Gk.shape[1:], fill=np.zeros(Gk.shape[1:]))
        return mean


def _mean_from_sums(S: np.ndarray, counts: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """Per-column mean ``S[:, j] / c_j`` over the c_j holders; columns with c_j = 0 take ``fill``
    (the same arithmetic as :func:`fedsonmf.core.masks.column_mean` on the blocks)."""
    held = counts > 0
    out = fill.astype(np.float64, copy=True)
    out[:, held] = S[:, held] / counts[held]
    return out


def _carried_utx(st: dict, X) -> np.ndarray:
    """U_p^{s,0} X_p from the client's state: carried when the previous round's local steps made
    it anyway (full batch), else computed from the carried basis (stochastic local steps end on a
    basis whose U^T X they never form: one pass over X, only when a rule needs it)."""
    return st["UtX"] if "UtX" in st else ut_x(st["U"], X)


def _col_sqnorms(X) -> np.ndarray:
    """||X[:, j]||^2 for every column (dense or sparse)."""
    import scipy.sparse as sp

    if sp.issparse(X):
        return np.asarray(X.multiply(X).sum(axis=0), dtype=np.float64).ravel()
    X = np.asarray(X)
    return np.einsum("ij,ij->j", X, X, dtype=np.float64)
