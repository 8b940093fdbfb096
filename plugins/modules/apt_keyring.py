#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: apt_keyring
short_description: Install an apt signing key as a signed-by keyring, after checking its fingerprint
version_added: 0.1.0
description:
  - Fetches an OpenPGP public key (armored or binary), checks that its primary key fingerprint is
    the pinned one, and writes it in binary form to O(dest) for an apt source's C(signed-by=).
  - "Why not the built-in modules: C(ansible.builtin.apt_key) uses the deprecated C(apt-key) and a
    global keyring; C(ansible.builtin.get_url) checks a file checksum, which changes when the
    vendor re-exports the same key; C(ansible.builtin.deb822_repository) downloads a C(signed_by)
    key without checking its fingerprint."
  - Needs C(gpg) on the host.
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  url:
    description: Where to fetch the key (C(https://), C(http://) or C(file://)).
    type: str
    required: true
  dest:
    description:
      - The keyring file to write (binary OpenPGP), for example under C(/usr/share/keyrings).
    type: path
    required: true
  fingerprints:
    description: Primary key fingerprints the key must have (spaces are ignored).
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds to wait for the download.
    type: int
    default: 30
  mode:
    description: File mode of O(dest).
    type: str
    default: "0644"
attributes:
  check_mode:
    support: full
    description: Downloads and checks the key, reports whether O(dest) would change, writes nothing.
  diff_mode:
    support: full
    description: Shows the fingerprints before and after.
  idempotent:
    support: full
    description: A keyring that already holds the key with the expected fingerprints is left as
      it is.
"""

EXAMPLES = r"""
- name: NVIDIA's repository key
  hostnet.llamafactory.apt_keyring:
    url: https://nvidia.github.io/libnvidia-container/gpgkey
    dest: /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
    fingerprints: [C95B321B61E88C1809C4F759DDCAE044F796ECB0]
"""

RETURN = r"""
fingerprints:
  description: The primary key fingerprints of the installed key.
  returned: success
  type: list
  elements: str
  sample: [C95B321B61E88C1809C4F759DDCAE044F796ECB0]
dest:
  description: The keyring file.
  returned: success
  type: str
  sample: /etc/apt/keyrings/nvidia-container-toolkit.gpg
"""

import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import fetch_url
from ansible_collections.hostnet.llamafactory.plugins.module_utils._keyring import (
    KeyringError,
    check,
    is_armored,
    primary_fingerprints,
)


def _gpg(module, gpg, args, data=None, strict=True):
    home = tempfile.mkdtemp(prefix="apt_keyring-")
    try:
        rc, out, err = module.run_command(
            [gpg, "--batch", "--homedir", home, *args], data=data, binary_data=True, encoding=None
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    if rc != 0:
        if not strict:
            return None
        module.fail_json(msg="gpg %s failed: %s" % (" ".join(args), err))
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            dest=dict(type="path", required=True),
            fingerprints=dict(type="list", elements="str", required=True),
            timeout=dict(type="int", default=30),
            mode=dict(type="str", default="0644"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    gpg = module.get_bin_path("gpg", required=True)
    response, info = fetch_url(module, params["url"], timeout=params["timeout"])
    is_http = params["url"].startswith(("http://", "https://"))
    if response is None or (is_http and info.get("status") != 200):
        module.fail_json(msg="cannot fetch the key from %s: %s" % (params["url"], info.get("msg")))
    data = response.read()
    if is_armored(data):
        data = _gpg(module, gpg, ["--dearmor"], data=data)

    def fingerprints_of(blob, strict=True):
        handle, path = tempfile.mkstemp()
        try:
            os.write(handle, blob)
            os.close(handle)
            out = _gpg(module, gpg, ["--show-keys", "--with-colons", path], strict=strict)
        finally:
            os.unlink(path)
        if out is None:
            return None
        text = out.decode("utf-8", "replace") if isinstance(out, bytes) else out
        return primary_fingerprints(text)

    found = fingerprints_of(data)
    try:
        check(found, params["fingerprints"], params["url"])
    except KeyringError as exc:
        module.fail_json(msg=str(exc), fingerprints=found)

    dest = params["dest"]
    current = None
    if os.path.exists(dest):
        with open(dest, "rb") as handle:
            current = handle.read()
    changed = current != data
    diff = None
    if module._diff:
        # Only for --diff, and only when it differs: an unreadable old file is just replaced.
        before = found
        if changed:
            before = fingerprints_of(current, strict=False) if current else []
        diff = {
            "before": "(unreadable)\n" if before is None else "\n".join(before) + "\n",
            "after": "\n".join(found) + "\n",
        }
    if changed and not module.check_mode:
        directory = os.path.dirname(dest) or "."
        handle, temp = tempfile.mkstemp(dir=directory)
        os.write(handle, data)
        os.close(handle)
        module.atomic_move(temp, dest)
    if not module.check_mode and os.path.exists(dest):
        file_args = module.load_file_common_arguments(
            dict(path=dest, mode=params["mode"], owner="root", group="root")
        )
        changed = module.set_fs_attributes_if_different(file_args, changed)
    module.exit_json(changed=changed, fingerprints=found, dest=dest, diff=diff)


if __name__ == "__main__":
    main()
