#!/usr/bin/env bash
# `zinc train` from the command line: the embedded default equals
# examples/tiny.json; an infeasible config stops before any work with the
# same explanation `zinc plan` gives; a short run writes one JSON line per
# step, a trace, and the per-tier report. With --slow, the learning check:
# the embedded default's loss falls below 4.5 (from ln(320) = 5.77; the
# chain's floor is 1.06) in its 60 steps.
set -u
zinc=$(realpath "$1")
src=$(realpath "$2")
mode=${3:-fast}
fail=0
work=$(realpath "$(mktemp -d train-cli-XXXXXX)")
trap 'rm -rf "$work"' EXIT
cd "$work"

check() { if ! eval "$1"; then echo "FAIL: $2"; fail=1; fi; }

if [ "$mode" = fast ]; then
    "$zinc" train --print-default > default.json
    check "cmp -s default.json '$src/examples/tiny.json'" "embedded default differs from examples/tiny.json"

    "$zinc" plan "$src/examples/tiny.json" --set tiers.cpu=1MiB > /dev/null 2> plan.err
    rc=$?; check "[ \$rc -eq 1 ]" "zinc plan accepted a 1 MiB cpu tier"
    "$zinc" train "$src/examples/tiny.json" --set tiers.cpu=1MiB > /dev/null 2> train.err
    rc=$?
    check "[ $rc -eq 1 ]" "zinc train with an infeasible config exited $rc, expected 1"
    why=$(grep -o 'does not fit: .*' plan.err)
    check "[ -n \"\$why\" ] && grep -qF \"\$why\" train.err" "train's error differs from plan's: $(cat train.err)"
    check "[ ! -e zinc-swap ]" "an infeasible run created the swap directory"

    # budgets beyond the machine: a run refuses them naming what the machine
    # has (before creating anything); a plan (maybe for another machine) warns
    "$zinc" train --set tiers.cpu=100TiB --steps 1 > /dev/null 2> big.err
    rc=$?
    check "[ $rc -eq 1 ] && grep -q \"tiers.cpu 100.00 TiB is more than this machine's RAM\" big.err" \
          "tiers.cpu=100TiB: $(cat big.err)"
    "$zinc" plan "$src/examples/tiny.json" --set tiers.cpu=100TiB > /dev/null 2> bigplan.err
    rc=$?
    check "[ $rc -eq 0 ] && grep -q 'planning for another one' bigplan.err" \
          "zinc plan with tiers.cpu=100TiB: $(cat bigplan.err)"
    "$zinc" train --set 'tiers.nvme=[{"path": "s1", "size": "60TiB"}, {"path": "s2", "size": "30TiB"}]' \
        --steps 1 > /dev/null 2> bignv.err
    rc=$?
    check "[ $rc -eq 1 ] && grep -q 'tiers.nvme asks 90.00 TiB on the file system of s1 and the other paths on it' bignv.err" \
          "tiers.nvme 60+30 TiB on one file system: $(cat bignv.err)"
    check "[ ! -e s1 ] && [ ! -e s2 ] && [ ! -e zinc-swap ]" "a refused run created swap space"
    # after the run, the cost model's measurements (the link, the schedule
    # probe, the layer probe; a fresh cache makes it measure them all) stay
    # within the run's own GPU tier: every device arena the run's process
    # makes, its own 19.91 MiB and the measurements', is at most 20 MiB
    # (the layer probe asked 1 GiB and more before; on an H200 a 7B run's
    # probe held 20.7 GiB beside the run's 5.4)
    ZINC_CACHE_DIR="$work/fresh-cache" ZINC_LOG=debug "$zinc" train --steps 2 \
        --set 'tiers.gpu="20MiB"' > probe.out 2> probe.err
    rc=$?
    big=$(grep -oE 'arena [0-9.]+ [KMG]iB' probe.err | awk '{ v = $2 * ($3 == "GiB" ? 1024 : $3 == "KiB" ? 1 / 1024 : 1); if (v > 20) print }')
    check "[ $rc -eq 0 ] && grep -q '^predicted step time' probe.out && [ -z \"\$big\" ] &&
           [ \$(grep -c 'arena' probe.err) -ge 4 ]" \
          "tiers.gpu=20MiB: the measurements after the run: rc $rc, arenas over 20 MiB: $big $(grep -E 'error|warning' probe.err)"
    # pinned-RAM checkpoints: planned in the cpu column (the device keeps a
    # ring of three), and the run trains with them
    "$zinc" plan "$src/examples/tiny.json" --set activation_checkpointing.cpu_checkpointing=true \
        --detail > cpuck.out 2> cpuck.err
    rc=$?
    check "[ $rc -eq 0 ] && grep -qE '^activations \(ckpt\) +- +[0-9.]+ [KMG]iB' cpuck.out &&
           grep -qE '^activation ckpt ring +gpu .* 3 ' cpuck.out" \
          "cpu_checkpointing=true plan: $(grep -E 'activation|error' cpuck.out cpuck.err)"
    "$zinc" train "$src/examples/tiny.json" --set activation_checkpointing.cpu_checkpointing=true \
        --steps 3 > cpuck.out 2> cpuck.err
    rc=$?
    "$zinc" train "$src/examples/tiny.json" --steps 3 > gpuck.out 2> gpuck.err
    l1=$(grep -oE 'step +3/3 +loss +[0-9.]+' cpuck.out)
    l2=$(grep -oE 'step +3/3 +loss +[0-9.]+' gpuck.out)
    check "[ $rc -eq 0 ] && [ -n '$l1' ] && [ '$l1' = '$l2' ]" \
          "cpu_checkpointing=true train: rc $rc, '$l1' vs '$l2' $(tail -3 cpuck.err)"
    # two auto-sized paths on one file system: its free space counted once
    one=$("$zinc" plan "$src/examples/tiny.json" --set 'tiers.nvme=[{"path": "p1"}]' | grep '^budget')
    two=$("$zinc" plan "$src/examples/tiny.json" --set 'tiers.nvme=[{"path": "p1"}, {"path": "p2"}]' | grep '^budget')
    # (the free space may move a little between the two plans: not 2x)
    check "echo '$one $two' | awk '{ exit !(\$6 > 0 && \$13 < 1.5 * \$6 && \$7 == \$14) }'" \
          "two paths on one file system: '$one' vs '$two'"

    "$zinc" train --steps 3 --set train.log_every=1 --json-log log.jsonl --trace trace.json > out.txt 2> err.txt
    rc=$?
    check "[ $rc -eq 0 ]" "zinc train --steps 3 exited $rc: $(cat err.txt)"
    check "[ \$(wc -l < log.jsonl) -eq 3 ]" "expected 3 JSON lines"
    check "grep -q '\"loss\"' log.jsonl" "JSON log has no loss"
    check "grep -q 'thread_name' trace.json && grep -q 'nvme write' trace.json" "trace lacks tracks"
    check "grep -q 'high-water' out.txt && grep -q 'step time / busiest' out.txt" "no report"
    check "grep -q 'step     3/3' out.txt" "no progress line for step 3"
    # the setup writes the master (11.70 MiB) and leaves Adam's zero m and v
    # unwritten (3 x 11.70 = the 35.09 MiB a step writes)
    "$zinc" train --steps 0 > s0.out 2>&1
    check "grep -q 'setup wrote 11.70 MiB to nvme' s0.out" "setup writes: $(grep 'no steps' s0.out)"
    # evaluation on a held-out file: every train.eval_every steps and at the
    # end, in the step's JSON line, and the summary; a missing file is named
    python3 -c '
