//! Mapping a verified package into this process, and calling into it.
//!
//! # The protocol that makes this sound
//! - Only a library that passed every check of [`Package::verify`](super::Package::verify)
//!   is loaded, and what was checked is what loads: the manifest is checked first
//!   (signature, ABI, target, version), then the bytes are written to a fresh `memfd`,
//!   sealed against any change (`F_SEAL_WRITE`, `F_SEAL_SHRINK`, `F_SEAL_GROW`,
//!   `F_SEAL_SEAL`), read back, and only what the sealed file holds is checked (hash, ELF).
//!   Another process of this user may open the memfd through `/proc/PID/fd/N` and write to
//!   it before the seal; it then fails the hash. `dlopen` maps `/proc/self/fd/N`, never a
//!   path another process could swap.
//! - The descriptor is read only once its `abi` field (the first, in every ABI) says it has
//!   this layout; its strings and exports are then read as the SDK wrote them, and compared
//!   with the signed manifest: a library whose descriptor says anything else is refused.
//! - The memfd stays open as long as the library is mapped: the dynamic loader takes a path
//!   it has opened before for the library it opened then, so no later memfd may get the same
//!   `/proc/self/fd/N`. (For the same reason `elf` refuses a library with a `DT_SONAME`.)
//! - A library is never unloaded (`dlclose` would leave TLS destructors and callbacks of Rust
//!   code pointing into unmapped memory), so the descriptor, its strings and its functions
//!   live as long as the process: `&'static` is honest. Loads are bounded by [`MAX_LOADED`].
//! - Calls pass the argument as a byte slice and take the result through the host's `write`
//!   callback into a `Vec` the host owns; no allocation crosses. Every export runs under the
//!   SDK's `catch_unwind`. A state is a `Box` the package made; the host keeps it in the
//!   property ([`State`]) on one trustee, which calls its methods one at a time and drops it
//!   once, through the package's own `drop`.
//!
//! What is not verified, and cannot be: that the package's code is memory-safe, correct, or
//! ends. A loaded package runs with all of its node's power.

use std::ffi::{CString, c_void};
use std::io::{Read as _, Seek as _, Write as _};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Mutex;

use gossamer_package::{CallFn, Descriptor, DropFn, Host, NewFn, kind};

use super::PackageError;
use super::elf::Inspected;
use super::file::{ExportEntry, ExportKind, Package, PackageId, Policy, Version};

/// Packages one process loads at most: each stays mapped for good.
pub(crate) const MAX_LOADED: usize = 64;

/// A package mapped into this process.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) id: PackageId,
    pub(crate) name: String,
    pub(crate) exports: Vec<LoadedExport>,
}

/// One export of a loaded package: what the manifest says, and its functions.
#[derive(Debug)]
pub(crate) struct LoadedExport {
    pub(crate) entry: ExportEntry,
    call: Option<CallFn>,
    new: Option<NewFn>,
    drop: Option<DropFn>,
}

/// What a descriptor says.
#[derive(Debug)]
pub(crate) struct Described {
    pub(crate) name: String,
    pub(crate) version: Version,
    pub(crate) exports: Vec<ExportEntry>,
    pub(crate) on_load: bool,
}

/// Why a call into a package produced no value.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The export panicked: its message.
    Panicked(String),
    /// The argument did not decode there: why.
    BadArgument(String),
}

/// The packages this process loaded, by id.
static LOADED: Mutex<Vec<&'static Loaded>> = Mutex::new(Vec::new());

/// The package `id`, if this process loaded it.
pub(crate) fn loaded(id: PackageId) -> Option<&'static Loaded> {
    let all = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    all.iter().find(|l| l.id == id).copied()
}

