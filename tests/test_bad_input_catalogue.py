"""The bad-input catalogue: every case is an input through the public API, the
error type it must raise and a fragment of the message.  No case may end in a raw
traceback (an exception that is not one of fedsonmf's errors), a hang, or a silent result.

Cases are generated combinatorially:

* every bad view kind x every position x every estimator entry point;
* every bad Xs container x every entry point;
* every bad value x every hyper-parameter x every entry point (the exact type --
  ParameterError, or InputError for a rank above a view's width -- and the parameter's name);
* every corruption x every .mat file (synthetic files always, the shared real files when
  the data folder is present);
* every way of resuming a checkpoint on other data, another config or a damaged file.
"""

from __future__ import annotations

import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp

import fedsonmf
from fedsonmf.datasets import load_mat
from fedsonmf.datasets.mat import default_data_dir
from fedsonmf.estimators.clustering import FedMultiViewClustering
from fedsonmf.estimators.options import from_flat
from fedsonmf.exceptions import (
    CheckpointError,
    FedSONMFError,
    InputError,
    ParameterError,
)
from fedsonmf.federation import checkpoint as ckpt
from fedsonmf.federation.inprocess import run_inprocess
from fedsonmf.protocol.config import FedConfig

N, WIDTHS, R = 20, (6, 6, 7), 2


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[], Any]
    error: type | tuple
    fragment: str  # a regular expression searched in the message


def _good_views():
    rng = np.random.default_rng(0)
    return [rng.random((N, d)) for d in WIDTHS]


# ----------------------------------------------------------------------------- views

_HAS_LONGDOUBLE = np.finfo(np.longdouble).max > 1e308


def _with(v, i, j, value, dtype=None):
    w = v.astype(dtype or v.dtype, copy=True)
    w[i, j] = value
    return w


BAD_VIEWS: dict[str, tuple[Callable, str]] = {
    # kind: (make(view) -> bad view, fragment ({p} = position))
    "nan": (lambda v: _with(v, 0, 0, np.nan), r"view {p} contains NaN or Inf"),
    "inf": (lambda v: _with(v, 3, 1, np.inf), r"view {p} contains NaN or Inf"),
    "-inf": (lambda v: _with(v, 5, 2, -np.inf), r"view {p} contains NaN or Inf"),
    "nan-float32": (lambda v: _with(v, 1, 1, np.nan, np.float32), r"view {p} contains NaN or Inf"),
    "nan-csr": (lambda v: sp.csr_matrix(_with(v, 2, 0, np.nan)), r"view {p} contains NaN"),
    "nan-dok": (lambda v: sp.dok_matrix(_with(v, 2, 0, np.nan)), r"view {p} contains NaN"),
    "inf-bsr-array": (lambda v: sp.bsr_array(_with(v, 0, 0, np.inf)), r"view {p} contains NaN"),
    "complex-dense": (lambda v: v.astype(complex), r"view {p} must hold real numbers, got complex"),
    "complex-dense-real-valued": (lambda v: v + 0j, r"view {p} must hold real numbers, got complex"),
    "complex-csr": (lambda v: sp.csr_matrix(v.astype(complex) * 1j), r"view {p} must hold real numbers, got complex"),
    "complex-coo-array": (lambda v: sp.coo_array(v + 1j), r"view {p} must hold real numbers, got complex"),
    "complex-dok": (lambda v: sp.dok_matrix(v.astype(np.complex64)), r"view {p} must hold real numbers, got complex"),
    "complex-lil": (lambda v: sp.lil_matrix(v + 2j), r"view {p} must hold real numbers, got complex"),
    "complex-dia": (lambda v: sp.dia_matrix(v + 1j), r"view {p} must hold real numbers, got complex"),
    # numbers stored as objects are converted (scikit-learn's convention); anything else is refused
    "object": (lambda v: _with(v, 0, 0, {"a": 1}, dtype=object), r"view {p} must hold real numbers, got dtype object"),
    "object-str": (lambda v: _with(v, 1, 1, "x", dtype=object), r"view {p} must hold real numbers, got dtype object"),
    "str": (lambda v: v.astype(str), r"view {p} must hold real numbers, got dtype <U"),
    "bytes-dtype": (lambda v: v.astype("S8"), r"view {p} must hold real numbers, got dtype \|S8"),
    "datetime": (lambda v: np.zeros(v.shape, dtype="datetime64[s]"), r"view {p} must hold real numbers"),
    "none": (lambda v: None, r"view {p} must be an array or a scipy.sparse matrix, got NoneType"),
    "string": (lambda v: "abc", r"view {p} must be an array or a scipy.sparse matrix, got str"),
    "bytes": (lambda v: b"abc", r"view {p} must be an array or a scipy.sparse matrix, got bytes"),
    "dict": (lambda v: {"a": v}, r"view {p} must be an array or a scipy.sparse matrix, got dict"),
    "scalar": (lambda v: 3.0, r"view {p} must be an array or a scipy.sparse matrix, got float"),
    "1-d": (lambda v: v.ravel(), r"view {p} must be 2-D"),
    "3-d": (lambda v: v[:, :, None], r"view {p} must be 2-D"),
    "ragged": (lambda v: [[1.0, 2.0], [3.0]], r"view {p} cannot be read as an array"),
    "no-features": (lambda v: v[:, :0], r"view {p} is empty"),
    "zeros": (lambda v: np.zeros_like(v), r"view {p} is all zero"),
    "zeros-lil": (lambda v: sp.lil_matrix(v.shape), r"view {p} is all zero"),
    "zeros-explicit-csc": (lambda v: sp.csc_matrix((np.zeros(3), ([0, 1, 2], [0, 0, 0])), shape=v.shape),
                           r"view {p} is all zero"),
    "fewer-rows": (lambda v: v[:-1], r"different numbers of samples|disagree on n_samples"),
    "overflow": (lambda v: v * 1e200, r"view {p} is too large for float64 arithmetic"),
    "overflow-sparse": (lambda v: sp.csr_array(v * 1e160), r"view {p} is too large for float64 arithmetic"),
    "overflow-float32": (lambda v: (v * 1e19).astype(np.float32), r"view {p} is too large for float32 arithmetic"),
    "underflow": (lambda v: v * 1e-200, r"view {p} is too small for float64 arithmetic"),
}
if _HAS_LONGDOUBLE:
    BAD_VIEWS["overflow-on-cast"] = (lambda v: v.astype(np.longdouble) * np.longdouble("1e400"),
                                     r"view {p} has values that overflow float64")

