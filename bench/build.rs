//! Records the compiler version so result files can name the toolchain that built the benchmarks,
//! and generates the gRPC service of the `rack` experiment's tonic baseline.

use std::process::Command;

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=BENCH_RUSTC_VERSION={version}");
    // The profile's directory (`OUT_DIR` is `<target>/<profile>/build/<unit>/out`): `PROFILE`
    // says `release` for the `smoke` profile too, whose headers should name it.
    let profile = std::env::var("OUT_DIR")
        .ok()
        .and_then(|out| {
            let dir = std::path::Path::new(&out).ancestors().nth(3)?.file_name()?;
            Some(dir.to_string_lossy().into_owned())
        })
        .or_else(|| std::env::var("PROFILE").ok())
        .unwrap_or_default();
    println!("cargo:rustc-env=BENCH_PROFILE={profile}");
    println!("cargo:rerun-if-env-changed=RUSTC");
    println!("cargo:rerun-if-changed=build.rs");

    // The tonic baseline's service, described in Rust rather than in a .proto file, so the
    // build needs no `protoc`: the messages are hand-derived prost types in `src/rack/grpc.rs`.
    let add = tonic_build::manual::Method::builder()
        .name("add")
        .route_name("Add")
        .input_type("crate::rack::grpc::AddRequest")
        .output_type("crate::rack::grpc::AddReply")
        .codec_path("tonic_prost::ProstCodec")
        .build();
    let counter = tonic_build::manual::Service::builder()
        .name("Counter")
        .package("rack")
        .method(add)
        .build();
    tonic_build::manual::Builder::new().compile(&[counter]);
}
