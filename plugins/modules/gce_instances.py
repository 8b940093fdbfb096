#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gce_instances
short_description: Create or delete a training job's group of Compute Engine VMs, zone failover
version_added: 0.1.0
description:
  - V(present) - the group's VMs V(PREFIX-0) .. V(PREFIX-N-1) exist and run, all in one zone,
    each labelled C(llamafactory=training), C(llamafactory-rank=RANK) (what the dynamic inventory
    reads) and C(llamafactory-group=PREFIX) (what marks it as created here).
  - Before creating anything, the region's quotas (regions.get) are compared with what the
    missing VMs need (the machine type's vCPUs and GPUs from machineTypes.get, spot VMs against
    the preemptible GPU quota where the project has one, one external address each); a region
    that cannot hold them is skipped and named, and when none can, nothing is created and the
    quota is named with how to raise it.
  - The VMs of a zone are inserted together; when the zone is out of stock
    (C(ZONE_RESOURCE_POOL_EXHAUSTED)) or a quota refuses one, the VMs just created there are
    deleted and the whole group moves to the next of O(zones); every zone tried is returned with
    Google's error. When every zone failed, nothing is left.
  - A group that exists is kept - re-running creates nothing (changed=false) - and a stopped VM
    of it is started. A VM of the group with another machine type or provisioning model, or a
    group spread over several zones, is named and nothing is changed (never silently replaced).
  - V(absent) deletes the VMs labelled C(llamafactory-group=PREFIX) and the group's placement
    policy; nothing else.
  - Why not C(google.cloud.gcp_compute_instance) - it creates one instance at a time, waits for
    each operation without a deadline, knows no zone failover, quota check, placement policy
    or group, and cannot tell a stock-out from another error. This module uses the same client
    (google.cloud's C(GcpSession) - its authentication options, its token handling).
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  state:
    description: Whether the group exists and runs, or is gone.
    type: str
    choices: [present, absent]
    default: present
  prefix:
    description:
      - The group's name - its VMs are named PREFIX-RANK and labelled
        C(llamafactory-group=PREFIX).
    type: str
    required: true
  count:
    description: How many VMs (ranks 0 .. count-1). Required with O(state=present).
    type: int
  zones:
    description:
      - The zones to try, in order (all VMs land in one of them). With O(state=absent), where to
        look for the placement policy (the VMs are found wherever they are).
    type: list
    elements: str
    required: true
  machine_type:
    description: The machine type (C(g2-standard-8)...). Required with O(state=present).
    type: str
  accelerators:
    description: GPUs attached to an N1 machine type (A, G series have theirs built in).
    type: list
    elements: dict
    default: []
    suboptions:
      type:
        description: The accelerator type (C(nvidia-tesla-t4)...).
        type: str
        required: true
      count:
        description: GPUs per VM.
        type: int
        required: true
  image:
    description: The boot disk's source image (a link or an image family link).
    type: str
    default: projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts
  boot_disk_size_gb:
    description: The boot disk's size.
    type: int
    default: 200
  boot_disk_type:
    description: The boot disk's type.
    type: str
    default: pd-balanced
  network:
    description: nic0's VPC network (a name or a link).
    type: str
    default: default
  subnetwork:
    description: nic0's subnetwork (a name in the zone's region, or a link); the default when empty.
    type: str
    default: ""
  gpu_networks:
    description: The further NICs of a machine type with GPU NICs (A3, A4), in GCP's order.
    type: list
    elements: dict
    default: []
    suboptions:
      network:
        description: The NIC's network.
        type: str
        required: true
      subnetwork:
        description: The NIC's subnetwork.
        type: str
      nic_type:
        description: C(GVNIC), or C(MRDMA) for the RDMA NICs of A3 Ultra and A4.
        type: str
  external_ip:
    description: Whether each VM gets an ephemeral external IP (the controller's way in).
    type: bool
    default: true
  vm_service_account:
    description: The VMs' service account (its e-mail); the default compute account when empty.
    type: str
    default: ""
  vm_scopes:
    description:
      - The VMs' access scopes (their service account's IAM roles decide the rest).
      - O(scopes) are the controller's, for its own calls.
    type: list
    elements: str
    default: [https://www.googleapis.com/auth/cloud-platform]
  provisioning_model:
    description: V(standard), or V(spot) (about a third of the price; GCE may preempt it).
    type: str
    choices: [standard, spot]
    default: standard
  termination_action:
    description: What preemption does to a spot VM - V(stop) it (the disk kept) or V(delete) it.
    type: str
    choices: [stop, delete]
    default: stop
  placement:
    description:
      - V(compact) puts the VMs close together (a placement policy PREFIX-compact in the
        region); V(none) does not.
    type: str
    choices: [none, compact]
    default: none
  reservation:
    description: A specific reservation the VMs consume (its name); none when empty.
    type: str
    default: ""
  labels:
    description: More labels on every VM.
    type: dict
    default: {}
  metadata:
    description: Instance metadata (C(ssh-keys), C(enable-oslogin), ...).
    type: dict
    default: {}
  capacity_retries:
    description:
      - How many times the last zone is tried again after a stock-out (the only zone, for VMs
        missing from a group that exists), with a doubling pause, before the error is named.
    type: int
    default: 0
  capacity_backoff:
    description: Seconds before the first of O(capacity_retries) (then doubled).
    type: float
    default: 30
  timeout:
    description: Seconds each operation, and the wait for every VM to run, may take.
    type: int
    default: 600
  poll_interval:
    description: Seconds between polls.
    type: float
    default: 2
extends_documentation_fragment:
  - google.cloud.gcp
attributes:
  check_mode:
    support: full
    description: Reads the group, quotas and machine type; says what it would create or delete.
  diff_mode:
    support: none
    description: Reports no diff.
  idempotent:
    support: full
    description: A group already as wanted is left alone (changed=false).
notes:
  - IAM - compute.instances.create, .get, .list, .delete, .start, compute.machineTypes.get,
    compute.regions.get, compute.resourcePolicies.create/.get/.delete (with a placement), and
    iam.serviceAccounts.actAs on the VMs' service account (roles/compute.instanceAdmin.v1 and
    roles/iam.serviceAccountUser).
  - A request that meets a connection error is sent again (5 tries, pausing 1, 2, 4, 8 s); each
    write carries its own C(requestId), which Compute Engine uses to ignore a request it has
    already seen, so a retried insert never creates a second VM.
