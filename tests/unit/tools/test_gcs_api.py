"""The box's Cloud Storage (tools/localcluster/gcs_api.py): google-cloud-storage reaches it as it
reaches storage.googleapis.com (the box's proxy and CA in the environment, the service-account
key's tokens, or a metadata server's), and every exchange keeps the JSON API's published
contract (storage.v1.json)."""

import base64
import hashlib
import json
import os
import threading

import google.auth.credentials
import google.oauth2.service_account
import google_crc32c
import pytest
import requests
import storage_contract
from google.api_core import exceptions
from google.cloud import storage
from localcluster import compute_api, gce_metadata, gcs_api

BUCKET = "hlf-test-llamafactory"
API = "https://storage.googleapis.com/storage/v1"


class Box:
    def __init__(self, tmp_path):
        (tmp_path / "gce").mkdir()
        self.compute = compute_api.Server(tmp_path / "gce")
        self.info = self.compute.client_info()
        (tmp_path / "gce" / "client.json").write_text(json.dumps(self.info))
        self.key_file = tmp_path / "metadata-token.key"
        self.key_file.write_bytes(os.urandom(32).hex().encode())
        self.front = gcs_api.Front(
            tmp_path / "gcs", tmp_path / "gce", metadata_key=str(self.key_file), project="hlf-test"
        ).start()
        self.compute.compute.configure({"storage": self.front.client_info()["api"]})
        self.control = self.front.client_info()["control"]
        requests.post(f"{self.control}/buckets", json={"name": BUCKET}, timeout=10)
        self.thread = threading.Thread(
            target=self.compute.serve_forever, kwargs={"poll_interval": 0.05}
        )
        self.thread.start()
        self.account = tmp_path / "gce" / "service-account.json"
        self.email = json.loads(self.account.read_text())["client_email"]

    def client(self, credentials=None):
        credentials = (
            credentials
            or google.oauth2.service_account.Credentials.from_service_account_file(
                str(self.account), scopes=["https://www.googleapis.com/auth/devstorage.read_write"]
            )
        )
        return storage.Client(project="hlf-test", credentials=credentials)

    def session(self, token=None):
        """A plain session through the proxy (no google-auth), with a token when given."""
        session = requests.Session()
        session.trust_env = False
        session.proxies = {"https": self.info["proxy"]}
        session.verify = self.info["ca"]
        if token:
            session.headers["Authorization"] = f"Bearer {token}"
        return session

    def history(self):
        return requests.get(f"{self.control}/history", timeout=10).json()

    def close(self):
        self.compute.shutdown()
        self.compute.server_close()
        self.thread.join(5)
        self.front.stop()


@pytest.fixture
def box(tmp_path, monkeypatch):
    box = Box(tmp_path)
    # What `./dev cluster env` exports: all a client on the controller needs.
    for name, value in box.info["env"].items():
        monkeypatch.setenv(name, value)
    yield box
    history = box.history()
    box.close()
    assert history
    assert storage_contract.validate_log(history) == []


class MetadataToken(google.auth.credentials.Credentials):
    """Credentials with a token as a VM's metadata server hands it out."""

    def __init__(self, token):
        super().__init__()
        self.token = token

    def refresh(self, request):
        pass


def crc32c_b64(data):
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


def md5_b64(data):
    return base64.b64encode(hashlib.md5(data).digest()).decode()  # noqa: S324 (GCS's md5Hash)


