# shellcheck shell=bash
# stand-in for the local cluster; not Google's.
# Stands in for nccl-env-profile.sh of the GPUDirect-TCPXO plugin installer
# (us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/nccl-plugin-gpudirecttcpx-dev:v1.0.17), which
# its `install` subcommand writes to /var/lib/tcpxo/lib64. Every variable and value below is the
# one the published profile sets:
#   google/nccl-plugin-gpudirect-tcpxo@8f816be3b74e94cbbeb75db2762431ec09370ac1:
#   tcpxo_scripts/nccl-env-profile.sh
# Usage, as Google's run scripts do (GoogleCloudPlatform/cluster-toolkit@
# 2452d0dc718a82ec3e76da57d0c007fefeebc119: examples/machine-learning/a3-megagpu-8g/nccl-tests/
# run-nccl-tests.sh):
#   NCCL_LIB_DIR="/var/lib/tcpxo/lib64" source /var/lib/tcpxo/lib64/nccl-env-profile.sh
# Like the real profile, this is bash ([[ =~ ]] and local): source it from bash.

: "${NCCL_LIB_DIR:?Must set NCCL_LIB_DIR}"

# The NICs, found as the published profile finds them: each netdev's PCI address (PCI_SLOT_NAME in
# /sys/class/net/<netdev>/device/uevent). An address on bus 00 with function 0 (00:XX.0) is the
# host (gVNIC) NIC; one on buses 06, 07, 0d, 0e, 86, 87, 8d, 8e, device 00 function 0, is a GPU
# NIC. Netdevs without a PCI device (the local cluster's veths) are skipped, and what is not found
# keeps the profile's defaults: eth0 for the host NIC, eth1..eth8 for the GPU NICs.
host_nic="eth0"
gpu_nics="eth1,eth2,eth3,eth4,eth5,eth6,eth7,eth8"
_standin_find_nics() {
  local uevent netdev line slot found_host="" found_gpu=""
  for uevent in /sys/class/net/*/device/uevent; do
    [[ -r "${uevent}" ]] || continue
    netdev="${uevent#/sys/class/net/}"
    netdev="${netdev%%/*}"
    slot=""
    while IFS= read -r line; do
      case "${line}" in PCI_SLOT_NAME=*) slot="${line#PCI_SLOT_NAME=}" ;; esac
    done <"${uevent}"
    [[ -n "${slot}" ]] || continue
    if [[ "${slot}" =~ 00:[0-9a-f]{2}\.0 ]]; then
      found_host="${netdev}"  # the last one found, as in the published profile
    elif [[ "${slot}" =~ [0|8][6-7d-e]:00\.0 ]]; then
      found_gpu="${found_gpu:+${found_gpu},}${netdev}"
    fi
  done
  if [[ -n "${found_host}" ]]; then host_nic="${found_host}"; fi
  if [[ -n "${found_gpu}" ]]; then gpu_nics="${found_gpu}"; fi
}
_standin_find_nics
unset -f _standin_find_nics

export LD_LIBRARY_PATH="${NCCL_LIB_DIR}:${LD_LIBRARY_PATH}"
export NCCL_FASTRAK_IFNAME="${gpu_nics}"
export NCCL_FASTRAK_CTRL_DEV="${host_nic}"
export NCCL_SOCKET_IFNAME="${host_nic}"
export NCCL_CROSS_NIC=0
export NCCL_PROTO=Simple,LL128
export NCCL_MIN_NCHANNELS=4
export NCCL_NVLSTREE_MAX_CHUNKSIZE=131072
export NCCL_P2P_NET_CHUNKSIZE=524288
export NCCL_P2P_PCI_CHUNKSIZE=524288
export NCCL_P2P_NVL_CHUNKSIZE=1048576
export NCCL_FASTRAK_NUM_FLOWS=2
export NCCL_FASTRAK_ENABLE_CONTROL_CHANNEL=0
export NCCL_BUFFSIZE=8388608
export NCCL_FASTRAK_USE_SNAP=1
export NCCL_FASTRAK_USE_LLCM=1
export CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7
export NCCL_NET_GDR_LEVEL=PIX
export NCCL_FASTRAK_ENABLE_HOTPATH_LOGGING=0
export NCCL_TUNER_PLUGIN=libnccl-tuner.so
export NCCL_TUNER_CONFIG_PATH="${NCCL_LIB_DIR}/a3plus_tuner_config.textproto"
export NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE="${NCCL_LIB_DIR}/a3plus_guest_config.textproto"
export NCCL_FASTRAK_PLUGIN_ACCEPT_TIMEOUT_MS=600000
export NCCL_DEBUG=WARN
export NCCL_DEBUG_SUBSYS=INIT,NET,ENV,COLL,GRAPH