requirements:
  - requests
  - google-auth
"""

EXAMPLES = r"""
- name: Two spot L4 VMs, in the first zone with room
  hostnet.llamafactory.gce_instances:
    prefix: trainer
    count: 2
    zones: [us-central1-a, us-central1-b, us-east4-c]
    machine_type: g2-standard-8
    provisioning_model: spot
    termination_action: delete
    metadata:
      ssh-keys: "me:ssh-ed25519 AAAA... me@laptop"
    project: my-project
    auth_kind: application
  delegate_to: localhost

- name: Delete them
  hostnet.llamafactory.gce_instances:
    prefix: trainer
    state: absent
    zones: [us-central1-a, us-central1-b, us-east4-c]
    project: my-project
    auth_kind: application
  delegate_to: localhost
"""

RETURN = r"""
zone:
  description: The zone holding the group (empty when it does not exist).
  returned: always
  type: str
  sample: us-central1-b
instances:
  description: The group's VMs at the end, by rank.
  returned: always
  type: list
  elements: dict
  sample: [{name: trainer-0, zone: us-central1-b, status: RUNNING, rank: 0,
            machine_type: g2-standard-8, internal_ip: 10.128.0.5, external_ip: 34.1.2.3,
            provisioning_model: SPOT}]
zones_tried:
  description: Each zone left for another, with Google's error.
  returned: always
  type: list
  elements: dict
  sample: [{zone: us-central1-a, reason: capacity, error: "ZONE_RESOURCE_POOL_EXHAUSTED: ..."}]
created:
  description: The VMs created (or, in check mode, that would be).
  returned: always
  type: list
  elements: str
deleted:
  description: The VMs deleted (or, in check mode, that would be).
  returned: always
  type: list
  elements: str
