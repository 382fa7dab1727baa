//! The package file: a manifest, its signature and the library, and every check made of them
//! before a byte of the library runs.
//!
//! The file is postcard: `{ magic, manifest: bytes, signature: bytes, library: bytes }`. The
//! manifest travels as its encoded bytes, so that what is signed is exactly what is read. The
//! signature is Ed25519 (`verify_strict`) over [`DOMAIN`] ‖ manifest bytes, and the manifest
//! holds the library's BLAKE3, so the signature covers the library. A package's id is
//! BLAKE3(manifest bytes ‖ library): two builds of one version are two ids.

use std::fmt;
use std::str::FromStr;

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::PackageError;

/// The first bytes of every package file.
const MAGIC: [u8; 8] = *b"GSMPKG\x00\x01";

/// What a signature covers besides the manifest: signatures made for anything else never
/// verify as a package's.
pub(crate) const DOMAIN: &[u8] = b"gossamer package manifest v1\0";

/// A package's id: BLAKE3(manifest bytes ‖ library). `Display` shows the first 8 bytes in hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PackageId(pub [u8; 32]);

impl fmt::Display for PackageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for PackageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PackageId({})", hex(&self.0))
    }
}

/// `MAJOR.MINOR.PATCH`, ordered as numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Version {
    /// Incompatible changes.
    pub major: u32,
    /// Additions.
    pub minor: u32,
    /// Fixes.
    pub patch: u32,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl FromStr for Version {
    type Err = String;

    fn from_str(s: &str) -> Result<Version, String> {
        let parts: Vec<&str> = s.trim().split('.').collect();
        let number = |p: &str| p.parse::<u32>().ok();
        match parts.as_slice() {
            [a, b, c] => match (number(a), number(b), number(c)) {
                (Some(major), Some(minor), Some(patch)) => Ok(Version {
                    major,
                    minor,
                    patch,
                }),
                _ => Err(format!(
                    "{s:?} is not a version: expected MAJOR.MINOR.PATCH"
                )),
            },
            _ => Err(format!(
                "{s:?} is not a version: expected MAJOR.MINOR.PATCH"
            )),
        }
    }
}

/// What an export of a package is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExportKind {
    /// `fn(A) -> R`, no state.
    Function,
    /// A state type, built from an argument (`node.entrust_package`).
    State,
    /// `fn(&mut S, A) -> R` on the state named here.
    Method {
        /// The state's name.
        state: String,
    },
}

/// One export, as the manifest lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportEntry {
    /// Its name (a state's is the state's name).
    pub name: String,
    /// What it is.
    pub kind: ExportKind,
    /// Its fingerprint (`gossamer-schema`), which a call's types must match.
    pub fingerprint: u64,
}

/// What a package says of itself, signed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The package's name.
    pub name: String,
    /// Its version.
    pub version: Version,
    /// The package ABI its library was built for (`gossamer_package::PACKAGE_ABI`).
    pub abi: u32,
    /// The target it runs on, as [`target`] names it.
    pub target: String,
    /// BLAKE3 of the library.
    pub library_blake3: [u8; 32],
    /// The library's length in bytes.
    pub library_len: u64,
    /// Its exports, in the descriptor's order.
    pub exports: Vec<ExportEntry>,
    /// The shared libraries it needs (`DT_NEEDED`).
    pub needed: Vec<String>,
    /// Whether it runs code of its own when loaded (`on_load`).
    pub on_load: bool,
    /// The public key that signs it.
    pub signer: [u8; 32],
}

/// The target this build runs on: architecture, OS and C library, e.g. `x86_64-linux-gnu`.
pub fn target() -> String {
    let env = if cfg!(target_env = "gnu") {
        "gnu"
    } else if cfg!(target_env = "musl") {
        "musl"
    } else {
        "other"
    };
    format!("{}-{}-{env}", std::env::consts::ARCH, std::env::consts::OS)
}

/// The file, as it is written.
#[derive(Serialize, Deserialize)]
struct File {
    magic: [u8; 8],
    #[serde(with = "serde_bytes")]
    manifest: Vec<u8>,
    #[serde(with = "serde_bytes")]
    signature: Vec<u8>,
    #[serde(with = "serde_bytes")]
    library: Vec<u8>,
}

/// A package file, read but not yet trusted: [`Package::verify`] says whether it may load.
#[derive(Clone)]
pub struct Package {
    manifest: Manifest,
    manifest_bytes: Vec<u8>,
    signature: Vec<u8>,
    library: std::sync::Arc<[u8]>,
    id: PackageId,
}

