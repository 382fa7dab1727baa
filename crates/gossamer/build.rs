//! With the `ucx` feature, compiles the UCX shim against the system's UCX headers and links
//! UCX (its include and library paths from pkg-config's `ucx.pc` where it exists, else the
//! compiler's own).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    #[cfg(feature = "ucx")]
    ucx();
}

#[cfg(feature = "ucx")]
fn ucx() {
    let shim = "src/transport/ucx/shim.c";
    println!("cargo::rerun-if-changed={shim}");
    let mut build = cc::Build::new();
    build.file(shim).warnings(true).warnings_into_errors(true);
    let pkg = std::process::Command::new("pkg-config")
        .args(["--cflags", "--libs", "ucx"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_default();
    for flag in pkg.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-I") {
            build.include(dir);
        } else if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo::rustc-link-search=native={dir}");
        }
    }
    build.compile("gossamer_ucx_shim");
    // After the shim, which uses them: the linker resolves left to right.
    for lib in ["ucp", "ucs"] {
        println!("cargo::rustc-link-lib={lib}");
    }
}
