# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The job plan's copies as job_files entries (controller only, private): what
ansible.builtin.copy with `src/` and `dest/` makes - every folder 0750, every file 0640."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import os

FILE_MODE = "0640"
FOLDER_MODE = "0750"


def _file(path, dest):
    with open(path, "rb") as handle:
        encoded = base64.b64encode(handle.read()).decode("ascii")
    return {"path": dest, "state": "file", "mode": FILE_MODE, "content_base64": encoded}


def entries(copies):
    """copies: [{src, dest, directory}] -> job_files entries, each folder before what it holds."""
    found = []
    for copy in copies:
        source, dest = copy["src"], copy["dest"].rstrip("/")
        if not copy["directory"]:
            found.append(_file(source, dest))
            continue
        for folder, dirs, files in os.walk(source):
            dirs.sort()
            relative = os.path.relpath(folder, source)
            target = dest if relative == "." else "%s/%s" % (dest, relative)
            found.append({"path": target, "state": "directory", "mode": FOLDER_MODE})
            found.extend(
                _file(os.path.join(folder, name), "%s/%s" % (target, name))
                for name in sorted(files)
            )
    return found
