# shellcheck shell=bash
# Sourced by groups.sh and mps.sh: how long a step of a script bounded by
# a deadline may run, and how its end is reported.

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
