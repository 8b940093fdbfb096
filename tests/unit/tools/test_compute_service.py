"""tools/localcluster/compute_service.py: the fake Compute Engine API run as a cluster's service
(started once, kept while it runs, stopped by its pid), without Docker."""

import json

from localcluster import compute_service, spec


def test_the_fake_runs_as_the_clusters_service(tmp_path):
    definition = spec.load(name="unit", vms=[{"name": "vm0"}, {"name": "vm1"}])
    state = {"name": "unit", "definition": spec.to_raw(definition), "nodes": []}
    (tmp_path / "state.json").write_text(json.dumps(state))
    state = compute_service.start(tmp_path)
    try:
        gce = state["gce"]
        assert json.loads((tmp_path / "state.json").read_text())["gce"] == gce
        assert (gce["project"], gce["zone"]) == ("hostnet-box", "us-central1-a")
        assert gce["proxy"].startswith("http://127.0.0.1:")
        assert gce["env"]["REQUESTS_CA_BUNDLE"] == gce["ca"]
        account = json.loads((tmp_path / "gce" / "service-account.json").read_text())
        assert gce["service_account_file"] == str(tmp_path / "gce" / "service-account.json")
        assert account["project_id"] == "hostnet-box"
        assert compute_service._is_running(gce["pid"])
        assert compute_service.start(tmp_path)["gce"]["pid"] == gce["pid"]  # kept, not restarted
    finally:
        compute_service.stop(tmp_path)
    assert not compute_service._is_running(gce["pid"])
    assert not (tmp_path / "gce" / "client.json").exists()
    compute_service.stop(tmp_path)  # nothing to stop: no error
