"""A fake Compute Engine API: a stand-in for compute.googleapis.com, which neither the local
cluster nor the tests can reach - the local cluster's control plane (with gce_control.py's
backend, started by compute_service.py) and the tests' double.

It follows the Compute Engine v1 REST contract for what google.cloud.gcp_compute_firewall and
gcp_compute_firewall_info use (https://cloud.google.com/compute/docs/reference/rest/v1/firewalls
and .../globalOperations):

- firewalls: insert (POST .../projects/P/global/firewalls), get, patch (JSON merge patch: a list
  replaces the whole list, null removes a field), delete, and list (GET on the collection, with a
  `filter` of `name = "x"` terms joined by OR, or `name eq REGEX`; paged by maxResults and
  pageToken in order of name, as the aggregated list below);
- each write answers a compute#operation, PENDING, then RUNNING until its time is up, then DONE;
  the change lands when it is DONE (whether or not anyone polls), as on GCE;
  GET .../projects/P/global/operations/NAME polls it;
- errors in Google's JSON shape, {"error": {"code", "message", "errors": [{"message", "domain",
  "reason"}]}}: 400 required (a rule's name, which insert and patch both need), 400 invalid
  (bad name, CIDR, protocol, port, an immutable field patched; a query parameter the method
  does not take: "Invalid JSON payload received. Unknown name ..." with status
  INVALID_ARGUMENT, as the API's front end answers), 401 for a missing or wrong bearer token,
  403 "Required 'PERMISSION' permission for 'RESOURCE'", 404 "The resource
  'projects/P[/global/...]' was not found", 409 alreadyExists;
- the real defaults: network global/networks/default, priority 1000, direction INGRESS, and an
  INGRESS rule without sources gets sourceRanges ["0.0.0.0/0"]; links use
  https://www.googleapis.com/compute/v1/ (the module fetches an operation's targetLink there).

For the google.cloud.gcp_compute inventory plugin (.../rest/v1/instances/aggregatedList):

- GET .../projects/P/aggregated/instances (permission compute.instances.list): a
  compute#instanceAggregatedList whose "items" maps every zone ("zones/Z") to {"instances": [...]}
  or, when none matches on the page, {"warning": {"code": "NO_RESULTS_ON_PAGE", ...}};
  `filter` takes terms `FIELD = VALUE` or `FIELD != VALUE` (FIELD a dotted path such as
  labels.KEY, status or name; VALUE bare or "quoted"; a missing field is unequal), alone or each
  in parentheses joined by spaces (implicit AND, as the plugin joins its filters), AND, or OR;
  anything else is a 400 invalid;
  maxResults (at most 500) and pageToken page through the matching instances in order of zone
  and name, and nextPageToken is set while more remain;
- instances as the API returns them: kind, id, name, zone and selfLink as full links, status
  (RUNNING unless given), machineType, labels as given, networkInterfaces with network and
  subnetwork links, networkIP, and accessConfigs [{natIP, type ONE_TO_ONE_NAT, name External
  NAT}] only where given (a VM without an external IP has none).

Placement (.../rest/v1/resourcePolicies, .../regionOperations/get), kept in memory in both modes:
POST .../projects/P/regions/R/resourcePolicies (compute.resourcePolicies.create: name required
and checked, a groupPlacementPolicy {collocation COLLOCATED or UNSPECIFIED_COLLOCATION, vmCount
and availabilityDomainCount optional, positive}, no other kind; 409 alreadyExists, a pending
insert included) answers a regional operation, polled at GET .../regions/R/operations/NAME
(compute.regionOperations.get); GET .../resourcePolicies/NAME (compute.resourcePolicies.get)
answers the backend's placement policies merged with those inserted (compute#resourcePolicy,
status READY); DELETE (compute.resourcePolicies.delete) is a 400 resourceInUseByAnotherResource
("The resource_policy resource '...' is already being used by '.../instances/I'") while an
instance lists it in resourcePolicies, else a regional operation. 404 for another name or a
region without zones.

Creating instances (.../rest/v1/instances/insert, .../machineTypes/get, .../regions/get):

- POST .../projects/P/zones/Z/instances (compute.instances.create): name required and matching
  NAME_RE (400 required / invalid); machineType required, a URL or partial URL
  (zones/Z/machineTypes/T) of the instance's zone, else 400 invalid ("Must be a URL to a valid
  Compute resource...", "... in a different scope than the instance.", "Machine type with name
  'T' does not exist in zone 'Z'."); 409 alreadyExists (a pending insert included); labels
  checked as setLabels does; scheduling: provisioningModel STANDARD (default) or SPOT,
  instanceTerminationAction STOP or DELETE; SPOT gets preemptible true, instanceTerminationAction
  STOP, automaticRestart false and onHostMaintenance TERMINATE unless given (MIGRATE or a restart
  given: 400 "Scheduling must have preemptible be false when OnHostMaintenance isn't
  TERMINATE."), STANDARD automaticRestart true and MIGRATE; a GPU type (or guestAccelerators)
  not TERMINATE on host maintenance is refused as GCE does (400 "Instances with guest
  accelerators do not support live migration."); each resourcePolicies link must name a policy
  of the zone's region (404 else); each network must exist (404). The answer is a zonal
  operation (insert); the instance exists when it is DONE, as instances.get answers it: kind,
  id, creationTimestamp, status RUNNING, machineType and zone links, labels and labelFingerprint,
  metadata {kind, fingerprint, items}, scheduling with its defaults, networkInterfaces (nicN,
  network and subnetwork links, networkIP from the region's default subnet range, and a natIP
  for each ONE_TO_ONE_NAT access config), disks (a new disk named after the instance, as
  .../zones/Z/disks/NAME), serviceAccounts ("default" as the project's Compute Engine default
  account), resourcePolicies and guestAccelerators as full links.
  The zone's capacity (config "capacity": {ZONE: {TYPE: N}}: at most N not TERMINATED; a zone or
  type absent is unlimited) and the region's quotas are taken when the request arrives, counting
  the inserts still running (two parallel inserts cannot both take the last slot); beyond them the
  insert is accepted and its operation ends DONE with ZONE_RESOURCE_POOL_EXHAUSTED or
  QUOTA_EXCEEDED ("Quota 'M' exceeded.  Limit: L in region R."), nothing created. Starting a
  TERMINATED VM takes capacity and quotas again (the same errors; it stays TERMINATED); a stopped
  or deleted one frees them. Without a backend the instance is stored in memory; with one,
  backend.insert(zone, body) runs in the operation's thread (body: the request with scheduling's
  defaults, machineType as the type's short name, resourcePolicies as full links), and the
  instance is the backend's from then on.
- GET .../zones/Z/machineTypes/T: tools/localcluster/machine_types.py's table (guestCpus,
  memoryMb, accelerators); 404 for another type.
- GET .../regions/R: status UP, its zones, and quotas [{metric, limit, usage}] (numbers): the
  limits of machine_types.DEFAULT_LIMITS under config "quotas": {REGION: {METRIC: LIMIT}}, the
  usage of the region's instances not TERMINATED (vCPUs by family, GPUs - a spot VM's against
  the preemptible metric where its limit is above 0, GCE's rule - and external addresses). Only
  the metrics of compute.v1.json's Quota enum are listed; machine_types.UNLISTED ones
  (NVIDIA_H100_GPUS, NVIDIA_H200_GPUS, NVIDIA_B200_GPUS...) are enforced at insert all the same.
- The zones that exist: config "zones": [ZONE...] (default ZONES and the backend's zone), and
  any zone holding an instance; a region exists where one of its zones does.

Per zone (.../rest/v1/instances, .../zoneOperations), over the same instances:

- GET .../projects/P/zones/Z/instances (compute#instanceList; `filter` as above, every match on
  one page) and .../instances/NAME;
- GET .../projects/P/zones/Z/operations (compute.zoneOperations.list): a compute#operationList
  of the zone's operations, system events included, in order of insertTime (orderBy
  "creationTimestamp desc": newest first); `filter` as above (operationType =
  "compute.instances.preempted", (targetLink = "...") terms), paged as the aggregated list;
- POST .../instances/NAME/stop, /start, /reset, /setLabels
  (body {"labels", "labelFingerprint"}: a fingerprint other than the instance's current
  labelFingerprint is a 412 conditionNotMet; label keys and values checked as GCE does) and
  DELETE .../instances/NAME: each answers a zonal compute#operation, polled at GET
  .../projects/P/zones/Z/operations/NAME, the change landing when it is DONE. Without a backend
  the static instances change in memory: stop makes one TERMINATED without natIP, start RUNNING
  with it, reset needs a RUNNING one (400 resourceNotReady otherwise), delete removes it.
- With a backend (`--cluster STATE_DIR`: tools/localcluster/gce_control.py's ClusterBackend, the
  local cluster's VMs), the instances are the backend's, read live at every request, each in the
  zone its own "zone" link names (the backend's VMs may lie in several zones), and a write
  runs the backend's stop/start/reset/delete/set_labels(NAME[, labels]) in a thread of its own:
  the operation is RUNNING until that returns, then DONE (with "error" if it raised). A firewall
  write that lands calls backend.firewalls_landed(every rule of the project).

OAuth2 (https://developers.google.com/identity/protocols/oauth2/service-account): STATE/
service-account.json is a service-account key (type, project_id, private_key_id, private_key,
client_email, token_uri https://oauth2.googleapis.com/token) made for this fake. POST /token on
oauth2.googleapis.com with grant_type urn:ietf:params:oauth:grant-type:jwt-bearer and an RS256
JWT assertion signed by that key (iss = client_email, aud = token_uri, scope, iat and exp at most
an hour apart and not expired) answers {"access_token", "expires_in", "token_type": "Bearer"}; that
token is accepted as a bearer token until it expires, like the fixed one in client.json. Errors
as Google's: 400 {"error": "invalid_grant" | "unsupported_grant_type" | "invalid_scope",
"error_description"}.

It is checked against Google's published contract, not only against these notes:
tests/compute_contract.py loads the Compute Engine v1 discovery document that ships in
google-api-python-client (compute.v1.json), and its validate_log takes this fake's log (GET
history) and checks each exchange: the method and path are a method of the document, the path
parameters match their patterns, the query parameters are the method's or the standard ones, the
request body fits the method's request schema (a request that does not must have been refused),
and the answer fits its response schema (no field the document lacks, int64 as strings, enums)
or is Google's JSON error. tests/unit/tools/test_compute_api.py,
tests/unit/inventories/test_gcp_compute.py and the gcp_firewall molecule verifier assert that
every exchange of their runs passes.

It is reached the way the module allows: the module's URLs are fixed, so clients set
HTTPS_PROXY=http://127.0.0.1:PORT and REQUESTS_CA_BUNDLE=STATE/ca.pem. CONNECT to
compute.googleapis.com, www.googleapis.com or oauth2.googleapis.com:443 is answered here with TLS
from a test CA (trustme; STATE/ca.pem and its key ca-key.pem, kept across restarts) and served
from memory. CONNECT to storage.googleapis.com:443 is relayed, bytes both ways, to the box's Cloud
Storage front (gcs_api.py, which answers TLS with a certificate from the same CA) once
POST /_fake/config {"storage": "127.0.0.1:PORT"} named it; that is the one connection the fake
opens, to loopback. CONNECT to any other host, and plain proxy requests, are refused and logged.
It listens on 127.0.0.1 only.

Token introspection as Google's (https://oauth2.googleapis.com/tokeninfo?access_token=T, GET or
POST): for a token this fake issued (or the fixed one) {"azp", "aud" (the key's client_id),
"scope", "exp", "expires_in", "email" (the key's client_email), "email_verified",
"access_type"}, else 400 {"error": "invalid_token", "error_description": "Invalid Value"}. The
Cloud Storage front learns a caller's identity from it.

Plain requests to /_fake/... are the tests' control API: GET requests (the log: per request its
method, host, path, query, body, status, response and, for an operation, its status), DELETE
requests, GET history (every entry since the start, which neither reset nor DELETE clears),
POST reset, POST config ({"operation_seconds": N or null for never, "deny": [PERMISSION...],
"start_capacity_errors": N (the next N instances.start operations end DONE with the error
ZONE_RESOURCE_POOL_EXHAUSTED, the instance left TERMINATED, as a zone's stock-out does),
"capacity", "quotas" and "zones" (above),
"projects": {P: [NETWORK...]}, "page_size": N or null: at most N items a list's page, as the
real API may return fewer than maxResults, "storage": "HOST:PORT" or null: where CONNECT to
storage.googleapis.com is relayed}), GET firewalls, PUT firewalls/P/NAME (edit a rule behind
the API's back, as someone in the console would; kind, id, creationTimestamp, name and selfLink
are filled in where missing, as every stored rule has them; answers the rule), GET instances,
PUT instances/P/ZONE/NAME (body: the instance resource; the fake fills in what the API always
returns and answers the result), POST preempt {"project", "zone", "name"} (project and zone
default to the backend's): GCE preempting a Spot (or preemptible) VM - 404 for an unknown one,
400 for a standard or not RUNNING one - records a system operation in the zone's operations
(name systemevent-..., operationType compute.instances.preempted, user "system", status DONE,
statusMessage "Instance was preempted."), then stops the VM (TERMINATED, natIP released) or
deletes it, per its scheduling.instanceTerminationAction; with a backend, backend.preempt(NAME)
runs in a thread of its own (it stops or deletes the VM itself); answers {"operation": NAME} at
once.

Usage: python compute_api.py start|stop|serve --state DIR [--idle SECONDS] [--cluster STATE_DIR]
  start daemonizes, waits until it answers, and writes DIR/client.json (proxy, CA, token,
  service-account file, project, pid); stop ends it (by the pid it wrote, after checking that the
  pid is this fake); serve runs in the foreground. It also exits by itself after --idle seconds
  without a request (0: never).
"""

