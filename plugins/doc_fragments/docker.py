# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """Options shared by the modules that reach the node's Docker daemon through
    plugins/module_utils/_docker_api.py (image_pull, job_status, and job_wait, which passes them
    on to job_status)."""

    # The daemon's socket and how long one call may wait for it.
    DOCUMENTATION = r"""
options:
  docker_socket:
    description:
      - The Docker daemon's unix socket on the node; the Engine API is reached through it
        directly (no docker CLI, no Docker SDK for Python).
    type: path
    default: /var/run/docker.sock
  docker_timeout:
    description:
      - Seconds one Engine API call may wait for the daemon (connecting, and each read of its
        answer). Stopping a container waits its grace period on top of this; a pull's stream is
        bounded by the pull's own deadline instead.
    type: int
    default: 60
notes:
  - The task usually needs C(become) - the daemon's socket belongs to root and the docker group.
"""

    # The progress line of a long wait, printed by the action on the controller.
    PROGRESS = r"""
options:
  progress_every:
    description:
      - Longest time between two progress lines on the controller, in seconds.
    type: float
    default: 30
"""

    # Stopping a container: docker stop's grace period.
    STOP = r"""
options:
  stop_timeout:
    description: Seconds between SIGTERM and SIGKILL when stopping a container.
    type: int
    default: 10
"""
