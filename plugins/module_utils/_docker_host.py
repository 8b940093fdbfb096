# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the docker_engine role reads on a host, parsed from the tools' own output (unit-tested on
captured output in tests/unit/fixtures/docker_host): installed packages (dpkg-query), the
dockerd version, a systemd unit's state and a file's owner, group and mode."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import grp
import os
import pwd
import re
import stat

# dpkg-query -W -f "${binary:Package}\t${Version}\t${db:Status-Abbrev}\n" NAME...
DPKG_FORMAT = "${binary:Package}\\t${Version}\\t${db:Status-Abbrev}\\n"
# systemctl show UNIT --property=...
UNIT_PROPERTIES = ("LoadState", "ActiveState", "UnitFileState", "ActiveEnterTimestampMonotonic")
# What the docker_engine role looks for with its defaults (node_facts' `docker_host` defaults).
DOCKER_ENGINE_PACKAGES = (
    "ca-certificates",
    "gnupg",
    "python3-requests",
    "docker.io",
    "docker-ce",
    "docker-ce-cli",
    "containerd.io",
)
DOCKER_ENGINE_PENDING_MARKER = "/etc/docker/.hostnet-llamafactory-restart-pending"
# The read's options (docker_host_facts', and node_facts' `docker_host`).
OPTIONS = dict(
    packages=dict(type="list", elements="str", default=[]),
    service=dict(type="str"),
    daemon_json=dict(type="path"),
    pending_marker=dict(type="path"),
    dockerd=dict(type="bool", default=False),
)


def installed_packages(stdout):
    """dpkg-query's lines -> {name: version} of the packages installed ("ii": wanted install,
    installed; a removed package keeps "rc" and is not installed). An architecture qualifier
    (name:amd64) is dropped."""
    found = {}
    for line in (stdout or "").splitlines():
        fields = line.split("\t")
        if len(fields) < 3:
            continue
        name, version, status = fields[0], fields[1], fields[2]
        if status.strip() == "ii" or status[:2] == "ii":
            found[name.split(":", 1)[0]] = version
    return found


def os_release(text, machine):
    """/etc/os-release's text and the machine (uname -m) -> {family, distribution, version,
    release, architecture, name}: what the docker_engine role would otherwise gather facts for.
    The family is Debian for Debian and its derivatives (ID or ID_LIKE), else the ID."""
    values = {}
    for line in (text or "").splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and not key.startswith("#"):
            values[key] = value.strip().strip("'\"")
    distribution = values.get("ID", "linux").lower()
    like = values.get("ID_LIKE", "").lower().split()
    family = "Debian" if distribution == "debian" or "debian" in like else distribution
    return {
        "family": family,
        "distribution": distribution,
        "version": values.get("VERSION_ID", ""),
        "release": values.get("VERSION_CODENAME", ""),
        "architecture": machine,
        "name": values.get("PRETTY_NAME") or values.get("NAME") or distribution,
    }


def dockerd_version(stdout):
    """'Docker version 20.10.24+dfsg1, build 5d6db84' -> '20.10.24' (None without a version)."""
    match = re.search(r"version\s+v?(\d+\.\d+(?:\.\d+)?)", stdout or "")
    return match.group(1) if match else None


def package_version(dpkg_version):
    """A Docker package's dpkg version -> the upstream major.minor.patch: '5:27.3.1-1~debian.12~
    bookworm' (docker-ce) -> '27.3.1', '20.10.24+dfsg1-1+deb12u1' (docker.io) -> '20.10.24'
    (None when it does not start with one)."""
    upstream = (dpkg_version or "").split(":", 1)[-1]
    match = re.match(r"(\d+\.\d+(?:\.\d+)?)", upstream)
    return match.group(1) if match else None


