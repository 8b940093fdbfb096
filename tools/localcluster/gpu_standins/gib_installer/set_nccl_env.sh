# shellcheck shell=sh
# stand-in for the local cluster; not Google's.
# Stands in for scripts/set_nccl_env.sh, written by the gIB plugin installer
# (us-docker.pkg.dev/gce-ai-infra/gpudirect-gib/nccl-plugin-gib:v1.1.1) into /var/lib/gib and
# sourced in the workload container as /usr/local/gib/scripts/set_nccl_env.sh: like Google's,
# it names its files under /usr/local/gib, wherever the installer wrote them, so a container
# that mounts the folder elsewhere gets paths to nothing (a wrong NCCL_TUNER_CONFIG_PATH crashes
# NCCL). Google's script is not published; the values below are those Google's public recipes
# set around it, each with its source. Short names:
#   PKB = GoogleCloudPlatform/PerfKitBenchmarker@2391eb06011d1184c7756deb99fa9ff5f396578c:
#         perfkitbenchmarker/data/nvidia_hpl/a4.dockerfile
#   CHS = GoogleCloudPlatform/cluster-health-scanner@14ed6db2105c169ed14a2739c0cf29bbe9722c8b:
#         src/nccl_healthcheck/run-nccl-combined-plugins.sh (function run_nccl_rdma)
#   CT  = GoogleCloudPlatform/cluster-toolkit@1047080375afbb44da4b596be314634e7486af4a:
#         examples/machine-learning/a3-ultragpu-8g/nccl-tests/run-nccl-tests.sh (lines 34-36: the
#         script sourced from /usr/local/gib, no config path set around it)
#   CT-VAR = GoogleCloudPlatform/cluster-toolkit@2123ba50d7a0ed5d82f7fbf95a818aaf92860b67:
#         the same file when it mounted /var/lib/gib as itself and had to override both paths
#   GKE = GoogleCloudPlatform/container-engine-accelerators@
#         992db81257553607f1477945f1b3219632991829: gpudirect-rdma/nccl-test.yaml lines 74-88
#         (the installer's folder mounted at /usr/local/gib, the script sourced there)
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
# Under /usr/local/gib whatever the host folder (CHS names the same files there; CT-VAR had to
# override both when its mount was /var/lib/gib).
export NCCL_TUNER_CONFIG_PATH=/usr/local/gib/configs/tuner_config.txtpb
export NCCL_SHIMNET_GUEST_CONFIG_CHECKER_CONFIG_FILE=/usr/local/gib/configs/guest_config.txtpb
# CT and GKE put /usr/local/gib/lib64 first next to sourcing the script; whether Google's script
# does it too is not published. The stand-in does, so either way works.
export LD_LIBRARY_PATH="/usr/local/gib/lib64:${LD_LIBRARY_PATH}"
