"""The benchmarks, on a local cluster of their own ('bench', subnets moved by 6 x 32 /24s)
or, for the demo, through `./dev demo` itself. Every run has a deadline and prints progress.

Jobs: 'bench-base' trains once on vm0+vm1 (the image pulled from the cluster's registry, the
demo's config with a few steps); the hand launches and the all_reduce runs reuse what it staged
on the nodes (config, env file, image); 'bench-n8' trains once on 8 VMs for the re-run benchmark.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from localcluster import box_api, cluster, hub_double, registry, spec, train_image

from .results import Results

ROOT = Path(__file__).resolve().parents[2]
CLUSTER, SHIFT = "bench", 6
JOBS = "/var/lib/llamafactory/jobs"
SCRATCH = "/var/lib/llamafactory/bench"
BASE_JOB, N8_JOB = "bench-base", "bench-n8"
# Every bench job: the demo's config cut to a few steps (the re-run does not train anyway).
JOB_VARS = {"llamafactory_train_overrides": {"max_steps": 4, "save_steps": 2}}
SIZES_MB = [16, 32, 64, 128, 256]
# Which finding names each failure, and what the preflight run changes to cause it.
FAULTS = {
    "bridge networking": {
        "expect": "container-not-on-host-network",
        "vars": {"llamafactory_network_mode": "bridge", "llamafactory_allow_bridge": True},
    },
    # On the GCP path the firewall role names it (the API's address on the rule's network).
    "wrong NIC": {"expect": "which the rule is for", "vars": {"llamafactory_interface": "ext0"}},
    "blocked port": {"expect": "peer-unreachable", "vars": {}},
    # The report's third fault on GCP: no rule lets the VMs reach each other (the box's project
    # has no default-allow-internal); the preflight's run deletes the cut's rule itself.
    "no firewall rule": {"expect": "peer-unreachable", "vars": {"gcp_firewall_state": "absent"}},
    "two nodes at rank 0": {"expect": "llamafactory_node_rank must be unique", "vars": {}},
}
BLOCK_RULE = "INPUT -i {nic} -p tcp -m conntrack --ctstate NEW --dport 30000:65535 -j DROP"


def slug(text: str) -> str:
    """'wrong NIC' -> 'wrong-nic' (job, folder and log names)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchError(RuntimeError):
    pass


def vm_sh(container: str, script: str, timeout: float = 300, check: bool = True) -> str:
    try:
        result = subprocess.run(
            ["docker", "exec", container, "sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{container}: {script[:80]!r} did not finish in {timeout:.0f} s") from exc
    if check and result.returncode != 0:
        raise BenchError(
            f"{container}: {script[:120]!r} failed ({result.returncode}): "
            f"{(result.stderr or result.stdout)[-1500:]}"
        )
    return result.stdout


def parallel(function, items):
    with concurrent.futures.ThreadPoolExecutor(max(1, len(items))) as pool:
        return list(pool.map(function, items))


# ------------------------------------------------------------------ the controller's runs


def _become_subreaper() -> None:
    """Orphaned descendants (ssh's ControlPersist masters) become our children, so that their
    CPU time is counted in RUSAGE_CHILDREN once they are reaped."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise BenchError("prctl(PR_SET_CHILD_SUBREAPER) failed: the CPU figures would miss ssh")


def machine_busy_s() -> float:
    """CPU seconds this machine's cores have been busy since boot, all processes (the VMs'
    included): /proc/stat's user, nice, system, irq and softirq (not idle, iowait, the time a
    hypervisor gave to others, nor guest time, which user already counts)."""
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]
    )
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _cpu_of_children() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _end_ssh_masters(control_dir: Path) -> None:
    for socket_path in control_dir.iterdir():
        subprocess.run(
            ["ssh", "-O", "exit", "-o", f"ControlPath={socket_path}", "bench"],
            capture_output=True,
            timeout=20,
            check=False,
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # reap the masters (now our children)
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.1)


def watched(line: str, watch: str | tuple[str, ...]) -> bool:
    """Whether `line` holds `watch`, or one of its strings."""
    return any(text in line for text in ((watch,) if isinstance(watch, str) else watch))


def run_logged(
    command: list[str],
    log_path: Path,
    label: str,
    deadline_s: float,
    watch: str | tuple[str, ...] | None = None,
    env: dict | None = None,
) -> dict:
    """Run a controller command with its output in log_path and a progress line every 20 s;
    kill it at the deadline. Returns rc, seconds, cpu_s (it and every process it started,
    ssh masters included), seen_s (when `watch` first appeared in its output) and the output."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    control_dir = Path(tempfile.mkdtemp(prefix="hlf-bench-ssh-"))
    environment = {
        **os.environ,
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control_dir),
        "ANSIBLE_NOCOLOR": "1",
        **(env or {}),
    }
    state = {"seen": None, "task": "", "lines": []}
    cpu_before = _cpu_of_children()
    started = time.monotonic()
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment,
            cwd=ROOT,
            start_new_session=True,
        ) as process,
    ):

        def read():
            for line in process.stdout:
                log.write(line)
                log.flush()  # the log can be followed while the run goes on
                state["lines"].append(line)
                plain = re.sub(r"\x1b\[[0-9;]*m", "", line).strip(" *\n")
                if plain.startswith(("TASK [", "PLAY [", "==>", "[localcluster")):
                    state["task"] = plain
                if watch and state["seen"] is None and watched(line, watch):
                    state["seen"] = time.monotonic() - started

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        timed_out = False
        while True:
            try:
                process.wait(timeout=20)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed > deadline_s:
                    timed_out = True
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(timeout=30)
                    break
                say(f"{label}: {elapsed:.0f} s, {state['task'][:100]}")
        reader.join(timeout=30)
    seconds = time.monotonic() - started
    _end_ssh_masters(control_dir)
    cpu = _cpu_of_children() - cpu_before
    shutil.rmtree(control_dir, ignore_errors=True)
    output = "".join(state["lines"])
    if timed_out:
        raise BenchError(f"{label} did not finish within {deadline_s:.0f} s (log: {log_path})")
    return {
        "rc": process.returncode,
        "seconds": seconds,
        "cpu_s": cpu,
        "seen_s": state["seen"],
        "output": output,
    }


def changed_tasks(output: str) -> int:
    """The sum of changed= over the PLAY RECAP lines."""
    return sum(int(n) for n in re.findall(r"\bchanged=(\d+)", output.split("PLAY RECAP")[-1]))


# ------------------------------------------------------------------ the bench cluster