from __future__ import annotations

import argparse
import base64
import copy
import functools
import hashlib
import ipaddress
import itertools
import json
import os
import re
import secrets
import select
import signal
import socket
import ssl
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

try:  # run as a package (the local cluster) or as a script (its daemon)
    from . import machine_types
except ImportError:
    import machine_types

API_HOSTS = ("compute.googleapis.com", "www.googleapis.com")
OAUTH_HOST = "oauth2.googleapis.com"
# Relayed, not served here: to the box's Cloud Storage front (gcs_api.py), once configured.
STORAGE_HOST = "storage.googleapis.com"
TOKEN_URI = f"https://{OAUTH_HOST}/token"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_SECONDS = 3600
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
INSTANCE_ACTIONS = {  # URL verb -> (permission, operationType, backend method)
    "stop": ("compute.instances.stop", "stop", "stop"),
    "start": ("compute.instances.start", "start", "start"),
    "reset": ("compute.instances.reset", "reset", "reset"),
    "setLabels": ("compute.instances.setLabels", "setLabels", "set_labels"),
    "delete": ("compute.instances.delete", "delete", "delete"),
}
LINK = "https://www.googleapis.com/compute/v1/"
NAME_RE = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
PROTOCOLS = {"tcp", "udp", "icmp", "esp", "ah", "sctp", "ipip", "all"}
PORTED = {"tcp", "udp", "sctp"}
# Fields a patch may not change.
IMMUTABLE = ("name", "network", "direction")
DEFAULT_PROJECTS = {"hlf-test": ["default", "hlf-net"]}
# Every project's zones in an aggregated list (with the zones that hold an instance).
ZONES = ("europe-west4-a", "us-central1-a", "us-central1-b", "us-central1-c")
MAX_RESULTS = 500
# The default network's subnet in a region (auto mode's ranges); inserts take addresses there.
SUBNET_RANGES = {
    "us-central1": "10.128.0.0/20",
    "europe-west1": "10.132.0.0/20",
    "us-west1": "10.138.0.0/20",
    "asia-east1": "10.140.0.0/20",
    "us-east1": "10.142.0.0/20",
    "us-east4": "10.150.0.0/20",
    "europe-west4": "10.164.0.0/20",
}
# The query parameters every method takes (the discovery document's standard parameters), and
# those of the list methods.
STANDARD_QUERY = {
    "$.xgafv",
    "access_token",
    "alt",
    "callback",
    "fields",
    "key",
    "oauth_token",
    "prettyPrint",
    "quotaUser",
    "uploadType",
    "upload_protocol",
    "userIp",
}
LIST_QUERY = ("filter", "maxResults", "orderBy", "pageToken")


class CapacityError(Exception):
    """A start the zone has no room for: the operation ends DONE with GCE's error entry (the
    instance stays TERMINATED), as Compute Engine reports a stock-out."""

    def __init__(self, project, zone):
        super().__init__(zone)
        self.entry = {
            "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
            "message": f"The zone 'projects/{project}/zones/{zone}' does not have enough "
            "resources available to fulfill the request. Try a different zone, or try again "
            "later.",
        }

    @classmethod
    def raise_for(cls, project, zone):
        def apply():
            raise cls(project, zone)

        return apply


class QuotaError(Exception):
    """An insert beyond a regional quota: the operation ends DONE with GCE's QUOTA_EXCEEDED."""

    def __init__(self, metric, limit, region):
        super().__init__(metric)
        self.entry = {
            "code": "QUOTA_EXCEEDED",
            "message": f"Quota '{metric}' exceeded.  Limit: {limit:.1f} in region {region}.",
        }


class ApiError(Exception):
    def __init__(self, code, reason, message, status=None):
        super().__init__(message)
        self.code, self.reason, self.message, self.status = code, reason, message, status

    def body(self):
        error = {"message": self.message, "domain": "global", "reason": self.reason}
        body = {"code": self.code, "message": self.message, "errors": [error]}
        if self.status:
            body["status"] = self.status
        return {"error": body}


def not_found(resource):
    return ApiError(404, "notFound", f"The resource '{resource}' was not found")


def invalid(field, value, why):
    return ApiError(400, "invalid", f"Invalid value for field '{field}': '{value}'. {why}")


def required(field):
    return ApiError(400, "required", f"Required field '{field}' not specified")