import random, struct
r = random.Random(7); n = 4000
ids = [r.randrange(320) for _ in range(n)]
open("eval.tok", "wb").write(b"ZNTOKENS" + struct.pack("<IIQII", 1, 2, n, 320, 0) + struct.pack("<%dH" % n, *ids))'
    "$zinc" train --steps 4 --set data.eval_path=\"eval.tok\" --set train.eval_every=2 \
        --json-log ev.jsonl > ev.out 2> ev.err
    rc=$?
    check "[ $rc -eq 0 ]" "training with data.eval_path: $(cat ev.err)"
    check "[ \$(grep -c '^eval  *[0-9]' ev.out) -eq 2 ] && grep -q '^eval loss .*perplexity' ev.out" \
          "eval lines: $(grep eval ev.out)"
    check "[ \$(grep -c eval_loss ev.jsonl) -eq 2 ] && grep '\"step\": 4' ev.jsonl | grep -q eval_ppl" \
          "eval in the JSON log: $(cat ev.jsonl)"
    "$zinc" train --steps 1 --set data.eval_path=\"nope.tok\" > /dev/null 2> nope.err
    rc=$?
    check "[ $rc -eq 1 ] && grep -q 'data.eval_path.*nope.tok' nope.err" "missing eval file: $(cat nope.err)"
    # packing: a version 2 file of documents from 3 to 90 tokens trains
    # packed (the default) and padded, which differ; a non-boolean is named
    python3 -c '
import random, struct
r = random.Random(9); ids = []; ends = []
while len(ids) < 20000:
    ids += [r.randrange(320) for _ in range(r.randrange(3, 91))]; ends.append(len(ids))
