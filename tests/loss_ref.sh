# Shared by the shell tests that resume a run and compare it with an
# uninterrupted one (sourced): same_as_ref JSONL compares every step of a
# --json-log with ref.jsonl's by loss_hex (the loss's bits) and prints the
# steps compared, or the first that differs (then returns 1).
same_as_ref() {
    local n=0 first=""
    while read -r line; do
        step=$(echo "$line" | sed 's/.*"step": \([0-9]*\),.*/\1/')
        hex=$(echo "$line" | sed 's/.*"loss_hex": "\([^"]*\)".*/\1/')
        want=$(grep "\"step\": $step," ref.jsonl | sed 's/.*"loss_hex": "\([^"]*\)".*/\1/')
        [ -z "$first" ] && first=$step
        if [ "$hex" != "$want" ]; then echo "step $step: loss $hex, uninterrupted $want"; return 1; fi
        n=$((n + 1))
    done < "$1"
    echo "steps $first..$((first + n - 1)) identical"
}
