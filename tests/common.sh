# Shared by the shell tests (sourced): check and wait_for. A test sets
# fail=0 first and exits with $fail.

# check CONDITION-EXIT-CODE MESSAGE: "ok: MESSAGE", or "FAIL: MESSAGE" and
# fail=1.
check() {
    if [ "$1" -ne 0 ]; then
        echo "FAIL: $2"
        fail=1
    else
        echo "ok: $2"
    fi
}

# wait_for FILE PATTERN: waits (up to 60 s) until FILE has a line matching
# PATTERN; 1 when it never does.
wait_for() {
    for _ in $(seq 600); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}
