//! `gsm package`: make, sign and check code packages (see `gossamer::package`).

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use gossamer::package::{self, Package, Policy, SecretKey, hex, unhex};

/// What `gsm package` does.
#[derive(clap::Subcommand)]
pub(crate) enum Options {
    /// Make a signing key: NAME.key (the secret, mode 0600) and NAME.pub (the public key,
    /// which nodes list in GSM_TRUSTED_KEYS); prints the public key.
    Keygen {
        /// Path of the key files, without extension.
        name: PathBuf,
    },
    /// Package a library built with gossamer-package (a cdylib), signed: reads its
    /// descriptor for the manifest (this maps the library here, so its initializers run:
    /// package only code you built), checks its ELF as a node will.
    Build {
        /// The library, e.g. target/release/libmy_package.so.
        library: PathBuf,
        /// The signing key (NAME.key from `gsm package keygen`).
        #[arg(long)]
        key: PathBuf,
        /// Where to write the package.
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Sign a package again with another key (its id changes with the signer).
    Sign {
        /// The package.
        package: PathBuf,
        /// The signing key.
        #[arg(long)]
        key: PathBuf,
        /// Where to write the signed package (default: over the input).
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Print a package's manifest and id, trusting nothing.
    Inspect {
        /// The package.
        package: PathBuf,
    },
    /// Check a package as a node would before loading it (signature, hashes, ABI, target,
    /// ELF), without loading it. Keys come from --trusted and GSM_TRUSTED_KEYS.
    Verify {
        /// The package.
        package: PathBuf,
        /// A trusted public key (64 hex digits); repeatable.
        #[arg(long)]
        trusted: Vec<String>,
        /// The lowest version that passes: NAME=MAJOR.MINOR.PATCH; repeatable.
        #[arg(long = "min-version")]
        min_versions: Vec<String>,
    },
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    match options {
        Options::Keygen { name } => keygen(name),
        Options::Build { library, key, out } => {
            let key = read_key(key)?;
            let bytes =
                std::fs::read(library).with_context(|| format!("reading {}", library.display()))?;
            let package = package::build(bytes, &key)
                .with_context(|| format!("packaging {}", library.display()))?;
            write_package(&package, out)?;
            let m = package.manifest();
            println!(
                "{} {} ({} exports, {} bytes) → {}, id {}",
                m.name,
                m.version,
                m.exports.len(),
                std::fs::metadata(out)?.len(),
                out.display(),
                package.id()
            );
            Ok(())
        }
        Options::Sign { package, key, out } => {
            let key = read_key(key)?;
            let signed = open(package)?.sign(&key);
            let out = out.as_deref().unwrap_or(package);
            write_package(&signed, out)?;
            println!(
                "signed by {} → {}, id {}",
                hex(&key.public()),
                out.display(),
                signed.id()
            );
            Ok(())
        }
        Options::Inspect { package } => {
            let p = open(package)?;
            let m = p.manifest();
            println!("package   {} {}", m.name, m.version);
            println!("id        {:?}", p.id());
            println!("signed    {}", if p.is_signed() { "yes" } else { "no" });
            println!("signer    {}", hex(&m.signer));
            println!("abi       {}", m.abi);
            println!("target    {}", m.target);
            println!(
                "library   {} bytes, blake3 {}",
                m.library_len,
                hex(&m.library_blake3)
            );
            println!("needs     {}", m.needed.join(", "));
            println!("on_load   {}", if m.on_load { "yes" } else { "no" });
            for e in &m.exports {
                println!(
                    "export    {:?} {:?} fingerprint {:016x}",
                    e.name, e.kind, e.fingerprint
                );
            }
            Ok(())
        }
        Options::Verify {
            package,
            trusted,
            min_versions,
        } => {
            let p = open(package)?;
            let mut keys = Vec::new();
            let from_env = std::env::var("GSM_TRUSTED_KEYS").unwrap_or_default();
            for k in trusted
                .iter()
                .map(String::as_str)
                .chain(from_env.split([',', ' ']))
            {
                if k.is_empty() {
                    continue;
                }
                keys.push(unhex(k).with_context(|| format!("{k:?} is not a public key"))?);
            }
            let mut floors = Vec::new();
            for entry in min_versions {
                let (name, version) = entry
                    .split_once('=')
                    .with_context(|| format!("{entry:?}: expected NAME=MAJOR.MINOR.PATCH"))?;
                floors.push((
                    name.to_owned(),
                    version.parse().map_err(anyhow::Error::msg)?,
                ));
            }
            let policy = Policy {
                trusted: keys,
                max_package: usize::MAX,
                min_versions: floors,
            };
            p.verify(&policy)
                .with_context(|| format!("{} does not verify", package.display()))?;
            println!("{}: ok, id {}", package.display(), p.id());
            Ok(())
        }
    }
}

fn keygen(name: &Path) -> anyhow::Result<()> {
    let key = SecretKey::generate()?;
    let secret = name.with_extension("key");
    let public = name.with_extension("pub");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&secret)
        .with_context(|| {
            format!(
                "creating {} (an existing key is never overwritten)",
                secret.display()
            )
        })?;
    writeln!(file, "{}", key.to_hex())?;
    std::fs::write(&public, format!("{}\n", hex(&key.public())))
        .with_context(|| format!("writing {}", public.display()))?;
    println!("{}", hex(&key.public()));
    Ok(())
}

/// A key file, refused if others may read it.
fn read_key(path: &Path) -> anyhow::Result<SecretKey> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "{} has mode {mode:o}: a signing key must be readable by its owner only (chmod 600)",
            path.display()
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(SecretKey::from_hex(&text)?)
}

fn open(path: &Path) -> anyhow::Result<Package> {
    Package::open(path).with_context(|| format!("reading {}", path.display()))
}

fn write_package(package: &Package, out: &Path) -> anyhow::Result<()> {
    std::fs::write(out, package.to_bytes()).with_context(|| format!("writing {}", out.display()))
}
