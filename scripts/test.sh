#!/usr/bin/env bash
# The project's whole test suite, as CI runs it. Installs what it needs first, then runs the
# cheap checks (format, lints) before the tests, the loom models and the valgrind run.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# Keep a copy of everything printed, to total the tests at the end.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
exec > >(tee "$log") 2>&1

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

step "tools"
missing=()
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
command -v memcslap >/dev/null 2>&1 || missing+=(libmemcached-tools)
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! python3 -c 'import pymemcache' 2>/dev/null; then
  python3 -m pip install --quiet pymemcache 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages pymemcache
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings denied)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo doc (warnings denied)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet

step "tests (debug)"
cargo test --workspace --all-features

step "trust tests (release)"
cargo test -p trust --all-features --release --tests

step "loom models of the channel and park protocols"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p trust --lib --release loom

step "valgrind memcheck on the channel, fiber and shutdown tests"
binaries=$(cargo test -p trust --tests --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("delegation", "fibers", "shutdown"):
        print(m["executable"])')
[ -n "$binaries" ] || { echo "no test binaries found for valgrind" >&2; exit 1; }
for bin in $binaries; do
  echo "valgrind: $(basename "$bin")"
  GOSSAMER_TEST_SCALE=20 valgrind --tool=memcheck --error-exitcode=99 --quiet "$bin" --test-threads=1 -q
done

step "kvs against real memcached clients and against memcached itself (differential)"
KVS_REQUIRE_EXTERNAL=1 apps/kvs/tests/run_external.sh

step "benchmark smoke run: every experiment runs and checks its own results (speed is not judged)"
cargo run --release -p gsm -- bench --quick all

step "all checks passed"
# One closing line for every runner above: cargo's "test result" lines and the Python clients'.
total=$(grep -oE '[0-9]+ passed' "$log" | awk '{ n += $1 } END { print n + 0 }')
echo "tests: $total passed, 0 failed"
