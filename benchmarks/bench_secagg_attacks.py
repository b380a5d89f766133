"""Attacks on secure aggregation by an active server and by one dishonest client, with and without
the defences (signed keys with the key-list check; bounded uploads).

* **key swap** (the server): it relays to every client its own X25519 key in every peer's slot,
  derives the same pair keys as the client, strips the masks of every upload and decodes it; it
  sums the recovered uploads itself, so the run goes on.  Reported: the relative error of the
  recovered set-up and round uploads against what the clients masked (unsigned keys), or the
  refusal (signed keys, the in-process engine's default).
* **poisoned uploads** (client 1 from round 2): random masked values, masked values + 2^62, a
  float NaN, its upload x 1e12 (its own checks bypassed), its round-1 reply renumbered as
  round 3.  Reported: with the server's bound checks off, the run's end and max |V|; with them
  (the default), the error.
  (The stopping reasons of the runs without checks say "with every upload within its public
  bound": the checks that would have said otherwise are the ones switched off.)

    .venv/bin/python benchmarks/bench_secagg_attacks.py [--out benchmarks/results/secagg_attacks.json]

In process, a few seconds (BLAS pinned to one thread).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from fedsonmf._io import new_private_dir, write_atomic
from fedsonmf._validation import check_views
from fedsonmf.datasets import make_synthetic
from fedsonmf.federation import loop as fed_loop
from fedsonmf.federation import secagg
from fedsonmf.federation.inprocess import InProcessTransport
from fedsonmf.federation.loop import ClientRuntime, run_federation
from fedsonmf.protocol.config import FedConfig
from fedsonmf.protocol.messages import Message

R, ROUNDS, SEED = 4, 4, 7
CFG = FedConfig(n_components=R, tau=3, secure_aggregation=True)


def _views():
    data = make_synthetic(n_clients=3, n_samples=60, n_features=12, rank=R, heterogeneity=0.5, random_state=1).views
    return check_views(data, R)


# ----------------------------------------------------------------------------- key swap


class Recorder:
    """What each client masked: ``{(kind, round, client): {item name: float64 array}}``."""

    def __init__(self):
        self.items: dict = {}

    def __call__(self, reply, msg, runtime):
        me = int(msg.scalars["client"]) if msg.kind == "setup" else int(runtime.state.arrays[secagg.STATE_ME])
        for field in ("arrays", "scalars", "diagnostics"):
            for k, v in getattr(reply, field).items():
                self.items[(reply.kind if reply.kind != "setup" else "init", reply.round, me, f"{field}.{k}")] = \
                    np.asarray(v, dtype=np.float64).reshape(-1) if np.ndim(v) == 0 else np.asarray(v, np.float64)
        return reply


class KeySwapServer(InProcessTransport):
    """An active server: its own key in every peer slot of every client's list; unmasks every upload."""

    def __init__(self, clients, m):
        super().__init__(clients)
        self.m = m
        self.attacker = [secagg.generate_keypair() for _ in range(m)]
        self.keys: dict[int, np.ndarray] = {}  # client p -> the pair keys the attacker shares with it
        self.recovered: dict = {}

    def exchange(self, messages):
        kind = messages[0].kind if messages else ""
        if kind == "init":
            params = json.loads(str(messages[0].scalars[secagg.SECAGG_KEY]))
            real = params["public_keys"]
            out = []
            for p, msg in enumerate(messages):
                shown = [real[p] if q == p else self.attacker[q][1].hex() for q in range(self.m)]
                keys = np.zeros((self.m, 32), dtype=np.uint8)
                for q in range(self.m):
                    if q != p:
                        lst = [self.attacker[q][1] if i == q else bytes.fromhex(real[p]) if i == p
                               else secagg.generate_keypair()[1] for i in range(self.m)]
                        keys[q] = secagg.pair_keys(self.attacker[q][0], lst, q, self.seed)[p]
                self.keys[p] = keys
                out.append(dataclasses.replace(msg, scalars={**msg.scalars, secagg.SECAGG_KEY: json.dumps(
                    dict(params, public_keys=shown), sort_keys=True)}))
            messages = out
        replies = super().exchange(messages)
        if kind in ("init", "round") and self.keys:
            params = json.loads(str(messages[0].scalars[secagg.SECAGG_KEY]))
            label = secagg.exchange_label(self.seed, kind, messages[0].round if kind == "round" else 0,
                                          params["cohort"], params.get("nonce", ""))
            for p, rep in enumerate(replies):
                for key, y in rep.arrays.items():
                    name = key[len(secagg.MASKED_PREFIX):]
                    q_p = np.array(y, dtype=np.uint64).ravel()
                    for q in range(self.m):
                        if q == p:
                            continue
                        M = secagg.mask_stream(secagg.exchange_key(self.keys[p][q].tobytes(), "pair|" + label), name,
                                               q_p.size)
                        q_p = q_p - M if p < q else q_p + M
                    self.recovered[(kind, messages[0].round, p, name)] = secagg.decode(q_p, params["bits"][name])
            # the server feeds its loop the true sums (of the recovered uploads): nobody notices
            rnd = messages[0].round
            fed = []
            for p, rep in enumerate(replies):
                arrays = {}
                for key, y in rep.arrays.items():
                    name = key[len(secagg.MASKED_PREFIX):]
                    total = sum(self.recovered[(kind, rnd, q, name)] for q in range(self.m))
                    arrays[key] = (secagg.encode(total, params["bits"][name], self.m).reshape(np.shape(y)) if p == 0
                                   else np.zeros(np.shape(y), dtype=np.uint64))
                fed.append(dataclasses.replace(rep, arrays=arrays))
            replies = fed
        return replies

    seed = str(SEED)


