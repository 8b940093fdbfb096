# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the Hub model's fetch reports (controller only, private; the hub_cache action): a
progress line, and a failure named with its cause and the fix."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DEFAULT_ENDPOINT = "https://huggingface.co"


def size(count):
    count = float(count or 0)
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return ("%.0f %s" if unit == "B" else "%.1f %s") % (count, unit)
        count /= 1000.0
    return "%.1f GB" % count  # pragma: no cover


def describe(state, elapsed=None):
    """'1.2 GB of 16.1 GB (7%), 96.0 MB/s, 14 s' from a download's or a copy's state."""
    got = state.get("received") or 0
    total = state.get("total")
    parts = [size(got) + ((" of %s (%d%%)" % (size(total), 100 * got // total)) if total else "")]
    skipped = state.get("skipped") or state.get("before") or 0
    if elapsed:
        rate = max(got - skipped, 0) / max(elapsed, 0.001)
        parts.append("%s/s" % size(rate))
        parts.append("%.0f s" % elapsed)
    return ", ".join(parts)


def failure(action, repo, endpoint, state, host):
    """The message of a failed download, copy or server: what failed, the error, the fix."""
    name = repo["repo_id"]
    revision = repo.get("revision") or "main"
    dataset = repo.get("repo_type") == "dataset"
    # Where the config names it: the fix points there.
    named = "hf_hub_url in dataset_info.json" if dataset else "model_name_or_path"
    where = endpoint or DEFAULT_ENDPOINT
    kind = state.get("kind") or "failed"
    error = state.get("error") or "no detail"
    fixes = {
        "not-found": (
            "%s (%s) is not a %s on the Hub at %s, or it is private and "
            "llamafactory_hf_token cannot see it. Fix: check the id (ORG/NAME, as on its "
            "page), give a token that can read it (llamafactory_hf_token, vaulted), or point "
            "%s at files on the controller"
            % (name, named, "dataset" if dataset else "model", where, named)
        ),
        "gated": (
            "%s is gated: its files need a token of an account that accepted its licence. Fix: "
            "accept the licence on its page (%s/%s%s) and set llamafactory_hf_token to a "
            "token of that account (ansible-vault; it is written to a 0600 file only)"
            % (name, where.rstrip("/"), "datasets/" if dataset else "", name)
        ),
        "revision": (
            "%s has no revision %r (model_revision in the training config). Fix: give a branch, "
            "tag or commit that exists" % (name, revision)
        ),
        "token": (
            "the Hub refused the token (llamafactory_hf_token) for %s. Fix: give a valid token "
            "with read access (huggingface.co/settings/tokens)" % name
        ),
        "unreachable": (
            "rank 0's node (%s) cannot reach the Hub at %s. Fix: give the node a route to it "
            "(an external address or Cloud NAT), or set llamafactory_hf_endpoint to a mirror "
            "the node reaches" % (host, where)
        ),
        "disk": (
            "the node's disk is full (llamafactory_hf_cache). Fix: free space or point "
            "llamafactory_hf_cache at a larger disk"
        ),
        "source": (
            "%s could not copy %s from rank 0's node. Fix: the nodes must reach each other on "
            "preflight_port (the firewall rule between the nodes; playbooks/doctor.yml checks "
            "it)" % (host, name)
        ),
        "serve": (
            "rank 0's node could not serve %s to the others (the port may be taken). Fix: free "
            "preflight_port on it, or set preflight_port to another port" % name
        ),
        "copy": "the copy of %s on %s was refused. Fix: run again (a partial copy resumes)"
        % (name, host),
    }
    label = ("dataset " if dataset else "") + name
    what = {"download": "downloading %s" % label, "pull": "copying %s to %s" % (label, host)}.get(
        action, "serving %s" % label
    )
    fix = fixes.get(kind) or (
        "Fix: read the error; a run again resumes the download (llamafactory_hub_fetch: never "
        "lets the ranks download it themselves)"
    )
    return "%s failed (hub-%s): %s\nCause: %s" % (what, kind, error, fix)
