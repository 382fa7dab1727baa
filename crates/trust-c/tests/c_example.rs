//! The C program `c/counter_table.c`, built with `cc` against this build's `libtrust_c.a` and
//! the generated header, runs its example: each way of sharing its structures, every result
//! checked, and the API's errors.

use std::path::PathBuf;
use std::process::Command;

/// The directory cargo put this build's libraries in (`target/<profile>`).
fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/c_example-<hash>
    exe.parent()
        .and_then(|deps| deps.parent())
        .expect("the test runs from target/<profile>/deps")
        .to_path_buf()
}

#[test]
fn the_c_example_runs_and_checks_itself() {
    let dir = build_dir();
    let library = [dir.join("libtrust_c.a"), dir.join("deps/libtrust_c.a")]
        .into_iter()
        .find(|p| p.exists())
        .expect("cargo builds libtrust_c.a with this crate's tests");
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let program = dir.join("counter_table-test");
    let out = Command::new("cc")
        .args(["-O1", "-g", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg("-o")
        .arg(&program)
        .arg(crate_dir.join("c/counter_table.c"))
        .arg(&library)
        .args(["-lpthread", "-ldl", "-lm"])
        .output()
        .expect("running cc (a C compiler is needed: Debian's build-essential)");
    assert!(
        out.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&program)
        .arg("example")
        .output()
        .expect("running the C example");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.lines().last() == Some("ok"),
        "the C example failed ({}): {stdout}{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("table under apply_then: 1000 operations"));
}