impl fmt::Debug for Package {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Package")
            .field("name", &self.manifest.name)
            .field("version", &self.manifest.version)
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// Who may sign the packages a node loads, and what else it requires of them.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// Public keys whose packages load; none: loading is off.
    pub trusted: Vec<[u8; 32]>,
    /// Largest package file, in bytes.
    pub max_package: usize,
    /// The lowest version of a package name that loads (no downgrade to an old signed build).
    pub min_versions: Vec<(String, Version)>,
}

impl Package {
    /// Reads a package from its file's bytes: structure only, nothing is trusted yet.
    ///
    /// # Errors
    /// [`PackageError::Malformed`] for anything that is not a package file.
    pub fn from_bytes(bytes: &[u8]) -> Result<Package, PackageError> {
        let file: File = postcard::from_bytes(bytes)
            .map_err(|e| PackageError::Malformed(format!("not a package file: {e}")))?;
        if file.magic != MAGIC {
            return Err(PackageError::Malformed(
                "not a gossamer package file (wrong magic)".into(),
            ));
        }
        let manifest: Manifest = postcard::from_bytes(&file.manifest)
            .map_err(|e| PackageError::Malformed(format!("the manifest does not decode: {e}")))?;
        let id = id_of(&file.manifest, &file.library);
        Ok(Package {
            manifest,
            manifest_bytes: file.manifest,
            signature: file.signature,
            library: file.library.into(),
            id,
        })
    }

    /// Reads the package file at `path`: a regular file of at most `GSM_MAX_PACKAGE` bytes
    /// (the [`Policy::current`] limit), since no node would load a larger one.
    ///
    /// # Errors
    /// [`PackageError::TooLarge`] for a larger file; [`PackageError::Io`] when it cannot be
    /// read or is no regular file (a device, a pipe); [`Package::from_bytes`]'s errors.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<Package, PackageError> {
        use std::io::Read as _;
        let path = path.as_ref();
        let limit = Policy::current()?.max_package;
        let io = |e: std::io::Error| PackageError::Io(format!("reading {}: {e}", path.display()));
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(PackageError::Io(format!(
                "{} is not a regular file: a package is read from a file",
                path.display()
            )));
        }
        let too_large = |len: usize| PackageError::TooLarge { len, limit };
        if meta.len() > limit as u64 {
            return Err(too_large(usize::try_from(meta.len()).unwrap_or(usize::MAX)));
        }
        // Bounded again: the file may grow while it is read.
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.take(limit as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() > limit {
            return Err(too_large(bytes.len()));
        }
        Package::from_bytes(&bytes)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let file = File {
            magic: MAGIC,
            manifest: self.manifest_bytes.clone(),
            signature: self.signature.clone(),
            library: self.library.to_vec(),
        };
        postcard::to_allocvec(&file).expect("a package encodes")
    }

    /// The manifest (as the file says: check with [`Package::verify`]).
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The package's id.
    pub fn id(&self) -> PackageId {
        self.id
    }

    /// The library's bytes.
    pub(crate) fn library(&self) -> &[u8] {
        &self.library
    }

    /// Whether the file is signed at all.
    pub fn is_signed(&self) -> bool {
        !self.signature.is_empty()
    }

    /// Checks everything that can be checked before the library is mapped, in the order the
    /// safety model gives: [`verify_manifest`](Package::verify_manifest), then the library
    /// (its hash and length, then its ELF; see `elf`).
    ///
    /// # Errors
    /// The first check that fails, saying what to do.
    pub fn verify(&self, policy: &Policy) -> Result<(), PackageError> {
        self.verify_manifest(policy)?;
        self.verify_library(&self.library)
    }

    /// The checks of [`verify`](Package::verify) that do not read the library: loading on,
    /// size, signer trusted, signature, ABI, target, version floor. A node then checks the
    /// library as the sealed file it maps holds it, not as this package holds it.
    ///
    /// # Errors
    /// The first check that fails, saying what to do.
    pub fn verify_manifest(&self, policy: &Policy) -> Result<(), PackageError> {
        if policy.trusted.is_empty() {
            return Err(PackageError::NotEnabled);
        }
        let len = self.manifest_bytes.len() + self.signature.len() + self.library.len();
        if len > policy.max_package {
            return Err(PackageError::TooLarge {
                len,
                limit: policy.max_package,
            });
        }
        self.verify_signature(&policy.trusted)?;
        let m = &self.manifest;
        if m.abi != gossamer_package::PACKAGE_ABI {
            return Err(PackageError::Abi {
                theirs: m.abi,
                ours: gossamer_package::PACKAGE_ABI,
            });
        }
        if m.target != target() {
            return Err(PackageError::Target {
                theirs: m.target.clone(),
                ours: target(),
            });
        }
        if let Some((_, min)) = policy.min_versions.iter().find(|(n, _)| *n == m.name)
            && m.version < *min
        {
            return Err(PackageError::Downgrade {
                name: m.name.clone(),
                version: m.version,
                min: *min,
            });
        }
        Ok(())
    }

    /// Checks that `library` is the one the (verified) manifest hashes, and its ELF.
    pub(crate) fn verify_library(&self, library: &[u8]) -> Result<(), PackageError> {
        let m = &self.manifest;
        if m.library_len != library.len() as u64
            || blake3::hash(library).as_bytes() != &m.library_blake3
        {
            return Err(PackageError::HashMismatch);
        }
        super::elf::check(library, &m.needed)
    }

    fn verify_signature(&self, trusted: &[[u8; 32]]) -> Result<(), PackageError> {
        let signer = self.manifest.signer;
        if self.signature.is_empty() {
            return Err(PackageError::Unsigned);
        }
        if !trusted.contains(&signer) {
            return Err(PackageError::UntrustedKey {
                signer: hex(&signer),
            });
        }
        let key = VerifyingKey::from_bytes(&signer).map_err(|_| PackageError::BadSignature)?;
        let signature = ed25519_dalek::Signature::from_slice(&self.signature)
            .map_err(|_| PackageError::BadSignature)?;
        key.verify_strict(&signed_bytes(&self.manifest_bytes), &signature)
            .map_err(|_| PackageError::BadSignature)
    }

    /// A package of `library` described by `manifest` (whose hash, length and signer this
    /// sets), signed with `key`: what [`build`](super::build) does once it has read the
    /// descriptor, for tools that write a manifest themselves. A node still checks that the
    /// library's descriptor says what the manifest says.
    pub fn signed(mut manifest: Manifest, library: Vec<u8>, key: &SecretKey) -> Package {
        let signing = SigningKey::from_bytes(&key.0);
        manifest.library_blake3 = *blake3::hash(&library).as_bytes();
        manifest.library_len = library.len() as u64;
        manifest.signer = signing.verifying_key().to_bytes();
        let manifest_bytes = postcard::to_allocvec(&manifest).expect("a manifest encodes");
        let signature = signing
            .sign(&signed_bytes(&manifest_bytes))
            .to_bytes()
            .to_vec();
        let id = id_of(&manifest_bytes, &library);
        Package {
            manifest,
            manifest_bytes,
            signature,
            library: library.into(),
            id,
        }
    }

    /// This package, signed again with `key` (its id changes: the manifest names the signer).
    pub fn sign(&self, key: &SecretKey) -> Package {
        Package::signed(self.manifest.clone(), self.library.to_vec(), key)
    }
}

