"""./dev bench: what the collection costs and what it saves, measured on the local cluster.

  time-to-cause  seconds until a known multi-node failure is named (the preflight) versus the
                 hand launch of the report failing or hanging (capped)
  rerun          train.yml again with the job finished (changed=0) on 2 and on 8 VMs: wall time
                 and the controller's CPU seconds per node
  allreduce      Gloo all_reduce bus bandwidth, 16-256 MB, host-networked containers (the
                 role's docker run options) versus the same processes run on the VMs directly
  failures       a node that vanishes under a detached job (launch_peer_timeout 30 and 60 s):
                 seconds until the survivor exits; a restart (launch_max_restarts 1) after a
                 rank's container is killed or its VM is stopped through the API (the
                 controller restarts), or a worker killed (the agents restart): seconds to
                 training again
  profile        every task of train.yml timed (ansible.posix.profile_tasks) on 2 and 8 VMs: a
                 re-run with the job finished, and a run until the preflight names a fault
  scale          the stand-in job (no training: tools/localcluster/standin) on 2, 8, 16 and 32
                 VMs with Ansible's default 5 forks: a detached launch (its controller CPU
                 per VM, the machine's cores busy), the wait for a 1-minute
                 job (its controller CPU per VM per minute), a re-run, and the time until the
                 preflight names a fault (bridge networking); the launch and the fault task
                 by task at 2 VMs and the largest count
  forks          the stand-in job on every VM (--nodes 32) with Ansible's default 5 forks and
                 with the repository's 25, alternating: a detached launch (its controller CPU
                 per VM) and the time until the preflight names a fault (bridge networking)
  scale-faults   each fault once on 2 VMs and once on every VM (--nodes 32), the stand-in
                 job, 5 forks, alternating: seconds until it is named, and - a node's own
                 fault (a blocked port, a second rank 0, a wrong NIC), put on the last VM -
                 whether the finding names that VM
  floor          tools/bench/floor.yml on 2 VMs and on every VM (--nodes 32), 5 forks,
                 alternating: every task skipped, 10 controller-only tasks, 1, 2 and 4 module
                 calls, 2 calls and a container per VM - the wall time, the controller's and
                 the VMs' CPU per VM that any per-node play costs on this machine
  outputs        llamafactory_output_uri: the same 40-step job with and without it,
                 interleaved (mean step time), each checkpoint's seconds from saved to complete
                 in the box's bucket, and a 256 MB checkpoint part sent and restored
  demo           wall time of ./dev demo, cold once (the cluster's images removed) and warm
  hub            the base model from the Hub (the box's double, 200 MB at 50 MB/s) on 2 and
                 8 VMs: fetched once by rank 0's node and copied node to node, versus every
                 node downloading it by itself; the Hub's downloads counted
  vms            up.yml (role gcp_vms) creating 1, 2, 8 and 32 VMs (--nodes: the largest count)
                 through the box's Compute Engine API from an empty project and waiting for
                 their SSH, interleaved, each run followed by down.yml: wall time, the module's
                 create task, the SSH wait
  compare        with --compare REV: the re-run on 2 and 8 VMs and the time until the
                 preflight names each fault, the collection at REV (a git worktree) versus
                 this working tree, interleaved: ./dev bench --only compare --compare HEAD~3

The runs of each comparison are interleaved within this invocation and paired by repetition;
results.json (every measurement, rewritten after each one), results.md and results.png go to
--out. --resume continues an interrupted run, skipping what results.json already holds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

from localcluster.util import ClusterError

from . import runs
from .results import Results

BENCHMARKS = [
    "time-to-cause",
    "allreduce",
    "rerun",
    "failures",
    "profile",
    "scale",
    "forks",
    "scale-faults",
    "floor",
    "compare",
    "outputs",
    "hub",
    "vms",
    "preemption",
    "demo",
]
# The benchmarks of the stand-in job on many VMs: 8 VMs at least, no real training first.
STANDIN_BENCHES = {"scale", "forks", "scale-faults", "floor"}
NOTES = {
    "outputs-step": (
        "The demo's job with `max_steps: 40, save_steps: 4` on 2 VMs, with and without "
        "`llamafactory_output_uri` (the box's bucket), alternating which runs first: "
        "`train_runtime / 40` from `all_results.json`. With it, each node's sync service sends "
        "every checkpoint while the next steps run."
    ),
    "outputs-transfer": (
        "Upload: the seconds from a checkpoint's newest file on either node to the time in its "
        "`COMPLETE.json` (the sync service's interval is 10 s and it waits for 5 quiet seconds), "
        "and a 256 MB checkpoint part (random bytes) sent by the nodes' library "
        "(`sync_checkpoints`, with the manifest and the mark) from one VM. Restore: that part "
        "downloaded back (`restore_part`, every file checked against the manifest). The box's "
        "Cloud Storage runs on the same 2 cores."
    ),
    "scale": (
        "The stand-in job (tools/localcluster/standin/README.md: a small program in place of "
        "llamafactory-cli, for scale runs only; it rendezvouses, exchanges a few bytes per step "
        "and writes the trainer log and checkpoints; no model, no training) through the "
        "collection's real launch, wait and re-run, `ANSIBLE_FORKS=5` (Ansible's default), the "
        "preflight without its all-reduce (the image has no torch). Every VM is set up first "
        "(Docker's settings, the image pulled) by one unmeasured launch on all of them, waited "
        "for until its job ends; each timed run starts once the CPUs were less than 20% busy for "
        "5 s (at most 60 s). Per "
        "repetition and count: "
        "`train.yml` with `launch_wait=false`, then `playbooks/wait.yml` until the 120-step job "
        "(0.5 s a step) finishes, then `train.yml` again (changed=0; the job read from rank "
        "0's node alone), then `train.yml` with "
        "another job in bridge networking, timed until the preflight names it "
        "(container-not-on-host-network). CPU: user+system seconds "
        "of ansible-playbook and every process it started. The machine's cores busy: the "
        "launch's busy time of every core (/proc/stat, the VMs' processes included) over its "
        "wall time times the cores. Every count's run is paired with the "
        "2-VM run of the same repetition; the VMs share the controller's 2 cores."
    ),
    "forks": (
        "Table 10's launch (detached; the wait after it unmeasured) and fault on every VM of the "
        "bench cluster, `ANSIBLE_FORKS=5` (Ansible's default) and `ANSIBLE_FORKS=25` (the "
        "repository's ansible.cfg), alternating which runs first, after the same unmeasured "
        "set-up launch. CPU: as table 10's. The VMs share the controller's 2 cores."
    ),
    "scale-faults": (
        "`train.yml` of a new job with one fault, the stand-in job (table 10's, after the same "
        "unmeasured set-up launch), `ANSIBLE_FORKS=5`, detached, on 2 VMs and on every VM of "
        "the bench cluster, alternating which count runs first; timed from its start until the "
        "finding's id appears in its output. A node's own fault is put on the cut's last VM "
        "(the farthest from the first forks; rank 0's probe gathers its report last): new TCP "
        "connections to ports 30000-65535 dropped on that VM alone (blocked port), "
        "`llamafactory_node_rank: 0` in its host_vars (a second rank 0, named by the "
        "validation), `llamafactory_interface: ext0` in its host_vars (a wrong NIC, named by the "
        "firewall role from the API's addresses); the finding's line must name that VM. Bridge "
        "networking and no firewall rule (the run deletes the cut's rule) concern every node. "
        "The VMs share the controller's 2 cores."
    ),
    "floor": (
        "`tools/bench/floor.yml` through the bench cluster's GCP inventory, `ANSIBLE_FORKS=5`, "
        "on 2 VMs and on every VM of the cluster, alternating which count runs first, after the "
        "same unmeasured set-up launch as table 10's: every task skipped (the play's and the "
        "inventory's own cost), ten `set_fact` tasks per VM in one include, 1, 2 and 4 "
        "`ansible.builtin.command: /bin/true` calls per VM (become), and 2 calls with a "
        "container of the stand-in's image started and removed (`docker run --rm`). CPU: the "
        "controller's as table 10's, the VMs' from each VM's cgroup (every process in it: sshd, "
        "the modules' Python, Docker). The VMs share the controller's 2 cores."
    ),
    "time-to-cause": (
        "Preflight: `train.yml` on the GCP path (the dynamic inventory, the firewall rule made "
        "through the box's API) with the fault, timed from its start until the finding's id "
        "appears in its output (the job's image already on the nodes, as after any first run; "
        "the wrong NIC is named by the firewall role, before the preflight, from the API's "
        "address of each VM on the rule's network). "
        "Hand launch: `docker run` of the job's own image, config and data on both VMs at once, "
        "as the report's user does it - Docker's bridge with `-p 29500:29500` and no NIC set "
        "(bridge networking), host networking with `GLOO_SOCKET_IFNAME=ext0` (wrong NIC), host "
        "networking with new TCP connections to ports 30000-65535 dropped on both VMs and "
        "MASTER_PORT open (blocked port), the nodes' firewall rule deleted through the box's API "
        "(no firewall rule: the report's third fault; the preflight's run deletes it with "
        "`gcp_firewall_state=absent`), `RANK=0/1` and no "
        "`NODE_RANK` (two nodes at rank 0: LLaMA-Factory 0.9.5 reads NODE_RANK) - timed until a "
        "rank exits with an error, or the cap (a hang). MASTER_ADDR is rank 0's internal "
        "address in both, so that each run has one fault only."
    ),
    "rerun": (
        "`train.yml` with the job already finished (every task ok, none changed), 8 VMs versus "
        "their first 2 (the same cluster, two inventories); the job is read from rank 0's node "
        "alone (the record its collect step left there). CPU: user+system seconds of "
        "ansible-playbook and every process it started, its ssh masters included (each run "
        "opens its own connections). The VMs' CPU: user+system seconds of every process in the "
        "run's VM containers (their cgroups), idle work included. The 8 VMs run on the same 2 "
        "cores as the controller. Each run starts once the CPUs were less than 20% busy for 5 s "
        "(at most 60 s of waiting)."
    ),
    "allreduce": (
        "Container: `docker run --network host --ipc host --env-file <the job's env>` of the "
        "training image, as the role's launch.sh. Bare: the same image's files unpacked on the "
        "VM and run with chroot (no namespaces, no cgroup of its own), the same env file. One "
        "torchrun process per VM, Gloo over the VPC NIC (MTU 1460), bus bandwidth as "
        "nccl-tests defines it. Both VMs share this machine's 2 cores."
    ),
    "peer-lost": (
        "Node vanished: a job launched with `launch_wait=false` (no controller waits) on 2 VMs; "
        "after its first step every packet between rank 1's VM and rank 0 is dropped and rank "
        "1's container paused (no connection reset), timed until rank 0's container exits (its "
        "agent stops it); over_bound_s in results.json is that time minus the bound."
    ),
    "restart": (
        "`train.yml` with `launch_max_restarts: 1`, 40 steps, a "
        "checkpoint every 10; after the first one rank 1's container is killed, or its VM "
        "stopped through the box's API (`gcp_instances_restart_stopped: true`), timed until "
        "rank 0 logs a step of the resumed run (the wait noticing, every rank stopped, the "
        "VM started, the preflight, the relaunch, the model loaded)."
    ),
    "restart-on-nodes": (
        "The same `train.yml` (controller attached): rank 1's container killed (its agent "
        "with it: the controller restarts, the run of table 6) versus one of rank 1's training "
        "workers killed with SIGKILL (the ranks' agents restart every rank in their "
        "containers, from the newest checkpoint both hold), timed until rank 0 logs a step of "
        "the resumed run."
    ),
    "profile-rerun": (
        "`train.yml` with the job already finished, 2 VMs versus 8 (the re-run benchmark's "
        "jobs), with ansible.posix's `profile_tasks` callback: a task's time runs from its start "
        "to the next task's start, all hosts together; a task run more than once (an included "
        "file's) is summed. The whole run's row is the wall time of `ansible-playbook`."
    ),
    "profile-fault": (
        "`train.yml` of a new job with the bridge-networking fault "
        "(`llamafactory_network_mode: bridge`, `llamafactory_allow_bridge: true`), timed as "
        "table 8 until the play ends: the preflight names the fault "
        "(container-not-on-host-network) and nothing is launched."
    ),
    "profile-rerun-cpu": (
        "Table 8's runs, with the bench's `task_cpu` callback (tools/bench/callbacks): the CPU "
        "seconds (user + system) of `ansible-playbook` and of the processes it reaped - a worker "
        "forked per host and task, and the ssh clients they ran - from a task's start to the "
        "next one's; the whole run's row also counts the ssh masters. The VMs' own CPU is not "
        "in it (they share the same 2 cores)."
    ),
    "profile-fault-cpu": "Table 9's runs, counted as table 11.",
    "profile-scale-launch": (
        "Table 10's detached launch, task by task (ansible.posix's profile_tasks: a task's time "
        "runs from its start to the next task's, all hosts together; an included file's tasks "
        "summed), on 2 VMs and on the series' largest count. The whole run's row is the wall "
        "time of `ansible-playbook`."
    ),
    "profile-scale-fault": (
        "Table 10's run with the bridge-networking fault, timed as table 20 until the play ends "
        "(the preflight names the fault; nothing is launched)."
    ),
    "hub": (
        "tests/integration/playbooks/hub_fetch.yml (the job planned, the NICs found, then the "
        "launch's hub.yml alone) on a cluster of its own (8 VMs, their project allowing traffic "
        "between them), cut to 2 or 8 nodes; the fetch's time is the sum of hub.yml's tasks "
        "(profile_tasks). The model: config.json and a 200 MB model.safetensors on the box's Hub "
        "double, which sends at most 50 MB/s in all (the site's link to the Hub, shared by the "
        "nodes); every node's cache emptied before each run. once: rank 0's node downloads it "
        "(huggingface_hub in a container), the others copy it from rank 0 over the VPC, "
        "checksummed. each node: llamafactory_hub_fetch each_node. The 8 VMs share this "
        "machine's 2 cores and disk."
    ),
    "vms": (
        "`ansible-playbook playbooks/up.yml` on the box's GCP-path inventory of an empty project "
        "(no VM; zones us-central1-a and -b), `gcp_vms_count` N, machine type n2-standard-4, the "
        "repository's ansible.cfg (25 forks), N = 1, 2, 8 and 32 (`--nodes` sets the largest) in "
        "that order each repetition; "
        "each run followed by `playbooks/down.yml -e gcp_vms_down_force=true` (its time in the "
        "last column), so that every run starts from an empty project. The create task: the "
        "module gce_instances (the quota check, one instances.insert per VM sent at once, the "
        "wait until every VM runs); the SSH wait: wait_for_connection on every VM "
        "(profile_tasks' times); the rest: Ansible's start, the other tasks, the inventory's "
        "refresh. 1 VM is the floor (the inserts run in parallel). Each box VM is a Docker "
        "container (systemd, sshd, dockerd) made on this machine's 2 cores."
    ),
    "preemption": (
        "`ansible-playbook playbooks/train.yml` from the box's empty project: `gcp_vms_count` 2 "
        "spot n2-standard-4 VMs with `gcp_vms_termination_action` stop or delete (a group of its "
        "own each, alternating which runs first), the stand-in job (400 steps of 0.5 s, a "
        "checkpoint every 10), `llamafactory_output_uri` in the box's bucket (synced every 2 s), "
        "`gcp_instances_restart_stopped`, `launch_peer_timeout` 30, `launch_max_restarts` 1, "
        "`gcp_instances_when_done` delete. Once a checkpoint is complete in the bucket, rank 1's "
        "VM is preempted (`POST /_fake/preempt`: the metadata's `preempted`, the ACPI shutdown "
        "with 30 s to react, then the VM stopped or deleted). Seconds from the preemption until: "
        "the wait's failure reached the VMs' status (cause named), the VM was running and "
        "reachable again (VM back: started, or created with its SSH awaited), the relaunch was "
        "decided (after the firewall rule, Docker and the outputs' client on a created VM), and "
        "rank 0 logged a step of the resumed run (training again). The job's image is pulled "
        "again on a created VM (the stand-in's, 0.2 GB; the real one is 2.5 GB)."
    ),
    "demo": (
        "Cold: after `./dev cluster rmi` (VM images, training image, registry image and its "
        "storage removed; the pip wheelhouse and the debootstrap downloads stay cached). "
        "Warm: everything cached, the cluster created and removed by the command itself."
    ),
}


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({model}), {memory:.0f} GiB, Linux {platform.release()}"


def versions() -> dict:
    found = {"python": platform.python_version()}
    try:
        import ansible.release

        found["ansible-core"] = ansible.release.__version__
    except ImportError:
        pass
    docker = subprocess.run(
        ["docker", "version", "-f", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    found["docker"] = docker.stdout.strip()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="./dev bench", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, default=BENCHMARKS)
    parser.add_argument("--reps", type=int, default=3, help="repetitions (default %(default)s)")
    parser.add_argument(
        "--allreduce-reps", type=int, default=6, help="all_reduce repetitions (short runs: 6)"
    )
    parser.add_argument(
        "--rerun-reps",
        type=int,
        help="re-run repetitions (default: --reps; a re-run takes seconds, its ratio is noisy)",
    )
    parser.add_argument("--cap", type=float, default=120, help="hand launch cap, s (120)")
    parser.add_argument("--out", type=Path, default=runs.ROOT / "benchmarks")
    parser.add_argument("--resume", action="store_true", help="keep results.json's runs")
    parser.add_argument("--no-cold", action="store_true", help="demo: skip the cold run")
    parser.add_argument("--keep", action="store_true", help="leave the bench cluster up")
    parser.add_argument(
        "--compare", metavar="REV", help="compare: the git revision to measure this tree against"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        help="VMs of the bench cluster (default: 8 with rerun, profile, scale, forks or floor, "
        "else 2; scale runs every count up to it: --nodes 32; forks and floor run on all); vms: "
        "its largest "
        "count (32)",
    )
    args = parser.parse_args(argv)
    if args.rerun_reps is None:
        args.rerun_reps = args.reps
    if min(args.reps, args.allreduce_reps, args.rerun_reps) < 1:
        parser.error("--reps, --allreduce-reps and --rerun-reps must be 1 or more")
    if args.compare is None and "compare" in args.only:
        parser.error("--only compare needs --compare REV (the revision to measure against)")
    if args.compare is not None and "compare" not in args.only:
        args.only = [*args.only, "compare"] if "--only" in (argv or sys.argv) else ["compare"]
    if args.compare is None:
        args.only = [b for b in args.only if b != "compare"]
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    selected = [b for b in BENCHMARKS if b in args.only]
    results = Results(
        args.out,
        meta={
            "started": started,
            "command": "./dev bench " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": machine(),
            "versions": versions(),
            "reps": args.reps,
            "allreduce_reps": args.allreduce_reps,
            "rerun_reps": args.rerun_reps,
            "cap_s": args.cap,
            "notes": NOTES,  # the table shows those of the benchmarks with results
        },
        resume=args.resume,
    )
    logs = args.out / "logs"
    try:
        cluster_benches = [b for b in selected if b not in ("demo", "hub", "vms", "preemption")]
        if cluster_benches:
            needed = 8 if {"rerun", "profile", "compare"} & set(selected) else 2
            if STANDIN_BENCHES & set(selected):
                needed = max(needed, 8)
            nodes = args.nodes or needed
            if nodes < needed:
                parser.error(f"--nodes {nodes}: the benchmarks chosen need more VMs")
            bench = runs.BenchCluster(nodes, logs)
            bench.up()
            try:
                # the real job, trained once
                if set(cluster_benches) - STANDIN_BENCHES - {"outputs"}:
                    bench.ensure_trained(2, runs.BASE_JOB, deadline_s=1800)
                if "time-to-cause" in selected:
                    runs.time_to_cause(bench, results, args.reps, args.cap)
                if "allreduce" in selected:
                    runs.allreduce(bench, results, args.allreduce_reps)
                if "rerun" in selected:
                    runs.rerun(bench, results, args.rerun_reps)
                if "failures" in selected:
                    runs.failures(bench, results, args.reps)
                if "profile" in selected:
                    runs.profile(bench, results, args.reps)
                if "scale" in selected:
                    runs.scale(bench, results, args.reps)
                if "forks" in selected:
                    runs.forks(bench, results, args.reps)
                if "scale-faults" in selected:
                    runs.scale_faults(bench, results, args.reps)
                if "floor" in selected:
                    runs.floor(bench, results, args.reps)
                if "compare" in selected:
                    runs.compare(bench, results, args.rerun_reps, args.compare, args.cap)
                if "outputs" in selected:
                    runs.outputs(bench, results, args.reps)
            finally:
                if not args.keep:
                    bench.down()
        if "vms" in selected:  # an empty project of its own
            runs.vms(results, args.reps, logs, keep=args.keep, largest=args.nodes or 32)
        if "preemption" in selected:  # an empty project of its own
            runs.preemption(results, args.reps, logs, keep=args.keep)
        if "hub" in selected:  # a cluster of its own
            runs.hub_fetch(results, args.reps, logs, keep=args.keep)
        if "demo" in selected:  # last: the cold run removes the images the others use
            runs.demo(results, args.reps, logs, cold=not args.no_cold)
    except KeyboardInterrupt:
        print(f"bench: interrupted; what was measured is in {results.path}", file=sys.stderr)
        return 130
    except (runs.BenchError, ClusterError) as exc:
        print(f"bench: error: {exc}\nwhat was measured is in {results.path}", file=sys.stderr)
        return 1
    results.meta["finished"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results.save()
    print(f"bench: results in {results.folder} (results.json, results.md, results.png)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