n = len(ids)
open("docs.tok", "wb").write(b"ZNTOKENS" + struct.pack("<IIQII", 2, 2, n, 320, 2) +
    struct.pack("<%dH" % n, *ids) + struct.pack("<Q", len(ends)) + struct.pack("<%dQ" % len(ends), *ends))'
    "$zinc" train --steps 2 --set data.path=\"docs.tok\" --json-log pk.jsonl > pk.out 2> pk.err
    rc=$?
    check "[ $rc -eq 0 ]" "packed training: $(cat pk.err)"
    "$zinc" train --steps 2 --set data.path=\"docs.tok\" --set data.packing=false \
        --json-log pad.jsonl > pad.out 2> pad.err
    rc=$?
    check "[ $rc -eq 0 ]" "padded training: $(cat pad.err)"
    check "[ -s pk.jsonl ] && [ -s pad.jsonl ] && [ \"\$(grep -o 'loss_hex[^,]*' pk.jsonl)\" != \"\$(grep -o 'loss_hex[^,]*' pad.jsonl)\" ]" \
          "packed and padded runs gave the same losses"
    # the HF Trainer's names: epochs over the token file's windows, and
    # save_steps / save_total_limit / output_dir / warmup_ratio for zinc's own
    "$zinc" train --print-default | python3 -c '
import json, sys; c = json.load(sys.stdin); del c["train"]["steps"]; json.dump(c, open("nosteps.json", "w"))'
    "$zinc" train nosteps.json --data docs.tok --set train.num_train_epochs=0.25 --set train.warmup_ratio=0.25 \
        --set train.output_dir=\"ep\" --set train.save_steps=3 --set train.save_total_limit=1 \
        --json-log ep.jsonl > ep.out 2> ep.err
    rc=$?
    spe=$(sed -n 's/.*epochs *0.25 x \([0-9]*\) steps per epoch.*/\1/p' ep.out)
    check "[ $rc -eq 0 ] && [ -n '$spe' ] && [ \$(wc -l < ep.jsonl) -eq \$(( (${spe:-0} + 3) / 4 )) ]" \
          "0.25 epochs of ${spe:-?} steps: exit $rc, $(wc -l < ep.jsonl 2>/dev/null) steps ($(tail -1 ep.err))"
    check "[ \$(ls ep | grep -c step-) -eq 1 ]" "save_total_limit 1 kept $(ls ep | grep -c step-) checkpoints"
    "$zinc" train nosteps.json --steps 3 --data docs.tok --set train.num_train_epochs=2 > epw.out 2>&1
    check "grep -q 'train.steps 3 is given and wins' epw.out && grep -q 'trained 3 steps' epw.out" \
          "train.steps beside num_train_epochs: $(grep -E 'note|trained' epw.out)"
    # DeepSpeed's tensorboard section: event files under output_path/job_name
    # with its scalars at samples seen. Read back here by an independent
    # reader of the format (TFRecord framing with masked crc32c, the Event
    # protobuf); TensorBoard 2.21's own EventAccumulator read the same
    # files when this was written (issue 34's note)
    "$zinc" train --steps 3 --set tensorboard.enabled=true --set tensorboard.output_path=\"tb\" \
        --set tensorboard.job_name=\"job\" > tb.out 2>&1
    check "[ $? -eq 0 ]" "tensorboard run: $(tail -2 tb.out)"
    python3 - tb/job > tbread.out 2>&1 <<'PY'
