# -*- coding: utf-8 -*-
# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One Compute Engine API request through google.cloud's GcpSession (its token and headers),
sent again on a connection error (private; gce_instance and gce_instances). GcpSession's own
full_* methods cannot report such an error (they read the exception's `message`, which Python
3's exceptions lack, and the module dies with an AttributeError), so a dropped connection - the
network or a proxy to the API - would fail the task. A write carries its own requestId, which
Compute Engine uses to ignore a request it has already seen: a repeat does nothing twice.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time
import uuid

try:
    import requests
except ImportError:  # GcpModule names the missing library
    requests = None

ATTEMPTS = 5  # of a request that meets a connection error


def send(session, fail, method, url, params=None, body=None, attempts=ATTEMPTS, sleep=None):
    """The response to METHOD url (session: a GcpSession; fail(msg): ends the module), tried
    `attempts` times on a connection error, pausing 1, 2, 4, 8... s (at most 30)."""
    if method != "GET":
        params = dict(params or {}, requestId=str(uuid.uuid4()))
    for attempt in range(attempts):
        try:
            return session.session().request(
                method, url, params=params, json=body, headers=session._set_headers(None)
            )
        except requests.exceptions.RequestException as exc:
            if attempt == attempts - 1:
                # The exception's type alone: its text may carry the request's details.
                return fail(
                    "%s %s failed %d times: %s" % (method, url, attempts, type(exc).__name__)
                )
            (sleep or time.sleep)(min(30, 2**attempt))
    return None
