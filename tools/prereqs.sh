#!/usr/bin/env bash
# The machine-level prerequisites of ./dev (and so of CI: .ci/run is ./dev test).
#
#   tools/prereqs.sh base     python3-venv, git, shellcheck (ansible-test sanity), gnupg
#   tools/prereqs.sh docker   base + docker.io, debootstrap, busybox-static, openssh-client,
#                             and Docker's daemon answering `docker info`
#
# Missing Debian packages are installed with apt-get when run as root; otherwise it says exactly
# what to run. Docker's daemon is started when it does not answer: with systemd by systemctl,
# without (a container, a fresh CI machine) by `setsid dockerd`, then waited for with a deadline.
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/dockerd.log}"
DOCKERD_WAIT_S="${DOCKERD_WAIT_S:-60}"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'prereqs: error: %s\n' "$*" >&2; exit 1; }
is_root() { [[ "$(id -u)" == 0 ]]; }

# missing_packages CHECK:PACKAGE...: the packages whose check fails. A check is a command name,
# or py.MODULE for a module of the system's python3.
missing_packages() {
    local pair check
    for pair in "$@"; do
        check="${pair%%:*}"
        if [[ "$check" == py.* ]]; then
            python3 -c "import ${check#py.}" 2>/dev/null || echo "${pair#*:}"
        else
            command -v "$check" >/dev/null || echo "${pair#*:}"
        fi
    done
}

install_packages() {
    (($#)) || return 0
    if is_root && command -v apt-get >/dev/null; then
        say "installing $*"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
    else
        die "missing: $*; install them: sudo apt-get install -y $*"
    fi
}

# How to start the daemon here: "systemctl" (systemd runs), else "dockerd".
start_method() { if [[ -d /run/systemd/system ]]; then echo systemctl; else echo dockerd; fi; }

# A pid file left by a daemon that did not stop cleanly (a machine restarted) makes dockerd
# refuse to start; it is removed only when no such process runs under that PID.
remove_stale_pid_file() {
    local file="$1" name="$2" pid
    [[ -f "$file" ]] || return 0
    pid="$(cat "$file" 2>/dev/null)"
    if [[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name" ]]; then
        return 0
    fi
    say "removing $file: it names PID ${pid:-none}, which is not a running $name"
    rm -f "$file"
}

ensure_dockerd() {
    docker info >/dev/null 2>&1 && return 0
    local method
    method="$(start_method)"
    if ! is_root; then
        if [[ "$method" == systemctl ]]; then
            die "Docker does not answer; start it: sudo systemctl start docker"
        fi
        die "Docker does not answer and there is no systemd; start it:" \
            "sudo sh -c 'setsid dockerd >$DOCKERD_LOG 2>&1 </dev/null &'" \
            "(or run this script as root: sudo tools/prereqs.sh docker)"
    fi
    if [[ "$method" == systemctl ]]; then
        say "starting Docker (systemctl start docker)"
        systemctl start docker
    else
        remove_stale_pid_file /var/run/docker.pid dockerd
        say "starting dockerd (log: $DOCKERD_LOG)"
        setsid dockerd >"$DOCKERD_LOG" 2>&1 </dev/null &
    fi
    local waited=0
    until docker info >/dev/null 2>&1; do
        if ((waited >= DOCKERD_WAIT_S)); then
            [[ -f "$DOCKERD_LOG" ]] && tail -n 20 "$DOCKERD_LOG" >&2
            die "Docker did not answer within $DOCKERD_WAIT_S s (the end of its log is above)"
        fi
        ((waited % 10 == 0 && waited > 0)) && say "waiting for Docker: $waited s of $DOCKERD_WAIT_S s"
        sleep 1
        waited=$((waited + 1))
    done
    say "Docker answers (after $waited s)"
}

BASE=(py.ensurepip:python3-venv git:git shellcheck:shellcheck gpg:gnupg)
# dockerd, not docker: a machine may have the client alone (docker.io brings both).
DOCKER=(dockerd:docker.io debootstrap:debootstrap busybox:busybox-static ssh:openssh-client)

main() {
    local wanted
    case "${1:-}" in
        base) wanted=("${BASE[@]}") ;;
        docker) wanted=("${BASE[@]}" "${DOCKER[@]}") ;;
        *) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    esac
    local missing
    mapfile -t missing < <(missing_packages "${wanted[@]}")
    install_packages "${missing[@]}"
    [[ "$1" == docker ]] && ensure_dockerd
    return 0
}

main "$@"
