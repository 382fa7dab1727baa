#!/usr/bin/env bash
# Runs the integration tests of `trust`, `gossamer`, `rangelock` and `objects` (and gsm's launcher
# tests, and the C API's contract tests; the rack-level ones also over UCX) over and over
# on a loaded machine, to find the failures that show once in a hundred runs.
#
#   scripts/stress.sh                    # 30 minutes, one busy loop per core beside the tests
#   scripts/stress.sh --minutes 0.5      # the short run that scripts/test.sh makes
#   scripts/stress.sh --runs 300 --only cross_runtime --load 2
#
# Each selected test binary runs under a time limit, the binaries taking equal shares of the
# time (or each --runs times); a run that fails or overruns has its output kept (the path is
# printed) and the others go on. With --minutes, a run still going 15 s after the last minute
# ends is stopped and counted as cut, neither passed nor failed (a short run would otherwise
# last as long as the slowest binary it picked). At the end
# one line per binary gives its good and failed runs, then the closing `stress: N runs ok, M
# failed` line; the exit status is non-zero if anything failed. (Runs, not tests: the test
# command's total counts each test once, from its own runner's lines.)
#
# Why load: the tests' order and timing promises must hold by design, not because the machine
# happened to be idle. A busy loop per core takes the CPU from workers and ranks at random
# moments, which is what turns a latent race into a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=30 runs=0 load=$(nproc) only="" release=0
usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  echo "options: --minutes M | --runs N, --load BUSY_LOOPS, --only SUBSTRING, --release" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) minutes=${2:?}; shift 2 ;;
    --runs) runs=${2:?}; shift 2 ;;
    --load) load=${2:?}; shift 2 ;;
    --only) only=${2:?}; shift 2 ;;
    --release) release=1; shift ;;
    *) usage ;;
  esac
done
[[ $minutes =~ ^[0-9]+(\.[0-9]+)?$ && $runs =~ ^[0-9]+$ && $load =~ ^[0-9]+$ ]] || usage
seconds=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')

profile=()
[ $release = 1 ] && profile=(--release)

# The build `scripts/test.sh` makes, by the same command (the whole workspace with every
# feature: a narrower selection unifies dependencies' features differently and compiles
# gossamer and a dozen crates again), so nothing is compiled again. Of it, the integration
# tests of these packages (crash_ledger is left out: it is a long run of its own, and
# `scripts/test.sh` runs it), and the rack-level ones again with every link on UCX, over its
# TCP and its shared memory (named `…@ucx`).
built=$(cargo test "${profile[@]}" --workspace --all-features --tests --no-run --message-format=json 2>/dev/null |
  python3 scripts/test-binaries.py)
binaries=$(awk '$3 == "test" && $2 != "crash_ledger" &&
    ($1 ~ /^(trust|gossamer|rangelock|objects|gsm)$/ || ($1 == "trust-c" && $2 == "api") ||
     ($1 == "kvs" && $2 == "rack")) { print $1 "/" $2, $4 }
  $3 == "test" && $1 ~ /^(gossamer|objects|rangelock)$/ && $2 ~ /^(rack|named|regions|hosts)$/ {
    print $1 "/" $2 "@ucx", $4 }' <<<"$built" | sort -u | shuf)
[ -n "$binaries" ] || { echo "stress: no test binaries were built" >&2; exit 1; }
if [ -n "$only" ]; then
  binaries=$(grep -F -- "$only" <<<"$binaries" || true)
  [ -n "$binaries" ] || { echo "stress: no test binary matches --only $only" >&2; exit 2; }
fi

keep=$(mktemp -d -t gossamer-stress.XXXXXX)
loaders=()
cleanup() {
  [ ${#loaders[@]} -eq 0 ] || kill "${loaders[@]}" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
for _ in $(seq 1 "$load"); do
  (while :; do :; done) &
  loaders+=($!)
done

declare -A passed failed spent
while read -r name _; do passed[$name]=0 failed[$name]=0 spent[$name]=0; done <<<"$binaries"
cut=0
# One run of binary `$1` at path `$2`, counted and timed; `$3`, if given, is a shorter time
# limit in seconds, which the end of the run's minutes sets.
run_once() {
  local name=$1 bin=$2 stop_at=${3:-600} started=${EPOCHREALTIME/./} status=0
  local out="$keep/${name//\//.}.$((passed[$name] + failed[$name] + 1)).log" on=()
  [[ $name == *@ucx ]] && on=(env "GSM_TEST_TRANSPORTS=ucx/tcp ucx/sm")
  # Ten minutes is far beyond any of these binaries on a loaded machine: an overrun is a hang.
  local limit=$((stop_at < 600 ? stop_at : 600))
  timeout --kill-after=10s "$limit" "${on[@]}" "$bin" </dev/null >"$out" 2>&1 || status=$?
  spent[$name]=$((spent[$name] + ${EPOCHREALTIME/./} - started)) # microseconds
  if [ $status -eq 124 ] && [ "$limit" -lt 600 ]; then
    cut=$((cut + 1))
    echo "stress: $name cut at the end of the run's time"
    rm -f "$out"
  elif [ $status -eq 0 ]; then
    passed[$name]=$((passed[$name] + 1))
    rm -f "$out"
  else
    failed[$name]=$((failed[$name] + 1))
    echo "stress: $name FAILED (status $status$([ $status -eq 124 ] && echo ': timed out')), output in $out"
    grep -E 'FAILED|panicked|error' "$out" | head -n 5 | sed 's/^/    /' || true
  fi
}

echo "stress: $(wc -l <<<"$binaries") test binaries, $load busy loops," \
  "$([ "$runs" -gt 0 ] && echo "$runs runs of each" || echo "$minutes minutes"); failures kept in $keep"
if [ "$runs" -gt 0 ]; then
  for _ in $(seq 1 "$runs"); do
    while read -r name bin; do run_once "$name" "$bin"; done <<<"$binaries"
  done
else
  # Each binary gets an equal share of the time: next is always the one that has had the least,
  # so a test binary of a tenth of a second runs hundreds of times beside one of thirty seconds.
  # Ties (at first, all) go in the shuffled order, so that a short run covers other binaries
  # each time rather than the same first few.
  deadline=$((SECONDS + seconds))
  while [ $SECONDS -lt $deadline ]; do
    next=$(while read -r name bin; do echo "${spent[$name]} $((passed[$name] + failed[$name])) $name $bin"; done \
      <<<"$binaries" | sort -s -n -k1,1 -k2,2 | head -n 1)
    read -r _ _ name bin <<<"$next"
    run_once "$name" "$bin" $((deadline + 15 - SECONDS))
  done
fi

total_passed=0 total_failed=0
while read -r name _; do
  printf '  %-28s %5d runs ok, %d failed (%d s)\n' "$name" "${passed[$name]}" "${failed[$name]}" $((spent[$name] / 1000000))
  total_passed=$((total_passed + passed[$name])) total_failed=$((total_failed + failed[$name]))
done <<<"$binaries"
echo "stress: took $((SECONDS / 60)) min"
echo "stress: $total_passed runs ok, $total_failed failed$([ $cut -eq 0 ] || echo ", $cut cut at the end")"
[ "$total_failed" -eq 0 ] && rmdir "$keep" 2>/dev/null
[ "$total_failed" -eq 0 ]