def key_swap(views, signed: bool) -> dict:
    rec = Recorder()
    signers = secagg.KeySigner.group(len(views)) if signed else [None] * len(views)
    clients = [ClientRuntime(X, "fedsonmf", CFG, upload_hook=rec, signer=sg) for X, sg in zip(views, signers)]
    server = KeySwapServer(clients, len(views))
    try:
        res = run_federation(server, "fedsonmf", CFG, max_rounds=ROUNDS, seed=SEED)
    except secagg.KeyAgreementError as exc:
        return {"outcome": "refused", "error": str(exc)[:200], "uploads_recovered": len(server.recovered)}
    errs: dict[str, list] = {"arrays": [], "diagnostics": []}
    for (kind, rnd, p, name), x in server.recovered.items():
        plain = rec.items.get((kind, rnd, p, name))
        if plain is not None and np.linalg.norm(plain) > 0:
            errs[name.split(".")[0]].append(float(np.linalg.norm(x.reshape(-1) - plain.reshape(-1))
                                                  / np.linalg.norm(plain)))
    # the uploads proper (V_proj, V-hat) to the fixed point's error; the diagnostics likewise, except
    # the residuals r_U near convergence, which are themselves at the fixed point's resolution
    return {"outcome": f"completed ({res.n_rounds} rounds)", "uploads_recovered": sum(map(len, errs.values())),
            "max_relative_error_uploads": max(errs["arrays"]) if errs["arrays"] else None,
            "median_relative_error_diagnostics": float(np.median(errs["diagnostics"])) if errs["diagnostics"] else None}


# ----------------------------------------------------------------------------- poisoned uploads


def _wrapping_encode(x, bits, m, name="item"):
    q = np.fmod(np.rint(np.ldexp(np.asarray(x, dtype=np.float64), int(bits))), 2.0 ** 64)
    return np.mod(q, 2.0 ** 64).astype(np.uint64)


