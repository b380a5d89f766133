import numpy as np
import pytest
import scipy.sparse as sp

from fedsonmf.preprocessing import normalize_views, tfidf_views


@pytest.fixture
def views():
    rng = np.random.default_rng(0)
    counts = rng.poisson(0.7, size=(30, 20)).astype(float)
    counts[4] = 0.0  # all-zero sample
    counts[:, 7] = 0.0  # all-zero feature
    signed = rng.standard_normal((30, 5))  # negative entries are valid input
    signed[11] = 0.0
    return [counts, signed]


def dense(v):
    return v.toarray() if sp.issparse(v) else v


def test_each_view_has_unit_frobenius_norm(views):
    for W in normalize_views(views):
        assert np.linalg.norm(dense(W)) == pytest.approx(1.0, rel=1e-12)


def test_normalization_is_a_pure_rescaling(views):
    out = normalize_views(views)
    for X, W in zip(views, out, strict=True):
        np.testing.assert_allclose(W * np.linalg.norm(X), X, rtol=1e-12)


def test_dense_and_sparse_agree_and_stay_sparse(views):
    dense_out = normalize_views(views)
    for fmt in (sp.csr_array, sp.csc_matrix, sp.coo_array):
        sparse_out = normalize_views([fmt(X) for X in views])
        for D, S in zip(dense_out, sparse_out, strict=True):
            assert sp.issparse(S)
            np.testing.assert_allclose(S.toarray(), D, rtol=1e-12)
    assert normalize_views([sp.csc_matrix(views[0])])[0].format == "csc"


def test_zero_samples_and_features_give_no_nan(views):
    for out in (normalize_views(views), tfidf_views([np.abs(views[0])])):
        for W in out:
            assert np.all(np.isfinite(dense(W)))
        assert not dense(out[0])[4].any() and not dense(out[0])[:, 7].any()


def test_inputs_are_not_modified(views):
    before = [X.copy() for X in views]
    S = sp.csr_array(views[0])
    out = normalize_views([views[0], S])
    assert out[0] is not views[0] and out[1] is not S
    np.testing.assert_array_equal(views[0], before[0])
    np.testing.assert_array_equal(S.toarray(), before[0])


def test_dtypes():
    x32 = np.ones((3, 2), dtype=np.float32)
    xint = np.ones((3, 2), dtype=np.uint8)
    out = normalize_views([x32, xint])
    assert out[0].dtype == np.float32 and out[1].dtype == np.float64
    np.testing.assert_allclose(out[1], np.full((3, 2), 1 / np.sqrt(6)))


def test_all_zero_view_raises_with_index(views):
    with pytest.raises(ValueError, match="view 1 is all zero"):
        normalize_views([views[0], np.zeros((30, 3))])
    with pytest.raises(ValueError, match="view 0 is all zero"):
        normalize_views([sp.csr_array((30, 3))])


@pytest.mark.parametrize(
    "bad, match",
    [
        ([np.ones((3, 2)), np.ones((4, 2))], "n_samples"),
        ([np.ones(3)], "view 0 must be 2-D"),
        ([np.array([[1.0, np.nan]])], "view 0 contains NaN"),
        ([], "empty"),
    ],
)
def test_invalid_views_raise(bad, match):
    with pytest.raises(ValueError, match=match):
        normalize_views(bad)


def test_unknown_method_raises(views):
    with pytest.raises(ValueError, match="method"):
        normalize_views(views, method="l2")


def test_single_matrix_instead_of_list_raises(views):
    with pytest.raises(TypeError, match="list"):
        normalize_views(views[0])


def test_tfidf_matches_sklearn_and_keeps_kind(views):
    from sklearn.feature_extraction.text import TfidfTransformer

    counts = views[0]
    expected = TfidfTransformer().fit_transform(counts).toarray()
    dense_out, sparse_out, mat_out = tfidf_views(
        [counts, sp.csr_array(counts), sp.csr_matrix(counts)])
    assert isinstance(dense_out, np.ndarray)
    assert isinstance(sparse_out, sp.sparray) and sparse_out.format == "csr"
    assert isinstance(mat_out, sp.spmatrix)
    for W in (dense_out, sparse_out, mat_out):
        np.testing.assert_allclose(dense(W), expected, rtol=1e-12)
    norms = np.linalg.norm(dense_out, axis=1)
    np.testing.assert_allclose(norms[norms > 0], 1.0)


def test_tfidf_rejects_negative_counts(views):
    with pytest.raises(ValueError, match="view 1 has negative"):
        tfidf_views(views)