/// Loads `package` once (later calls return the same), after verifying it under `policy`;
/// `rank` is this node's, for the package's `on_load`.
pub(crate) fn load(
    package: &Package,
    policy: &Policy,
    rank: u32,
) -> Result<&'static Loaded, PackageError> {
    // Held throughout: one load per id, however many callers race for it.
    let mut all = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = all.iter().find(|l| l.id == package.id()) {
        return Ok(l);
    }
    if all.len() >= MAX_LOADED {
        return Err(PackageError::TooMany { limit: MAX_LOADED });
    }
    package.verify_manifest(policy)?;
    let sealed = Sealed::new(package.library())?;
    package.verify_library(&sealed.contents)?;
    let descriptor = open(sealed)?;
    let described = describe_descriptor(descriptor)?;
    let m = package.manifest();
    if described.name != m.name
        || described.version != m.version
        || described.exports != m.exports
        || described.on_load != m.on_load
    {
        return Err(PackageError::Descriptor(format!(
            "the library describes {} {} with {:?}, the manifest {} {} with {:?}",
            described.name, described.version, described.exports, m.name, m.version, m.exports
        )));
    }
    if let Some(on_load) = descriptor.on_load {
        let mut out = Vec::new();
        // SAFETY: the descriptor's `on_load` is the SDK's wrapper, called with a live host
        // and this call's output, as the package ABI says.
        let status = unsafe { on_load(&host(rank), (&raw mut out).cast()) };
        if status != gossamer_package::OK {
            return Err(PackageError::OnLoad(
                String::from_utf8_lossy(&out).into_owned(),
            ));
        }
    }
    // SAFETY: `descriptor` lives as long as the process (the library is never unloaded), and
    // its `exports` are `exports_len` valid entries, checked by `describe_descriptor`.
    let raw = unsafe { raw_exports(descriptor) };
    let exports = described
        .exports
        .into_iter()
        .zip(raw)
        .map(|(entry, e)| LoadedExport {
            entry,
            call: e.call,
            new: e.new,
            drop: e.drop,
        })
        .collect();
    let loaded: &'static Loaded = Box::leak(Box::new(Loaded {
        id: package.id(),
        name: described.name,
        exports,
    }));
    all.push(loaded);
    Ok(loaded)
}

/// For `gsm package build`: checks the ELF of `library` as it lies sealed, maps it (never to
/// be unloaded) and reads the descriptor, without running its `on_load`. Its ELF
/// initializers do run: describe only a library you built.
pub(crate) fn describe(library: &[u8]) -> Result<(Described, Inspected), PackageError> {
    let sealed = Sealed::new(library)?;
    if sealed.contents != library {
        // The manifest will hash `library`: it must be what is described.
        return Err(PackageError::Load(
            "the library changed while it was written to a memfd".into(),
        ));
    }
    let inspected = super::elf::inspect(&sealed.contents)?;
    Ok((describe_descriptor(open(sealed)?)?, inspected))
}

/// A library in a memfd that no one can change any more, and what the memfd holds: the bytes
/// to check, since another process of this user may have written to it (through
/// `/proc/PID/fd/N`) before it was sealed.
struct Sealed {
    file: std::fs::File,
    contents: Vec<u8>,
}

