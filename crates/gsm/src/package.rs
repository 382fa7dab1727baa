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
    /// Check a package as a node with this environment would before loading it (size,
    /// signature, hashes, ABI, target, version floor, ELF), without loading it:
    /// GSM_TRUSTED_KEYS, GSM_MAX_PACKAGE and GSM_PACKAGE_MIN_VERSIONS apply as on a node;
    /// --trusted adds keys, --min-version sets a name's floor in place of the environment's.
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
            let mut policy = Policy::current()?;
            for k in trusted {
                policy
                    .trusted
                    .push(unhex(k).with_context(|| format!("{k:?} is not a public key"))?);
            }
            for entry in min_versions {
                let (name, version) = entry
                    .split_once('=')
                    .with_context(|| format!("{entry:?}: expected NAME=MAJOR.MINOR.PATCH"))?;
                let version = version.parse().map_err(anyhow::Error::msg)?;
                policy.min_versions.retain(|(n, _)| n != name);
                policy.min_versions.push((name.to_owned(), version));
            }
            p.verify(&policy)
                .with_context(|| format!("{} does not verify", package.display()))?;
            println!("{}: ok, id {}", package.display(), p.id());
            Ok(())
        }
    }
}

fn keygen(name: &Path) -> anyhow::Result<()> {
    let (secret, public) = key_paths(name)?;
    let key = SecretKey::generate()?;
    let create = |path: &Path, mode: u32| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true) // never an existing file, nor through a symbolic link
            .mode(mode)
            .open(path)
            .with_context(|| {
                format!(
                    "creating {} (an existing file or link is never written to)",
                    path.display()
                )
            })
    };
    let mut file = create(&secret, 0o600)?;
    writeln!(file, "{}", key.to_hex())?;
    let written = create(&public, 0o644).and_then(|mut file| {
        writeln!(file, "{}", hex(&key.public()))
            .with_context(|| format!("writing {}", public.display()))
    });
    if let Err(e) = written {
        // The secret alone is of no use, and would stop the next try.
        std::fs::remove_file(&secret).ok();
        return Err(e);
    }
    println!("{}", hex(&key.public()));
    Ok(())
}

/// NAME.key and NAME.pub: the extensions are added to the whole name (`team.v2` gives
/// `team.v2.key`).
fn key_paths(name: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let text = name.as_os_str();
    if name.file_name().is_none() || text.as_encoded_bytes().ends_with(b"/") {
        bail!(
            "{:?} names no file: give the key files' path without extension, e.g. keys/team",
            name.display()
        );
    }
    let with = |extension: &str| {
        let mut path = text.to_owned();
        path.push(extension);
        PathBuf::from(path)
    };
    Ok((with(".key"), with(".pub")))
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
