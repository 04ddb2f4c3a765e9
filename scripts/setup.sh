#!/usr/bin/env bash
# Installs what zinc needs (Debian 12 packages) when something is missing, and
# configures the meson build directories. Idempotent: quick when all is there.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential meson ninja-build pkg-config liburing-dev libhwloc-dev
      libjansson-dev libyaml-dev libsodium-dev libopenblas-openmp-dev libomp-dev libopenmpi-dev openmpi-bin
      fio e2fsprogs iproute2 python3 python3-venv
      openssh-client openssh-server    # (zinc launch's ssh; tests/test_launch.sh runs an sshd)
      pdsh                             # (zinc launch --launcher pdsh, tested there too)
      clang libclang-rt-14-dev)    # (clang: the libFuzzer harnesses of build-fuzz)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The CUDA toolkit is optional; when it sits in /usr/local/cuda, use it.
if [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
fi

setup_dir() {  # setup_dir DIR [meson options...]
    local dir=$1; shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" >"$dir.setup.log" 2>&1 || { cat "$dir.setup.log"; exit 1; }
        rm -f "$dir.setup.log"
    fi
}
# The project's virtual environment for `zinc prepare` (tokenizers, jinja2:
# scripts/requirements-prepare.txt, pinned, installed without their optional
# dependencies, which loading a tokenizer.json does not use). Remade when the
# requirements change.
setup_venv() {
    local req=scripts/requirements-prepare.txt stamp=.venv/.requirements
    if [ -x .venv/bin/python ] && cmp -s "$req" "$stamp"; then
        return 0
    fi
    echo "setup: making .venv for zinc prepare"
    rm -rf .venv
    python3 -m venv .venv || { echo "setup: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; return 1; }
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r "$req" ||
        { rm -rf .venv; echo "setup: pip could not install $req" >&2; return 1; }
    cp "$req" "$stamp"
}

# The fuzz suite's Python side: the prepare requirements and atheris
# (scripts/requirements-fuzz.txt) in .venv-fuzz, apart from the users' .venv.
setup_venv_fuzz() {
    local stamp=.venv-fuzz/.requirements
    if [ -x .venv-fuzz/bin/python ] &&
        cat scripts/requirements-prepare.txt scripts/requirements-fuzz.txt | cmp -s - "$stamp"; then
        return 0
    fi
    echo "setup: making .venv-fuzz for the Python fuzz harness"
    rm -rf .venv-fuzz
    python3 -m venv .venv-fuzz || { echo "setup: python3 -m venv failed" >&2; return 1; }
    .venv-fuzz/bin/python -m pip install -q --disable-pip-version-check --no-deps \
        -r scripts/requirements-prepare.txt -r scripts/requirements-fuzz.txt ||
        { rm -rf .venv-fuzz; echo "setup: pip could not install the fuzz requirements" >&2; return 1; }
    cat scripts/requirements-prepare.txt scripts/requirements-fuzz.txt > "$stamp"
}

for d in "$@"; do
    case "$d" in
        venv)         setup_venv ;;
        venv-fuzz)    setup_venv_fuzz ;;
        build)        setup_dir build ;;
        build-nocuda) setup_dir build-nocuda -Dcuda=disabled -Dnccl=disabled ;;
        build-asan)   setup_dir build-asan -Dcuda=disabled -Db_sanitize=address,undefined -Db_lundef=false ;;
        build-tsan)   setup_dir build-tsan -Dcuda=disabled -Db_sanitize=thread -Db_lundef=false ;;
        build-fuzz)   CC=clang setup_dir build-fuzz -Dfuzz=true -Dcuda=disabled -Dnccl=disabled \
                          -Db_sanitize=address,undefined -Db_lundef=false ;;
        *) echo "setup: unknown build dir $d" >&2; exit 2 ;;
    esac
done
