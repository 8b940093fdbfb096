#!/usr/bin/env bash
# stand-in for the local cluster; not Google's.
# Stands in for /scripts/container_entry.sh of
# us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/nccl-plugin-gpudirecttcpx-dev:v1.0.17, the
# GPUDirect-TCPXO NCCL plugin installer. It writes the same file names as the real installer,
# but every library is a small text file: nothing here can load into NCCL.
#
# Contract followed:
# - Command line (Slurm prolog, GoogleCloudPlatform/slurm-gcp@01d802506dadd73b3663f81b2153ad42f80e96ac:
#   tools/prologs-epilogs/receive-data-path-manager-mega):
#     docker run --rm --name nccl-installer --network=host -v /var/lib:/var/lib IMAGE install --install-nccl
# - What `install` writes, into both /var/lib/tcpxo/lib64 and /var/lib/fastrak/lib64
#   (google/nccl-plugin-gpudirect-tcpxo@04815d1bb89971577c7330f9873b70644b3a5934:
#   tcpxo_scripts/container_entry.sh): the plugin libnccl-net.so, which the guest-config shim
#   replaces (the plugin is renamed libnccl-net_internal.so) unless --no-install-nccl-shim-net;
#   libGPUViz.so, libnccl-profiler-comma.so, the tuner libnccl-tuner.so, the a3plus_*_config
#   textprotos (with _ll128/_nvlstree links), nccl-env-profile.sh (with -ll128/-nvlstree links),
#   and libnccl.so* only with --install-nccl. libnccl-tcpxo.so is in the file list seen on a VM
#   (the create-a3mega README quoted in the research notes).
# - Plugin v1.0.17 goes with RxDM v1.0.23 (GoogleCloudPlatform/slurm-gcp@
#   13fd92b615c030b9ba62e4a87d610bcc7af72b75: tools/prologs-epilogs/receive-data-path-manager-mega
#   lines 31-32), qualified with NCCL 2.28.7-1 (google/nccl-plugin-gpudirect-tcpxo@
#   04815d1bb89971577c7330f9873b70644b3a5934, the v1.0.17 release commit).
# Differences, on purpose: the real script prints its help and exits 0 on an unknown subcommand
# and ignores unknown options; this one exits 2 on both, so that a wrong command line fails in
# tests. Only `install` is offered (the real one also has shell, daemon and debug-info), and the
# installer writes no version marker of its own (nor does the real one).
set -eu

VERSION="v1.0.17"
NCCL_VERSION="2.28.7"
IMAGE="us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/nccl-plugin-gpudirecttcpx-dev:${VERSION}"
TARGETS="/var/lib/tcpxo/lib64 /var/lib/fastrak/lib64"

usage() {
  cat >&2 <<USAGE
Usage: $(basename "$0") <subcommand> [options]
(stand-in for the local cluster; not Google's: ${IMAGE})
Subcommands:
    install    Install the NCCL plugin into /var/lib/tcpxo/lib64 and /var/lib/fastrak/lib64
               --install-nccl installs libnccl.so.2 as well
               --tune_net is accepted and does nothing here
               --no-install-nccl-shim-net does not install the guest config checker
USAGE
}

standin() {  # standin FILE WHAT: a small text file in place of a library or a config
  printf '%s\n' "stand-in for the local cluster; not Google's: $2 of ${IMAGE}" >"$1"
}

install_subcommand() {
  local install_nccl=false shim=true option
  for option in "$@"; do
    case "${option}" in
      --install-nccl) install_nccl=true ;;
      --no-install-nccl-shim-net) shim=false ;;
      --tune_net) echo "--tune_net: not applied (stand-in)" ;;
      *)
        echo "install: unknown option '${option}'" >&2
        usage
        exit 2
        ;;
    esac
  done
  local dir
  for dir in ${TARGETS}; do
    mkdir -p "${dir}"
    if ${install_nccl}; then
      standin "${dir}/libnccl.so.${NCCL_VERSION}" "NCCL ${NCCL_VERSION}"
      ln -sf "libnccl.so.${NCCL_VERSION}" "${dir}/libnccl.so.2"
      ln -sf libnccl.so.2 "${dir}/libnccl.so"
    fi
    echo "Installing NCCL plugin into ${dir} (stand-in files)"
    standin "${dir}/libnccl-net.so" "the TCPXO NCCL net plugin"
    standin "${dir}/libnccl-tcpxo.so" "the TCPXO transport library"
    standin "${dir}/libGPUViz.so" "libGPUViz"
    standin "${dir}/libnccl-profiler-comma.so" "the NCCL profiler plugin"
    install -m 0644 /scripts/nccl-env-profile.sh "${dir}/nccl-env-profile.sh"
    ln -sf "${dir}/nccl-env-profile.sh" "${dir}/nccl-env-profile-ll128.sh"
    ln -sf "${dir}/nccl-env-profile.sh" "${dir}/nccl-env-profile-nvlstree.sh"
    standin "${dir}/libnccl-tuner.so" "the NCCL tuner plugin"
    standin "${dir}/a3plus_tuner_config.textproto" "the tuner config"
    sed -i '1s/^/# /' "${dir}/a3plus_tuner_config.textproto"
    ln -sf "${dir}/a3plus_tuner_config.textproto" "${dir}/a3plus_tuner_config_ll128.textproto"
    ln -sf "${dir}/a3plus_tuner_config.textproto" "${dir}/a3plus_tuner_config_nvlstree.textproto"
    if ${shim}; then
      mv "${dir}/libnccl-net.so" "${dir}/libnccl-net_internal.so"
      standin "${dir}/libnccl-net.so" "the guest config checker shim (libnccl-net-shim.so)"
      standin "${dir}/a3plus_guest_config.textproto" "the guest config"
      sed -i '1s/^/# /' "${dir}/a3plus_guest_config.textproto"
      ln -sf "${dir}/a3plus_guest_config.textproto" "${dir}/a3plus_guest_config_ll128.textproto"
      ln -sf "${dir}/a3plus_guest_config.textproto" "${dir}/a3plus_guest_config_nvlstree.textproto"
    fi
  done
  echo "Installed the stand-in NCCL plugin ${VERSION} (not Google's; no working library)"
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
