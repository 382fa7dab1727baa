// The demo package's library, built with cargo (shared by the packages test and the unit
// tests of `package::load`, which include this file).

/// Builds the demo package (`packages/demo`; version 2 with `v2`) into
/// `target/test-packages` and returns the library's bytes. Flags meant for the tests' own
/// build (a sanitizer's) are left out: a package is an ordinary release build.
pub(crate) fn demo_library(v2: bool) -> Vec<u8> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = root.join("target/test-packages");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    build
        .current_dir(&root)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .args([
            "build",
            "--quiet",
            "--release",
            "-p",
            "demo-package",
            "--target-dir",
        ])
        .arg(&target);
    if v2 {
        build.args(["--features", "v2"]);
    }
    let status = build.status().expect("run cargo");
    assert!(status.success(), "building the demo package failed");
    std::fs::read(target.join("release/libdemo_package.so")).expect("the built library")
}
