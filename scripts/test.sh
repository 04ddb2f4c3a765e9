#!/usr/bin/env bash
# The whole test suite: the default build (CUDA compiled when the toolkit is
# present; GPU tests skip without a GPU), a build without CUDA on a second
# numeric path (another Adam SIMD path and another OpenBLAS kernel family
# than this CPU picks: scripts/numeric-paths.sh), the unit suite under
# AddressSanitizer+UBSan, the gpu suite under ThreadSanitizer, the parsers
# under libFuzzer (build-fuzz, clang). Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
bash scripts/setup.sh build build-nocuda build-asan build-tsan build-fuzz || exit 1
# zinc prepare's Python side (PyPI: tokenizers, jinja2); without it the
# prepare test skips, saying so
bash scripts/setup.sh venv || echo "test: no .venv for zinc prepare: its test will skip"
# the Python fuzz harness's (atheris); without it fuzz_template skips, saying so
bash scripts/setup.sh venv-fuzz || echo "test: no .venv-fuzz: fuzz_template will skip"

jobs=$(nproc)
pass=0 fail=0 skip=0
run_env=()
run() {  # run DIR [meson test args...]; the environment in run_env
    local dir=$1; shift
    # the default build compiles everything (benchmarks included); the others
    # only what their selected tests run (scripts/suite-targets.py; every
    # target when it cannot tell)
    local targets=()
    if [ "$dir" != build ]; then
        # (regenerated first where a meson.build changed: the lists come from it)
        ninja -C "$dir" build.ninja >"$dir/ninja.log" 2>&1 ||
            { cat "$dir/ninja.log"; fail=$((fail + 1)); return; }
        mapfile -t targets < <(python3 scripts/suite-targets.py "$dir" "$@") || targets=()
    fi
    echo "== $dir: building ${#targets[@]} targets (0: all)"
    ninja -C "$dir" "${targets[@]}" >"$dir/ninja.log" 2>&1 ||
        { cat "$dir/ninja.log"; fail=$((fail + 1)); return; }
    echo "== $dir: testing $* ${run_env[*]}"
    env "${run_env[@]}" meson test -C "$dir" --print-errorlogs --num-processes "$jobs" "$@"
    local log="$dir/meson-logs/testlog.json"
    if [ -f "$log" ]; then
        local p f s
        p=$(grep -c '"result": "OK"' "$log")
        s=$(grep -c '"result": "SKIP"' "$log")
        f=$(grep -c -E '"result": "(FAIL|TIMEOUT|ERROR|UNEXPECTEDPASS)"' "$log")
        pass=$((pass + p)) skip=$((skip + s)) fail=$((fail + f))
    else
        fail=$((fail + 1))
    fi
}
# the scale run (33 GiB of swap, ~90 s) once: the host backend is the same
# code in both builds
run build --no-suite scale "$@"
# the same suites on other kernels: a bound fitted to one BLAS or SIMD path
# fails here
read -r -a run_env <<<"$(bash scripts/numeric-paths.sh second build)" || run_env=()
# (suite once: tests whose checks do not depend on the SIMD or BLAS kernel,
# or that run every SIMD path themselves: the launcher, the plan contract,
# signals, checkpoints compared bit for bit, ranks against one rank;
# `meson test --list` shows them, tests/meson.build says why for each)
run build-nocuda --no-suite once "$@"
run_env=()
run build-asan --suite unit "$@"
run build-tsan --suite gpu "$@"
# every parser of outside input under libFuzzer (clang, ASan + UBSan), 10 s each
run build-fuzz --suite fuzz "$@"
echo
echo "tests: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
