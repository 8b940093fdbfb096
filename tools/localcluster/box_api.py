"""A client of a local cluster's Compute Engine API (gce_control.py), reached as a GCP client
reaches compute.googleapis.com: through the box's proxy, trusting its CA, with tokens from its
OAuth2 endpoint for the service-account key it wrote. For the tests and the benchmarks, which
act behind the collection's back (stop a VM, widen or delete a rule) and read what the API
holds. Box(state["gce"]); an answer other than 200, or an operation that fails or outlasts its
deadline, raises ClusterError."""

from __future__ import annotations

import time

import google.auth.transport.requests
import google.oauth2.service_account
import requests

from .util import ClusterError

SCOPES = ["https://www.googleapis.com/auth/compute"]
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

    # -- instances ------------------------------------------------------------------------------

    def act(self, name: str, verb: str, body: dict | None = None) -> dict:
        """POST .../instances/NAME/VERB (stop, start, reset, setLabels) and wait for it."""
        return self.done(self.call("POST", f"{self.zone_url}/instances/{name}/{verb}", json=body))

    def instance(self, name: str) -> dict:
        return self.call("GET", f"{self.zone_url}/instances/{name}")

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