/// Reads `data` as a library and as a package file and checks it under a policy that trusts
/// one fixed key, without loading anything: no panic; what reads re-encodes to the same bytes and id; a
/// package whose signature verifies under the fixed key must be one that key signed.
/// Panics when a check fails.
#[cfg(feature = "fuzzing")]
pub(crate) fn check_file(data: &[u8]) {
    // The ELF checks on bytes no signature vouches for: they refuse or accept, never panic.
    let _ = super::elf::inspect(data);
    let Ok(package) = Package::from_bytes(data) else {
        return;
    };
    let again = Package::from_bytes(&package.to_bytes()).expect("a package read re-encodes");
    assert_eq!(again.id(), package.id());
    assert_eq!(again.manifest(), package.manifest());
    let key = SecretKey([7; 32]);
    let policy = Policy {
        trusted: vec![key.public()],
        max_package: 1 << 20,
        min_versions: vec![(
            "fuzz".into(),
            Version {
                major: 1,
                minor: 0,
                patch: 0,
            },
        )],
    };
    if package.verify(&policy).is_ok() {
        // Only the fixed key's signature verifies, and only over what it signed: a fuzzer
        // cannot forge one, so this never holds unless the input came from `signed`.
        let resigned = Package::signed(package.manifest().clone(), package.library.to_vec(), &key);
        assert_eq!(
            resigned.id(),
            package.id(),
            "a verified package is the one the key signed"
        );
    }
}

fn signed_bytes(manifest: &[u8]) -> Vec<u8> {
    [DOMAIN, manifest].concat()
}

fn id_of(manifest: &[u8], library: &[u8]) -> PackageId {
    let mut h = blake3::Hasher::new();
    h.update(manifest);
    h.update(library);
    PackageId(*h.finalize().as_bytes())
}

/// A signing key's 32 secret bytes. Its file is the bytes in hex, mode 0600.
#[derive(Clone)]
pub struct SecretKey(pub(crate) [u8; 32]);

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey(public {})", hex(&self.public()))
    }
}

