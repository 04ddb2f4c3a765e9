#!/usr/bin/env bash
# Every public header compiles on its own, as C11 and as C++ when a C++
# compiler is present, with no CUDA/liburing types leaking in.
set -u
cc=$1
inc=$2
build=$3
pass=0 fail=0
for h in "$inc"/zinc/*.h; do
    name=$(basename "$h")
    if printf '#include "zinc/%s"\nint zn_header_test_dummy;\n' "$name" |
        "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$inc" -I"$build" -x c - ; then
        pass=$((pass + 1))
    else
        echo "FAIL: zinc/$name does not compile alone"
        fail=$((fail + 1))
    fi
    if grep -nE '\b(cuda|cublas|nccl|io_uring|hwloc|json_t|MPI_)[A-Za-z_]*\b' "$h" |
        grep -vE '^\s*[0-9]+:\s*(/\*|\*)' | grep -qE '#include <(cuda|cublas|nccl|liburing|hwloc|jansson|mpi)'; then
        echo "FAIL: zinc/$name includes a foreign library header"
        fail=$((fail + 1))
    fi
done
echo "headers: $pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
