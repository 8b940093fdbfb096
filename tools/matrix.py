"""The controller support matrix: the collection's controller-side checks under other ansible-core
versions than the development venv's, each in a Debian 13 (Python 3.13) container.

Usage: ./dev matrix [--core 2.20 [--core 2.19 ...]] [--keep] [--offline] [--untracked]
   (or: PYTHONPATH=tools .venv/bin/python tools/matrix.py ..., from the repository root)

Per version (a series such as 2.20 means its latest release on PyPI; 2.20.3 means that one):
copy the files git tracks (--untracked: also new ones not ignored) into a fresh container of
hostnet-llamafactory/controller:debian13 (an image built once with debootstrap and cached, like
the local cluster's images), make a venv with that ansible-core and what the unit tests need,
install the collections of requirements.yml the way tools/setup_collections.py does (from the
`ansible` wheel pinned in pyproject.toml, the same for every core), then run the unit tests, the
packaging test (tests/unit/test_packaging.py) and `ansible-test sanity` of that core
(tools/sanity.py --core). Python packages come from PyPI: the container reaches it directly when
it can (with this machine's CA bundle), else - or with --offline - wheels are downloaded here
into .cache/matrix/wheels and the container runs without a network. One line per version, a
JSON summary in .cache/matrix/last.json; exit status 1 when any version fails.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "matrix"
PLATFORM = "debian13"
KIND = "controller"
DEFAULT_CORES = ("2.19", "2.20", "2.21")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
SRC = "/work/ansible_collections/hostnet/llamafactory"
VENV = "/opt/venv"
# Development-only tools the controller checks do not need.
NOT_NEEDED = (
    "ansible-core",
    "ansible-lint",
    "molecule",
    "molecule-plugins",
    "ruff",
    "pytest-testinfra",
)
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_28_x86_64", "manylinux_2_34_x86_64")
# Each step: (name, deadline in seconds).
DEADLINES = {"venv": 900, "collections": 300, "unit": 1200, "packaging": 300, "sanity": 1800}
HEARTBEAT_S = 20
# The frozen requirement files in an ansible-core wheel that ansible-test sanity installs.
FROZEN = r"ansible_test/_data/requirements/(sanity\.[\w.-]+|ansible-test)\.txt"


class MatrixError(RuntimeError):
    """A problem the user can fix; the message names the fix."""


def log(message: str) -> None:
    print(f"[matrix {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- pure parts (tests/unit/test_matrix.py) ---


@dataclass(frozen=True)
class Core:
    """One column of the matrix: `label` as asked (2.20 or 2.20.3), the pip requirement."""

    label: str
    requirement: str


def minimum_core(runtime_yml: str) -> tuple[int, int]:
    """(major, minor) of meta/runtime.yml's requires_ansible lower bound."""
    found = re.search(r"requires_ansible:\s*[\"']?>=\s*(\d+)\.(\d+)", runtime_yml)
    if not found:
        raise MatrixError("meta/runtime.yml has no requires_ansible: '>=X.Y' lower bound")
    return int(found.group(1)), int(found.group(2))


def parse_cores(values: list[str] | None, minimum: tuple[int, int]) -> list[Core]:
    """--core values (series or exact releases, also comma-separated) as Core, in order, once."""
    cores: list[Core] = []
    for value in [v.strip() for item in values or DEFAULT_CORES for v in item.split(",")]:
        found = re.fullmatch(r"(?:ansible-core)?\s*(?:==)?\s*(\d+)\.(\d+)(?:\.(\d+))?", value)
        if not found:
            raise MatrixError(f"--core {value!r}: give a series (2.20) or a release (2.20.3)")
        major, minor, patch = int(found.group(1)), int(found.group(2)), found.group(3)
        if (major, minor) < minimum:
            raise MatrixError(
                f"--core {value}: meta/runtime.yml requires ansible-core >= "
                f"{minimum[0]}.{minimum[1]}; pick a newer one"
            )
        if patch is None:
            core = Core(f"{major}.{minor}", f"ansible-core>={major}.{minor},<{major}.{minor + 1}")
        else:
            core = Core(f"{major}.{minor}.{patch}", f"ansible-core=={major}.{minor}.{patch}")
        if core not in cores:
            cores.append(core)
    return cores


def unit_requirements(pyproject: str) -> list[str]:
    """pyproject.toml's dependencies without ansible-core and the development-only tools."""
    deps = tomllib.loads(pyproject)["project"]["dependencies"]
    name = re.compile(r"[A-Za-z0-9_.-]+")
    return [d for d in deps if name.match(d).group(0).lower() not in NOT_NEEDED]


