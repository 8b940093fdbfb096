# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""How the controller words a pull (the action image_pull): progress lines from the module's
progress summary, and the cause and fix of the daemon's pull errors."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.hostnet.llamafactory.plugins.module_utils._image_pull import (
    split_reference,
)


def human_bytes(count):
    value = float(count)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return ("%.0f %s" if unit in ("B", "kB") else "%.1f %s") % (value, unit)
        value /= 1000.0
    return "%.1f GB" % value  # pragma: no cover


def describe(snapshot, elapsed=None, rate=None):
    """'812.3 MB of 2.1 GB (38%), 3 of 9 layers, 41.2 MB/s, 20 s', then, once everything is
    downloaded, '2.1 GB, extracted 45%, 7 of 9 layers, 80 s'."""
    parts = []
    total = snapshot.get("total") or 0
    got = snapshot.get("downloaded") or 0
    layers, done = snapshot.get("layers") or 0, snapshot.get("layers_done") or 0
    if total and got < total:
        parts.append("%s of %s (%d%%)" % (human_bytes(got), human_bytes(total), 100 * got // total))
    elif total and done < layers:
        extracted = snapshot.get("extracted") or 0
        parts.append("%s, extracted %d%%" % (human_bytes(total), 100 * extracted // total))
    elif total:
        parts.append(human_bytes(total))
    elif layers:
        parts.append("starting")
    else:
        parts.append("contacting the registry")
    if layers:
        parts.append("%d of %d layers" % (done, layers))
    if rate and got < total:
        parts.append("%s/s" % human_bytes(rate))
    if elapsed is not None:
        parts.append("%.0f s" % elapsed)
    return ", ".join(parts)


# (substring of the daemon's error, cause, fix); {image} and {registry} are filled in.
PULL_ERRORS = (
    (
        ("unauthorized", "authentication required", "no basic auth credentials", "denied"),
        "the registry {registry} refused the credentials (or gave none) for {image}",
        "set llamafactory_registry_username and llamafactory_registry_password (vault the "
        "password); for "
        "Artifact Registry use oauth2accesstoken and a token from `gcloud auth "
        "print-access-token`, or _json_key and a service account key, or run `gcloud auth "
        "configure-docker REGION-docker.pkg.dev` on the nodes",
    ),
    (
        ("manifest unknown", "not found", "does not exist", "repository name not known"),
        "{image} does not exist in {registry}",
        "check llamafactory_image (repository and tag), and that the image was pushed there",
    ),
    (
        ("x509", "certificate"),
        "the node does not trust {registry}'s TLS certificate",
        "put the registry's CA in /etc/docker/certs.d/{registry}/ca.crt on every node, or list "
        "the registry in docker_engine_daemon_extra.insecure-registries",
    ),
    (
        ("server gave http response to https client",),
        "{registry} speaks plain HTTP",
        "list it in docker_engine_daemon_extra.insecure-registries (docker_engine role), or serve "
        "it over TLS",
    ),
    (
        ("no such host", "name resolution", "lookup "),
        "the node cannot resolve {registry}",
        "check the registry name in llamafactory_image and the node's DNS",
    ),
    (
        (
            "i/o timeout",
            "connection refused",
            "no route to host",
            "network is unreachable",
            "tls handshake timeout",
            "context deadline exceeded",
        ),
        "the node cannot reach {registry}",
        "check the node's route and firewall to the registry (on GCP: Cloud NAT or Private Google "
        "Access for VMs without external IPs)",
    ),
    (
        ("no space left on device",),
        "the node's disk is full",
        "free space under Docker's data root (/var/lib/docker) or use larger disks",
    ),
)


def explain(error, image):
    """(cause, fix) for a pull error, or (None, None) when the table does not know it."""
    registry = split_reference(image)[0]
    lowered = (error or "").lower()
    for needles, cause, fix in PULL_ERRORS:
        if any(needle in lowered for needle in needles):
            return cause.format(image=image, registry=registry), fix.format(
                image=image, registry=registry
            )
    return None, None
