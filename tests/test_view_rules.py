"""Properties of the label-free rules of a client's view: the rank rule and the preprocessing rule."""

import numpy as np
import pytest
import scipy.sparse as sp

from fedsonmf.pipeline.rank_rule import pad_view, resolve_rank
from fedsonmf.pipeline.row_norms import normalize_rows
from fedsonmf.pipeline.view_rule import mean_energy_share, preprocess_view

# ----------------------------------------------------------------------------- rank


@pytest.mark.parametrize("c,widths", [(5, [3183, 3203]), (7, [24, 576]), (10, [216, 6, 64]), (3, [2, 2])])
def test_capping_rules_never_exceed_narrowest_view(c, widths):
    for rule in ("paper", 4, 100):
        r, msg = resolve_rank(c, widths, rule)
        assert 1 <= r <= min(widths)
        want = {"paper": c}.get(rule, rule)
        assert r == min(want, min(widths))
        assert (msg is None) == (want <= min(widths))


def test_auto_is_two_c_and_names_the_views_to_pad():
    assert resolve_rank(5, [3183, 3203]) == (10, None)
    r, msg = resolve_rank(10, [216, 76, 64, 6, 240, 47])
    assert r == 20
    assert msg is not None and "[3]" in msg and "padded" in msg


def test_resolve_rank_rejects_bad_input():
    with pytest.raises(ValueError):
        resolve_rank(0, [10])
    with pytest.raises(ValueError):
        resolve_rank(3, [])
    with pytest.raises(ValueError):
        resolve_rank(3, [10], "bogus")


def test_pad_view_adds_zero_features_only():
    rng = np.random.default_rng(0)
    X = rng.random((7, 3))
    P = pad_view(X, 5)
    assert P.shape == (7, 5)
    np.testing.assert_array_equal(P[:, :3], X)
    assert not P[:, 3:].any()
    assert pad_view(X, 3) is X
    S = pad_view(sp.csr_matrix(X), 6)
    assert sp.issparse(S) and S.shape == (7, 6)
    np.testing.assert_array_equal(S.toarray()[:, :3], X)


# ----------------------------------------------------------------------------- preprocessing


def _text_like(rng, n=60, d=400):
    X = sp.random(n, d, density=0.03, random_state=np.random.RandomState(1), format="csr")
    X.data = np.ceil(X.data * 5)
    return X


def _image_like(rng, n=60, d=30):
    return 5.0 + rng.random((n, d))  # every feature on in every sample


def test_statistic_separates_sparse_text_from_dense_features():
    rng = np.random.default_rng(0)
    assert mean_energy_share(preprocess_view(_text_like(rng), "l2")[0]) < 0.5
    assert mean_energy_share(preprocess_view(_image_like(rng), "l2")[0]) > 0.5
    assert mean_energy_share(np.zeros((3, 4))) == 0.0


def test_auto_centres_dense_only_and_keeps_text_sparse():
    rng = np.random.default_rng(0)
    T, info_t = preprocess_view(_text_like(rng))
    assert sp.issparse(T) and not info_t["centered"] and info_t["sample_l2"]
    X = _image_like(rng)
    A, info_a = preprocess_view(X)  # centred, unit variance, then every sample to unit norm again
    assert info_a["centered"] and info_a["standardized"] and info_a["resample_l2"]
    np.testing.assert_allclose(np.linalg.norm(A, axis=1), 1.0)
    L = normalize_rows(X)
    Y_std = (L - L.mean(axis=0)) / L.std(axis=0)
    np.testing.assert_allclose(A, normalize_rows(Y_std))


def test_constant_features_of_a_dense_view_become_zero_not_nan():
    rng = np.random.default_rng(1)
    X = _image_like(rng)
    X[:, 0] = 0.0  # a feature no sample has: zero variance
    Y, info = preprocess_view(X)
    assert info["centered"] and np.all(np.isfinite(Y))
    np.testing.assert_allclose(Y[:, 0], 0.0, atol=1e-6)