def test_uploads_small_and_large_read_back_with_gcs_checksums(box):
    bucket = box.client().bucket(BUCKET)
    small, large = os.urandom(1000), os.urandom(9 * 1024 * 1024)  # multipart; resumable > 8 MiB
    bucket.blob("run1/small.bin").upload_from_string(small, if_generation_match=0)
    bucket.blob("run1/deep/large.bin").upload_from_string(large)
    uploads = {e["upload"] for e in box.history() if e.get("upload")}
    assert uploads == {"multipart", "resumable", "session"}

    listed = {b.name: b for b in box.client().list_blobs(BUCKET, prefix="run1/")}
    assert set(listed) == {"run1/small.bin", "run1/deep/large.bin"}
    for name, data in (("run1/small.bin", small), ("run1/deep/large.bin", large)):
        blob = listed[name]
        assert (blob.size, blob.crc32c, blob.md5_hash) == (
            len(data),
            crc32c_b64(data),
            md5_b64(data),
        )
        assert blob.media_link.startswith("https://storage.googleapis.com/download/storage/v1/")
    assert bucket.blob("run1/deep/large.bin").download_as_bytes() == large  # checked (crc32c)
    assert bucket.get_blob("run1/small.bin").download_as_bytes(start=10, end=19) == small[10:20]

    top = box.client().list_blobs(BUCKET, prefix="run1/", delimiter="/")
    assert [b.name for b in top] == ["run1/small.bin"]
    assert top.prefixes == {"run1/deep/"}

    bucket.blob("run1/small.bin").delete()
    with pytest.raises(exceptions.NotFound, match="No such object"):
        bucket.blob("run1/small.bin").download_as_bytes()
    assert bucket.get_blob("run1/small.bin") is None


def test_lists_page_by_max_results(box):
    bucket = box.client().bucket(BUCKET)
    for n in range(5):
        bucket.blob(f"p/{n}").upload_from_string(b"x")
    pages = box.client().list_blobs(BUCKET, prefix="p/", max_results=5, page_size=2).pages
    assert [[b.name for b in page] for page in pages] == [["p/0", "p/1"], ["p/2", "p/3"], ["p/4"]]


def test_if_generation_match_0_refuses_an_existing_object(box):
    blob = box.client().bucket(BUCKET).blob("once")
    blob.upload_from_string(b"first", if_generation_match=0)
    with pytest.raises(exceptions.PreconditionFailed, match="pre-conditions"):
        blob.upload_from_string(b"second", if_generation_match=0)
    with pytest.raises(exceptions.PreconditionFailed):
        blob.upload_from_string(os.urandom(9 * 1024 * 1024), if_generation_match=0)
    assert blob.download_as_bytes() == b"first"


def test_tokens_the_box_did_not_issue_get_401(box):
    url = f"{API}/b/{BUCKET}/o"
    anonymous = box.session().get(url, timeout=10)
    assert anonymous.status_code == 401
    error = anonymous.json()["error"]
    assert error["message"].startswith("Anonymous caller does not have storage.objects.list")
    assert error["errors"][0]["reason"] == "required"
    for token in ("ya29.made-up", "ya29.local-Zm9vIDk5OTk5OTk5OTk.abc", "x"):
        answer = box.session(token).get(url, timeout=10)
        assert answer.status_code == 401, token
        assert answer.json()["error"]["message"] == "Invalid Credentials"


def test_metadata_server_tokens_name_the_vms_account(box):
    account = "123-compute@developer.gserviceaccount.com"
    document = {"instance": {"serviceAccounts": {"default": {"email": account}}}}
    key = gce_metadata.read_key(str(box.key_file))
    answer = gce_metadata.token_answer(document, "default", {}, key)
    token = json.loads(answer.body)["access_token"]
    assert gce_metadata.token_identity(token, key) == account
    blob = box.client(MetadataToken(token)).bucket(BUCKET).blob("from-vm")
    blob.upload_from_string(b"vm")
    assert blob.download_as_bytes() == b"vm"
    assert {e["identity"] for e in box.history() if e.get("identity")} == {account}
    other = gce_metadata.make_token(account, b"another cluster's key")
    assert box.session(other).get(f"{API}/b/{BUCKET}", timeout=10).status_code == 401


