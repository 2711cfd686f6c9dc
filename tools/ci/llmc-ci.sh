#!/usr/bin/env bash
# llmc CI stage: compile a model for a target x dtype matrix and check every runnable cell against
# eager PyTorch, leaving JUnit + JSON reports for the CI system to publish.
#
#   tools/ci/llmc-ci.sh MODEL.pt2 [--targets "cpu hip"] [--dtypes "f32 bf16"] [--out DIR]
#                       [--reports DIR] [--bisect] [--diff-arg ARG]...
#
# Options (each has an environment default, so a CI file can set them once):
#   --targets LIST   targets, space- or comma-separated       LLMC_CI_TARGETS  (default: cpu)
#   --dtypes LIST    dtypes, space- or comma-separated        LLMC_CI_DTYPES   (default: f32)
#   --out DIR        compiled artifacts, one folder per cell  LLMC_CI_OUT      (default: out/ci)
#   --reports DIR    JUnit/JSON reports and summary.json      LLMC_CI_REPORTS  (default: reports)
#   --bisect         on a failing cell, run `llmc bisect` and keep its one-op reproducer
#                    (reports/CELL.bisect.json, OUT/CELL.bisect/)          LLMC_CI_BISECT=1
#   --diff-arg ARG   extra argument for every `llmc diff` (repeatable), e.g. --diff-arg=--seed=3
#   The llmc command is $LLMC (default: llmc); $LLMC_CI_PYTHON (default: python3) parses JSON and
#   writes the JUnit files llmc diff does not, so it must be the python llmc is installed in.
#
# Per cell (CELL = MODELSTEM-TARGET-DTYPE), as `llmc targets` describes the target:
#   runs here (cpu; vulkan    llmc compile, then llmc diff MODEL OUT.vmfb --junit reports/CELL.xml
#     where a Vulkan driver     --json reports/CELL.json
#     such as lavapipe is)
#   compile only (hip, xpu,   llmc compile; reports/CELL.xml records the compile and a skipped run
#     cuda; vulkan without
#     a Vulkan driver)
#   planned / not supported   recorded as skipped in reports/CELL.xml
# Logs: reports/CELL.compile.log, reports/CELL.diff.log. Summary: reports/summary.json + stdout.
#
# Exit status: 0 when every cell passed or was skipped; otherwise the highest exit code of a failing
# cell (1 a check failed: output over tolerance; 3 compile or runtime failure); 2 bad usage.

set -u

usage() {
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
die() { echo "llmc-ci: error: $*" >&2; exit 2; }

LLMC=${LLMC:-llmc}
PY=${LLMC_CI_PYTHON:-python3}
targets=${LLMC_CI_TARGETS:-cpu}
dtypes=${LLMC_CI_DTYPES:-f32}
out=${LLMC_CI_OUT:-out/ci}
reports=${LLMC_CI_REPORTS:-reports}
do_bisect=${LLMC_CI_BISECT:-0}
diff_args=()
model=""

while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage ;;
        --targets) [ $# -ge 2 ] || die "--targets needs a value"; targets=$2; shift 2 ;;
        --targets=*) targets=${1#*=}; shift ;;
        --dtypes) [ $# -ge 2 ] || die "--dtypes needs a value"; dtypes=$2; shift 2 ;;
        --dtypes=*) dtypes=${1#*=}; shift ;;
        --out) [ $# -ge 2 ] || die "--out needs a value"; out=$2; shift 2 ;;
        --out=*) out=${1#*=}; shift ;;
        --reports) [ $# -ge 2 ] || die "--reports needs a value"; reports=$2; shift 2 ;;
        --reports=*) reports=${1#*=}; shift ;;
        --bisect) do_bisect=1; shift ;;
        --diff-arg) [ $# -ge 2 ] || die "--diff-arg needs a value"; diff_args+=("$2"); shift 2 ;;
        --diff-arg=*) diff_args+=("${1#*=}"); shift ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) [ -z "$model" ] || die "one MODEL.pt2 only (got '$model' and '$1')"; model=$1; shift ;;
    esac
done

[ -n "$model" ] || die "no model given: tools/ci/llmc-ci.sh MODEL.pt2 [--targets ...] [--dtypes ...]"
[ -e "$model" ] || die "$model: no such file or folder"
command -v "$LLMC" >/dev/null 2>&1 || die "'$LLMC' not found: install llmc (pip install -e .) or set LLMC"
command -v "$PY" >/dev/null 2>&1 || die "'$PY' not found: set LLMC_CI_PYTHON"
"$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llmc.compiler.report") is None)' 2>/dev/null ||
    die "'$PY' cannot import llmc: set LLMC_CI_PYTHON to the python llmc is installed in"
targets=$(echo "$targets" | tr ',' ' ')
dtypes=$(echo "$dtypes" | tr ',' ' ')
[ -n "${targets// /}" ] || die "--targets is empty"
[ -n "${dtypes// /}" ] || die "--dtypes is empty"
mkdir -p "$out" "$reports" || die "cannot create $out or $reports"

stem=$(basename "$model")
[ -d "$model" ] || stem=${stem%.*}  # a checkpoint folder keeps its whole name
targets_json=$("$LLMC" targets --json) || die "'$LLMC targets --json' failed"

