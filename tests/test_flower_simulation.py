"""Flower's simulation engine: the shipped app with 100 simulated clients on one machine,
and the node-config rule that gives a simulated node its view (nodeconfig).

The 100-client run is marked ``deploy`` (a simulation SuperLink, Ray, ≈20-40 s); the
node-config tests are fast and call the real ClientApp object in this process.
"""

import json
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Context, MessageType, RecordDict  # noqa: E402
from flwr.app import Message as FlwrMessage  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from fedsonmf._validation import check_views  # noqa: E402
from fedsonmf.datasets import make_synthetic  # noqa: E402
from fedsonmf.exceptions import InputError  # noqa: E402
from fedsonmf.federation.flower import codec, nodeconfig, write_views  # noqa: E402
from fedsonmf.federation.flower.audit import audit_wire  # noqa: E402
from fedsonmf.federation.flower.client_app import make_client_app, state_dir_of  # noqa: E402
from fedsonmf.federation.inprocess import run_inprocess  # noqa: E402
from fedsonmf.protocol.config import FedConfig  # noqa: E402


@pytest.fixture
def task_identity():
    """Outside a Flower runtime, Message(...) needs the task identity set (internal API)."""
    old = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id = TaskIdentity.run_id = TaskIdentity.node_id = 1
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = old


def _ctx(node_config, run_config):
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config=run_config)


def _hello(app, ctx):
    msg = FlwrMessage(RecordDict({codec.META: ConfigRecord({"kind": "hello", "round": 0, "client": -1,
                                                            "job-id": "j"})}),
                      dst_node_id=7, message_type=MessageType.QUERY)
    msg.metadata.__dict__["_message_id"] = "h"
    return app(message=msg, context=ctx).content[codec.META]


@pytest.fixture
def two_folders(tmp_path):
    """An organisation's own view (d=8) and a sim-data-dir holding other views (d=5)."""
    rng = np.random.default_rng(0)
    own = write_views([rng.random((30, 8))], tmp_path / "org")[0]
    sim = tmp_path / "sim"
    write_views([rng.random((30, 5)), rng.random((30, 5))], sim)
    return own, sim


# ----------------------------------------------------------------------------- the node-config rule


def test_deployment_node_with_data_path_ignores_sim_data_dir(tmp_path, two_folders, task_identity):
    own, sim = two_folders
    nc = {"partition-id": 0, "num-partitions": 2, "data-path": str(own), "state-dir": str(tmp_path / "st")}
    ctx = _ctx(nc, {nodeconfig.SIM_DATA_DIR: str(sim)})
    info = _hello(make_client_app(), ctx)
    assert (info["d"], info["n"]) == (8, 30)  # its own view, not sim/view0.npy (d=5)
    assert state_dir_of(ctx, "j") == tmp_path / "st" / "j"
    # even inside the simulation engine, a node config with data-path decides
    assert nodeconfig.data_path(ctx, simulation=True) == own
    nc_no_state = {k: v for k, v in nc.items() if k != "state-dir"}
    assert nodeconfig.state_base(_ctx(nc_no_state, ctx.run_config), simulation=True) == own.parent / ".fedsonmf-state"
    assert not (sim / ".fedsonmf-state").exists()


def test_node_without_data_path_outside_simulation_refuses_sim_data_dir(two_folders, task_identity):
    _, sim = two_folders
    ctx = _ctx({"partition-id": 1, "num-partitions": 2}, {nodeconfig.SIM_DATA_DIR: str(sim)})
    assert not nodeconfig.in_simulation()  # this test process is no Ray worker
    with pytest.raises(ValueError, match="honoured only by the simulated nodes"):
        nodeconfig.data_path(ctx)
    with pytest.raises(ValueError, match="honoured only by the simulated nodes"):
        state_dir_of(ctx, "j")
    with pytest.raises(Exception, match="honoured only by the simulated nodes"):
        _hello(make_client_app(), ctx)
    with pytest.raises(ValueError, match="no 'data-path'"):
        nodeconfig.data_path(_ctx({"partition-id": 1}, {}), simulation=True)


def test_simulated_node_reads_its_partitions_view(two_folders):
    _, sim = two_folders
    ctx = _ctx({"partition-id": 1, "num-partitions": 2}, {nodeconfig.SIM_DATA_DIR: str(sim)})
    assert nodeconfig.data_path(ctx, simulation=True) == sim / "view1.npy"
    assert nodeconfig.state_base(ctx, simulation=True) == sim / ".fedsonmf-state" / "p1"
    np.save(sim / "view1.mask.npy", np.ones(30, bool))  # masks beside the views are not views
    assert nodeconfig.data_path(ctx, simulation=True) == sim / "view1.npy"
    with pytest.raises(FileNotFoundError, match="no view file view2.<ext> for partition 2"):
        nodeconfig.data_path(_ctx({"partition-id": 2}, ctx.run_config), simulation=True)
    np.save(sim / "view1.other.npy", np.ones(3))
    (sim / "view1.npz").write_bytes(b"")
    with pytest.raises(ValueError, match=r"partition 1 has several view files .*view1.npy.*view1.npz"):
        nodeconfig.data_path(ctx, simulation=True)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        nodeconfig.data_path(_ctx({"partition-id": 0}, {nodeconfig.SIM_DATA_DIR: str(sim / "nope")}),
                             simulation=True)