def now():
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Compute:
    """The API's state: projects, networks, firewall rules, operations, and the request log."""

    def __init__(self, token, backend=None):
        self.token = token
        self.backend = backend
        self.service_account = None  # (client_email, public key), set by the Server
        self.issued = {}  # access token -> expiry (time.time()); kept across a reset
        self.scopes = {}  # access token -> the scope it was granted for
        self.storage = None  # (host, port) of the Cloud Storage front CONNECT is relayed to
        self.lock = threading.RLock()
        self.ids = itertools.count(int(time.time()) * 1000)
        self.history = []  # every entry of the log since the start, kept through resets
        self.reset()

    def reset(self):
        with self.lock:
            self.projects = {p: set(n) for p, n in DEFAULT_PROJECTS.items()}
            if self.backend is not None:
                self.projects[self.backend.project] = set(self.backend.networks)
            self.parked_nat = {}  # (project, zone, name) -> natIPs of a stopped static instance
            self.firewalls = {}  # (project, name) -> resource
            if self.backend is not None:  # the project's own rules (a fresh project's defaults)
                for rule in self.backend.rules:
                    self._store_firewall(self.backend.project, rule["name"], rule)
            self.instances = {}  # (project, zone, name) -> resource
            self.page_size = None
            self.operations = {}  # (project, name) -> [operation, done_at or None, apply]
            self.request_ids = {}  # (path, requestId) -> (project, operation name)
            self.deny = set()
            self.operation_seconds = 0.0
            self.start_capacity_errors = 0
            self.capacity = {}  # zone -> {machine type: how many may exist}
            self.quotas = {}  # region -> {metric: limit} over machine_types.DEFAULT_LIMITS
            self.creating = {}  # (project, zone, name) -> the instance while its insert runs
            self.zone_names = None  # config "zones": the zones that exist (None: the defaults)
            # (project, region, name) -> an inserted resource policy, or None for a backend's
            # policy deleted here
            self.policies = {}
            self.policy_inserts = {}  # (project, region, name) -> its insert's operation
            self.nat_count = itertools.count(2)  # external addresses handed out by inserts
            self.log = []

    def configure(self, config):
        with self.lock:
            if "operation_seconds" in config:
                seconds = config["operation_seconds"]
                self.operation_seconds = None if seconds is None else float(seconds)
            if "deny" in config:
                self.deny = set(config["deny"])
            if "projects" in config:
                self.projects = {p: set(n) for p, n in config["projects"].items()}
            if "page_size" in config:
                size = config["page_size"]
                self.page_size = None if size is None else max(1, int(size))
            if "capacity" in config:
                self.capacity = {z: dict(t) for z, t in (config["capacity"] or {}).items()}
            if "quotas" in config:
                self.quotas = {r: dict(q) for r, q in (config["quotas"] or {}).items()}
            if "zones" in config:
                zones = config["zones"]
                self.zone_names = None if zones is None else [str(z) for z in zones]
            if "start_capacity_errors" in config:
                self.start_capacity_errors = max(0, int(config["start_capacity_errors"]))
            if "storage" in config:
                host, _colon, port = str(config["storage"] or "").rpartition(":")
                self.storage = (host, int(port)) if host else None

    # -- the API --------------------------------------------------------------------------------

    def handle(self, method, path, query, headers, body):
        """Answer one API request: (status, JSON body)."""
        with self.lock:
            self._finish_due_operations()
            if not self._authorized(headers.get("Authorization", "")):
                message = "Request had invalid authentication credentials."
                return 401, ApiError(401, "authError", message, "UNAUTHENTICATED").body()
            try:
                request_id = self._request_id(method, query)
                known = self.request_ids.get((path, request_id)) if request_id else None
                if known in self.operations:  # a retried write: the first one's operation
                    return 200, copy.deepcopy(self.operations[known][0])
                answer = self._route(method, path, query, body)
                if request_id and answer.get("kind") == "compute#operation":
                    project = path.split("/")[4]
                    self.request_ids[(path, request_id)] = (project, answer["name"])
                return 200, answer
            except ApiError as error:
                return error.code, error.body()

    @staticmethod
    def _request_id(method, query):
        """A write's requestId (a UUID, as GCE requires; GCE ignores a request whose ID it has
        seen and answers with the first one's operation), or None."""
        values = query.get("requestId") if method in ("POST", "PATCH", "DELETE") else None
        if not values:
            return None
        try:
            uuid.UUID(values[0])
        except ValueError:
            raise invalid("requestId", values[0], "Must be a valid UUID.") from None
        return values[0]

    def _authorized(self, header):
        token = header.removeprefix("Bearer ")
        if not header.startswith("Bearer ") or not token:
            return False
        return token == self.token or self.issued.get(token, 0) > time.time()

    def _route(self, method, path, query, body):
        match = re.fullmatch(
            r"/compute/v1/projects/([^/]+)/zones/([^/]+)/machineTypes/([^/]+)", path
        )
        if match:
            if method != "GET":
                raise ApiError(405, "httpMethodNotAllowed", "Method not allowed")
            check_query(query)
            return self._machine_type(*match.groups())
        match = re.fullmatch(r"/compute/v1/projects/([^/]+)/regions/([^/]+)", path)
        if match:
            if method != "GET":
                raise ApiError(405, "httpMethodNotAllowed", "Method not allowed")
            check_query(query)
            return self._region(*match.groups())
        match = re.fullmatch(
            r"/compute/v1/projects/([^/]+)/regions/([^/]+)/operations/([^/]+)", path
        )
        if match:
            if method != "GET":
                raise ApiError(405, "httpMethodNotAllowed", "Method not allowed")
            check_query(query)
            project, region, name = match.groups()
            self._known_region(project, region)
            return self._get_operation(project, name, region=region)
        match = re.fullmatch(
            r"/compute/v1/projects/([^/]+)/zones/([^/]+)/(instances|operations)"
            r"(?:/([^/]+)(?:/(stop|start|reset|setLabels))?)?",
            path,
        )
        if match:
            return self._zonal(method, *match.groups(), query, body)
        match = re.fullmatch(
            r"/compute/v1/projects/([^/]+)/regions/([^/]+)/resourcePolicies(?:/([^/]+))?", path
        )
        if match:
            project, region, name = match.groups()
            if (method, name is None) == ("POST", True):
                check_query(query, "requestId")
                return self._insert_resource_policy(project, region, body)
            if name is None or method not in ("GET", "DELETE"):
                raise ApiError(405, "httpMethodNotAllowed", "Method not allowed")
            if method == "DELETE":
                check_query(query, "requestId")
                return self._delete_resource_policy(project, region, name)
            check_query(query)
            return self._resource_policy(project, region, name)
        match = re.fullmatch(r"/compute/v1/projects/([^/]+)/aggregated/instances", path)
        if match:
            if match.group(1) not in self.projects:
                raise not_found(f"projects/{match.group(1)}")
            if method != "GET":
                raise ApiError(405, "httpMethodNotAllowed", "Method not allowed")
            check_query(query, *LIST_QUERY, "includeAllScopes", "serviceProjectNumber")
            return self._aggregated_instances(match.group(1), query)
        match = re.fullmatch(
            r"/compute/v1/projects/([^/]+)/global/(firewalls|operations)(?:/([^/]+))?", path
        )
        if not match:
            raise ApiError(404, "notFound", f"Not Found: {path}")
        project, kind, name = match.group(1), match.group(2), match.group(3)
        if kind == "operations":
            if method != "GET" or not name:
                raise ApiError(405, "httpMethodNotAllowed", "Method not allowed")
            check_query(query)
            self._known_project(project)
            return self._get_operation(project, name)
        if name is None and method == "GET":
            check_query(query, *LIST_QUERY)
            self._known_project(project)
            return self._list(project, query)
        if name is None and method == "POST":
            check_query(query, "requestId")
            self._known_project(project)
            return self._insert(project, body)
        if name is not None and method == "GET":
            check_query(query)
            self._known_project(project)
            return self._get(project, name)
        if name is not None and method in ("PATCH", "DELETE"):
            check_query(query, "requestId")
            self._known_project(project)
            if method == "PATCH":
                return self._patch(project, name, body)
            return self._delete(project, name)
        raise ApiError(405, "httpMethodNotAllowed", "Method not allowed")

    def _known_region(self, project, region):
        self._known_project(project)
        if region not in {region_of(z) for z in self._zones(project)}:
            raise not_found(f"projects/{project}/regions/{region}")

    def _policies(self, project, region):
        """name -> resource policy of the region: the backend's, merged with those inserted here
        (less those deleted here)."""
        found = {}
        if self.backend is not None and project == self.backend.project:
            for policy in self.backend.resource_policies():
                if policy["region"].endswith(f"/regions/{region}"):
                    found[policy["name"]] = policy
        for (p, r, name), policy in self.policies.items():
            if (p, r) == (project, region):
                if policy is None:
                    found.pop(name, None)
                else:
                    found[name] = policy
        return found

    def _resource_policy(self, project, region, name):
        """resourcePolicies.get."""
        self._known_region(project, region)
        resource = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        self._check("compute.resourcePolicies.get", resource)
        policy = self._policies(project, region).get(name)
        if policy is None:
            raise not_found(resource)
        return copy.deepcopy(policy)

    def _insert_resource_policy(self, project, region, body):
        """resourcePolicies.insert: a placement policy (groupPlacementPolicy), kept in memory."""
        self._known_region(project, region)
        body = body if isinstance(body, dict) else {}
        name = body.get("name")
        if not name:
            raise required("resource.name")
        if not NAME_RE.match(str(name)):
            raise invalid("resource.name", name, f"Must be a match of regex '{NAME_RE.pattern}'")
        resource = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        self._check("compute.resourcePolicies.create", resource)
        placement = body.get("groupPlacementPolicy")
        if not isinstance(placement, dict):
            why = "The fake knows placement policies only (groupPlacementPolicy)."
            raise invalid("resource.groupPlacementPolicy", placement, why)
        collocation = placement.get("collocation", "UNSPECIFIED_COLLOCATION")
        if collocation not in ("COLLOCATED", "UNSPECIFIED_COLLOCATION"):
            raise invalid("resource.groupPlacementPolicy.collocation", collocation, "Unknown.")
        for field in ("vmCount", "availabilityDomainCount"):
            value = placement.get(field)
            if value is not None and (not isinstance(value, int) or value < 1):
                why = "Must be a positive integer."
                raise invalid(f"resource.groupPlacementPolicy.{field}", value, why)
        key = (project, region, name)
        pending = self.policy_inserts.get(key)
        if name in self._policies(project, region) or (pending and pending["status"] != "DONE"):
            raise ApiError(409, "alreadyExists", f"The resource '{resource}' already exists")
        region_link = f"{LINK}projects/{project}/regions/{region}"
        policy = {
            "kind": "compute#resourcePolicy",
            "id": str(next(self.ids)),
            "creationTimestamp": now(),
            "selfLink": f"{LINK}{resource}",
            "region": region_link,
            "name": name,
            "status": "READY",
            "groupPlacementPolicy": {k: v for k, v in placement.items() if v is not None},
        }
        if body.get("description"):
            policy["description"] = body["description"]

        def apply():
            self.policies[key] = policy

        operation = self._operation(project, "insert", policy, apply, region=region)
        self.policy_inserts[key] = self.operations[(project, operation["name"])][0]
        return operation

    def _delete_resource_policy(self, project, region, name):
        """resourcePolicies.delete: refused while an instance uses the policy, as GCE does."""
        self._known_region(project, region)
        resource = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        policy = self._policies(project, region).get(name)
        if policy is None:
            raise not_found(resource)
        self._check("compute.resourcePolicies.delete", resource)
        every = {**self._instance_table(), **self.creating}
        for (p, zone, instance), found in sorted(every.items()):
            links = [link_path(link) for link in found.get("resourcePolicies") or []]
            if p == project and resource in links:
                user = f"projects/{project}/zones/{zone}/instances/{instance}"
                message = (
                    f"The resource_policy resource '{resource}' is already being used by '{user}'"
                )
                raise ApiError(400, "resourceInUseByAnotherResource", message)

        def apply():
            self.policies[(project, region, name)] = None

        return self._operation(project, "delete", policy, apply, region=region)

    def _known_project(self, project):
        if project not in self.projects:
            raise not_found(f"projects/{project}")

    def _check(self, permission, resource):
        if permission in self.deny:
            raise ApiError(403, "forbidden", f"Required '{permission}' permission for '{resource}'")

    def _existing(self, project, name):
        rule = self.firewalls.get((project, name))
        if rule is None:
            raise not_found(f"projects/{project}/global/firewalls/{name}")
        return rule

    def _get(self, project, name):
        self._check("compute.firewalls.get", f"projects/{project}/global/firewalls/{name}")
        return copy.deepcopy(self._existing(project, name))

    def _list(self, project, query):
        self._check("compute.firewalls.list", f"projects/{project}")
        expression = query.get("filter", [""])[0]
        keep = parse_filter(expression)
        start, size = self._page(query, expression)
        matching = [
            rule
            for (p, name), rule in sorted(self.firewalls.items())
            if p == project and keep(rule)
        ]
        answer = {
            "kind": "compute#firewallList",
            "id": f"projects/{project}/global/firewalls",
            "selfLink": f"{LINK}projects/{project}/global/firewalls",
        }
        items = [copy.deepcopy(rule) for rule in matching[start : start + size]]
        if items:  # the real API leaves "items" out of an empty list
            answer["items"] = items
        if start + size < len(matching):
            answer["nextPageToken"] = page_token(start + size, expression)
        return answer

    def _page(self, query, expression):
        """(start, size) of a list's page, from maxResults, pageToken and the page_size set."""
        try:
            size = int(query.get("maxResults", [MAX_RESULTS])[0])
        except ValueError:
            size = -1
        if not 0 <= size <= MAX_RESULTS:
            raise invalid("maxResults", query["maxResults"][0], "Must be between 0 and 500.")
        size = min(size or MAX_RESULTS, self.page_size or MAX_RESULTS)
        return self._page_start(query.get("pageToken", [""])[0], expression), size

    def _aggregated_instances(self, project, query):
        self._check("compute.instances.list", f"projects/{project}")
        expression = query.get("filter", [""])[0]
        keep = parse_instance_filter(expression)
        start, size = self._page(query, expression)
        table = self._instance_table()
        matching = [
            (zone, name)
            for (p, zone, name), instance in sorted(table.items())
            if p == project and keep(instance)
        ]
        page = matching[start : start + size]
        zones = self._zones(project, table)
        items = {}
        for zone in zones:
            instances = [table[(project, z, name)] for z, name in page if z == zone]
            if instances:
                items[f"zones/{zone}"] = {"instances": instances}
            else:
                scope = f"zones/{zone}"
                items[scope] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope '{scope}' on this page.",
                        "data": [{"key": "scope", "value": scope}],
                    }
                }
        answer = {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{project}/aggregated/instances",
            "items": items,
            "selfLink": f"{LINK}projects/{project}/aggregated/instances",
        }
        if start + size < len(matching):
            answer["nextPageToken"] = page_token(start + size, expression)
        return answer

    @staticmethod
    def _page_start(token, expression):
        if not token:
            return 0
        try:
            page = json.loads(base64.urlsafe_b64decode(token.encode()))
            start = int(page["start"])
        except (ValueError, TypeError, KeyError):
            raise invalid("pageToken", token, "Invalid page token.") from None
        if page.get("filter") != expression:
            raise invalid("pageToken", token, "The page token belongs to another filter.")
        return start

    def _insert(self, project, body):
        name = (body or {}).get("name")
        if not name:
            raise required("resource.name")
        if not NAME_RE.match(str(name)):
            raise invalid("resource.name", name, f"Must be a match of regex '{NAME_RE.pattern}'")
        resource = f"projects/{project}/global/firewalls/{name}"
        self._check("compute.firewalls.create", resource)
        rule = self._validated(project, dict(body))
        self._check("compute.networks.updatePolicy", rule["network"].removeprefix(LINK))
        if (project, name) in self.firewalls:
            raise ApiError(409, "alreadyExists", f"The resource '{resource}' already exists")
        rule.update(
            kind="compute#firewall",
            id=str(next(self.ids)),
            creationTimestamp=now(),
            selfLink=f"{LINK}{resource}",
        )

        def apply():
            self.firewalls[(project, name)] = rule

        return self._operation(project, "insert", rule, apply)

    def _patch(self, project, name, body):
        resource = f"projects/{project}/global/firewalls/{name}"
        current = self._existing(project, name)
        self._check("compute.firewalls.update", resource)
        if not (body or {}).get("name"):
            raise required("resource.name")  # the document: required by insert and patch
        merged = copy.deepcopy(current)
        for key, value in (body or {}).items():
            if key in ("kind", "id", "creationTimestamp", "selfLink"):
                continue
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        rule = self._validated(project, merged)
        for field in IMMUTABLE:
            if rule.get(field) != current.get(field):
                why = "The field cannot be changed after the rule is created."
                raise invalid(f"resource.{field}", rule.get(field), why)
        self._check("compute.networks.updatePolicy", rule["network"].removeprefix(LINK))

        def apply():
            if (project, name) in self.firewalls:
                self.firewalls[(project, name)] = rule

        return self._operation(project, "patch", rule, apply)

    def _delete(self, project, name):
        resource = f"projects/{project}/global/firewalls/{name}"
        rule = self._existing(project, name)
        self._check("compute.firewalls.delete", resource)
        self._check("compute.networks.updatePolicy", rule["network"].removeprefix(LINK))

        def apply():
            self.firewalls.pop((project, name), None)

        return self._operation(project, "delete", rule, apply)

    def _validated(self, project, rule):
        """The rule as the API stores it, with its defaults; ApiError(400/404) when invalid."""
        network = normalize_network(project, rule.get("network") or "global/networks/default")
        if network is None:
            raise invalid("resource.network", rule.get("network"), "Invalid network reference.")
        net_project, net_name = network.removeprefix(LINK + "projects/").split("/global/networks/")
        if net_name not in self.projects.get(net_project, set()):
            raise not_found(network.removeprefix(LINK))
        rule["network"] = network
        rule.setdefault("description", "")
        rule.setdefault("priority", 1000)
        rule.setdefault("direction", "INGRESS")
        rule.setdefault("disabled", False)
        rule.setdefault("logConfig", {"enable": False})
        if not isinstance(rule["priority"], int) or not 0 <= rule["priority"] <= 65535:
            raise invalid("resource.priority", rule["priority"], "Must be between 0 and 65535.")
        if rule["direction"] not in ("INGRESS", "EGRESS"):
            raise invalid("resource.direction", rule["direction"], "Must be INGRESS or EGRESS.")
        if bool(rule.get("allowed")) == bool(rule.get("denied")):
            raise invalid(
                "resource", rule.get("name"), "Exactly one of allowed or denied is required."
            )
        for field in ("allowed", "denied"):
            for index, entry in enumerate(rule.get(field) or []):
                check_protocol(f"resource.{field}[{index}]", entry)
        for field in ("sourceRanges", "destinationRanges"):
            for index, cidr in enumerate(rule.get(field) or []):
                try:
                    ipaddress.ip_network(cidr, strict=False)
                except ValueError:
                    raise invalid(
                        f"resource.{field}[{index}]", cidr, "Must be a valid CIDR."
                    ) from None
        for field in ("sourceTags", "targetTags"):
            for index, tag in enumerate(rule.get(field) or []):
                if not NAME_RE.match(tag):
                    raise invalid(f"resource.{field}[{index}]", tag, "Must be a valid tag.")
        sources = ("sourceRanges", "sourceTags", "sourceServiceAccounts")
        if rule["direction"] == "INGRESS" and not any(rule.get(f) for f in sources):
            rule["sourceRanges"] = ["0.0.0.0/0"]  # the API's documented default
        for field in [k for k, v in rule.items() if v in ([], None)]:
            del rule[field]
        return rule

    def _operation(self, project, kind, rule, apply, zone=None, background=False, region=None):
        """An operation on `rule` (any resource with a selfLink), zonal, regional or global;
        `apply` lands the change when it is DONE, or, `background`, runs at once in a thread of
        its own and makes it DONE."""
        name = f"operation-{next(self.ids)}-{secrets.token_hex(4)}"
        scope = operation_scope(project, zone, region)
        operation = {
            "kind": "compute#operation",
            "id": str(next(self.ids)),
            "name": name,
            "operationType": kind,
            "targetLink": rule["selfLink"],
            "status": "PENDING",
            "user": "fake@example.com",
            "progress": 0,
            "insertTime": now(),
            "selfLink": f"{LINK}{scope}/operations/{name}",
        }
        if rule.get("id"):
            operation["targetId"] = rule["id"]
        if zone:
            operation["zone"] = f"{LINK}projects/{project}/zones/{zone}"
        if region:
            operation["region"] = f"{LINK}projects/{project}/regions/{region}"
        if background:
            self.operations[(project, name)] = [operation, None, apply]
            answer = copy.deepcopy(operation)
            threading.Thread(target=self._run, args=(operation, apply), daemon=True).start()
            return answer
        seconds = self.operation_seconds
        done_at = None if seconds is None else time.monotonic() + seconds
        self.operations[(project, name)] = [operation, done_at, apply]
        answer = copy.deepcopy(operation)
        if done_at is not None and seconds <= 0:
            self._finish(project, name)
            answer = copy.deepcopy(self.operations[(project, name)][0])
            answer["status"] = "RUNNING"  # a fresh operation is never DONE in its first answer
        return answer

    def _run(self, operation, apply):
        with self.lock:
            operation.update(status="RUNNING", startTime=now(), progress=50)
        try:
            apply()
            error = None
        except Exception as exc:  # noqa: BLE001 - the operation reports it, as GCE's do
            error = f"{type(exc).__name__}: {exc}"
        with self.lock:
            if error:
                operation["error"] = {"errors": [{"code": "INTERNAL_ERROR", "message": error}]}
                operation.update(httpErrorStatusCode=500, httpErrorMessage="INTERNAL SERVER ERROR")
            operation.update(status="DONE", progress=100, endTime=now())

    def _get_operation(self, project, name, zone=None, region=None):
        scope = operation_scope(project, zone, region)
        kind = "zone" if zone else "region" if region else "global"
        self._check(f"compute.{kind}Operations.get", f"{scope}/operations/{name}")
        entry = self.operations.get((project, name))
        if entry is None or entry[0]["selfLink"] != f"{LINK}{scope}/operations/{name}":
            raise not_found(f"{scope}/operations/{name}")
        operation = entry[0]
        if operation["status"] == "PENDING":
            operation.update(status="RUNNING", startTime=now(), progress=50)
        return copy.deepcopy(operation)

    def _finish_due_operations(self):
        due = [
            key
            for key, (op, done_at, _apply) in self.operations.items()
            if op["status"] != "DONE" and done_at is not None and time.monotonic() >= done_at
        ]
        for project, name in due:
            self._finish(project, name)

    def _finish(self, project, name):
        operation, _done_at, apply = self.operations[(project, name)]
        try:
            apply()
        except (CapacityError, QuotaError) as error:
            operation["error"] = {"errors": [error.entry]}
            operation.update(httpErrorStatusCode=503, httpErrorMessage="SERVICE UNAVAILABLE")
        operation.update(status="DONE", progress=100, endTime=now())
        operation.setdefault("startTime", operation["endTime"])
        if self.backend is not None and "/global/firewalls/" in operation["targetLink"]:
            rules = [r for (p, _n), r in sorted(self.firewalls.items()) if p == project]
            self.backend.firewalls_landed(copy.deepcopy(rules))

    # -- instances per zone -----------------------------------------------------------------

    def _instance_table(self):
        """(project, zone, name) -> instance, as the API returns it: the backend's, read now, or
        the static ones; each with the labelFingerprint of its current labels."""
        if self.backend is None:
            table = copy.deepcopy(self.instances)
        else:  # each in its own zone (the backend's VMs may lie in several)
            table = {
                (self.backend.project, link_name(i.get("zone")) or self.backend.zone, i["name"]): i
                for i in self.backend.instances()
            }
        for instance in table.values():
            instance["labelFingerprint"] = label_fingerprint(instance.get("labels") or {})
        return table

    def _zones(self, project, table=None):
        """The project's zones: config "zones" (by default ZONES and the backend's zone), and
        any zone holding one of its instances."""
        table = self.instances if table is None else table
        if self.zone_names is not None:
            zones = set(self.zone_names)
        else:
            zones = set(ZONES)
            if self.backend is not None and project == self.backend.project:
                zones.add(self.backend.zone)
        zones.update(zone for p, zone, _name in table if p == project)
        return sorted(zones)

    def _zonal(self, method, project, zone, kind, name, action, query, body):
        if project not in self.projects:
            raise not_found(f"projects/{project}")
        table = self._instance_table()
        if zone not in self._zones(project, table):  # the backend's zones included
            raise not_found(f"projects/{project}/zones/{zone}")
        if kind == "operations":
            if method != "GET" or action:
                raise ApiError(405, "httpMethodNotAllowed", "Method not allowed")
            if name is None:
                check_query(query, *LIST_QUERY)
                return self._list_operations(project, zone, query)
            check_query(query)
            return self._get_operation(project, name, zone)
        if name is None and method == "POST":
            check_query(query, "requestId", "sourceInstanceTemplate", "sourceMachineImage")
            return self._insert_instance(project, zone, table, body)
        if name is None:
            if method != "GET":
                raise ApiError(405, "httpMethodNotAllowed", "Method not allowed")
            return self._list_instances(project, zone, table, query)
        resource = f"projects/{project}/zones/{zone}/instances/{name}"
        if (method, action) == ("GET", None):
            self._check("compute.instances.get", resource)
            if (project, zone, name) not in table:
                raise not_found(resource)
            return table[(project, zone, name)]
        verb = {"POST": action, "DELETE": "delete" if action is None else None}.get(method)
        if verb not in INSTANCE_ACTIONS:
            raise ApiError(405, "httpMethodNotAllowed", "Method not allowed")
        permission, kind, method_name = INSTANCE_ACTIONS[verb]
        instance = table.get((project, zone, name))
        if instance is None:
            raise not_found(resource)
        self._check(permission, resource)
        args = (self._checked_labels(instance, body),) if verb == "setLabels" else ()
        if verb == "reset" and instance["status"] != "RUNNING":
            raise ApiError(400, "resourceNotReady", f"The resource '{resource}' is not ready")
        if verb == "start" and self.start_capacity_errors:
            self.start_capacity_errors -= 1
            return self._operation(
                project, kind, instance, CapacityError.raise_for(project, zone), zone=zone
            )
        if verb == "start" and instance.get("status") == "TERMINATED":
            # A stopped VM takes the zone's capacity and the region's quotas again.
            machine = link_name(instance.get("machineType"))
            running = {**instance, "status": "RUNNING"}
            refusal = self._refusal(project, zone, machine, running, table)
            if refusal is not None:
                return self._operation(project, kind, instance, raiser(refusal), zone=zone)
        if self.backend is not None:
            apply = functools.partial(getattr(self.backend, method_name), name, *args)
            return self._operation(project, kind, instance, apply, zone=zone, background=True)
        apply = functools.partial(self._act, (project, zone, name), verb, *args)
        return self._operation(project, kind, instance, apply, zone=zone)

    def _machine_type(self, project, zone, name):
        self._known_project(project)
        if zone not in self._zones(project, self.instances):
            raise not_found(f"projects/{project}/zones/{zone}")
        resource = f"projects/{project}/zones/{zone}/machineTypes/{name}"
        self._check("compute.machineTypes.get", resource)
        answer = machine_types.resource(project, zone, name, LINK)
        if answer is None:
            raise not_found(resource)
        return answer

    def _limits(self, region):
        return {**machine_types.DEFAULT_LIMITS, **self.quotas.get(region, {})}

    def _usage(self, project, region, instances):
        """{metric: amount} the instances of `region` (not TERMINATED) take."""
        limits, used = self._limits(region), {}
        for (p, zone, _n), instance in instances.items():
            if p != project or zone.rsplit("-", 1)[0] != region:
                continue
            if instance.get("status") in ("TERMINATED", "STOPPED"):
                continue
            for metric, amount in machine_types.usage(instance, limits).items():
                used[metric] = used.get(metric, 0.0) + amount
        return used

    def _region(self, project, region):
        """regions.get: the region's zones and its quotas (usage from its instances)."""
        self._known_project(project)
        zones = [z for z in self._zones(project, self.instances) if z.rsplit("-", 1)[0] == region]
        if not zones:
            raise not_found(f"projects/{project}/regions/{region}")
        self._check("compute.regions.get", f"projects/{project}/regions/{region}")
        used = self._usage(project, region, {**self._instance_table(), **self.creating})
        return {
            "kind": "compute#region",
            "id": str(int.from_bytes(region.encode()[:7], "big")),
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
            "name": region,
            "description": region,
            "status": "UP",
            "zones": [f"{LINK}projects/{project}/zones/{z}" for z in zones],
            "quotas": [
                {"metric": metric, "limit": float(limit), "usage": used.get(metric, 0.0)}
                for metric, limit in sorted(self._limits(region).items())
                if metric not in machine_types.UNLISTED
            ],
            "selfLink": f"{LINK}projects/{project}/regions/{region}",
            "supportsPzs": False,
        }

    def _insert_instance(self, project, zone, table, body):
        """instances.insert: checked as GCE checks it; the zone's capacity (config) and the
        region's quotas are taken when the request arrives (with the inserts still running), and
        a request beyond them ends DONE with GCE's error, nothing created."""
        body = copy.deepcopy(body) if isinstance(body, dict) else {}
        name = body.get("name")
        if not name:
            raise required("resource.name")
        if not NAME_RE.match(str(name)):
            raise invalid(
                "resource.name",
                name,
                "Must be a match of regex '[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?'",
            )
        resource = f"projects/{project}/zones/{zone}/instances/{name}"
        self._check("compute.instances.create", resource)
        machine = self._machine_of(project, zone, body.get("machineType"))
        key = (project, zone, name)
        if key in table or key in self.creating:
            raise ApiError(409, "alreadyExists", f"The resource '{resource}' already exists")
        self._checked_labels({"labelFingerprint": None}, {"labels": body.get("labels") or {}})
        has_gpus = bool(machine_types.TYPES[machine][2] or body.get("guestAccelerators"))
        body["scheduling"] = checked_scheduling(body.get("scheduling"), has_gpus)
        policies = self._instance_policies(project, zone, body.get("resourcePolicies"))
        body["machineType"] = machine  # the backend's body: the short name
        if policies:
            body["resourcePolicies"] = policies  # full links
        instance = self._new_instance(project, zone, body, policies, table)
        refusal = self._refusal(project, zone, machine, instance, table)
        if refusal is not None:
            return self._operation(project, "insert", instance, raiser(refusal), zone=zone)
        self.creating[key] = instance

        if self.backend is not None:

            def create():
                try:
                    self.backend.insert(zone, copy.deepcopy(body))
                finally:
                    with self.lock:
                        self.creating.pop(key, None)

            return self._operation(project, "insert", instance, create, zone=zone, background=True)

        def land():
            self.creating.pop(key, None)
            self.instances[key] = instance

        return self._operation(project, "insert", instance, land, zone=zone)

    def _machine_of(self, project, zone, given):
        """The machine type's name from an insert's machineType (a URL or partial URL of the
        instance's zone); ApiError(400) for another form, zone or an unknown type."""
        if not given:
            raise required("resource.machineType")
        path = link_path(given)
        match = re.fullmatch(r"(?:projects/([^/]+)/)?zones/([^/]+)/machineTypes/([^/]+)", path)
        if not match:
            why = "Must be a URL to a valid Compute resource of the correct type."
            raise invalid("resource.machineType", given, why)
        in_project, in_zone, machine = match.groups()
        if in_zone != zone or in_project not in (None, project):
            why = f"Machine type specified '{path}' is in a different scope than the instance."
            raise invalid("resource.machineType", given, why)
        if machine not in machine_types.TYPES:
            why = f"Machine type with name '{machine}' does not exist in zone '{zone}'."
            raise invalid("resource.machineType", given, why)
        return machine

    def _instance_policies(self, project, zone, links):
        """An insert's resourcePolicies as full links: each must exist in the zone's region."""
        region, found = region_of(zone), []
        for index, link in enumerate(links or []):
            path = link_path(link)
            if "/" not in path:
                path = f"projects/{project}/regions/{region}/resourcePolicies/{path}"
            elif path.startswith("regions/"):
                path = f"projects/{project}/{path}"
            match = re.fullmatch(r"projects/([^/]+)/regions/([^/]+)/resourcePolicies/([^/]+)", path)
            if not match:
                why = "Must be a URL to a valid Compute resource of the correct type."
                raise invalid(f"resource.resourcePolicies[{index}]", link, why)
            if match.group(2) != region:
                why = f"Resource policy must be in the instance's region '{region}'."
                raise invalid(f"resource.resourcePolicies[{index}]", link, why)
            if match.group(3) not in self._policies(match.group(1), region):
                raise not_found(path)
            found.append(LINK + path)
        return found

    def _new_instance(self, project, zone, body, policies, table):
        """The instance an insert creates, as instances.get answers it."""
        zone_link = f"{LINK}projects/{project}/zones/{zone}"
        region, name = region_of(zone), body["name"]
        instance = copy.deepcopy(body)
        for field in ("disks", "networkInterfaces", "guestAccelerators", "resourcePolicies"):
            instance.pop(field, None)
        created = now()
        instance.update(
            kind="compute#instance",
            id=str(next(self.ids)),
            creationTimestamp=created,
            lastStartTimestamp=created,
            name=name,
            zone=zone_link,
            selfLink=f"{zone_link}/instances/{name}",
            status="RUNNING",
            machineType=f"{zone_link}/machineTypes/{body['machineType']}",
            labels=dict(body.get("labels") or {}),
            fingerprint=label_fingerprint({"instance": name, "created": created}),
            cpuPlatform="Intel Cascade Lake",
            startRestricted=False,
        )
        instance.setdefault("canIpForward", False)
        instance.setdefault("deletionProtection", False)
        metadata = {"kind": "compute#metadata"}
        items = (body.get("metadata") or {}).get("items") or []
        metadata["fingerprint"] = label_fingerprint({"items": items})
        if items:
            metadata["items"] = items
        instance["metadata"] = metadata
        if isinstance(body.get("tags"), dict):
            tags = body["tags"].get("items") or []
            instance["tags"] = {"fingerprint": label_fingerprint({"tags": tags})}
            if tags:
                instance["tags"]["items"] = tags
        used = {
            nic.get("networkIP")
            for other in [*table.values(), *self.creating.values()]
            for nic in other.get("networkInterfaces") or []
        }
        nics = []
        for index, given in enumerate(body.get("networkInterfaces") or [{}]):
            nic = self._new_nic(project, region, index, given, used)
            used.add(nic["networkIP"])
            nics.append(nic)
        instance["networkInterfaces"] = nics
        disks = [new_disk(zone_link, name, i, d) for i, d in enumerate(body.get("disks") or [])]
        if disks:
            instance["disks"] = disks
        accelerators = [
            {
                "acceleratorType": f"{zone_link}/acceleratorTypes/"
                + link_name(given.get("acceleratorType")),
                "acceleratorCount": int(given.get("acceleratorCount") or 1),
            }
            for given in body.get("guestAccelerators") or []
        ]
        if accelerators:
            instance["guestAccelerators"] = accelerators
        if policies:
            instance["resourcePolicies"] = policies
        accounts = []
        for account in body.get("serviceAccounts") or []:
            email = account.get("email") or "default"
            if email == "default":  # the project's Compute Engine default service account
                email = f"{project_number(project)}-compute@developer.gserviceaccount.com"
            accounts.append({"email": email, "scopes": list(account.get("scopes") or [])})
        if accounts:
            instance["serviceAccounts"] = [{k: v for k, v in a.items() if v} for a in accounts]
        instance["labelFingerprint"] = label_fingerprint(instance["labels"])
        if not instance["labels"]:
            del instance["labels"]
        return instance

    def _new_nic(self, project, region, index, given, used):
        """One network interface of an insert: its network (which must exist), subnetwork, an
        internal address of the subnet, and a natIP for each ONE_TO_ONE_NAT access config."""
        field = f"resource.networkInterfaces[{index}]"
        network = normalize_network(project, given.get("network") or "global/networks/default")
        if network is None:
            raise invalid(f"{field}.network", given.get("network"), "Invalid network reference.")
        net_project, net_name = network.removeprefix(LINK + "projects/").split("/global/networks/")
        if net_name not in self.projects.get(net_project, set()):
            raise not_found(network.removeprefix(LINK))
        subnetwork = link_path(given.get("subnetwork") or net_name)
        if "/" not in subnetwork:
            subnetwork = f"projects/{project}/regions/{region}/subnetworks/{subnetwork}"
        elif subnetwork.startswith("regions/"):
            subnetwork = f"projects/{project}/{subnetwork}"
        nic = copy.deepcopy(given)
        nic.update(
            kind="compute#networkInterface",
            name=f"nic{index}",
            network=network,
            subnetwork=LINK + subnetwork,
            fingerprint=label_fingerprint({"nic": index}),
        )
        nic.setdefault("stackType", "IPV4_ONLY")
        if not nic.get("networkIP"):
            subnet = ipaddress.ip_network(SUBNET_RANGES.get(region, "10.128.0.0/20"))
            hosts = (str(host) for host in itertools.islice(subnet.hosts(), 1, None))
            nic["networkIP"] = next(host for host in hosts if host not in used)
        configs = []
        for number, config in enumerate(given.get("accessConfigs") or []):
            kind = config.get("type", "ONE_TO_ONE_NAT")
            if kind != "ONE_TO_ONE_NAT":
                why = "Only ONE_TO_ONE_NAT access configs are supported for IPv4."
                raise invalid(f"{field}.accessConfigs[{number}].type", kind, why)
            config = copy.deepcopy(config)
            config.update(kind="compute#accessConfig", type=kind)
            config.setdefault("name", "External NAT")
            config.setdefault("networkTier", "PREMIUM")
            if not config.get("natIP"):  # an ephemeral external address (TEST-NET ranges)
                config["natIP"] = str(ipaddress.ip_address("198.51.100.0") + next(self.nat_count))
            configs.append(config)
        if configs:
            nic["accessConfigs"] = configs
        else:
            nic.pop("accessConfigs", None)
        return nic

    def _list_operations(self, project, zone, query):
        """zoneOperations.list: the zone's operations (system events included) in order of
        insertTime, filtered as instances are (operationType = "...", targetLink = "...")."""
        self._check("compute.zoneOperations.list", f"projects/{project}/zones/{zone}")
        expression = query.get("filter", [""])[0]
        keep = parse_instance_filter(expression)
        order = query.get("orderBy", [""])[0].strip()
        if order not in ("", "creationTimestamp desc"):
            why = "Only 'creationTimestamp desc' is supported for this collection."
            raise invalid("orderBy", order, why)
        start, size = self._page(query, expression)
        zone_link = f"{LINK}projects/{project}/zones/{zone}"
        matching = sorted(
            (
                operation
                for (p, _name), (operation, *_rest) in self.operations.items()
                if p == project and operation.get("zone") == zone_link and keep(operation)
            ),
            key=lambda operation: int(operation["id"]),
            reverse=bool(order),
        )
        answer = {
            "kind": "compute#operationList",
            "id": f"projects/{project}/zones/{zone}/operations",
            "selfLink": f"{zone_link}/operations",
        }
        items = [copy.deepcopy(op) for op in matching[start : start + size]]
        if items:
            answer["items"] = items
        if start + size < len(matching):
            answer["nextPageToken"] = page_token(start + size, expression)
        return answer

    def _refusal(self, project, zone, kind, instance, table):
        """The OperationError an insert ends with (capacity, then quota), or None."""
        every = {**table, **self.creating}
        limit = self.capacity.get(zone, {}).get(kind)
        if limit is not None:
            taken = sum(
                1
                for (p, z, _n), i in every.items()
                if (p, z) == (project, zone)
                and i.get("machineType", "").rsplit("/", 1)[-1] == kind
                and i.get("status") not in ("TERMINATED", "STOPPED")
            )
            if taken >= limit:
                return CapacityError(project, zone)
        region = zone.rsplit("-", 1)[0]
        limits = self._limits(region)
        used = self._usage(project, region, every)
        for metric, amount in sorted(machine_types.usage(instance, limits).items()):
            if metric in limits and used.get(metric, 0.0) + amount > limits[metric]:
                return QuotaError(metric, limits[metric], region)
        return None

    def _list_instances(self, project, zone, table, query):
        self._check("compute.instances.list", f"projects/{project}/zones/{zone}")
        keep = parse_instance_filter(query.get("filter", [""])[0])
        answer = {
            "kind": "compute#instanceList",
            "id": f"projects/{project}/zones/{zone}/instances",
            "selfLink": f"{LINK}projects/{project}/zones/{zone}/instances",
        }
        items = [i for (p, z, _n), i in sorted(table.items()) if (p, z) == (project, zone)]
        items = [i for i in items if keep(i)]
        if items:  # the real API leaves "items" out of an empty list
            answer["items"] = items
        return answer

    @staticmethod
    def _checked_labels(instance, body):
        body = body if isinstance(body, dict) else {}
        labels = body.get("labels") or {}
        if not isinstance(labels, dict) or len(labels) > 64:
            raise invalid("labels", labels, "At most 64 labels, as a map.")
        for key, value in labels.items():
            if not LABEL_KEY_RE.match(str(key)):
                raise invalid("labels", key, f"Label keys must match '{LABEL_KEY_RE.pattern}'.")
            if not isinstance(value, str) or not LABEL_VALUE_RE.match(value):
                why = f"Label values must match '{LABEL_VALUE_RE.pattern}'."
                raise invalid(f"labels.{key}", value, why)
        if body.get("labelFingerprint") != instance["labelFingerprint"]:
            message = "Labels fingerprint either invalid or resource labels have changed"
            raise ApiError(412, "conditionNotMet", message)
        return dict(labels)

    def _act(self, key, verb, *args):
        """A write on a static instance, when its operation is DONE."""
        instance = self.instances.get(key)
        if instance is None:
            return
        configs = [
            config
            for nic in instance.get("networkInterfaces", [])
            for config in nic.get("accessConfigs") or []
        ]
        if verb == "stop" and instance.get("status") != "TERMINATED":
            instance["status"] = "TERMINATED"
            self.parked_nat[key] = [config.pop("natIP", None) for config in configs]
        elif verb == "start" and instance.get("status") == "TERMINATED":
            instance["status"] = "RUNNING"
            for config, nat in zip(configs, self.parked_nat.pop(key, []), strict=False):
                if nat:
                    config["natIP"] = nat
        elif verb == "setLabels":
            instance["labels"] = args[0]
        elif verb == "delete":
            del self.instances[key]

    # -- OAuth2 -----------------------------------------------------------------------------

    def grant(self, form):
        """POST https://oauth2.googleapis.com/token: (status, JSON body)."""
        with self.lock:
            return self._grant(form)

    def _grant(self, form):
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import padding

        def refuse(error, description):
            return 400, {"error": error, "error_description": description}

        grant_type = form.get("grant_type", [""])[0]
        if grant_type != JWT_BEARER:
            return refuse("unsupported_grant_type", f"Invalid grant_type: {grant_type}")
        assertion = form.get("assertion", [""])[0]
        try:
            header_b64, claims_b64, signature_b64 = assertion.split(".")
            header = json.loads(b64url_decode(header_b64))
            claims = json.loads(b64url_decode(claims_b64))
            signature = b64url_decode(signature_b64)
        except (ValueError, TypeError):
            return refuse("invalid_grant", "Invalid JWT: the assertion is malformed.")
        email, public_key = self.service_account
        if header.get("alg") != "RS256":
            return refuse("invalid_grant", "Invalid JWT: the algorithm must be RS256.")
        if claims.get("iss") != email:
            return refuse("invalid_grant", "Invalid JWT: no such service account (iss).")
        try:
            signed = f"{header_b64}.{claims_b64}".encode()
            public_key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
        except InvalidSignature:
            return refuse("invalid_grant", "Invalid JWT Signature.")
        if claims.get("aud") != TOKEN_URI:
            return refuse("invalid_grant", "Invalid JWT: Failed audience check.")
        issued, expires, clock = claims.get("iat"), claims.get("exp"), time.time()
        if (
            not isinstance(issued, int | float)
            or not isinstance(expires, int | float)
            or not 0 < expires - issued <= TOKEN_SECONDS
            or expires < clock
            or issued > clock + 300
        ):
            message = (
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable "
                "timeframe. Check your iat and exp values in the JWT claim."
            )
            return refuse("invalid_grant", message)
        if not str(claims.get("scope") or "").strip():
            return refuse("invalid_scope", "Invalid OAuth scope or ID token audience provided.")
        token = "ya29." + secrets.token_urlsafe(32)
        self.issued[token] = clock + TOKEN_SECONDS
        self.scopes[token] = " ".join(str(claims["scope"]).split())
        return 200, {"access_token": token, "expires_in": TOKEN_SECONDS - 1, "token_type": "Bearer"}

    def tokeninfo(self, form):
        """GET or POST https://oauth2.googleapis.com/tokeninfo?access_token=T: (status, body)."""
        token = form.get("access_token", [""])[0]
        with self.lock:
            expiry = self.issued.get(token, 0)
            if token == self.token:
                expiry, scope = (
                    time.time() + TOKEN_SECONDS,
                    "https://www.googleapis.com/auth/cloud-platform",
                )
            else:
                scope = self.scopes.get(token, "")
            if not token or expiry <= time.time():
                return 400, {"error": "invalid_token", "error_description": "Invalid Value"}
            email, _key = self.service_account
        client_id = self.client_id
        return 200, {
            "azp": client_id,
            "aud": client_id,
            "scope": scope,
            "exp": str(int(expiry)),
            "expires_in": str(max(0, int(expiry - time.time()))),
            "email": email,
            "email_verified": "true",
            "access_type": "online",
        }

    # -- control ----------------------------------------------------------------------------

    def record(self, entry):
        with self.lock:
            self.log.append(entry)
            self.history.append(entry)

    def put_firewall(self, project, name, rule):
        """Store a rule as given, with what every stored rule has (kind, id, selfLink...); with
        a backend it takes effect in the VMs, as an edit in the console would."""
        with self.lock:
            stored = self._store_firewall(project, name, rule)
            if self.backend is not None and project == self.backend.project:
                rules = [r for (p, _n), r in sorted(self.firewalls.items()) if p == project]
                self.backend.firewalls_landed(copy.deepcopy(rules))
            return stored

    def _store_firewall(self, project, name, rule):
        rule = copy.deepcopy(rule) if isinstance(rule, dict) else {}
        rule.setdefault("kind", "compute#firewall")
        rule.setdefault("id", str(next(self.ids)))
        rule.setdefault("creationTimestamp", now())
        rule.setdefault("name", name)
        rule.setdefault("selfLink", f"{LINK}projects/{project}/global/firewalls/{name}")
        self.firewalls[(project, name)] = rule
        return copy.deepcopy(rule)

    def snapshot(self):
        with self.lock:
            return {f"{p}/{n}": copy.deepcopy(r) for (p, n), r in sorted(self.firewalls.items())}

    def put_instance(self, project, zone, name, body):
        """Store an instance as the API would return it (defaults for what it always has)."""
        with self.lock:
            instance = copy.deepcopy(body) if isinstance(body, dict) else {}
            zone_link = f"{LINK}projects/{project}/zones/{zone}"
            instance.update(
                kind="compute#instance",
                name=name,
                zone=zone_link,
                selfLink=f"{zone_link}/instances/{name}",
            )
            instance.setdefault("id", str(next(self.ids)))
            instance.setdefault("creationTimestamp", now())
            instance.setdefault("status", "RUNNING")
            instance.setdefault("machineType", f"{zone_link}/machineTypes/e2-standard-4")
            region = zone.rsplit("-", 1)[0]
            for index, nic in enumerate(instance.setdefault("networkInterfaces", [{}])):
                nic.setdefault("kind", "compute#networkInterface")
                nic.setdefault("name", f"nic{index}")
                network = nic.get("network") or "global/networks/default"
                nic["network"] = normalize_network(project, network) or network
                nic.setdefault(
                    "subnetwork",
                    f"{LINK}projects/{project}/regions/{region}/subnetworks/"
                    + nic["network"].rsplit("/", 1)[-1],
                )
                nic.setdefault("networkIP", f"10.128.{index}.{len(self.instances) + 2}")
                for config in nic.get("accessConfigs") or []:
                    config.setdefault("kind", "compute#accessConfig")
                    config.setdefault("type", "ONE_TO_ONE_NAT")
                    config.setdefault("name", "External NAT")
                    config.setdefault("networkTier", "PREMIUM")
            self.instances[(project, zone, name)] = instance
            return copy.deepcopy(instance)

    def preempt(self, body):
        """POST /_fake/preempt {"project", "zone", "name"}: GCE preempts a Spot VM: a system
        operation compute.instances.preempted (DONE) in the zone's operations, then the VM
        stopped or deleted (its instanceTerminationAction); with a backend, backend.preempt(name)
        in a thread of its own. (status, {"operation": NAME} or an error)."""
        with self.lock:
            project = body.get("project") or (self.backend.project if self.backend else "")
            zone = body.get("zone") or (self.backend.zone if self.backend else "")
            name = body.get("name") or ""
            resource = f"projects/{project}/zones/{zone}/instances/{name}"
            instance = self._instance_table().get((project, zone, name))
            if instance is None:
                return 404, not_found(resource).body()
            scheduling = instance.get("scheduling") or {}
            if scheduling.get("provisioningModel") != "SPOT" and not scheduling.get("preemptible"):
                message = f"'{resource}' is neither a Spot nor a preemptible VM"
                return 400, ApiError(400, "badRequest", message).body()
            if instance.get("status") != "RUNNING":
                message = f"'{resource}' is {instance.get('status')}, not RUNNING"
                return 400, ApiError(400, "resourceNotReady", message).body()
            stamp, zone_link = now(), f"{LINK}projects/{project}/zones/{zone}"
            operation_name = f"systemevent-{int(time.time() * 1000)}-{secrets.token_hex(6)}"
            operation = {
                "kind": "compute#operation",
                "id": str(next(self.ids)),
                "name": operation_name,
                "zone": zone_link,
                "operationType": "compute.instances.preempted",
                "targetLink": instance["selfLink"],
                "user": "system",
                "status": "DONE",
                "statusMessage": "Instance was preempted.",
                "progress": 100,
                "insertTime": stamp,
                "startTime": stamp,
                "endTime": stamp,
                "selfLink": f"{zone_link}/operations/{operation_name}",
            }
            if instance.get("id"):
                operation["targetId"] = instance["id"]
            self.operations[(project, operation_name)] = [operation, None, lambda: None]
            if self.backend is not None:
                threading.Thread(target=self._preempt_backend, args=(name,), daemon=True).start()
            else:
                action = scheduling.get("instanceTerminationAction", "STOP")
                self._act((project, zone, name), "delete" if action == "DELETE" else "stop")
            return 200, {"operation": operation_name}

    def _preempt_backend(self, name):
        try:
            self.backend.preempt(name)
        except Exception as error:  # noqa: BLE001 - the daemon's log says it
            print(f"preempting {name} failed: {type(error).__name__}: {error}", file=sys.stderr)

    def instances_snapshot(self):
        with self.lock:
            return {
                f"{p}/{z}/{n}": copy.deepcopy(r) for (p, z, n), r in sorted(self.instances.items())
            }


