#!/usr/bin/env bash
# The numeric paths a CPU may take: zinc's Adam SIMD path (ZINC_SIMD) and
# OpenBLAS's kernel family (OPENBLAS_CORETYPE), which the host backend's
# GEMMs run on. The fixture tests must pass on every one this CPU can run,
# whatever the machine picks by itself (tests/README.md, "Bounds").
#
#   numeric-paths.sh second BUILD   prints "ZINC_SIMD=.. OPENBLAS_CORETYPE=.."
#                                   for a path other than the one BUILD's
#                                   zinc picks here (scripts/test.sh runs
#                                   one build's suites under it)
#   numeric-paths.sh matrix BUILD   runs the fixture tests under every
#                                   combination this CPU can run; one line
#                                   each, exit 1 if any failed
set -uo pipefail
cd "$(dirname "$0")/.."

mode=${1:-}
build=${2:-build}
zinc=$build/zinc
[ -x "$zinc" ] || { echo "numeric-paths: $zinc is not built" >&2; exit 2; }

flags=$(grep -m1 '^flags' /proc/cpuinfo)
has() { [[ " $flags " == *" $1 "* ]]; }

# The kernel families OpenBLAS 0.3.21 (Debian 12, DYNAMIC_ARCH) has for
# x86-64, from SSE3 up; only those this CPU can execute.
cores=(Prescott Sandybridge)
has avx2 && has fma && cores+=(Haswell Zen)
has avx512f && has avx512bw && has avx512vl && cores+=(SkylakeX)
has avx512_bf16 && cores+=(Cooperlake)
simds=(scalar)
has avx2 && has fma && has f16c && simds+=(avx2)
has avx512f && has avx512bw && has avx512vl && simds+=(avx512)

info=$("$zinc" info --json 2>/dev/null)
field() { python3 -c 'import json,sys; print(json.load(sys.stdin)["cpu"][sys.argv[1]])' "$1" <<<"$info"; }
native_simd=$(field adam_path)
native_core=$(field blas | sed -E 's/.*, ([A-Za-z0-9]+) kernels.*/\1/')

case "$mode" in
second)
    # another vector path if there is one, else the scalar loop
    simd=scalar
    for s in avx512 avx2; do
        [[ " ${simds[*]} " == *" $s "* && "$s" != "$native_simd" ]] && { simd=$s; break; }
    done
    # a family with other GEMM kernels: AVX2 where the CPU picked AVX-512
    # kernels, AVX-512 where it picked AVX2 ones and has them, else AVX
    case "$native_core" in
        SkylakeX|Cooperlake|SapphireRapids) core=Haswell ;;
        *) if [[ " ${cores[*]} " == *" SkylakeX "* ]]; then core=SkylakeX; else core=Sandybridge; fi ;;
    esac
    echo "ZINC_SIMD=$simd OPENBLAS_CORETYPE=$core"
    ;;
matrix)
    tests=(train_hf model_ref model_packed model_gqa model_grad train)
    echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); zinc picks" \
         "adam $native_simd, OpenBLAS $native_core kernels"
    echo "# fixture tests: ${tests[*]}"
    bad=0
    for core in "${cores[@]}"; do
        for simd in "${simds[@]}"; do
            line="OPENBLAS_CORETYPE=$core ZINC_SIMD=$simd:"
            for t in "${tests[@]}"; do
                log=$(mktemp)
                if (cd "$build/tests" && env ZINC_LOG=warn OMP_NUM_THREADS=2 ZINC_DEVICE_GUARD=1 \
                        OPENBLAS_CORETYPE=$core ZINC_SIMD=$simd "./test_$t" >"$log" 2>&1); then
                    line+=" $t ok"
                else
                    line+=" $t FAILED"
                    bad=$((bad + 1))
                    grep -m3 FAIL "$log" | sed 's/^/    /' >&2
                fi
                rm -f "$log"
            done
            echo "$line"
        done
    done
    echo "# $bad failed"
    [ "$bad" -eq 0 ]
    ;;
*)
    echo "usage: numeric-paths.sh second|matrix [BUILD]" >&2
    exit 2
    ;;
esac