def pytest_counts(output: str) -> dict[str, int]:
    """{'passed': 10, 'failed': 1, ...} from pytest's last summary line; {} when there is none."""
    lines = [line for line in output.splitlines() if re.search(r"\b(passed|failed|error)", line)]
    if not lines:
        return {}
    kinds = r"(\d+) (passed|failed|skipped|errors?|warnings?|xfailed|xpassed)"
    counts = re.findall(kinds, lines[-1])
    plural = {"error": "errors", "warning": "warnings"}
    return {plural.get(kind, kind): int(n) for n, kind in counts}


def sanity_counts(output: str) -> dict[str, int]:
    """{'run': N, 'failed': M, 'skipped': S} from ansible-test sanity's output (its lines
    'Running sanity test "pep8"' and 'FATAL: The 1 sanity test(s) listed below (out of 23)
    failed'; either quote, ERROR or FATAL, to survive small changes)."""
    run = len(re.findall(r"^Running sanity test [\"']", output, re.MULTILINE))
    skipped = len(re.findall(r"^WARNING: Skipping sanity test [\"']", output, re.MULTILINE))
    failed = re.search(
        r"^(?:ERROR|FATAL): The (\d+) sanity test\(s\) listed below \(out of \d+\) failed",
        output,
        re.MULTILINE,
    )
    return {"run": run, "failed": int(failed.group(1)) if failed else 0, "skipped": skipped}


@dataclass
class Check:
    name: str
    status: str = "skipped"  # pass, fail or skipped (an earlier step failed)
    seconds: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    detail: str = ""


@dataclass
class Result:
    core: Core
    versions: dict[str, str] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.checks) and all(c.status == "pass" for c in self.checks)


def describe(check: Check) -> str:
    """A few words per check: 'unit 450 passed', 'sanity 22/23 FAILED'."""
    counts = check.counts
    if check.status == "skipped":
        return f"{check.name} skipped"
    if check.name == "sanity" and counts:
        run, failed = counts.get("run", 0), counts.get("failed", 0)
        if check.status == "pass":
            return f"sanity {run}/{run}"
        if not failed:  # ansible-test itself stopped (FATAL), in the test it was running
            return f"sanity FAILED in test {run}"
        return f"sanity {run - failed}/{run} FAILED"
    if counts:
        words = ", ".join(f"{n} {k}" for k, n in counts.items())
        return f"{check.name} {words}"
    return f"{check.name} {'ok' if check.status == 'pass' else 'FAILED'}"


def summary_line(result: Result) -> str:
    versions = result.versions
    what = f"ansible-core {versions.get('ansible-core', result.core.label + ' (not installed)')}"
    if versions.get("python"):
        what += f" on Python {versions['python']}"
    shown = [describe(c) for c in result.checks if c.name in ("unit", "packaging", "sanity")]
    failed = [c.name for c in result.checks if c.status == "fail"]
    tail = f"; failed: {', '.join(failed)}" if failed else ""
    tail += f"; {result.error}" if result.error else ""
    status = "PASS" if result.passed else "FAIL"
    return f"{status} {what}: {', '.join(shown)} ({result.seconds:.0f} s){tail}"


def summary(results: list[Result], image: str, seconds: float, network: str) -> dict:
    return {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "image": image,
        "network": network,
        "seconds": round(seconds, 1),
        "passed": all(r.passed for r in results),
        "results": [
            {
                "core": r.core.label,
                "requirement": r.core.requirement,
                "status": "PASS" if r.passed else "FAIL",
                "versions": r.versions,
                "seconds": round(r.seconds, 1),
                "error": r.error,
                "checks": {
                    c.name: {
                        "status": c.status,
                        "seconds": round(c.seconds, 1),
                        "counts": c.counts,
                        "detail": c.detail,
                    }
                    for c in r.checks
                },
                "line": summary_line(r),
            }
            for r in results
        ],
    }


# --- Docker and the host ---


def sh(command: list[str], timeout: float = 120, check: bool = True, **kwargs) -> str:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
        )
    except subprocess.TimeoutExpired as exc:
        raise MatrixError(f"{' '.join(command[:3])} did not finish within {timeout:.0f} s") from exc
    if check and done.returncode != 0:
        raise MatrixError(
            f"{' '.join(command[:4])} failed ({done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-1500:]}"
        )
    return done.stdout


