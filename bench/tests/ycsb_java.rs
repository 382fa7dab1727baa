//! `bench::ycsb::generators` against YCSB 0.17.0's own Java generators.
//!
//! `bench/java/YcsbGenerators.java` runs the real classes from `core-0.17.0.jar` and prints hashes,
//! keys and zeta sums, which must equal ours bit for bit, and histograms of each sampler, which
//! must pass a two-sample chi-square test against ours. The same test must also reject samplers
//! that are slightly wrong, so that a comparison which cannot fail does not pass unnoticed.
//!
//! The jar is `$YCSB_CORE_JAR`, else `target/ycsb/core-0.17.0.jar` (`scripts/test.sh` downloads
//! it). Without the jar or a JDK the test skips, loudly, unless `YCSB_REQUIRE_JAVA=1`.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bench::ycsb::generators::{ScrambledZipfian, SkewedLatest, Zipfian, fnvhash64, key_name, zeta};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Zipf};

/// Samples per histogram: enough that a skew of 0.9 for 0.99 fails by far.
const SAMPLES: usize = 200_000;

/// Keys in each histogram's range (the Java driver's `ITEMS`).
const ITEMS: u64 = 1000;

/// How long javac or java may take before the test gives up on it.
const DEADLINE: Duration = Duration::from_secs(120);

/// The chance that a correct generator fails one comparison.
const FALSE_ALARM: f64 = 1e-6;

/// The standard normal's upper `FALSE_ALARM` quantile, Φ⁻¹(1 − 10⁻⁶).
const Z_FALSE_ALARM: f64 = 4.753_424_308_817_089;

/// A merged bin must hold at least this many samples of both runs together, so that the
/// chi-square approximation holds.
const MIN_BIN: u64 = 20;

type Histogram = BTreeMap<i64, u64>;

/// What the Java driver printed.
#[derive(Default)]
struct JavaOutput {
    fnv: Vec<(i64, i64)>,
    keys: Vec<(u64, String)>,
    zeta: Vec<(u64, u64)>,
    hist: HashMap<String, Histogram>,
}

#[test]
fn generators_match_ycsb() {
    let Some(java) = run_java() else { return };

    assert!(java.fnv.len() >= 10, "too few fnvhash64 lines");
    for &(input, hash) in &java.fnv {
        assert_eq!(fnvhash64(input), hash, "fnvhash64({input})");
    }
    assert!(!java.keys.is_empty(), "no key lines");
    for (keynum, key) in &java.keys {
        assert_eq!(&key_name(*keynum), key, "key_name({keynum})");
    }
    assert!(
        java.zeta.iter().any(|&(n, _)| n == 1_000_000),
        "no zeta of a million items"
    );
    for &(n, bits) in &java.zeta {
        let ours = zeta(n, 0.99);
        assert_eq!(
            ours.to_bits(),
            bits,
            "zeta({n}): ours {ours}, Java's {}",
            f64::from_bits(bits)
        );
    }

    let mut rng = StdRng::seed_from_u64(0x5eed_7c5b);
    let hist = |name: &str| {
        java.hist
            .get(name)
            .unwrap_or_else(|| panic!("the Java driver printed no {name} histogram"))
    };

    let mut scrambled = ScrambledZipfian::new(0, ITEMS - 1);
    let ours = sample(|| scrambled.next(&mut rng));
    assert_same("scrambled", &ours, hist("scrambled"));

    let mut latest = SkewedLatest::new(ITEMS - 1);
    let ours = sample(|| latest.next(ITEMS - 1, &mut rng));
    assert_same("latest", &ours, hist("latest"));

    let mut zipfian = Zipfian::new(0, ITEMS - 1);
    let ours = sample(|| zipfian.next(&mut rng));
    assert_same("zipfian", &ours, hist("zipfian"));

    let mut grown = Zipfian::new(0, ITEMS / 2 - 1);
    let ours = sample(|| grown.next_long(ITEMS, &mut rng));
    assert_same("grown", &ours, hist("grown"));

    // The test can fail: near misses are rejected.
    let zipf = Zipf::new(1e10, 0.9).unwrap();
    let wrong = sample(|| fnvhash64(zipf.sample(&mut rng) as i64 - 1) as u64 % ITEMS);
    assert_differ(
        "scrambled, exact zipf of skew 0.9",
        &wrong,
        hist("scrambled"),
    );
    let mut unscrambled = Zipfian::new(0, ITEMS - 1);
    let wrong = sample(|| unscrambled.next(&mut rng));
    assert_differ("scrambled, unscrambled", &wrong, hist("scrambled"));
    // The counter's next value taken for its last one: every key one higher.
    let mut off_by_one = SkewedLatest::new(ITEMS);
    let wrong = sample(|| off_by_one.next(ITEMS, &mut rng));
    assert_differ("latest, from the next key", &wrong, hist("latest"));
    let mut fresh = Zipfian::new(0, ITEMS - 1);
    let wrong = sample(|| fresh.next(&mut rng));
    assert_differ("grown, with eta of the grown count", &wrong, hist("grown"));
}

