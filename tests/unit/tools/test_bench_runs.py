"""The benchmark's cuts of its cluster: the GCP-path inventory with only its group narrowed."""

import yaml
from bench import runs
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
