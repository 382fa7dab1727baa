//! Code packages: functions and states in a signed shared library, loaded by running nodes
//! and called by name (the seed's *rieds* and *jams*, without its unauthenticated code path).
//!
//! A package is a `cdylib` written with the `gossamer-package` SDK and a signed manifest, in
//! one file ([`Package`]). `gsm package keygen|build|sign|inspect|verify` make and check them.
//! A node's first call to another node carries the package; the node verifies it, loads it,
//! and later calls carry only its id ([`PackageId`]) and the export's index. Calls are pinned
//! to an id: two versions of a package coexist, and a changed function is a new id, never a
//! stale one under the same name.
//!
//! # What is checked, before anything of the package runs
//! `dlopen` runs a library's initializers, so every check comes first:
//! 1. Loading is off unless trusted keys are set (`GSM_TRUSTED_KEYS`, or
//!    [`Rack::trust_package_key`](crate::Rack::trust_package_key)).
//! 2. The file fits `GSM_MAX_PACKAGE` ([`Package::open`] reads no more, and only a regular
//!    file); its signer is a trusted key; the Ed25519 signature (strict verification) over
//!    the manifest holds; the id is the one the caller named; the package ABI and target are
//!    this node's; the version is not below `GSM_PACKAGE_MIN_VERSIONS` for its name.
//! 3. The library's bytes go into a memfd that is sealed against any change; what the sealed
//!    file holds is then checked (`load`): its BLAKE3 and length are the manifest's, and it
//!    is a shared object for this machine, read as the loader reads it, without writable
//!    code, an executable stack, search paths, filters or any dynamic tag not on an
//!    allow-list, needing only the C runtime (libc, libm, libgcc_s, this architecture's
//!    dynamic loader) at symbol versions this system has, and exporting the descriptor
//!    (`elf` says exactly what is and is not checked).
//! 4. `dlopen` maps that sealed file: what was checked is what loads. The descriptor must
//!    then say what the manifest says, with no two exports of one kind and name (`load`).
//! 5. A package is never unloaded; a process loads at most 64.
//!
//! # What is not
//! Memory safety, correctness and termination of the package's code. A signed package has
//! its node's full power: the signature says who built it, not what it does. Sign only code
//! you would link into the program itself, and keep the signing key as you would a deploy key.
//! Code is never injected into messages as in the seed (that needs writable, executable
//! memory and cannot be checked).

mod elf;
mod file;
mod load;
mod remote;

use std::fmt;

pub use file::{
    ExportEntry, ExportKind, Manifest, Package, PackageId, Policy, SecretKey, Version, hex, target,
    unhex,
};
pub use remote::PkgTrust;

pub(crate) use remote::builtins;
#[cfg(feature = "fuzzing")]
pub(crate) use remote::pretend_loaded;

#[cfg(feature = "fuzzing")]
pub(crate) use file::check_file;

/// Why a package was not loaded or called.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum PackageError {
    /// This node trusts no key, so it loads no package.
    NotEnabled,
    /// The file is larger than `GSM_MAX_PACKAGE`.
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// Not a package file, or a truncated one.
    Malformed(String),
    /// The package carries no signature.
    Unsigned,
    /// Its signer is not one of this node's trusted keys.
    UntrustedKey {
        /// The signer's public key, in hex.
        signer: String,
    },
    /// The signature does not hold over the manifest.
    BadSignature,
    /// The library is not the one the manifest hashes.
    HashMismatch,
    /// The package is not the one the caller named.
    IdMismatch {
        /// The id named.
        expected: PackageId,
        /// The package's.
        found: PackageId,
    },
    /// Built for another package ABI.
    Abi {
        /// The package's.
        theirs: u32,
        /// This node's.
        ours: u32,
    },
    /// Built for another target.
    Target {
        /// The package's.
        theirs: String,
        /// This node's.
        ours: String,
    },
    /// Older than the lowest version this node loads of that name.
    Downgrade {
        /// The package's name.
        name: String,
        /// Its version.
        version: Version,
        /// The lowest this node loads.
        min: Version,
    },
    /// The library's ELF fails a check.
    Elf(String),
    /// `dlopen` or `dlsym` failed.
    Load(String),
    /// The library's descriptor does not say what the manifest says.
    Descriptor(String),
    /// The package's `on_load` failed.
    OnLoad(String),
    /// This process has loaded as many packages as it may.
    TooMany {
        /// The limit.
        limit: usize,
    },
    /// The package has no such export (of that kind).
    NoSuchExport {
        /// The package's name.
        package: String,
        /// The name asked for.
        name: String,
        /// Its exports of that kind.
        has: Vec<String>,
    },
    /// The export takes or returns other types than the call's.
    SignatureMismatch {
        /// The export.
        export: String,
        /// The call's fingerprint.
        ours: u64,
        /// The export's.
        theirs: u64,
    },
    /// The node has not loaded the package (it restarted since?): the caller sends it again.
    Missing(PackageId),
    /// The argument did not decode in the package.
    BadArgument(String),
    /// Reading or writing a file.
    Io(String),
}

