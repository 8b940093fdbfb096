#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gce_instance
short_description: Start, stop, delete or label a Compute Engine instance, with bounded waits
version_added: 0.1.0
description:
  - Reads one instance through the Compute Engine API and brings it to O(state) - V(running)
    (instances.start, or resume for a suspended one), V(stopped) (instances.stop), V(absent)
    (instances.delete) or V(present) (read only) - and merges O(labels) into its labels
    (instances.setLabels with the label fingerprint).
  - Every operation is polled until DONE within O(timeout) seconds, and the instance until its
    status settles. A start refused for capacity (V(ZONE_RESOURCE_POOL_EXHAUSTED)) is retried
    O(capacity_retries) times with a doubling pause, then the error is named.
  - V(absent) refuses an instance that lacks any of O(require_labels) - the collection deletes
    only VMs it labelled as a job's own.
  - Why not C(google.cloud.gcp_compute_instance) - it manages an instance from its whole
    definition (machine type, disks, networks) and cannot stop, start or delete an instance by
    name alone, and it waits for operations without a deadline. This module uses the same
    client (google.cloud's C(GcpSession) - its authentication options, its token handling).
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  name:
    description: The instance's name.
    type: str
    required: true
  zone:
    description: The instance's zone (its name, or its URL as the gcp_compute inventory gives it).
    type: str
    required: true
  state:
    description: What the instance must be.
    type: str
    choices: [running, stopped, absent, present]
    default: present
  labels:
    description: Labels merged into the instance's (others kept).
    type: dict
    default: {}
  require_labels:
    description: With O(state=absent), labels the instance must carry, else nothing is deleted.
    type: dict
    default: {}
  allow_absent:
    description:
      - With O(state=present), an instance that does not exist (a spot VM deleted by its
        preemption) returns V(absent) as its status instead of failing.
    type: bool
    default: false
  timeout:
    description: Seconds each operation, and each wait for the instance's status, may take.
    type: int
    default: 600
  capacity_retries:
    description: How many times a start refused for capacity is tried again.
    type: int
    default: 3
  capacity_backoff:
    description: Seconds before the first retry of a start refused for capacity (then doubled).
    type: float
    default: 30
  poll_interval:
    description: Seconds between polls of an operation or of the instance.
    type: float
    default: 2
extends_documentation_fragment:
  - google.cloud.gcp
attributes:
  check_mode:
    support: full
    description: Reads the instance and says what it would do.
  diff_mode:
    support: none
    description: Reports no diff.
  idempotent:
    support: full
    description: An instance already as wanted is left alone (changed=false).
notes:
  - IAM - compute.instances.get, and compute.instances.start, .stop, .delete, .setLabels for the
    calls it makes (roles/compute.instanceAdmin.v1 holds them all).
  - A request that meets a connection error is sent again (5 tries, pausing 1, 2, 4, 8 s); each
    write carries its own C(requestId), which Compute Engine uses to ignore a request it has
    already seen, so a retried stop or delete is not applied twice.
requirements:
  - requests
  - google-auth
"""

EXAMPLES = r"""
- name: Stop the VM once the results are on the controller
  hostnet.llamafactory.gce_instance:
    name: trainer-0
    zone: us-central1-a
    project: my-project
    auth_kind: application
    state: stopped
  delegate_to: localhost

- name: Delete it, only if it is the job's own
  hostnet.llamafactory.gce_instance:
    name: trainer-0
    zone: us-central1-a
    project: my-project
    auth_kind: application
    state: absent
    require_labels: {llamafactory-job: demo}
  delegate_to: localhost
"""

RETURN = r"""
status:
  description: The instance's status at the end (V(absent) when it does not exist).
  returned: always
  type: str
  sample: TERMINATED
status_before:
  description: The instance's status before (V(absent) when it did not exist).
  returned: always
  type: str
  sample: RUNNING
labels:
  description: The instance's labels at the end.
  returned: always
  type: dict
  sample: {llamafactory-job: demo}
scheduling:
  description: The instance's scheduling (preemptible, provisioningModel - spot VMs say SPOT).
  returned: when the instance exists
  type: dict
  sample: {provisioningModel: SPOT, preemptible: true}
actions:
  description: The API calls made (or, in check mode, that would be).
  returned: always
  type: list
  elements: str
  sample: [setLabels, stop]
preempted:
  description:
    - With O(state=present) and an instance that is not running - the time of its latest
      preemption in the zone's operation log (operationType compute.instances.preempted), or
      null when none is there.
  returned: always
  type: str
  sample: "2026-12-04T10:01:02.345-08:00"
capacity_retries:
  description: Starts refused for capacity before the one that worked.
  returned: always
  type: int
  sample: 0
"""

import time

from ansible_collections.google.cloud.plugins.module_utils.gcp_utils import (
    GcpModule,
    GcpSession,
)
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _gce_instance as gce
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _gce_request as gce_request,
)


class Instance(object):
    def __init__(self, module):
        self.module = module
        params = module.params
        self.project = params["project"]
        self.zone = gce.short_zone(params["zone"])
        self.name = params["name"]
        self.session = GcpSession(module, "compute")
        self.deadline_s = params["timeout"]
        self.poll = params["poll_interval"]

    def url(self, verb=None):
        return gce.instance_url(self.project, self.zone, self.name, verb)

    def send(self, method, url, params=None, body=None):
        """One request, tried again on a connection error (module_utils/_gce_request.py)."""
        return gce_request.send(self.session, self.fail, method, url, params, body)

    def fail(self, msg, **extra):
        where = "%s/%s/%s" % (self.project, self.zone, self.name)
        self.module.fail_json(msg="%s: %s" % (where, msg), **extra)

    def get(self):
        response = self.send("GET", self.url())
        if response.status_code == 404:
            return None
        return self._json(response, "reading the instance")

    def _json(self, response, doing):
        try:
            body = response.json()
        except ValueError:
            body = {"error": {"message": response.text[:500]}}
        if response.status_code >= 400:
            error = body.get("error") or {}
            self.fail(
                "the Compute Engine API refused %s: %s %s"
                % (doing, response.status_code, error.get("message", body))
            )
        return body

    def call(self, verb, body=None):
        """POST instances/NAME/VERB (or DELETE), then wait for its operation: its errors."""
        if verb == "delete":
            response = self.send("DELETE", self.url())
        else:
            response = self.send("POST", self.url(verb), body=body or {})
        operation = self._json(response, verb)
        deadline = time.time() + self.deadline_s
        while operation.get("status") != "DONE":
            if time.time() > deadline:
                self.fail(
                    "%s did not finish in %d s (timeout); operation %s"
                    % (verb, self.deadline_s, operation.get("name"))
                )
            time.sleep(self.poll)
            link = operation.get("selfLink") or "%sprojects/%s/zones/%s/operations/%s" % (
                gce.API,
                self.project,
                self.zone,
                operation.get("name"),
            )
            operation = self._json(self.send("GET", link), "reading operation %s" % verb)
        return gce.operation_errors(operation)

    def preempted(self):
        """The insertTime of the instance's latest preemption (zoneOperations.list), or None."""
        url = "%sprojects/%s/zones/%s/operations" % (gce.API, self.project, self.zone)
        query = {"filter": 'operationType = "compute.instances.preempted"'}
        response = self.send("GET", url, params=query)
        if response.status_code >= 400:  # the cause stays unnamed, the status says enough
            return None
        return gce.latest_preemption(response.json().get("items") or [], self.name)

    def settle(self, state):
        """The instance once its status no longer moves (within the timeout)."""
        deadline = time.time() + self.deadline_s
        while True:
            instance = self.get()
            status = instance.get("status") if instance else None
            if status not in gce.MOVING:
                return instance
            if time.time() > deadline:
                self.fail("still %s after %d s (timeout)" % (status, self.deadline_s))
            time.sleep(self.poll)


def main():
    module = GcpModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            zone=dict(type="str", required=True),
            state=dict(
                type="str", default="present", choices=["running", "stopped", "absent", "present"]
            ),
            labels=dict(type="dict", default={}),
            require_labels=dict(type="dict", default={}),
            timeout=dict(type="int", default=600),
            capacity_retries=dict(type="int", default=3),
            capacity_backoff=dict(type="float", default=30),
            poll_interval=dict(type="float", default=2),
            allow_absent=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    params = module.params
    target = Instance(module)
    instance = target.get()
    before = instance.get("status") if instance else None
    actions, retries = [], 0
    if instance is None and params["state"] == "present" and params["allow_absent"]:
        module.exit_json(
            changed=False,
            status="absent",
            status_before="absent",
            labels={},
            scheduling={},
            actions=[],
            capacity_retries=0,
            preempted=target.preempted(),
        )
    if instance is None and params["state"] != "absent":
        target.fail("no such instance (its name, zone or project is wrong, or it was deleted)")
    if params["state"] == "absent" and instance is not None:
        foreign = gce.foreign_labels(instance.get("labels"), params["require_labels"])
        if foreign:
            target.fail(
                "not deleted: it lacks the labels that make it this job's own (%s); the "
                "collection deletes only VMs it labelled at launch" % ", ".join(foreign)
            )
    wanted = dict((k, str(v)) for k, v in (params["labels"] or {}).items())
    if instance is not None and params["state"] != "absent" and wanted:
        labels = instance.get("labels") or {}
        if any(labels.get(k) != v for k, v in wanted.items()):
            actions.append("setLabels")
            if not module.check_mode:
                merged = dict(labels, **wanted)
                body = {"labels": merged, "labelFingerprint": instance.get("labelFingerprint")}
                errors = target.call("setLabels", body)
                if errors:
                    target.fail("setLabels failed: %s" % errors)
    if instance is not None and params["state"] in ("running", "stopped"):
        instance = target.settle(params["state"]) if not module.check_mode else instance
    status = instance.get("status") if instance else None
    verb, done = gce.next_call(params["state"], status)
    if not done and verb:
        actions.append(verb)
        if not module.check_mode:
            pause = params["capacity_backoff"]
            while True:
                errors = target.call(verb)
                if not errors:
                    break
                if verb in ("start", "resume") and gce.is_capacity_error(errors):
                    if retries < params["capacity_retries"]:
                        retries += 1
                        time.sleep(pause)
                        pause *= 2
                        continue
                    target.fail(
                        "%s refused for capacity %d times (%s): the zone has no room for this "
                        "machine type now; try later, another zone, or a reservation"
                        % (verb, retries + 1, errors[0][1] or errors[0][0]),
                        capacity_retries=retries,
                    )
                target.fail("%s failed: %s" % (verb, errors))
    final = None
    if not module.check_mode and actions:
        final = target.settle(params["state"]) if params["state"] != "absent" else target.get()
    else:
        final = instance
    module.exit_json(
        changed=bool(actions),
        status=(final or {}).get("status", "absent"),
        status_before=before or "absent",
        labels=(final or {}).get("labels") or {},
        scheduling=(final or {}).get("scheduling") or {},
        actions=actions,
        preempted=(
            target.preempted()
            if params["state"] == "present" and before not in (None, "RUNNING")
            else None
        ),
        capacity_retries=retries,
    )


if __name__ == "__main__":
    main()
