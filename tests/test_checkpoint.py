"""Checkpoint files (atomic, bit-exact) and checkpoint/resume of the in-process engine."""

import json

import numpy as np
import pytest

from fedsonmf._validation import check_views
from fedsonmf.algorithms import ALGORITHMS
from fedsonmf.core.ustep import PenaltyOptions
from fedsonmf.federation import checkpoint as ckpt
from fedsonmf.federation.inprocess import run_inprocess
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.history import History
from fedsonmf.protocol.messages import ClientState, ServerState


def test_atomic_save_roundtrip_is_bit_exact(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {"A": rng.standard_normal((3, 5)), "B": np.arange(4)}
    path = ckpt.atomic_save_npz(tmp_path / "x.npz", arrays, {"k": 1, "f": 0.1})
    got, meta = ckpt.load_npz(path)
    assert set(got) == {"A", "B"} and meta == {"k": 1, "f": 0.1}
    assert np.array_equal(got["A"], arrays["A"]) and got["A"].dtype == np.float64
    assert [p.name for p in tmp_path.iterdir()] == ["x.npz"]  # no temporary file left


def test_load_missing_or_torn_file_raises(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        ckpt.load_npz(tmp_path / "nope.npz")
    (tmp_path / "torn.npz").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(ckpt.CheckpointError, match="cannot read"):
        ckpt.load_npz(tmp_path / "torn.npz")


def test_server_checkpoint_roundtrip(tmp_path):
    state = ServerState(3, {"V": np.ones((2, 4)), "Vbar": np.full((2, 4), 0.5)})
    hist = History()
    hist.append({"round": 1, "R": 2.0, "R_start": 4.0, "seconds": 0.1})
    hist.append({"round": 2, "R": 1.0, "R_start": 2.0, "seconds": 0.1})
    ckpt.save_server_checkpoint(tmp_path, state, hist, {"seed": 7, "algorithm": "fedsonmf"})
    got = ckpt.load_server_checkpoint(tmp_path)
    assert got.state.round == 3 and got.completed_rounds == 2
    assert np.array_equal(got.state.arrays["Vbar"], state.arrays["Vbar"])
    assert got.history.rows == hist.rows and got.history.R0 == 4.0
    assert got.run == {"seed": 7, "algorithm": "fedsonmf"}
    # a new row after a resume continues the relative residuals from the saved R^1
    row = got.history.append({"round": 3, "R": 0.5, "R_start": 1.0})
    assert row["R_rel"] == 0.25


def test_client_states_keep_the_last_two_rounds(tmp_path):
    for s in range(5):
        ckpt.save_client_state(tmp_path, 1, ClientState(s, {"U": np.full((3, 2), s)}), {"algorithm": "x"})
    ckpt.save_client_state(tmp_path, 0, ClientState(0, {"U": np.zeros((3, 2))}))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client-0-r0.npz", "client-1-r3.npz", "client-1-r4.npz"]
    st, meta = ckpt.load_client_state(tmp_path, 1, 3)
    assert st.round == 3 and np.all(st.arrays["U"] == 3) and meta["algorithm"] == "x"
    with pytest.raises(ckpt.CheckpointError, match=r"no saved state after round 2.*saved rounds: \[3, 4\]"):
        ckpt.load_client_state(tmp_path, 1, 2)


def test_client_state_file_must_hold_the_named_round(tmp_path):
    ckpt.save_client_state(tmp_path, 0, ClientState(2, {"U": np.zeros(2)}))
    (tmp_path / "client-0-r2.npz").rename(tmp_path / "client-0-r3.npz")  # a stale file under a new name
    with pytest.raises(ckpt.CheckpointError, match="holds client 0 round 2, expected client 0 round 3"):
        ckpt.load_client_state(tmp_path, 0, 3)


def test_config_from_dict_roundtrip():
    cfg = FedConfig(n_components=5, mu=0.3, tau=4, correction=False, init_v="random",
                    ustep=PenaltyOptions(eps1_rel=1e-3, polish=False))
    again = ckpt.config_from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


@pytest.fixture(scope="module")
def views(small_problem):
    return check_views(small_problem.views, 4)


CFG = FedConfig(n_components=4, tau=3)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_inprocess_resume_gives_the_uninterrupted_result(tmp_path, views, algorithm):
    full = run_inprocess(views, CFG, algorithm, max_rounds=4, seed=11)
    part = run_inprocess(views, CFG, algorithm, max_rounds=2, seed=11, checkpoint_dir=tmp_path)
    assert part.n_rounds == 2
    res = run_inprocess(views, CFG, algorithm, max_rounds=4, checkpoint_dir=tmp_path, resume=True)
    assert res.seed == 11 and res.n_rounds == 4
    assert np.array_equal(res.V, full.V)
    for a, b in zip(res.bases, full.bases):
        assert np.array_equal(a, b)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(res.history.rows) == strip(full.history.rows)


def test_inprocess_resume_when_clients_are_one_round_ahead(tmp_path, views):
    """A crash after the clients saved round s but before the server did: resume redoes round s."""
    full = run_inprocess(views, CFG, max_rounds=3, seed=2)
    run_inprocess(views, CFG, max_rounds=2, seed=2, checkpoint_dir=tmp_path)
    saved = ckpt.load_server_checkpoint(tmp_path)
    # roll the server back to round 1, as if it died before committing round 2
    one = run_inprocess(views, CFG, max_rounds=1, seed=2, checkpoint_dir=tmp_path / "one")
    ckpt.save_server_checkpoint(tmp_path, one.server_state, one.history, saved.run)
    res = run_inprocess(views, CFG, max_rounds=3, checkpoint_dir=tmp_path, resume=True)
    assert np.array_equal(res.V, full.V)


def test_inprocess_resume_refuses_another_config(tmp_path, views):
    run_inprocess(views, CFG, max_rounds=1, seed=2, checkpoint_dir=tmp_path)
    with pytest.raises(ckpt.CheckpointError, match="config of this run"):
        run_inprocess(views, CFG.replace(tau=4), max_rounds=2, checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(ValueError, match="needs checkpoint_dir"):
        run_inprocess(views, CFG, max_rounds=2, resume=True)


# ----------------------------------------------------------------------------- safe resume


def _resume(views_dn, tmp_path, cfg=CFG):
    return run_inprocess(views_dn, cfg, max_rounds=3, checkpoint_dir=tmp_path, resume=True)


@pytest.fixture
def saved_run(tmp_path, small_problem):
    raw = [np.asarray(v.toarray() if hasattr(v, "toarray") else v) for v in small_problem.views]
    run_inprocess(check_views(raw, 4), CFG, max_rounds=2, seed=5, checkpoint_dir=tmp_path)
    return tmp_path, raw


@pytest.mark.parametrize("change, client", [
    (lambda raw: [np.random.default_rng(9).random(raw[0].shape), *raw[1:]], 0),   # other data, same shape
    (lambda raw: [raw[0], raw[1] * 1.01, *raw[2:]], 1),                            # one view scaled by 1 %
    (lambda raw: [raw[1], raw[0], *raw[2:]] if raw[0].shape == raw[1].shape else
     [raw[1][:, :raw[0].shape[1]], raw[0][:, :raw[1].shape[1]], *raw[2:]], 0),    # two views swapped
    (lambda raw: [v[:-3] for v in raw], 0),                                        # other n
])
def test_resume_on_other_data_is_refused_by_the_client(saved_run, change, client):
    tmp_path, raw = saved_run
    with pytest.raises(ckpt.CheckpointError, match=rf"client {client}: refusing to resume on other data"):
        _resume(check_views(change(raw), 4), tmp_path)


def test_resume_refuses_a_damaged_client_state(saved_run):
    tmp_path, raw = saved_run
    views_dn = check_views(raw, 4)
    st, meta = ckpt.load_client_state(tmp_path, 1, 2)
    good = st.arrays["U"].copy()
    for bad, match in [(good * 1.01, "client 1: saved U is not orthonormal"),
                       (-good, "client 1: saved U has negative entries"),
                       (good[:-1], r"client 1: saved U has shape"),
                       (np.full_like(good, np.nan), "client 1: saved U holds NaN")]:
        st.arrays["U"] = bad
        ckpt.save_client_state(tmp_path, 1, st, meta)
        with pytest.raises(ckpt.CheckpointError, match=match):
            _resume(views_dn, tmp_path)
    st.arrays["U"] = good
    st.arrays["UtX"] = st.arrays["UtX"][:, :-1]
    ckpt.save_client_state(tmp_path, 1, st, meta)
    with pytest.raises(ckpt.CheckpointError, match=r"client 1: saved UtX has shape"):
        _resume(views_dn, tmp_path)


def test_config_mismatch_names_the_field(saved_run):
    tmp_path, raw = saved_run
    with pytest.raises(ckpt.CheckpointError, match=r"config\.tau: 3 in the checkpoint, 5 now"):
        _resume(check_views(raw, 4), tmp_path, CFG.replace(tau=5))
    with pytest.raises(ckpt.CheckpointError, match=r"config\.mu: 'auto' in the checkpoint, 0\.5 now"):
        _resume(check_views(raw, 4), tmp_path, CFG.replace(mu=0.5))


def test_temp_files_of_a_killed_write_are_cleaned(saved_run):
    tmp_path, raw = saved_run
    for name in (".server.npz.k1ll3d.tmp", ".client-0-r2.npz.abc123.tmp", ".client-1-r3.npz.x_y.tmp"):
        (tmp_path / name).write_bytes(b"half a file")
    res = _resume(check_views(raw, 4), tmp_path)
    assert res.n_rounds == 3
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_fingerprint_is_layout_independent_and_sensitive():
    import scipy.sparse as sp

    rng = np.random.default_rng(0)
    A = rng.random((6, 9))
    assert ckpt.view_fingerprint(A) == ckpt.view_fingerprint(np.asfortranarray(A))
    S = sp.random(6, 9, density=0.4, random_state=1, format="csc")
    assert ckpt.view_fingerprint(S) == ckpt.view_fingerprint(S.tocsr())
    B = A.copy()
    B[3, 4] = np.nextafter(B[3, 4], 2)
    assert ckpt.view_fingerprint(A) != ckpt.view_fingerprint(B)