class BenchCluster:
    def __init__(self, nodes: int, logs: Path):
        self.definition = spec.load(name=CLUSTER, shift=SHIFT, nodes=nodes)
        self.logs = logs
        self.state: dict = {}
        self.pull_vars: Path | None = None
        self._box: box_api.Box | None = None

    def up(self) -> None:
        say(f"cluster {CLUSTER}: {len(self.definition.vms)} VMs")
        self.state = cluster.up(self.definition)
        client = cluster.client()
        train_image.ensure_assets(client, cluster.cache_dir())
        found = registry.start(self.definition, client, cluster.cache_dir())
        image = registry.push(client, found, train_image.TRAIN_IMAGE, registry.TRAIN_REPOSITORY)
        self.pull_vars = registry.pull_vars(found, image)
        self.image = image

    def push_standin(self) -> str:
        """The stand-in job's image (scale runs only) in the cluster's registry; its name."""
        client = cluster.client()
        found = registry.start(self.definition, client, cluster.cache_dir())
        local = train_image.ensure_standin_image(client, cluster.cache_dir())
        return registry.push(client, found, local, STANDIN_REPOSITORY)

    def down(self) -> None:
        cluster.down(self.definition)
        for derived in self.definition.inventory.parent.glob(f"{CLUSTER}-n*.gcp"):
            shutil.rmtree(derived)  # the inventories cut from the cluster's (see inventory())

    @property
    def nodes(self) -> list[dict]:
        return self.state["nodes"]

    @property
    def box(self) -> box_api.Box:
        """The cluster's Compute Engine API, as a GCP client reaches it."""
        if self._box is None:
            self._box = box_api.Box(self.state["gce"])
        return self._box

    def nodes_rule(self) -> dict:
        """The firewall rule train.yml made between the first two VMs (bench-base's)."""
        rule = self.box.rule(f"{self.inventory(2).name.removesuffix('.gcp')}-nodes")
        if rule is None:
            raise BenchError("the rule between the first two VMs is missing: train bench-base")
        return rule

    def inventory(
        self, count: int, duplicate_rank: bool = False, host_vars: dict | None = None
    ) -> Path:
        """The cluster's GCP-path inventory (the shipped dynamic inventory pointed at the box)
        with its group cut to the VMs of rank < `count`: every VM is still listed by the API, as
        in a project with other VMs, only the group differs (and, with duplicate_rank, every
        node's rank is 0; with host_vars, {VM name: its variables} in host_vars/ of a folder of
        its own)."""
        source = Path(self.state["gcp_inventory"])
        suffix = "-rank0" if duplicate_rank else "-vars" if host_vars else ""
        folder = source.with_name(f"{CLUSTER}-n{count}{suffix}.gcp")
        folder.mkdir(exist_ok=True)
        if host_vars:  # this run's alone: an earlier run's files removed first
            shutil.rmtree(folder / "host_vars", ignore_errors=True)
            (folder / "host_vars").mkdir()
            for name, variables in host_vars.items():
                (folder / "host_vars" / f"{name}.yml").write_text(yaml.safe_dump(variables))
        config = yaml.safe_load((source / "gcp_compute.yml").read_text())
        group = config["groups"]["llamafactory"]
        config["groups"]["llamafactory"] = (
            f"({group}) and (labels['llamafactory-rank'] | int) < {count}"
        )
        if duplicate_rank:
            config["compose"]["llamafactory_node_rank"] = "0"
        (folder / "gcp_compute.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        shutil.copy(source / "box.yml", folder / "box.yml")
        if not (folder / "group_vars").is_symlink():
            (folder / "group_vars").symlink_to(Path("..") / "group_vars")
        return folder

    def train(self, inventory: Path, job: str, label: str, deadline_s: float, **extra) -> dict:
        watch = extra.pop("_watch", None)
        playbook = extra.pop("_playbook", "playbooks/train.yml")
        env = {**self.state["gce"]["env"], **extra.pop("_env", {})}
        revision = extra.pop("_revision", None)
        if revision is not None:  # the collection at another revision (compare)
            playbook = str(revision.tree / playbook)
            env.update(revision.env)
        # Each cut of the cluster is a cluster of its own to the firewall role (its own rule):
        # one rule rewritten for 2 and then 8 nodes would change at every re-run.
        variables = {
            **JOB_VARS,
            "llamafactory_job": job,
            "gcp_firewall_cluster_name": Path(inventory).name.removesuffix(".gcp"),
            **extra,
        }
        command = [
            "ansible-playbook",
            playbook,
            "-i",
            str(inventory),
            "-e",
            f"@{self.pull_vars}",
            "-e",
            json.dumps(variables),
        ]
        log_path = self.logs / f"{slug(label)}.log"
        # The box's API proxy and CA: the dynamic inventory and the firewall role reach it.
        return run_logged(command, log_path, label, deadline_s, watch=watch, env=env)

    def ensure_trained(self, count: int, job: str, deadline_s: float, revision=None) -> None:
        """Train `job` on the first `count` VMs (a re-run that keeps it when it finished before
        with the same inputs), with the collection of `revision` (a Revision; None: this tree)."""
        inventory = self.inventory(count)
        say(f"job {job}: training once on {count} VMs (pulls the image where missing)")
        # A job left by an earlier bench run with other inputs (e.g. new demo assets) is replaced.
        result = self.train(
            inventory,
            job,
            f"first run of {job}",
            deadline_s,
            launch_restart_on_change=True,
            _revision=revision,
        )
        if result["rc"] != 0:
            raise BenchError(
                f"job {job} failed (rc {result['rc']}); see {self.logs}: {result['output'][-1500:]}"
            )
        say(f"job {job}: done in {result['seconds']:.0f} s")


# ------------------------------------------------------------------ 1. time to a named cause


def _hand_prepare(vm: dict, case: str, rank: int, nodes: list[dict]) -> tuple[str, str]:
    """A copy of bench-base's staged files for a hand launch and its `docker run` line: the
    user's command from the report, with only `case`'s mistake in it."""
    container = vm["container"]
    base_dir, hand_dir = f"{JOBS}/{BASE_JOB}", f"{SCRATCH}/hand-{slug(case)}"
    info = json.loads(vm_sh(container, f"docker inspect llamafactory-{BASE_JOB}"))[0]
    env = {}
    for line in vm_sh(container, f"cat {base_dir}/env").splitlines():
        key, _sep, value = line.partition("=")
        if key:
            env[key] = value
    master = nodes[0]["vpc_address"]
    env.update(MASTER_ADDR=master, MASTER_PORT="29500", NNODES=str(len(nodes)))
    network = ["--network", "host"]
    if case == "bridge networking":  # the report: Docker's bridge, 29500 published, no NIC set
        network = ["-p", "29500:29500"]
        env.pop("NCCL_SOCKET_IFNAME", None)
        env.pop("GLOO_SOCKET_IFNAME", None)
    elif case == "wrong NIC":
        env.update(NCCL_SOCKET_IFNAME="ext0", GLOO_SOCKET_IFNAME="ext0")
    elif case == "two nodes at rank 0":  # RANK=0/1 as before 0.9.1; 0.9.5 reads NODE_RANK
        env.pop("NODE_RANK", None)
        env["RANK"] = str(rank)
    binds = [b.replace(base_dir, hand_dir) for b in info["HostConfig"]["Binds"] or []]
    command = [part.replace(base_dir, hand_dir) for part in info["Config"]["Cmd"]]
    env_text = "".join(f"{k}={v}\n" for k, v in sorted(env.items()))
    vm_sh(
        container,
        f"rm -rf {hand_dir} && mkdir -p {hand_dir} && cd {base_dir} && "
        f"tar --exclude=./output --exclude=./smoke -cf - . | tar -C {hand_dir} -xf - && "
        f"sed -i 's#{base_dir}#{hand_dir}#g' {hand_dir}/config.yaml && "
        f"printf %s {shlex.quote(env_text)} > {hand_dir}/env && rm -rf {hand_dir}/output",
    )
    run = [
        "docker",
        "run",
        "-d",
        "--name",
        "bench-hand",
        *network,
        "--ipc",
        "host",
        "--env-file",
        f"{hand_dir}/env",
        "--workdir",
        hand_dir,
    ]
    for bind in binds:
        run += ["-v", bind]
    run += [info["Config"]["Image"], *command]
    return " ".join(shlex.quote(part) for part in run), hand_dir


# The lines a user would read as the error, most telling first.
TELLING = (
    r"Connection refused|timed out|No route|unreachable|Unable to find|172\.17\.|"
    r"DistNetworkError|DistStoreError|RuntimeError|TimeoutError",
    r"Error|error|failed",
)


def error_line(lines: list[str]) -> str:
    """The line of a rank's log that says what went wrong, as far as it says anything."""
    for pattern in TELLING:
        found = [line for line in lines if re.search(pattern, line)]
        found = [line for line in found if "CalledProcessError" not in line] or found
        if found:
            return found[-1].strip()
    return (lines or ["(no output)"])[-1].strip()


def hand_launch(nodes: list[dict], case: str, cap: float, log_stem: Path) -> dict:
    """Start the hand launch on both VMs at once; seconds until a rank exits with an error (the
    user sees a failure) or the cap (a hang). What the user sees: that rank's telling line (both
    ranks' logs are kept next to the results)."""
    pair = nodes[:2]
    prepared = [_hand_prepare(vm, case, rank, pair) for rank, vm in enumerate(pair)]
    parallel(lambda vm: vm_sh(vm["container"], "docker rm -f bench-hand", check=False), pair)
    started = time.monotonic()
    starts = list(zip(pair, prepared, strict=True))
    parallel(lambda item: vm_sh(item[0]["container"], item[1][0]), starts)
    outcome, seconds, failed = "hang", cap, []
    try:
        while time.monotonic() - started < cap:
            states = parallel(
                lambda vm: vm_sh(
                    vm["container"],
                    "docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' bench-hand",
                    check=False,
                ).split(),
                pair,
            )
            failed = [i for i, s in enumerate(states) if s and s[0] == "exited" and s[1] != "0"]
            if failed:
                seconds, outcome = time.monotonic() - started, "failed"
                break
            if all(s and s[0] == "exited" for s in states):
                seconds, outcome = time.monotonic() - started, "completed"
                break
            time.sleep(1)
        logs = parallel(
            lambda vm: vm_sh(vm["container"], "docker logs bench-hand 2>&1", check=False), pair
        )
    finally:
        parallel(
            lambda item: vm_sh(
                item[0]["container"], f"docker rm -f bench-hand; rm -rf {item[1][1]}", check=False
            ),
            starts,
        )
    log_stem.parent.mkdir(parents=True, exist_ok=True)
    for rank, text in enumerate(logs):
        log_stem.with_name(f"{log_stem.name}-rank{rank}.log").write_text(text)
    if failed:
        shown = f"rank {failed[0]}: {error_line(logs[failed[0]].splitlines())}"
    elif outcome == "hang":
        last = (logs[1].strip().splitlines() or ["(no output)"])[-1]
        shown = f"no error within {cap:.0f} s; rank 1's last line: {last}"
    else:
        shown = "both ranks exited 0"
    return {  # a run that trained shows no failure: no time to one, and no ratio
        "seconds": None if outcome == "completed" else round(seconds, 1),
        "capped": outcome == "hang",
        "outcome": outcome,
        "named": False,
        "shown": shown[:300],
    }


def preflight_launch(
    bench: BenchCluster, case: str, rep: int, cap: float, revision=None, label: str = ""
) -> dict:
    fault = FAULTS[case]
    inventory = bench.inventory(2, duplicate_rank=case == "two nodes at rank 0")
    job = "ttc-" + slug(case)
    result = bench.train(
        inventory,
        job,
        f"preflight {case} {rep}{label}",
        deadline_s=max(cap, 300),
        _watch=fault["expect"],
        _revision=revision,
        **fault["vars"],
    )
    named = result["seen_s"] is not None and result["rc"] != 0
    seconds = min(result["seen_s"] if named else result["seconds"], cap)
    said = ""
    match = re.search(rf"{re.escape(fault['expect'])}[^\n\"]*", result["output"])
    if match:  # from the finding's id to the end of its line
        said = match.group(0).strip(" -\\n")[:300]
    return {
        "seconds": round(seconds, 1),
        "capped": not named and result["seconds"] >= cap,
        "named": named,
        "rc": result["rc"],
        "shown": said,
    }


def fault_applied(bench: BenchCluster, case: str, hand: bool):
    """The fault of `case` on the cluster for one run, undone after it."""
    # A firewall between the nodes that lets MASTER_PORT through but no high port.
    blocked = bench.nodes[:2] if case == "blocked port" else []
    # The nodes' rule, deleted for the hand launch (the preflight's run deletes it itself) and
    # put back after either.
    rule = bench.nodes_rule() if case == "no firewall rule" else None
    rules = {rule["name"]: rule} if rule is not None else {}
    return faults_on(bench, blocked, rules, deleted=list(rules) if hand else [])


@contextlib.contextmanager
def faults_on(bench: BenchCluster, blocked: list[dict], rules: dict, deleted: list[str]):
    """For one run: new TCP connections to the high ports (BLOCK_RULE) dropped on the `blocked`
    VMs, and the firewall rules named in `deleted` deleted; after it, the VMs' iptables rule
    taken back and every rule of `rules` ({name: rule}) that is missing put back (a run may
    delete one itself)."""
    for vm in blocked:
        vm_sh(vm["container"], f"iptables -I {BLOCK_RULE.format(nic=vm['nic'])}")
    for name in deleted:
        bench.box.delete_rule(name)
    try:
        yield
    finally:
        for vm in blocked:
            vm_sh(vm["container"], f"iptables -D {BLOCK_RULE.format(nic=vm['nic'])}", check=False)
        for name, rule in rules.items():
            if bench.box.rule(name) is None:
                bench.box.insert_rule(rule)


def time_to_cause(bench: BenchCluster, results: Results, reps: int, cap: float) -> None:
    nodes = bench.nodes
    for rep in range(1, reps + 1):
        for case in FAULTS:
            for variant in ("preflight", "hand") if rep % 2 else ("hand", "preflight"):
                if results.has("time-to-cause", case, variant, rep):
                    continue
                say(f"time to cause: {case}, {variant}, repetition {rep} of {reps}")
                with fault_applied(bench, case, hand=variant == "hand"):
                    if variant == "hand":
                        stem = bench.logs / f"hand-{slug(case)}-{rep}"
                        figures = hand_launch(nodes, case, cap, stem)
                    else:
                        figures = preflight_launch(bench, case, rep, cap)
                results.add("time-to-cause", case, variant, rep, **figures)
                say(
                    f"  {figures['seconds']} s ({figures.get('outcome', 'named')}): "
                    f"{figures['shown'][:160]}"
                )


# ------------------------------------------------------------------ 3. all_reduce


def _prepare_allreduce(vm: dict, image: str) -> None:
    """The sweep script on the VM and, for the bare runs, the image's files unpacked on the
    VM itself (run with chroot: no namespaces, no cgroup of its own)."""
    script = (Path(__file__).with_name("allreduce_sweep.py")).read_text()
    rootfs = f"{SCRATCH}/rootfs"
    vm_sh(
        vm["container"],
        f"mkdir -p {SCRATCH} && cat > {SCRATCH}/sweep.py <<'EOF'\n{script}\nEOF",
    )
    marker = f"{rootfs}/opt/llamafactory/bin/torchrun"
    present = vm_sh(vm["container"], f"test -x {marker} && echo yes", check=False).strip()
    if not present:
        say(f"{vm['name']}: unpacking the training image for the bare runs")
        vm_sh(
            vm["container"],
            f"docker rm -f bench-rootfs >/dev/null 2>&1; mkdir -p {rootfs} && "
            f"docker create --name bench-rootfs {shlex.quote(image)} >/dev/null && "
            f"docker export bench-rootfs | tar -x -C {rootfs} && docker rm bench-rootfs",
            timeout=900,
        )
    vm_sh(
        vm["container"],
        f"cp /etc/hosts /etc/hostname {rootfs}/etc/ && "
        f"for d in proc sys dev; do mountpoint -q {rootfs}/$d || "
        f"mount --rbind /$d {rootfs}/$d; done && cp {SCRATCH}/sweep.py {rootfs}/sweep.py",
    )


def _cleanup_allreduce(vm: dict) -> None:
    rootfs = f"{SCRATCH}/rootfs"
    vm_sh(
        vm["container"],
        f"for d in dev sys proc; do umount -R {rootfs}/$d 2>/dev/null; done; "
        f"docker rm -f bench-ar >/dev/null 2>&1; rm -rf {SCRATCH}",
        check=False,
        timeout=600,
    )


def _sweep(vm: dict, variant: str, image: str, sizes: list[float], deadline: int) -> str:
    env_file = f"{JOBS}/{BASE_JOB}/env"
    torchrun = (
        'exec torchrun --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node 1 '
        '--master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" /sweep.py '
        f"--sizes {' '.join(str(s) for s in sizes)} --deadline {deadline}"
    )
    if variant == "container":  # the options of the role's launch.sh
        script = (
            f"docker rm -f bench-ar >/dev/null 2>&1; docker run --rm --name bench-ar "
            f"--network host --ipc host --env-file {env_file} "
            f"-v {SCRATCH}/sweep.py:/sweep.py:ro {shlex.quote(image)} sh -c {shlex.quote(torchrun)}"
        )
    else:
        rootfs = f"{SCRATCH}/rootfs"
        path = "/opt/llamafactory/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        inner = f"set -a; . /job.env; set +a; {torchrun}"
        script = (
            f"cp {env_file} {rootfs}/job.env && "
            f"chroot {rootfs} /usr/bin/env -i PATH={path} HOME=/root PYTHONUNBUFFERED=1 "
            f"sh -c {shlex.quote(inner)}"
        )
    return vm_sh(vm["container"], script + " 2>&1", timeout=deadline + 60)


def allreduce(bench: BenchCluster, results: Results, reps: int) -> None:
    pair = bench.nodes[:2]
    image = bench.image
    parallel(lambda vm: _prepare_allreduce(vm, image), pair)
    try:
        for rep in range(1, reps + 1):
            for variant in ("container", "bare") if rep % 2 else ("bare", "container"):
                if all(results.has("allreduce", f"{s} MB", variant, rep) for s in SIZES_MB):
                    continue
                say(f"all_reduce: {variant}, repetition {rep} of {reps} ({SIZES_MB} MB)")
                outputs = parallel(lambda vm, v=variant: _sweep(vm, v, image, SIZES_MB, 600), pair)
                lines = [
                    json.loads(line)["sweep"]
                    for line in outputs[0].splitlines()
                    if line.startswith('{"sweep"')
                ]
                if len(lines) != len(SIZES_MB):
                    raise BenchError(f"all_reduce {variant}: no result: {outputs[0][-1500:]}")
                for line in lines:
                    results.add(
                        "allreduce",
                        f"{line['size_mb']:g} MB",
                        variant,
                        rep,
                        busbw_GBps=line["busbw_GBps"],
                        seconds_per_all_reduce=line["seconds"],
                        iterations=line["iterations"],
                    )
                say("  " + ", ".join(f"{x['size_mb']:g} MB {x['busbw_GBps']} GB/s" for x in lines))
    finally:
        parallel(_cleanup_allreduce, pair)


# ------------------------------------------------------------------ 2. re-run overhead


def busy_fraction(first: list[int], second: list[int]) -> float:
    """The share of CPU time not idle between two readings of /proc/stat's `cpu` line."""
    deltas = [b - a for a, b in zip(first, second, strict=True)]
    total = sum(deltas)
    idle = deltas[3] + deltas[4]  # idle, iowait
    return (total - idle) / total if total > 0 else 0.0


def _cpu_line() -> list[int]:
    return [int(field) for field in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def settle(threshold: float = 0.5, quiet_s: float = 10, max_s: float = 180) -> float:
    """Wait until the machine's CPUs are busy less than `threshold` of the time for `quiet_s`
    (a training just ended: its containers and the VMs' Docker are still winding down), at most
    `max_s`; returns the seconds waited. Timed runs then start on a machine at rest."""
    started = time.monotonic()
    quiet_since = None
    while time.monotonic() - started < max_s:
        before = _cpu_line()
        time.sleep(2)
        busy = busy_fraction(before, _cpu_line())
        now = time.monotonic()
        if busy < threshold:
            quiet_since = quiet_since or now
            if now - quiet_since >= quiet_s:
                return now - started
        else:
            quiet_since = None
    say(f"the CPUs were still busy after {max_s:.0f} s; measuring anyway")
    return time.monotonic() - started


def container_cpu_s(container_id: str, cgroup_root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """A container's CPU seconds so far, from its cgroup (v1 cpuacct or v2 cpu.stat, Docker's
    cgroupfs or systemd layout); None where none of them is there."""
    v1 = cgroup_root / "cpuacct" / "docker" / container_id / "cpuacct.usage"
    if v1.exists():
        return int(v1.read_text()) / 1e9
    for v2 in (
        cgroup_root / "docker" / container_id / "cpu.stat",
        cgroup_root / "system.slice" / f"docker-{container_id}.scope" / "cpu.stat",
    ):
        if v2.exists():
            for line in v2.read_text().splitlines():
                if line.startswith("usage_usec "):
                    return int(line.split()[1]) / 1e6
    return None


def vms_cpu_s(vms: list[dict]) -> float | None:
    """The VMs' CPU seconds so far (every process in their containers), or None."""
    client = cluster.client()
    readings = [container_cpu_s(client.containers.get(vm["container"]).id) for vm in vms]
    return None if None in readings else sum(readings)


# A re-run starts when the CPUs were busy less than this share of the time for 5 s.
RERUN_REST = 0.2


def rest() -> float:
    """Before a timed run: the CPUs busy less than RERUN_REST of the time for 5 s (at most 60 s
    of waiting); the seconds waited."""
    return settle(threshold=RERUN_REST, quiet_s=5, max_s=60)


def rerun(bench: BenchCluster, results: Results, reps: int) -> None:
    _become_subreaper()
    # 8 VMs, also in a larger cluster (--nodes 32 for the scale series): the VMs beyond the
    # 8 trained ones have never run the job.
    counts = {"2 nodes": 2, "8 nodes": 8}
    if len(bench.nodes) < 8:
        raise BenchError("the re-run benchmark needs the cluster with 8 VMs")
    bench.ensure_trained(8, N8_JOB, deadline_s=2400)
    say(f"re-run: the machine at rest after {settle():.0f} s")
    jobs = {"2 nodes": BASE_JOB, "8 nodes": N8_JOB}
    for rep in range(1, reps + 1):
        for variant in ("2 nodes", "8 nodes") if rep % 2 else ("8 nodes", "2 nodes"):
            if results.has("rerun", "train.yml re-run", variant, rep):
                continue
            inventory = bench.inventory(counts[variant])
            vms = bench.nodes[: counts[variant]]
            # Each run from a machine at rest: the one before it leaves ssh masters, Docker and
            # journal writes winding down on the shared cores (a re-run takes only seconds).
            rested = rest()
            vms_before = vms_cpu_s(vms)
            result = bench.train(
                inventory, jobs[variant], f"re-run {variant} {rep}", deadline_s=900
            )
            vms_after = vms_cpu_s(vms)
            if result["rc"] != 0:
                raise BenchError(f"re-run on {variant} failed: {result['output'][-1500:]}")
            figures = {
                "seconds": round(result["seconds"], 1),
                "cpu_s": round(result["cpu_s"], 2),
                "cpu_s_per_node": round(result["cpu_s"] / counts[variant], 2),
                "changed": changed_tasks(result["output"]),
                "rested_s": round(rested, 1),
            }
            if vms_before is not None and vms_after is not None:
                figures["vm_cpu_s_per_node"] = round((vms_after - vms_before) / counts[variant], 2)
            results.add("rerun", "train.yml re-run", variant, rep, **figures)
            say(f"re-run {variant} {rep}: {figures}")


# ------------------------------------------------------------------ the scale series

STANDIN_REPOSITORY = "hostnet/standin:1"
SCALE_COUNTS = (2, 8, 16, 32)
SCALE_STEPS = 120  # 0.5 s each (the stand-in's default): about a minute of waiting
# Ansible's own default (this repository's ansible.cfg says 25): what a user of the collection
# gets without a configuration of their own.
SCALE_ENV = {"ANSIBLE_FORKS": "5"}
# The launch's and the fault's tasks timed (profile_tasks) at 2 VMs and at the largest count.
SCALE_PROFILES = {
    "launch, detached (s)": "profile-scale-launch",
    "time to a named cause (s)": "profile-scale-fault",
}


def scale(bench: BenchCluster, results: Results, reps: int) -> None:
    """The stand-in job (tools/localcluster/standin: real launch, wait, re-run code; no
    training) on 2, 8, 16 and 32 VMs with 5 forks: launched detached, waited for by
    playbooks/wait.yml (its controller CPU per VM per minute of waiting), re-run with the job
    finished, then a job with the profile's fault (bridge networking) until the preflight names
    it. Each count's figures are paired with the 2-VM run of the same repetition."""
    _become_subreaper()
    counts = [c for c in SCALE_COUNTS if c <= len(bench.nodes)]
    if counts[-1] < 8:
        raise BenchError("the scale series needs a cluster of 8 VMs or more (--nodes 32)")
    job_vars = _standin_setup(bench, counts[-1], "scale")
    # (The 2-VM cases are never stored under their own name: count 2 is measured in every
    # repetition, for the pairs.)
    todo = [
        (rep, count)
        for rep in range(1, reps + 1)
        for count in counts
        if not all(results.has("scale", case, "N VMs", rep) for case in _scale_cases(count))
    ]
    for rep in range(1, reps + 1):
        measured, saved = {}, set()
        for count in counts if rep % 2 else list(reversed(counts)):
            if (rep, count) not in todo:
                continue
            measured[count] = _scale_once(bench, count, rep, job_vars)
            profiles = measured[count].pop("profiles", {})
            if count in (2, counts[-1]):
                variant = "2 VMs" if count == 2 else "N VMs"
                results.add_many(
                    [
                        (SCALE_PROFILES[name], task, variant, rep, {"seconds": seconds})
                        for name, tasks in profiles.items()
                        for task, seconds in tasks.items()
                    ]
                )
            # Saved as soon as it pairs with the 2-VM run: a larger count that fails later
            # leaves what was measured.
            if 2 not in measured:
                continue
            items = []
            for done, figures in measured.items():
                if done == 2 or done in saved:
                    continue
                saved.add(done)
                for name, value in figures.items():
                    case = f"{name}, {done} VMs"
                    items.append(("scale", case, "2 VMs", rep, {"value": measured[2][name]}))
                    items.append(("scale", case, "N VMs", rep, {"value": value}))
            if items:
                results.add_many(items)


def _standin_setup(bench: BenchCluster, count: int, name: str) -> dict:
    """The stand-in's job settings, after every VM is set up (Docker's settings, the stand-in's
    image pulled) by one unmeasured launch on the first `count`: each measured run is then a new
    job on prepared nodes, as after any first run, not the first-time setup of the VMs."""
    job_vars = {
        "llamafactory_image": bench.push_standin(),
        "preflight_smoke_test": False,  # the stand-in image has no torch
        "llamafactory_train_overrides": {"max_steps": SCALE_STEPS, "save_steps": 40},
        "_env": SCALE_ENV,
    }
    warm = bench.train(
        bench.inventory(count),
        f"{name}-warm-n{count}",
        f"{name}: every VM set up ({count})",
        3600,
        launch_wait=False,
        **dict(job_vars),
    )
    if warm["rc"] != 0:
        raise BenchError(f"{name}: the set-up launch failed: {warm['output'][-1500:]}")
    # Its ranks would share the cores with the first measured runs (and hold ports): waited for.
    _waited(bench, bench.inventory(count), f"{name}-warm-n{count}", f"{name}: set-up", job_vars)
    return job_vars


SCALE_FIGURES = (
    "launch, detached (s)",
    "launch: controller CPU s per VM",
    "launch: the machine's cores busy (%)",
    "wait for a 1-minute job (s)",
    "wait: controller CPU s per VM per minute",
    "re-run (s)",
    "re-run: controller CPU s per VM",
    "time to a named cause (s)",
)


def _scale_cases(count: int) -> list[str]:
    return [f"{name}, {count} VMs" for name in SCALE_FIGURES]


def _scale_once(bench: BenchCluster, count: int, rep: int, job_vars: dict) -> dict:
    inventory = bench.inventory(count)
    job = f"scale-n{count}-r{rep}"
    label = f"scale {count} VMs {rep}"
    # profile_tasks (its recap at the end) on the launch and the fault: where the time goes.
    profiled = dict(job_vars, _env={**job_vars["_env"], **scale_profile_env()})
    # Each timed run starts on a machine at rest: what the run before left winding down (probes
    # ending, containers removed, agents lingering) would land on whichever count runs next.
    rest()
    launched, busy, waited = _launched_and_waited(bench, inventory, job, label, profiled, job_vars)
    rest()
    rerun = bench.train(inventory, job, f"{label}: re-run", 1800, **dict(job_vars))
    if rerun["rc"] != 0 or changed_tasks(rerun["output"]) != 0:
        raise BenchError(f"{label}: the re-run failed or changed: {rerun['output'][-1500:]}")
    rest()
    faulty = _fault_named(bench, inventory, f"scale-fault-n{count}-r{rep}", label, profiled)
    figures = {
        "launch, detached (s)": round(launched["seconds"], 1),
        "launch: controller CPU s per VM": round(launched["cpu_s"] / count, 2),
        # The VMs and the controller share this machine's cores: how busy the launch kept them.
        "launch: the machine's cores busy (%)": round(
            100 * busy / (launched["seconds"] * (os.cpu_count() or 1)), 1
        ),
        "wait for a 1-minute job (s)": round(waited["seconds"], 1),
        "wait: controller CPU s per VM per minute": round(
            waited["cpu_s"] / count / (waited["seconds"] / 60), 3
        ),
        "re-run (s)": round(rerun["seconds"], 1),
        "re-run: controller CPU s per VM": round(rerun["cpu_s"] / count, 2),
        "time to a named cause (s)": round(faulty["seen_s"], 1),
    }
    say(f"{label}: {figures}")
    figures["profiles"] = {
        "launch, detached (s)": {
            WHOLE_RUN: round(launched["seconds"], 1),
            **task_profile(launched["output"]),
        },
        "time to a named cause (s)": {
            WHOLE_RUN: round(faulty["seconds"], 1),
            **task_profile(faulty["output"]),
        },
    }
    return figures


def _launched_and_waited(
    bench: BenchCluster, inventory: Path, job: str, label: str, launch_vars: dict, wait_vars: dict
) -> tuple[dict, float, dict]:
    """A detached launch of `job`, then playbooks/wait.yml until it finishes: the launch's run
    (rc, seconds, cpu_s...), the machine's busy CPU seconds during it, and the wait's run."""
    busy_before = machine_busy_s()
    launched = bench.train(
        inventory, job, f"{label}: launch", 3600, launch_wait=False, **launch_vars
    )
    busy = machine_busy_s() - busy_before
    if launched["rc"] != 0:
        raise BenchError(f"{label}: the launch failed: {launched['output'][-1500:]}")
    return launched, busy, _waited(bench, inventory, job, label, wait_vars)


def _waited(bench: BenchCluster, inventory: Path, job: str, label: str, wait_vars: dict) -> dict:
    """playbooks/wait.yml until `job` finishes: its run (rc, seconds, cpu_s...)."""
    waited = bench.train(
        inventory, job, f"{label}: wait", 1800, _playbook="playbooks/wait.yml", **dict(wait_vars)
    )
    if waited["rc"] != 0 or f"job {job} finished" not in waited["output"]:
        raise BenchError(f"{label}: the wait failed: {waited['output'][-1500:]}")
    return waited


def _fault_named(
    bench: BenchCluster, inventory: Path, job: str, label: str, job_vars: dict
) -> dict:
    """The profile's fault, named by the preflight after every task before it (its probes run in
    the stand-in's image): a job of its own on the same VMs, until the preflight names it."""
    fault = FAULTS[PROFILE_FAULT]
    faulty = bench.train(
        inventory,
        job,
        f"{label}: {PROFILE_FAULT}",
        1800,
        _watch=fault["expect"],
        **job_vars,
        **fault["vars"],
        # Detached: a bridge-networked job's wait would need a fork per node (validation
        # refuses it with 5 forks); the preflight runs before the launch either way.
        launch_wait=False,
    )
    if faulty["rc"] == 0 or faulty["seen_s"] is None:
        raise BenchError(f"{label}: {fault['expect']} was not named: {faulty['output'][-1500:]}")
    return faulty


# One fault at a time, on 2 VMs and on every VM of the bench cluster. A node's own fault is put
# on the cut's last node (the farthest from the first forks, its probe's report gathered last by
# rank 0's): the finding must name it, not only its kind.
SCALE_FAULTS = {
    "bridge networking": {**FAULTS["bridge networking"], "node": False},
    "blocked port on the last node": {"expect": "peer-unreachable", "vars": {}, "node": True},
    "the last node at rank 0 too": {
        "expect": "llamafactory_node_rank must be unique",
        "vars": {},
        "node": True,
        "host_vars": {"llamafactory_node_rank": 0},
    },
    # Named by the firewall role; on 2 VMs the last node is rank 1, whose path back from rank
    # 0 is checked first (an asymmetric path: the same NIC named).
    "wrong NIC on the last node": {
        "expect": ("which the rule is for", "Asymmetric paths"),
        "vars": {},
        "node": True,
        "host_vars": {"llamafactory_interface": "ext0"},
    },
    "no firewall rule": {**FAULTS["no firewall rule"], "node": False},
}
# Ansible's prefix of a task's result ('fatal: [vm0]: FAILED! => {"msg": "', or its error's
# "[ERROR]: Task failed: Action failed: "): not the finding's words.
_HOST_PREFIX = re.compile(
    r"^\s*(?:(?:fatal|failed|ok|changed|skipping): \[[^\]]*\](?::\s*FAILED!)?(?:\s*=>\s*)?"
    r'(?:\{"msg":\s*")?|\[ERROR\]: Task failed: (?:Action failed: )?)'
)


def finding_line(output: str, expect: str | tuple[str, ...]) -> str:
    """The first line of `output` that holds the finding's id (or one of them), without
    Ansible's host prefix."""
    for line in output.splitlines():
        if watched(line, expect):
            return _HOST_PREFIX.sub("", line).strip()
    return ""


def names_node(line: str, node: str) -> bool:
    """Whether `line` names the VM `node` as a word of its own (vm3 is not in vm31)."""
    return re.search(rf"(?<![\w.-]){re.escape(node)}(?![\w-])", line) is not None


def scale_faults(bench: BenchCluster, results: Results, reps: int) -> None:
    """Each fault of SCALE_FAULTS with the stand-in job on 2 VMs and on every VM of the bench
    cluster (5 forks), alternating which count runs first: seconds until the preflight (or the
    validation, or the firewall role) names it, whether it did, and - a node's own fault, put
    on the cut's last node - whether the finding names that node."""
    _become_subreaper()
    count = len(bench.nodes)
    job_vars = _standin_setup(bench, count, "scale-faults")
    for rep in range(1, reps + 1):
        for case, fault in SCALE_FAULTS.items():
            order = ["2 VMs", "N VMs"] if rep % 2 else ["N VMs", "2 VMs"]
            for variant in order:
                if results.has("scale-faults", case, variant, rep):
                    continue
                cut = 2 if variant == "2 VMs" else count
                rest()
                figures = _scale_fault(bench, case, fault, cut, rep, job_vars)
                results.add("scale-faults", case, variant, rep, vms=cut, **figures)
                say(f"fault at scale: {case}, {cut} VMs: {figures}")


def _scale_fault(
    bench: BenchCluster, case: str, fault: dict, cut: int, rep: int, job_vars: dict
) -> dict:
    last = bench.nodes[cut - 1]
    inventory = bench.inventory(
        cut, host_vars={last["name"]: fault["host_vars"]} if fault.get("host_vars") else None
    )
    blocked = [last] if case.startswith("blocked port") else []
    # No rule between the nodes: the run deletes its cut's rule itself; the other cuts' rules
    # (which also cover these VMs) are deleted for the run. Every one is put back after it.
    rules = {}
    if case == "no firewall rule":
        rules = {
            name: rule
            for name, rule in bench.box.rules().items()
            if re.fullmatch(rf"{CLUSTER}-n\d+(-[a-z0-9]+)?-nodes", name)
        }
    others = [name for name in rules if name != f"{CLUSTER}-n{cut}-nodes"]
    with faults_on(bench, blocked, rules, deleted=others):
        result = bench.train(
            inventory,
            # A job of its own each time: one this cluster finished before would not launch.
            f"sf-{slug(case)}-n{cut}-r{rep}-{int(time.time()) % 100000}",
            f"scale fault {case} {cut} VMs {rep}",
            1800,
            _watch=fault["expect"],
            **job_vars,
            **fault["vars"],
            # The cut's own rule (a folder with host_vars would otherwise be a cluster of its own).
            gcp_firewall_cluster_name=f"{CLUSTER}-n{cut}",
            launch_wait=False,
        )
    named = result["seen_s"] is not None and result["rc"] != 0
    line = finding_line(result["output"], fault["expect"])
    return {
        "seconds": round(result["seen_s"] if named else result["seconds"], 1),
        "named": named,
        "node": last["name"] if fault["node"] else None,
        "node_named": names_node(line, last["name"]) if fault["node"] and named else None,
        "rc": result["rc"],
        "shown": line[:400],
    }


# Ansible's default, and the repository's ansible.cfg.
FORKS_VARIANTS = {"5 forks": "5", "25 forks": "25"}
FORKS_FIGURES = (
    "launch, detached (s)",
    "launch: controller CPU s per VM",
    "time to a named cause (s)",
)


def forks(bench: BenchCluster, results: Results, reps: int) -> None:
    """The stand-in job on every VM of the bench cluster (--nodes) with Ansible's default 5
    forks and with 25 (the repository's ansible.cfg), alternating which runs first: a detached
    launch (then waited for, unmeasured) and the profile's fault until the preflight names it."""
    _become_subreaper()
    count = len(bench.nodes)
    inventory = bench.inventory(count)
    job_vars = _standin_setup(bench, count, "forks")
    for rep in range(1, reps + 1):
        order = list(FORKS_VARIANTS) if rep % 2 else list(reversed(FORKS_VARIANTS))
        for variant in order:
            cases = [f"{name}, {count} VMs" for name in FORKS_FIGURES]
            if all(results.has("forks", case, variant, rep) for case in cases):
                continue
            rest()
            run_vars = dict(job_vars, _env={**SCALE_ENV, "ANSIBLE_FORKS": FORKS_VARIANTS[variant]})
            slug_ = variant.split()[0]
            label = f"forks {variant} {count} VMs {rep}"
            launched, _busy, _waited = _launched_and_waited(
                bench, inventory, f"forks-f{slug_}-r{rep}", label, run_vars, job_vars
            )
            faulty = _fault_named(bench, inventory, f"forks-fault-f{slug_}-r{rep}", label, run_vars)
            figures = dict(
                zip(
                    cases,
                    (
                        round(launched["seconds"], 1),
                        round(launched["cpu_s"] / count, 2),
                        round(faulty["seen_s"], 1),
                    ),
                    strict=True,
                )
            )
            say(f"{label}: {figures}")
            results.add_many(
                [("forks", case, variant, rep, {"value": value}) for case, value in figures.items()]
            )


# The floor series: what any per-node play costs here, with nothing of the collection's.
FLOOR_PLAYBOOK = ROOT / "tools" / "bench" / "floor.yml"
FLOOR_CASES = {
    "every task skipped": {"floor_calls": 0, "floor_local": False, "floor_container": False},
    "10 controller-only tasks per VM": {
        "floor_calls": 0,
        "floor_local": True,
        "floor_container": False,
    },
    "1 module call per VM": {"floor_calls": 1, "floor_local": False, "floor_container": False},
    "2 module calls per VM": {"floor_calls": 2, "floor_local": False, "floor_container": False},
    "4 module calls per VM": {"floor_calls": 4, "floor_local": False, "floor_container": False},
    "2 module calls and a container per VM": {
        "floor_calls": 2,
        "floor_local": False,
        "floor_container": True,
    },
}
FLOOR_FIGURES = ("wall (s)", "controller CPU s per VM", "the VMs' CPU s per VM")


def floor(bench: BenchCluster, results: Results, reps: int) -> None:
    """tools/bench/floor.yml on 2 VMs and on every VM of the bench cluster (--nodes), 5 forks,
    alternating which count runs first: module calls on every VM (ansible.builtin.command,
    become), controller-only tasks, a container of the stand-in's image started and removed on
    every VM - what a per-node design costs on this machine whatever the collection does."""
    _become_subreaper()
    count = len(bench.nodes)
    job_vars = _standin_setup(bench, count, "floor")  # the image on every VM
    counts = {"2 VMs": 2, "N VMs": count}
    for rep in range(1, reps + 1):
        for name, settings in FLOOR_CASES.items():
            order = list(counts) if rep % 2 else list(reversed(counts))
            for variant in order:
                cases = [f"{name}: {figure}, {count} VMs" for figure in FLOOR_FIGURES]
                if results.has("floor", cases[0], variant, rep):
                    continue
                settle(threshold=RERUN_REST, quiet_s=3, max_s=30)
                vms = bench.nodes[: counts[variant]]
                label = f"floor {name} {counts[variant]} VMs {rep}"
                vms_before = vms_cpu_s(vms)
                run = bench.train(
                    bench.inventory(counts[variant]),
                    "floor",
                    label,
                    900,
                    _playbook=str(FLOOR_PLAYBOOK),
                    _env=SCALE_ENV,
                    floor_image=job_vars["llamafactory_image"],
                    **settings,
                )
                vms_after = vms_cpu_s(vms)
                if run["rc"] != 0:
                    raise BenchError(f"{label}: rc {run['rc']}: {run['output'][-1500:]}")
                vms_s = None if None in (vms_before, vms_after) else vms_after - vms_before
                figures = (
                    round(run["seconds"], 1),
                    round(run["cpu_s"] / len(vms), 2),
                    None if vms_s is None else round(vms_s / len(vms), 2),
                )
                say(f"{label}: {figures}")
                results.add_many(
                    [
                        ("floor", case, variant, rep, {"value": value})
                        for case, value in zip(cases, figures, strict=True)
                        if value is not None
                    ]
                )


def scale_profile_env() -> dict:
    """ansible.posix's profile_tasks alone (no CPU file), its recap in playbook order."""
    return {
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
        **{k: v for k, v in PROFILE_ENV.items() if k.startswith("PROFILE_TASKS_")},
    }


# ------------------------------------------------------------------ the task profile

# ansible.posix's profile_tasks: every task's time (its start to the next task's start, all
# hosts together) listed once at the end, in playbook order.
PROFILE_ENV = {
    # task_cpu (tools/bench/callbacks): the controller's CPU per task, next to the wall time.
    "ANSIBLE_CALLBACK_PLUGINS": str(ROOT / "tools" / "bench" / "callbacks"),
    "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks,task_cpu",
    "PROFILE_TASKS_SUMMARY_ONLY": "true",
    "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
    "PROFILE_TASKS_SORT_ORDER": "none",
}
PROFILE_FAULT = "bridge networking"  # named by the preflight, after every task before it ran
WHOLE_RUN = "(the whole run)"


def task_profile(output: str) -> dict[str, float]:
    """profile_tasks' recap -> task name -> seconds (a task run more than once, e.g. an
    included file's, summed)."""
    recap = output.split("TASKS RECAP", 1)
    if len(recap) < 2:
        raise BenchError("no TASKS RECAP in the output: is ansible.posix installed?")
    times: dict[str, float] = {}
    for line in recap[1].splitlines():
        match = re.match(r"^(.+?) -+ (\d+\.\d+)s$", line.strip())
        if match:
            name = match.group(1)
            times[name] = round(times.get(name, 0.0) + float(match.group(2)), 2)
    return times


def task_cpu(path: Path) -> dict[str, float]:
    """task_cpu's file (tools/bench/callbacks/task_cpu.py) -> task name -> the controller's CPU
    seconds, rounded to 0.01."""
    if not path.exists():
        raise BenchError(f"{path} is missing: the task_cpu callback did not run")
    return {task: round(seconds, 2) for task, seconds in json.loads(path.read_text()).items()}


def profile(bench: BenchCluster, results: Results, reps: int) -> None:
    """Every task of train.yml timed on 2 and 8 VMs: a re-run with the job finished, and a run
    whose fault the preflight names."""
    counts = {"2 nodes": 2, "8 nodes": 8}
    if len(bench.nodes) < 8:
        raise BenchError("the profile needs the cluster with 8 VMs")
    bench.ensure_trained(8, N8_JOB, deadline_s=2400)
    say(f"profile: the machine at rest after {settle():.0f} s")
    jobs = {"2 nodes": BASE_JOB, "8 nodes": N8_JOB}
    fault = FAULTS[PROFILE_FAULT]
    for rep in range(1, reps + 1):
        for variant in ("2 nodes", "8 nodes") if rep % 2 else ("8 nodes", "2 nodes"):
            runs_ = {
                "profile-rerun": (jobs[variant], {}, 0),
                "profile-fault": ("profile-" + slug(PROFILE_FAULT), fault["vars"], 2),
            }
            for name, (job, extra, expected_rc) in runs_.items():
                if results.has(name, WHOLE_RUN, variant, rep):
                    continue
                label = f"{name} {variant} {rep}"
                cpu_file = bench.logs / f"{slug(label)}.cpu.json"
                cpu_file.unlink(missing_ok=True)
                result = bench.train(
                    bench.inventory(counts[variant]),
                    job,
                    label,
                    deadline_s=900,
                    _env={**PROFILE_ENV, "TASK_CPU_OUT": str(cpu_file)},
                    **extra,
                )
                if result["rc"] != expected_rc or (
                    expected_rc and fault["expect"] not in result["output"]
                ):
                    raise BenchError(
                        f"{name} on {variant}: rc {result['rc']}: {result['output'][-1500:]}"
                    )
                tasks = task_profile(result["output"])
                cpu = task_cpu(cpu_file)
                results.add_many(
                    [
                        (name, WHOLE_RUN, variant, rep, {"seconds": round(result["seconds"], 1)}),
                        *((name, task, variant, rep, {"seconds": t}) for task, t in tasks.items()),
                        (f"{name}-cpu", WHOLE_RUN, variant, rep, {"seconds": result["cpu_s"]}),
                        *(
                            (f"{name}-cpu", task, variant, rep, {"seconds": t})
                            for task, t in cpu.items()
                        ),
                    ]
                )
                say(f"{name} {variant} {rep}: {result['seconds']:.1f} s, {len(tasks)} tasks")


# ------------------------------------------------------------------ 3. failures


def _job_container(vm: dict, job: str) -> dict | None:
    found = vm_sh(vm["container"], f"docker inspect llamafactory-{job} || true", check=False)
    listed = json.loads(found) if found.strip().startswith("[") else []
    return listed[0] if listed else None


def _steps(vm: dict, job: str) -> list[int]:
    text = vm_sh(vm["container"], f"cat {JOBS}/{job}/output/trainer_log.jsonl || true", check=False)
    return [json.loads(line)["current_steps"] for line in text.splitlines() if line.strip()]


def _wait(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise BenchError(f"not within {seconds:.0f} s: {what}")


def _clean_job(bench: BenchCluster, job: str) -> None:
    for vm in bench.nodes[:2]:
        vm_sh(vm["container"], f"docker rm -f llamafactory-{job}; rm -rf {JOBS}/{job}", check=False)


def peer_lost(bench: BenchCluster, bound: int, rep: int) -> dict:
    """A detached job (launch_wait=false) whose rank 1 vanishes (packets from rank 0 dropped, its
    container paused): seconds from the cut until rank 0's container exited."""
    vm0, vm1 = bench.nodes[:2]
    job = f"fail-lost-{bound}"
    _clean_job(bench, job)
    result = bench.train(
        bench.inventory(2),
        job,
        f"peer lost {bound} s {rep}: launch",
        deadline_s=900,
        launch_wait=False,
        launch_peer_timeout=bound,
        llamafactory_train_overrides={"max_steps": 2000, "save_steps": 5000},
    )
    if result["rc"] != 0:
        raise BenchError(f"the detached launch failed: {result['output'][-1500:]}")
    _wait(lambda: _steps(vm0, job), 300, "the first step")
    address0 = json.loads(vm_sh(vm0["container"], f"cat {JOBS}/{job}/agent.json"))["address"]
    cut = f"iptables -I INPUT -s {address0} -j DROP; iptables -I OUTPUT -d {address0} -j DROP"
    vm_sh(vm1["container"], f"{cut}; docker pause llamafactory-{job}")
    started = time.monotonic()
    try:
        _wait(
            lambda: not (_job_container(vm0, job) or {}).get("State", {}).get("Running"),
            bound + 300,
            "rank 0 stopping",
        )
        seconds = time.monotonic() - started
    finally:
        vm_sh(
            vm1["container"],
            f"docker unpause llamafactory-{job}; iptables -D INPUT -s {address0} -j DROP; "
            f"iptables -D OUTPUT -d {address0} -j DROP",
            check=False,
        )
    code = (_job_container(vm0, job) or {}).get("State", {}).get("ExitCode")
    _clean_job(bench, job)
    return {"seconds": round(seconds, 1), "over_bound_s": round(seconds - bound, 1), "exit": code}


def restart_cost(bench: BenchCluster, case: str, rep: int) -> dict:
    """train.yml with launch_max_restarts 1; after the first checkpoint rank 1's container is
    killed or its VM stopped through the API (gcp_instances_restart_stopped): the controller
    restarts every rank; or a worker of rank 1 is killed (SIGKILL): the ranks' agents restart
    them in their containers. Seconds from the fault until rank 0 logs a step of the resumed
    run, and the play's total."""
    vm0, vm1 = bench.nodes[:2]
    job = "fail-" + slug(case)
    _clean_job(bench, job)
    outcome = {}
    extra = {"gcp_instances_restart_stopped": True} if case == "VM stopped" else {}

    def run():
        outcome["result"] = bench.train(
            bench.inventory(2),
            job,
            f"restart {case} {rep}",
            deadline_s=1500,
            launch_max_restarts=1,
            llamafactory_train_overrides={"max_steps": 40, "save_steps": 10},
            **extra,
        )

    thread = threading.Thread(target=run)
    thread.start()
    shard = f"{JOBS}/{job}/output/checkpoint-10/global_step10"
    _wait(
        lambda: (
            not thread.is_alive()
            or all(
                vm_sh(v["container"], f"test -d {shard} && echo y", check=False).strip() == "y"
                for v in (vm0, vm1)
            )
        ),
        900,
        "the first checkpoint",
    )
    if not thread.is_alive():
        raise BenchError(f"{job} ended before its first checkpoint")
    first_start = (_job_container(vm0, job) or {})["State"]["StartedAt"]
    started = time.monotonic()
    if case == "VM stopped":
        bench.box.act(vm1["name"], "stop")
    elif case == "worker killed":
        top = vm_sh(vm1["container"], f"docker top llamafactory-{job} -eo pid,args")
        worker = next(
            line.split()[0]
            for line in top.splitlines()
            if "launcher.py" in line and "torchrun" not in line
        )
        vm_sh(vm1["container"], f"kill -9 {worker}")
    else:
        vm_sh(vm1["container"], f"docker kill llamafactory-{job}")

    if case == "worker killed":  # the same containers: the resumed run appends to the log

        def training_again():
            text = vm_sh(vm0["container"], f"cat {JOBS}/{job}/agent-state.json", check=False)
            try:
                restarts = json.loads(text).get("restarts") or []
            except ValueError:
                return False
            return bool(restarts) and len(_steps(vm0, job)) > restarts[0]["step"]

    else:
        _wait(
            lambda: (
                not thread.is_alive()
                or not (_job_container(vm0, job) or {}).get("State", {}).get("Running")
            ),
            600,
            "rank 0 stopped",
        )
        before = len(_steps(vm0, job))

        def training_again():
            state = (_job_container(vm0, job) or {}).get("State", {})
            return state.get("StartedAt") != first_start and len(_steps(vm0, job)) > before

    _wait(lambda: not thread.is_alive() or training_again(), 1200, "training again")
    seconds = time.monotonic() - started
    thread.join(1500)
    result = outcome.get("result") or {}
    if result.get("rc") != 0:
        raise BenchError(f"{job}: the play failed: {result.get('output', '')[-1500:]}")
    lost = re.search(r"(\d+) steps lost", result["output"])
    _clean_job(bench, job)
    return {
        "seconds": round(seconds, 1),
        "play_s": round(result["seconds"], 1),
        "steps_lost": int(lost.group(1)) if lost else None,
    }


def failures(bench: BenchCluster, results: Results, reps: int) -> None:
    for rep in range(1, reps + 1):
        for bound in (30, 60) if rep % 2 else (60, 30):
            variant = f"launch_peer_timeout {bound} s"
            case = "rank 1's node cut off and frozen"
            if not results.has("peer-lost", case, variant, rep):
                figures = peer_lost(bench, bound, rep)
                results.add("peer-lost", case, variant, rep, **figures)
                say(f"peer lost, {variant}, {rep}: {figures}")
        # The container killed (the controller restarts) is compared with the VM stopped and
        # with a worker killed (the agents restart): one run, in both comparisons.
        cases = ["rank killed", "VM stopped", "worker killed"]
        for case in cases if rep % 2 else cases[::-1]:
            comparisons = RESTART_COMPARISONS[case]
            if all(results.has(bench_, row, variant, rep) for bench_, row, variant in comparisons):
                continue
            figures = restart_cost(bench, case, rep)
            for bench_, row, variant in comparisons:
                results.add(bench_, row, variant, rep, **figures)
            say(f"restart, {case}, {rep}: {figures}")


# The restart cases: (benchmark, row, variant) each run is recorded as.
RESTART_COMPARISONS = {
    "rank killed": [
        ("restart", "after the first checkpoint", "rank killed"),
        ("restart-on-nodes", "rank 1 after the first checkpoint", "container killed"),
    ],
    "VM stopped": [("restart", "after the first checkpoint", "VM stopped")],
    "worker killed": [
        ("restart-on-nodes", "rank 1 after the first checkpoint", "worker killed"),
    ],
}


# ------------------------------------------------------------------ outputs on Cloud Storage

OUTPUTS_STEPS = {"max_steps": 40, "save_steps": 4}
SYNTHETIC_MB = 256  # a checkpoint part of this size, for the transfer rates
VENV_PYTHON = "/opt/hostnet-llamafactory/outputs/venv/bin/python"
TRANSFER = """
import json, sys, time
sys.path.insert(0, "/opt/hostnet-llamafactory/outputs")
import _gcs_outputs as g
uri, job, folder, action = sys.argv[1:5]
store = g.Store(uri, job)
started = time.monotonic()
if action == "upload":
    g.sync_checkpoints(store, folder, 0, 1, set())
    assert store.newest_complete() == 1, store.checkpoints()
else:
    store.restore_part(folder, 1, 0)
print(json.dumps({"seconds": time.monotonic() - started}))
"""


def _all_results(vm: dict, job: str) -> dict:
    return json.loads(vm_sh(vm["container"], f"cat {JOBS}/{job}/output/all_results.json"))


def _sent_after_saved(bench: BenchCluster, job: str, uri: str) -> list[float]:
    """Per checkpoint: seconds from its last file written on a node to COMPLETE.json's time."""
    storage = box_api.Storage(bench.state["gcs"])
    prefix = uri.split("/", 3)[3] + f"/{job}/checkpoints/"
    try:
        marks = [n for n in storage.objects(prefix) if n.endswith("/COMPLETE.json")]
        delays = []
        for name in marks:
            step = name[len(prefix) :].split("/")[0]
            saved = max(
                float(
                    vm_sh(
                        vm["container"],
                        f"find {JOBS}/{job}/output/{step} -type f -printf '%T@\\n' "
                        "| sort -n | tail -1",
                        check=False,
                    ).strip()
                    or 0
                )
                for vm in bench.nodes[:2]
            )
            if saved:
                delays.append(json.loads(storage.read(name))["at"] - saved)
        return delays
    finally:
        storage.close()


def _transfer(vm: dict, uri: str, job: str, folder: str, action: str) -> float:
    out = vm_sh(
        vm["container"],
        f"REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt {VENV_PYTHON} "
        f"-c {shlex.quote(TRANSFER)} {uri} {job} {folder} {action}",
        timeout=900,
    )
    return json.loads(out.strip().splitlines()[-1])["seconds"]


def outputs(bench: BenchCluster, results: Results, reps: int) -> None:
    """The same job (40 steps, a checkpoint every 4) with and without llamafactory_output_uri,
    interleaved: the mean step time (train_runtime / steps), and with it the seconds from a
    checkpoint's last file to its COMPLETE.json in the bucket; then a synthetic checkpoint part
    of SYNTHETIC_MB sent and restored by the nodes' library on one VM."""
    uri = f"gs://{bench.state['gcs']['bucket']}/bench"
    vm0 = bench.nodes[0]
    for rep in range(1, reps + 1):
        for variant in ("with", "without") if rep % 2 else ("without", "with"):
            if results.has("outputs-step", "mean step time", f"{variant} output URI", rep):
                continue
            # A job of its own per run: the bucket keeps a finished job's checkpoints, and a
            # job of the same name would resume from its last one.
            job = f"outputs-{variant}-{rep}"
            _clean_job(bench, job)
            extra = {"llamafactory_output_uri": uri} if variant == "with" else {}
            result = bench.train(
                bench.inventory(2),
                job,
                f"outputs {variant} {rep}",
                deadline_s=1500,
                llamafactory_train_overrides=OUTPUTS_STEPS,
                **extra,
            )
            if result["rc"] != 0:
                raise BenchError(f"{job}: the play failed: {result['output'][-1500:]}")
            runtime = _all_results(vm0, job)["train_runtime"]
            step_s = runtime / OUTPUTS_STEPS["max_steps"]
            results.add(
                "outputs-step",
                "mean step time",
                f"{variant} output URI",
                rep,
                seconds=round(step_s, 4),
                play_s=round(result["seconds"], 1),
            )
            if variant == "with":
                delays = _sent_after_saved(bench, job, uri)
                results.add(
                    "outputs-transfer",
                    "a demo checkpoint saved -> complete in the bucket",
                    "upload",
                    rep,
                    seconds=round(sum(delays) / max(1, len(delays)), 2),
                    checkpoints=len(delays),
                )
            say(f"outputs {variant} {rep}: {step_s:.3f} s a step")
            _clean_job(bench, job)
        if results.has("outputs-transfer", f"{SYNTHETIC_MB} MB part", "restore", rep):
            continue
        folder = f"{SCRATCH}/outputs/out"
        vm_sh(
            vm0["container"],
            f"rm -rf {SCRATCH}/outputs && mkdir -p {folder}/checkpoint-1/global_step1 && "
            f"head -c {SYNTHETIC_MB}M /dev/urandom > {folder}/checkpoint-1/global_step1/shard.pt "
            f"&& echo {{}} > {folder}/checkpoint-1/trainer_state.json",
        )
        job = f"transfer-{rep}"
        sent = _transfer(vm0, uri, job, folder, "upload")
        vm_sh(vm0["container"], f"rm -rf {folder}/checkpoint-1")
        restored = _transfer(vm0, uri, job, folder, "restore")
        vm_sh(vm0["container"], f"rm -rf {SCRATCH}/outputs")
        for variant, seconds in (("upload", sent), ("restore", restored)):
            results.add(
                "outputs-transfer",
                f"{SYNTHETIC_MB} MB part",
                variant,
                rep,
                seconds=round(seconds, 2),
                mb_per_s=round(SYNTHETIC_MB / seconds, 1),
            )
        say(
            f"outputs transfer {rep}: {SYNTHETIC_MB} MB sent in {sent:.1f} s, "
            f"restored in {restored:.1f} s"
        )


# ------------------------------------------------------------------ 4. the demo


def demo(results: Results, reps: int, logs: Path, cold: bool) -> None:
    dev = str(ROOT / "dev")
    if cold and not results.has("demo", "./dev demo", "cold", 1):
        say("demo, cold: removing the local cluster's images first (./dev cluster rmi)")
        subprocess.run([dev, "cluster", "rmi"], check=True, cwd=ROOT, timeout=600)
        result = run_logged([dev, "demo"], logs / "demo-cold.log", "demo (cold)", 3600)
        if result["rc"] != 0:
            raise BenchError(f"./dev demo failed (cold): {result['output'][-1500:]}")
        results.add("demo", "./dev demo", "cold", 1, seconds=round(result["seconds"], 1))
    for rep in range(1, reps + 1):
        if results.has("demo", "./dev demo", "warm", rep):
            continue
        label = f"demo (warm {rep})"
        result = run_logged([dev, "demo"], logs / f"demo-warm-{rep}.log", label, 1800)
        if result["rc"] != 0:
            raise BenchError(f"./dev demo failed (warm): {result['output'][-1500:]}")
        results.add("demo", "./dev demo", "warm", rep, seconds=round(result["seconds"], 1))
        say(f"demo warm {rep}: {result['seconds']:.0f} s")


# ------------------------------------------------------------------ before and after a change


class Revision:
    """The collection at a git revision, run from a git worktree on a collections path of its
    own (the other collections from this checkout's .cache), on the same cluster, inventory and
    ansible.cfg as this working tree."""

    def __init__(self, rev: str, work: Path):
        sha = subprocess.run(
            ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        self.label = sha[:7]
        self.tree = work / f"tree-{self.label}"
        if not (self.tree / "galaxy.yml").exists():
            subprocess.run(
                ["git", "worktree", "add", "--force", "--detach", str(self.tree), sha],
                cwd=ROOT,
                capture_output=True,
                check=True,
            )
        # The job's generated assets (the tiny model and dataset the config names relative to
        # itself), which git does not hold: this checkout's.
        assets = self.tree / ".cache" / "assets"
        if (ROOT / ".cache" / "assets").is_dir() and not assets.exists():
            assets.parent.mkdir(parents=True, exist_ok=True)
            assets.symlink_to(ROOT / ".cache" / "assets")
        self.collections = work / f"collections-{self.label}"
        link = self.collections / "ansible_collections" / "hostnet" / "llamafactory"
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(self.tree)
        self.env = {
            "ANSIBLE_COLLECTIONS_PATH": f"{self.collections}:{ROOT / '.cache' / 'collections'}"
        }

    def remove(self) -> None:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(self.tree)],
            cwd=ROOT,
            capture_output=True,
            check=False,
        )
        shutil.rmtree(self.collections, ignore_errors=True)


def compare(bench: BenchCluster, results: Results, reps: int, rev: str, cap: float) -> None:
    """The re-run on 2 and 8 VMs and the time until the preflight names each fault, with the
    collection at `rev` ("before") and as this tree has it ("after"), interleaved: each pair of
    runs alternates which goes first. Each revision re-runs jobs it trained itself (a job's
    digest may differ between revisions)."""
    _become_subreaper()
    if len(bench.nodes) < 8:
        raise BenchError("the comparison needs the cluster with 8 VMs")
    before = Revision(rev, Path(tempfile.gettempdir()) / "hlf-bench-revisions")
    sides = {"before": before, "after": None}
    jobs = {
        ("before", 2): f"{BASE_JOB}-{before.label}",
        ("before", 8): f"{N8_JOB}-{before.label}",
        ("after", 2): BASE_JOB,
        ("after", 8): N8_JOB,
    }
    try:
        for (side, count), job in jobs.items():
            bench.ensure_trained(count, job, deadline_s=2400, revision=sides[side])
        say(f"compare: the machine at rest after {settle():.0f} s")
        for rep in range(1, reps + 1):
            order = ("before", "after") if rep % 2 else ("after", "before")
            for count in (2, 8) if rep % 2 else (8, 2):
                case = f"re-run, {count} VMs"
                for side in order:
                    if results.has("compare-rerun", case, side, rep):
                        continue
                    rest()
                    result = bench.train(
                        bench.inventory(count),
                        jobs[side, count],
                        f"compare {side} {count} VMs {rep}",
                        deadline_s=900,
                        _revision=sides[side],
                    )
                    if result["rc"] != 0:
                        raise BenchError(f"{case} ({side}) failed: {result['output'][-1500:]}")
                    figures = {
                        "seconds": round(result["seconds"], 1),
                        "cpu_s": round(result["cpu_s"], 2),
                        "changed": changed_tasks(result["output"]),
                    }
                    results.add("compare-rerun", case, side, rep, **figures)
                    say(f"{case} {side} {rep}: {figures}")
            for case in FAULTS:
                for side in order:
                    if results.has("compare-time-to-cause", case, side, rep):
                        continue
                    with fault_applied(bench, case, hand=False):
                        figures = preflight_launch(
                            bench, case, rep, cap, revision=sides[side], label=f" ({side})"
                        )
                    results.add("compare-time-to-cause", case, side, rep, **figures)
                    say(f"time to cause: {case} {side} {rep}: {figures['seconds']} s")
    finally:
        before.remove()


# ------------------------------------------------------------------ the Hub model's fetch

HUB_CLUSTER = "benchhub"
HUB_MODEL = "hostnet-bench/model-200mb"
HUB_MODEL_MB = 200
# The double's rate, shared by every connection: the site's link to the Hub (a NAT gateway, an
# office line), the same for both variants.
HUB_RATE_MBPS = 50
HUB_PLAYBOOK = "tests/integration/playbooks/hub_fetch.yml"
HUB_CACHE = "/var/lib/llamafactory/hf-cache/hub"
# hub.yml's tasks, as profile_tasks names them: the fetch's time is theirs.
HUB_TASKS = (
    "Look for the Hub repositories in every node's cache",
    "Write the download's script",
    "Write the Hugging Face token",
    "Download from the Hub",
    "Serve the repositories from rank 0's node",
    "Copy them from rank 0's node",
    "Stop serving",
)
HUB_VARIANTS = {"once": "once", "each node": "each_node"}


def hub_definition(nodes: int) -> spec.ClusterSpec:
    """'benchhub': `nodes` VMs whose project lets them reach each other, on /24s of shift 6 that
    no test cluster uses (198.18.197.0/24, 198.19.195.0/24)."""
    allow = dict(spec.DEFAULT_ALLOW_INTERNAL, sourceRanges=["198.18.5.0/24"])
    return spec.load(
        name=HUB_CLUSTER,
        shift=SHIFT,
        nodes=nodes,
        networks={
            "vpc": {"subnet": "198.18.5.0/24", "mtu": 1460},
            "external": {"subnet": "198.19.3.0/24"},
        },
        firewall=[*spec.load().firewall, allow],
    )


def _static_inventory(source: Path, count: int) -> Path:
    """The cluster's static inventory with its group cut to the first `count` VMs."""
    data = yaml.safe_load(source.read_text())
    group = data["all"]["children"]["llamafactory"]["hosts"]
    names = list(group)[:count]
    data["all"]["children"]["llamafactory"]["hosts"] = {name: group[name] for name in names}
    path = source.with_name(f"{source.stem}-n{count}.yml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def hub_fetch(results: Results, reps: int, logs: Path, keep: bool = False) -> None:
    """The base model (200 MB, from the box's Hub double at 50 MB/s shared) fetched by
    playbooks' hub.yml on 2 and 8 VMs: once (rank 0's node downloads, the others copy from it)
    versus every node downloading by itself (llamafactory_hub_fetch each_node); every cache
    emptied before each run; runs interleaved, paired by repetition."""
    _become_subreaper()
    definition = hub_definition(8)
    say(f"cluster {HUB_CLUSTER}: 8 VMs")
    state = cluster.up(definition)
    double = hub_double.on_cluster(definition, rate=HUB_RATE_MBPS * 1e6)
    try:
        weights = os.urandom(HUB_MODEL_MB * 1000 * 1000)
        double.add_repo(
            HUB_MODEL,
            {"config.json": b'{"model_type": "llama"}', "model.safetensors": weights},
        )
        image = train_image.ensure_hub_client_image(cluster.client(), cluster.cache_dir())
        parallel(lambda node: train_image.load_into(node["container"], image), state["nodes"])
        inventories = {n: _static_inventory(Path(state["inventory"]), n) for n in (2, 8)}
        folder = f"{HUB_CACHE}/models--{HUB_MODEL.replace('/', '--')}"
        for rep in range(1, reps + 1):
            for count in (2, 8):
                order = list(HUB_VARIANTS) if rep % 2 else list(reversed(HUB_VARIANTS))
                case = f"{count} nodes"
                for variant in order:
                    if results.has("hub", case, variant, rep):
                        continue
                    parallel(
                        lambda node: vm_sh(node["container"], f"rm -rf {folder}"), state["nodes"]
                    )
                    double.reset()
                    rested = rest()
                    variables = {
                        "llamafactory_job": "bench-hub",
                        "llamafactory_config": str(
                            ROOT / "examples/local-demo/llama3_lora_sft_ds3.yaml"
                        ),
                        "llamafactory_image": image,
                        "llamafactory_pull": "never",
                        "llamafactory_hf_endpoint": double.url,
                        "llamafactory_hub_fetch": HUB_VARIANTS[variant],
                        "llamafactory_train_overrides": {"model_name_or_path": HUB_MODEL},
                    }
                    command = [
                        "ansible-playbook",
                        HUB_PLAYBOOK,
                        "-i",
                        str(inventories[count]),
                        "-e",
                        json.dumps(variables),
                    ]
                    label = f"hub {case} {variant} {rep}"
                    env = {
                        **PROFILE_ENV,
                        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
                    }
                    result = run_logged(command, logs / f"{slug(label)}.log", label, 900, env=env)
                    if result["rc"] != 0:
                        raise BenchError(f"{label} failed: {result['output'][-1500:]}")
                    tasks = task_profile(result["output"])
                    fetch_s = sum(
                        seconds
                        for name, seconds in tasks.items()
                        if any(task in name for task in HUB_TASKS)
                    )
                    figures = {
                        "seconds": round(fetch_s, 1),
                        "playbook_s": round(result["seconds"], 1),
                        "hub_downloads": len(double.downloads(HUB_MODEL)),
                        "hub_MB": round(double.sent() / 1e6, 1),
                        "rested_s": round(rested, 1),
                    }
                    results.add("hub", case, variant, rep, **figures)
                    say(f"{label}: {figures}")
    finally:
        double.stop()
        for path in Path(definition.inventory).parent.glob(f"{HUB_CLUSTER}-n*.yml"):
            path.unlink()  # the inventories cut from the cluster's (_static_inventory)
        if not keep:
            cluster.down(definition)


# ------------------------------------------------------------------ VMs from an empty project

VMS_CLUSTER = "benchvms"
VMS_COUNTS = (1, 2, 8, 32)  # 1: one VM's creation alone, the floor (the inserts run in parallel)
VMS_MACHINE = "n2-standard-4"
# The two steps of up.yml, as profile_tasks names their tasks: the module's creation (its
# quota check, the inserts and the wait for every VM to run; started in the background, then
# awaited) and the wait for every VM's SSH.
VMS_STEPS = {
    "create task (s)": "Create the VMs",
    "SSH wait (s)": "Wait for the VM's SSH",
}
VMS_WHOLE = "up.yml (s)"


def vms_definition() -> spec.ClusterSpec:
    """'benchvms': an empty project (no VM) on /24s that no other cluster uses, shifted by 7
    (198.18.240.0/24, 198.19.240.0/24)."""
    return spec.load(
        name=VMS_CLUSTER,
        shift=7,
        nodes=0,
        networks={
            "vpc": {"subnet": "198.18.16.0/24", "mtu": 1460},
            "external": {"subnet": "198.19.16.0/24"},
        },
    )


def vms_split(tasks: dict[str, float], seconds: float) -> dict[str, float]:
    """up.yml's wall time and profile_tasks' times (task name -> s) -> the figures of one run:
    the whole run, the module's create task and the wait for SSH (each the sum of the tasks
    whose name holds the step's task name), and the rest (Ansible's start, the other tasks, the
    inventory's refresh)."""
    figures = {VMS_WHOLE: round(seconds, 1)}
    for figure, task in VMS_STEPS.items():
        figures[figure] = round(sum(s for name, s in tasks.items() if task in name), 1)
    figures["the rest (s)"] = round(seconds - sum(figures[f] for f in VMS_STEPS), 1)
    return figures


def vms_counts(largest: int) -> tuple[int, ...]:
    """The counts of the series: the floor, 2, 8 and `largest` (--nodes; 32 by default)."""
    return tuple(sorted({c for c in VMS_COUNTS[:-1] if c <= largest} | {largest}))


def vms_series(results: Results, reps: int, once, counts: tuple[int, ...] = VMS_COUNTS) -> None:
    """once(count, rep) -> figures for every count of `counts` in that order, repetition after
    repetition, each run recorded at once as "FIGURE, N VMs" (variant N VMs) and, once the
    repetition's 2-VM run is in, paired with it (variant 2 VMs). A resumed run measures what
    is missing, and the 2-VM run again when a count of its repetition is missing (the pairs)."""
    for rep in range(1, reps + 1):
        missing = [
            count
            for count in counts
            if not results.has("vms", f"{VMS_WHOLE}, {count} VMs", "N VMs", rep)
        ]
        if missing and 2 not in missing and 2 in counts:
            missing = sorted({*missing, 2})
        measured: dict[int, dict] = {}
        for count in missing:
            measured[count] = once(count, rep)
            items = [
                ("vms", f"{name}, {count} VMs", "N VMs", rep, {"value": value})
                for name, value in measured[count].items()
            ]
            if 2 in measured:  # every count of the repetition so far, paired with it
                done = [
                    c
                    for c in counts
                    if c in measured or results.has("vms", f"{VMS_WHOLE}, {c} VMs", "N VMs", rep)
                ]
                items += [
                    ("vms", f"{name}, {c} VMs", "2 VMs", rep, {"value": value})
                    for c in done
                    for name, value in measured[2].items()
                ]
            results.add_many(items)


def vms(
    results: Results, reps: int, logs: Path, keep: bool = False, largest: int = VMS_COUNTS[-1]
) -> None:
    """up.yml (role gcp_vms) creating N VMs through the box's Compute Engine API in an empty
    project and waiting for their SSH, N = 1, 2, 8 and 32 interleaved by repetition, each run
    followed by down.yml (gcp_vms_down_force) so that the next one starts from an empty project.
    Each count's figures are paired with the 2-VM run of the same repetition."""
    definition = vms_definition()
    say(f"cluster {VMS_CLUSTER}: an empty project")
    state = cluster.up(definition)
    inventory = state["gcp_inventory"]
    env = {
        **state["gce"]["env"],
        **PROFILE_ENV,
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks",
    }
    gce = box_api.Box(state["gce"])

    def instances() -> list[str]:
        return list(gce.instances())

    def down(label: str) -> float:
        command = [
            "ansible-playbook",
            "playbooks/down.yml",
            "-i",
            inventory,
            "-e",
            json.dumps({"gcp_vms_prefix": VMS_CLUSTER, "gcp_vms_down_force": True}),
        ]
        result = run_logged(
            command, logs / f"{slug(label)}-down.log", f"{label}: down", 1200, env=env
        )
        left = instances()
        if result["rc"] != 0 or left:
            raise BenchError(
                f"{label}: down.yml rc {result['rc']}, left {left}: {result['output'][-1500:]}"
            )
        return result["seconds"]

    def once(count: int, rep: int) -> dict:
        label = f"vms {count} {rep}"
        settle(threshold=0.5, quiet_s=5, max_s=30)  # the other work on this machine
        variables = {
            "gcp_vms_count": count,
            "gcp_vms_prefix": VMS_CLUSTER,
            "gcp_vms_machine_type": VMS_MACHINE,
        }
        command = ["ansible-playbook", "playbooks/up.yml", "-i", inventory]
        command += ["-e", json.dumps(variables)]
        result = run_logged(command, logs / f"{slug(label)}.log", label, 1800, env=env)
        made = instances()
        if result["rc"] != 0 or len(made) != count:
            raise BenchError(
                f"{label}: rc {result['rc']}, {len(made)} VMs: {result['output'][-1500:]}"
            )
        figures = vms_split(task_profile(result["output"]), result["seconds"])
        figures["down.yml (s)"] = round(down(label), 1)
        say(f"{label}: {figures}")
        return figures

    try:
        if instances():
            down("leftovers")
        vms_series(results, reps, once, vms_counts(largest))
    finally:
        gce.close()
        if not keep:
            cluster.down(definition)


PREEMPT_VARIANTS = {"preempted, STOP": "stop", "preempted, DELETE": "delete"}
# Task banners in train.yml's output, in the order a restart after a preemption passes them.
PREEMPT_MARKS = {
    "cause named": "Name the VMs that are not running as the cause",
    "VM back": "Find every node's NIC and MASTER_ADDR again after a VM was started",
    "relaunch decided": "Decide again",
}
PREEMPT_STEPS = {"max_steps": 400, "save_steps": 10}  # the stand-in's 0.5 s steps


def _marks_seen(log_path: Path, started: float, seen: dict, stop: threading.Event) -> None:
    """Note when each PREEMPT_MARKS banner first appears in the run's log (s after `started`),
    from the moment of the preemption: the log is followed as it is written."""
    while not stop.is_set():
        text = log_path.read_text() if log_path.is_file() else ""
        for name, task in PREEMPT_MARKS.items():
            if name not in seen and f"{task}]" in text:  # a role's task, or an include
                seen[name] = round(time.monotonic() - started, 1)
        stop.wait(0.5)


def preemption(results: Results, reps: int, logs: Path, keep: bool = False) -> None:
    """A spot VM preempted mid-training, with its termination action STOP (started again) or
    DELETE (created again: a fresh disk set up, its checkpoint part from the bucket): train.yml
    from an empty project (gcp_vms_count 2, the stand-in job, llamafactory_output_uri in the
    box's bucket, gcp_instances_restart_stopped, when_done delete), rank 1's VM preempted once a
    checkpoint is complete in the bucket. Seconds from the preemption until the restart named
    the cause, the VM was back, the relaunch was decided, and rank 0 logged a step again."""
    _become_subreaper()
    definition = vms_definition()
    say(f"cluster {VMS_CLUSTER}: an empty project, with the stand-in image and a bucket")
    state = cluster.up(definition)
    client = cluster.client()
    found = registry.start(definition, client, cluster.cache_dir())
    local = train_image.ensure_standin_image(client, cluster.cache_dir())
    image = registry.push(client, found, local, STANDIN_REPOSITORY)
    pull_vars = registry.pull_vars(found, image)
    gce = box_api.Box(state["gce"])
    storage = box_api.Storage(state["gcs"])
    uri = f"gs://{state['gcs']['bucket']}/preempt"

    def once(variant: str, rep: int) -> dict:
        action = PREEMPT_VARIANTS[variant]
        prefix, job = f"bp{action}", f"preempt-{action}-{rep}"
        label = f"preemption {action} {rep}"
        log_path = logs / f"{slug(label)}.log"
        variables = {
            "llamafactory_job": job,
            "llamafactory_image": image,
            "preflight_smoke_test": False,  # the stand-in image has no torch
            "llamafactory_train_overrides": PREEMPT_STEPS,
            "llamafactory_output_uri": uri,
            "gcs_outputs_interval_s": 2,
            "gcp_vms_count": 2,
            "gcp_vms_prefix": prefix,
            "gcp_vms_machine_type": VMS_MACHINE,
            "gcp_vms_provisioning_model": "spot",
            "gcp_vms_termination_action": action,
            "gcp_instances_restart_stopped": True,
            "gcp_instances_when_done": "delete",
            "launch_max_restarts": 1,
            "launch_peer_timeout": 30,
        }
        command = ["ansible-playbook", "playbooks/train.yml", "-i", state["gcp_inventory"]]
        command += ["-e", f"@{pull_vars}", "-e", json.dumps(variables)]
        outcome: dict = {}

        def run():
            try:
                outcome["result"] = run_logged(
                    command, log_path, label, 1800, env=state["gce"]["env"]
                )
            except BenchError as exc:
                outcome["error"] = exc

        settle(threshold=0.5, quiet_s=5, max_s=30)
        thread = threading.Thread(target=run)
        thread.start()
        rank0 = {"container": f"{definition.prefix()}-{prefix}-0"}
        checkpoints = f"preempt/{job}/checkpoints/"
        _wait(
            lambda: not thread.is_alive() or storage.complete_checkpoints(checkpoints),
            1200,
            f"{label}: the first checkpoint complete in the bucket",
        )
        if not thread.is_alive():
            raise BenchError(f"{label} ended before its first checkpoint: {outcome}")
        first_start = (_job_container(rank0, job) or {})["State"]["StartedAt"]
        zone = gce.instances()[f"{prefix}-1"]
        seen: dict = {}
        stop = threading.Event()
        started = time.monotonic()
        gce.fake("preempt", {"project": definition.project, "zone": zone, "name": f"{prefix}-1"})
        watcher = threading.Thread(target=_marks_seen, args=(log_path, started, seen, stop))
        watcher.start()
        try:
            _wait(
                lambda: (
                    not thread.is_alive()
                    or not (_job_container(rank0, job) or {}).get("State", {}).get("Running")
                ),
                600,
                f"{label}: rank 0 stopped",
            )
            before = len(_steps(rank0, job))

            def training_again():
                now = (_job_container(rank0, job) or {}).get("State", {})
                return now.get("StartedAt") != first_start and len(_steps(rank0, job)) > before

            _wait(lambda: not thread.is_alive() or training_again(), 1200, f"{label}: training")
            seen["training again"] = round(time.monotonic() - started, 1)
            thread.join(1800)
        finally:
            stop.set()
            watcher.join()
        result = outcome.get("result") or {}
        if result.get("rc") != 0:
            raise BenchError(
                f"{label}: rc {result.get('rc')} {outcome.get('error', '')}: "
                f"{result.get('output', '')[-1500:]}"
            )
        missing = [name for name in (*PREEMPT_MARKS, "training again") if name not in seen]
        if missing:
            raise BenchError(f"{label}: not seen in its log: {missing} (log: {log_path})")
        figures = {f"{name} (s)": seen[name] for name in (*PREEMPT_MARKS, "training again")}
        lost = re.search(r"(\d+) steps lost", result["output"])
        figures["steps lost"] = int(lost.group(1)) if lost else None
        figures["train.yml (s)"] = round(result["seconds"], 1)
        say(f"{label}: {figures}")
        return figures

    try:
        for rep in range(1, reps + 1):
            order = list(PREEMPT_VARIANTS) if rep % 2 else list(reversed(PREEMPT_VARIANTS))
            for variant in order:
                if results.has("preemption", "training again (s)", variant, rep):
                    continue
                figures = once(variant, rep)
                results.add_many(
                    [("preemption", name, variant, rep, {"value": value})
                     for name, value in figures.items() if value is not None]
                )  # fmt: skip
    finally:
        gce.close()
        storage.close()
        if not keep:
            cluster.down(definition)
