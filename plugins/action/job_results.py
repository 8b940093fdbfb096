# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for hostnet.llamafactory.job_results (see plugins/modules/job_results.py).

Tells the module the checksums of the files the controller already holds, runs it once on the
node, and writes what came back that differs: the files whose content changed and the listing.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import os

from ansible.plugins.action import ActionBase
from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import _results as results

ARGUMENT_SPEC = dict(
    output_dir=dict(type="str", required=True),
    dest=dict(type="path", required=True),
    files=dict(type="list", elements="str", default=[]),
    patterns=dict(type="list", elements="str", default=[]),
    listing=dict(type="str", default=""),
    header=dict(type="str", default=""),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        _valid, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        dest = args["dest"]
        for name in args["files"] + [args["listing"]]:
            if name and (os.path.basename(name) != name or name in (".", "..")):
                result.update(failed=True, msg="%r is not a file name (no folders)" % name)
                return result
        module_args = dict(
            output_dir=args["output_dir"],
            dest=dest,
            files=args["files"],
            patterns=args["patterns"],
            known=results.known_checksums(dest, args["files"]),
        )
        node = self._execute_module(
            module_name="hostnet.llamafactory.job_results",
            module_args=module_args,
            task_vars=task_vars,
        )
        if node.get("failed"):
            node.pop("invocation", None)
            result.update(node)
            return result
        contents = {}
        for name in args["files"]:
            entry = node["files"].get(name)
            if entry and "content" in entry:
                contents[name] = base64.b64decode(entry["content"])
        if args["listing"]:
            text = results.listing_text(args["header"], node["matching"]).encode("utf-8")
            if results.differs(os.path.join(dest, args["listing"]), text):
                contents[args["listing"]] = text
        written = sorted(contents)
        if written and not self._task.check_mode:
            if not os.path.isdir(dest):
                os.makedirs(dest, 0o755)
            for name in written:
                results.write(os.path.join(dest, name), contents[name])
        result.update(
            changed=bool(written),
            written=written,
            matching=node["matching"],
            missing=node["missing"],
            dest=dest,
        )
        return result
