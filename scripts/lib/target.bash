# The benchmarks' verdict lines, one per target (sourced by scripts/bench-*):
#
#   target NAME FIGURE OP BAR [UNIT]
#
# prints `target NAME: FIGURE[UNIT] (bar OP BAR[UNIT]): ok|MISSED`, OP being
# <= or >=, and counts the misses in $targets_missed.  A figure that is not
# a number (nothing was measured) is MISSED.  A benchmark fails only when
# something cannot run, never on a MISSED line: CI runs the --smoke modes,
# whose tiny sizes say nothing of speed.
targets_missed=0
target() {
  local name=$1 fig=$2 op=$3 bar=$4 unit=${5:-} verdict=MISSED
  case "$op" in '<='|'>=') ;; *) echo "target: bad operator '$op'" >&2; return 2 ;; esac
  if [[ "$fig" =~ ^-?[0-9]+\.?[0-9]*([eE][-+]?[0-9]+)?$ ]] &&
     awk -v f="$fig" -v b="$bar" -v op="$op" 'BEGIN { exit !(op == "<=" ? f <= b : f >= b) }'; then
    verdict=ok
  else
    targets_missed=$((targets_missed + 1))
  fi
  echo "target $name: $fig$unit (bar $op $bar$unit): $verdict"
}