def checked_scheduling(given, has_gpus):
    """An insert's scheduling with GCE's defaults; ApiError(400) where GCE refuses it: a Spot or
    preemptible VM is not restarted nor migrated, GPUs cannot live-migrate."""
    scheduling = dict(given) if isinstance(given, dict) else {}
    model = scheduling.get("provisioningModel", "STANDARD")
    if model not in ("STANDARD", "SPOT"):
        raise invalid("resource.scheduling.provisioningModel", model, "Must be STANDARD or SPOT.")
    action = scheduling.get("instanceTerminationAction")
    if action is not None and action not in ("STOP", "DELETE"):
        why = "Must be STOP or DELETE."
        raise invalid("resource.scheduling.instanceTerminationAction", action, why)
    if model == "SPOT" or scheduling.get("preemptible"):
        if model == "SPOT":
            scheduling["preemptible"] = True
            scheduling.setdefault("instanceTerminationAction", "STOP")
        scheduling.setdefault("automaticRestart", False)
        scheduling.setdefault("onHostMaintenance", "TERMINATE")
        if scheduling["onHostMaintenance"] != "TERMINATE" or scheduling["automaticRestart"]:
            message = (
                "Invalid value for field 'resource.scheduling.onHostMaintenance': "
                f"'{scheduling['onHostMaintenance']}'. Scheduling must have preemptible be false "
                "when OnHostMaintenance isn't TERMINATE."
            )
            raise ApiError(400, "invalid", message)
    scheduling["provisioningModel"] = model
    scheduling.setdefault("automaticRestart", True)
    scheduling.setdefault("onHostMaintenance", "MIGRATE")
    if has_gpus and scheduling["onHostMaintenance"] != "TERMINATE":
        message = "Instances with guest accelerators do not support live migration."
        raise ApiError(400, "badRequest", message)
    return scheduling


