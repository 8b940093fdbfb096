#!/usr/bin/env bash
# stand-in for the local cluster; not Google's.
# Stands in for /fts/entrypoint_rxdm_container.sh of
# us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.23, the GPUDirect-TCPXO
# receive-datapath manager (RxDM). It moves no data: it checks its flags and the aperture devices,
# reports ready with the real daemon's log line, and waits to be stopped.
#
# Contract followed:
# - How it is run (GoogleCloudPlatform/slurm-gcp@01d802506dadd73b3663f81b2153ad42f80e96ac:
#   tools/prologs-epilogs/receive-data-path-manager-mega):
#     docker run --detach --rm --name receive-datapath-manager-JOB --cap-add=NET_ADMIN
#       --network=host --privileged --gpus all --volume /var/lib/nvidia/lib64:/usr/local/nvidia/lib64
#       --volume /dev/dmabuf_import_helper:/dev/dmabuf_import_helper
#       --env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu IMAGE --num_hops=2
#   and it is ready once `docker container logs` shows "Buffer manager initialization complete".
# - The real entrypoint runs /fts/kernel_tuning.sh (sysctls, ethtool on the GPU NICs) and then
#   /fts/fastrak_gpumem_manager "$@", a gflags program
#   (google/nccl-plugin-gpudirect-tcpxo: scripts/entrypoint_rxdm_container.sh). The stand-in
#   changes no kernel setting.
# - Flags: --num_hops, --uid, --alsologtostderr (the Slurm prolog), --num_nics (retired in the
#   Nov 19, 2025 release but still passed by older scripts: accepted and ignored), and the
#   defaults read from the manager's source: num_nics=8, nics_to_use="", use_gpu_mem=true,
#   num_gpus_to_use=0, http_port=7332. Release notes: GoogleCloudPlatform/
#   container-engine-accelerators@0a2b482ede2c659a85c7a1a1345e09ea709d10d0: gpudirect-tcpxo/README.md.
# - It needs the aperture devices (/dev/aperture_devices/<PCI address>, made by a udev rule for
#   PCI 1ae0:0084): without them it fails.
# Differences, on purpose: a flag error exits 2 (a gflags program exits 1), so that a caller can
# tell a wrong command line from missing devices (exit 1). It logs to stderr whatever the flags.
set -u

VERSION="v1.0.23"
APERTURE_DEVICES="${APERTURE_DEVICES:-/dev/aperture_devices}"

log() {  # log LEVEL MESSAGE...: a glog-style line on stderr
  printf '%s%s %7d fastrak_gpumem_manager_standin.sh] %s\n' \
    "$1" "$(date -u '+%m%d %H:%M:%S.%6N')" "$$" "${*:2}" >&2
}

flag_error() {
  echo "ERROR: $1" >&2
  exit 2
}

is_int() { [[ "$1" =~ ^-?[0-9]+$ ]]; }
bool_value() {  # bool_value NAME VALUE: the gflags spellings of a bool
  case "$2" in
    true | t | yes | y | 1) echo true ;;
    false | f | no | n | 0) echo false ;;
    *) flag_error "illegal value '$2' specified for bool flag '$1'" ;;
  esac
}

num_hops=2
num_nics=8
num_nics_given=false
uid=""
alsologtostderr=false
nics_to_use=""
use_gpu_mem=true
num_gpus_to_use=0
http_port=7332

while [ "$#" -gt 0 ]; do
  arg="$1"
  shift
  case "${arg}" in
    --) break ;;
    --* | -*) ;;
    *) continue ;;  # gflags leaves positional arguments to the program, which takes none
  esac
  body="${arg#-}"
  body="${body#-}"
  name="${body%%=*}"
  has_value=false
  value=""
  if [[ "${body}" == *=* ]]; then
    has_value=true
    value="${body#*=}"
  fi
  case "${name}" in
    num_hops | num_nics | num_gpus_to_use | http_port | uid | nics_to_use)
      if ! ${has_value}; then
        [ "$#" -gt 0 ] || flag_error "flag '${arg}' is missing its argument"
        value="$1"
        shift
      fi
      case "${name}" in
        uid | nics_to_use) ;;
        *) is_int "${value}" || flag_error "illegal value '${value}' specified for int32 flag '${name}'" ;;
      esac
      printf -v "${name}" '%s' "${value}"
      [ "${name}" = num_nics ] && num_nics_given=true
      ;;
    alsologtostderr | use_gpu_mem)
      if ${has_value}; then value="$(bool_value "${name}" "${value}")" || exit 2; else value=true; fi
      printf -v "${name}" '%s' "${value}"
      ;;
    noalsologtostderr | nouse_gpu_mem)
      ${has_value} && flag_error "boolean value ('${value}') specified for negated flag '${name}'"
      printf -v "${name#no}" '%s' false
      ;;
    *) flag_error "unknown command line flag '${name}'" ;;
  esac
done

log I "stand-in for the local cluster; not Google's: tcpgpudmarxd ${VERSION} starting" \
  "(num_hops=${num_hops} num_nics=${num_nics} uid=${uid} nics_to_use=${nics_to_use}" \
  "use_gpu_mem=${use_gpu_mem} num_gpus_to_use=${num_gpus_to_use} http_port=${http_port}" \
  "alsologtostderr=${alsologtostderr})"
if ${num_nics_given}; then
  log W "--num_nics is retired (release of Nov 19, 2025); ignored"
fi
log I "kernel tuning skipped (stand-in: no sysctl or ethtool change)"
if [ ! -d "${APERTURE_DEVICES}" ] || [ -z "$(ls -A "${APERTURE_DEVICES}" 2>/dev/null)" ]; then
  log E "no aperture devices in ${APERTURE_DEVICES}: cannot start the buffer manager"
  exit 1
fi
for device in "${APERTURE_DEVICES}"/*; do
  log I "aperture device ${device}"
done

stopping() {
  log I "received $1; shutting down"
  [ -n "${sleeper:-}" ] && kill "${sleeper}" 2>/dev/null
  exit 0
}
trap 'stopping SIGTERM' TERM
trap 'stopping SIGINT' INT
log I "Buffer manager initialization complete"
sleep infinity &
sleeper=$!
wait "${sleeper}"