started_vms:
  description: Stopped VMs of the group that were started (not C(started), which Ansible's async
    protocol reserves).
  returned: always
  type: list
  elements: str
"""

import time

from ansible_collections.google.cloud.plugins.module_utils.gcp_utils import (
    GcpModule,
    GcpSession,
)
from ansible_collections.hostnet.llamafactory.plugins.module_utils import _gce_instances as grp
from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
    _gce_request as gce_request,
)


class ApiRefused(Exception):
    def __init__(self, status, code, message):
        Exception.__init__(self, message)
        self.status, self.code, self.message = status, code, message


class Group(object):
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.project = self.params["project"]
        self.session = GcpSession(module, "compute")
        self.timeout = self.params["timeout"]
        self.poll = self.params["poll_interval"]

    # -- the API --------------------------------------------------------------------------

    def url(self, path):
        return "%sprojects/%s/%s" % (grp.API, self.project, path)

    def answer(self, response, doing):
        try:
            body = response.json()
        except ValueError:
            body = {"error": {"message": response.text[:500]}}
        if response.status_code >= 400:
            error = body.get("error") or {}
            reasons = [e.get("reason", "") for e in error.get("errors") or []]
            raise ApiRefused(
                response.status_code,
                reasons[0] if reasons else "",
                "the Compute Engine API refused %s: %s %s"
                % (doing, response.status_code, error.get("message", body)),
            )
        return body

    def send(self, method, url, params=None, body=None):
        """One request, tried again on a connection error (module_utils/_gce_request.py): a
        group's creation makes many, and the API or the network between may drop one."""
        return gce_request.send(
            self.session, lambda msg: self.module.fail_json(msg=msg), method, url, params, body
        )

    def get(self, path, doing):
        response = self.send("GET", self.url(path))
        if response.status_code == 404:
            return None
        return self.answer(response, doing)

    def wait(self, operations, doing):
        """Poll operations until every one is DONE: {name: [(code, message)]} of their errors."""
        deadline = time.time() + self.timeout
        pending = dict((op["name"], op) for op in operations)
        errors = {}
        while pending:
            for name, operation in list(pending.items()):
                if operation.get("status") == "DONE":
                    found = (operation.get("error") or {}).get("errors") or []
                    errors[name] = [(e.get("code", ""), e.get("message", "")) for e in found]
                    del pending[name]
            if not pending:
                break
            if time.time() > deadline:
                self.module.fail_json(
                    msg="%s: operations %s not DONE after %d s (gcp_instances_timeout)"
                    % (doing, ", ".join(sorted(pending)), self.timeout)
                )
            time.sleep(self.poll)
            for name, operation in list(pending.items()):
                response = self.send("GET", operation["selfLink"])
                pending[name] = self.answer(response, "reading operation %s" % name)
        return errors

    def group(self):
        """The instances labelled as the group's own, in any zone (aggregatedList)."""
        found, token = [], None
        query = {"filter": 'labels.%s = "%s"' % (grp.GROUP_LABEL, self.params["prefix"])}
        while True:
            if token:
                query["pageToken"] = token
            response = self.send("GET", self.url("aggregated/instances"), params=query)
            body = self.answer(response, "listing the group's instances")
            for scoped in (body.get("items") or {}).values():
                found.extend(scoped.get("instances") or [])
            token = body.get("nextPageToken")
            if not token:
                return sorted(found, key=lambda i: i["name"])

    # -- present ----------------------------------------------------------------------------

    def present(self):
        params = self.params
        prefix, count, machine_type = params["prefix"], params["count"], params["machine_type"]
        if not count or count < 1 or not machine_type:
            self.module.fail_json(msg="state=present needs count (1 or more) and machine_type")
        model = params["provisioning_model"]
        found = grp.group_as_found(self.group(), prefix, count, machine_type, model)
        if found["mismatched"]:
            self.module.fail_json(
                msg="the group %s exists otherwise (%s; wanted %s, %s): nothing changed. "
                "Delete it (playbooks/down.yml), or set gcp_vms_machine_type and "
                "gcp_vms_provisioning_model to what it is"
                % (prefix, ", ".join(found["mismatched"]), machine_type, model)
            )
        if len(found["zones"]) > 1:
            self.module.fail_json(
                msg="the group %s is spread over zones %s; a job's VMs must share one zone: "
                "delete it (playbooks/down.yml) and create it again"
                % (prefix, ", ".join(found["zones"]))
            )
        result = {"created": [], "deleted": [], "started_vms": [], "zones_tried": []}
        if found["extra"]:
            self.module.warn(
                "VMs of the group beyond its %d ranks are left alone: %s"
                % (count, ", ".join(found["extra"]))
            )
        zone = found["zone"]
        if found["missing"]:
            zones = [zone] if zone else [grp.short(z) for z in params["zones"]]
            zone = self.create(found["missing"], zones, result)
        stopped = [
            n
            for n, i in sorted(found["present"].items())
            if i.get("status") in ("TERMINATED", "STOPPED")
        ]
        if stopped and not self.module.check_mode:
            operations = []
            for name in stopped:
                response = self.send(
                    "POST", self.url("zones/%s/instances/%s/start" % (zone, name)), body={}
                )
                operations.append(self.answer(response, "starting %s" % name))
            errors = self.wait(operations, "starting the group's stopped VMs")
            failed = ["%s" % e for e in errors.values() if e]
            if failed:
                self.module.fail_json(msg="starting %s failed: %s" % (", ".join(stopped), failed))
        result["started_vms"] = stopped
        instances = []
        if not self.module.check_mode and zone:
            instances = self.settle(zone, grp.vm_names(prefix, count))
        elif zone:
            instances = [grp.summary(i) for _n, i in sorted(found["present"].items())]
        changed = bool(result["created"] or result["started_vms"])
        self.module.exit_json(changed=changed, zone=zone or "", instances=instances, **result)

    def create(self, names, zones, result):
        """Create `names` in the first zone of `zones` with room: that zone."""
        params = self.params
        left = []
        checked = {}  # region -> quota shortfall message or None
        candidates = []
        for zone in zones:
            machine = self.get(
                "zones/%s/machineTypes/%s" % (zone, params["machine_type"]),
                "reading the machine type",
            )
            if machine is None:
                left.append(
                    {
                        "zone": zone,
                        "reason": "machine type",
                        "error": "%s is not offered in %s" % (params["machine_type"], zone),
                    }
                )
                continue
            region = grp.region_of(zone)
            if region not in checked:
                checked[region] = self.quota_check(region, machine, len(names))
            if checked[region]:
                left.append({"zone": zone, "reason": "quota", "error": checked[region]})
                continue
            candidates.append((zone, machine))
        if not candidates:
            result["zones_tried"] = left
            quota = [z["error"] for z in left if z["reason"] == "quota"]
            self.module.fail_json(
                msg="no VM created: %s"
                % "; ".join(
                    sorted(set(quota)) or ["%s: %s" % (z["zone"], z["error"]) for z in left]
                ),
                zones_tried=left,
            )
        if self.module.check_mode:
            result["created"] = list(names)
            result["zones_tried"] = left
            return candidates[0][0]
        # The last zone (the only one, for VMs missing from a group that exists - a preempted
        # VM) is tried again on a stock-out, with a doubling pause: capacity often comes back.
        retries, pause = params["capacity_retries"], params["capacity_backoff"]
        for index, (zone, machine) in enumerate(candidates):
            has_gpus = bool(machine.get("accelerators") or params["accelerators"])
            policy = self.placement(zone) if params["placement"] == "compact" else None
            while True:
                failure = self.insert_all(zone, names, has_gpus, policy)
                if failure is None:
                    result["created"] = list(names)
                    result["zones_tried"] = left
                    return zone
                left.append(dict(zone=zone, **failure))
                last = index == len(candidates) - 1
                if not (last and failure["reason"] == "capacity" and retries > 0):
                    break
                retries -= 1
                time.sleep(pause)
                pause *= 2
        result["zones_tried"] = left
        self.module.fail_json(
            msg="no zone had room for the group (nothing is left in any of them; each zone tried "
            "once, the last one 1 + capacity_retries times): %s"
            % "; ".join("%s: %s" % (z["zone"], z["error"]) for z in left),
            zones_tried=left,
        )

    def quota_check(self, region, machine, count):
        """None, or the message naming the region's quotas the group does not fit in."""
        info = self.get("regions/%s" % region, "reading region %s's quotas" % region)
        if info is None:
            return "region %s does not exist" % region
        quotas = info.get("quotas") or []
        listed = dict((q.get("metric"), float(q.get("limit", 0))) for q in quotas)
        needs = grp.quota_needs(
            machine,
            count,
            self.params["provisioning_model"] == "spot",
            self.params["accelerators"],
            listed,
            self.params["external_ip"],
        )
        short_of = grp.shortfalls(quotas, needs)
        return grp.quota_message(self.project, region, short_of) if short_of else None

    def placement(self, zone):
        region = grp.region_of(zone)
        name = "%s-compact" % self.params["prefix"]
        path = "regions/%s/resourcePolicies/%s" % (region, name)
        if self.get(path, "reading the placement policy") is None:
            body = grp.placement_policy_body(name, self.params["count"])
            response = self.send(
                "POST", self.url("regions/%s/resourcePolicies" % region), body=body
            )
            operation = self.answer(response, "creating the placement policy %s" % name)
            errors = self.wait([operation], "creating the placement policy")
            if errors.get(operation["name"]):
                self.module.fail_json(
                    msg="creating the placement policy %s failed: %s" % (name, errors)
                )
        return self.url(path)

    def insert_all(self, zone, names, has_gpus, policy):
        """Insert every VM in `zone`: None when all were created, else the zone's failure
        {reason, error} once the VMs created there are deleted again."""
        params = dict(self.params)
        operations, created, failure, fatal = [], [], None, None
        for name in names:
            rank = grp.rank_of(params["prefix"], name)
            body = grp.instance_body(params, name, rank, zone, has_gpus, policy)
            response = self.send("POST", self.url("zones/%s/instances" % zone), body=body)
            try:
                operation = self.answer(response, "creating %s in %s" % (name, zone))
            except ApiRefused as refused:
                kind = grp.zone_failure([(refused.code, refused.message)])
                if refused.code == "quotaExceeded":
                    kind = "quota"
                if kind:
                    failure = {"reason": kind, "error": refused.message}
                else:
                    fatal = refused.message
                break
            operation["_vm"] = name
            operations.append(operation)
        errors = self.wait(operations, "creating the group in %s" % zone) if operations else {}
        for operation in operations:
            found = errors.get(operation["name"]) or []
            if not found:
                created.append(operation["_vm"])
                continue
            kind = grp.zone_failure(found)
            text = "; ".join("%s: %s" % pair for pair in found)
            if kind and failure is None:
                failure = {"reason": kind, "error": text}
            elif not kind and fatal is None:
                fatal = "%s: %s" % (operation["_vm"], text)
        if failure is None and fatal is None:
            return None
        self.delete(zone, created)
        if fatal:
            self.module.fail_json(
                msg="creating the group in %s failed (the VMs created there are deleted again): %s"
                % (zone, fatal)
            )
        return failure

    def settle(self, zone, names):
        """Every VM RUNNING (within the timeout): their summaries."""
        deadline = time.time() + self.timeout
        while True:
            instances = [
                self.get("zones/%s/instances/%s" % (zone, n), "reading %s" % n) for n in names
            ]
            missing = [names[k] for k, i in enumerate(instances) if i is None]
            if missing:
                self.module.fail_json(
                    msg="%s vanished after creation (preempted?)" % ", ".join(missing)
                )
            waiting = [
                "%s %s" % (i["name"], i.get("status"))
                for i in instances
                if i.get("status") != "RUNNING"
            ]
            if not waiting:
                return [grp.summary(i) for i in instances]
            if time.time() > deadline:
                self.module.fail_json(
                    msg="not RUNNING after %d s (gcp_instances_timeout): %s"
                    % (self.timeout, ", ".join(waiting))
                )
            time.sleep(self.poll)

    # -- absent -----------------------------------------------------------------------------

    def delete(self, zone, names):
        operations = []
        for name in names:
            response = self.send("DELETE", self.url("zones/%s/instances/%s" % (zone, name)))
            if response.status_code == 404:
                continue
            operations.append(self.answer(response, "deleting %s" % name))
        errors = self.wait(operations, "deleting %s" % ", ".join(names)) if operations else {}
        failed = dict((n, e) for n, e in errors.items() if e)
        if failed:
            self.module.fail_json(msg="deleting %s failed: %s" % (", ".join(names), failed))

    def absent(self):
        prefix = self.params["prefix"]
        instances = self.group()
        by_zone = {}
        for instance in instances:
            by_zone.setdefault(grp.short(instance["zone"]), []).append(instance["name"])
        regions = sorted(set(grp.region_of(z) for z in list(self.params["zones"]) + list(by_zone)))
        policies = []
        for region in regions:
            path = "regions/%s/resourcePolicies/%s-compact" % (region, prefix)
            if self.get(path, "reading the placement policy") is not None:
                policies.append(path)
        deleted = sorted(i["name"] for i in instances)
        if not self.module.check_mode:
            for zone, names in sorted(by_zone.items()):
                self.delete(zone, names)
            for path in policies:
                response = self.send("DELETE", self.url(path))
                if response.status_code != 404:
                    operation = self.answer(response, "deleting %s" % path)
                    self.wait([operation], "deleting the placement policy")
        self.module.exit_json(
            changed=bool(deleted or policies),
            zone="",
            instances=[],
            created=[],
            started_vms=[],
            deleted=deleted,
            zones_tried=[],
            placement_policies_deleted=[grp.short(p) for p in policies],
        )