impl Sealed {
    /// Writes `library` to a fresh memfd, seals it and reads back what it holds.
    fn new(library: &[u8]) -> Result<Sealed, PackageError> {
        let load = |why: String| PackageError::Load(why);
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
        let fd = unsafe {
            libc::memfd_create(
                c"gossamer-package".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(load(format!(
                "memfd_create: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
        let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        file.write_all(library)
            .map_err(|e| load(format!("writing the library to a memfd: {e}")))?;
        let seals =
            libc::F_SEAL_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on a descriptor this function owns.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(load(format!(
                "sealing the memfd: {}",
                std::io::Error::last_os_error()
            )));
        }
        // One byte more than written: a file grown before the seal shows as longer.
        let mut contents = Vec::with_capacity(library.len());
        file.seek(std::io::SeekFrom::Start(0))
            .and_then(|_| {
                (&file)
                    .take(library.len() as u64 + 1)
                    .read_to_end(&mut contents)
            })
            .map_err(|e| load(format!("reading the sealed memfd back: {e}")))?;
        Ok(Sealed { file, contents })
    }
}

/// Maps the sealed library and finds its descriptor.
fn open(sealed: Sealed) -> Result<&'static Descriptor, PackageError> {
    let load = |why: String| PackageError::Load(why);
    let file = sealed.file;
    let path =
        CString::new(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("a path without NUL");
    // SAFETY: dlopen of a sealed file holding a library that passed every check; it runs
    // the library's initializers, which the signature vouches for.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    // Kept open for good, as the library stays mapped: the loader knows a library by the path
    // it was opened with, so a later memfd given the same descriptor number would be taken
    // for this one.
    std::mem::forget(file);
    if handle.is_null() {
        return Err(load(format!("dlopen: {}", dl_error())));
    }
    let symbol = CString::new(gossamer_package::DESCRIPTOR_SYMBOL).expect("no NUL");
    // SAFETY: dlsym on a live handle with a NUL-terminated name.
    let address = unsafe { libc::dlsym(handle, symbol.as_ptr()) };
    let Some(address) = NonNull::new(address.cast::<Descriptor>()) else {
        return Err(load(format!(
            "dlsym {}: {}",
            gossamer_package::DESCRIPTOR_SYMBOL,
            dl_error()
        )));
    };
    if !address.as_ptr().is_aligned() {
        return Err(load("the descriptor is misaligned".into()));
    }
    // SAFETY: the symbol is the descriptor static the SDK's `package!` defines (the ELF check
    // found it exported; its `abi` is read before any other field); the library is never
    // unloaded, so it lives as long as the process.
    Ok(unsafe { address.as_ref() })
}

/// The text of the last `dl*` error.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the next dl call
    // on this thread, which it is copied before.
    let text = unsafe { libc::dlerror() };
    if text.is_null() {
        return "unknown error".into();
    }
    // SAFETY: as above.
    unsafe { std::ffi::CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// Exports a descriptor may have at most (a bound on what is read from it).
const MAX_EXPORTS: usize = 4096;

/// The exports of `d`.
///
/// # Safety
/// `d.abi` must be this ABI and `d.exports_len` at most [`MAX_EXPORTS`]: then `exports` points
/// at that many entries of the package's static memory, which lives as long as the process.
unsafe fn raw_exports(d: &'static Descriptor) -> &'static [gossamer_package::Export] {
    if d.exports_len == 0 {
        return &[];
    }
    // SAFETY: as this function's contract.
    unsafe { std::slice::from_raw_parts(d.exports, d.exports_len) }
}

/// Reads a descriptor as the module docs say.
fn describe_descriptor(d: &'static Descriptor) -> Result<Described, PackageError> {
    if d.abi != gossamer_package::PACKAGE_ABI {
        return Err(PackageError::Abi {
            theirs: d.abi,
            ours: gossamer_package::PACKAGE_ABI,
        });
    }
    if d.exports_len > MAX_EXPORTS || (d.exports_len > 0 && d.exports.is_null()) {
        return Err(PackageError::Descriptor(format!(
            "{} exports (at most {MAX_EXPORTS})",
            d.exports_len
        )));
    }
    let text = |s: gossamer_package::Str, what: &str| {
        // SAFETY: a descriptor's strings point into the package's static memory.
        let bytes = unsafe { s.bytes() };
        String::from_utf8(bytes.to_vec())
            .map_err(|_| PackageError::Descriptor(format!("{what} is not UTF-8")))
    };
    let name = text(d.name, "the name")?;
    let version = text(d.version, "the version")?
        .parse()
        .map_err(PackageError::Descriptor)?;
    let mut exports = Vec::new();
    // SAFETY: the ABI and the count were checked above.
    for e in unsafe { raw_exports(d) } {
        let export_name = text(e.name, "an export's name")?;
        let kind = match (e.kind, e.call, e.new, e.drop) {
            (kind::FUNCTION, Some(_), None, None) => ExportKind::Function,
            (kind::STATE, None, Some(_), Some(_)) => ExportKind::State,
            (kind::METHOD, Some(_), None, None) => ExportKind::Method {
                state: text(e.state, "a method's state")?,
            },
            _ => {
                return Err(PackageError::Descriptor(format!(
                    "export {export_name:?} has kind {} with functions that do not fit it",
                    e.kind
                )));
            }
        };
        // A call names an export by kind and name (a method by its state's name too), so
        // two of one kind and name would be one to a caller; two state types of one name
        // would let a method of one be called on the other's state.
        if exports
            .iter()
            .any(|x: &ExportEntry| x.name == export_name && x.kind == kind)
        {
            return Err(PackageError::Descriptor(format!(
                "two exports {export_name:?} of kind {kind:?}: give each its own name (a state \
                 type its own State::NAME)"
            )));
        }
        exports.push(ExportEntry {
            name: export_name,
            kind,
            fingerprint: (e.fingerprint)(),
        });
    }
    Ok(Described {
        name,
        version,
        exports,
        on_load: d.on_load.is_some(),
    })
}

/// The host a call of this node's gets.
fn host(rank: u32) -> Host {
    Host {
        abi: gossamer_package::PACKAGE_ABI,
        rank,
        write: write_out,
        log: log_line,
    }
}

/// [`Host::write`]: appends to the `Vec<u8>` a call passed as its output.
///
/// # Safety
/// `out` is the `&mut Vec<u8>` the host passed for this call; `ptr..ptr + len` is readable.
unsafe extern "C" fn write_out(out: *mut c_void, ptr: *const u8, len: usize) {
    // SAFETY: as this function's contract: the host passes its own `Vec<u8>` as `out`.
    let out = unsafe { &mut *out.cast::<Vec<u8>>() };
    if len > 0 {
        // SAFETY: as this function's contract.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(ptr, len) });
    }
}

/// [`Host::log`]: one line to standard error.
///
/// # Safety
/// `ptr..ptr + len` is readable.
unsafe extern "C" fn log_line(ptr: *const u8, len: usize) {
    let bytes = if len == 0 {
        &[][..]
    } else {
        // SAFETY: as this function's contract.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    };
    eprintln!("gossamer: package: {}", String::from_utf8_lossy(bytes));
}

/// The result of a call that wrote `out` and returned `status`: on success, `out` is the
/// output; otherwise it says why.
fn outcome(status: u32, out: &[u8]) -> Result<(), Failed> {
    match status {
        gossamer_package::OK => Ok(()),
        gossamer_package::BAD_ARGUMENT => Err(Failed::BadArgument(
            String::from_utf8_lossy(out).into_owned(),
        )),
        _ => Err(Failed::Panicked(String::from_utf8_lossy(out).into_owned())),
    }
}

impl Loaded {
    /// Runs export `index`, a function, on `arg`.
    pub(crate) fn call_function(
        &self,
        index: usize,
        arg: &[u8],
        rank: u32,
    ) -> Result<Vec<u8>, Failed> {
        let e = &self.exports[index];
        let call = e.call.filter(|_| e.entry.kind == ExportKind::Function);
        let call = call.expect("the caller checked the export is a function");
        let mut out = Vec::new();
        // SAFETY: a function export's `call` takes a null state, the argument bytes and this
        // call's output, as the package ABI says.
        let status = unsafe {
            call(
                &host(rank),
                std::ptr::null_mut(),
                arg.as_ptr(),
                arg.len(),
                (&raw mut out).cast(),
            )
        };
        outcome(status, &out).map(|()| out)
    }

    /// Builds a state with export `index`, a state type, from `arg`.
    pub(crate) fn new_state(
        &'static self,
        index: usize,
        arg: &[u8],
        rank: u32,
    ) -> Result<State, Failed> {
        let e = &self.exports[index];
        let new = e.new.filter(|_| e.entry.kind == ExportKind::State);
        let new = new.expect("the caller checked the export is a state");
        let (mut out, mut state) = (Vec::new(), std::ptr::null_mut());
        // SAFETY: a state export's `new` takes the argument bytes, this call's output and a
        // place for the state, as the package ABI says.
        let status = unsafe {
            new(
                &host(rank),
                arg.as_ptr(),
                arg.len(),
                (&raw mut out).cast(),
                &raw mut state,
            )
        };
        outcome(status, &out)?;
        let ptr = NonNull::new(state)
            .ok_or_else(|| Failed::Panicked("the package built no state".into()))?;
        Ok(State {
            package: self,
            export: index,
            ptr,
        })
    }
}

/// A state a package built, owned by the property that holds it.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) package: &'static Loaded,
    /// Its state export.
    pub(crate) export: usize,
    ptr: NonNull<c_void>,
}

// SAFETY: the SDK requires a state type to be `Send`; the pointer is the only handle to it,
// and the property that holds this is used by one trustee at a time.
unsafe impl Send for State {}

impl State {
    /// Runs export `index`, which must be a method of this state's type, on `arg`; its output
    /// is appended to `out` (the caller's buffer, which it may reuse from call to call).
    pub(crate) fn call(
        &mut self,
        index: usize,
        arg: &[u8],
        rank: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Failed> {
        let state = &self.package.exports[self.export].entry.name;
        let call = self
            .package
            .exports
            .get(index)
            .and_then(|e| match &e.entry.kind {
                ExportKind::Method { state: s } if s == state => e.call,
                _ => None,
            });
        let Some(call) = call else {
            return Err(Failed::BadArgument(format!(
                "export #{index} of {} is no method of {state}",
                self.package.name
            )));
        };
        let start = out.len();
        // SAFETY: a method's `call` takes a state its package built with the method's state
        // export (checked just above by name) and that no other call uses now (`&mut self`),
        // the argument and this call's output.
        let status = unsafe {
            call(
                &host(rank),
                self.ptr.as_ptr(),
                arg.as_ptr(),
                arg.len(),
                std::ptr::from_mut(out).cast(),
            )
        };
        outcome(status, &out[start..])
    }
}

impl Drop for State {
    fn drop(&mut self) {
        let drop = self.package.exports[self.export].drop;
        if let Some(drop) = drop {
            // SAFETY: the state's own export's `drop`, once, on the state `new` built.
            unsafe { drop(self.ptr.as_ptr()) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::package::{PackageError, SecretKey};

    include!("../../tests/common/demo_package.rs");

    struct First;
    impl gossamer_package::State for First {
        const NAME: &'static str = "Same";
    }
    struct Second;
    impl gossamer_package::State for Second {
        const NAME: &'static str = "Same";
    }

    static SAME_NAME: [gossamer_package::Export; 2] = [
        gossamer_package::Export::state(|(): ()| First),
        gossamer_package::Export::state(|(): ()| Second),
    ];

    static TWO_STATES_OF_ONE_NAME: Descriptor = Descriptor {
        abi: gossamer_package::PACKAGE_ABI,
        name: gossamer_package::Str::new("twice"),
        version: gossamer_package::Str::new("1.0.0"),
        exports: SAME_NAME.as_ptr(),
        exports_len: SAME_NAME.len(),
        on_load: None,
    };

    #[test]
    fn two_state_types_of_one_name_are_refused() {
        let err = describe_descriptor(&TWO_STATES_OF_ONE_NAME).unwrap_err();
        assert!(
            matches!(&err, PackageError::Descriptor(why) if why.contains("\"Same\"")),
            "{err}"
        );
    }

    /// The whole unsafe path, once, in-process: map the demo package, check its descriptor,
    /// run `on_load`, build a state, call a method and a function, drop the state. Run under
    /// valgrind and AddressSanitizer by `scripts/test.sh`.
    #[test]
    fn a_package_loads_and_its_exports_run() {
        let key = SecretKey::generate().unwrap();
        let package = crate::package::build(demo_library(false), &key).unwrap();
        let policy = Policy {
            trusted: vec![key.public()],
            max_package: 64 << 20,
            min_versions: Vec::new(),
        };
        let loaded = load(&package, &policy, 3).expect("the demo package loads");
        assert!(
            std::ptr::eq(loaded, load(&package, &policy, 3).unwrap()),
            "loaded once"
        );
        let index = |name: &str| {
            loaded
                .exports
                .iter()
                .position(|e| e.entry.name == name)
                .unwrap()
        };
        let shape = postcard::to_allocvec(&(4u64, 16u64, 8u64)).unwrap();
        let mut state = loaded.new_state(index("Server"), &shape, 3).unwrap();
        let put = postcard::to_allocvec(&(5u64, b"five".to_vec())).unwrap();
        let mut out = Vec::new();
        state
            .call(index("indirect_put"), &put, 3, &mut out)
            .unwrap();
        let slot: u64 = postcard::from_bytes(&out).unwrap();
        assert!(slot < 16);
        // The output is appended to what the buffer holds.
        let mut out = vec![9];
        let key = postcard::to_allocvec(&5u64).unwrap();
        state.call(index("get"), &key, 3, &mut out).unwrap();
        assert_eq!(out[0], 9);
        let got: Option<Vec<u8>> = postcard::from_bytes(&out[1..]).unwrap();
        assert_eq!(&got.unwrap()[..4], b"five");
        let out = loaded.call_function(index("version"), &[], 3).unwrap();
        let (version, rank): (String, u32) = postcard::from_bytes(&out).unwrap();
        assert_eq!((version.as_str(), rank), ("1.0.0", 3));
        let message = "nope".to_string();
        match loaded.call_function(
            index("panics"),
            &postcard::to_allocvec(&message).unwrap(),
            3,
        ) {
            Err(Failed::Panicked(m)) => assert_eq!(m, "nope"),
            other => panic!("expected a panic, got {other:?}"),
        }
        match loaded.call_function(index("sum"), &[0xff], 3) {
            Err(Failed::BadArgument(why)) => assert!(why.contains("does not decode"), "{why}"),
            other => panic!("expected a bad argument, got {other:?}"),
        }
        drop(state);
        // A package signed by a key the policy does not trust never loads.
        let stranger = package.sign(&SecretKey::generate().unwrap());
        assert!(matches!(
            load(&stranger, &policy, 3),
            Err(PackageError::UntrustedKey { .. })
        ));
    }
}