def test_run_simulation_checks_the_views_before_starting_anything(tmp_path):
    from fedsonmf.federation.flower import run_simulation

    cfg = FedConfig(n_components=3)
    with pytest.raises(InputError, match="holds no view file"):
        run_simulation(tmp_path, cfg, run_dir=tmp_path / "run")
    write_views([np.random.default_rng(1).random((20, 2))], tmp_path / "v")
    with pytest.raises(InputError, match="larger than view 0's number of features"):
        run_simulation(tmp_path / "v", cfg, run_dir=tmp_path / "run")
    assert not (tmp_path / "run" / "flwr-home").exists()  # no process was started


# ----------------------------------------------------------------------------- 100 simulated clients


def _our_processes(flwr_home: Path, ray_tmp: str) -> list[str]:
    """Live processes whose environment names this run's FLWR_HOME or whose command line its Ray folder."""
    marker = f"FLWR_HOME={flwr_home}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (entry / "cmdline").read_bytes()
            if marker in (entry / "environ").read_bytes().split(b"\0") or ray_tmp.encode() in cmd:
                found.append(f"{entry.name}: {cmd[:80]!r}")
        except OSError:
            continue
    return found


@pytest.mark.slow
@pytest.mark.deploy
def test_100_simulated_clients_equal_the_inprocess_engine(tmp_path):
    pytest.importorskip("ray")
    from fedsonmf.federation.flower import run_simulation

    m, rounds, seed = 100, 3, 11
    data = make_synthetic(n_clients=m, n_samples=60, n_features=8, rank=3, heterogeneity=0.6, random_state=4)
    cfg = FedConfig(n_components=3)
    run_dir = tmp_path / "sim"
    # generous limits: on a loaded 2-core machine the handshake (Ray start + 100 hellos) took 90 s
    res = run_simulation(data.views, cfg, run_dir=run_dir, max_rounds=rounds, seed=seed, record_wire=True,
                         node_timeout=900.0, round_timeout=900.0)
    # the app runs with secure aggregation (its default); the in-process secure run decodes the same sums
    cfg = cfg.replace(secure_aggregation=True)
    with threadpool_limits(1):  # the simulation pins BLAS to one thread in every process
        ref = run_inprocess(check_views(data.views, 3), cfg, "fedsonmf", max_rounds=rounds, seed=seed)
    assert np.array_equal(res.V, ref.V)  # bit-identical
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(res.history.rows) == strip(ref.history.to_records())
    info = res.extra["flower"]
    assert info["engine"] == "simulation" and info["num_supernodes"] == m and len(set(info["node_ids"])) == m
    # each partition read its own view and kept its state in its own node-local folder
    state = run_dir / "views" / ".fedsonmf-state"
    for p in range(m):
        facts = json.loads((state / f"p{p}" / f"view-facts-{p}.json").read_text())
        assert facts["key"][0] == str((run_dir / "views" / f"view{p}.npy").resolve())
        assert (state / f"p{p}" / info["job_id"] / f"client-{p}-r{rounds}.npz").is_file()
    # what crossed Flower's wire is what a deployment sends, nothing of a view's feature dimension
    rows = [json.loads(line) for line in (run_dir / "server" / "wire.jsonl").read_text().splitlines()]
    summary = audit_wire(rows, "fedsonmf", cfg, 60)
    hellos = sum(summary.get(k, {"messages": 0})["messages"] for k in ("up hello", "up hello+setup"))
    assert summary["up round"]["messages"] == m * rounds and hellos == m
    # every process of the simulation (SuperLink, flwr-simulation, Ray) is gone
    assert _our_processes(run_dir / "flwr-home", info["ray_tmp"]) == []
    assert not Path(info["ray_tmp"]).exists()
    secs = [r["seconds"] for r in res.history.rows]
    print(f"\n100 simulated clients: start-up {info['startup_seconds']:.1f} s "
          f"(SuperLink {info['superlink_seconds']:.1f} s,"
          f" ServerApp up at {info['server_start_seconds']:.1f} s, handshake {info['handshake_seconds']:.1f} s), "
          f"{np.mean(secs):.2f} s/round, wall {info['wall_seconds']:.1f} s, pid {os.getpid()}")


