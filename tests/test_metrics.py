import numpy as np
import pytest

from fedsonmf.metrics import adjusted_rand, clustering_accuracy, clustering_scores, format_scores, nmi, purity

Y = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 2])


def test_permuted_labelling_scores_one():
    perm = {0: 7, 1: 3, 2: 5}
    y_pred = np.array([perm[v] for v in Y])
    scores = clustering_scores(Y, y_pred)
    assert scores == pytest.approx({"acc": 1.0, "nmi": 1.0, "purity": 1.0})
    assert clustering_scores(["a", "b"], [1, 0]) == pytest.approx(
        {"acc": 1.0, "nmi": 1.0, "purity": 1.0})


def test_hand_computed_example():
    # contingency (classes x clusters):
    #   class 0: [3, 0, 0]    class 1: [1, 2, 0]    class 2: [0, 2, 2]
    y_pred = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    # best matching 0->0, 1->1, 2->2: 3 + 2 + 2 = 7
    assert clustering_accuracy(Y, y_pred) == pytest.approx(0.7)
    # cluster majorities: 3 (cluster 0), 2 (cluster 1), 2 (cluster 2)
    assert purity(Y, y_pred) == pytest.approx(0.7)


def test_more_clusters_than_classes():
    y_true = np.array([0, 0, 0, 0, 1, 1])
    y_pred = np.array([0, 0, 1, 1, 2, 2])
    # one of the two class-0 clusters is left unmatched
    assert clustering_accuracy(y_true, y_pred) == pytest.approx(4 / 6)
    assert purity(y_true, y_pred) == 1.0  # splitting never lowers purity


def test_fewer_clusters_than_classes():
    y_true = np.array([0, 0, 1, 1, 2, 2, 2])
    y_pred = np.zeros(7, dtype=int)
    # one cluster: purity = largest class fraction, and so is ACC
    assert purity(y_true, y_pred) == pytest.approx(3 / 7)
    assert clustering_accuracy(y_true, y_pred) == pytest.approx(3 / 7)
    assert nmi(y_true, y_pred) == pytest.approx(0.0)


def test_acc_never_exceeds_purity_and_scores_in_unit_interval():
    rng = np.random.default_rng(0)
    for _ in range(50):
        y_true = rng.integers(0, 4, 40)
        y_pred = rng.integers(0, rng.integers(1, 7), 40)
        s = clustering_scores(y_true, y_pred)
        assert all(0.0 <= v <= 1.0 for v in s.values())
        assert s["acc"] <= s["purity"] + 1e-12


def test_nmi_average_methods():
    rng = np.random.default_rng(1)
    y_true, y_pred = rng.integers(0, 3, 60), rng.integers(0, 4, 60)
    v = {m: nmi(y_true, y_pred, average_method=m)
         for m in ("arithmetic", "geometric", "sqrt", "max", "min")}
    assert v["sqrt"] == v["geometric"]
    # the denominators satisfy max >= arithmetic >= geometric >= min of the two entropies
    assert v["max"] <= v["arithmetic"] <= v["geometric"] <= v["min"]
    assert v["max"] < v["min"]
    assert clustering_scores(y_true, y_pred, average_method="max")["nmi"] == v["max"]
    with pytest.raises(ValueError, match="average_method"):
        nmi(y_true, y_pred, average_method="mean")


@pytest.mark.parametrize("func", [clustering_accuracy, purity, nmi, adjusted_rand, clustering_scores])
def test_invalid_inputs_raise(func):
    with pytest.raises(ValueError, match="differ in length"):
        func([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match=r"y_pred must be 1-D"):
        func([0, 1], [[0], [1]])
    with pytest.raises(ValueError, match="empty"):
        func([], [])


def test_adjusted_rand_is_one_for_a_relabelling_zero_in_expectation_and_reported_on_request():
    """1 for the classes under any names, about 0 for random labels (it is corrected for chance, unlike
    purity), below 1 for a worse partition; ``clustering_scores(ari=True)`` adds it, and the one-line
    report prints it after the three percentages."""
    assert adjusted_rand(Y, np.array([5, 5, 5, 9, 9, 9, 1, 1, 1, 1])) == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 4000)
    assert abs(adjusted_rand(y, rng.integers(0, 4, 4000))) < 0.01
    y_pred = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    assert adjusted_rand(Y, y_pred) < 1.0
    assert "ari" not in clustering_scores(Y, y_pred)
    sc = clustering_scores(Y, y_pred, ari=True)
    assert sc["ari"] == adjusted_rand(Y, y_pred)
    assert format_scores(sc) == f"ACC 70.0 %  NMI {100 * sc['nmi']:.1f} %  purity 70.0 %  ARI {sc['ari']:.4f}"
    assert format_scores({k: v for k, v in sc.items() if k != "ari"}, digits=2).endswith("purity 70.00 %")
