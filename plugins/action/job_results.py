# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin for hostnet.llamafactory.job_results (see plugins/modules/job_results.py).

Tells the module the checksums of the files the controller already holds, runs it once on the
node, and writes what came back that differs; the model's files that did not fit in that call
come in pieces, and each is checked against the node's SHA-256 before it replaces the copy there.
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
    model_dir=dict(type="str", default=""),
    model_max_mb=dict(type="float", default=2048),
    model_fetch=dict(type="bool", default=True),
    record=dict(type="dict"),
    record_path=dict(type="path"),
)
PIECE = 32 * 1024 * 1024  # per module call: base64 makes it 43 MB of JSON


def _plain_name(name):
    return bool(name) and os.path.basename(name) == name and name not in (".", "..")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        _valid, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        dest = args["dest"]
        for name in args["files"] + ([args["model_dir"]] if args["model_dir"] else []):
            if not _plain_name(name):
                result.update(failed=True, msg="%r is not a file name (no folders)" % name)
                return result
        model_path = os.path.join(dest, args["model_dir"]) if args["model_dir"] else None
        model_known = results.folder_checksums(model_path) if model_path else {}
        fetch = args["model_fetch"] and not self._task.check_mode
        node = self._node(
            task_vars,
            output_dir=args["output_dir"],
            dest=dest,
            files=args["files"],
            known=results.known_checksums(dest, args["files"]),
            model_dir=args["model_dir"],
            model_max_mb=args["model_max_mb"],
            model_fetch=args["model_fetch"],
            model_known=model_known,
            inline_bytes=PIECE if fetch else 0,
            **dict((k, args[k]) for k in ("record", "record_path") if args[k] is not None),
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
        written = sorted(contents)
        if written and not self._task.check_mode:
            self._folder(dest)
            for name in written:
                results.write(os.path.join(dest, name), contents[name])
        model = {}
        if model_path:
            try:
                model = self._model(task_vars, args, node["model"], model_path, model_known, fetch)
            except (OSError, ValueError) as exc:
                result.update(failed=True, msg="the model did not reach %s: %s" % (model_path, exc))
                return result
        result.update(
            changed=bool(written or model.get("fetched") or node.get("recorded")),
            written=written,
            missing=node["missing"],
            dest=dest,
            model=model,
            recorded=bool(node.get("recorded")),
        )
        return result

    def _node(self, task_vars, **module_args):
        return self._execute_module(
            module_name="hostnet.llamafactory.job_results",
            module_args=module_args,
            task_vars=task_vars,
        )

    @staticmethod
    def _folder(path):
        if not os.path.isdir(path):
            os.makedirs(path, 0o755)

    def _model(self, task_vars, args, described, path, known, fetch):
        """Bring the model's files that differ (fetch) or only compare them; then SHA256SUMS."""
        files = described["files"]
        for entry in files:
            if not _plain_name(entry["name"]) or entry["name"] == results.SUMS:
                raise ValueError("the node's output folder holds a file named %r" % entry["name"])
        model = {
            "path": path,
            "files": [dict((k, v) for k, v in f.items() if k != "content") for f in files],
            "size": described["size"],
            "over_limit": not described["checksummed"],
            "max_mb": args["model_max_mb"],
            "fetched": [],
            "verified": False,
        }
        if model["over_limit"] or not files:
            return model
        differing = [f for f in files if known.get(f["name"]) != f["sha256"]]
        if args["model_fetch"]:  # in check mode: what would come
            model["fetched"] = [f["name"] for f in differing]
        if not fetch:  # only compared
            model["verified"] = not differing
            return model
        self._folder(path)
        for entry in differing:
            if "content" in entry:
                pieces = [base64.b64decode(entry["content"])]
            else:
                pieces = self._pieces(task_vars, args["output_dir"], entry)
            results.write_pieces(os.path.join(path, entry["name"]), pieces, entry["sha256"])
        sums = results.sums_text(files).encode("ascii")
        if results.differs(os.path.join(path, results.SUMS), sums):
            results.write(os.path.join(path, results.SUMS), sums)
        model["verified"] = True
        return model

    def _pieces(self, task_vars, output_dir, entry):
        """The file's content from the node, PIECE bytes per module call."""
        offset = 0
        while offset < entry["size"]:
            got = self._node(
                task_vars,
                output_dir=output_dir,
                dest="",
                read=dict(name=entry["name"], offset=offset, length=PIECE),
            )
            if got.get("failed"):
                raise OSError(got.get("msg"))
            data = base64.b64decode(got["content"])
            if not data:
                raise OSError(
                    "%s ended at %d bytes, not %d" % (entry["name"], offset, entry["size"])
                )
            offset += len(data)
            yield data