/// `SAMPLES` draws of `draw`, counted by value.
fn sample(mut draw: impl FnMut() -> u64) -> Histogram {
    let mut hist = Histogram::new();
    for _ in 0..SAMPLES {
        *hist.entry(draw() as i64).or_default() += 1;
    }
    hist
}

/// Fails unless the two histograms could come from one distribution.
fn assert_same(name: &str, ours: &Histogram, java: &Histogram) {
    let (stat, critical, df) = chi_square(ours, java);
    eprintln!("{name}: chi-square {stat:.1} on {df} degrees of freedom, critical {critical:.1}");
    assert!(
        stat < critical,
        "{name}: our histogram differs from YCSB's: chi-square {stat:.1} on {df} degrees of \
         freedom, above {critical:.1} (false-alarm rate {FALSE_ALARM})"
    );
}

/// Fails if the comparison cannot tell a wrong generator from YCSB's.
fn assert_differ(name: &str, wrong: &Histogram, java: &Histogram) {
    let (stat, critical, df) = chi_square(wrong, java);
    eprintln!(
        "{name} (must fail): chi-square {stat:.1} on {df} degrees of freedom, critical {critical:.1}"
    );
    assert!(
        stat >= critical,
        "{name}: the comparison passed a wrong generator (chi-square {stat:.1} on {df} degrees of \
         freedom, below {critical:.1}), so it cannot be trusted to catch a wrong one"
    );
}

/// The two-sample chi-square statistic of `a` and `b`, its critical value at `FALSE_ALARM`, and
/// its degrees of freedom.
///
/// Bins are merged in key order until each holds `MIN_BIN` samples of both together (a short
/// tail joins the last bin). With totals `n` and `m`, the statistic is
/// `Σ (a·√(m/n) − b·√(n/m))² / (a + b)` over the merged bins, chi-square with one degree of
/// freedom fewer than there are bins when both come from one distribution.
fn chi_square(a: &Histogram, b: &Histogram) -> (f64, f64, usize) {
    let keys: BTreeMap<i64, (u64, u64)> = a
        .keys()
        .chain(b.keys())
        .map(|&k| {
            (
                k,
                (
                    a.get(&k).copied().unwrap_or(0),
                    b.get(&k).copied().unwrap_or(0),
                ),
            )
        })
        .collect();
    let mut bins: Vec<(u64, u64)> = Vec::new();
    let mut open = (0, 0);
    for &(x, y) in keys.values() {
        open = (open.0 + x, open.1 + y);
        if open.0 + open.1 >= MIN_BIN {
            bins.push(open);
            open = (0, 0);
        }
    }
    match bins.last_mut() {
        Some(last) => *last = (last.0 + open.0, last.1 + open.1),
        None => bins.push(open),
    }
    let n: u64 = bins.iter().map(|b| b.0).sum();
    let m: u64 = bins.iter().map(|b| b.1).sum();
    let (ka, kb) = ((m as f64 / n as f64).sqrt(), (n as f64 / m as f64).sqrt());
    let stat = bins
        .iter()
        .map(|&(x, y)| (x as f64 * ka - y as f64 * kb).powi(2) / (x + y) as f64)
        .sum();
    let df = bins.len().saturating_sub(1).max(1);
    (stat, chi_square_quantile(df), df)
}

/// The chi-square distribution's upper `FALSE_ALARM` quantile with `df` degrees of freedom, by
/// Wilson and Hilferty's approximation: `(X/df)^(1/3)` is nearly normal with mean `1 − 2/(9·df)`
/// and variance `2/(9·df)`. Good to a few parts in a thousand at the hundreds of degrees of
/// freedom here.
fn chi_square_quantile(df: usize) -> f64 {
    let v = 2.0 / (9.0 * df as f64);
    df as f64 * (1.0 - v + Z_FALSE_ALARM * v.sqrt()).powi(3)
}

