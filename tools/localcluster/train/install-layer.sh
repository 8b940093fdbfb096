#!/bin/sh
# Runs inside a container of a base training image: replaces some of its packages with the
# exact versions of /requirements.txt from the wheelhouse mounted read-only at /wheels.
# --no-deps: the list is the whole difference; `pip check` proves the result consistent.
set -eu
venv=/opt/llamafactory
"$venv/bin/pip" install -q --no-index --find-links /wheels --no-compile --no-deps \
    -r /requirements.txt
"$venv/bin/pip" check
"$venv/bin/llamafactory-cli" version
rm -rf /root/.cache
