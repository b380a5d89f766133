"""The loopback deployment end to end: a SuperLink and 3 SuperNodes as separate
processes, shared by all tests of this module (≈5-8 s per round on a loaded machine,
so every run is short).  Slow (≈3-4 min in total), run in CI.
"""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest

pytest.importorskip("flwr")

from threadpoolctl import threadpool_limits  # noqa: E402

from _waits import STALL, join, status_progress, wait_until  # noqa: E402
from fedsonmf._validation import check_views  # noqa: E402
from fedsonmf.datasets import make_synthetic  # noqa: E402
from fedsonmf.federation.flower import (  # noqa: E402
    LoopbackDeployment,
    load_result,
    write_app_dir,
    write_views,
)
from fedsonmf.federation.flower.audit import audit_wire  # noqa: E402
from fedsonmf.federation.inprocess import run_inprocess  # noqa: E402
from fedsonmf.protocol.config import FedConfig  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.deploy]

R, N = 4, 60
CFG = FedConfig(n_components=R, tau=3)
ROUNDS, SEED = 3, 5

FAULT_CLIENT = '''"""Test shim: the fedsonmf ClientApp with injected faults (run config 'fault' =
kind:client:round[:path], comma-separated)."""
import os
import time

from fedsonmf.federation.flower.client_app import make_client_app


def _fault(msg, context, job_id):
    spec = str(context.run_config.get("fault", ""))
    if not spec:
        return
    for one in spec.split(","):
        kind, client, rnd, *path = one.split(":", 3)
        if int(context.node_config["partition-id"]) == int(client) and msg.kind == "round" and msg.round == int(rnd):
            if kind == "raise":
                raise RuntimeError(f"injected fault in client {client} round {rnd}")
            if kind == "hang":
                time.sleep(120)
            if kind == "wait":  # hold this round until the test creates the file (at most 120 s)
                end = time.monotonic() + 120
                while not os.path.exists(path[0]) and time.monotonic() < end:
                    time.sleep(0.01)


app = make_client_app(before_handle=_fault)
'''


@pytest.fixture(scope="module")
def data():
    d = make_synthetic(n_clients=3, n_samples=N, n_features=12, rank=R, heterogeneity=0.5, random_state=1)
    return d.views


@pytest.fixture(scope="module")
def reference(data):
    """The in-process run (BLAS pinned to one thread, like the launched processes)."""
    with threadpool_limits(1):
        return run_inprocess(check_views(data, R), CFG, max_rounds=ROUNDS, seed=SEED)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("flower")
    paths = write_views(data, root / "views")
    # the gate runs the node's installed ClientApp, never code from the FAB: the fault-injecting
    # ClientApp is this node-side module (inert unless the run config sets 'fault')
    mods = root / "mods"
    mods.mkdir()
    (mods / "fedsonmf_fault_client.py").write_text(FAULT_CLIENT)
    dep = LoopbackDeployment(root / "run", paths, client_app="fedsonmf_fault_client:app",
                             require_secure_aggregation=False)  # the plain protocol (below)
    dep.env["PYTHONPATH"] = os.pathsep.join(p for p in (str(mods), dep.env.get("PYTHONPATH", "")) if p)
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()
        leftovers = [p for p in list(dep.nodes.values()) + [dep.superlink] if p.poll() is None]
        assert not leftovers


def _config(job, **kw):
    rc = {"num-rounds": ROUNDS, "seed": SEED, "config-json": json.dumps(CFG.to_dict()), "job-id": job,
          "round-timeout": STALL, "node-timeout": STALL, "record-wire": True,  # ceilings of event waits
          "secure-aggregation": False}  # the plain protocol (secure aggregation: tests/test_secagg.py)
    rc.update(kw)
    return rc


def _wire(out):
    return [json.loads(line) for line in open(out / "wire.jsonl")]


def test_deployment_end_to_end_equals_inprocess(deployment, reference):
    out = deployment.run_dir / "e2e"
    outcome = deployment.run(_config("e2e"), out_dir=out)
    assert outcome.ok, outcome.status
    res = load_result(out)
    assert res.n_rounds == ROUNDS
    np.testing.assert_allclose(res.V, reference.V, rtol=0, atol=1e-10)
    assert np.array_equal(res.V, reference.V)  # bit-identical with BLAS pinned to 1 thread
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(res.history.to_records()) == strip(reference.history.to_records())
    assert res.config["n_clients"] == 3 and res.config["n_components"] == R and res.seed == SEED
    summary = audit_wire(_wire(out), "fedsonmf", CFG, N)
    assert summary["up round"]["messages"] == 3 * ROUNDS and summary["up round"]["bytes_diagnostics"] > 0
    # serialised array bytes per round and client: one r x n float64 matrix each way (+ .npy header)
    for wb in res.extra["flower"]["wire_bytes"][1:]:
        assert 3 * R * N * 8 <= wb["down"] <= 3 * (R * N * 8 + 256)


