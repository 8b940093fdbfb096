"""A client of a local cluster's Compute Engine API (gce_control.py), reached as a GCP client
reaches compute.googleapis.com: through the box's proxy, trusting its CA, with tokens from its
OAuth2 endpoint for the service-account key it wrote. For the tests and the benchmarks, which
act behind the collection's back (stop a VM, widen or delete a rule) and read what the API
holds. Box(state["gce"]); an answer other than 200, or an operation that fails or outlasts its
deadline, raises ClusterError.

Storage(state["gcs"]) does the same for the box's Cloud Storage (gcs_service.py): objects under
a prefix with their size and checksums, an object's bytes (google-cloud-storage, as a client on
GCP), and the control API (buckets, denials, the request log)."""

from __future__ import annotations

import time

import google.auth.transport.requests
import google.cloud.storage
import google.oauth2.service_account
import requests

from .util import ClusterError

SCOPES = ["https://www.googleapis.com/auth/compute"]
STORAGE_SCOPES = ["https://www.googleapis.com/auth/devstorage.full_control"]
API = "https://compute.googleapis.com/compute/v1/projects"
# Fields the API sets on a rule; an insert leaves them out.
OUTPUT_ONLY = ("id", "kind", "selfLink", "creationTimestamp")


class Box:
    def __init__(self, gce: dict):
        credentials = google.oauth2.service_account.Credentials.from_service_account_file(
            gce["service_account_file"], scopes=SCOPES
        )
        self.session = google.auth.transport.requests.AuthorizedSession(
            credentials, auth_request=google.auth.transport.requests.Request(self._plain(gce))
        )
        self._configure(self.session, gce)
        self.project_url = f"{API}/{gce['project']}"
        self.zone = gce["zone"]
        self.control_url = gce.get("control")
        self.zone_url = f"{self.project_url}/zones/{gce['zone']}"
        self.rules_url = f"{self.project_url}/global/firewalls"

    @staticmethod
    def _configure(session: requests.Session, gce: dict) -> requests.Session:
        session.trust_env = False
        session.proxies = {"https": gce["proxy"]}
        session.verify = gce["ca"]
        return session

    def _plain(self, gce: dict) -> requests.Session:
        return self._configure(requests.Session(), gce)

    def close(self) -> None:
        self.session.close()

    def call(self, method: str, url: str, **kwargs) -> dict:
        answer = self.session.request(method, url, timeout=30, **kwargs)
        if answer.status_code != 200:
            raise ClusterError(f"{method} {url}: {answer.status_code} {answer.text}")
        return answer.json()

    def done(self, operation: dict, deadline_s: float = 120) -> dict:
        """Poll an operation (zonal or global, from its selfLink) until DONE; it must not fail."""
        started = time.monotonic()
        while operation["status"] != "DONE":
            if time.monotonic() - started > deadline_s:
                raise ClusterError(f"operation not done after {deadline_s} s: {operation}")
            time.sleep(0.5)
            operation = self.call("GET", operation["selfLink"])
        if "error" in operation:
            raise ClusterError(f"operation failed: {operation['error']}")
        return operation

    def fake(self, path: str, body: dict) -> dict:
        """POST to the fake's control API (config, preempt): what no GCP client can do."""
        with requests.Session() as plain:
            plain.trust_env = False  # loopback, never a proxy
            answer = plain.post(f"{self.control_url}/{path}", json=body, timeout=30)
        if answer.status_code != 200:
            raise ClusterError(f"POST {path}: {answer.status_code} {answer.text}")
        return answer.json()

    # -- instances ------------------------------------------------------------------------------

    def act(self, name: str, verb: str, body: dict | None = None) -> dict:
        """POST .../instances/NAME/VERB (stop, start, reset, setLabels) and wait for it."""
        return self.done(self.call("POST", f"{self.zone_url}/instances/{name}/{verb}", json=body))

    def instance(self, name: str) -> dict:
        return self.call("GET", f"{self.zone_url}/instances/{name}")

    def instances(self) -> dict[str, str]:
        """Every VM of the project, in any zone (aggregatedList): {name: zone}."""
        listed = self.call("GET", f"{self.project_url}/aggregated/instances")
        return {
            i["name"]: i["zone"].rsplit("/", 1)[-1]
            for scope in listed.get("items", {}).values()
            for i in scope.get("instances", [])
        }

    # -- firewall rules -------------------------------------------------------------------------

    def rules(self) -> dict[str, dict]:
        """The project's rules by name."""
        listed = self.call("GET", self.rules_url)
        return {rule["name"]: rule for rule in listed.get("items", [])}

    def rule(self, name: str) -> dict | None:
        answer = self.session.get(f"{self.rules_url}/{name}", timeout=30)
        if answer.status_code == 404:
            return None
        if answer.status_code != 200:
            raise ClusterError(f"GET {self.rules_url}/{name}: {answer.status_code} {answer.text}")
        return answer.json()

    def insert_rule(self, rule: dict) -> None:
        body = {k: v for k, v in rule.items() if k not in OUTPUT_ONLY}
        self.done(self.call("POST", self.rules_url, json=body))

    def patch_rule(self, name: str, changes: dict) -> None:
        """A JSON merge patch of the rule (the API wants its name in the body too)."""
        body = {"name": name, **changes}
        self.done(self.call("PATCH", f"{self.rules_url}/{name}", json=body))

    def delete_rule(self, name: str) -> None:
        self.done(self.call("DELETE", f"{self.rules_url}/{name}"))


