"""What the server knows of the clients' own refusal policies, and the exchange that respects them.

A client may refuse to answer a refinement request whose partition has a nonempty cluster smaller
than its own minimum (on Flower a node's ``refine-min-cluster-size``, so that no reply is about a
handful of samples).  :class:`NodePolicy` is the server's bookkeeping of those minima -- announced
at the handshake or learnt from a refusal -- and decides which partitions it sends at all;
:class:`RefineExchange` wraps a refinement exchange in it (a partition not sent is answered NaN,
the refinements' mark of a refused partition).  Pure bookkeeping over arrays and the refusal's
text: the stage driver (:func:`fedsonmf.pipeline.stages.finish_clustering`) reads its counts for
the notes, and either engine may wrap its exchanges in it.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from fedsonmf.exceptions import FederationError

__all__ = ["SMALL_CLUSTER_REFUSAL", "NodePolicy", "RefineExchange", "smallest_clusters"]

#: what a node's refusal under its ``refine-min-cluster-size`` policy says, then `` = <its minimum>``
#: (the node's check of a request, :mod:`fedsonmf.federation.flower.clustering`); the server learns the
#: minimum from it (:class:`NodePolicy`)
SMALL_CLUSTER_REFUSAL = "refused by this node's policy refine-min-cluster-size"
_POLICY_SHOWN = re.compile(re.escape(SMALL_CLUSTER_REFUSAL) + r" = (\d+)")


class NodePolicy:
    """What the server knows of the nodes' ``refine-min-cluster-size`` policies: per node (view
    order) the minimum it announced at its hello or showed by refusing (``mins``; 1: none), and
    ``floor``, the largest of them (what the notes report).

    A node refuses a whole request when one partition in it has a nonempty cluster below its
    minimum (the node's check of a request, :mod:`fedsonmf.federation.flower.clustering`).  Each
    node announces its minimum at the handshake, so the server starts from it and no request is
    refused; a node that does not (another release) says its minimum when it refuses, and the server
    learns it from that first refusal (for the node the error names, else for every node) and sends
    the request again without the partitions below it.
    Either way it then never sends them: their replies are NaN, the refinements' mark of a refused
    partition (:mod:`fedsonmf.pipeline.refine`: a start stops at the last partition answered, the
    seeding is dropped; :mod:`fedsonmf.pipeline.graph`: the search ends at the lowest cut met).  So
    one partition with a small cluster does not end a refinement, and an honest server asks no node
    twice (an announcing node never) for what it refuses.  Each node's minimum is checked against the
    samples that node holds (``held``, per node its sample ids, None: all -- an incomplete view's node
    replies from its own samples alone), which is what the node checks; a node with no minimum of its
    own constrains nothing.  ``refused``: the partitions not sent."""

    def __init__(self, n_clusters: int, announced=(), held=None):
        self.n_clusters, self.refused = int(n_clusters), 0
        self.mins = [max(1, int(k)) for k in announced]
        self.held = list(held) if held is not None else [None] * len(self.mins)
        if len(self.held) < len(self.mins):
            self.held += [None] * (len(self.mins) - len(self.held))
        self.shown = 1  # a minimum shown by a refusal that named no node: every node's

    @property
    def floor(self) -> int:
        """The largest minimum known (announced or shown)."""
        return max([1, self.shown, *self.mins])

    def meets(self, rows) -> np.ndarray:
        """Whether each partition of ``rows`` (S, n) meets every node's minimum among the samples
        that node holds (the membership the server knows from the masked setup), (S,)."""
        rows = np.asarray(rows, dtype=np.int64)
        ok = np.ones(rows.shape[0], dtype=bool)
        if self.shown > 1:
            ok &= smallest_clusters(rows, self.n_clusters) >= self.shown
        for k, h in zip(self.mins, self.held):
            need = max(k, self.shown)
            if need > 1:
                ok &= smallest_clusters(rows if h is None else rows[:, h], self.n_clusters) >= need
        return ok

    def learn(self, exc: FederationError) -> None:
        """Take in the minimum a refusal shows (for the node it names, else for all); re-raise ``exc``
        when it shows nothing new (a lost node, another refusal: not ours to work around)."""
        shown = max((int(k) for k in _POLICY_SHOWN.findall(str(exc))), default=0)
        p = exc.client
        if p is not None and 0 <= p < len(self.mins):
            if shown <= max(self.mins[p], self.shown):
                raise exc
            self.mins[p] = shown
            return
        if shown <= self.floor:
            raise exc
        self.shown = shown

    def ask(self, rows, send: Callable):
        """``(ok, send(ok))``: ``send`` the partitions of ``rows`` (S, n) that meet the floor (``ok``,
        (S,)), again without those below a minimum a refusal shows; ``(ok, None)`` when none meets it.
        Counts the partitions not sent."""
        while (ok := self.meets(rows)).any():
            try:
                reply = send(ok)
            except FederationError as exc:
                self.learn(exc)
                continue
            break
        else:
            reply = None
        self.refused += int(ok.size - ok.sum())
        return ok, reply


class RefineExchange:
    """The refinement's exchange ``send`` kept inside the nodes' policies (:class:`NodePolicy`): only
    the partitions that meet the floor are sent; the others' replies are NaN."""

    def __init__(self, send: Callable, n_clusters: int, policy: NodePolicy | None = None):
        self.send, self.n_clusters = send, int(n_clusters)
        self.policy = NodePolicy(n_clusters) if policy is None else policy

    def __call__(self, labels):
        labels = np.asarray(labels, dtype=np.int64)
        rows = labels.reshape(-1, labels.shape[-1])
        S, n = rows.shape
        D, score = np.full((S, n, self.n_clusters), np.nan), np.full(S, np.nan)
        ok, reply = self.policy.ask(rows, lambda ok: self.send(labels if labels.ndim == 1 else rows[ok]))
        if reply is not None:
            D[ok] = np.asarray(reply[0], dtype=np.float64).reshape(int(ok.sum()), n, self.n_clusters)
            score[ok] = np.asarray(reply[1], dtype=np.float64).reshape(int(ok.sum()))
        return (D[0], score[:1]) if labels.ndim == 1 else (D, score)


def smallest_clusters(rows, n_clusters: int) -> np.ndarray:
    """The size of the smallest nonempty cluster of each partition of ``rows`` (S, n), (S,): what a
    node's ``refine-min-cluster-size`` checks (:mod:`fedsonmf.federation.flower.clustering`) and the
    server respects (:class:`NodePolicy`)."""
    rows = np.asarray(rows, dtype=np.int64)
    sizes = np.stack([np.bincount(row, minlength=int(n_clusters)) for row in rows])
    return np.where(sizes > 0, sizes, rows.shape[1]).min(axis=1)
