"""A stand-in for NVIDIA's apt repository, for tests (NVIDIA's repository is out of reach here).

It follows the real repository's contract as the nvidia_container_toolkit role uses it: a flat
repository at <dir>/stable/deb/<arch>/ (the role's source line ends in `$(ARCH) /`) with
Packages, Release, InRelease and Release.gpg signed by an OpenPGP key of its own, the armored
public key at <dir>/gpgkey, and a package named nvidia-container-toolkit that installs the
binary Docker's runtime entry names, /usr/bin/nvidia-container-runtime (here a wrapper that
runs runc), and /usr/bin/nvidia-ctk. A second, unrelated key is written to <dir>/wrong-gpgkey.

Usage: python nvidia_apt_repo.py DIR   (writes DIR/fingerprint and DIR/wrong-fingerprint too)
"""

import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VERSION = "1.17.8-1"
RUNTIME = """#!/bin/sh
# Test stand-in for NVIDIA's nvidia-container-runtime: no GPU hooks, plain runc.
exec runc "$@"
"""
CTK = """#!/bin/sh
echo "NVIDIA Container Toolkit CLI version 1.17.8 (hostnet.llamafactory test stand-in)"
"""


def gpg(home: str, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(
        [
            "gpg",
            "--batch",
            "--homedir",
            home,
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            *args,
        ],
        input=data,
        check=True,
        capture_output=True,
    ).stdout


def new_key(home: str, name: str) -> str:
    gpg(home, "--quick-gen-key", f"{name} <test@hostnet.invalid>", "ed25519", "sign", "never")
    listing = gpg(home, "--with-colons", "--list-keys", name).decode()
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def build_deb(work: Path, arch: str) -> Path:
    root = work / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "usr" / "bin").mkdir(parents=True)
    for name, text in (("nvidia-container-runtime", RUNTIME), ("nvidia-ctk", CTK)):
        path = root / "usr" / "bin" / name
        path.write_text(text)
        path.chmod(0o755)
    (root / "DEBIAN" / "control").write_text(
        f"Package: nvidia-container-toolkit\nVersion: {VERSION}\nArchitecture: {arch}\n"
        "Maintainer: hostnet.llamafactory tests <test@hostnet.invalid>\n"
        "Description: test stand-in for the NVIDIA Container Toolkit\n"
        " Installs nvidia-container-runtime (a runc wrapper) and nvidia-ctk; no GPU support.\n"
    )
    deb = work / f"nvidia-container-toolkit_{VERSION}_{arch}.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def main(out: Path) -> None:
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], check=True, capture_output=True, text=True
    ).stdout.strip()
    repo = out / "stable" / "deb" / arch
    # Empty `out` but keep it: it may be bind-mounted into the test hosts already.
    out.mkdir(parents=True, exist_ok=True)
    for child in out.iterdir():
        shutil.rmtree(child) if child.is_dir() else child.unlink()
    repo.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        home, wrong_home = str(work / "gnupg"), str(work / "wrong")
        os.mkdir(home, 0o700)
        os.mkdir(wrong_home, 0o700)
        fingerprint = new_key(home, "NVIDIA stand-in repository key")
        wrong = new_key(wrong_home, "Unrelated key")
        (out / "gpgkey").write_bytes(gpg(home, "--armor", "--export", fingerprint))
        (out / "wrong-gpgkey").write_bytes(gpg(wrong_home, "--armor", "--export", wrong))
        (out / "fingerprint").write_text(fingerprint + "\n")
        (out / "wrong-fingerprint").write_text(wrong + "\n")

        deb = build_deb(work, arch)
        shutil.copy(deb, repo / deb.name)
        data = deb.read_bytes()
        control = (work / "pkg" / "DEBIAN" / "control").read_text()
        packages = (
            control + f"Filename: ./{deb.name}\nSize: {len(data)}\n"
            f"MD5sum: {hashlib.md5(data).hexdigest()}\n"  # noqa: S324 (apt's format)
            f"SHA256: {hashlib.sha256(data).hexdigest()}\n\n"
        ).encode()
        (repo / "Packages").write_bytes(packages)
        (repo / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
        lines = [
            "Origin: hostnet.llamafactory tests",
            "Label: nvidia-container-toolkit stand-in",
            f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S UTC', time.gmtime())}",
            f"Architectures: {arch}",
            "SHA256:",
        ]
        for name in ("Packages", "Packages.gz"):
            blob = (repo / name).read_bytes()
            lines.append(f" {hashlib.sha256(blob).hexdigest()} {len(blob)} {name}")
        release = ("\n".join(lines) + "\n").encode()
        (repo / "Release").write_bytes(release)
        (repo / "InRelease").write_bytes(
            gpg(home, "--local-user", fingerprint, "--clearsign", data=release)
        )
        (repo / "Release.gpg").write_bytes(
            gpg(home, "--local-user", fingerprint, "--armor", "--detach-sign", data=release)
        )
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    out.chmod(0o755)
    print(f"stand-in repository in {repo}, key {fingerprint}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
