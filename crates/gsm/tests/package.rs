//! `gsm package`, driven as a user would: key files and `verify` under a node's settings.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gossamer::package::{Manifest, Package, SecretKey, hex, target};

const GSM: &str = env!("CARGO_BIN_EXE_gsm");

/// Long enough for a loaded 2-core machine, short enough to fail a hung test soon.
const DEADLINE: Duration = Duration::from_secs(30);

/// Runs `gsm package ARGS` with `env` added (and every GSM_ variable of the test's own
/// environment removed), within [`DEADLINE`].
fn gsm_package(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(GSM);
    command
        .arg("package")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("GSM_")) {
        command.env_remove(name);
    }
    command.envs(env.iter().copied());
    let mut child = command.spawn().expect("start gsm");
    let started = Instant::now();
    while child.try_wait().expect("wait for gsm").is_none() {
        if started.elapsed() > DEADLINE {
            child.kill().ok();
            panic!("gsm package {args:?} did not end within {DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("gsm's output")
}

/// A scratch directory of this test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("gsm-package-{test}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn keygen_adds_the_extensions_to_the_whole_name() {
    let dir = Scratch::new("dotted");
    let out = gsm_package(&["keygen", arg(&dir.path("team.v2"))], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(dir.path("team.v2.key").exists() && dir.path("team.v2.pub").exists());
    assert!(
        !dir.path("team.key").exists(),
        "keygen team.v2 wrote team.key"
    );
    let public = std::fs::read_to_string(dir.path("team.v2.pub")).unwrap();
    assert_eq!(public.trim(), text(&out.stdout).trim());
}

#[test]
fn keygen_never_writes_through_a_link() {
    let dir = Scratch::new("link");
    std::os::unix::fs::symlink(dir.path("elsewhere"), dir.path("team.pub")).unwrap();
    let out = gsm_package(&["keygen", arg(&dir.path("team"))], &[]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "keygen wrote through team.pub");
    assert!(stderr.contains("team.pub"), "{stderr}");
    assert!(
        !dir.path("elsewhere").exists(),
        "the link's target was written"
    );
    assert!(
        !dir.path("team.key").exists(),
        "a secret without its public key is left"
    );
}

/// A package of a few bytes (no library a node would load), version 1.2.3, signed.
fn small_package(dir: &Scratch) -> (PathBuf, String) {
    let key = SecretKey::generate().unwrap();
    let manifest = Manifest {
        name: "small".into(),
        version: "1.2.3".parse().unwrap(),
        abi: gossamer_package_abi(),
        target: target(),
        library_blake3: [0; 32],
        library_len: 0,
        exports: vec![],
        needed: vec![],
        on_load: false,
        signer: [0; 32],
    };
    let package = Package::signed(manifest, vec![0; 300], &key);
    let path = dir.path("small.gpkg");
    std::fs::write(&path, package.to_bytes()).unwrap();
    (path, hex(&key.public()))
}

fn gossamer_package_abi() -> u32 {
    // The ABI the package's manifest must name to get past that check to the ones tested.
    let key = SecretKey::generate().unwrap();
    let probe = Manifest {
        name: String::new(),
        version: "0.0.0".parse().unwrap(),
        abi: 0,
        target: target(),
        library_blake3: [0; 32],
        library_len: 0,
        exports: vec![],
        needed: vec![],
        on_load: false,
        signer: [0; 32],
    };
    let policy = gossamer::package::Policy {
        trusted: vec![key.public()],
        max_package: 1 << 20,
        min_versions: vec![],
    };
    match Package::signed(probe, vec![], &key).verify(&policy) {
        Err(gossamer::package::PackageError::Abi { ours, .. }) => ours,
        other => panic!("expected an ABI refusal, got {other:?}"),
    }
}

#[test]
fn verify_applies_the_limits_a_node_would() {
    let dir = Scratch::new("verify");
    let (package, public) = small_package(&dir);
    let trusted = ("GSM_TRUSTED_KEYS", public.as_str());
    // Signed and trusted: only the library (no ELF file) is refused.
    let out = gsm_package(&["verify", arg(&package)], &[trusted]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success() && stderr.contains("ELF"), "{stderr}");
    // Larger than the node's GSM_MAX_PACKAGE.
    let out = gsm_package(
        &["verify", arg(&package)],
        &[trusted, ("GSM_MAX_PACKAGE", "100")],
    );
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("GSM_MAX_PACKAGE = 100"),
        "{stderr}"
    );
    // Below the node's GSM_PACKAGE_MIN_VERSIONS for its name.
    let out = gsm_package(
        &["verify", arg(&package)],
        &[trusted, ("GSM_PACKAGE_MIN_VERSIONS", "small=2.0.0")],
    );
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("older than 2.0.0"),
        "{stderr}"
    );
    // The command line's floor for a name replaces the environment's.
    let out = gsm_package(
        &["verify", arg(&package), "--min-version", "small=1.0.0"],
        &[trusted, ("GSM_PACKAGE_MIN_VERSIONS", "small=2.0.0")],
    );
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("ELF") && !stderr.contains("older"),
        "{stderr}"
    );
}
