"""A VM writes to the cluster's bucket as a GCE VM writes to Cloud Storage: google-cloud-storage
in a venv (pip installs it offline from the box's wheelhouse), storage.googleapis.com resolved
to the box, its CA in the VM's system trust store, the token from the VM's metadata server; the
controller reads the object back through the box's proxy with the service-account key."""

import base64
import json
import time

import google_crc32c
import pytest
import storage_contract
from conftest import VM
from localcluster import box_api, gce_metadata

pytestmark = pytest.mark.cluster  # brings up a local cluster

VENV = "/tmp/gcs-venv"  # noqa: S108 (in the VM)
SCRIPT = """
import json, sys
import google.auth.compute_engine
import google.cloud.storage

bucket_name, project, name, payload = sys.argv[1:]
credentials = google.auth.compute_engine.Credentials()
client = google.cloud.storage.Client(project=project, credentials=credentials)
blob = client.bucket(bucket_name).blob(name)
blob.upload_from_string(payload.encode(), if_generation_match=0)
listed = [b.name for b in client.list_blobs(bucket_name, prefix=name)]
print(json.dumps({"read": blob.download_as_bytes().decode(), "listed": listed}))
"""


def test_a_vm_writes_to_the_bucket_with_its_metadata_servers_token(test_cluster):
    _definition, state = test_cluster
    gcs, node = state["gcs"], state["nodes"][0]
    vm = VM(node)
    started = time.monotonic()
    resolved = vm.sh("getent hosts storage.googleapis.com").stdout.split()[0]
    assert resolved == gcs["vm_address"]
    vm.sh(f"test -d {VENV} || python3 -m venv {VENV}")
    vm.sh(f"{VENV}/bin/pip install -q google-cloud-storage", timeout=180)
    name = f"it/{node['name']}-{time.time_ns()}.txt"
    payload = f"written by {node['name']}"
    vm.sh(f"cat > /tmp/gcs_write.py <<'EOF'\n{SCRIPT}\nEOF")
    run = (
        f"REQUESTS_CA_BUNDLE={gcs['vm_ca_bundle']} {VENV}/bin/python /tmp/gcs_write.py "
        f"{gcs['bucket']} {gcs['project']} {name} '{payload}'"
    )
    answer = json.loads(vm.sh(run).stdout)
    assert answer == {"read": payload, "listed": [name]}

    storage = box_api.Storage(gcs)
    try:
        crc32c = base64.b64encode(google_crc32c.Checksum(payload.encode()).digest()).decode()
        assert storage.objects("it/")[name]["size"] == len(payload)
        assert storage.objects("it/")[name]["crc32c"] == crc32c
        assert storage.read(name) == payload.encode()
        history = storage.history()
    finally:
        storage.close()
    account = f"{gce_metadata.numeric_id(gcs['project'], 12)}-compute@developer.gserviceaccount.com"
    writes = [e for e in history if (e.get("body") or {}).get("name") == name]
    assert [(e["identity"], e["upload"], e["status"]) for e in writes] == [
        (account, "multipart", 200)
    ]
    assert storage_contract.validate_log(history) == []
    assert time.monotonic() - started < 60