def new_disk(zone_link, instance, index, given):
    """An insert's disk as instances.get answers it: a new disk (initializeParams) gets a source
    named after the instance, as GCE names it."""
    params = given.get("initializeParams") or {}
    boot = bool(given.get("boot", index == 0))
    disk_name = params.get("diskName") or (instance if boot else f"{instance}-{index}")
    disk = {
        "kind": "compute#attachedDisk",
        "type": given.get("type", "PERSISTENT"),
        "mode": given.get("mode", "READ_WRITE"),
        "source": given.get("source") or f"{zone_link}/disks/{disk_name}",
        "deviceName": given.get("deviceName") or f"persistent-disk-{index}",
        "index": index,
        "boot": boot,
        "autoDelete": bool(given.get("autoDelete", bool(params))),
        "interface": given.get("interface", "SCSI"),
        "diskSizeGb": str(params.get("diskSizeGb") or "10"),
    }
    if not str(disk["source"]).startswith("https://"):
        disk["source"] = LINK + link_path(disk["source"])
    return disk


def project_number(project):
    """A stable project number for a project id (the default service account's name)."""
    return int(hashlib.sha256(project.encode()).hexdigest()[:10], 16) % 10**12


def raiser(error):
    """An operation's `apply` that ends it with `error` (a CapacityError)."""

    def apply():
        raise error

    return apply


