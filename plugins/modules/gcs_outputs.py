#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gcs_outputs
short_description: A training job's checkpoints and outputs on Cloud Storage, from a node
version_added: 0.1.0
description:
  - Runs on a node, under the Python of the venv that the role hostnet.llamafactory.gcs_outputs
    installs (google-cloud-storage), as the VM's service account (its token from the metadata
    server; no key file on the node).
  - The layout under O(uri)/JOB is in C(plugins/module_utils/_gcs_outputs.py) - each node's part
    of a checkpoint with its manifest, C(COMPLETE.json) written last by node 0 once every part
    arrived and matches its manifest, the final outputs with C(MANIFEST.json).
  - O(state=probe) writes, reads back and deletes a small object - the bucket exists and the
    service account may write it - and names the fix (the IAM role, the VM's access scopes)
    when not.
  - O(state=query) lists the job's checkpoints in the bucket.
  - O(state=sync) uploads this node's part of each complete local checkpoint that is not there
    yet (node 0 then marks the checkpoints whose every part arrived).
  - O(state=restore) downloads this node's part of checkpoint O(step) when the node does not
    hold it whole (its disk was replaced or wiped).
  - O(state=output) (node 0, after a successful job) uploads the final outputs and checks the
    bucket's copy against the node's files.
  - Why not M(google.cloud.gcp_storage_object) - it moves one object per task with a key file
    on the machine that runs it; here a checkpoint is many files per node, checked against
    their CRC32C, in parallel, with the VM's own identity.
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  uri:
    description: C(llamafactory_output_uri), gs://BUCKET[/PREFIX].
    type: str
    required: true
  job:
    description: The job's name; its objects are under O(uri)/O(job).
    type: str
    required: true
  state:
    description: What to do (see the description).
    type: str
    choices: [probe, query, sync, restore, output]
    required: true
  output_dir:
    description: The job's output folder on the node (all but O(state=probe) and O(state=query)).
    type: path
  node:
    description: This node's rank.
    type: int
    default: 0
  nodes:
    description: The job's node count (O(state=sync) on node 0).
    type: int
    default: 1
  step:
    description: The checkpoint to restore (O(state=restore)).
    type: int
  workers:
    description: Parallel transfers.
    type: int
    default: 4
attributes:
  check_mode:
    support: full
    description: O(state=probe) and O(state=query) run; the others say what they would move.
  diff_mode:
    support: none
    description: Objects are binary; RV(uploaded) and RV(restored) name them.
  idempotent:
    support: full
    description: An object already in the bucket with the same CRC32C is not sent again; a
      checkpoint the node holds is not downloaded.
"""

EXAMPLES = r"""
- name: Restore this node's part of checkpoint-40 from the bucket
  hostnet.llamafactory.gcs_outputs:
    uri: gs://my-bucket/runs
    job: sft
    state: restore
    output_dir: /var/lib/llamafactory/jobs/sft/output
    node: 1
    step: 40
  vars:
    ansible_python_interpreter: /opt/hostnet-llamafactory/outputs/venv/bin/python
  become: true
"""

RETURN = r"""
uri:
  description: gs://BUCKET/PREFIX/JOB.
  returned: always
  type: str
checkpoints:
  description: Step (a string) to C(complete) and C(nodes) (the node ranks whose part is
    there), for O(state=query) and O(state=sync).
  returned: when state is query or sync
  type: dict
complete:
  description: The steps complete in the bucket, oldest first.
  returned: when state is query or sync
  type: list
  elements: int
local:
  description: The steps of the checkpoints this node holds whole.
  returned: when state is sync or restore
  type: list
  elements: int
uploaded:
  description: Checkpoint steps (O(state=sync)) or file names (O(state=output)) sent.
  returned: when state is sync or output
  type: list
restored:
  description: The number of files downloaded (0 when the node held the checkpoint).
  returned: when state is restore
  type: int
verified:
  description: The bucket's final outputs match the node's files (O(state=output)).
  returned: when state is output
  type: bool
files:
  description: The final outputs' names with size, CRC32C and SHA-256 (O(state=output)).
  returned: when state is output
  type: dict
"""

import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

try:
    from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
        _gcs_outputs as outputs,
    )
    from google.api_core import exceptions as api_exceptions

    IMPORT_ERROR = None
except ImportError:
    IMPORT_ERROR = traceback.format_exc()


def main():
    module = AnsibleModule(
        argument_spec=dict(
            uri=dict(type="str", required=True),
            job=dict(type="str", required=True),
            state=dict(
                type="str", required=True, choices=["probe", "query", "sync", "restore", "output"]
            ),
            output_dir=dict(type="path"),
            node=dict(type="int", default=0),
            nodes=dict(type="int", default=1),
            step=dict(type="int"),
            workers=dict(type="int", default=4),
        ),
        required_if=[
            ("state", "sync", ["output_dir"]),
            ("state", "restore", ["output_dir", "step"]),
            ("state", "output", ["output_dir"]),
        ],
        supports_check_mode=True,
    )
    if IMPORT_ERROR:
        module.fail_json(
            msg=missing_required_lib(
                "google-cloud-storage (the role hostnet.llamafactory.gcs_outputs installs it)"
            ),
            exception=IMPORT_ERROR,
        )
    p = module.params
    state, folder, node = p["state"], p["output_dir"], p["node"]
    try:
        store = outputs.Store(p["uri"], p["job"], workers=p["workers"])
    except ValueError as exc:
        module.fail_json(msg="llamafactory_output_uri: %s" % exc)
    result = {"changed": False, "uri": store.uri}
    try:
        if state == "probe":
            store.probe(node)
        elif state in ("query", "sync"):
            if state == "sync":
                local = outputs.complete_checkpoints(outputs.checkpoint_listing(folder))
                result["local"] = local
                if module.check_mode:
                    result["uploaded"] = []
                else:
                    uploaded, _marked = outputs.sync_checkpoints(
                        store, folder, node, p["nodes"], set()
                    )
                    result.update(uploaded=uploaded, changed=bool(uploaded))
            found = store.checkpoints()
            result["checkpoints"] = dict(("%d" % s, e) for s, e in found.items())
            result["complete"] = sorted(s for s, e in found.items() if e["complete"])
        elif state == "restore":
            local = outputs.complete_checkpoints(outputs.checkpoint_listing(folder))
            result.update(local=local, restored=0)
            if p["step"] not in local:
                result["changed"] = True
                if not module.check_mode:
                    result["restored"] = store.restore_part(folder, p["step"], node)
        elif state == "output":
            if module.check_mode:
                verified, why, manifest = store.verify_output(folder)
                result.update(
                    verified=verified, uploaded=[], files=(manifest or {}).get("files", {})
                )
            else:
                manifest, uploaded = store.upload_output(folder)
                verified, why, _manifest = store.verify_output(folder)
                result.update(
                    verified=verified,
                    uploaded=uploaded,
                    files=manifest["files"],
                    changed=bool(uploaded),
                )
                if not verified:
                    module.fail_json(
                        msg="the final outputs in %s do not match the node's: %s"
                        % (store.uri, why),
                        **result,
                    )
    except outputs.OutputsError as exc:
        module.fail_json(msg=str(exc), **result)
    except api_exceptions.GoogleAPICallError as exc:
        module.fail_json(msg=outputs.refusal(store, state, exc), **result)
    except (IOError, OSError) as exc:
        module.fail_json(msg="%s: %s" % (folder or store.uri, exc), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