import glob, struct, sys
T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    T.append(c)
def crc(b):
    c = 0xFFFFFFFF
    for x in b:
        c = T[(c ^ x) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
def fields(b):
    i, out = 0, []
    while i < len(b):
        k, s = 0, 0
        while True:
            x = b[i]; i += 1; k |= (x & 0x7F) << s; s += 7
            if x < 0x80: break
        f, w = k >> 3, k & 7
        if w == 0:
            v, s = 0, 0
            while True:
                x = b[i]; i += 1; v |= (x & 0x7F) << s; s += 7
                if x < 0x80: break
        elif w == 1: v = b[i:i + 8]; i += 8
        elif w == 5: v = b[i:i + 4]; i += 4
        elif w == 2:
            n, s = 0, 0
            while True:
                x = b[i]; i += 1; n |= (x & 0x7F) << s; s += 7
                if x < 0x80: break
            v = b[i:i + n]; i += n
        out.append((f, w, v))
    return out
files = glob.glob(sys.argv[1] + "/events.out.tfevents.*")
assert len(files) == 1, files
b = open(files[0], "rb").read()
o, scalars, version = 0, {}, None
while o < len(b):
    n, = struct.unpack("<Q", b[o:o + 8])
    assert struct.unpack("<I", b[o + 8:o + 12])[0] == crc(b[o:o + 8]), "length crc"
    rec = b[o + 12:o + 12 + n]
    assert struct.unpack("<I", b[o + 12 + n:o + 16 + n])[0] == crc(rec), "record crc"
    o += 16 + n
    ev = fields(rec)
    step = [v for f, w, v in ev if f == 2][0] if any(f == 2 for f, w, v in ev) else 0
    for f, w, v in ev:
        if f == 3: version = v.decode()
        if f == 5:
            for f2, w2, val in fields(v):
                d = dict((g, x) for g, _, x in fields(val))
                scalars.setdefault(d[1].decode(), []).append((step, struct.unpack("<f", d[2])[0]))
assert version == "brain.Event:2", version
loss = scalars["Train/Samples/train_loss"]
assert [s for s, _ in loss] == [4, 8, 12] and all(4 < v < 7 for _, v in loss), loss
assert len(scalars["Train/Samples/lr"]) == 3 and len(scalars["Train/Samples/grad_norm"]) == 3
print("tensorboard events: ok", sorted(scalars))
PY
    check "[ $? -eq 0 ]" "tensorboard event file: $(tail -3 tbread.out)"
    # an NVMe path on a read-only file system: plan refuses it with the
    # message train gives (root only: a read-only tmpfs is mounted for it)
    mkdir -p rofs
    if mount -t tmpfs -o ro,size=1m tmpfs rofs 2>/dev/null; then
        "$zinc" plan "$src/examples/tiny.json" --set 'tiers.nvme="rofs"' > ro-plan.out 2>&1
        rp=$?
        "$zinc" train --steps 1 --set 'tiers.nvme="rofs"' > ro-train.out 2>&1
        rt=$?
        umount rofs
        check "[ $rp -eq 1 ] && [ $rt -eq 1 ] && grep -q 'read-only file system' ro-plan.out && grep -q 'read-only file system' ro-train.out" \
              "read-only nvme path: plan $rp ($(tail -1 ro-plan.out)), train $rt ($(tail -1 ro-train.out))"
    else
        echo "note: read-only nvme path not checked (mounting a tmpfs needs root)"
    fi
    # a swap folder that does not exist: plan and train refuse it alike,
    # naming the setting, the path and both ways out, and create nothing
    nocreate=(--set tiers.create_nvme_path=false --set 'tiers.nvme="no/such/swap"')
    "$zinc" plan "$src/examples/tiny.json" "${nocreate[@]}" > miss-plan.out 2> miss-plan.err
    rp=$?
    "$zinc" train --steps 1 "${nocreate[@]}" > miss-train.out 2> miss-train.err
    rt=$?
    msg=$(grep -o 'tiers.nvme\[0\].path no/such/swap (in .*' miss-plan.err)
    check "[ $rp -eq 1 ] && [ $rt -eq 1 ] && [ -n \"\$msg\" ] && grep -qF \"\$msg\" miss-train.err" \
          "missing swap folder: plan $rp ($(tail -1 miss-plan.err)), train $rt ($(tail -1 miss-train.err))"
    check "grep -qF 'no/such/swap (in $work) does not exist' miss-train.err &&
           grep -qF 'mkdir -p no/such/swap' miss-train.err &&
           grep -qF -- '--set tiers.create_nvme_path=true' miss-train.err" \
          "the refusal says where and how to allow it: $(tail -1 miss-train.err)"
    check "[ ! -e no ]" "a refused run created its swap folder"
    # ... naming the offload section's key when tiers.nvme is not given
    python3 - "$src/examples/tiny.json" > offl.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
del c["tiers"]["nvme"]
c["tiers"]["create_nvme_path"] = False
c["zero_optimization"]["offload_optimizer"]["nvme_path"] = "no/offload"
print(json.dumps(c))
PY
    "$zinc" plan offl.json > offl.out 2>&1
    check "[ $? -eq 1 ] && grep -qF 'zero_optimization.offload_optimizer.nvme_path no/offload (in $work) does not exist' offl.out" \
          "missing offload nvme_path: $(tail -1 offl.out)"
    # tiers.create_nvme_path: the plan says the run creates it, the run does
    # (0700, with its parents), and leaves it empty at its end
    "$zinc" plan "$src/examples/tiny.json" --set 'tiers.nvme="made/here/swap"' > made-plan.out 2>&1
    check "[ $? -eq 0 ] && grep -q '^  swap         made/here/swap (missing: the run creates it' made-plan.out && [ ! -e made ]" \
          "plan of a swap folder to create: $(grep -E 'swap|error' made-plan.out)"
    "$zinc" train --steps 2 --set tiers.create_nvme_path=true --set 'tiers.nvme="made/here/swap"' \
        > made.out 2>&1
    rc=$?
    check "[ $rc -eq 0 ] && [ -d made/here/swap ] && [ \"\$(stat -c %a made/here/swap)\" = 700 ] &&
           [ -z \"\$(ls -A made/here/swap)\" ]" \
          "tiers.create_nvme_path=true: exit $rc, $(ls -lA made/here 2>&1) $(tail -1 made.out)"
    # a swap folder through a symbolic link: used where it leads, and the plan
    # and the run header say where; a link to nothing is refused even when
    # the run may create folders
    mkdir -p realswap/sub && ln -s realswap swaplink && ln -s nowhere dangling
    "$zinc" plan "$src/examples/tiny.json" --set 'tiers.nvme="swaplink"' > link-plan.out 2>&1
    check "grep -qF '  swap         swaplink -> $work/realswap (a symbolic link)' link-plan.out" \
          "plan through a symlink: $(grep -E 'swap|error' link-plan.out)"
    "$zinc" plan "$src/examples/tiny.json" --set 'tiers.nvme="swaplink/sub"' > link2-plan.out 2>&1
    check "grep -qF '  swap         swaplink/sub ($work/realswap/sub, through a symbolic link)' link2-plan.out" \
          "plan through a symlinked parent: $(grep -E 'swap|error' link2-plan.out)"
    "$zinc" train --steps 2 --set 'tiers.nvme="swaplink/sub"' > link.out 2>&1
    rc=$?
    check "[ $rc -eq 0 ] && grep -qF '  swap     swaplink/sub ($work/realswap/sub, through a symbolic link)' link.out &&
           [ -z \"\$(ls -A realswap/sub)\" ]" \
          "train through a symlinked parent: exit $rc, $(grep -E 'swap|error' link.out)"
    "$zinc" plan "$src/examples/tiny.json" --set 'tiers.nvme="dangling"' > dang.out 2>&1
    check "[ $? -eq 1 ] && grep -qF 'tiers.nvme[0].path dangling (in $work) is a symbolic link to nowhere, which does not exist' dang.out && [ ! -e nowhere ]" \
          "a symlink to nothing: $(tail -1 dang.out)"
    # DeepSpeed's csv_monitor: its file layout, one CSV per event
    "$zinc" train --steps 3 --set csv_monitor.enabled=true --set csv_monitor.output_path=\"cm\" \
        > cm.out 2>&1
    check "[ $? -eq 0 ] && [ \"\$(head -1 cm/DeepSpeedJobName/Train_Samples_train_loss.csv | tr -d '\\r')\" = step,train_loss ] && [ \$(wc -l < cm/DeepSpeedJobName/Train_Samples_lr.csv) -eq 4 ]" \
          "csv_monitor files: $(ls cm/DeepSpeedJobName 2>&1 | tr '\n' ' ')"
    "$zinc" train --steps 1 --set data.packing=1 > /dev/null 2> pkbad.err
    rc=$?
    check "[ $rc -ne 0 ] && grep -q 'data.packing' pkbad.err" "data.packing=1: $(cat pkbad.err)"
    # SSD wear: the run measures what the plan said it writes per step
    wear=$(grep -o 'nvme wear: .* written per step (the plan: [^)]*)' out.txt)
    check "echo '$wear' | sed 's/nvme wear: \(.*\) written per step (the plan: \(.*\))/\1 \2/' | awk '{ exit !(\$1 == \$3 && \$2 == \$4) }'" \
          "measured nvme writes per step differ from the plan's: '$wear'"
    "$zinc" plan "$src/examples/tiny.json" > plan.out 2>&1
    check "grep -q 'nvme writes .* per optimizer step' plan.out" "zinc plan prints no nvme writes per step"
    check "[ -z \"\$(ls zinc-swap 2>/dev/null)\" ]" "swap files left behind"
else
    "$zinc" train --json-log log.jsonl > out.txt 2> err.txt
    rc=$?
    check "[ $rc -eq 0 ]" "zinc train exited $rc: $(cat err.txt)"
    last=$(tail -1 log.jsonl | sed 's/.*"loss": \([0-9.]*\).*/\1/')
    first=$(head -1 log.jsonl | sed 's/.*"loss": \([0-9.]*\).*/\1/')
    echo "loss $first -> $last"
    check "awk -v l=$last 'BEGIN { exit !(l < 4.5) }'" "loss after 60 steps $last, expected < 4.5"
fi
[ $fail -eq 0 ] && echo ok
exit $fail
