#!/usr/bin/env bash
# make test-binder: build a fresh virtual environment from exactly the files Binder reads
# (binder/requirements.txt, which includes ../requirements.txt, then binder/postBuild), then import lossgeom and
# run one chapter under strict nbval in it. Here pip finds torch's CPU wheel on local disk
# (PyTorch's CPU index is unreachable and skipped at once with PIP_RETRIES=0); on Binder
# the same file takes it from that index.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=$(mktemp -d)
trap 'rm -rf "$env_dir"' EXIT
python3 -m venv "$env_dir/venv"
PIP_RETRIES=0 "$env_dir/venv/bin/pip" install --quiet --disable-pip-version-check -r binder/requirements.txt
PATH="$env_dir/venv/bin:$PATH" bash binder/postBuild > /dev/null  # as repo2docker does, in its environment
"$env_dir/venv/bin/python" - <<'PY'
import lossgeom, torch
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
print(f"binder environment: lossgeom {lossgeom.__version__}, torch {torch.__version__}")
PY
PYTHONHASHSEED=0 OMP_NUM_THREADS=2 "$env_dir/venv/bin/python" -m pytest -q -p no:cacheprovider \
  chapters/ch02_family_of_minima.ipynb
