"""How much a view file may claim, checked from its headers before anything is allocated.

A view file declares its size before its data: a ``.npy`` header its shape and dtype, a ``.npz``
archive each member's uncompressed size (and each member's own ``.npy`` header), a Matrix Market
file its shape and number of entries, a MAT file each array's class and dimensions.  A reader that
trusts the declaration allocates first and fails later: a 70-byte ``.mtx`` header declaring
5 x 10^10 entries, a ``.npy`` header declaring 10^6 x 10^6 float64 (7.3 TiB) or a 0.8 MB
``.npz`` member inflating to 1 GB each exhaust the machine before any error.  The readers of
:mod:`fedsonmf.datasets.files` and :mod:`._mat_read` read the declarations first and refuse,
naming the file and the figure:

* a declaration larger than the file can hold (a ``.npy`` whose header needs more bytes than
  follow it, a coordinate ``.mtx`` declaring more entries than its text has room for at the
  shortest entry, a zip member whose array needs more bytes than the member declares): forged
  or truncated, refused whatever the budget;
* an estimate of the memory the read needs above :func:`view_budget`: by default half of the
  memory the machine has available when the file is read (``MemAvailable`` of ``/proc/meminfo``,
  else ``os.sysconf``), or the environment variable ``FEDSONMF_MAX_VIEW_BYTES`` (bytes, or with a
  suffix ``K``, ``M``, ``G``, ``T``: powers of 1024);
* a compressed member (``.npz``, MAT v7) inflating more than ``FEDSONMF_MAX_INFLATION`` times
  (default 100) to more than 64 MiB: a zip bomb.  Real views compress 2-10 times (sparse
  indices and values); a genuine view of mostly zeros saved compressed can exceed it: save it
  uncompressed (``np.save``, ``scipy.sparse.save_npz(..., compressed=False)``) or raise the
  variable.

* a view whose features alone would exhaust the budget in a fit: a fit holds arrays of one row
  per feature whatever the number of samples (the basis U_p of d_p x r and its work copies, the
  per-feature statistics of the preprocessing), so a 1.7 KB sparse file declaring 2 x 10^8 columns
  read fine and the fit then needed tens of GiB.  The rule counts :data:`FIT_BYTES_PER_FEATURE`
  (1 KiB: 128 float64 per feature, e.g. four d_p x 32 arrays) times the number of columns, and
  refuses a view needing more than the budget (:func:`check_fit_features`, for a file's declared
  shape, and :func:`fedsonmf._validation.check_views`, for views given to ``fit``).

The budget is per file: each file is checked when it is read.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from fedsonmf.exceptions import InputError

BUDGET_ENV = "FEDSONMF_MAX_VIEW_BYTES"
INFLATION_ENV = "FEDSONMF_MAX_INFLATION"
#: default ratio of uncompressed to compressed size above which a large member is refused
MAX_INFLATION = 100.0
#: members inflating to less than this are never refused for their ratio
INFLATION_FLOOR = 64 << 20
#: memory a fit holds per feature of a view (bytes), whatever the number of samples: 128 float64, e.g.
#: the basis U_p (d_p x r) and three work arrays of its shape for r up to 32
FIT_BYTES_PER_FEATURE = 128 * 8
_FALLBACK_BUDGET = 4 << 30  # no /proc/meminfo and no sysconf: 4 GiB
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def human(n: float) -> str:
    """A byte count for a message: ``1.5 GiB``, ``7.28 TiB``, ``312 bytes``."""
    n = float(n)
    for unit, scale in (("EiB", 1 << 60), ("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20),
                        ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:.0f} {unit}"
    return f"{int(n)} bytes"


def _parse_bytes(text: str, name: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, flags=re.IGNORECASE)
    if not m:
        raise InputError(f"{name}={text!r} is not a byte count (e.g. 2000000000, 512M, 8G)")
    return int(float(m[1]) * _SUFFIX[m[2].upper()])


def available_memory() -> int | None:
    """The memory the machine has available now (bytes), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def view_budget() -> int:
    """The most memory (bytes) the read of one view file may need: ``FEDSONMF_MAX_VIEW_BYTES`` when
    set, else half of :func:`available_memory` (4 GiB where that cannot be read)."""
    env = os.environ.get(BUDGET_ENV)
    if env:
        return _parse_bytes(env, BUDGET_ENV)
    avail = available_memory()
    return _FALLBACK_BUDGET if avail is None else avail // 2