ENTRY_POINTS = {
    "federated_sonmf": lambda Xs: fedsonmf.federated_sonmf(Xs, R, max_rounds=1, random_state=0),
    "FedSONMF.fit": lambda Xs: fedsonmf.FedSONMF(R, max_rounds=1, random_state=0).fit(Xs),
    "Clustering.fit": lambda Xs: FedMultiViewClustering(2, max_rounds=1, random_state=0, n_init=1).fit(Xs),
}

# the clustering estimator normalises the views first (X_p / ||X_p||_F, computed without
# overflow): a view too large or too small for the arithmetic is rescued, not refused
_RESCUED_BY_NORMALISATION = {"overflow", "overflow-sparse", "overflow-float32", "underflow"}
# estimators/clustering.py reads Xs[0].shape before validating (owned by the estimator rewrite)
_NO_SHAPE = {"none", "string", "bytes", "dict", "scalar", "ragged"}


def _view_cases():
    out = []
    for entry, fit in ENTRY_POINTS.items():
        for kind, (make, frag) in BAD_VIEWS.items():
            if entry == "Clustering.fit" and kind in _RESCUED_BY_NORMALISATION:
                continue
            for p in range(len(WIDTHS)):
                def call(make=make, p=p, fit=fit):
                    Xs = _good_views()
                    Xs[p] = make(Xs[p])
                    return fit(Xs)

                case = Case(f"{entry}-{kind}-view{p}", call, InputError, frag.format(p=p))
                out.append(pytest.param(case, id=case.id))
    return out


