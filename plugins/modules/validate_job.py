#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# Documentation only: plugins/action/validate_job.py does the work, on the controller.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: validate_job
short_description: Check the whole LLaMA-Factory job before any node is contacted, and plan it
version_added: 0.1.0
description:
  - Runs on the controller only (an action plugin; it never contacts a node). Reads the job's
    variables (role defaults, play vars, each host's inventory and extra vars), the training
    YAML named by C(llamafactory_config) and the variables every role of the collection
    documents in its C(meta/argument_specs.yml).
  - Checks types, ranges and choices of every variable the playbooks hand to the nodes, and the
    syntax of every value that reaches a node (environment names and values, interface names,
    image references, job names, paths, ulimits, registry user, GCP project and names), the
    training YAML's shape, node ranks, forks, C(--limit), the platform, renamed and removed
    variables, and unknown variables with the collection's prefixes (typos, with the closest
    known name).
  - Fails once, listing every problem, each naming its variable and the fix. Otherwise returns
    the job's plan - its identity computed once (name, ports, folders, container, nodes, ranks,
    master, platform, GPUs and processes per node and, for O(purpose=train), the node-local
    training config, the files to copy and the job's digest). The role
    hostnet.llamafactory.llamafactory gives it to every host as the fact C(llamafactory_job_plan)
    (set_fact with C(run_once), so that it is not cached beyond the run).
  - Variables set by tasks (set_fact, register, gathered facts) are not checked for their names;
    the collection's roles set facts with their own prefixes.
author:
  - hostnet.llamafactory contributors (@hostnet)
options:
  purpose:
    description:
      - What the playbook validates for. V(train) needs C(llamafactory_config), a file on the
        controller, which is read and planned. V(admin) (status, stop, cleanup) needs
        C(llamafactory_job) or C(llamafactory_config) and does not read the file. V(doctor) needs
        neither; without a job its folder is C(llamafactory_jobs_root)/.doctor.
      - V(train) and V(doctor) refuse a C(--limit) that leaves out a node of the group
        C(llamafactory).
    type: str
    choices: [train, admin, doctor]
    default: train
attributes:
  check_mode:
    support: full
    description: Reads and checks only; the same in check mode.
  diff_mode:
    support: none
    description: Reports no diff.
  idempotent:
    support: full
    description: Changes nothing; the same settings give the same plan.
  platform:
    support: full
    platforms: posix
    description: Runs on the controller.
notes:
  - The plan is returned, not set as a fact, so that fact caching cannot keep it beyond the run
    (a stale plan would outlive a changed config).
"""

EXAMPLES = r"""
- name: Check the job and plan it
  hostnet.llamafactory.validate_job:
    purpose: train
  run_once: true
  delegate_to: localhost
  register: checked

- name: Show where the job lives
  ansible.builtin.debug:
    msg: "{{ checked.plan.job_dir }} on {{ checked.plan.nodes | join(', ') }}"
"""

RETURN = r"""
plan:
  returned: success
  description:
    - job, purpose, master_port, preflight_port, agent_port (the ranks' agents, see the launch
      role), jobs_root, job_dir, output_dir, container
      (empty for a doctor run without a job), nodes (the play's hosts in group order), ranks
      (host to node rank), master (the host of rank 0), nproc (processes per node), platform,
      gpus_per_node (host to GPU count).
    - For O(purpose=train) also config (the training config every node gets), copies (key,
      src, dest, directory, and inline - small enough to go inside the launch's one
      file-writing call - of each file to copy), digest, notes and warnings (also the task's
      warnings; a ddp_timeout above llamafactory_collective_timeout_max is lowered to it).
  type: dict
  sample:
    job: demo
    purpose: train
    master_port: 29949
    preflight_port: 49949
    agent_port: 39949
    jobs_root: /var/lib/llamafactory/jobs
    job_dir: /var/lib/llamafactory/jobs/demo
    output_dir: /var/lib/llamafactory/jobs/demo/output
    container: llamafactory-demo
    nodes: [vm0, vm1]
    ranks: {vm0: 0, vm1: 1}
    master: vm0
    nproc: 1
    config: {stage: sft, output_dir: /var/lib/llamafactory/jobs/demo/output}
    copies:
      - key: deepspeed
        src: /home/me/job/ds_z3_config.json
        dest: /var/lib/llamafactory/jobs/demo/deepspeed.json
        directory: false
        inline: true
    digest: 3aa9f3ce4201677a
    notes:
      - output_dir saves/tiny becomes /var/lib/llamafactory/jobs/demo/output on every node
problems:
  description: Every problem found, each naming its variable and the fix.
  returned: failure
  type: list
  elements: str
  sample:
    - >-
      llamafactory_job 'My Job' is not usable as a container and folder name: use 1-48
      lower-case letters, digits and dashes, starting with a letter or digit.
notes:
  description: What the nodes use from the image or from a shared mount instead of a copy (train).
  returned: success
  type: list
  elements: str
  sample: [dataset_dir data is not on the controller - the nodes use it as a path inside the image]
msg:
  description: The job in one line, or every problem.
  returned: always
  type: str
  sample: >-
    job 'demo' (train): 2 nodes, master vm0, MASTER_PORT 29949, job folder
    /var/lib/llamafactory/jobs/demo
"""