def test_denied_permissions_answer_403_with_gcs_messages(box):
    deny = {"identity": box.email, "permission": "storage.objects.create", "bucket": BUCKET}
    requests.post(f"{box.control}/deny", json=deny, timeout=10).raise_for_status()
    bucket = box.client().bucket(BUCKET)
    with pytest.raises(exceptions.Forbidden) as raised:
        bucket.blob("no").upload_from_string(b"x")
    assert (
        f'"message": "{box.email} does not have storage.objects.create access to the Google '
        "Cloud Storage object. Permission 'storage.objects.create' denied on resource (or it may "
        'not exist)."'
    ) in raised.value.message
    deny = {"identity": "*", "permission": "storage.buckets.get", "bucket": BUCKET}
    requests.post(f"{box.control}/deny", json=deny, timeout=10).raise_for_status()
    with pytest.raises(exceptions.Forbidden, match=r"storage\.buckets\.get access to the Google"):
        box.client().get_bucket(BUCKET)
    requests.delete(f"{box.control}/deny", timeout=10).raise_for_status()
    assert box.client().get_bucket(BUCKET).name == BUCKET


def test_buckets_from_the_api_and_the_control_api(box):
    client = box.client()
    with pytest.raises(exceptions.NotFound, match="The specified bucket does not exist"):
        client.get_bucket("hlf-nope")
    created = client.create_bucket("hlf-made-by-client")
    assert created.self_link == "https://www.googleapis.com/storage/v1/b/hlf-made-by-client"
    with pytest.raises(exceptions.Conflict, match="You already own this bucket"):
        client.create_bucket("hlf-made-by-client")
    assert {b.name for b in client.list_buckets()} == {BUCKET, "hlf-made-by-client"}
    created.blob("x").upload_from_string(b"x")
    with pytest.raises(exceptions.Conflict, match="not empty"):
        created.delete()
    assert requests.delete(f"{box.control}/buckets/hlf-made-by-client", timeout=10).ok
    with pytest.raises(exceptions.NotFound):
        client.get_bucket("hlf-made-by-client")
    log = requests.get(f"{box.control}/requests", timeout=10).json()
    assert {e["method_id"] for e in log} >= {
        "storage.buckets.get",
        "storage.buckets.insert",
        "storage.buckets.list",
        "storage.buckets.delete",
        "storage.objects.insert",
    }


def test_the_contract_check_catches_deviations():
    entry = {
        "method": "GET",
        "host": "storage.googleapis.com",
        "path": f"/storage/v1/b/{BUCKET}/o",
        "query": {},
        "status": 200,
        "response": {"kind": "storage#objects", "items": []},
    }
    assert storage_contract.validate_log([entry]) != []  # GCS leaves an empty list out
    entry["status"], entry["response"] = 404, None
    assert storage_contract.validate_log([entry]) != []  # an error without Google's shape


def test_ranged_downloads_answer_206_with_gcs_headers(box):
    data = bytes(range(200))
    blob = box.client().bucket(BUCKET).blob("r/a b.bin")  # a name that needs encoding
    blob.upload_from_string(data)
    token = blob.client._credentials.token
    url = f"https://storage.googleapis.com/download/storage/v1/b/{BUCKET}/o/r%2Fa%20b.bin"
    session = box.session(token)
    for header, status, body in (
        ("bytes=10-19", 206, data[10:20]),
        ("bytes=190-", 206, data[190:]),
        ("bytes=-5", 206, data[-5:]),
        (None, 200, data),
    ):
        headers = {"Range": header} if header else {}
        answer = session.get(url, params={"alt": "media"}, headers=headers, timeout=10)
        assert (answer.status_code, answer.content) == (status, body), header
        assert answer.headers["X-Goog-Hash"] == f"crc32c={crc32c_b64(data)},md5={md5_b64(data)}"
        assert answer.headers["X-Goog-Stored-Content-Length"] == "200"
    answer = session.get(url, params={"alt": "media"}, headers={"Range": "bytes=300-"}, timeout=10)
    assert answer.status_code == 416
    assert answer.json()["error"]["code"] == 416