class Hostile(ClientRuntime):
    def __init__(self, X, attack):
        super().__init__(X, "fedsonmf", CFG)
        self.attack, self.kept, self.rng = attack, None, np.random.default_rng(0)

    def handle(self, msg: Message) -> Message:
        hit = msg.kind == "round" and msg.round >= 2
        with contextlib.ExitStack() as stack:
            if self.attack == "x1e12" and hit:
                self.upload_hook = lambda rep, m_, rt: dataclasses.replace(
                    rep, arrays={k: 1e12 * np.asarray(v) for k, v in rep.arrays.items()})
                stack.callback(setattr, secagg, "check_upload_bound", secagg.check_upload_bound)
                stack.callback(setattr, secagg, "encode", secagg.encode)
                secagg.check_upload_bound = lambda *a, **k: None  # type: ignore[assignment]
                secagg.encode = _wrapping_encode  # type: ignore[assignment]
            reply = super().handle(msg)
            self.upload_hook = None
        if msg.kind == "round" and msg.round == 1:
            self.kept = reply
        if not hit or self.attack == "x1e12":
            return reply
        if self.attack == "renumbered":
            return dataclasses.replace(self.kept, round=msg.round) if msg.round == 3 else reply
        arrays = {}
        for k, a in reply.arrays.items():
            if self.attack == "random":
                arrays[k] = self.rng.integers(0, 2 ** 64 - 1, size=np.shape(a), dtype=np.uint64, endpoint=True)
            elif self.attack == "plus2^62":
                arrays[k] = np.asarray(a) + np.uint64(2 ** 62)
            else:  # nan
                arrays[k] = np.full(np.shape(a), np.nan)
        return dataclasses.replace(reply, arrays=arrays)


def poisoned(views, attack: str, checks: bool) -> dict:
    clients = [Hostile(X, attack) if p == 1 else ClientRuntime(X, "fedsonmf", CFG) for p, X in enumerate(views)]
    with contextlib.ExitStack() as stack:
        if not checks:  # the server's checks off: what a run without them ends with
            stack.callback(setattr, secagg, "check_sum_bound", secagg.check_sum_bound)
            stack.callback(setattr, fed_loop.secagg, "UploadBoundError", secagg.UploadBoundError)
            secagg.check_sum_bound = lambda *a, **k: None  # type: ignore[assignment]
            if attack == "nan":
                stack.callback(setattr, secagg, "aggregate_masked", secagg.aggregate_masked)
                orig = secagg.aggregate_masked

                def lenient(replies, *a, **k):
                    replies = [dataclasses.replace(r, arrays={n: np.nan_to_num(np.asarray(v)).astype(np.uint64)
                                                              for n, v in r.arrays.items()}) for r in replies]
                    return orig(replies, *a, **k)

                secagg.aggregate_masked = lenient  # type: ignore[assignment]
        try:
            with np.errstate(all="ignore"):
                res = run_federation(InProcessTransport(clients), "fedsonmf", CFG, max_rounds=ROUNDS, seed=SEED)
        except Exception as exc:  # noqa: BLE001 - the outcome is what this reports
            return {"outcome": f"failed: {type(exc).__name__}", "error": str(exc)[:160]}
    V = res.V
    return {"outcome": "completed" if not res.extra.get("diverged") else "stopped (diverged)",
            "max_abs_V": float(np.max(np.abs(V))) if np.all(np.isfinite(V)) else float("nan"),
            "stopping_reason": res.stopping_reason[:160]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    views = _views()
    out: dict = {"key_swap": {}, "poisoned": {}}
    with threadpool_limits(1):
        honest = run_federation(InProcessTransport([ClientRuntime(X, "fedsonmf", CFG) for X in views]), "fedsonmf",
                                CFG, max_rounds=ROUNDS, seed=SEED)
        out["honest_max_abs_V"] = float(np.max(np.abs(honest.V)))
        for signed in (False, True):
            out["key_swap"]["signed" if signed else "unsigned"] = key_swap(views, signed)
        for attack in ("random", "plus2^62", "nan", "x1e12", "renumbered"):
            out["poisoned"][attack] = {"without_checks": poisoned(views, attack, False),
                                       "with_checks": poisoned(views, attack, True)}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out is not None:  # like every results file: atomically, 0600 in a 0700 folder
        new_private_dir(args.out.parent)
        write_atomic(args.out, (text + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