BAD_CONTAINERS = {
    "ndarray": (lambda Xs: Xs[0], r"Xs must be a (non-empty )?list"),
    "sparse": (lambda Xs: sp.csr_matrix(Xs[0]), r"Xs must be a (non-empty )?list"),
    "empty-list": (lambda Xs: [], r"Xs (is empty|must be a non-empty list)"),
    "none": (lambda Xs: None, r"Xs must be a (non-empty )?list"),
    "dict": (lambda Xs: {0: Xs[0]}, r"Xs must be a (non-empty )?list"),
    "string": (lambda Xs: "views", r"Xs must be a (non-empty )?list"),
    "generator": (lambda Xs: (x for x in Xs), r"Xs must be a (non-empty )?list"),
}


def _container_cases():
    return [pytest.param(Case(f"{entry}-Xs-{kind}", (lambda fit=fit, make=make: fit(make(_good_views()))),
                              (InputError, ParameterError), frag), id=f"{entry}-Xs-{kind}")
            for entry, fit in ENTRY_POINTS.items() for kind, (make, frag) in BAD_CONTAINERS.items()]


# ----------------------------------------------------------------------------- hyper-parameters

BAD_PARAMS = {
    "n_components": [0, -1, 2.5, "3", None, True, np.float64(2.0), 1000],
    "mu": [-1.0, np.nan, np.inf, "big", None, True, [1.0], 1j, np.float32(-0.5)],
    "tau": [0, -1, 2.5, "3", None, True, np.int64(0)],
    "alpha": [0, -0.1, np.nan, np.inf, "x", None, True, np.float32(0.0)],
    "eta_g": [0, -1, np.nan, np.inf, "x", None],
    "rho1": [-1, np.nan, np.inf, "x", None],
    "max_rounds": [0, -1, 2.5, "10", None, True, np.nan, np.int64(0)],
    "tol": [-1, np.nan, np.inf, "x", True, np.float32(-1)],
    "correction": ["yes", 1, None, 0],
    "algorithm": ["nope", None, 3, "", "FEDSONMF "],
    "init_u": ["pca", None, 3, ""],
    "init_v": ["svd", None, 1],
    "diagnostics": ["yes", 1, None],
    "random_state": [-1, -3, "seed", 2.5, np.int64(-1), [1], True],
    "n_jobs": ["2", 2.5, 0, -2, True, [2], np.float64(2)],
    "blas_threads": [0, -1, 2.5, "2"],
    "ustep": ["fast", 1, [1]],
}

PARAM_ENTRY_POINTS = {
    "federated_sonmf": lambda kw: fedsonmf.federated_sonmf(_good_views(), **{"n_components": R, "max_rounds": 1,
                                                                          "random_state": 0, **kw}),
    "FedSONMF.fit": lambda kw: fedsonmf.FedSONMF(**{"n_components": R, "max_rounds": 1, "random_state": 0,
                                                     **kw}).fit(_good_views()),
}

BAD_CLUSTERING_PARAMS = {
    "n_clusters": [0, -1, 2.5, "2", None, 100],
    "n_components": [0, 2.5, "2"],
    "mu": [-1.0, "big", np.nan],
    "mu_scale": [-1.0, np.nan, "x"],
    "n_init": [0, 2.5],
    "kmeans_max_iter": [0, "5"],
    "tau": [0, 2.5],
    "alpha": [0.0, -1.0],
    "max_rounds": [0, 1.5],
    "random_state": [-1, "x"],
    "n_jobs": [0, "2"],
}


# FedMultiViewClustering computes mu='auto' (divided by eta_tilde = eta_g tau alpha) before the
# FedConfig validates tau and alpha: ZeroDivisionError, or a message naming mu (estimators rewrite)


def _param_error(name, value):
    """The exception a bad value of ``name`` must raise: ParameterError, except a rank larger than
    a view's width, which is a property of the data (InputError names the view)."""
    if name == "n_components" and isinstance(value, int) and value > min(WIDTHS):
        return InputError
    return ParameterError


