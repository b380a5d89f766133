"""The mathematical core (docs/algorithm.md §1-§7): pure functions over NumPy arrays.

No I/O, no transport, no estimator: every driver and algorithm calls these.

* :mod:`.prox` -- the l2,1 + nonnegativity prox (§2)
* :mod:`.ustep` -- the U-subproblem and its exact-penalty solver (§3)
* :mod:`.vstep` -- the local V update with splitting and drift correction (§4)
* :mod:`.server` -- the server step (§5)
* :mod:`.objective` -- objective and gradients (§1)
* :mod:`.residuals` -- the residuals R_V, R_U, R (§7)
* :mod:`.init` -- seeded initial bases (§6)
"""
