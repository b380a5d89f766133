"""The clustering pipeline's stages as pure functions, split by party.

Each module holds one stage: a client's half (computed on its own view, statistics never sent)
and the server's half (on what it receives anyway).  Both engines run these same functions: the
in-process estimator (:class:`~fedsonmf.estimators.clustering.FedMultiViewClustering`) and the
Flower apps (:mod:`fedsonmf.federation.flower.clustering`).

* :mod:`~fedsonmf.pipeline.view_rule` -- a client's preprocessing rule and its guards;
* :mod:`~fedsonmf.pipeline.rank_rule` -- r from c and the views' widths, zero padding;
* :mod:`~fedsonmf.pipeline.row_norms` -- row normalisers;
* :mod:`~fedsonmf.pipeline.steps` -- prepare a view, k-means on V, the refinement's starts;
* :mod:`~fedsonmf.pipeline.stopping` -- the label-stability stopping rule;
* :mod:`~fedsonmf.pipeline.restarts` -- how many fits, their seeds, the medoid kept;
* :mod:`~fedsonmf.pipeline.refine` -- the federated k-means refinement;
* :mod:`~fedsonmf.pipeline.graph` -- the federated graph refinement (normalized cut);
* :mod:`~fedsonmf.pipeline.spectral` -- the graph stage's spectral step and its ending;
* :mod:`~fedsonmf.pipeline.policy` -- the server's record of the clients' minimum cluster sizes;
* :mod:`~fedsonmf.pipeline.stages` -- the server's driver of the stages after the fit, over either
  engine's exchanges.
"""
