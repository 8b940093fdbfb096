"""./dev gpu-check: the collection's GPU-side checks on one machine with an NVIDIA GPU, outside
containers, without Docker, ansible-core or the internet (Python 3.8+ and PyTorch with CUDA).

It runs, each step with a deadline (all of it in well under 5 minutes):
  1. primary_nic's discovery on this machine (the module's own code, plugins/module_utils) and
     the network profile the machine type gives;
  2. an NCCL process group of world size 1 initialised with the rendered NCCL_SOCKET_IFNAME
     (exact-name form, "=NIC"), and an all_reduce on the GPU: must succeed;
  3. the same with a NIC name that does not exist: must fail fast, with NCCL's own message,
     which the collection's diagnosis must name;
  4. the preflight's smoke test (roles/preflight/files/smoke_allreduce.py) on its NCCL path
     through torchrun: algorithm bandwidth (bus bandwidth is 0 at world size 1);
  5. the GPU health checks on this machine's nvidia-smi output and kernel log (a kernel log it
     cannot read is reported as unread, not as clean).
What it saw (NCCL INFO lines included) goes to --out, to become test fixtures. Exit status: 0
when every step that could run passed, 1 otherwise; a step that cannot run here (no torch, no
GPU) is reported as skipped, with why.
"""

import argparse
import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NO_SUCH_NIC = "hlfnonic0"
NCCL_PROBE = r"""
import datetime, os, sys, time
import torch, torch.distributed as dist
torch.cuda.set_device(0)
started = time.time()
dist.init_process_group("nccl", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
tensor = torch.ones(1 << 20, device="cuda:0")
dist.all_reduce(tensor)
torch.cuda.synchronize()
print("nccl probe: all_reduce of world size 1 done in %.1f s, value %s"
      % (time.time() - started, float(tensor[0])), flush=True)
dist.destroy_process_group()
"""


def collection_modules():
    """The collection's module_utils and diagnosis, imported under their collection names from
    this checkout (no ansible-core needed: they use the standard library only)."""
    tree = Path(tempfile.mkdtemp(prefix="hlf-gpu-check-"))
    atexit.register(shutil.rmtree, tree, ignore_errors=True)
    (tree / "ansible_collections" / "hostnet").mkdir(parents=True)
    (tree / "ansible_collections" / "hostnet" / "llamafactory").symlink_to(ROOT)
    sys.path.insert(0, str(tree))
    from ansible_collections.hostnet.llamafactory.plugins.module_utils import (
        _gpu_health,
        _nic_host,
    )
    from ansible_collections.hostnet.llamafactory.plugins.plugin_utils import (
        _diagnosis,
    )

    return _nic_host, _gpu_health, _diagnosis


class Host:
    """What _nic_host needs of an AnsibleModule: get_bin_path and run_command."""

    def get_bin_path(self, name, required=False):
        path = shutil.which(name) or next(
            (p for p in (f"/usr/sbin/{name}", f"/sbin/{name}") if os.path.exists(p)), None
        )
        if path is None and required:
            raise RuntimeError(f"{name} is not installed (iproute2)")
        return path

    def run_command(self, args):
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
        return done.returncode, done.stdout, done.stderr


def metadata_opener(url, headers, timeout, follow_redirects, use_proxy):
    """ansible's open_url as _nic_host calls it, with urllib (no proxy, no redirects)."""
    del follow_redirects, use_proxy
    if not url.startswith("http://"):
        raise ValueError(f"{url}: the metadata server is asked over http:// only")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    # http:// only: the metadata server's URL (discover_network_metadata_url's default).
    return opener.open(urllib.request.Request(url, headers=headers), timeout=timeout)  # noqa: S310