def test_deployment_without_diagnostics(deployment, data):
    out = deployment.run_dir / "nodiag"
    cfg = CFG.replace(diagnostics=False)
    outcome = deployment.run(_config("nodiag", **{"num-rounds": 1, "diagnostics": False}), out_dir=out)
    assert outcome.ok, outcome.status
    summary = audit_wire(_wire(out), "fedsonmf", cfg, N)
    assert summary["up round"]["bytes_diagnostics"] == 0
    res = load_result(out)
    assert res.history.rows[0]["bytes_diagnostics"] == 0 and "R_rel" not in res.history.rows[0]
    with threadpool_limits(1):
        ref = run_inprocess(check_views(data, R), cfg, max_rounds=1, seed=SEED)
    assert np.array_equal(res.V, ref.V)


def test_client_that_raises_is_named_with_its_round(deployment):
    app = write_app_dir(deployment.run_dir / "app-fault", client_source=FAULT_CLIENT, extra_config={"fault": ""})
    out = deployment.run_dir / "raise"
    outcome = deployment.run(_config("raise", fault="raise:1:1"), out_dir=out, app_dir=app)
    st = outcome.status
    assert st["status"] == "failed"
    assert st["client"] == 1 and st["round"] == 1 and st["last_completed_round"] == 0
    assert "client 1" in st["error"] and "round 1" in st["error"] and "injected fault" in st["error"]


def test_killed_client_stops_the_run_and_resume_gives_the_same_v(deployment, reference):
    """SIGKILL SuperNode 2 during round 2: the server stops within the round timeout naming
    client 2 and round 2, after saving round 1; restart the node, resume, same V."""
    out = deployment.run_dir / "kill"
    timeout = 30.0  # the round timeout under test: a cold ClientApp start on a loaded machine can take > 12 s
    # node 0 holds round 2 until node 2 is killed: the kill lands in round 2 however fast the rounds are
    killed = out.parent / "kill-killed"
    app = write_app_dir(deployment.run_dir / "app-fault", client_source=FAULT_CLIENT, extra_config={"fault": ""})
    outcome = {}

    def go():
        outcome["o"] = deployment.run(_config("kill", **{"round-timeout": timeout, "fault": f"wait:0:2:{killed}"}),
                                      out_dir=out, app_dir=app)

    th = threading.Thread(target=go)
    th.start()
    ckpt_file = out / "checkpoint" / "server.npz"
    wait_until(ckpt_file.exists, "round 1's checkpoint", progress=status_progress(out), alive=th.is_alive)
    assert ckpt_file.exists(), "round 1 never completed"
    deployment.kill_node(2, signal.SIGKILL)
    t_kill = time.monotonic()
    killed.touch()
    join(th, progress=status_progress(out))
    st = outcome["o"].status
    assert st["status"] == "failed", st
    assert st["client"] == 2 and st["round"] == 2 and st["last_completed_round"] == 1, st
    # stopped by the round timeout, not by the test's patience (+ flwr run's exit, slow on a loaded machine)
    assert time.monotonic() - t_kill < timeout + 120

    deployment.start_node(2)  # a new node id, the same view and node-local state
    outcome2 = deployment.run(_config("kill", resume=True), out_dir=out, app_dir=app)
    assert outcome2.ok, outcome2.status
    res = load_result(out)
    assert res.extra["flower"]["resumed_from_round"] == 2
    assert np.array_equal(res.V, reference.V)
    assert [r["round"] for r in res.history.rows] == [1, 2, 3]


