# shellcheck shell=bash
# Sourced by groups.sh and mps.sh: how long a step of a script bounded by
# a deadline may run, and how its end is reported; and by owed-x2.sh and
# owed-x4.sh: their argument and the set-up their steps share (owed_step,
# owed_begin, below).

# step_limit DEADLINE CAP MIN_STEP NAME SUMMARY: prints the seconds the
# step NAME may run, min(CAP, DEADLINE - now - 7) (7 s for the test's own
# timeout, 5 s before, and the KILL after TERM); with less than MIN_STEP
# left it appends "== NAME: skipped" to SUMMARY and returns 1.
step_limit() {
  local deadline=$1 cap=$2 min=$3 name=$4 summary=$5 now limit
  now=$(date +%s)
  limit=$(( deadline - now - 7 ))
  if [ "$limit" -lt "$min" ]; then
    echo "== $name: skipped: $(( deadline - now ))s left before the deadline" >>"$summary"
    return 1
  fi
  [ "$limit" -gt "$cap" ] && limit=$cap
  echo "$limit"
}

# timeout_note RC LIMIT LOG: " (timed out: its limit was LIMITs)" when
# the step was killed by timeout or Go's -test.timeout fired, else "".
timeout_note() {
  if [ "$1" -eq 124 ] || [ "$1" -eq 137 ] || grep -q '^panic: test timed out' "$3"; then
    echo " (timed out: its limit was ${2}s)"
  fi
}

# Sourced by owed-x2.sh and owed-x4.sh too, from the repository root:
# owed_begin SCRIPT STEP empties $R (/tmp/owed-STEP), where the step puts
# its files, tarred into $OUT/STEP.tgz at exit, and sets status, the
# step's exit status, which part RC WHAT fails when RC is not 0;
# need_files FILES... stops the script (exit 2) naming a missing carry.
owed_begin() {
  OWED_SCRIPT=$1 STEP=$2
  OUT=${OUT:-.gpu/out}
  R=/tmp/owed-$STEP
  rm -rf "$R"
  mkdir -p "$R" "$OUT"
  trap 'tar czf "$OUT/$STEP.tgz" -C "$R" --exclude=cache . 2>/dev/null' EXIT
  status=0
}
part() { echo "$2: exit $1"; [ "$1" -eq 0 ] || status=1; }
need_files() {
  local f
  for f in "$@"; do
    [ -e "$f" ] || { echo "$OWED_SCRIPT: $STEP needs $f (carry it; see list)" >&2; exit 2; }
  done
}

# owed_step SCRIPT ARGS...: SCRIPT's step, from the table in its header
# comment (the "#   step" line and the rows under it, up to a bare "#";
# a row's first word is a step): `list` prints the table and exits 0; no
# argument, more than one, or a step the table lacks prints the header
# (usage) and exits 2. Sets STEP. The table is the one list of steps.
owed_step() {
  local script=$1 table
  shift
  table=$(awk '/^#   step /{on=1} on && /^#$/{exit} on' "$script" | sed 's/^# *//')
  if [ $# -eq 1 ] && [ "$1" = list ]; then
    echo "$table"
    exit 0
  fi
  if [ $# -ne 1 ] || ! sed 1d <<<"$table" | awk '{print $1}' | grep -qxF -- "$1"; then
    [ $# -eq 1 ] && echo "$(basename "$script"): unknown step $1" >&2
    awk 'NR == 1 {next} /^#/ {print; next} {exit}' "$script" | sed 's/^# \{0,1\}//' >&2
    exit 2
  fi
  STEP=$1
}