impl fmt::Display for PackageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use PackageError::*;
        match self {
            NotEnabled => write!(
                f,
                "loading code packages is off on this node: set GSM_TRUSTED_KEYS to the public \
                 keys (hex, comma-separated) whose packages it may load"
            ),
            TooLarge { len, limit } => {
                write!(
                    f,
                    "the package is {len} bytes, more than GSM_MAX_PACKAGE = {limit}"
                )
            }
            Malformed(why) => write!(f, "malformed package: {why}"),
            Unsigned => write!(
                f,
                "the package is not signed: sign it with `gsm package sign`"
            ),
            UntrustedKey { signer } => write!(
                f,
                "the package is signed by {signer}, which is not in GSM_TRUSTED_KEYS"
            ),
            BadSignature => write!(f, "the package's signature does not verify"),
            HashMismatch => write!(f, "the library is not the one the manifest hashes"),
            IdMismatch { expected, found } => {
                write!(f, "expected package {expected}, received package {found}")
            }
            Abi { theirs, ours } => write!(
                f,
                "the package is for package ABI {theirs}, this node speaks {ours}: rebuild it \
                 with this gossamer-package"
            ),
            Target { theirs, ours } => {
                write!(f, "the package is built for {theirs}, this node is {ours}")
            }
            Downgrade { name, version, min } => write!(
                f,
                "{name} {version} is older than {min}, the lowest this node loads \
                 (GSM_PACKAGE_MIN_VERSIONS)"
            ),
            Elf(why) => write!(f, "the package's library is refused: {why}"),
            Load(why) => write!(f, "the package's library does not load: {why}"),
            Descriptor(why) => {
                write!(
                    f,
                    "the package's descriptor contradicts its manifest: {why}"
                )
            }
            OnLoad(why) => write!(f, "the package's on_load failed: {why}"),
            TooMany { limit } => write!(
                f,
                "this process loaded {limit} packages, as many as it may (they are never \
                 unloaded)"
            ),
            NoSuchExport { package, name, has } => {
                write!(
                    f,
                    "package {package} has no export {name:?} of that kind (it has {has:?})"
                )
            }
            SignatureMismatch {
                export,
                ours,
                theirs,
            } => write!(
                f,
                "export {export:?} has fingerprint {theirs:016x}, the call's types \
                 {ours:016x}: the types differ from the package's"
            ),
            Missing(id) => write!(f, "the node has not loaded package {id}"),
            BadArgument(why) => write!(f, "the package refused the argument: {why}"),
            Io(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for PackageError {}

/// Builds a package of the library bytes `library` (a `cdylib` made with `gossamer-package`),
/// signed with `key`: checks its ELF as a node would, reads its descriptor for the manifest
/// and signs that. What `gsm package build` does.
///
/// The library is mapped into this process to read its descriptor (never to be unloaded), so
/// its initializers run here: build only a library you built yourself.
///
/// # Errors
/// The library fails an ELF check, or has no valid descriptor.
pub fn build(library: Vec<u8>, key: &SecretKey) -> Result<Package, PackageError> {
    let (described, inspected) = load::describe(&library)?;
    let manifest = Manifest {
        name: described.name,
        version: described.version,
        abi: gossamer_package::PACKAGE_ABI,
        target: target(),
        library_blake3: [0; 32],
        library_len: 0,
        exports: described.exports,
        needed: inspected.needed,
        on_load: described.on_load,
        signer: [0; 32],
    };
    Ok(Package::signed(manifest, library, key))
}

/// The policy of this node's rack: its trusted keys and limits.
pub(crate) fn policy() -> Policy {
    let state = crate::state::current().expect("a package call outside a rack");
    Policy::from_settings(&state.settings)
}

impl Policy {
    /// The policy `settings` give a node: `GSM_TRUSTED_KEYS` (and keys a program added with
    /// [`Rack::trust_package_key`](crate::Rack::trust_package_key)), `GSM_MAX_PACKAGE` and
    /// `GSM_PACKAGE_MIN_VERSIONS`.
    ///
    /// ```
    /// use gossamer::env::Settings;
    /// use gossamer::package::Policy;
    ///
    /// let vars = [("GSM_MAX_PACKAGE", "1MiB"), ("GSM_PACKAGE_MIN_VERSIONS", "demo=2.0.0")];
    /// let get = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string());
    /// let policy = Policy::from_settings(&Settings::from_vars(get)?);
    /// assert_eq!(policy.max_package, 1 << 20);
    /// assert_eq!(policy.min_versions[0].0, "demo");
    /// assert!(policy.trusted.is_empty(), "no key: loading is off");
    /// # Ok::<(), gossamer::env::EnvError>(())
    /// ```
    pub fn from_settings(settings: &crate::env::Settings) -> Policy {
        Policy {
            trusted: settings.trusted_keys.clone(),
            max_package: settings.max_package,
            min_versions: settings
                .min_versions
                .iter()
                .map(|(name, [major, minor, patch])| {
                    let version = Version {
                        major: *major,
                        minor: *minor,
                        patch: *patch,
                    };
                    (name.clone(), version)
                })
                .collect(),
        }
    }

    /// The policy of this process: its rack node's, when it runs one; otherwise the one the
    /// environment gives a node ([`Policy::from_settings`] of
    /// [`Settings::from_env`](crate::env::Settings::from_env)).
    ///
    /// # Errors
    /// Outside a rack, an environment variable a node would refuse ([`PackageError::Io`]
    /// names it).
    pub fn current() -> Result<Policy, PackageError> {
        if let Some(state) = crate::state::current() {
            return Ok(Policy::from_settings(&state.settings));
        }
        crate::env::Settings::from_env()
            .map(|settings| Policy::from_settings(&settings))
            .map_err(|e| PackageError::Io(format!("the environment: {e}")))
    }
}