/// Compiles and runs the Java driver, or says why it cannot (`None`: skipped).
fn run_java() -> Option<JavaOutput> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let jar = std::env::var_os("YCSB_CORE_JAR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../target/ycsb/core-0.17.0.jar"));
    let mut missing = Vec::new();
    if !jar.is_file() {
        missing.push(format!(
            "YCSB's jar at {} (set YCSB_CORE_JAR, or download \
             https://repo1.maven.org/maven2/site/ycsb/core/0.17.0/core-0.17.0.jar there; \
             scripts/test.sh does)",
            jar.display()
        ));
    }
    let tools: Vec<&str> = ["javac", "java"]
        .into_iter()
        .filter(|tool| !on_path(tool))
        .collect();
    if !tools.is_empty() {
        missing.push(format!(
            "{} on the PATH (a JDK 17 or later, e.g. Debian's openjdk-17-jdk-headless)",
            tools.join(" and ")
        ));
    }
    if !missing.is_empty() {
        let what = missing.join("; and ");
        if std::env::var_os("YCSB_REQUIRE_JAVA").is_some_and(|v| v == "1") {
            panic!("YCSB_REQUIRE_JAVA=1 but the comparison with YCSB needs {what}");
        }
        // Straight to stderr: the test harness keeps `eprintln!` of passing tests to itself.
        let note =
            format!("\n*** ycsb_java skipped: no comparison with YCSB, missing {what} ***\n\n");
        std::io::stderr().write_all(note.as_bytes()).ok();
        return None;
    }

    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let scratch =
        Scratch(std::env::temp_dir().join(format!("ycsb-java-{}-{nanos}", std::process::id())));
    let dir = scratch.0.as_path();
    std::fs::create_dir_all(dir).unwrap();
    let source = manifest.join("java/YcsbGenerators.java");
    let classpath = std::env::join_paths([jar.as_path(), dir]).unwrap();
    // Both runs are short: the JIT's first tier alone and the serial collector take about half
    // the time off each (flags other JVMs do not know are ignored).
    let quick = [
        "-XX:+IgnoreUnrecognizedVMOptions",
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
    ];
    run(
        Command::new("javac")
            .args(quick.map(|flag| format!("-J{flag}")))
            .arg("-cp")
            .arg(&jar)
            .arg("-d")
            .arg(dir)
            .arg(&source),
        dir,
        "javac of bench/java/YcsbGenerators.java",
    );
    let out = run(
        Command::new("java")
            .args(quick)
            .arg("-cp")
            .arg(&classpath)
            .arg("YcsbGenerators")
            .arg(SAMPLES.to_string()),
        dir,
        "java YcsbGenerators",
    );
    Some(parse(&out))
}

/// The driver's class files and output, removed however the test ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// Whether `tool` is a file in one of the PATH's directories: a look, where running
/// `javac -version` would cost half a second.
fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// Runs `command` with its output in files under `dir`, killing it at the deadline; its stdout.
fn run(command: &mut Command, dir: &Path, what: &str) -> String {
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let child = command
        .stdin(Stdio::null())
        .stdout(File::create(&out).unwrap())
        .stderr(File::create(&err).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let status = wait(child, what);
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(status.success(), "{what} failed ({status}):\n{stderr}");
    std::fs::read_to_string(&out).unwrap()
}

/// Waits for `child` until the deadline, then kills it and fails.
fn wait(mut child: std::process::Child, what: &str) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > DEADLINE {
            child.kill().ok();
            child.wait().ok();
            panic!("{what} did not finish within {DEADLINE:?}; killed it");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads the driver's output (format in `YcsbGenerators.java`).
fn parse(out: &str) -> JavaOutput {
    let mut java = JavaOutput::default();
    let mut ended = false;
    for line in out.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| -> i64 {
            fields[i]
                .parse()
                .unwrap_or_else(|e| panic!("bad number in {line:?}: {e}"))
        };
        match fields[..] {
            ["fnv", _, _] => java.fnv.push((num(1), num(2))),
            ["key", _, key] => java.keys.push((num(1) as u64, key.to_owned())),
            ["zeta", _, _] => java.zeta.push((num(1) as u64, num(2) as u64)),
            ["hist", name, _, _] => {
                java.hist
                    .entry(name.to_owned())
                    .or_default()
                    .insert(num(2), num(3) as u64);
            }
            ["end"] => ended = true,
            _ => panic!("unexpected line from the Java driver: {line:?}"),
        }
    }
    assert!(ended, "the Java driver's output stops before `end`:\n{out}");
    for (name, hist) in &java.hist {
        let total: u64 = hist.values().sum();
        assert_eq!(
            total, SAMPLES as u64,
            "Java's {name} histogram holds {total} samples"
        );
    }
    java
}