def run(args, env, deadline, log_path):
    """(rc, output, seconds): args run with env, killed at the deadline; output saved."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            args,
            env=env,
            capture_output=True,
            text=True,
            timeout=deadline,
            check=False,
        )
        rc, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        output = f"{_text(exc.stdout)}{_text(exc.stderr)}\n[gpu-check] killed after {deadline} s\n"
    seconds = round(time.monotonic() - started, 1)
    log_path.write_text(output)
    return rc, output, seconds


def _text(value):
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def nccl_env(nic_name, port):
    env = dict(os.environ)
    env.update(
        {
            "NCCL_SOCKET_IFNAME": "=" + nic_name,
            "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_SUBSYS": "INIT,NET",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES", "0"),
        }
    )
    return env


def torch_status(python):
    """(why not, CUDA version, GPU count): why is None when torch with CUDA and a GPU is usable
    by `python`; the version and count are None where torch could not tell."""
    probe = "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.device_count())"
    try:
        done = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} could not run: {exc}", None, None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"PyTorch is not importable by {python} ({last})", None, None
    version, cuda, count = done.stdout.split()
    if cuda == "None" or int(count) == 0:
        return f"PyTorch {version} sees no CUDA GPU (CUDA {cuda}, {count} devices)", None, 0
    return None, cuda, int(count)


def check_nic(nic_host, out):
    params = {name: spec.get("default") for name, spec in nic_host.OPTIONS.items()}
    result = nic_host.discover(Host(), params, opener=metadata_opener)
    (out / "primary_nic.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    profile = result["network_profile"]
    return result, {
        "name": "primary_nic",
        "status": "passed",
        "detail": f"{result['interface']} {result['address']}/{result['prefix']} (found by "
        f"{result['method']}); network profile {profile['profile']} ({profile['why']})",
    }


def check_nccl(nic, python, out, diagnosis):
    steps = []
    port = free_port()
    rc, output, seconds = run(
        [python, "-c", NCCL_PROBE], nccl_env(nic, port), 180, out / "nccl-good-nic.log"
    )
    ok = rc == 0 and "nccl probe: all_reduce" in output
    steps.append(
        {
            "name": "nccl-good-nic",
            "status": "passed" if ok else "failed",
            "detail": f"NCCL_SOCKET_IFNAME=={nic}: "
            f"{'initialised and reduced' if ok else f'failed (exit {rc})'} in {seconds} s",
            "nccl_info": [line for line in output.splitlines() if "NCCL INFO" in line][:40],
        }
    )
    rc, output, seconds = run(
        [python, "-c", NCCL_PROBE],
        nccl_env(NO_SUCH_NIC, free_port()),
        120,
        out / "nccl-missing-nic.log",
    )
    named = [f["id"] for f in diagnosis.diagnose(output)]
    nccl_said = next(
        (line.strip() for line in output.splitlines() if "no socket interface" in line), None
    )
    ok = rc not in (0, 124) and seconds < 60 and "nccl-interface-missing" in named
    steps.append(
        {
            "name": "nccl-missing-nic",
            "status": "passed" if ok else "failed",
            "detail": f"NCCL_SOCKET_IFNAME=={NO_SUCH_NIC}: exit {rc} after {seconds} s; NCCL "
            f"said {nccl_said!r}; diagnosis: {', '.join(named) or 'nothing named'}",
        }
    )
    smoke = ROOT / "roles" / "preflight" / "files" / "smoke_allreduce.py"
    env = nccl_env(nic, free_port())
    args = [python, "-m", "torch.distributed.run", "--nproc_per_node=1", "--nnodes=1"]
    args += ["--master_addr=127.0.0.1", "--master_port=" + env["MASTER_PORT"], str(smoke)]
    args += ["--backend", "nccl", "--size-mb", "256", "--iterations", "10", "--deadline", "120"]
    rc, output, seconds = run(args, env, 180, out / "smoke-nccl.log")
    result = next(
        (json.loads(line)["smoke"] for line in output.splitlines() if line.startswith('{"smoke"')),
        None,
    )
    steps.append(
        {
            "name": "smoke-test-nccl",
            "status": "passed" if rc == 0 and result else "failed",
            "detail": (
                f"algorithm bandwidth {result['algbw_GBps']} GB/s ({result['bytes']} bytes, "
                f"{result['seconds_per_all_reduce']} s per all_reduce; bus bandwidth is 0 at "
                "world size 1)"
                if result
                else f"no result (exit {rc} after {seconds} s)"
            ),
            "smoke": result,
        }
    )
    return steps


def check_health(gpu_health, out, image_cuda, expected_gpus):
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"name": "gpu-health", "status": "skipped", "detail": "nvidia-smi is not installed"}
    xml = subprocess.run([smi, "-q", "-x"], capture_output=True, text=True, timeout=60, check=False)
    if xml.returncode != 0:
        return {
            "name": "gpu-health",
            "status": "failed",
            "detail": f"nvidia-smi -q -x failed (exit {xml.returncode}): "
            f"{xml.stderr.strip()[-300:]}",
        }
    (out / "nvidia-smi-q-x.xml").write_text(xml.stdout)
    query = subprocess.run(
        [smi, "--query-gpu=" + ",".join(gpu_health.QUERY_FIELDS), "--format=csv"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    (out / "nvidia-smi-query-gpu.csv").write_text(query.stdout + query.stderr)
    kernel_log = None
    for args in (["dmesg"], ["journalctl", "-k", "--no-pager", "-q"]):
        if shutil.which(args[0]):
            done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
            if done.returncode == 0 and done.stdout:
                kernel_log = done.stdout
                break
    parsed = gpu_health.parse_smi_xml(xml.stdout)
    # The GPUs CUDA sees (PyTorch) against those nvidia-smi lists; unknown without PyTorch.
    findings = gpu_health.check(parsed, kernel_log, expected_gpus, image_cuda)
    xid_lines = [e["line"] for e in gpu_health.xid_events(kernel_log)] if kernel_log else []
    (out / "kernel-xid.log").write_text("".join(line + "\n" for line in xid_lines))
    errors = [f for f in findings if f["level"] == "error"]
    return {
        "name": "gpu-health",
        "status": "failed" if errors else "passed",
        "detail": f"{len(parsed['gpus'])} GPU(s), driver {parsed['driver_version']} (CUDA "
        f"{parsed['cuda_version']}), PyTorch's CUDA {image_cuda}; kernel log "
        f"{'read' if kernel_log is not None else 'unread'}; findings: "
        + ("; ".join(f"{f['id']} ({f['level']})" for f in findings) or "none"),
        "gpus": parsed["gpus"],
        "findings": findings,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="./dev gpu-check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu-check")
    parser.add_argument(
        "--python", default=sys.executable, help="the Python with PyTorch (default: this one)"
    )
    args = parser.parse_args(argv)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    nic_host, gpu_health, diagnosis = collection_modules()
    steps = []
    nic = None
    try:
        nic, step = check_nic(nic_host, out)
        steps.append(step)
    except Exception as exc:  # noqa: BLE001 - any failure of the discovery is this step's result
        steps.append({"name": "primary_nic", "status": "failed", "detail": str(exc)})
    why_not, cuda, gpus = torch_status(args.python)
    if why_not or nic is None:
        reason = why_not or "no NIC was found (step primary_nic)"
        for name in ("nccl-good-nic", "nccl-missing-nic", "smoke-test-nccl"):
            steps.append({"name": name, "status": "skipped", "detail": reason})
    else:
        steps.extend(check_nccl(nic["interface"], args.python, out, diagnosis))
    steps.append(check_health(gpu_health, out, cuda, gpus or None))
    summary = {
        "seconds": round(time.monotonic() - started, 1),
        "host": socket.gethostname(),
        "steps": steps,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for step in steps:
        print(f"{step['name']:<17} {step['status']:<7} {step['detail']}")
    print(f"gpu-check: {summary['seconds']} s; what it saw is in {out}")
    return 1 if any(step["status"] == "failed" for step in steps) else 0


if __name__ == "__main__":
    sys.exit(main())
