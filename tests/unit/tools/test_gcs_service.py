"""tools/localcluster/gcs_service.py: the box's Cloud Storage run as a cluster's service after the
fake Compute Engine API (started once, kept while it runs, stopped by its pid), the cluster's
bucket made, reached with box_api.Storage as a client on the controller reaches GCS."""

import json

import storage_contract
from localcluster import box_api, compute_service, gcs_service, spec


def test_cloud_storage_runs_as_the_clusters_service(tmp_path):
    definition = spec.load(name="unit", vms=[{"name": "vm0"}])
    state = {"name": "unit", "definition": spec.to_raw(definition), "nodes": []}
    (tmp_path / "state.json").write_text(json.dumps(state))
    compute_service.start(tmp_path)
    try:
        state = gcs_service.start(tmp_path)
        gcs = state["gcs"]
        assert json.loads((tmp_path / "state.json").read_text())["gcs"] == gcs
        assert "gce" in json.loads((tmp_path / "state.json").read_text())
        assert gcs["bucket"] == "hostnet-box-llamafactory"
        assert gcs["endpoint"] == "https://storage.googleapis.com"
        assert gcs["env"]["REQUESTS_CA_BUNDLE"] == gcs["ca"]
        assert gcs["api"].startswith("127.0.0.1:") and gcs["vm_address"] is None
        assert gcs_service.start(tmp_path)["gcs"]["pid"] == gcs["pid"]  # kept

        storage = box_api.Storage(gcs)
        try:
            blob = storage.client.bucket(gcs["bucket"]).blob("out/a.txt")
            blob.upload_from_string(b"hello")
            listed = storage.objects("out/")
            assert listed == {"out/a.txt": {"size": 5, "crc32c": "mnG7TA==", "md5": blob.md5_hash}}
            assert storage.read("out/a.txt") == b"hello"
            storage.create_bucket("hostnet-box-other")
            assert storage.objects(bucket="hostnet-box-other") == {}
            storage.deny("*", "storage.objects.list", "hostnet-box-other")
            assert [d[1] for d in storage.control("GET", "deny")] == ["storage.objects.list"]
            storage.allow_all()
            storage.delete_bucket("hostnet-box-other")
            log = storage.history()
            assert {e["identity"] for e in log} == {
                json.loads((tmp_path / "gce" / "service-account.json").read_text())["client_email"]
            }
            assert storage_contract.validate_log(log) == []
        finally:
            storage.close()
    finally:
        gcs_service.stop(tmp_path)
        compute_service.stop(tmp_path)
    assert not gcs_service._is_running(gcs["pid"])
    assert not (tmp_path / "gcs" / "client.json").exists()
    gcs_service.stop(tmp_path)  # nothing to stop: no error
