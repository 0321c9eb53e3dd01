#!/usr/bin/env bash
# make test-portable: strict nbval of every chapter again, under settings that change the
# floating-point kernels on this machine, against the same committed reference outputs.
#
# Another CPU, another BLAS code path or another thread count changes the last bits of a
# float64 result. The committed outputs must hold only digits that survive that, so each
# setting below must pass with exactly the outputs `make test` compares:
#   ATEN_CPU_CAPABILITY=default   torch's generic (non-SIMD) kernels
#   ATEN_CPU_CAPABILITY=avx2      torch's AVX2 kernels (where the CPU has AVX2)
#   ATEN_CPU_CAPABILITY=avx512    torch's AVX-512 kernels (where the CPU has AVX-512)
#   one thread                    OMP/MKL/OpenBLAS on one thread (other reduction order)
#   MKL_CBWR=COMPATIBLE           MKL's conditional-numerical-reproducibility path (torch's BLAS)
#   OPENBLAS_CORETYPE=Sandybridge numpy/scipy's OpenBLAS on its older AVX kernels
# nbval's flags are `make test`'s, from pyproject.toml's pytest settings.
# Usage: tools/test_portable.sh [notebook ...]   (default: every chapters/*.ipynb)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(chapters)

settings=("ATEN_CPU_CAPABILITY=default")
grep -qw avx2 /proc/cpuinfo 2>/dev/null && settings+=("ATEN_CPU_CAPABILITY=avx2")
grep -qw avx512f /proc/cpuinfo 2>/dev/null && settings+=("ATEN_CPU_CAPABILITY=avx512")
settings+=("OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1"
           "MKL_CBWR=COMPATIBLE"
           "OPENBLAS_CORETYPE=Sandybridge")

failed=()
start=$SECONDS
for setting in "${settings[@]}"; do
  echo "== test-portable: $setting"
  t0=$SECONDS
  # shellcheck disable=SC2086
  if env $setting "$PY" -m pytest -q -n 2 --dist loadfile "${targets[@]}"; then
    echo "== passed in $((SECONDS - t0)) s: $setting"
  else
    echo "== FAILED: $setting"
    failed+=("$setting")
  fi
done
echo "== test-portable: ${#settings[@]} settings in $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
  printf '== failed under: %s\n' "${failed[@]}"
  exit 1
fi