impl SecretKey {
    /// A new key from the operating system's randomness.
    ///
    /// # Errors
    /// The operating system has no randomness to give.
    pub fn generate() -> Result<SecretKey, PackageError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| PackageError::Io(format!("randomness: {e}")))?;
        Ok(SecretKey(bytes))
    }

    /// The public key that verifies this key's signatures.
    pub fn public(&self) -> [u8; 32] {
        SigningKey::from_bytes(&self.0).verifying_key().to_bytes()
    }

    /// The key's file contents: 64 hex digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    /// A key from its file contents.
    ///
    /// # Errors
    /// Not 64 hex digits.
    pub fn from_hex(text: &str) -> Result<SecretKey, PackageError> {
        unhex(text.trim())
            .map(SecretKey)
            .ok_or_else(|| PackageError::Malformed("a key is 64 hex digits".into()))
    }
}

/// Bytes in lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// 32 bytes from 64 hex digits.
pub fn unhex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// A manifest of no exports, for tests.
#[cfg(test)]
pub(crate) fn test_manifest() -> Manifest {
    Manifest {
        name: "t".into(),
        version: "1.2.3".parse().unwrap(),
        abi: gossamer_package::PACKAGE_ABI,
        target: target(),
        library_blake3: [0; 32],
        library_len: 0,
        exports: vec![],
        needed: vec![],
        on_load: false,
        signer: [0; 32],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_package_round_trips_and_any_flipped_bit_is_caught() {
        let key = SecretKey::generate().unwrap();
        let pkg = Package::signed(test_manifest(), b"library bytes".to_vec(), &key);
        let trusted = [key.public()];
        pkg.verify_signature(&trusted).unwrap();
        let bytes = pkg.to_bytes();
        let again = Package::from_bytes(&bytes).unwrap();
        assert_eq!(again.id(), pkg.id());
        assert_eq!(again.manifest(), pkg.manifest());
        // A bit flipped in every byte (a different bit from byte to byte): the file no longer
        // reads, or its signature or hash tells.
        for at in 0..bytes.len() {
            for bit in [at % 8] {
                let mut bad = bytes.clone();
                bad[at] ^= 1 << bit;
                let Ok(p) = Package::from_bytes(&bad) else {
                    continue;
                };
                let signature = p.verify_signature(&trusted);
                let hash = blake3::hash(&p.library).as_bytes() == &p.manifest.library_blake3
                    && p.manifest.library_len == p.library.len() as u64;
                assert!(
                    signature.is_err() || !hash,
                    "a flip at byte {at} bit {bit} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn untrusted_and_unsigned_packages_are_refused() {
        let key = SecretKey::generate().unwrap();
        let other = SecretKey::generate().unwrap();
        let pkg = Package::signed(test_manifest(), vec![1, 2, 3], &key);
        assert!(matches!(
            pkg.verify_signature(&[other.public()]),
            Err(PackageError::UntrustedKey { .. })
        ));
        let mut unsigned = pkg.clone();
        unsigned.signature.clear();
        assert!(matches!(
            unsigned.verify_signature(&[key.public()]),
            Err(PackageError::Unsigned)
        ));
        assert!(matches!(
            pkg.verify(&Policy::default()),
            Err(PackageError::NotEnabled)
        ));
    }

    #[test]
    fn open_refuses_files_above_the_limit_and_devices_without_reading_them() {
        let limit = Policy::current().unwrap().max_package;
        let dir = std::env::temp_dir().join(format!("gossamer-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let large = dir.join("large.gpkg");
        let file = std::fs::File::create(&large).unwrap();
        file.set_len(limit as u64 + 1).unwrap(); // sparse: no disk space
        let err = Package::open(&large).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            err,
            PackageError::TooLarge {
                len: limit + 1,
                limit
            }
        );
        assert!(err.to_string().contains("GSM_MAX_PACKAGE"), "{err}");
        let err = Package::open("/dev/zero").unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn versions_parse_and_order_as_numbers() {
        let v: Version = "1.10.0".parse().unwrap();
        assert!(v > "1.9.9".parse().unwrap());
        assert_eq!(v.to_string(), "1.10.0");
        assert!("1.2".parse::<Version>().is_err());
        assert!("1.2.x".parse::<Version>().is_err());
    }

    #[test]
    fn keys_read_back_from_hex() {
        let key = SecretKey::generate().unwrap();
        let again = SecretKey::from_hex(&key.to_hex()).unwrap();
        assert_eq!(again.public(), key.public());
        assert!(SecretKey::from_hex("abc").is_err());
        assert_eq!(unhex(&hex(&[7; 32])), Some([7; 32]));
    }
}
