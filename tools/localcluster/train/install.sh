#!/bin/sh
# Runs inside the build container: the wheelhouse is mounted read-only at /wheels.
# Installs LLaMA-Factory with CPU torch and DeepSpeed into the venv /opt/llamafactory.
set -eu
venv=/opt/llamafactory
set -- /wheels/pip-*.whl
pip_wheel=$1
python3 -m venv --without-pip "$venv"
pip() { "$venv/bin/python" "$pip_wheel/pip" "$@"; }
# Run pip from its wheel (Debian's python3 has no ensurepip), then install it into the venv.
pip install -q --no-index --find-links /wheels "$pip_wheel"
"$venv/bin/pip" install -q --no-index --find-links /wheels --no-compile \
    torch==2.13.0 setuptools wheel
"$venv/bin/pip" install -q --no-index --find-links /wheels --no-compile \
    --constraint /wheels/constraints.txt llamafactory==0.9.5
# DeepSpeed's CPU backend loads its shared-memory op at start-up and would compile it there
# (with a compiler the image lacks): build it now, then drop the compiler (libgomp1 stays).
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends g++ python3-dev libgomp1 >/dev/null
DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 \
    "$venv/bin/pip" install -q --no-index --find-links /wheels --no-compile --no-build-isolation \
    --constraint /wheels/constraints.txt deepspeed==0.19.8
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq --auto-remove g++ python3-dev >/dev/null
rm -rf /var/lib/apt/lists/*
# LLaMA-Factory requires torchvision and torchaudio, whose only Linux wheels are CUDA builds:
# with a CPU torch, torchvision breaks `import transformers` ("operator torchvision::nms does not
# exist") and torchaudio's compiled extension cannot load. transformers works without
# torchvision; llamafactory imports torchaudio unconditionally (audio only), so torchaudio stays
# as pure Python without its extension libraries.
"$venv/bin/pip" uninstall -q -y torchvision
rm -f "$venv"/lib/python3*/site-packages/torchaudio/lib/*.so
"$venv/bin/pip" check || true
"$venv/bin/llamafactory-cli" version
DS_ACCELERATOR=cpu "$venv/bin/python" -c 'from deepspeed.accelerator import get_accelerator as a
a().create_op_builder("ShareMemCommBuilder").load(); print("DeepSpeed shm op: prebuilt")'
rm -rf /root/.cache