def max_inflation() -> float:
    """The largest ratio of uncompressed to compressed size of a member above 64 MiB."""
    env = os.environ.get(INFLATION_ENV)
    if not env:
        return MAX_INFLATION
    try:
        value = float(env)
    except ValueError:
        value = math.nan
    if not value > 1:
        raise InputError(f"{INFLATION_ENV}={env!r} is not a ratio above 1 (e.g. 100)")
    return value


def budget_hint(budget: int) -> str:
    """How the memory budget was set, and how to change it (for an error message)."""
    source = f"{BUDGET_ENV}={os.environ[BUDGET_ENV]}" if os.environ.get(BUDGET_ENV) else \
        "half of the memory available"
    return f"more than the budget of {human(budget)} ({source}; set {BUDGET_ENV} to change it)"


def check_budget(path: Path, need: float, what: str) -> None:
    """Refuse reading ``path`` when ``need`` bytes (the estimate for ``what``) exceed :func:`view_budget`."""
    budget = view_budget()
    if need > budget:
        raise InputError(f"{path}: {what} needs about {human(need)} of memory to read, {budget_hint(budget)}; "
                         "refused before reading")


def fit_features_problem(n_rows: int, n_cols: int) -> str | None:
    """Why a view of ``n_rows`` x ``n_cols`` has too many features for a fit within :func:`view_budget`
    (:data:`FIT_BYTES_PER_FEATURE` per column), or None."""
    need = int(n_cols) * FIT_BYTES_PER_FEATURE
    budget = view_budget()
    if need <= budget:
        return None
    return (f"its shape {int(n_rows)} x {int(n_cols)} has so many features that a fit would need about "
            f"{human(need)} of memory for them alone ({FIT_BYTES_PER_FEATURE} bytes per feature: the basis "
            f"and its work arrays), {budget_hint(budget)}")


def check_fit_features(path: Path, n_rows: int, n_cols: int, when: str = "before reading") -> None:
    """Refuse the view file ``path`` declaring ``n_rows`` x ``n_cols`` when a fit could not hold its
    features (:func:`fit_features_problem`)."""
    problem = fit_features_problem(n_rows, n_cols)
    if problem:
        raise InputError(f"{path}: {problem}; refused {when}")


def check_holds(path: Path, declared: str, need: float, have: float, where: str = "the file holds") -> None:
    """Refuse a declaration (``declared``, needing ``need`` bytes) the file cannot hold (``have`` bytes)."""
    if need > have:
        raise InputError(f"{path}: {declared} needs at least {human(need)}, but {where} only {human(have)}: "
                         "a truncated file or a forged header; refused before reading")


def check_inflation(path: Path, what: str, uncompressed: float, compressed: float) -> None:
    """Refuse a compressed ``what`` inflating more than :func:`max_inflation` times to over 64 MiB."""
    limit = max_inflation()
    if uncompressed > INFLATION_FLOOR and uncompressed > limit * max(compressed, 1):
        raise InputError(f"{path}: {what} inflates {human(compressed)} to {human(uncompressed)} "
                         f"({uncompressed / max(compressed, 1):.0f} times, more than {limit:g}): a zip bomb? If the "
                         f"file is genuine, save it uncompressed or set {INFLATION_ENV}; refused before reading")


def prod(shape) -> int:
    """The number of elements of ``shape`` (Python ints: no overflow)."""
    out = 1
    for s in shape:
        out *= int(s)
    return out
