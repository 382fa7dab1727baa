#!/usr/bin/env bash
# The project's whole test suite, as CI runs it. Installs what it needs first, then runs the
# cheap checks (format, lints) before the tests, the loom models, valgrind, where a nightly
# toolchain exists the fuzz targets and AddressSanitizer, and last the benchmarks' smoke run.
#
# Every long step runs under a time limit (CI allows 90 minutes in all, and the whole script
# is to stay under 35 on a fresh 2-core machine), so a hang fails the run naming its step
# instead of eating the limit silently. The tests bound their own waits as well. Builds are
# shared where they can be: later debug steps reuse the binaries of the first (`--workspace`
# everywhere, so that features unify alike), and the other profiles' builds are made ahead, in
# the background at the lowest priority (see `prebuild`). Each step prints its time.
set -euo pipefail
cd "$(dirname "$0")/.."

# Keep a copy of everything printed, to total the tests at the end.
log=$(mktemp) prebuild_log=$(mktemp) scratch=$(mktemp -d) prebuild_pid=""
cleanup() {
  [ -z "$prebuild_pid" ] || kill -- -"$prebuild_pid" 2>/dev/null || true
  rm -rf "$log" "$prebuild_log" "$scratch"
}
trap cleanup EXIT
exec > >(tee "$log") 2>&1

# Each step's wall time, printed when it ends and again at the end.
step_name="" step_started=$SECONDS times=()
step() {
  if [ -n "$step_name" ]; then
    times+=("$(printf '%6ds  %s' $((SECONDS - step_started)) "$step_name")")
    echo "(took $((SECONDS - step_started)) s)"
  fi
  step_name=$* step_started=$SECONDS
  printf '\n==> %s\n' "$*"
}

# Runs a command with a time limit (`timeout`'s duration, e.g. 20m); when it runs out, the
# command's whole process group is killed and the run fails with a line naming the step.
limit() {
  local duration=$1 status=0
  shift
  timeout --kill-after=30s "$duration" "$@" &
  limited=$!
  wait "$limited" || status=$?
  limited=""
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "error: the step \"$step_name\" did not finish within $duration: $*" >&2
  fi
  return "$status"
}
# `timeout` puts the step in a process group of its own, which Ctrl-C does not reach: pass it on.
limited=""
trap '[ -z "$limited" ] || kill -INT "$limited" 2>/dev/null; exit 130' INT TERM

# Every build here starts from nothing (CI's clean clone): incremental compilation's caches
# would only be written, never reused.
export CARGO_INCREMENTAL=0

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# The nightly toolchain (pre-installed here and in CI) runs the fuzz targets and AddressSanitizer.
nightly=0
cargo +nightly --version >/dev/null 2>&1 && nightly=1