def watch(command: list[str], what: str, log_file: Path, deadline_s: float) -> tuple[int, str]:
    """Run a long command, its output to `log_file`; a progress line every HEARTBEAT_S with the
    last line it printed; killed at the deadline. (exit status, output); 124 at the deadline."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    started = time.monotonic()
    with (
        log_file.open("w") as sink,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        ) as proc,
    ):

        def read() -> None:
            for line in proc.stdout:
                lines.append(line)
                sink.write(line)
                sink.flush()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        timed_out = False
        while reader.is_alive():
            reader.join(HEARTBEAT_S)
            elapsed = time.monotonic() - started
            if reader.is_alive() and elapsed >= deadline_s:
                proc.kill()
                timed_out = True
                reader.join(10)
                break
            if reader.is_alive():
                last = next((x.strip() for x in reversed(lines) if x.strip()), "")
                log(f"  {what}: {elapsed:.0f} s of {deadline_s} s | {last[:110]}")
        proc.wait(timeout=30)
    output = "".join(lines)
    if timed_out:
        return 124, output + f"\n(killed: past the {deadline_s} s deadline)\n"
    return proc.returncode, output


def checkout_tar(extra: list[Path], untracked: bool) -> bytes:
    """The files git tracks, as they are in the working tree (.venv and .cache are not tracked),
    with `untracked`: also those untracked but not ignored (as tools/sanity.py copies them),
    and `extra` files, as a tar under SRC."""
    listing = ["git", "ls-files", "-z", *(["-co", "--exclude-standard"] if untracked else [])]
    names = sh(listing, cwd=ROOT).split("\0")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in filter(None, names):
            path = ROOT / name
            if path.is_file() or path.is_symlink():  # not a tracked file deleted here
                archive.add(path, arcname=f"{SRC}/{name}".lstrip("/"), recursive=False)
        for path in extra:
            archive.add(path, arcname=f"{SRC}/{path.relative_to(ROOT)}".lstrip("/"))
    return buffer.getvalue()


def collections_wheel() -> Path:
    """The `ansible` wheel of pyproject.toml that ./dev setup downloaded (setup_collections.py)."""
    wanted = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hostnet"]
    name, version = wanted["collections"]["wheel"].split("==")
    found = sorted((ROOT / ".cache" / "wheels").glob(f"{name}-{version}-*.whl"))
    if not found:
        raise MatrixError(f"{name}=={version} is not in .cache/wheels: run ./dev setup first")
    return found[-1]


def pypi_reachable(image: str) -> bool:
    """Whether a container on Docker's default bridge reaches PyPI (with this machine's CAs)."""
    probe = (
        "import urllib.request; "
        "urllib.request.urlopen('https://pypi.org/simple/pip/', timeout=15).read(1)"
    )
    done = subprocess.run(
        ["docker", "run", "--rm", *ca_args(), image, "python3", "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode == 0


def ca_args() -> list[str]:
    """This machine's CA bundle in the container, for machines behind a TLS-inspecting proxy
    (harmless elsewhere: the same public roots)."""
    if not Path(CA_BUNDLE).is_file():
        return []
    env = []
    for name in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        env += ["-e", f"{name}={CA_BUNDLE}"]
    return ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro", *env]


def release(wheel: Path) -> tuple[int, ...]:
    """(2, 20, 10) of ansible_core-2.20.10-py3-none-any.whl (a pre-release: its number part)."""
    version = wheel.name.split("-")[1]
    return tuple(int(re.match(r"\d*", part).group(0) or 0) for part in version.split("."))


def wheelhouse(core: Core, requirements: list[str]) -> Path:
    """Wheels for Python 3.13 of `core`, the unit tests' requirements, pip and the sanity tests'
    requirements, downloaded on this machine (for a container without a network)."""
    folder = CACHE / "wheels" / core.label
    folder.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "-q", "--progress-bar", "off", "-d"]
    base += [str(folder), "--python-version", "3.13", "--only-binary=:all:"]
    for platform in PLATFORMS:
        base += ["--platform", platform]
    log(f"{core.label}: downloading wheels for Python 3.13 into {folder.relative_to(ROOT)}")
    code, output = watch(
        [*base, core.requirement, *requirements, "pip"],
        f"{core.label} pip download",
        folder / "download.log",
        DEADLINES["venv"],
    )
    if code != 0:
        raise MatrixError(f"pip download for {core.label} failed:\n{output[-1500:]}")
    # ansible-test sanity installs its own pinned requirements (and pip) into venvs: one
    # download per frozen file (--no-deps; two files may pin one package differently).
    wheel = max(folder.glob("ansible_core-*.whl"), key=release)  # the one pip installs
    pinned = folder / "requirements"
    pinned.mkdir(exist_ok=True)
    with zipfile.ZipFile(wheel) as archive:
        files = [m for m in archive.namelist() if re.fullmatch(FROZEN, m)]
        for member in files:
            (pinned / Path(member).name).write_bytes(archive.read(member))
        source = archive.read("ansible_test/_internal/python_requirements.py").decode()
    pips = [f"pip=={v}" for v in re.findall(r"pip='([0-9.]+)'", source)]
    for index, target in enumerate([*sorted(pinned.glob("*.txt")), *pips]):
        what = ["-r", str(target)] if isinstance(target, Path) else [target]
        code, output = watch(
            [*base, "--no-deps", *what],
            f"{core.label} pip download (sanity {index + 1}/{len(files) + len(pips)})",
            folder / "download-sanity.log",
            DEADLINES["venv"],
        )
        if code != 0:
            raise MatrixError(f"pip download of {what[-1]} failed:\n{output[-1500:]}")
    return folder


def step_script(name: str, core: Core, requirements: list[str]) -> str:
    """The bash script of one step, run in SRC inside the container."""
    quoted = " ".join(f"'{r}'" for r in [core.requirement, *requirements])
    return {
        "venv": (
            f"python3 -m venv {VENV} && {VENV}/bin/python -m pip install -q --progress-bar off "
            f"--upgrade pip && {VENV}/bin/python -m pip install --progress-bar off {quoted} && "
            f"{VENV}/bin/python -c 'import sys, ansible.release as r; "
            'print("VERSIONS", r.__version__, sys.version.split()[0])\''
        ),
        "collections": f"python tools/setup_collections.py {SRC}/.cache/collections",
        "unit": "python -m pytest -q -p no:cacheprovider tests/unit "
        "--ignore=tests/unit/test_packaging.py",
        "packaging": "python -m pytest -q -p no:cacheprovider tests/unit/test_packaging.py",
        # The core as installed in the venv (a series resolves to one release).
        "sanity": "python tools/sanity.py --core "
        '"ansible-core==$(python -c "import ansible.release as r; print(r.__version__)")"',
    }[name]


def run_core(core: Core, image: str, requirements: list[str], options) -> Result:
    """One version in its own container: the steps of DEADLINES in order, each one logged in
    .cache/matrix/<version>/<step>.log; a failed step skips the rest."""
    offline, keep = options.offline, options.keep
    result = Result(core)
    started = time.monotonic()
    name = f"hlf-matrix-{core.label.replace('.', '-')}"
    logs = CACHE / core.label
    sh(["docker", "rm", "-f", name], check=False)  # a kept one of ours from an earlier run
    try:
        network = ["--network", "none"] if offline else []
        mounts = []
        if offline:
            mounts = ["-v", f"{wheelhouse(core, requirements)}:/wheels:ro"]
        else:
            cache = CACHE / "pip-cache"  # pip's cache: later runs download nothing
            cache.mkdir(parents=True, exist_ok=True)
            mounts = ["-v", f"{cache}:/root/.cache/pip"]
        sh(
            [
                "docker",
                "run",
                "-d",
                "--name",
                name,
                "--label",
                "hostnet.llamafactory.matrix=1",
                *network,
                *ca_args(),
                *mounts,
                "-e",
                "PIP_DISABLE_PIP_VERSION_CHECK=1",
                image,
                "sleep",
                "infinity",
            ]
        )
        tar = checkout_tar([collections_wheel()], options.untracked)
        subprocess.run(
            ["docker", "exec", "-i", name, "tar", "-x", "-C", "/"],
            input=tar,
            capture_output=True,
            timeout=300,
            check=True,
        )
        if offline:  # in pip's site-wide file: ansible-test passes pip no PIP_* variables
            pip_conf = (
                "printf '[global]\\nno-index = true\\nfind-links = /wheels\\n' >/etc/pip.conf"
            )
            sh(["docker", "exec", name, "sh", "-c", pip_conf])
        # A git work tree, as in a checkout: tools/sanity.py and ansible-test read git's list.
        git = "git -c user.name=matrix -c user.email=matrix@localhost"
        snapshot = f"git init -q && git add -A && {git} commit -qm 'matrix snapshot'"
        sh(["docker", "exec", "-w", SRC, name, "sh", "-c", snapshot])
        log(f"{core.label}: container {name}, checkout copied ({len(tar) // 1024} KiB)")
        env = [
            "-e",
            f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "-e",
            f"ANSIBLE_CONFIG={SRC}/ansible.cfg",
            "-e",
            f"PYTHONPATH={SRC}/tools",
        ]
        exec_ = ["docker", "exec", "-w", SRC, *env, name, "bash", "-euo", "pipefail"]
        for step in DEADLINES:
            check = Check(step)
            result.checks.append(check)
            if any(c.status != "pass" for c in result.checks[:-1]):
                continue  # skipped: an earlier step failed
            log(f"{core.label}: {step} (deadline {DEADLINES[step]} s)")
            began = time.monotonic()
            code, output = watch(
                [*exec_, "-c", step_script(step, core, requirements)],
                f"{core.label} {step}",
                logs / f"{step}.log",
                DEADLINES[step],
            )
            check.seconds = time.monotonic() - began
            check.status = "pass" if code == 0 else "fail"
            if step in ("unit", "packaging"):
                check.counts = pytest_counts(output)
            elif step == "sanity":
                check.counts = sanity_counts(output)
            elif step == "venv":
                found = re.search(r"^VERSIONS (\S+) (\S+)", output, re.MULTILINE)
                if found:
                    result.versions = {"ansible-core": found.group(1), "python": found.group(2)}
            elif step == "collections":
                result.versions["collections"] = ", ".join(
                    re.findall(r"setup: collection (\S+ \S+)", output)
                )
            if code != 0:
                check.detail = f"exit {code}; log: {(logs / f'{step}.log').relative_to(ROOT)}"
                tail = "\n".join(output.strip().splitlines()[-25:])
                log(f"{core.label}: {step} FAILED (exit {code}); the end of its output:\n{tail}")
            else:
                counts = f": {describe(check)}" if check.counts else ""
                log(f"{core.label}: {step} ok in {check.seconds:.0f} s{counts}")
    except (MatrixError, subprocess.SubprocessError, OSError) as exc:
        result.error = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else repr(exc)
        log(f"{core.label}: {exc}")
    finally:
        if keep:
            log(f"{core.label}: kept: docker exec -it -w {SRC} {name} bash")
            log(f"{core.label}: remove it with: docker rm -f {name}")
        else:
            sh(["docker", "rm", "-f", name], check=False)
    result.seconds = time.monotonic() - started
    return result


def ensure_image() -> str:
    from localcluster import cluster, images
    from localcluster.util import ClusterError

    try:
        return images.ensure_vm_image(
            cluster.client(), images.PLATFORMS[PLATFORM], cluster.cache_dir(), kind=KIND
        )
    except ClusterError as exc:
        raise MatrixError(f"the {PLATFORM} controller image: {exc}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="./dev matrix", description=__doc__.split("\n\n", maxsplit=1)[0].replace("\n", " ")
    )
    parser.add_argument(
        "--core",
        action="append",
        metavar="VERSION",
        help=f"ansible-core series or release to check, repeatable (default: "
        f"{' '.join(DEFAULT_CORES)})",
    )
    parser.add_argument("--keep", action="store_true", help="keep each container for debugging")
    parser.add_argument(
        "--untracked",
        action="store_true",
        help="also copy the files git does not track but does not ignore (new, uncommitted)",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="download the wheels here and run the containers without a network",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        minimum = minimum_core((ROOT / "meta" / "runtime.yml").read_text())
        cores = parse_cores(args.core, minimum)
        requirements = unit_requirements((ROOT / "pyproject.toml").read_text())
        collections_wheel()  # fail early when ./dev setup has not run
        if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode:
            raise MatrixError("Docker does not answer: start dockerd (./dev matrix checks it)")
        log(f"versions: {', '.join(c.requirement for c in cores)}")
        image = ensure_image()
        offline = args.offline
        if not offline and not pypi_reachable(image):
            log("a container does not reach PyPI: wheels are downloaded here instead")
            offline = True
        network = "offline (wheels from this machine)" if offline else "PyPI from the container"
        log(f"image {image}; {network}")
    except MatrixError as exc:
        print(f"matrix: error: {exc}", file=sys.stderr)
        return 2
    results = []
    for core in cores:
        log(f"{core.label}: {core.requirement}")
        args.offline = offline
        result = run_core(core, image, requirements, args)
        log(summary_line(result))
        results.append(result)
    seconds = time.monotonic() - started
    made = summary(results, image, seconds, network)
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "last.json").write_text(json.dumps(made, indent=2) + "\n")
    print(f"\ncontroller matrix ({seconds:.0f} s; {CACHE.relative_to(ROOT)}/last.json):")
    for result in results:
        print(f"  {summary_line(result)}")
    return 0 if made["passed"] else 1


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
