#!/usr/bin/env bash
# Runs scripts/gpu-check.sh on a GPU machine from a bundle made here by
# scripts/gpu-bundle.sh, in a copy of the same checkout: unpacks it, puts the
# checkout where the build directory expects it (its paths are absolute),
# finds the machine's cuBLAS, cudart and NCCL, and copies the results file and
# every step's output to OUT_DIR.
# Usage: scripts/gpu-remote.sh BUNDLE.tar.xz OUT_DIR [BUDGET_S]
#   BUDGET_S: gpu-check starts no step after that many seconds (default 0:
#   no budget)
#   GPU_REMOTE_CMD="...": run that shell command instead of gpu-check, in the
#   same environment (a single test under cuda-gdb, say)
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
bundle=$(realpath "$1")
out=$(realpath -m "$2")
budget=${3:-0}
mkdir -p "$out"
tar -xJf "$bundle" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall()' "$bundle" || { echo "gpu-remote: cannot unpack $bundle" >&2; exit 1; }
bdir=$(ls -d build*/BUNDLE | head -1 | xargs dirname)
cat "$bdir/BUNDLE"
src=$(sed -n 's/^source root //p' "$bdir/BUNDLE")
if [ -n "$src" ] && ! [ "$src" -ef . ]; then
    if [ -e "$src" ]; then
        echo "gpu-remote: the build expects its checkout at $src, which holds something else" >&2
        exit 1
    fi
    mkdir -p "$(dirname "$src")" && ln -s "$(pwd)" "$src" ||
        { echo "gpu-remote: cannot link $src to $(pwd)" >&2; exit 1; }
fi
cd "$src" || exit 1

# the bundle's libraries only where this machine lacks them (its own, often
# newer, stay in use by everything else, PyTorch too)
for f in .gpu/lib/*; do
    if ldconfig -p | awk '{ print $1 }' | grep -qx "$(basename "$f")"; then
        rm -f "$f"
    else
        echo "gpu-remote: $(basename "$f") from the bundle"
    fi
done
# the CUDA libraries: found by the loader, else in the toolkit or Python's
# CUDA wheels
libs=""
for name in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    if ldconfig -p | awk '{ print $1 }' | grep -qx "$name"; then
        echo "gpu-remote: $name from the loader's cache"
        continue
    fi
    f=$(ls /usr/local/cuda/lib64/$name /usr/local/cuda/targets/x86_64-linux/lib/$name 2>/dev/null | head -1)
    [ -n "$f" ] || f=$(find /usr /opt -name "$name" 2>/dev/null | head -1)
    if [ -z "$f" ]; then
        echo "gpu-remote: $name not found on this machine" >&2
        continue
    fi
    echo "gpu-remote: $name from $f"
    case ":$libs:" in *":$(dirname "$f"):"*) ;; *) libs="$libs:$(dirname "$f")" ;; esac
done
export LD_LIBRARY_PATH="$(pwd)/.gpu/lib$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# the meson that made the build directory, for meson test
mkdir -p .gpu/bin
cat > .gpu/bin/meson <<EOF
#!/bin/sh
PYTHONPATH="$(pwd)/.gpu/py\${PYTHONPATH:+:\$PYTHONPATH}" exec python3 -c 'import sys; from mesonbuild.mesonmain import main; sys.argv[0] = "meson"; sys.exit(main())' "\$@"
EOF
chmod +x .gpu/bin/meson
export PATH="$(pwd)/.gpu/bin:/usr/local/cuda/bin:$PATH"
meson --version | sed 's/^/gpu-remote: meson /'
ldd "$bdir/zinc" | grep "not found" && echo "gpu-remote: zinc is missing libraries (above)" >&2

if [ -n "${GPU_REMOTE_CMD:-}" ]; then
    OUT=$out bash -c "$GPU_REMOTE_CMD"
    exit $?
fi
GPU_CHECK_PREBUILT=1 GPU_CHECK_BUDGET_S=$budget GPU_CHECK_LOGS="$out/steps" \
    bash scripts/gpu-check.sh "$bdir"
rc=$?
cp bench/results/gpu-check-*.md "$out/" 2>/dev/null
cp "$bdir/meson-logs/testlog.txt" "$out/" 2>/dev/null
tar -C "$out" -czf "$out/steps.tar.gz" steps && rm -rf "$out/steps"
exit $rc
