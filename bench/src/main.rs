//! The benchmark runner: `cargo run --release -p bench -- NAME` runs one experiment, `--list`
//! names them (see `bench/README.md`).

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    bench::cli(&args)
}