step "tools"
missing=()
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
command -v cc >/dev/null 2>&1 || missing+=(gcc libc6-dev) # the C API's program (crates/trust-c/c)
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
command -v memcslap >/dev/null 2>&1 || missing+=(libmemcached-tools)
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || missing+=(libopenmpi-dev) # the Open MPI side of `bench regions` and `bench objects`
command -v ip >/dev/null 2>&1 || missing+=(iproute2) # `ip netns`, for the multi-host test
# UCX (gossamer's `ucx` feature, which --all-features builds) and its tools (`ucx_perftest`, the
# baseline of `bench rack`'s UCX rows).
[ -e /usr/include/ucp/api/ucp.h ] || missing+=(libucx-dev)
command -v ucx_perftest >/dev/null 2>&1 || missing+=(ucx-utils)
command -v python3 >/dev/null 2>&1 || missing+=(python3 python3-pip)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server) # Redis Cluster, `bench ycsb`'s peer
command -v javac >/dev/null 2>&1 || missing+=(default-jdk-headless) # YCSB's own generators (bench/tests/ycsb_java.rs)
command -v curl >/dev/null 2>&1 || missing+=(curl ca-certificates)
if [ ${#missing[@]} -gt 0 ]; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if ! python3 -c 'import pymemcache' 2>/dev/null; then
  python3 -m pip install --quiet pymemcache 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages pymemcache
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# YCSB's core (site.ycsb:core 0.17.0 from Maven Central), whose generators the bench's are
# checked against; kept beside the build, and checked against the digest it was first fetched with.
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
export YCSB_CORE_JAR="$target_dir/ycsb/core-0.17.0.jar" YCSB_REQUIRE_JAVA=1
ycsb_sha256=e1c64d09bfc642715428c2e53ec129b0a98a0e634ee32bf0ae77e5b4eebb3cda
if ! echo "$ycsb_sha256  $YCSB_CORE_JAR" | sha256sum --check --status 2>/dev/null; then
  mkdir -p "$(dirname "$YCSB_CORE_JAR")"
  curl --fail --silent --show-error --retry 3 --max-time 120 -o "$YCSB_CORE_JAR.part" \
    https://repo1.maven.org/maven2/site/ycsb/core/0.17.0/core-0.17.0.jar
  echo "$ycsb_sha256  $YCSB_CORE_JAR.part" | sha256sum --check --quiet
  mv "$YCSB_CORE_JAR.part" "$YCSB_CORE_JAR"
fi
if [ $nightly = 1 ] && ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  # A debug build: cargo-fuzz only starts builds and the fuzzer, and compiles in far less time.
  limit 15m cargo install --locked --quiet --debug cargo-fuzz
fi

# The debug tests: the whole workspace with every feature (see its step), its test targets
# only. The examples are left out: clippy and the check step compile every one, the tests that
# run one include its source (`#[path]`), and building them again took 41 CPU-seconds. The
# workspace's doc tests run after them (`--doc`), on the same build. `scripts/stress.sh` builds by this same
# command, so that it compiles nothing again.
debug_tests=(cargo test --workspace --all-features --tests)

# The builds of the later steps in other profiles and target directories, named once: their
# steps run them, and so does `prebuild`.
smoke_build=(cargo build --profile smoke -p bench -p gsm -p kvs -p demo-package --features bench/ucx)
smoke_trust_tests=(cargo test -p trust --all-features --profile smoke --tests)
loom_tests=(env RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom
  cargo test -p trust -p gossamer -p objects --lib)
asan=(env RUSTFLAGS="-Zsanitizer=address -Cunsafe-allow-abi-mismatch=sanitizer" CARGO_TARGET_DIR=target/asan
  cargo +nightly test --all-features --features corosensei/sanitizer --target x86_64-unknown-linux-gnu)
asan_trust_lib=("${asan[@]}" -p trust --lib)
asan_rack_lib=("${asan[@]}" -p trust -p gossamer --lib)
asan_trust_tests=("${asan[@]}" -p trust --test '*')
asan_c_api=("${asan[@]}" -p trust -p trust-c --test api)

# Makes those builds ahead, one after another, in the background at the lowest priority, while
# the steps before them run: much of those steps' time leaves a core idle (one crate compiling
# alone, ranks waiting on one another, valgrind running one thread at a time), and the builds
# take it. A step that needs a build finds it made, or waits for cargo's lock while it is being
# made, or makes it itself if the prebuild has not come to it yet; so the prebuild changes no
# step's result, only when its compiling happens.
prebuild() {
  set -e
  renice -n 19 -p "$BASHPID" >/dev/null
  local started=$SECONDS
  "${loom_tests[@]}" --no-run
  echo "prebuild: the loom models at +$((SECONDS - started)) s"
  # The smoke run's build early, though its step is last: the steps after it make the fuzz
  # targets' and AddressSanitizer's builds themselves if the prebuild has not, beside it, so
  # that by the smoke run the prebuild is over; left for last, this build alone held the smoke
  # run back 332 s (a fresh run, the machine idle otherwise).
  "${smoke_build[@]}"
  "${smoke_trust_tests[@]}" --no-run
  echo "prebuild: the smoke profile's executables and trust's tests at +$((SECONDS - started)) s"
  if [ $nightly = 1 ]; then
    cargo +nightly fuzz build --dev
    echo "prebuild: the fuzz targets at +$((SECONDS - started)) s"
    "${asan_trust_lib[@]}" --no-run
    "${asan_rack_lib[@]}" --no-run
    "${asan_trust_tests[@]}" --no-run
    "${asan_c_api[@]}" --no-run
    echo "prebuild: the AddressSanitizer tests at +$((SECONDS - started)) s"
  fi
}
# Job control for this one launch: the prebuild gets a process group of its own, which the exit
# trap kills whole (cargo and its compilers with it).
set -m
prebuild >"$prebuild_log" 2>&1 &
prebuild_pid=$!
set +m

step "cargo fmt --check"
cargo fmt --all -- --check

step "no import circles between the files of a crate"
python3 scripts/layers.py

step "cargo clippy (all targets, warnings denied)"
limit 30m cargo clippy --workspace --all-targets --all-features -- -D warnings

# The tests below build every feature; plain `cargo test`, as a contributor types it, must
# keep building too (its features leave out code the tests' build has).
step "cargo check (no features, all targets)"
limit 15m cargo check --workspace --all-targets

step "cargo doc (warnings denied)"
RUSTDOCFLAGS="-D warnings" limit 15m cargo doc --workspace --all-features --no-deps --quiet

# The test executables of the debug build (the next step's), one "PATH DIRECTORY" line each:
# of package $1, those whose targets are named by the other arguments. The later steps run
# them so rather than through `cargo test --test NAME`, whose narrower selection unifies
# dependencies' features differently and compiled gossamer and a dozen crates again.
built_tests() {
  local package=$1
  shift
  "${debug_tests[@]}" --no-run --message-format=json 2>/dev/null |
    python3 scripts/test-binaries.py |
    awk -v package="$package" -v names=" $* " '$1 == package && index(names, " " $2 " ") { print $4, $5 }'
}
# Runs those executables (`PACKAGE TARGET... -- ARGUMENTS`) as `cargo test` would, in their
# package's directory, each under a time limit; stops at the first that fails.
run_built() {
  local selection=() runs bin directory
  while [ "$1" != "--" ]; do selection+=("$1"); shift; done
  shift
  runs=$(built_tests "${selection[@]}")
  [ -n "$runs" ] || { echo "error: no test executable of ${selection[*]} was built" >&2; return 1; }
  while read -r bin directory; do
    echo "     Running $(basename "$bin") (${selection[0]})"
    (cd "$directory" && limit 10m "$bin" "$@" </dev/null)
  done <<<"$runs"
}

# CI runs as root, so the multi-host test (three hosts in network namespaces) must run, not
# skip; without root, run this script with GSM_REQUIRE_NETNS=0 to let it skip.
# One debug build for every test step: the whole workspace with every feature (`--workspace`
# everywhere, so that dependencies' features unify alike and nothing is compiled twice). Built
# plain and again with the features, the debug tests took 1,250 CPU-seconds of compiling
# against 830 for this build alone (2 vCPUs); what the features leave out of plain `cargo
# test` is a few `cfg(not(feature))` lines, and the check above keeps plain `cargo test` building.
# With every feature the test targets that need one (`required-features`) run too: the crash
# ledger among them, whose rank kills itself at each of the durable path's crash points
# (gossamer's `crashpoints` feature), in both durability modes, and whose ledger must show
# every call once; then each server-side point again under `gsm run --recover` (GSM_BIN, the
# gsm this build makes before any test runs), which restarts the rank while the job goes on;
# and the job on three hosts (network namespaces: root, as GSM_REQUIRE_NETNS above) whose
# cables are cut, and on three hosts' daemons under `gsm run --hosts --recover`.
step "tests (debug, every feature), the crash ledger at every crash point among them"
export GSM_REQUIRE_NETNS=${GSM_REQUIRE_NETNS:-1}
GSM_BIN="$target_dir/debug/gsm" limit 40m "${debug_tests[@]}"
limit 10m cargo test --workspace --all-features --doc

# The rack's transport-dependent tests again with every link on UCX (gossamer's `ucx` feature),
# over UCX's TCP and over its shared memory, on one host and on three network-namespace hosts.
# (The tests that exist only with UCX — its idle ranks sleep; a peer breaking its message
# order is a bad frame; `ucx` against `tcp` is refused — ran in the step above.)
step "the rack over UCX: GSM_TRANSPORT=ucx with UCX_TLS=tcp and UCX_TLS=sm"
# Only those: the filter selects the tests named for a UCX transport (`… [ucx/tcp]`); the
# others ran above.
export GSM_TEST_TRANSPORTS="ucx/tcp ucx/sm"
run_built gossamer rack named regions bad_frame packages hosts -- '[ucx/'
run_built objects rack -- '[ucx/'
run_built rangelock rack -- '[ucx/'
unset GSM_TEST_TRANSPORTS

# The jobs under `gsm run --recover` again with every link on UCX (the supervised jobs take
# GSM_TRANSPORT and UCX_TLS from here): random kills, a stopped rank, a rank down past the
# recovery timeout, three hosts with cut cables, three daemons' hosts (kills, a cut host, a
# killed daemon), and regions of a lost life. With UCX_TLS=sm,tcp:
# a job that recovers needs a UCX transport that detects a peer's failure, which UCX's shared
# memory is not (`UCX_TLS=sm` alone is refused with GSM_RECOVER=1), so links take UCX's TCP;
# a recovering job's heaps are registered, not UCX's, so a lost life's region is reached with
# UCX's one-sided operations (mapped lost heaps are the shared-memory transport's tests).
step "exactly once across crashes over UCX: the supervised jobs of the crash ledger"
[ -x "$target_dir/debug/gsm" ] || { echo "error: cargo test did not build $target_dir/debug/gsm" >&2; exit 1; }
GSM_BIN="$target_dir/debug/gsm" GSM_TRANSPORT=ucx UCX_TLS=sm,tcp run_built gossamer crash_ledger -- \
  random_kills_os stopped_rank_is_fenced unavailable_then_resumed across_3_hosts_with_cut_cables \
  across_3_daemons_recovering regions_of_a_lost_life_fail

# The integration tests again, over and over beside a busy loop per core: their order and
# timing promises must hold on a loaded machine. `scripts/stress.sh` alone runs this for 30
# minutes.
step "stress: the integration tests repeated on a loaded machine, half a minute"
limit 15m scripts/stress.sh --minutes 0.5

step "loom models of the channel, park, late-answer, property-home, shared-memory ring, durable-answer, object ring and barrier protocols"
# Unoptimised: loom explores the same interleavings in any profile, and here the build is most
# of the step (optimised: 184 s of building for 3 s of models; unoptimised: 94 s for 19 s).
# One cargo for the three crates: trust is built once, with the features the others give it.
limit 20m "${loom_tests[@]}" loom

step "valgrind memcheck on the channel, fiber, shutdown, deferred-answer, counter, migration and withdrawal tests"
binaries=$(built_tests trust delegation fibers shutdown group cross_runtime deferred stats migrate withdraw | cut -d' ' -f1)
[ -n "$binaries" ] || { echo "no test binaries found for valgrind" >&2; exit 1; }
for bin in $binaries; do
  echo "valgrind: $(basename "$bin")"
  # --fair-sched=yes: valgrind runs one thread at a time, and its default lock hand-over lets
  # a thread that spins or yields keep the CPU, starving the thread it waits for (a worker
  # yielding for answers from a trustee thread hung this step for 20 minutes).
  GOSSAMER_TEST_SCALE=20 limit 10m valgrind --tool=memcheck --fair-sched=yes --error-exitcode=99 \
    --quiet "$bin" --test-threads=1 -q
done

step "valgrind memcheck on the rack's unsafe modules (op descriptors, capture-free closures, shared-memory rings, UCX bindings, code packages)"
# op.rs reads descriptors named by offsets off the wire; capture_free.rs makes closures out of
# nothing; transport/shm maps memory shared with another process and passes descriptors;
# region/heap does atomics on such memory; package/load maps a code package from a memfd and
# calls into it through its C descriptor (the demo package, built by the test).
# Their unit tests, and the dispatcher's mutation test that drives op and capture_free (in
# call.rs), run here; with them the UCX transport's (its bindings, the handlers UCX calls
# back), compiled in by the `ucx` feature.
rack_lib=$(built_tests gossamer gossamer | cut -d' ' -f1)
[ -n "$rack_lib" ] || { echo "no gossamer unit-test binary found for valgrind" >&2; exit 1; }
GOSSAMER_TEST_SCALE=20 limit 10m valgrind --tool=memcheck --fair-sched=yes --error-exitcode=99 \
  --quiet "$rack_lib" --test-threads=1 -q op:: capture_free:: call:: transport:: region:: package::load

step "the C API: its program built with cc against libtrust_c.a, its example under valgrind memcheck"
# The library as a C program links it (the static one, built by the tests above: `cargo
# build` only puts it in place), the header cbindgen generated (crates/trust-c/header checks it).
limit 10m cargo build -p trust-c
c_program="$target_dir/debug/counter_table"
cc -O1 -g -Wall -Wextra -Werror -I crates/trust-c/include -o "$c_program" \
  crates/trust-c/c/counter_table.c "$target_dir/debug/libtrust_c.a" -lpthread -ldl -lm
# Definite leaks fail the run; std keeps the main thread's handle for good ("possibly lost").
limit 10m valgrind --tool=memcheck --fair-sched=yes --error-exitcode=99 --quiet --leak-check=full \
  --show-leak-kinds=definite --errors-for-leak-kinds=definite "$c_program" example

step "kvs against real memcached clients and against memcached itself (differential)"
KVS_REQUIRE_EXTERNAL=1 limit 15m apps/kvs/tests/run_external.sh "$target_dir/debug/kvs"

# Optimised code reorders and races differently: the trust tests again, in the smoke run's
# profile (trust at opt-level 3 there, see Cargo.toml), reusing the dependencies built above.
step "trust tests (optimised: the smoke profile)"
limit 20m "${smoke_trust_tests[@]}"

if [ $nightly = 1 ]; then
  # Each target runs for a bounded time from the corpus kept in fuzz/corpus/<target>; what it
  # finds goes to a scratch directory, so the run leaves the repository unchanged. To grow the
  # kept corpus: fuzz longer into it, then `cargo +nightly fuzz cmin <target>` (see fuzz/README.md).
  # Unoptimised (`--dev`), still under AddressSanitizer with debug assertions: the optimised
  # build took 460 CPU-seconds against 230, and a 5-second run mostly replays the corpus.
  step "fuzz targets, 5 s each"
  for target in $(cargo +nightly fuzz list); do
    mkdir -p "$scratch/$target"
    out="$scratch/$target.log"
    if ! limit 15m cargo +nightly fuzz run --dev "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
      -max_total_time=5 -print_final_stats=1 >"$out" 2>&1; then
      tail -n 60 "$out"
      echo "error: fuzz target $target failed; its input is in fuzz/artifacts/$target" >&2
      exit 1
    fi
    echo "$target: $(grep -E '^stat::(number_of_executed_units|new_units_added)' "$out" | tr '\n' ' ')"
  done

  # std is not instrumented (no rust-src component to rebuild it), hence the ABI-mismatch
  # allowance; corosensei's `sanitizer` feature tells ASan about every fiber stack switch, so
  # its reports on fiber stacks stay trustworthy. Leak checking stays on.
  step "AddressSanitizer on the trust tests, the C API's and the rack's unit tests"
  # trust's unit tests, and the rack's of its modules whose unsafe touches memory (the set
  # valgrind runs above; elsewhere the rack's unsafe is a plain syscall), then trust's
  # integration tests; the rack's multi-process tests are left out. The rack's run names trust
  # too, as only trust depends on corosensei; no test name of trust's has those filters.
  GOSSAMER_TEST_SCALE=4 limit 20m "${asan_trust_lib[@]}"
  # UCX's memory hooks (libucm) replace malloc and mmap as ASan does, and crash it: they are
  # turned off. UCX's context and workers live until the process exits, by design (see
  # transport/ucx/sys.rs): their allocations are not leaks (scripts/lsan-ucx.supp).
  UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none UCX_MEM_EVENTS=no \
    LSAN_OPTIONS="suppressions=$PWD/scripts/lsan-ucx.supp" GOSSAMER_TEST_SCALE=4 \
    limit 20m "${asan_rack_lib[@]}" -- op:: capture_free:: call:: transport:: region:: package::
  GOSSAMER_TEST_SCALE=4 limit 20m "${asan_trust_tests[@]}"
  # The C API's contract tests (its C program links no ASan runtime). trust is named too, for
  # its features as above (so that it is not built again); only trust-c has a test `api`.
  limit 10m "${asan_c_api[@]}"
else
  step "fuzz targets and AddressSanitizer"
  echo "skipped: no nightly toolchain (cargo +nightly); CI has one"
fi

# Last, once the prebuild is over: the smoke run's experiments check windows of milliseconds
# (an answer to a request within 15 ms), which a compiler beside them would put at risk.
step "the builds made ahead (prebuild)"
status=0
wait "$prebuild_pid" || status=$?
prebuild_pid=""
grep '^prebuild:' "$prebuild_log" || true
if [ "$status" -ne 0 ]; then
  # Each of its builds is its step's own too: a build that fails for a reason of the code fails
  # that step as well (the smoke run's, next), so this is shown, not counted.
  tail -n 40 "$prebuild_log"
  echo "note: the prebuild stopped (status $status); the steps make their builds themselves"
fi

step "benchmark smoke run: every experiment runs and checks its own results (speed is not judged)"
# The executables the experiments start (gsm, kvs, the demo package) built with the runner, in
# one build, so that the rack is compiled once rather than again for each; with the bench's
# `ucx` feature, for `rack`'s UCX rows. The `smoke` profile
# is release without debug information (see Cargo.toml): the same optimised code, smaller
# executables, which every rack node hashes at start, under callgrind too.
limit 20m "${smoke_build[@]}"
limit 15m "$target_dir/smoke/bench" --quick all

step "all checks passed"
printf '%s\n' "${times[@]}"
# One closing line for every runner above: cargo's "test result" lines and the Python clients'.
total=$(grep -oE '[0-9]+ passed' "$log" | awk '{ n += $1 } END { print n + 0 }')
echo "tests: $total passed, 0 failed"