class Storage:
    """The box's Cloud Storage, through the box's proxy with the service-account key's tokens."""

    def __init__(self, gcs: dict):
        credentials = google.oauth2.service_account.Credentials.from_service_account_file(
            gcs["service_account_file"], scopes=STORAGE_SCOPES
        )
        gce = {"proxy": gcs["env"]["HTTPS_PROXY"], "ca": gcs["ca"]}
        session = google.auth.transport.requests.AuthorizedSession(
            credentials,
            auth_request=google.auth.transport.requests.Request(
                Box._configure(requests.Session(), gce)
            ),
        )
        Box._configure(session, gce)
        self.client = google.cloud.storage.Client(
            project=gcs["project"], credentials=credentials, _http=session
        )
        self.bucket = gcs["bucket"]
        self.control_url = gcs["control"]
        self.control_session = requests.Session()
        self.control_session.trust_env = False  # loopback, never a proxy

    def close(self) -> None:
        self.client.close()
        self.control_session.close()

    def objects(self, prefix: str = "", bucket: str | None = None) -> dict[str, dict]:
        """name -> {"size" (int), "crc32c", "md5"} (base64, as GCS gives them) under a prefix."""
        return {
            blob.name: {"size": blob.size, "crc32c": blob.crc32c, "md5": blob.md5_hash}
            for blob in self.client.list_blobs(bucket or self.bucket, prefix=prefix)
        }

    def complete_checkpoints(self, prefix: str) -> list[int]:
        """The steps of the checkpoints under `prefix` (a job's checkpoints/ folder) that the
        nodes' sync marked complete (checkpoint-N/COMPLETE.json), ascending."""
        return sorted(
            int(name.split("checkpoint-")[1].split("/")[0])
            for name in self.objects(prefix)
            if name.endswith("/COMPLETE.json")
        )

    def read(self, name: str, bucket: str | None = None) -> bytes:
        """An object's bytes (checked against its crc32c by the client)."""
        return self.client.bucket(bucket or self.bucket).blob(name).download_as_bytes()

    # -- the control API ------------------------------------------------------------------------

    def control(self, method: str, path: str, body: dict | None = None):
        answer = self.control_session.request(
            method, f"{self.control_url}/{path}", json=body, timeout=30
        )
        if answer.status_code != 200:
            raise ClusterError(f"{method} {path}: {answer.status_code} {answer.text}")
        return answer.json()

    def create_bucket(self, name: str) -> dict:
        return self.control("POST", "buckets", {"name": name})

    def delete_bucket(self, name: str) -> None:
        self.control("DELETE", f"buckets/{name}")

    def deny(self, identity: str, permission: str, bucket: str | None = None) -> None:
        """Deny `identity` ("*": anyone) `permission` (storage.objects.create...) on a bucket
        (None: the cluster's; "*": every one) until allow_all."""
        body = {"identity": identity, "permission": permission, "bucket": bucket or self.bucket}
        self.control("POST", "deny", body)

    def allow_all(self) -> None:
        self.control("DELETE", "deny")

    def requests(self) -> list[dict]:
        """The log since the last clear_requests (gcs_api.py's entries)."""
        return self.control("GET", "requests")

    def history(self) -> list[dict]:
        return self.control("GET", "history")

    def clear_requests(self) -> None:
        self.control("DELETE", "requests")