def package_owning(path, packages, info_dir="/var/lib/dpkg/info"):
    """The one of `packages` (installed names) whose dpkg file list holds `path`, else None."""
    for name in packages:
        multiarch = glob.glob(os.path.join(info_dir, glob.escape(name) + ":*.list"))
        for listing in [os.path.join(info_dir, name + ".list"), *sorted(multiarch)]:
            try:
                with open(listing) as handle:
                    if any(line.rstrip("\n") == path for line in handle):
                        return name
            except (IOError, OSError):
                continue
    return None


def unit_state(stdout):
    """systemctl show's KEY=VALUE lines -> {loaded, active, enabled, state, since}: a unit
    systemd does not know is neither. `since` is when it last became active (microseconds of the
    monotonic clock; None while it never was): another value means it was started again."""
    values = {}
    for line in (stdout or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return {
        "loaded": values.get("LoadState") == "loaded",
        "active": values.get("ActiveState") == "active",
        "enabled": values.get("UnitFileState") in ("enabled", "enabled-runtime", "static"),
        "state": values.get("ActiveState") or "unknown",
        "since": None
        if values.get("ActiveEnterTimestampMonotonic") in (None, "", "0")
        else values["ActiveEnterTimestampMonotonic"],
    }


def file_attributes(st):
    """An os.stat result -> {owner, group, mode} as the copy module's options say them: names
    (ids, as strings, when the host has no such user or group) and 4 octal digits."""
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    return {"owner": owner, "group": group, "mode": "%04o" % stat.S_IMODE(st.st_mode)}


class HostReadError(Exception):
    """A tool the read needs failed (systemctl, or daemon.json unreadable)."""


def read(module, params):
    """docker_host_facts' result for `params` (its options), with `module` running the tools
    (run_command, get_bin_path). Raises HostReadError."""
    result = dict(
        changed=False,
        packages={},
        missing=[],
        service=None,
        daemon_json=None,
        daemon_json_attributes=None,
    )
    try:
        with open("/etc/os-release") as handle:
            release = handle.read()
    except (IOError, OSError):
        release = ""
    result["os"] = os_release(release, os.uname()[4])
    packages = params.get("packages") or []
    dpkg = module.get_bin_path("dpkg-query") if packages else None
    if packages and not dpkg:
        result["missing"] = None
    elif packages:
        # rc 1 names the packages dpkg has never heard of: not installed, not an error.
        _rc, out, _err = module.run_command([dpkg, "-W", "-f", DPKG_FORMAT, *packages])
        installed = installed_packages(out)
        result["packages"] = dict((n, installed[n]) for n in packages if n in installed)
        result["missing"] = [n for n in packages if n not in installed]
    if params.get("service"):
        systemctl = module.get_bin_path("systemctl")
        if not systemctl:
            raise HostReadError("systemctl is not on the PATH: Docker's unit cannot be read")
        rc, out, err = module.run_command(
            [systemctl, "show", params["service"], "--property=" + ",".join(UNIT_PROPERTIES)]
        )
        if rc != 0:
            raise HostReadError("systemctl show %s failed: %s" % (params["service"], err.strip()))
        result["service"] = unit_state(out)
    daemon_json = params.get("daemon_json")
    if daemon_json and os.path.exists(daemon_json):
        try:
            with open(daemon_json, "rb") as handle:
                result["daemon_json"] = handle.read().decode("utf-8", "replace")
            result["daemon_json_attributes"] = file_attributes(os.stat(daemon_json))
        except (IOError, OSError) as exc:
            raise HostReadError("cannot read %s: %s" % (daemon_json, exc)) from exc
    marker = params.get("pending_marker")
    result["pending"] = bool(marker) and os.path.exists(marker)
    result["dockerd_version"] = None
    if params.get("dockerd"):
        dockerd = module.get_bin_path("dockerd")
        if dockerd:
            # The version of the package that installed this dockerd (`packages`), without
            # starting it; any other dockerd is asked.
            owner = package_owning(os.path.realpath(dockerd), result["packages"] or {})
            version = package_version(result["packages"][owner]) if owner else None
            if version is None:
                _rc, out, _err = module.run_command([dockerd, "--version"])
                version = dockerd_version(out)
            result["dockerd_version"] = version
    return result
