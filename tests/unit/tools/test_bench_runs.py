"""The benchmark's cuts of its cluster: the GCP-path inventory with only its group narrowed."""

import json

import yaml
from bench import runs
from bench.results import Results
from localcluster import cluster


def test_a_cut_narrows_the_group_and_keeps_the_rest(tmp_path):
    source = tmp_path / "bench.gcp"
    source.mkdir()
    gce = {"project": "hostnet-box", "zone": "us-central1-a", "service_account_file": "/s/sa.json"}
    (source / "gcp_compute.yml").write_text(yaml.safe_dump(cluster.gcp_compute_config(gce)))
    (source / "box.yml").write_text("llamafactory:\n  vars: {ansible_user: gce}\n")
    bench = runs.BenchCluster(8, tmp_path / "logs")
    bench.state = {"gcp_inventory": str(source)}

    cut = bench.inventory(2)
    assert cut == tmp_path / "bench-n2.gcp"
    config = yaml.safe_load((cut / "gcp_compute.yml").read_text())
    whole = cluster.gcp_compute_config(gce)
    assert config["groups"]["llamafactory"] == (
        f"({whole['groups']['llamafactory']}) and (labels['llamafactory-rank'] | int) < 2"
    )
    assert {k: v for k, v in config.items() if k != "groups"} == {
        k: v for k, v in whole.items() if k != "groups"
    }
    assert (cut / "box.yml").read_text() == (source / "box.yml").read_text()
    assert (cut / "group_vars").readlink().as_posix() == "../group_vars"

    ranked = yaml.safe_load(
        (bench.inventory(2, duplicate_rank=True) / "gcp_compute.yml").read_text()
    )
    assert ranked["compose"]["llamafactory_node_rank"] == "0"
    assert bench.inventory(2) == cut  # made again in place


def test_the_failure_runs_are_interleaved_and_the_container_kill_counts_in_both_tables(
    tmp_path, monkeypatch
):
    order = []

    def restart_cost(_bench, case, rep):
        order.append((case, rep))
        return {"seconds": {"rank killed": 70.0, "VM stopped": 80.0, "worker killed": 35.0}[case]}

    monkeypatch.setattr(runs, "restart_cost", restart_cost)
    monkeypatch.setattr(runs, "peer_lost", lambda _bench, bound, _rep: {"seconds": bound + 8.0})
    monkeypatch.setattr(runs, "say", lambda _message: None)
    results = Results(tmp_path)
    runs.failures(None, results, reps=2)
    assert order == [
        ("rank killed", 1),
        ("VM stopped", 1),
        ("worker killed", 1),
        ("worker killed", 2),
        ("VM stopped", 2),
        ("rank killed", 2),
    ]
    summary = json.loads((tmp_path / "results.json").read_text())["summary"]
    assert summary["restart"]["after the first checkpoint"]["ratio"]["median"] == 80 / 70
    on_nodes = summary["restart-on-nodes"]["rank 1 after the first checkpoint"]
    assert on_nodes["ratio"]["median"] == 35 / 70 and on_nodes["worker killed"]["n"] == 2
    assert (
        "## 7. Restarted by the controller or by the agents"
        in (tmp_path / "results.md").read_text()
    )
    runs.failures(None, results, reps=2)  # everything measured: nothing runs again
    assert len(order) == 6