def _param_cases():
    out = []
    for entry, fit in PARAM_ENTRY_POINTS.items():
        for name, values in BAD_PARAMS.items():
            for i, value in enumerate(values):
                case = Case(f"{entry}-{name}={value!r}", (lambda fit=fit, kw={name: value}: fit(kw)),
                            _param_error(name, value), re.escape(name))
                out.append(pytest.param(case, id=f"{entry}-{name}-{i}"))
    for name, values in BAD_CLUSTERING_PARAMS.items():
        for i, value in enumerate(values):
            def call(name=name, value=value):
                # a grouped parameter goes into its option object, which checks it when it is made
                kw = {"max_rounds": 1, "random_state": 0, "n_init": 1, name: value}
                return FedMultiViewClustering(2, **from_flat(kw)).fit(_good_views()) if name != "n_clusters" \
                    else FedMultiViewClustering(**from_flat({"n_clusters": value, **kw})).fit(_good_views())

            out.append(pytest.param(Case(f"Clustering-{name}={value!r}", call, _param_error(name, value),
                                         re.escape(name)), id=f"Clustering.fit-{name}-{i}"))
    return out


# ----------------------------------------------------------------------------- .mat files


def _synthetic_mats(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    X = np.empty((1, 2), dtype=object)
    X[0, 0], X[0, 1] = rng.random((30, 5)), sp.csc_matrix(rng.random((30, 4)) > 0.5, dtype=float)
    y = rng.integers(1, 4, size=(30, 1)).astype(float)
    out = {}
    for name, compress in (("v5z", True), ("v5", False)):
        path = root / f"{name}.mat"
        scipy.io.savemat(path, {"X": X, "y": y}, do_compression=compress)
        out[name] = path
    try:
        import h5py
    except ImportError:  # pragma: no cover
        return out
    path = root / "v73.mat"
    with h5py.File(path, "w", userblock_size=512) as f:
        refs = f.create_group("#refs#")
        ref_arr = np.empty((2, 1), dtype=h5py.ref_dtype)
        for i in range(2):
            ds = refs.create_dataset(f"v{i}", data=rng.random((30, 5 + i)).T)
            ds.attrs["MATLAB_class"] = np.bytes_("double")
            ref_arr[i, 0] = ds.ref
        cell = f.create_dataset("X", data=ref_arr)
        cell.attrs["MATLAB_class"] = np.bytes_("cell")
        f.create_dataset("y", data=y.T).attrs["MATLAB_class"] = np.bytes_("double")
    with open(path, "r+b") as fh:  # MATLAB's text header in the user block
        fh.write(b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: test HDF5 schema 1.00 .".ljust(116))
    out["v73"] = path
    return out


def _flip(data: bytes, seed: int) -> bytes:
    rng = random.Random(seed)
    b = bytearray(data)
    k = rng.randrange(128, len(b))
    b[k] ^= 1 << rng.randrange(8)
    return bytes(b)


def _corruptions(kind: str) -> dict[str, tuple[Callable[[bytes], bytes], str]]:
    """name -> (corrupt(bytes) -> bytes, fragment besides the file name)."""
    c = {
        "empty": (lambda d: b"", "empty"),
        "header-only": (lambda d: d[:128], "header|no variables|corrupt"),
        "truncated-200B": (lambda d: d[:200], "truncated|no variables"),
        "truncated-10%": (lambda d: d[: len(d) // 10], "truncated|no variables"),
        "truncated-50%": (lambda d: d[: len(d) // 2], "truncated|no variables"),
        "truncated-last-byte": (lambda d: d[:-1], "truncated"),
        "text": (lambda d: b"this is not a MAT file\n" * 20, "not a MAT file"),
        "random-bytes": (lambda d: random.Random(7).randbytes(3000), "not a MAT file"),
        "zip": (lambda d: b"PK\x03\x04" + bytes(400), "not a MAT file"),
        "png": (lambda d: b"\x89PNG\r\n\x1a\n" + bytes(400), "not a MAT file"),
        "zeroed-middle": (lambda d: d[: len(d) // 2] + bytes(min(4096, len(d) // 4))
                          + d[len(d) // 2 + min(4096, len(d) // 4):], "corrupt|truncated|unusable"),
    }
    if kind == "v5":  # uncompressed: zeroed data bytes could be read back as zeros, silently
        del c["zeroed-middle"]
    if kind in ("v5z", "real"):  # zlib streams carry a checksum: a flipped bit is detected
        for s in range(6 if kind == "real" else 8):
            c[f"bitflip-{s}"] = (lambda d, s=s: _flip(d, s), "corrupt|truncated|unusable|no label|no views")
    if kind == "v73":
        c = {k: v for k, v in c.items() if k not in ("zeroed-middle",)}
        c["header-only"] = (lambda d: d[:512], "not a MAT file|no variables|corrupt")
        c["truncated-last-byte"] = (lambda d: d[:-1], "corrupt or truncated MAT v7.3")
        c["superblock-zeroed"] = (lambda d: d[:512] + bytes(64) + d[576:], "not a MAT file|corrupt")
        c["truncated-90%"] = (lambda d: d[: len(d) * 9 // 10], "corrupt or truncated MAT v7.3")
    return c


def _real_files() -> list[Path]:
    root = default_data_dir()
    if root is None or not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*.mat") if p.stat().st_size < 1_500_000)


def _mat_cases():
    out = []
    for kind in ("v5z", "v5", "v73"):
        for name, (corrupt, frag) in _corruptions(kind).items():
            def call(tmp, kind=kind, corrupt=corrupt, name=name):
                src = _synthetic_mats(tmp / "src")[kind]
                bad = tmp / f"{kind}-{name}.mat"
                bad.write_bytes(corrupt(src.read_bytes()))
                return bad
            out.append(pytest.param(("mat", call, frag), id=f"load_mat-{kind}-{name}"))
    real = _real_files()
    for path in real:
        for name, (corrupt, frag) in _corruptions("real").items():
            def call(tmp, path=path, corrupt=corrupt, name=name):
                bad = tmp / f"{path.stem}-{name}.mat"
                bad.write_bytes(corrupt(path.read_bytes()))
                return bad
            out.append(pytest.param(("mat", call, frag), id=f"load_mat-real-{path.stem}-{name}",
                                    marks=pytest.mark.realdata))
    return out


def _mat_content_cases():
    """Readable files whose content is wrong, and bad arguments."""
    def mk(variables):
        def call(tmp):
            path = tmp / "content.mat"
            scipy.io.savemat(path, variables)
            return path
        return call

    rng = np.random.default_rng(2)
    A, B = rng.random((12, 3)), rng.random((12, 4))
    cell = np.empty((1, 2), dtype=object)
    cell[0, 0], cell[0, 1] = A, B
    ccell = np.empty((1, 2), dtype=object)
    ccell[0, 0], ccell[0, 1] = A + 1j, B
    y = np.arange(12.0) % 3
    cases = {
        "no-labels": (mk({"X": cell}), InputError, "no label variable"),
        "non-integer-labels": (mk({"X": cell, "y": y + 0.5}), InputError, "non-integer"),
        "labels-matrix": (mk({"X": cell, "y": rng.random((12, 3))}), InputError, "not a vector"),
        "no-views": (mk({"y": y, "other": rng.random((5, 4))}), InputError, "no views found"),
        "view-without-sample-axis": (mk({"V1": rng.random((5, 4)), "y": y}), InputError, "no views found"),
        "complex-view": (mk({"X": ccell, "y": y}), InputError, "complex"),
        "missing-file": (lambda tmp: tmp / "nope.mat", InputError, "does not exist"),
        "directory": (lambda tmp: tmp, InputError, "not a regular file"),
    }
    out = [pytest.param(("content", call, err, frag, {}), id=f"load_mat-{name}")
           for name, (call, err, frag) in cases.items()]
    args = {
        "views_key-int": ({"views_key": 3}, ParameterError, "views_key"),
        "views_key-empty-list": ({"views_key": []}, ParameterError, "views_key"),
        "views_key-missing": ({"views_key": "Z"}, InputError, "views_key"),
        "labels_key-int": ({"labels_key": 1}, ParameterError, "labels_key"),
        "labels_key-missing": ({"labels_key": "gt"}, InputError, "labels_key"),
    }
    out += [pytest.param(("content", mk({"X": cell, "y": y}), err, frag, kw), id=f"load_mat-{name}")
            for name, (kw, err, frag) in args.items()]
    return out


# ----------------------------------------------------------------------------- checkpoints

CK_CFG = FedConfig(n_components=R, tau=2)


def _dn(raw):
    return fedsonmf._validation.check_views(raw, R)


@pytest.fixture(scope="module")
def base_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    run_inprocess(_dn(_good_views()), CK_CFG, max_rounds=2, seed=3, checkpoint_dir=root)
    return root


def _damage_client(p, how):
    def apply(d: Path):
        path = ckpt.client_state_path(d, p, 2)
        if how == "garbage":
            path.write_bytes(b"PK\x03\x04 not really a zip")
            return
        if how == "missing":
            path.unlink()
            return
        st, meta = ckpt.load_client_state(d, p, 2)
        U = st.arrays["U"]
        if how == "U-scaled":
            st.arrays["U"] = U * 1.001
        elif how == "U-negative":
            st.arrays["U"] = -U
        elif how == "U-nan":
            st.arrays["U"] = np.where(U > 0, np.nan, U)
        elif how == "U-shape":
            st.arrays["U"] = U[:-1]
        elif how == "UtX-shape":
            st.arrays["UtX"] = st.arrays["UtX"][:, :-1]
        elif how == "UtX-inf":
            st.arrays["UtX"] = st.arrays["UtX"] + np.inf
        elif how == "no-fingerprint":
            meta = {k: v for k, v in meta.items() if k != "fingerprint"}
        ckpt.save_client_state(d, p, st, meta)
    return apply


_DAMAGE = {
    "U-scaled": "saved U is not orthonormal",
    "U-negative": "saved U has negative entries",
    "U-nan": "saved U holds NaN",
    "U-shape": "saved U has shape",
    "UtX-shape": "saved UtX has shape",
    "UtX-inf": "saved UtX holds NaN or Inf",
    "no-fingerprint": "no data fingerprint",
    "garbage": "cannot read checkpoint file",
    "missing": "no saved state after round 2",
}


def _resume_cases():
    def views(change):
        return lambda: _dn(change(_good_views()))

    def scale(p, c):
        def f(raw):
            raw[p] = raw[p] * c
            return raw
        return f

    def other(p):
        def f(raw):
            raw[p] = np.random.default_rng(100 + p).random(raw[p].shape)
            return raw
        return f

    def drop_col(p):
        def f(raw):
            raw[p] = raw[p][:, :-1]
            return raw
        return f

    cases = []  # (id, make_views, cfg, algorithm, mutate_dir, fragment, extra kwargs)
    same = views(lambda raw: raw)
    for p in range(3):
        cases.append((f"other-data-view{p}", views(other(p)), CK_CFG, "fedsonmf", None,
                      rf"client {p}: refusing to resume on other data", {}))
        cases.append((f"scaled-1%-view{p}", views(scale(p, 1.01)), CK_CFG, "fedsonmf", None,
                      rf"client {p}: refusing to resume on other data", {}))
        cases.append((f"one-feature-less-view{p}", views(drop_col(p)), CK_CFG, "fedsonmf", None,
                      rf"client {p}: refusing to resume on other data.*shape", {}))
        cases.append((f"one-ulp-view{p}", views(lambda raw, p=p: [*raw[:p], _with(raw[p], 0, 0, np.nextafter(
            raw[p][0, 0], 2)), *raw[p + 1:]]), CK_CFG, "fedsonmf", None,
                      rf"client {p}: refusing to resume on other data", {}))
    cases.append(("views-swapped", views(lambda raw: [raw[1], raw[0], raw[2]]), CK_CFG, "fedsonmf", None,
                  r"client 0: refusing to resume on other data", {}))
    cases.append(("fewer-samples", views(lambda raw: [v[:-2] for v in raw]), CK_CFG, "fedsonmf", None,
                  r"client 0: refusing to resume on other data.*shape", {}))
    cases.append(("views-as-sparse", views(lambda raw: [sp.csr_matrix(v) for v in raw]), CK_CFG, "fedsonmf", None,
                  r"client 0: .*made on a dense float64 view, this one is sparse float64", {}))
    cases.append(("view-as-float32", views(lambda raw: [raw[0], raw[1].astype(np.float32), raw[2]]), CK_CFG,
                  "fedsonmf", None, r"client 1: .*made on a dense float64 view, this one is dense float32", {}))
    for field, value in [("mu", 0.5), ("alpha", 0.02), ("tau", 3), ("eta_g", 1.0), ("rho1", 0.5),
                         ("correction", False), ("init_u", "svd"), ("init_v", "random"), ("diagnostics", False),
                         ("n_components", 3)]:
        cases.append((f"config-{field}", same, CK_CFG.replace(**{field: value}), "fedsonmf", None,
                      rf"config\.{field}: .* in the checkpoint, .* now", {}))
    cases.append(("algorithm", same, CK_CFG, "fedmgs", None, r"algorithm of this run differs", {}))
    cases.append(("n_clients", views(lambda raw: raw[:2]), CK_CFG, "fedsonmf", None, r"n_clients: 3 in the "
                  r"checkpoint, 2 now", {}))
    cases.append(("seed", same, CK_CFG, "fedsonmf", None, r"seed: 3 in the checkpoint, 4 now", {"seed": 4}))
    for p in range(3):
        for how, frag in _DAMAGE.items():
            cases.append((f"client{p}-{how}", same, CK_CFG, "fedsonmf", _damage_client(p, how),
                          rf"client {p}:.*{frag}|{frag}.*client-{p}-r2\.npz", {}))
    cases.append(("server-garbage", same, CK_CFG, "fedsonmf",
                  lambda d: (d / "server.npz").write_bytes(b"garbage"), r"cannot read checkpoint file .*server\.npz",
                  {}))
    cases.append(("server-missing", same, CK_CFG, "fedsonmf", lambda d: (d / "server.npz").unlink(),
                  r"server\.npz does not exist", {}))
    return [pytest.param(c, id=f"resume-{c[0]}") for c in cases]


# ----------------------------------------------------------------------------- the tests


def _raises(case_error, fragment, call):
    try:
        result = call()
    except case_error as exc:
        assert isinstance(exc, FedSONMFError), f"raised {type(exc).__name__}, not one of fedsonmf's errors: {exc}"
        assert re.search(fragment, str(exc)), f"message {str(exc)!r} lacks {fragment!r}"
        return exc
    except Exception as exc:  # a raw traceback: the catalogue's failure
        pytest.fail(f"raw {type(exc).__name__} instead of {case_error}: {exc}")
    pytest.fail(f"no error; returned {type(result).__name__}")


@pytest.mark.parametrize("case", _view_cases() + _container_cases())
def test_bad_data(case):
    exc = _raises(case.error, case.fragment, case.call)
    assert isinstance(exc, FedSONMFError)


@pytest.mark.parametrize("case", _param_cases())
def test_bad_hyper_parameter(case):
    _raises(case.error, case.fragment, case.call)


@pytest.mark.parametrize("spec", _mat_cases())
def test_corrupted_mat_file(tmp_path, spec):
    _, make, frag = spec
    path = make(tmp_path)
    exc = _raises(InputError, re.escape(str(path)), lambda: load_mat(path))
    assert re.search(frag, str(exc)), f"message {str(exc)!r} lacks {frag!r}"


@pytest.mark.parametrize("spec", _mat_content_cases())
def test_bad_mat_content_or_argument(tmp_path, spec):
    _, make, err, frag, kw = spec
    path = make(tmp_path)
    exc = _raises(err, frag, lambda: load_mat(path, **kw))
    if err is InputError:
        assert str(path) in str(exc)


@pytest.mark.parametrize("spec", _resume_cases())
def test_bad_resume(tmp_path, base_checkpoint, spec):
    _, make_views, cfg, algorithm, mutate, frag, kw = spec
    d = tmp_path / "ck"
    shutil.copytree(base_checkpoint, d)
    if mutate is not None:
        mutate(d)
    _raises(CheckpointError, frag, lambda: run_inprocess(make_views(), cfg, algorithm, max_rounds=3,
                                                          checkpoint_dir=d, resume=True, **kw))


def test_resume_without_checkpoint_dir():
    _raises(ParameterError, "needs checkpoint_dir",
            lambda: run_inprocess(_dn(_good_views()), CK_CFG, max_rounds=2, resume=True))


def test_catalogue_size():
    n = (len(_view_cases()) + len(_container_cases()) + len(_param_cases()) + len(_mat_cases())
         + len(_mat_content_cases()) + len(_resume_cases()) + 1)
    assert n >= 300, n
