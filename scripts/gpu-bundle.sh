#!/usr/bin/env bash
# Packs a CUDA build of zinc for a GPU machine that cannot build it (no
# package registry, no jansson/liburing/hwloc/OpenBLAS headers): the zinc
# executable, the gpu suite's test programs, meson's test setup, the shared
# libraries they need outside CUDA and the C library, and this machine's
# meson (a build directory is read by the meson that made it). On the GPU
# machine scripts/gpu-remote.sh unpacks it beside the same checkout and runs
# scripts/gpu-check.sh on it. cuBLAS, cudart and NCCL come from the GPU
# machine (its driver and toolkit must be the build's major version).
# Usage: scripts/gpu-bundle.sh BUILD_DIR OUT.tar.xz
#   BUILD_DIR: configured with -Dcuda=enabled -Dgpu_arch=<the GPU's>, e.g.
#   meson setup build-gpu -Dcuda=enabled -Dgpu_arch=9.0 -Dmpi=disabled
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
bdir=${1%/}
out=$2
[ -f "$bdir/build.ninja" ] || { echo "gpu-bundle: $bdir is not a meson build directory" >&2; exit 2; }
python3 - "$bdir" <<'EOF' || { echo "gpu-bundle: $bdir is not configured with -Dcuda=enabled" >&2; exit 2; }
import json, sys
opts = {o["name"]: o["value"] for o in json.load(open(sys.argv[1] + "/meson-info/intro-buildoptions.json"))}
sys.exit(0 if opts.get("cuda") == "enabled" else 1)
EOF
export PATH="/usr/local/cuda/bin:$PATH"
ninja -C "$bdir" >/dev/null

stage=$(mktemp -d gpu-bundle-XXXXXX --tmpdir)
# nothing left behind: the staging folder and a half-written bundle go on
# any exit, Ctrl-C and SIGTERM included
trap 'rm -rf "$stage" "$out.part"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$stage/$bdir/tests" "$stage/.gpu/lib" "$stage/.gpu/py"

# the programs: zinc and every test of the gpu suite (meson's own list)
progs=$(python3 - "$bdir" <<'EOF'
import json, os, sys
b = sys.argv[1]
tests = json.load(open(b + "/meson-info/intro-tests.json"))
seen = {os.path.join(b, "zinc")}
for t in tests:
    if "gpu" in t["suite"] or any(s.endswith(":gpu") for s in t["suite"]):
        exe = t["cmd"][0]
        if exe.startswith(os.path.abspath(b)):
            seen.add(os.path.relpath(exe))
print("\n".join(sorted(seen)))
EOF
)
for p in $progs; do
    cp -a "$p" "$stage/$p"
done
cp -a "$bdir/meson-private" "$bdir/meson-info" "$stage/$bdir/"
mkdir -p "$stage/$bdir/meson-logs"    # meson test writes its logs there
{
    echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src include || echo ' (with uncommitted changes)')"
    echo "built $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release; echo "$PRETTY_NAME"), $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/CUDA \1/p')"
    echo "source root $(pwd)"
    python3 -c "import json,sys; o={x['name']: x['value'] for x in json.load(open(sys.argv[1]))}; print('gpu_arch', o['gpu_arch'])" \
        "$bdir/meson-info/intro-buildoptions.json"
} > "$stage/$bdir/BUNDLE"

# the libraries: what the programs load outside the C runtime and CUDA
# (those the GPU machine has, of a newer or equal version)
for p in $progs; do
    ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
    case "$name" in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) continue ;;
        libcuda.so*|libcudart.so*|libcublas*|libnccl.so*) continue ;;
    esac
    cp -L "$path" "$stage/.gpu/lib/$name"
done

# meson's test runner, as it made the build directory
mb=$(python3 -c 'import os, mesonbuild; print(os.path.dirname(mesonbuild.__file__))' 2>/dev/null ||
     ls -d /usr/lib/python3/dist-packages/mesonbuild)
cp -a "$mb" "$stage/.gpu/py/"
find "$stage/.gpu/py" -name __pycache__ -prune -exec rm -rf {} +

tar -C "$stage" -cf - . | xz -T0 -6 > "$out.part" && mv "$out.part" "$out"
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1)): $(echo $progs | wc -w) programs, $(ls "$stage/.gpu/lib" | wc -l) libraries"
sed 's/^/  /' "$stage/$bdir/BUNDLE"
