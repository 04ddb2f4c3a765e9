# awk -v want=N -f loss_diff.awk REF.jsonl GOT.jsonl: the worst relative
# difference between GOT's losses and REF's at the same "step", or "none"
# when GOT has not exactly N steps, a step is not in REF, or a loss is not
# a number (nan and inf compare as strings in mawk, and would pass).
{
    s = $0; sub(/.*"step": /, "", s); sub(/,.*/, "", s)
    l = $0; sub(/.*"loss": /, "", l); sub(/,.*/, "", l)
    if (l !~ /^-?[0-9.]+(e[-+]?[0-9]+)?$/) l = "bad"
    if (FILENAME == ARGV[1]) { ref[s] = l; next }
    n++
    if (!(s in ref) || l == "bad" || ref[s] == "bad") { bad = 1; next }
    d = (ref[s] - l) / ref[s]; if (d < 0) d = -d; if (d > w) w = d
}
END { if (bad || n != want) print "none"; else printf "%.3g\n", w }