def main():
    module = GcpModule(
        argument_spec=dict(
            state=dict(type="str", default="present", choices=["present", "absent"]),
            prefix=dict(type="str", required=True),
            count=dict(type="int"),
            zones=dict(type="list", elements="str", required=True),
            machine_type=dict(type="str"),
            accelerators=dict(
                type="list",
                elements="dict",
                default=[],
                options=dict(
                    type=dict(type="str", required=True), count=dict(type="int", required=True)
                ),
            ),
            image=dict(
                type="str", default="projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
            ),
            boot_disk_size_gb=dict(type="int", default=200),
            boot_disk_type=dict(type="str", default="pd-balanced"),
            network=dict(type="str", default="default"),
            subnetwork=dict(type="str", default=""),
            gpu_networks=dict(
                type="list",
                elements="dict",
                default=[],
                options=dict(
                    network=dict(type="str", required=True),
                    subnetwork=dict(type="str"),
                    nic_type=dict(type="str"),
                ),
            ),
            external_ip=dict(type="bool", default=True),
            vm_service_account=dict(type="str", default=""),
            vm_scopes=dict(type="list", elements="str", default=[grp.SCOPE_CLOUD_PLATFORM]),
            provisioning_model=dict(type="str", default="standard", choices=["standard", "spot"]),
            termination_action=dict(type="str", default="stop", choices=["stop", "delete"]),
            placement=dict(type="str", default="none", choices=["none", "compact"]),
            reservation=dict(type="str", default=""),
            labels=dict(type="dict", default={}),
            metadata=dict(type="dict", default={}),
            timeout=dict(type="int", default=600),
            poll_interval=dict(type="float", default=2),
            capacity_retries=dict(type="int", default=0),
            capacity_backoff=dict(type="float", default=30),
        ),
        supports_check_mode=True,
    )
    if not module.params["zones"]:
        module.fail_json(msg="zones is empty: name at least one zone")
    if module.params["state"] == "present":
        problem = grp.gpu_networks_problem(
            module.params["machine_type"], module.params["gpu_networks"]
        )
        if problem:
            module.fail_json(msg=problem)
    group = Group(module)
    try:
        if module.params["state"] == "absent":
            group.absent()
        else:
            group.present()
    except ApiRefused as refused:
        module.fail_json(msg=refused.message)


if __name__ == "__main__":
    main()