def link_path(link):
    """A resource link in any accepted form as its path, projects/P/...."""
    link = str(link or "")
    for prefix in (LINK, "https://compute.googleapis.com/compute/v1/"):
        link = link.removeprefix(prefix)
    return link


def link_name(link):
    """The last segment of a link (a zone's or machine type's name), or None."""
    return str(link).rsplit("/", 1)[-1] if link else None


def region_of(zone):
    return zone.rsplit("-", 1)[0]


def operation_scope(project, zone=None, region=None):
    if zone:
        return f"projects/{project}/zones/{zone}"
    if region:
        return f"projects/{project}/regions/{region}"
    return f"projects/{project}/global"


def page_token(start, expression):
    token = json.dumps({"start": start, "filter": expression})
    return base64.urlsafe_b64encode(token.encode()).decode()


def label_fingerprint(labels):
    """A labels map's fingerprint: opaque, base64, changing with the labels (as GCE's)."""
    text = json.dumps(labels, sort_keys=True).encode()
    return base64.b64encode(hashlib.sha256(text).digest()[:8]).decode()


def b64url_decode(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def make_service_account(path, project):
    """A service-account key file for this fake (0600); (client_email, public key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    email = f"hlf-fake@{project}.iam.gserviceaccount.com"
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    account = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": secrets.token_hex(20),
        "private_key": pem,
        "client_email": email,
        "client_id": str(secrets.randbelow(10**21)),
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": TOKEN_URI,
    }
    path.touch(mode=0o600)
    path.write_text(json.dumps(account, indent=2))
    return email, key.public_key()


def cluster_backend(cluster_state):
    """The local cluster's backend (gce_control.py, beside this file; this file also runs as a
    script, outside its package, so the package is found from here)."""
    tools = str(Path(__file__).resolve().parents[1])
    if tools not in sys.path:
        sys.path.insert(0, tools)
    from localcluster import gce_control

    return gce_control.ClusterBackend(cluster_state)


def normalize_network(project, value):
    """A network reference in any of the API's accepted forms, as its www.googleapis.com link."""
    value = str(value)
    for prefix in (
        "https://www.googleapis.com/compute/v1/",
        "https://compute.googleapis.com/compute/v1/",
    ):
        value = value.removeprefix(prefix)
    if value.startswith("global/networks/"):
        value = f"projects/{project}/{value}"
    if not re.fullmatch(r"projects/[^/]+/global/networks/[^/]+", value):
        return None
    return LINK + value