@pytest.mark.parametrize("rule", ["auto", "l2"])
@pytest.mark.parametrize("kind", ["text", "image"])
def test_preprocessing_is_scale_invariant(rule, kind):
    rng = np.random.default_rng(3)
    X = _text_like(rng) if kind == "text" else _image_like(rng)
    A, ia = preprocess_view(X, rule)
    B, ib = preprocess_view(X * 37.5, rule)
    def to(M):
        return M.toarray() if sp.issparse(M) else M
    np.testing.assert_allclose(to(A), to(B), atol=1e-12)
    assert ia["centered"] == ib["centered"]


def test_preprocessing_is_per_view_local():
    """The function sees one view only (no cross-view input exists in its signature), and
    its output is a function of that view: deterministic and unaffected by other calls."""
    import inspect

    assert list(inspect.signature(preprocess_view).parameters) == ["X", "rule", "threshold"]
    rng = np.random.default_rng(4)
    X, T = _image_like(rng), _text_like(rng)
    out1, _ = preprocess_view(X)
    preprocess_view(T)
    out2, _ = preprocess_view(X.copy())
    np.testing.assert_array_equal(out1, out2)


def test_preprocessing_is_per_sample_scale_invariant():
    rng = np.random.default_rng(6)
    X = _image_like(rng)
    s = rng.uniform(0.1, 10.0, size=(X.shape[0], 1))
    np.testing.assert_allclose(preprocess_view(X)[0], preprocess_view(X * s)[0], atol=1e-9)


def test_preprocessing_handles_zero_samples_and_negatives():
    X = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 3.0], [2.0, 1.0, 0.0]])
    Y, info = preprocess_view(X, "l2")
    assert np.all(np.isfinite(Y)) and not Y[0].any()
    np.testing.assert_allclose(np.linalg.norm(Y[1:], axis=1), 1.0)
    Y, _ = preprocess_view(X)
    assert np.all(np.isfinite(Y))
    Z, _info = preprocess_view(sp.csr_matrix(X), "l2")
    np.testing.assert_allclose(Z.toarray(), preprocess_view(X, "l2")[0])


def test_none_leaves_the_view_alone():
    X = np.arange(12.0).reshape(4, 3)
    Y, _info = preprocess_view(X, "none")
    np.testing.assert_array_equal(X, Y)
    assert Y is not X


def test_a_sparse_view_the_rule_would_densify_past_the_budget_is_refused_by_name(monkeypatch):
    """Centring a sparse view makes it dense: when its dense copies would exceed the memory budget
    (FEDSONMF_MAX_VIEW_BYTES here) the fit says so, naming the view and preprocess='l2', before any
    dense array is made; 'l2' keeps the view sparse and fits."""
    import scipy.sparse as sp

    from fedsonmf import FedMultiViewClustering
    from fedsonmf.exceptions import InputError

    rng = np.random.default_rng(0)
    dense_like = sp.csr_matrix(1.0 + 0.1 * rng.random((300, 200)))  # mean sample: most of the energy
    text_like = sp.random(300, 50, density=0.1, format="csr", random_state=1)
    monkeypatch.setenv("FEDSONMF_MAX_VIEW_BYTES", "1M")  # 3 x 300 x 200 x 8 B = 1.44 MB needed
    with pytest.raises(InputError, match=r"view 0: .*preprocess='l2' keeps it sparse"):
        FedMultiViewClustering(2, max_rounds=2, n_init=1, random_state=0).fit([dense_like, text_like])
    FedMultiViewClustering(2, max_rounds=2, n_init=1, random_state=0, preprocess="l2").fit([dense_like, text_like])
    monkeypatch.setenv("FEDSONMF_MAX_VIEW_BYTES", "1G")
    FedMultiViewClustering(2, max_rounds=2, n_init=1, random_state=0).fit([dense_like, text_like])
