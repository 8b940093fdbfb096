# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the gce_instance module does to one Compute Engine instance (private): the call a wanted
state needs from the instance's status, and the operation errors that are worth a retry. Pure
functions, unit-tested; the module makes the calls (google.cloud's GcpSession).

Statuses: https://cloud.google.com/compute/docs/instances/instance-life-cycle
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

API = "https://compute.googleapis.com/compute/v1/"

RUNNING = ("RUNNING",)
STOPPED = ("TERMINATED", "STOPPED")
# On the way to a status: wait for it to settle before acting.
MOVING = ("PROVISIONING", "STAGING", "STOPPING", "SUSPENDING", "REPAIRING")
# A start refused for these is retried (with a backoff), then named.
CAPACITY_ERRORS = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS")


def instance_url(project, zone, name, verb=None):
    url = "%sprojects/%s/zones/%s/instances/%s" % (API, project, zone, name)
    return url + "/" + verb if verb else url


def short_zone(zone):
    """'us-central1-a' from a zone's name or its URL (as the gcp_compute inventory gives it)."""
    return (zone or "").rstrip("/").rsplit("/", 1)[-1]


def next_call(state, status):
    """(call, done): the API call the wanted `state` needs now (None: nothing, or wait while
    the instance moves), and whether the instance is already as wanted. `status` is None when
    the instance does not exist."""
    if state == "absent":
        return (None, True) if status is None else ("delete", False)
    if status is None:
        raise ValueError("the instance does not exist")
    if state == "running":
        if status in RUNNING:
            return None, True
        if status == "SUSPENDED":
            return "resume", False
        if status in STOPPED:
            return "start", False
        return None, False  # moving: wait
    if state == "stopped":
        if status in STOPPED:
            return None, True
        if status in RUNNING or status == "SUSPENDED":
            return "stop", False
        return None, False
    return None, True  # present: read only


def operation_errors(operation):
    """[(code, message)] of a DONE operation's errors."""
    errors = ((operation or {}).get("error") or {}).get("errors") or []
    return [(e.get("code", ""), e.get("message", "")) for e in errors]


def is_capacity_error(errors):
    return any(code in CAPACITY_ERRORS for code, _message in errors)


def foreign_labels(labels, required):
    """The labels of `required` the instance lacks or holds with another value, as text."""
    labels = labels or {}
    return [
        "%s=%s (has %s)" % (key, value, labels.get(key, "none"))
        for key, value in sorted((required or {}).items())
        if labels.get(key) != value
    ]


def latest_preemption(operations, name):
    """The insertTime of the latest compute.instances.preempted operation on instance `name`
    (zoneOperations.list's items), or None."""
    times = [
        op.get("insertTime") or ""
        for op in operations
        if op.get("operationType") == "compute.instances.preempted"
        and (op.get("targetLink") or "").rstrip("/").rsplit("/", 1)[-1] == name
    ]
    return max(times) if times else None