def test_simulate_command_reports_bad_views_before_starting(tmp_path, capsys):
    from fedsonmf.cli.app import main

    write_views([np.ones((10, 4)), np.ones((10, 4))], tmp_path / "v")
    (tmp_path / "v" / "view1.npy").unlink()  # view0 only: one simulated client
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["flower", "simulate", str(tmp_path / "empty"), "--out", str(tmp_path / "run"), "--rank", "2"])
    assert exc.value.code == 2 and "holds no view file view0.<ext>" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["flower", "simulate", str(tmp_path / "v"), "--out", str(tmp_path / "run"), "--rank", "5"])
    assert exc.value.code == 2 and "larger than view 0's number of features (4" in capsys.readouterr().err
    np.save(tmp_path / "v" / "view2.npy", np.ones((10, 4)))
    with pytest.raises(SystemExit) as exc:
        main(["flower", "simulate", str(tmp_path / "v"), "--out", str(tmp_path / "run"), "--rank", "2"])
    assert exc.value.code == 2 and "none for partitions [1]" in capsys.readouterr().err
    assert not (tmp_path / "run" / "flwr-home").exists()


@pytest.mark.slow
@pytest.mark.deploy
def test_simulation_failure_names_the_view_and_leaves_no_process(tmp_path):
    """A view its node cannot use (NaN: the shapes pass the driver's pre-check) fails the run at the
    handshake with the view named, and every process of the simulation is stopped all the same."""
    pytest.importorskip("ray")
    from fedsonmf.exceptions import FlowerRunError
    from fedsonmf.federation.flower import run_simulation

    rng = np.random.default_rng(2)
    bad = rng.random((20, 6))
    bad[3, 2] = np.nan
    with pytest.raises(FlowerRunError, match=r"view 1") as exc:
        run_simulation([rng.random((20, 6)), bad], FedConfig(n_components=2), run_dir=tmp_path / "sim",
                       max_rounds=2, node_timeout=900.0, round_timeout=900.0)
    assert exc.value.status["status"] == "failed" and "view 1" in exc.value.status["error"]
    assert "NaN" in exc.value.status["error"]
    assert _our_processes(tmp_path / "sim" / "flwr-home", "fedsonmf-ray-never-matches") == []


@pytest.mark.slow
@pytest.mark.deploy
def test_an_outsider_on_the_simulation_port_runs_nothing(tmp_path):
    """A stock simulation SuperLink runs whatever app anyone on the host submits, as the user who
    started it, with the views' folder in reach. Now the stock CLI without the SuperLink's own CA
    certificate (in a 0700 folder) cannot reach it at all (run, ls, log, stop); with it, behind the
    gate, a foreign app and our own app without the run's signature are both refused, and neither
    ran (no marker)."""
    pytest.importorskip("ray")
    from fedsonmf.federation.flower import write_app_dir
    from fedsonmf.federation.flower.simulation import SimulationSuperLink
    from test_flower_gate import Outsider, write_evil_app

    markers = tmp_path / "markers"
    markers.mkdir()
    sim = "num-supernodes=2 client-resources-num-cpus=1"
    with SimulationSuperLink(tmp_path / "sim") as link:
        assert (link.gate_dir.stat().st_mode & 0o777) == 0o700 and Path(link.tls[0]).parent.parent == link.gate_dir
        eve = Outsider(tmp_path / "eve", link.port)  # no CA certificate: plain HTTP or an unknown issuer
        for args in (("ls", "x"), ("log", "1", "x"), ("stop", "1", "x"),
                     ("run", str(write_evil_app(tmp_path / "evil0", markers)), "x", "--federation-config", sim)):
            p = eve.flwr(*args, check=False)
            assert p.returncode != 0 and "unavailable" in (p.stdout + p.stderr).lower(), (args, p.stdout, p.stderr)
        mallory = Outsider(tmp_path / "mallory", link.port, ca=link.tls[0])  # one who got hold of the CA certificate
        evil = mallory.submit(write_evil_app(tmp_path / "evil", markers), "--federation-config", sim)
        copy = write_app_dir(tmp_path / "copy")  # byte-identical to the app a run of ours submits
        link.authorise(copy, {"out-dir": str(tmp_path / "sim" / "server")})  # ... and now pinned
        unsigned = mallory.submit(copy, "--federation-config", sim, "--run-config",
                                  f'num-clients=2 out-dir="{markers}" sim-data-dir="{tmp_path / "sim"}"')
        expected = {evil: "is not the fedsonmf app pinned", unsigned: "carries no coordinator authorisation"}
        for run_id, why in expected.items():
            info = mallory.wait_finished(run_id)
            assert info["status"] == "finished:failed" and "refused by the fedsonmf gate" in info["status-details"]
            assert why in info["status-details"], info
        assert not link.simulation_alive()
    assert list(markers.iterdir()) == []  # neither app's ServerApp nor any ClientApp ran
    log = (tmp_path / "sim" / "logs" / "gate-simulation.log").read_text()
    assert f"run {evil}: refused" in log and f"run {unsigned}: refused" in log
    assert _our_processes(tmp_path / "sim" / "flwr-home", "fedsonmf-ray-never-matches") == []