# What to do with one cell: "run", "compile" or "skip:<reason>" (from llmc's own target table).
cell_mode() {
    TARGETS_JSON="$targets_json" "$PY" - "$1" "$2" <<'EOF'
import json, os, sys
target, dtype = sys.argv[1], sys.argv[2]
table = json.loads(os.environ["TARGETS_JSON"])


def usable(device):  # a device of this family can be opened here (vulkan needs a Vulkan driver)
    if device == "local":
        return True
    from llmc.runtime.device import usable_devices
    return device in usable_devices()


caps = table.get(target)
if caps is None:
    print(f"unknown:'{target}' is not an llmc target (known: {', '.join(table)})")
elif not caps["implemented"]:
    print(f"skip:target {target} is planned, not implemented in this llmc")
else:
    support = caps["dtypes"].get(dtype)
    if support is None:
        print(f"unknown:'{dtype}' is not an llmc dtype (known: {', '.join(caps['dtypes'])})")
    elif support["state"] != "implemented":
        print(f"skip:{dtype} on {target} is {support['state']} ({support['how']})")
    elif caps["runs_here"] and usable(caps["device"]):
        print("run")
    else:
        print("compile")
EOF
}

# A JUnit file for a cell llmc diff did not report on: one testcase per step, each ok, skipped or
# failed, written by the JUnit writer `llmc diff --junit` uses (compiler/report.py).
# args: file cell target dtype then triples of (name status message)
write_junit() {
    "$PY" -m llmc.compiler.report ci-junit "$@"
}

# llmc's error line from a log, with the first upstream diagnostic after it (iree-compile's
# "error: ..."), for the reports.
error_of() {
    local head diag
    head=$(grep -m 1 '^llmc: \(internal \)\{0,1\}error:' "$1")
    diag=$(sed -n '/^llmc: \(internal \)\{0,1\}error:/,$p' "$1" | sed 1d | grep -m 1 'error:' | sed 's/^.*error: */error: /')
    printf '%s%s' "${head:-$(tail -n 1 "$1")}" "${diag:+ | $diag}"
}

bisect_cell() {
    local cell=$1 target=$2 dtype=$3
    [ "$do_bisect" = 1 ] || return 0
    echo "llmc-ci: $cell: bisecting" >&2
    "$LLMC" bisect "$model" --target "$target" --dtype "$dtype" -o "$out/$cell.bisect" \
        --json "$reports/$cell.bisect.json" >"$reports/$cell.bisect.log" 2>&1
    echo "llmc-ci: $cell: bisect exit $? (report $reports/$cell.bisect.json, reproducer $out/$cell.bisect/)" >&2
}

worst=0
summary=""
printf '%-32s %-9s %s\n' "cell" "status" "details"
for target in $targets; do
    for dtype in $dtypes; do
        cell="$stem-$target-$dtype"
        mode=$(cell_mode "$target" "$dtype") || die "could not read llmc's target table"
        status="" detail="" rc=0
        case "$mode" in
            unknown:*) die "${mode#unknown:}" ;;
            skip:*)
                status=skipped detail=${mode#skip:}
                write_junit "$reports/$cell.xml" "$cell" "$target" "$dtype" compile skipped "$detail" diff skipped "$detail"
                ;;
            run|compile)
                mkdir -p "$out/$cell"
                vmfb="$out/$cell/$stem.vmfb"
                "$LLMC" compile "$model" --target "$target" --dtype "$dtype" -o "$vmfb" --repro-dir "$out/$cell" \
                    >"$reports/$cell.compile.log" 2>&1
                rc=$?
                if [ $rc -ne 0 ]; then
                    status=error detail="compile exit $rc: $(error_of "$reports/$cell.compile.log")"
                    write_junit "$reports/$cell.xml" "$cell" "$target" "$dtype" compile failure "$detail"
                    bisect_cell "$cell" "$target" "$dtype"
                elif [ "$mode" = compile ]; then
                    status=passed detail="compiled (target does not run here)"
                    write_junit "$reports/$cell.xml" "$cell" "$target" "$dtype" compile ok "" diff skipped "$target runs elsewhere: compile only"
                else
                    "$LLMC" diff "$model" "$vmfb" --junit "$reports/$cell.xml" --json "$reports/$cell.json" \
                        ${diff_args[@]+"${diff_args[@]}"} >"$reports/$cell.diff.log" 2>&1
                    rc=$?
                    case $rc in
                        0) status=passed detail=$(grep -E '^(PASS|FAIL)' "$reports/$cell.diff.log" | tail -n 1) ;;
                        1) status=failed detail=$(grep -E '^(PASS|FAIL)' "$reports/$cell.diff.log" | tail -n 1)
                           bisect_cell "$cell" "$target" "$dtype" ;;
                        *) status=error detail="diff exit $rc: $(error_of "$reports/$cell.diff.log")"
                           [ -f "$reports/$cell.xml" ] || write_junit "$reports/$cell.xml" "$cell" "$target" "$dtype" compile ok "" diff failure "$detail" ;;
                    esac
                fi
                ;;
            *) die "unexpected cell mode '$mode'" ;;
        esac
        [ $rc -gt $worst ] && worst=$rc
        printf '%-32s %-9s %s\n' "$cell" "$status" "$detail"
        summary+=$(printf '%s\t%s\t%s\t%s\t%s\t%s' "$cell" "$target" "$dtype" "$status" "$rc" "$detail")$'\n'
    done
done

SUMMARY="$summary" "$PY" - "$reports/summary.json" "$model" "$worst" <<'EOF'
import json, os, sys
path, model, worst = sys.argv[1], sys.argv[2], int(sys.argv[3])
cells = []
for line in os.environ["SUMMARY"].splitlines():
    cell, target, dtype, status, rc, detail = (line.split("\t") + [""] * 6)[:6]
    cells.append({"cell": cell, "target": target, "dtype": dtype, "status": status, "exit_code": int(rc), "detail": detail})
json.dump({"format": "llmc-ci-summary/1", "model": model, "exit_code": worst, "cells": cells}, open(path, "w"), indent=2)
EOF

counts=$(printf '%s' "$summary" | cut -f4 | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $2; sep=", "}')
echo "llmc-ci: $counts; reports in $reports/ (exit $worst)"
exit $worst