def test_supernode_killed_in_round_k_restarted_in_round_k_plus_3_rejoins(deployment, data):
    """Partial participation (§15.2) in a real deployment: SIGKILL SuperNode 2 in round k, restart it
    (a new node id, the same view and node-local state) in round k + 3; the run goes on with the
    quorum, finishes, records who took part in each round, and equals the in-process run with the
    same participation."""
    from fedsonmf.federation import checkpoint as ckpt
    from fedsonmf.protocol.participation import Participation

    out = deployment.run_dir / "rejoin"
    k, rounds, timeout = 2, 8, 30.0  # a cold ClientApp start on a loaded 2-core machine can take > 8 s
    # node 0 holds round k until node 2 is killed, and round k + 2 until node 2 is back: the kill and
    # the restart land in those rounds however fast the rounds are
    killed, back = out.parent / "rejoin-killed", out.parent / "rejoin-back"
    outcome = {}
    rc = _config("rejoin", **{"num-rounds": rounds, "round-timeout": timeout, "min-clients": 2.0,
                              "rejoin": "refresh", "fault": f"wait:0:{k}:{killed},wait:0:{k + 2}:{back}"})

    app = write_app_dir(deployment.run_dir / "app-fault", client_source=FAULT_CLIENT, extra_config={"fault": ""})

    def go():
        outcome["o"] = deployment.run(rc, out_dir=out, app_dir=app)

    def completed():
        try:
            return ckpt.load_server_checkpoint(out / "checkpoint").completed_rounds
        except Exception:
            return 0

    def connections():  # lines the node loop writes once its connection to the SuperLink is up
        log = deployment.node_dir(2) / "gate" / "gate.log"
        return log.read_text().count(" connected to ") if log.exists() else 0

    th = threading.Thread(target=go)
    th.start()
    wait_until(lambda: completed() >= k - 1, f"round {k - 1}", progress=status_progress(out), alive=th.is_alive)
    before = connections()
    deployment.kill_node(2, signal.SIGKILL)  # during round k
    killed.touch()
    wait_until(lambda: completed() >= k + 1, f"round {k + 1}", progress=status_progress(out), alive=th.is_alive)
    assert completed() >= k + 1, "rounds k..k+1 never completed without the killed node"
    deployment.start_node(2)  # in round k + 2, which node 0 holds until the node is back
    wait_until(lambda: connections() > before, "node 2's new connection", alive=th.is_alive)
    back.touch()
    join(th, progress=status_progress(out))
    st = outcome["o"].status
    assert st["status"] == "completed", st
    res = load_result(out)
    parts = [r["participants"] for r in res.history.rows]
    assert res.n_rounds == rounds and [r["round"] for r in res.history.rows] == list(range(1, rounds + 1))
    assert parts[: k - 1] == [[0, 1, 2]] * (k - 1)
    assert parts[k] == parts[k + 1] == [0, 1]  # rounds k+1, k+2 without it (round k: killed mid-round)
    assert parts[-1] == [0, 1, 2]  # it took part again
    assert [r["n_participants"] for r in res.history.rows] == [len(p) for p in parts]
    dropped = res.extra["flower"]["dropped"]
    assert {d["client"] for d in dropped} == {2}
    with threadpool_limits(1):
        ref = run_inprocess(check_views(data, R), CFG, max_rounds=rounds, seed=SEED,
                            participation=Participation(min_clients=2, rejoin="refresh"),
                            available=lambda s: parts[s - 1])
    assert np.array_equal(res.V, ref.V)


def test_a_launcher_ended_by_sigterm_stops_its_superlink_supernodes_and_executors(tmp_path):
    """The daemons lead their own sessions (a terminal's Ctrl-C reaches only the launcher), so a
    launcher ended by TERM used to leave them running; now TERM raises SystemExit in the launcher and
    its deployment stops every process group it started before the launcher exits."""
    import subprocess
    import sys

    views = write_views(make_synthetic(n_clients=2, n_samples=30, n_features=8, rank=3, random_state=0).views,
                        tmp_path / "views")
    pids = tmp_path / "pids.json"
    script = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from fedsonmf.federation.flower.deployment import LoopbackDeployment\n"
        f"with LoopbackDeployment(Path({str(tmp_path / 'run')!r}), {[str(v) for v in views]!r}) as dep:\n"
        "    procs = list(dep.nodes.values()) + [dep.superlink] + list(dep.executors.values())\n"
        f"    Path({str(pids)!r}).write_text(json.dumps([p.pid for p in procs]))\n"
        "    time.sleep(3600)\n"
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        wait_until(lambda: pids.is_file() or launcher.poll() is not None, "the deployment started",
                   alive=lambda: launcher.poll() is None)
        assert launcher.poll() is None, "the launcher ended before its deployment started"
        started = json.loads(pids.read_text())
        assert len(started) >= 3 and all(_alive(p) for p in started)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=STALL) == 128 + signal.SIGTERM
        wait_until(lambda: not any(_alive(p) for p in started), "every daemon of the deployment stopped")
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in json.loads(pids.read_text()) if pids.is_file() else []:  # a failure leaves no daemon behind
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, reaped by nobody here, counts as stopped)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
