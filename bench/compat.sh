#!/usr/bin/env bash
# The test suite under one torch / transformers pair, as a GPU user meets it (requirements.txt's floors
# were measured with this):
#
#     bench/compat.sh TORCH TRANSFORMERS [TEST ...]
#     bench/compat.sh 2.11.0 '5.17.*'                 # the engine, fidelity, parallel, LoRA, delethink, plan tests
#     bench/compat.sh 2.14.1 newest tests             # the newest transformers pip offers; the whole suite
#     VENV=/work/venvs/t211 bench/compat.sh 2.11.0 5.17.0 tests/test_plan.py
#
# A version is a pip specifier (2.11.0, '5.17.*') or `newest`. The venv is made once per pair, outside
# the repo (pytest and git would otherwise walk its site-packages), and reused: a second run only tests.
set -euo pipefail
usage="usage: bench/compat.sh TORCH TRANSFORMERS [TEST ...]"
torch_v=${1:?$usage} tf_v=${2:?$usage}
shift 2
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(tests/test_engine.py tests/test_fidelity.py tests/test_parallel.py tests/test_lora.py
                                 tests/test_delethink.py tests/test_plan.py)
cd "$(dirname "$0")/.."
pair="torch-${torch_v//[^0-9A-Za-z.]/}-transformers-${tf_v//[^0-9A-Za-z.]/}"
venv=${VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/rlvr-compat/$pair}
pin() { [ "$2" = newest ] && echo "$1" || echo "$1==$2"; }

if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    # torch from PyPI, not requirements.txt's CPU advice: PyPI's default wheel is the CUDA build a GPU
    # user installs (it runs on CPU too). The rest is the README's test command, less requirements.txt's
    # own torch / transformers floors, so that a pair older than them can be tried, and the optional
    # packages that the LoRA and parquet tests of the default list need.
    "$venv/bin/pip" install -q "$(pin torch "$torch_v")" "$(pin transformers "$tf_v")" \
        -r <(grep -vE '^(torch|transformers)([<>=!~ ]|$)' requirements.txt) pytest pyarrow peft
fi
# What pip resolved (a wildcard, `newest`, or a pip config that caps versions can differ from what
# was asked) and whether torch is a CUDA build.
"$venv/bin/python" -c 'import torch, transformers as t, peft
print("torch", torch.__version__, "(CUDA build %s)" % torch.version.cuda, "| transformers", t.__version__,
      "| peft", peft.__version__)'
start=$SECONDS
rc=0
"$venv/bin/python" -m pytest -q -p no:cacheprovider --extended "${tests[@]}" || rc=$?  # the extended tests too
echo "torch $torch_v, transformers $tf_v: pytest exit $rc in $((SECONDS - start)) s (venv $venv)"
exit $rc
