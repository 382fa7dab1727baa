//! Code packages: refused before they run, loaded once, called across ranks, versions side by
//! side.
//!
//! Its own test driver (`harness = false`), as `rack.rs`. The driver builds the demo package
//! (`packages/demo`, versions 1 and 2) with cargo into `target/test-packages`, makes a key for
//! this run, and writes the packages every scenario uses — good ones and ones broken in each
//! way a node must refuse — into a scratch directory the ranks read (`TEST_PACKAGES`). Every
//! rank gets `GOSSAMER_TEST_MARKER`: the demo library appends a line to that file from an ELF
//! initializer, inside `dlopen`, so the file says whether and how often a package was loaded.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gossamer::Rack;
use gossamer::package::{Package, PackageError, SecretKey, hex};
use serde::{Deserialize, Serialize};

mod common;

use common::{all_succeed, panic_of};

use common::demo_package::demo_library;
use common::job::{self, finish, start};

/// The demo package's types, as a caller of version 1 writes them.
#[derive(Serialize, Deserialize)]
struct Shape {
    sums: u64,
    keys: u64,
    width: u64,
}

#[derive(Serialize, Deserialize)]
struct Put {
    key: u64,
    #[serde(with = "serde_bytes")]
    value: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
struct Payload(#[serde(with = "serde_bytes")] Vec<u8>);

/// Version 2's types: a shape includes its containers' names, so the caller's is `Put` too.
mod v2 {
    #[derive(serde::Serialize, serde::Deserialize)]
    pub(crate) struct Put {
        pub(crate) key: u64,
        #[serde(with = "serde_bytes")]
        pub(crate) value: Vec<u8>,
        pub(crate) ttl: u32,
    }
}
use v2::Put as PutV2;

fn main() -> std::process::ExitCode {
    if let Ok(scenario) = std::env::var("RACK_SCENARIO") {
        return Rack::from_env().run(move || play(&scenario));
    }
    let fixtures = Fixtures::make();
    // SAFETY: set before any test starts a thread of this process; the ranks inherit them.
    unsafe {
        std::env::set_var("TEST_PACKAGES", &fixtures.dir);
        std::env::set_var("GOSSAMER_TEST_MARKER", fixtures.dir.join("marker"));
        std::env::set_var("GSM_TRUSTED_KEYS", hex(&fixtures.key.public()));
        std::env::set_var("TEST_PACKAGE_KEY", fixtures.key.to_hex());
    }
    let both: &[(&str, fn())] = &[
        ("packages_called_across_3_ranks", calls_across_3_ranks),
        ("first_calls_from_4_ranks_load_once", first_calls),
        ("versions_side_by_side_stay_pinned", versions),
    ];
    let once: &[(&str, fn())] = &[
        ("bad_packages_are_refused_before_they_run", refusals),
        ("loading_is_off_without_trusted_keys", loading_off),
        ("a_version_below_the_floor_is_refused", below_min_version),
        ("a_package_that_aborts_ends_the_job", an_abort_ends_the_job),
        (
            "a_library_written_to_while_it_loads_is_refused",
            written_while_loading,
        ),
    ];
    let before = job::on_each_transport(both);
    let code = common::conclude_after("packages", before, once);
    std::fs::remove_dir_all(&fixtures.dir).ok();
    code
}

/// The packages of this run.
struct Fixtures {
    dir: PathBuf,
    key: SecretKey,
}

impl Fixtures {
    fn make() -> Fixtures {
        let (v1, v2) = (demo_library(false), demo_library(true));
        let dir = std::env::temp_dir().join(format!("gossamer-packages-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = SecretKey::generate().unwrap();
        let other = SecretKey::generate().unwrap();
        let good = gossamer::package::build(v1.clone(), &key).expect("package version 1");
        let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
        write("good.gpkg", &good.to_bytes());
        write("libdemo.so", &v1);
        write(
            "v2.gpkg",
            &gossamer::package::build(v2, &key).unwrap().to_bytes(),
        );
        write("untrusted.gpkg", &good.sign(&other).to_bytes());
        let bytes = good.to_bytes();
        let manifest_len = postcard::to_allocvec(good.manifest()).unwrap().len();
        // The file: magic (8), manifest (1-3 bytes of length, then its bytes), signature (1
        // byte of length, 64 bytes), library (length, bytes).
        let manifest_at = 8 + varint_len(manifest_len);
        let signature_at = manifest_at + manifest_len + 1;
        for (name, at) in [
            ("flip-manifest.gpkg", manifest_at + manifest_len / 2),
            ("flip-signature.gpkg", signature_at + 10),
            ("flip-library.gpkg", bytes.len() - 100),
        ] {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0x10;
            write(name, &flipped);
        }
        write("truncated.gpkg", &bytes[..bytes.len() - 1000]);
        write("unsigned.gpkg", &unsigned(&good));
        let resigned = |change: &dyn Fn(&mut gossamer::package::Manifest, &mut Vec<u8>)| {
            let (mut m, mut lib) = (good.manifest().clone(), v1.clone());
            change(&mut m, &mut lib);
            Package::signed(m, lib, &key).to_bytes()
        };
        write(
            "target.gpkg",
            &resigned(&|m, _| m.target = "riscv64-linux-gnu".into()),
        );
        write("abi.gpkg", &resigned(&|m, _| m.abi += 1));
        write("textrel.gpkg", &resigned(&|_, lib| set_textrel(lib)));
        write(
            "needed.gpkg",
            &resigned(&|_, lib| replace_all(lib, b"libgcc_s.so.1\0", b"libgcc_x.so.1\0")),
        );
        Fixtures { dir, key }
    }
}

fn varint_len(n: usize) -> usize {
    let mut len = 1;
    let mut n = n >> 7;
    while n > 0 {
        len += 1;
        n >>= 7;
    }
    len
}

/// The package file without its signature.
fn unsigned(p: &Package) -> Vec<u8> {
    #[derive(Serialize)]
    struct File {
        magic: [u8; 8],
        manifest: Vec<u8>,
        signature: Vec<u8>,
        library: Vec<u8>,
    }
    let bytes = p.to_bytes();
    let library_len = p.manifest().library_len as usize;
    let library = bytes[bytes.len() - library_len..].to_vec();
    let file = File {
        magic: bytes[..8].try_into().unwrap(),
        manifest: postcard::to_allocvec(p.manifest()).unwrap(),
        signature: Vec::new(),
        library,
    };
    postcard::to_allocvec(&file).unwrap()
}

/// Sets DF_TEXTREL in the library's DT_FLAGS entry (x86-64 ELF: 16-byte entries).
fn set_textrel(lib: &mut [u8]) {
    let phoff = u64::from_le_bytes(lib[32..40].try_into().unwrap()) as usize;
    let phnum = u16::from_le_bytes(lib[56..58].try_into().unwrap()) as usize;
    for i in 0..phnum {
        let ph = phoff + i * 56;
        if u32::from_le_bytes(lib[ph..ph + 4].try_into().unwrap()) != 2 {
            continue; // not PT_DYNAMIC
        }
        let offset = u64::from_le_bytes(lib[ph + 8..ph + 16].try_into().unwrap()) as usize;
        let size = u64::from_le_bytes(lib[ph + 32..ph + 40].try_into().unwrap()) as usize;
        for entry in (offset..offset + size).step_by(16) {
            if i64::from_le_bytes(lib[entry..entry + 8].try_into().unwrap()) == 30 {
                lib[entry + 8] |= 0x04; // DF_TEXTREL
                return;
            }
        }
    }
    panic!("the demo library has no DT_FLAGS");
}

fn replace_all(lib: &mut [u8], from: &[u8], to: &[u8]) {
    let mut found = false;
    let mut at = 0;
    while let Some(i) = lib[at..].windows(from.len()).position(|w| w == from) {
        lib[at + i..at + i + to.len()].copy_from_slice(to);
        at += i + to.len();
        found = true;
    }
    assert!(
        found,
        "{:?} is not in the library",
        String::from_utf8_lossy(from)
    );
}

fn package(name: &str) -> Result<Package, PackageError> {
    let dir = PathBuf::from(std::env::var("TEST_PACKAGES").unwrap());
    Package::open(dir.join(name))
}

fn shape() -> Shape {
    Shape {
        sums: 4,
        keys: 64,
        width: 8,
    }
}

/// How many times a process loaded a package, by the marker file.
fn loads() -> usize {
    let marker = std::env::var("GOSSAMER_TEST_MARKER").unwrap();
    std::fs::read_to_string(marker).map_or(0, |s| s.lines().count())
}

fn play(scenario: &str) {
    match scenario {
        "refusals" => play_refusals(),
        "off" => {
            let err = gossamer::this_node()
                .entrust_package(&package("good.gpkg").unwrap(), "Server", shape())
                .unwrap_err();
            assert_eq!(err, PackageError::NotEnabled);
            assert!(err.to_string().contains("GSM_TRUSTED_KEYS"), "{err}");
            assert_eq!(loads(), 0);
            println!("off ok");
        }
        "floor" => {
            let here = gossamer::this_node();
            let err = here
                .entrust_package(&package("good.gpkg").unwrap(), "Server", shape())
                .unwrap_err();
            assert!(matches!(err, PackageError::Downgrade { .. }), "{err}");
            assert_eq!(loads(), 0);
            here.entrust_package(&package("v2.gpkg").unwrap(), "Server", shape())
                .expect("version 2 is above the floor");
            assert_eq!(loads(), 1);
            println!("floor ok");
        }
        "calls" => play_calls(),
        "written" => play_written_while_loading(),
        "first_calls" => play_first_calls(),
        "versions" => play_versions(),
        "abort" => {
            let last = gossamer::nodes().last().unwrap();
            let pkg = package("good.gpkg").unwrap();
            println!("calling abort");
            let _: Result<u64, _> = last.call(&pkg, "abort", ());
            unreachable!("rank {} aborted", last.rank());
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn play_refusals() {
    let here = gossamer::this_node();
    type Expected = fn(&PackageError) -> bool;
    let cases: &[(&str, Expected)] = &[
        ("unsigned.gpkg", |e| *e == PackageError::Unsigned),
        ("untrusted.gpkg", |e| {
            matches!(e, PackageError::UntrustedKey { .. })
        }),
        ("flip-manifest.gpkg", |e| {
            matches!(e, PackageError::BadSignature | PackageError::Malformed(_))
        }),
        ("flip-signature.gpkg", |e| *e == PackageError::BadSignature),
        ("flip-library.gpkg", |e| *e == PackageError::HashMismatch),
        ("truncated.gpkg", |e| {
            matches!(e, PackageError::Malformed(_))
        }),
        ("target.gpkg", |e| matches!(e, PackageError::Target { .. })),
        ("abi.gpkg", |e| matches!(e, PackageError::Abi { .. })),
        (
            "textrel.gpkg",
            |e| matches!(e, PackageError::Elf(why) if why.contains("TEXTREL")),
        ),
        (
            "needed.gpkg",
            |e| matches!(e, PackageError::Elf(why) if why.contains("libgcc_x.so.1")),
        ),
    ];
    for (file, expected) in cases {
        let err = package(file)
            .and_then(|p| here.entrust_package(&p, "Server", shape()))
            .expect_err(file);
        assert!(expected(&err), "{file}: unexpected {err:?}");
        assert!(!err.to_string().is_empty());
        assert_eq!(loads(), 0, "{file} was loaded");
    }
    let good = package("good.gpkg").unwrap();
    let server = here.entrust_package(&good, "Server", shape()).unwrap();
    assert_eq!(loads(), 1);
    let at: u64 = server
        .call(
            "indirect_put",
            Put {
                key: 7,
                value: b"seven".to_vec(),
            },
        )
        .unwrap();
    assert!(at < 64);
    println!("refusals ok: {} refused before they ran", cases.len());
}

/// Where the writer of [`play_written_while_loading`] writes: in the padding after the
/// library, which the loader never reads, so that a change there loads as well as none.
const PADDING: usize = 1 << 20;
const WRITTEN_AT: usize = 64;
const WRITTEN: u8 = 0xee;

/// Loads packages while a thread keeps opening this process's package memfds through
/// `/proc/self/fd` and writing to them, as another process of this user could: every load
/// must either refuse the changed file or load a file that holds exactly the signed bytes.
fn play_written_while_loading() {
    use std::os::unix::fs::FileExt as _;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

    let dir = PathBuf::from(std::env::var("TEST_PACKAGES").unwrap());
    let library = std::fs::read(dir.join("libdemo.so")).unwrap();
    let key = SecretKey::from_hex(&std::env::var("TEST_PACKAGE_KEY").unwrap()).unwrap();
    let manifest = package("good.gpkg").unwrap().manifest().clone();
    let target = (library.len() + WRITTEN_AT) as u64;
    let memfds = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                std::fs::read_link(p)
                    .is_ok_and(|to| to.to_string_lossy().contains("memfd:gossamer-package"))
            })
            .collect::<Vec<_>>()
    };
    let (stop, landed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let writer = std::thread::spawn({
        let (stop, landed) = (stop.clone(), landed.clone());
        move || {
            while !stop.load(Relaxed) {
                for path in memfds() {
                    let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
                        continue;
                    };
                    // Until the seal refuses, or for a while.
                    for _ in 0..1000 {
                        if file.write_at(&[WRITTEN], target).is_err() {
                            break;
                        }
                        landed.fetch_add(1, Relaxed);
                    }
                }
            }
        }
    });
    let here = gossamer::this_node();
    let (mut loaded, mut refused) = (0, 0);
    for attempt in 0..40u64 {
        // Each attempt its own package (its own id), padded so that writing takes a while.
        let mut padded = library.clone();
        padded.extend_from_slice(&attempt.to_le_bytes());
        padded.resize(library.len() + PADDING, 0);
        let package = Package::signed(manifest.clone(), padded, &key);
        match here.load_package(&package) {
            Ok(()) => loaded += 1,
            Err(PackageError::HashMismatch) => refused += 1,
            Err(other) => panic!("attempt {attempt}: unexpected {other:?}"),
        }
    }
    stop.store(true, Relaxed);
    writer.join().expect("the writer thread");
    for path in memfds() {
        let mut byte = [0];
        std::fs::File::open(&path)
            .unwrap()
            .read_exact_at(&mut byte, target)
            .unwrap();
        assert_ne!(
            byte[0],
            WRITTEN,
            "{} holds a loaded library that was changed after it was checked",
            path.display()
        );
    }
    println!(
        "written ok: {loaded} loaded as signed, {refused} refused as changed, {} writes landed",
        landed.load(Relaxed)
    );
}

fn play_calls() {
    let pkg = package("good.gpkg").unwrap();
    for node in gossamer::nodes() {
        let server = node.entrust_package(&pkg, "Server", shape()).unwrap();
        for key in 0..20u64 {
            let value = key.to_le_bytes().to_vec();
            let slot: u64 = server.call("indirect_put", Put { key, value }).unwrap();
            assert!(slot < 64);
        }
        let got: Option<Vec<u8>> = server.call("get", 5u64).unwrap();
        assert_eq!(got, Some(5u64.to_le_bytes().to_vec()));
        let sum: u64 = server.call("server_sum", Payload(vec![1, 2, 3])).unwrap();
        assert_eq!(sum, 6);
        // Without waiting, in delegated context.
        let group = trust::Group::new();
        for k in 0..10u8 {
            let then =
                group.track(move |r: Result<u64, PackageError>| assert_eq!(r, Ok(u64::from(k))));
            server.call_then("server_sum", Payload(vec![k]), then);
        }
        group.wait();
        // A function, and where it ran.
        let total: u64 = node.call(&pkg, "sum", vec![1u64, 2, 3, 4]).unwrap();
        assert_eq!(total, 10);
        let (version, rank): (String, u32) = node.call(&pkg, "version", ()).unwrap();
        assert_eq!((version.as_str(), rank), ("1.0.0", node.rank()));
        // Wrong types are refused at the caller, from the signed manifest.
        let err = server
            .call::<String, u64>("indirect_put", "x".into())
            .unwrap_err();
        assert!(
            matches!(err, PackageError::SignatureMismatch { .. }),
            "{err}"
        );
        let err = node.call::<u64, u64>(&pkg, "nope", 1).unwrap_err();
        assert!(
            matches!(&err, PackageError::NoSuchExport { has, .. } if has.contains(&"sum".to_string())),
            "{err}"
        );
        // A panic in the package comes back as a panic, naming the node if it is another.
        let message = panic_of(|| node.call::<String, u64>(&pkg, "panics", "on purpose".into()));
        assert!(message.contains("on purpose"), "{message}");
        if node != gossamer::this_node() {
            let on = format!("on rank {}", node.rank());
            assert!(message.contains(&on), "{message}");
        }
    }
    println!("package calls ok on {} ranks", gossamer::nodes().len());
}

fn play_first_calls() {
    let target = gossamer::nodes().nth(1).unwrap();
    let callers: Vec<_> = gossamer::nodes()
        .map(|n| {
            gossamer::spawn_on(
                n,
                |()| {
                    let pkg = package("good.gpkg").unwrap();
                    let target = gossamer::nodes().nth(1).unwrap();
                    let fibers: Vec<_> = (0..8u64)
                        .map(|f| {
                            let pkg = pkg.clone();
                            trust::spawn(move || {
                                target
                                    .call::<Vec<u64>, u64>(&pkg, "sum", vec![f, 1])
                                    .unwrap()
                            })
                        })
                        .collect();
                    fibers.into_iter().map(|h| h.join()).sum::<u64>()
                },
                (),
            )
        })
        .collect();
    let sums: u64 = callers.into_iter().map(|h| h.join()).sum();
    let n = gossamer::nodes().len() as u64;
    assert_eq!(sums, n * (28 + 8), "every call answered");
    assert_eq!(loads(), 1, "one load on rank {}", target.rank());
    // Now the node has it: a call carries the id, not the library.
    let pkg = package("good.gpkg").unwrap();
    let before = bytes_written();
    let _: u64 = target.call(&pkg, "sum", vec![1u64]).unwrap();
    let sent = bytes_written() - before;
    assert!(sent < 1024, "a later call sent {sent} bytes");
    // A node the caller wrongly believes has the package answers `Missing`; the caller then
    // sends it and calls again, once.
    let other = gossamer::nodes().nth(2).unwrap();
    gossamer::fuzzing::pretend_loaded(other, &pkg);
    let before = bytes_written();
    let total: u64 = other.call(&pkg, "sum", vec![2u64, 3]).unwrap();
    let resent = bytes_written() - before;
    assert_eq!(total, 5);
    assert_eq!(
        loads(),
        2,
        "rank {} loaded it after `Missing`",
        other.rank()
    );
    let file = PathBuf::from(std::env::var("TEST_PACKAGES").unwrap()).join("good.gpkg");
    let library = std::fs::metadata(file).unwrap().len();
    assert!(
        resent > library,
        "the resend carried {resent} bytes, the package has {library}"
    );
    // Loaded ahead of any call: the first call then carries only the id.
    let ahead = gossamer::nodes().nth(3).unwrap();
    ahead.load_package(&pkg).unwrap();
    assert_eq!(loads(), 3, "rank {} loaded it ahead", ahead.rank());
    let before = bytes_written();
    let _: u64 = ahead.call(&pkg, "sum", vec![1u64]).unwrap();
    let first = bytes_written() - before;
    assert!(
        first < 1024,
        "a first call after load_package sent {first} bytes"
    );
    println!(
        "first calls ok: {} answered, one load, then {sent} bytes a call; after `Missing`, \
         the package again ({resent} bytes)",
        n * 8
    );
}

fn play_versions() {
    let node = gossamer::nodes().last().unwrap();
    let (v1, v2) = (package("good.gpkg").unwrap(), package("v2.gpkg").unwrap());
    let s1 = node.entrust_package(&v1, "Server", shape()).unwrap();
    let s2 = node.entrust_package(&v2, "Server", shape()).unwrap();
    let put = Put {
        key: 1,
        value: vec![1],
    };
    let _: u64 = s1.call("indirect_put", put).unwrap();
    let put2 = PutV2 {
        key: 1,
        value: vec![2],
        ttl: 5,
    };
    let _: u64 = s2.call("indirect_put", put2).unwrap();
    let wrong = PutV2 {
        key: 1,
        value: vec![3],
        ttl: 5,
    };
    let err = s1.call::<PutV2, u64>("indirect_put", wrong).unwrap_err();
    assert!(
        matches!(err, PackageError::SignatureMismatch { .. }),
        "{err}"
    );
    // Each state runs its own version.
    let got1: Option<Vec<u8>> = s1.call("get", 1u64).unwrap();
    let got2: Option<Vec<u8>> = s2.call("get", 1u64).unwrap();
    assert_eq!(got1.unwrap()[0], 1);
    assert_eq!(got2.unwrap()[0], 2);
    let (version, _): (String, u32) = node.call(&v2, "version", ()).unwrap();
    assert_eq!(version, "2.0.0");
    let (version, _): (String, u32) = node.call(&v1, "version", ()).unwrap();
    assert_eq!(version, "1.0.0");
    let err = node.call::<Vec<u64>, u64>(&v2, "sum", vec![1]).unwrap_err();
    assert!(matches!(err, PackageError::NoSuchExport { .. }), "{err}");
    assert_eq!(loads(), 2, "one load per version");
    println!("versions ok");
}

fn fresh_marker() {
    let marker = std::env::var("GOSSAMER_TEST_MARKER").unwrap();
    std::fs::remove_file(marker).ok();
}

fn one_node(scenario: &str, env: &[(&str, &str)]) -> (std::process::ExitStatus, String, String) {
    fresh_marker();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env("RACK_SCENARIO", scenario)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut results = common::finish(
        vec![cmd.spawn().unwrap()],
        Duration::from_secs(60),
        scenario,
    );
    results.remove(0)
}

fn refusals() {
    let (status, stdout, stderr) = one_node("refusals", &[]);
    assert!(status.success(), "{stderr}");
    assert!(stdout.contains("refusals ok"), "{stdout}");
}

fn loading_off() {
    let (status, stdout, stderr) = one_node("off", &[("GSM_TRUSTED_KEYS", "")]);
    assert!(
        status.success() && stdout.contains("off ok"),
        "{stdout}{stderr}"
    );
}

fn below_min_version() {
    let (status, stdout, stderr) = one_node("floor", &[("GSM_PACKAGE_MIN_VERSIONS", "demo=1.1.0")]);
    assert!(
        status.success() && stdout.contains("floor ok"),
        "{stdout}{stderr}"
    );
}

fn written_while_loading() {
    let (status, stdout, stderr) = one_node("written", &[]);
    assert!(
        status.success() && stdout.contains("written ok"),
        "{stdout}{stderr}"
    );
    println!("{}", stdout.trim());
}

fn calls_across_3_ranks() {
    fresh_marker();
    let results = finish(start(3, "calls", &[]), Duration::from_secs(60));
    all_succeed(&results, "package calls ok on 3 ranks");
}

fn first_calls() {
    fresh_marker();
    let results = finish(start(4, "first_calls", &[]), Duration::from_secs(60));
    all_succeed(&results, "first calls ok: 32 answered, one load");
}

fn versions() {
    fresh_marker();
    let results = finish(start(2, "versions", &[]), Duration::from_secs(60));
    all_succeed(&results, "versions ok");
}

fn an_abort_ends_the_job() {
    fresh_marker();
    let started = Instant::now();
    let results = finish(start(2, "abort", &[]), Duration::from_secs(30));
    let took = started.elapsed();
    let (status, stdout, stderr) = &results[0];
    assert!(stdout.contains("calling abort"), "{stdout}{stderr}");
    assert_eq!(
        status.code(),
        Some(gossamer::EXIT_PEER_LOST.into()),
        "{stderr}"
    );
    assert!(stderr.contains("rank 1"), "{stderr}");
    assert!(
        took < Duration::from_secs(5),
        "the job took {took:?} to end"
    );
}

/// Bytes this node has written on its links so far: how the test sees what a call sent.
fn bytes_written() -> u64 {
    gossamer::stats().links.iter().map(|l| l.bytes_out).sum()
}
