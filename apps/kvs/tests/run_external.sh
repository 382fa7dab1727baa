#!/usr/bin/env bash
# Runs kvs against real clients and against memcached, on loopback only:
#   1. clients.py (pymemcache, libmemcached-tools) against kvs,
#   2. clients.py's eviction test against kvs -m 8,
#   3. differential.py: the same random sequences against memcached and kvs.
#
# Needs: Debian packages memcached and libmemcached-tools, Python package pymemcache
#   apt-get install -y memcached libmemcached-tools && pip install pymemcache
# Without them it says what is missing and exits 0, unless KVS_REQUIRE_EXTERNAL=1.
#
# Usage: apps/kvs/tests/run_external.sh [path/to/kvs]   (default: cargo build, debug)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"

missing=()
command -v memcached >/dev/null || missing+=("memcached (apt-get install memcached)")
python3 -c 'import pymemcache' 2>/dev/null || missing+=("pymemcache (pip install pymemcache)")
command -v memcslap >/dev/null || missing+=("libmemcached-tools (apt-get install libmemcached-tools)")
if ((${#missing[@]})); then
    echo "run_external.sh: skipped, missing: ${missing[*]}"
    [[ "${KVS_REQUIRE_EXTERNAL:-0}" == 1 ]] && exit 1
    exit 0
fi

kvs="${1:-}"
if [[ -z "$kvs" ]]; then
    (cd "$root" && cargo build -q -p kvs)
    kvs="${CARGO_TARGET_DIR:-$root/target}/debug/kvs"
fi

# Free loopback ports, chosen by the kernel.
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
p_kvs=$(port); p_small=$(port)

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

"$kvs" -l 127.0.0.1 -p "$p_kvs" -t 2 & pids+=($!)
"$kvs" -l 127.0.0.1 -p "$p_small" -t 2 -m 8 & pids+=($!)
user=(); [[ $(id -u) == 0 ]] && user=(-u root)

wait_port() {
    for _ in $(seq 100); do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),timeout=0.2)" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on port $1" >&2
    return 1
}
wait_port "$p_kvs"; wait_port "$p_small"

status=0
echo "== clients.py against kvs"
python3 "$here/clients.py" "127.0.0.1:$p_kvs" || status=1
echo "== eviction against kvs -m 8"
python3 "$here/clients.py" --only eviction,stats_count "127.0.0.1:$p_small" || status=1
echo "== differential: memcached vs kvs"
# Each sequence runs against a fresh memcached and a fresh kvs: what one seed leaves behind
# (an incr'd counter's bytes, say) may legitimately differ. The reference memcached runs with
# one worker thread and without its LRU crawler and maintainer: whether incr rewrites a counter
# in place (padding it with spaces) depends on the references those threads hold at that
# moment, so with them memcached's own answers near u64::MAX varied from run to run (8 of 50
# runs of seeds 1 and 3 mismatched; 0 of 75 runs of seeds 1-3 without them). A seed that still
# mismatches gets one more fresh run; a kvs bug fails every run of the same sequence.
differential() {
    local seed=$1 p_a p_b pair
    p_a=$(port); p_b=$(port)
    memcached "${user[@]}" -l 127.0.0.1 -p "$p_a" -U 0 -m 256 -t 1 \
        -o no_lru_crawler,no_lru_maintainer & pair=($!)
    "$kvs" -l 127.0.0.1 -p "$p_b" -t 2 & pair+=($!)
    pids+=("${pair[@]}")
    wait_port "$p_a"; wait_port "$p_b"
    local ok=0
    python3 "$here/differential.py" --a "127.0.0.1:$p_a" --b "127.0.0.1:$p_b" --seed "$seed" --rounds 1000 || ok=1
    kill "${pair[@]}" 2>/dev/null || true
    wait "${pair[@]}" 2>/dev/null || true
    return $ok
}
for seed in 1 2 3; do
    if ! differential "$seed"; then
        echo "seed $seed mismatched; running it once more against fresh servers"
        differential "$seed" || status=1
    fi
done
exit $status
