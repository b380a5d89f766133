"""Every JSON output carries a ``meta`` block: versions, command line, time, seeds, SHA-256 of each input."""

import hashlib
import json

import numpy as np
import pytest
import scipy.sparse as sp

from fedsonmf import federated_sonmf
from fedsonmf._provenance import meta, sha256_array, sha256_file
from fedsonmf.cli.app import main


def _check_meta(m, n_inputs):
    assert set(m) >= {"versions", "command", "time_utc", "seeds", "inputs"}
    assert set(m["versions"]) >= {"fedsonmf", "numpy", "scipy", "scikit-learn", "python"}
    assert len(m["inputs"]) == n_inputs and all(len(i["sha256"]) == 64 for i in m["inputs"])


def test_hashes(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"abc")
    assert sha256_file(f) == hashlib.sha256(b"abc").hexdigest()
    X = np.arange(6.0).reshape(2, 3)
    assert sha256_array(X) == sha256_array(X.copy()) != sha256_array(X + 1)
    assert sha256_array(sp.csc_matrix(X)) == sha256_array(sp.coo_matrix(X))  # one canonical sparse form
    m = meta(inputs=[f, ("v", X)], seeds=3, call="test")
    assert m["command"] == "test" and m["seeds"] == [3] and [i["name"] for i in m["inputs"]] == [str(f), "v"]


def test_fit_result_json_has_meta_with_view_hashes(tmp_path):
    rng = np.random.default_rng(0)
    views = [rng.random((20, 5)), rng.random((20, 6))]
    res = federated_sonmf(views, 2, max_rounds=2, tol=0, random_state=4)
    res.save_json(tmp_path / "r.json")
    doc = json.loads((tmp_path / "r.json").read_text())
    _check_meta(doc["meta"], 2)
    assert doc["meta"]["seeds"] == [4]
    assert doc["meta"]["inputs"][0]["sha256"] == sha256_array(views[0])


def _cli(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code


def test_cli_json_outputs_have_meta(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.savetxt("a.csv", rng.random((30, 5)), delimiter=",")
    np.savetxt("b.csv", rng.random((30, 7)), delimiter=",")
    assert _cli(["cluster", "a.csv", "b.csv", "-k", "3", "--rounds", "3", "-q", "--json", "c.json"]) in (0, None)
    m = json.loads((tmp_path / "c.json").read_text())["meta"]
    _check_meta(m, 2)
    assert m["inputs"][0] == {"name": "a.csv", "sha256": sha256_file(tmp_path / "a.csv")}
    assert "cluster a.csv b.csv" in m["command"]
    assert _cli(["synthetic", "--rounds", "2", "-q", "--clients", "3", "--json", "s.json"]) in (0, None)
    _check_meta(json.loads((tmp_path / "s.json").read_text())["meta"], 3)
