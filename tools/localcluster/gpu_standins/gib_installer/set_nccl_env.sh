# shellcheck shell=sh
# stand-in for the local cluster; not Google's.
# Stands in for /var/lib/gib/scripts/set_nccl_env.sh, written by the gIB plugin installer
# (us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1). Google's script is not
# published; the values below are those Google's public recipes set around it, each with its
# source. Short names:
#   PKB = GoogleCloudPlatform/PerfKitBenchmarker@2391eb06011d1184c7756deb99fa9ff5f396578c:
#         perfkitbenchmarker/data/nvidia_hpl/a4.dockerfile
#   CHS = GoogleCloudPlatform/cluster-health-scanner@14ed6db2105c169ed14a2739c0cf29bbe9722c8b:
#         src/nccl_healthcheck/run-nccl-combined-plugins.sh (function run_nccl_rdma)
#   CT  = GoogleCloudPlatform/cluster-toolkit@c9ec0265044729f675562f19ed2845d08fca7251:
#         examples/machine-learning/a3-ultragpu-8g/nccl-tests/run-nccl-tests.sh
#   CT-VAR = GoogleCloudPlatform/cluster-toolkit@2123ba50d7a0ed5d82f7fbf95a818aaf92860b67:
#         the same file, when the plugin lived in /var/lib/gib
# CHS also sets NCCL_P2P_PCI_CHUNKSIZE=131072 and NCCL_P2P_NVL_CHUNKSIZE=524288, not set here.
# POSIX sh: source it from sh or bash.

export NCCL_NET=gIB  # PKB; CT sets it right after sourcing the script
export NCCL_CROSS_NIC=0  # PKB, CHS
export NCCL_NET_GDR_LEVEL=PIX  # PKB, CHS
export NCCL_P2P_NET_CHUNKSIZE=131072  # PKB, CHS
export NCCL_NVLS_CHUNKSIZE=524288  # PKB, CHS
export NCCL_IB_ADAPTIVE_ROUTING=1  # PKB, CHS
export NCCL_IB_QPS_PER_CONNECTION=4  # PKB, CHS
export NCCL_IB_TC=52  # PKB, CHS
export NCCL_IB_FIFO_TC=84  # PKB, CHS
export NCCL_IB_GID_INDEX=3  # CHS
export NCCL_SOCKET_IFNAME=enp0s19,enp192s20  # PKB; CT sets it right after sourcing the script
# CT-VAR (CHS names the same files under /usr/local/gib/configs)
export NCCL_TUNER_CONFIG_PATH=/var/lib/gib/configs/tuner_config.txtpb
export NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE=/var/lib/gib/configs/guest_config.txtpb
# CT-VAR and PKB (/usr/local/gib/lib64) put lib64 first next to sourcing the script; whether
# Google's script does it too is not published. The stand-in does, so either way works.
export LD_LIBRARY_PATH="/var/lib/gib/lib64:${LD_LIBRARY_PATH}"