def check_query(query, *names):
    """ApiError(400) for a query parameter the method does not take, as the API's front end
    refuses it before the method runs."""
    for key in sorted(query):
        if key not in STANDARD_QUERY and key not in names:
            message = (
                f'Invalid JSON payload received. Unknown name "{key}": Cannot bind query '
                f"parameter. Field '{key}' could not be found in request message."
            )
            raise ApiError(400, "invalid", message, "INVALID_ARGUMENT")


def check_protocol(field, entry):
    protocol = str(entry.get("IPProtocol", "")).lower()
    if protocol not in PROTOCOLS and not protocol.isdigit():
        raise invalid(f"{field}.IPProtocol", protocol, "Unknown protocol.")
    ports = entry.get("ports") or []
    if ports and protocol not in PORTED:
        raise invalid(f"{field}.ports", ports, "Ports are only valid for tcp, udp and sctp.")
    for port in ports:
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", str(port))
        low, high = (
            (int(match.group(1)), int(match.group(2) or match.group(1))) if match else (1, 0)
        )
        if not 0 <= low <= high <= 65535:
            raise invalid(f"{field}.ports", port, "Must be a port or a port range.")


def parse_filter(expression):
    """A predicate for the list filter subset the fake knows; ApiError(400) for anything else."""
    expression = expression.strip()
    if not expression:
        return lambda rule: True
    regex = re.fullmatch(r'name\s+(eq|ne)\s+"?([^"]*)"?', expression)
    if regex:
        pattern, negate = re.compile(regex.group(2)), regex.group(1) == "ne"
        return lambda rule: bool(pattern.fullmatch(rule["name"])) != negate
    terms = re.split(r"\s+OR\s+", expression)
    names = []
    for term in terms:
        match = re.fullmatch(r'\(?\s*name\s*=\s*"([^"]*)"\s*\)?', term.strip())
        if not match:
            raise invalid("filter", expression, "Invalid list filter expression.")
        names.append(match.group(1))
    return lambda rule: rule["name"] in names


FILTER_TERM = re.compile(r'\s*([A-Za-z_][\w-]*(?:\.[\w-]+)*)\s*(=|!=)\s*("[^"]*"|[^\s"()]+)\s*')


