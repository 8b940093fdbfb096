# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""OpenPGP keyring checks for apt's signed-by: fingerprints from `gpg --with-colons`."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

ARMOR_HEADER = b"-----BEGIN PGP PUBLIC KEY BLOCK-----"


class KeyringError(Exception):
    """A key that must not be trusted; the message names the fix."""


def is_armored(data):
    return data.lstrip().startswith(ARMOR_HEADER)


def normalize(fingerprint):
    return "".join(fingerprint.split()).upper()


def primary_fingerprints(colons):
    """Fingerprints of the primary keys in `gpg --show-keys --with-colons` output (not subkeys)."""
    found, after_pub = [], False
    for line in colons.splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            after_pub = True
        elif fields[0] == "fpr" and after_pub:
            found.append(fields[9].upper())
            after_pub = False
        elif fields[0] in ("sub", "uid"):
            after_pub = False
    return found


def check(fingerprints_found, wanted, source):
    """Refuse a key whose primary fingerprints do not include every wanted one."""
    wanted = [normalize(w) for w in wanted]
    missing = [w for w in wanted if w not in fingerprints_found]
    if not fingerprints_found:
        raise KeyringError("%s holds no OpenPGP public key; check the key URL" % source)
    if missing:
        raise KeyringError(
            "the key from %s has fingerprint(s) %s, not the pinned %s: refusing it. If you use "
            "a mirror with its own key, pin that key's fingerprint."
            % (source, ", ".join(fingerprints_found), ", ".join(missing))
        )
