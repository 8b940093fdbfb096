#!/usr/bin/env bash
# stand-in for the local cluster; not Google's.
# Stands in for /scripts/container_entry.sh of
# us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1, the installer of Google's
# gIB NCCL plugin (RDMA over RoCE: A3 Ultra, A4). It writes the layout the real installer writes,
# but every library and config is a small text file: nothing here can load into NCCL.
#
# Contract followed:
# - The GKE installer (GoogleCloudPlatform/container-engine-accelerators@
#   992db81257553607f1477945f1b3219632991829: gpudirect-rdma/nccl-rdma-installer.yaml lines
#   58-76) runs `/scripts/container_entry.sh install` and then copies /var/lib/gib/lib64 and
#   /var/lib/gib: the installer writes /var/lib/gib/{lib64,scripts,configs}; the workloads mount
#   the copy at /usr/local/gib (gpudirect-rdma/nccl-test.yaml line 75).
# - The files a recipe uses (GoogleCloudPlatform/cluster-toolkit@
#   2123ba50d7a0ed5d82f7fbf95a818aaf92860b67: examples/machine-learning/a3-ultragpu-8g/nccl-tests/
#   run-nccl-tests.sh): scripts/set_nccl_env.sh, configs/guest_config.txtpb,
#   configs/tuner_config.txtpb, lib64 (libnccl-net.so; libnccl.so.2 with --install-nccl).
# - On a plain VM (this project): docker run --rm --network=host -v /var/lib:/var/lib IMAGE
#   install --install-nccl. Google publishes no such command for VMs (their VM recipes install
#   the apt package nccl-gib into /usr/local/gib instead).
# Differences, on purpose: an unknown subcommand or option exits 2 with the usage.
set -eu

VERSION="v1.1.1"
IMAGE="us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:${VERSION}"
ROOT="/var/lib/gib"

usage() {
  cat >&2 <<USAGE
Usage: $(basename "$0") <subcommand> [options]
(stand-in for the local cluster; not Google's: ${IMAGE})
Subcommands:
    install    Install the gIB NCCL plugin into ${ROOT}
               --install-nccl installs libnccl.so.2 as well
USAGE
}

standin() {  # standin FILE WHAT [COMMENT]: a small text file in place of a library or a config
  printf '%s%s\n' "${3:-}" "stand-in for the local cluster; not Google's: $2 of ${IMAGE}" >"$1"
}

install_subcommand() {
  local install_nccl=false option
  for option in "$@"; do
    case "${option}" in
      --install-nccl) install_nccl=true ;;
      *)
        echo "install: unknown option '${option}'" >&2
        usage
        exit 2
        ;;
    esac
  done
  mkdir -p "${ROOT}/lib64" "${ROOT}/scripts" "${ROOT}/configs"
  if ${install_nccl}; then
    standin "${ROOT}/lib64/libnccl.so.2" "NCCL"
  fi
  standin "${ROOT}/lib64/libnccl-net.so" "the gIB NCCL net plugin"
  install -m 0644 /scripts/set_nccl_env.sh "${ROOT}/scripts/set_nccl_env.sh"
  standin "${ROOT}/configs/guest_config.txtpb" "the guest config" "# "
  standin "${ROOT}/configs/tuner_config.txtpb" "the tuner config" "# "
  echo "Installed the stand-in gIB plugin ${VERSION} into ${ROOT} (not Google's; no working library)"
}

subcommand="${1:-}"
[ "$#" -gt 0 ] && shift
case "${subcommand}" in
  install)
    echo "install"
    install_subcommand "$@"
    ;;
  *)
    usage
    exit 2
    ;;
esac
