//! Runs the benchmark suite without the `gsm` binary: `cargo run --release -p bench --example bench -- faa`.

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    bench::cli(&args)
}