def parse_instance_filter(expression):
    """A predicate for instances.aggregatedList's filter, the subset the fake knows: terms
    FIELD = VALUE or FIELD != VALUE, alone or each in parentheses joined by spaces (AND), AND, or
    OR; ApiError(400) for anything else."""
    text = expression.strip()
    if not text:
        return lambda instance: True
    if "(" not in text:
        terms, joins = [text], []
    else:
        parts = re.split(r"\(([^()]*)\)", text)
        terms, joins = parts[1::2], [p.strip() for p in parts[2:-1:2]]
        if parts[0].strip() or parts[-1].strip() or not set(joins) <= {"", "AND", "OR"}:
            raise invalid("filter", expression, "Invalid list filter expression.")
        if "OR" in joins and set(joins) != {"OR"}:
            raise invalid("filter", expression, "Invalid list filter expression.")
    tests = []
    for term in terms:
        match = FILTER_TERM.fullmatch(term)
        if not match:
            raise invalid("filter", expression, "Invalid list filter expression.")
        field, operator, value = match.groups()
        tests.append((field.split("."), operator == "!=", value.strip('"')))

    def holds(instance, path, negate, value):
        found = instance
        for key in path:
            found = found.get(key) if isinstance(found, dict) else None
        if isinstance(found, bool):
            found = str(found).lower()
        return (found is not None and str(found) == value) != negate

    combine = any if joins and joins[0] == "OR" else all
    return lambda instance: combine(holds(instance, *test) for test in tests)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # Many clients at once (every fork's inventory, a module's polls, 32 VMs' setup): the
    # socketserver default of 5 pending connections refuses some under load, which GCE never does.
    request_queue_size = 128

    def __init__(self, state_dir, token=None, idle=900.0, backend=None):
        import trustme

        self.state_dir = Path(state_dir)
        self.compute = Compute(token or secrets.token_urlsafe(24), backend)
        self.project = backend.project if backend else next(iter(DEFAULT_PROJECTS))
        self.service_account_path = self.state_dir / "service-account.json"
        self.compute.service_account = make_service_account(self.service_account_path, self.project)
        self.compute.client_id = json.loads(self.service_account_path.read_text())["client_id"]
        self.idle = idle
        self.last_request = time.monotonic()
        # The box's CA, kept across restarts (the VMs trust it; gcs_api.py issues from it).
        self.ca_path = self.state_dir / "ca.pem"
        ca_key = self.state_dir / "ca-key.pem"
        if self.ca_path.exists() and ca_key.exists():
            ca = trustme.CA.from_pem(self.ca_path.read_bytes(), ca_key.read_bytes())
        else:
            ca = trustme.CA()
            ca_key.touch(mode=0o600)
            ca_key.write_bytes(ca.private_key_pem.bytes())
            ca.cert_pem.write_to_path(str(self.ca_path))
        self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert(*API_HOSTS, OAUTH_HOST).configure_cert(self.tls)
        super().__init__(("127.0.0.1", 0), ProxyHandler)

    def client_info(self):
        proxy = f"http://127.0.0.1:{self.server_address[1]}"
        env = {
            "HTTPS_PROXY": proxy,
            "https_proxy": proxy,
            "NO_PROXY": "",
            "no_proxy": "",
            "REQUESTS_CA_BUNDLE": str(self.ca_path),
        }
        return {
            "proxy": proxy,
            "control": f"{proxy}/_fake",
            "ca": str(self.ca_path),
            "token": self.compute.token,
            "service_account_file": str(self.service_account_path),
            "project": self.project,
            "pid": os.getpid(),
            "env": env,
        }

    def watch_idle(self):
        if self.idle <= 0:
            return  # no idle timeout
        while time.monotonic() - self.last_request < self.idle:
            time.sleep(min(1.0, self.idle))
        self.shutdown()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30

    def log_message(self, *args):
        pass

    def answer(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")


class ApiHandler(Handler):
    """Requests inside a CONNECT tunnel, after TLS: the Compute Engine API."""

    def handle_one_request(self):
        self.server.last_request = time.monotonic()
        super().handle_one_request()

    def serve(self):
        url = urlsplit(self.path)
        compute = self.server.compute
        if self.headers.get("Host", "").split(":")[0] == OAUTH_HOST:
            return self.token()
        body = self.body()
        if isinstance(body, str):
            status, payload = 400, ApiError(400, "parseError", "Parse Error").body()
        else:
            headers = {"Authorization": self.headers.get("Authorization", "")}
            status, payload = compute.handle(
                self.command, url.path, parse_qs(url.query), headers, body
            )
        operation = payload.get("status") if payload.get("kind") == "compute#operation" else None
        compute.record(
            {
                "time": time.time(),
                "method": self.command,
                "host": self.headers.get("Host", "").split(":")[0],
                "path": url.path,
                "query": parse_qs(url.query),
                "body": body,
                "status": status,
                "response": payload,
                "operation": operation,
                "token_ok": status != 401,
            }
        )
        self.answer(status, payload)

    def token(self):
        length = int(self.headers.get("Content-Length") or 0)
        form = parse_qs(self.rfile.read(length).decode(errors="replace")) if length else {}
        path = urlsplit(self.path).path
        if (self.command, path) == ("POST", "/token"):
            status, payload = self.server.compute.grant(form)
        elif self.command in ("GET", "POST") and path == "/tokeninfo":
            form = {**parse_qs(urlsplit(self.path).query), **form}
            status, payload = self.server.compute.tokeninfo(form)
        else:
            status, payload = 404, {"error": "not_found", "error_description": f"Not Found: {path}"}
        entry = {"time": time.time(), "method": self.command, "host": OAUTH_HOST, "path": path}
        entry.update(grant_type=form.get("grant_type", [""])[0], status=status)
        self.server.compute.record(entry)
        self.answer(status, payload)

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = serve


class ProxyHandler(Handler):
    """The proxy: CONNECT to the API hosts is served here; the control API; nothing forwarded."""

    def handle_one_request(self):
        self.server.last_request = time.monotonic()
        super().handle_one_request()

    def refuse(self, target):
        self.server.compute.record(
            {
                "time": time.time(),
                "method": self.command,
                "host": target,
                "path": self.path,
                "refused": True,
                "status": 403,
            }
        )
        self.answer(403, {"error": f"the fake proxy serves only {', '.join(API_HOSTS)}"})

    def do_CONNECT(self):
        host, _colon, port = self.path.partition(":")
        storage = self.server.compute.storage
        if (host, port) == (STORAGE_HOST, "443") and storage:
            return self.relay(storage)
        if host not in (*API_HOSTS, OAUTH_HOST) or port != "443":
            self.close_connection = True
            return self.refuse(self.path)
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        try:
            tls = self.server.tls.wrap_socket(self.connection, server_side=True)
        except (ssl.SSLError, OSError):
            self.close_connection = True
            return None
        try:
            ApiHandler(tls, self.client_address, self.server)
        except OSError:
            pass  # the client went away
        finally:
            tls.close()
        self.close_connection = True
        return None

    def relay(self, upstream):
        """CONNECT storage.googleapis.com:443: the bytes both ways to the Cloud Storage front on
        loopback, which answers TLS with its certificate from the box's CA."""
        self.close_connection = True
        try:
            remote = socket.create_connection(upstream, timeout=10)
        except OSError:
            return self.answer(502, {"error": f"the Cloud Storage front {upstream} is down"})
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        self.server.compute.record(
            {"time": time.time(), "method": "CONNECT", "host": STORAGE_HOST, "relayed": True}
        )
        pair = {self.connection: remote, remote: self.connection}
        try:
            while True:
                readable, _w, _x = select.select(list(pair), [], [], 300)
                if not readable:
                    return None
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return None
                    pair[sock].sendall(data)
        except OSError:
            return None
        finally:
            remote.close()

    def control(self):
        url = urlsplit(self.path)
        if url.scheme or not url.path.startswith("/_fake/"):
            self.close_connection = True
            return self.refuse(self.path)  # a plain proxy request: never forwarded
        compute, parts = self.server.compute, url.path.split("/")[2:]
        body = self.body() or {}
        route = (self.command, parts[0] if parts else "")
        if route == ("GET", "requests"):
            with compute.lock:
                return self.answer(200, list(compute.log))
        if route == ("GET", "history"):
            with compute.lock:
                return self.answer(200, list(compute.history))
        if route == ("DELETE", "requests"):
            with compute.lock:
                compute.log.clear()
            return self.answer(200, {})
        if route == ("POST", "reset"):
            compute.reset()
            return self.answer(200, {})
        if route == ("POST", "config"):
            compute.configure(body)
            return self.answer(200, {})
        if route == ("GET", "firewalls"):
            return self.answer(200, compute.snapshot())
        if route == ("PUT", "firewalls") and len(parts) == 3:
            return self.answer(
                200, compute.put_firewall(unquote(parts[1]), unquote(parts[2]), body)
            )
        if route == ("GET", "instances"):
            return self.answer(200, compute.instances_snapshot())
        if route == ("POST", "preempt"):
            return self.answer(*compute.preempt(body))
        if route == ("PUT", "instances") and len(parts) == 4:
            names = [unquote(part) for part in parts[1:]]
            return self.answer(200, compute.put_instance(*names, body))
        return self.answer(404, {"error": f"no control route {self.command} {url.path}"})

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = control


# -- the daemon ------------------------------------------------------------------------------


def serve(state_dir, idle, cluster=None):
    state_dir.mkdir(parents=True, exist_ok=True)
    backend = cluster_backend(cluster) if cluster else None
    server = Server(state_dir, idle=idle, backend=backend)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    threading.Thread(target=server.watch_idle, daemon=True).start()
    info = server.client_info()
    tmp = state_dir / "client.json.tmp"
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(state_dir / "client.json")
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        (state_dir / "client.json").unlink(missing_ok=True)


def start(state_dir, idle, cluster=None, wait=20.0):
    state_dir.mkdir(parents=True, exist_ok=True)
    client = state_dir / "client.json"
    client.unlink(missing_ok=True)
    if os.fork() == 0:
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        log = os.open(state_dir / "fake.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.closerange(3, 1024)
        os.chdir("/")
        try:
            serve(state_dir, idle, cluster)
        finally:
            os._exit(0)
    os.wait()
    deadline = time.monotonic() + wait
    while not client.exists():
        if time.monotonic() > deadline:
            sys.exit(f"the fake did not start within {wait} s; see {state_dir / 'fake.log'}")
        time.sleep(0.05)
    print(client.read_text())


def is_fake(pid):
    try:
        return Path(__file__).name in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def stop(state_dir, wait=5.0):
    client = state_dir / "client.json"
    if not client.exists():
        return
    pid = json.loads(client.read_text())["pid"]
    if is_fake(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while is_fake(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if is_fake(pid):
            os.kill(pid, signal.SIGKILL)
    client.unlink(missing_ok=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop", "serve"])
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument(
        "--idle", type=float, default=900.0, help="exit after so long unused (0: never)"
    )
    parser.add_argument(
        "--cluster", type=Path, help="a local cluster's state dir: its VMs are the instances"
    )
    args = parser.parse_args()
    if args.action == "start":
        start(args.state, args.idle, args.cluster)
    elif args.action == "stop":
        stop(args.state)
    else:
        serve(args.state, args.idle, args.cluster)


if __name__ == "__main__":
    main()
