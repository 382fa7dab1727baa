//! Write a gossamer *code package*: functions and states that a running rack node loads from a
//! signed file and calls by name.
//!
//! A package is a `cdylib` that depends on this crate and declares its exports once, with
//! [`package!`]:
//!
//! ```
//! use gossamer_package::{Export, State};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Default)]
//! pub struct Table {
//!     slots: Vec<Option<(u64, Vec<u8>)>>,
//! }
//! impl State for Table {
//!     const NAME: &'static str = "Table";
//! }
//!
//! #[derive(Serialize, Deserialize)]
//! pub struct Put {
//!     key: u64,
//!     value: Vec<u8>,
//! }
//!
//! fn new_table(slots: u64) -> Table {
//!     Table { slots: vec![None; slots as usize] }
//! }
//!
//! fn put(t: &mut Table, p: Put) -> u64 {
//!     let at = (p.key % t.slots.len() as u64) as usize;
//!     t.slots[at] = Some((p.key, p.value));
//!     at as u64
//! }
//!
//! fn sum(values: Vec<u64>) -> u64 {
//!     values.iter().sum()
//! }
//!
//! gossamer_package::package! {
//!     name: "doc.kv",
//!     version: "1.0.0",
//!     on_load: None,
//!     exports: [
//!         Export::state(new_table),
//!         Export::method("put", put),
//!         Export::function("sum", sum),
//!     ],
//! }
//! # fn main() {}
//! ```
//!
//! `gsm package build` then reads the descriptor, writes the manifest (name, version, this
//! ABI, target, the library's BLAKE3, every export's fingerprint, the libraries it needs) and
//! signs it; see the gossamer README.
//!
//! # The boundary
//! Rust has no stable ABI, so host and package meet in C: one `#[repr(C)]` [`Descriptor`] at
//! the exported symbol [`DESCRIPTOR_SYMBOL`], whose [`Export`]s are `extern "C"` functions.
//! Values cross as postcard bytes: a call gets its argument as a byte slice and writes its
//! result through the [`Host`]'s `write`, so no allocation ever crosses. Every export runs
//! inside `catch_unwind`: a panic comes back as [`PANICKED`] with its message, and the host
//! raises it at the caller. A package that aborts takes its node down (and the job with it).
//!
//! Fingerprints are computed by `gossamer-schema`, as the host computes them for a caller's
//! types: a method of a state `S` taking `A` and returning `R` has
//! `apply_fingerprint::<A, R>(S::NAME)`, a function `free_fingerprint::<A, R>()`, a state's
//! constructor `new_fingerprint::<A>(S::NAME)`.

use std::any::TypeId;
use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use gossamer_schema;

/// The package ABI this crate builds: the layout of [`Descriptor`], [`Export`] and [`Host`]
/// and the meaning of their fields. A host refuses packages of an ABI it does not know.
pub const PACKAGE_ABI: u32 = 1;

/// The symbol a package exports its [`Descriptor`] at.
pub const DESCRIPTOR_SYMBOL: &str = "GOSSAMER_PACKAGE_V1";

/// A call ran; the output is its postcard-encoded result.
pub const OK: u32 = 0;
/// A call panicked; the output is the panic message (UTF-8).
pub const PANICKED: u32 = 1;
/// A call's argument did not decode; the output says why (UTF-8).
pub const BAD_ARGUMENT: u32 = 2;

/// A string in static memory of the package.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Str {
    /// The first byte.
    pub ptr: *const u8,
    /// Bytes (UTF-8).
    pub len: usize,
}

impl Str {
    /// The string `s`.
    pub const fn new(s: &'static str) -> Str {
        Str {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// The bytes, for the host.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be readable for `'a` (a package's static strings are, while it is
    /// loaded, and packages are never unloaded).
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the caller guarantees the range is readable for 'a.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// What the host gives every call: where output goes, a log, and where it runs.
#[repr(C)]
#[derive(Debug)]
pub struct Host {
    /// The host's [`PACKAGE_ABI`].
    pub abi: u32,
    /// The rank of the node the package runs on.
    pub rank: u32,
    /// Appends `len` bytes at `ptr` to the output `out` of the call running.
    pub write: unsafe extern "C" fn(out: *mut c_void, ptr: *const u8, len: usize),
    /// Writes one line to the node's standard error, naming the package.
    pub log: unsafe extern "C" fn(ptr: *const u8, len: usize),
}

/// Runs a function or a method: `state` is null for a function.
pub type CallFn = unsafe extern "C" fn(
    host: *const Host,
    state: *mut c_void,
    arg: *const u8,
    len: usize,
    out: *mut c_void,
) -> u32;

/// Builds a state from its argument into `*state`.
pub type NewFn = unsafe extern "C" fn(
    host: *const Host,
    arg: *const u8,
    len: usize,
    out: *mut c_void,
    state: *mut *mut c_void,
) -> u32;

/// Drops a state built by the export's [`NewFn`].
pub type DropFn = unsafe extern "C" fn(state: *mut c_void);

/// What kind of export an [`Export`] is.
pub mod kind {
    /// `fn(A) -> R`, no state: `call`.
    pub const FUNCTION: u32 = 0;
    /// A state type: `new` and `drop`.
    pub const STATE: u32 = 1;
    /// `fn(&mut S, A) -> R` on the state named `state`: `call`.
    pub const METHOD: u32 = 2;
}

/// One exported function, state or method.
#[repr(C)]
#[derive(Debug)]
pub struct Export {
    /// The export's name (a state's is its [`State::NAME`]).
    pub name: Str,
    /// A [`kind`] constant.
    pub kind: u32,
    /// For a method, the name of its state; empty otherwise.
    pub state: Str,
    /// The export's fingerprint (computed when asked: tracing types takes a while).
    pub fingerprint: extern "C" fn() -> u64,
    /// A function's or method's body.
    pub call: Option<CallFn>,
    /// A state's constructor.
    pub new: Option<NewFn>,
    /// A state's destructor.
    pub drop: Option<DropFn>,
}

// SAFETY: an `Export` holds only function pointers and pointers to static, immutable strings.
unsafe impl Sync for Export {}

/// The package, at [`DESCRIPTOR_SYMBOL`].
#[repr(C)]
#[derive(Debug)]
pub struct Descriptor {
    /// [`PACKAGE_ABI`] of the SDK that built the package.
    pub abi: u32,
    /// The package's name.
    pub name: Str,
    /// Its version, `MAJOR.MINOR.PATCH`.
    pub version: Str,
    /// The first of its exports.
    pub exports: *const Export,
    /// How many exports there are.
    pub exports_len: usize,
    /// Runs once, when a node loads the package, before any call (the seed's *ried* setting
    /// itself up); [`OK`] or [`PANICKED`] with a message written to `out`.
    pub on_load: Option<unsafe extern "C" fn(host: *const Host, out: *mut c_void) -> u32>,
}

// SAFETY: as for `Export`: pointers to static, immutable data and functions.
unsafe impl Sync for Descriptor {}

/// A type a package keeps state in, for the fingerprints of its methods: its name is the
/// property's stable type name as callers see it.
pub trait State: Send + 'static {
    /// The state's name in its package, one per state type: a host refuses a package that
    /// exports two state types of one name, and a method called on a state of another type
    /// refuses the call ([`BAD_ARGUMENT`]) rather than run on it.
    const NAME: &'static str;
}

impl Export {
    /// A function `fn(A) -> R` under `name`.
    pub const fn function<A, R, F>(name: &'static str, f: F) -> Export
    where
        A: DeserializeOwned,
        R: Serialize + DeserializeOwned,
        F: Fn(A) -> R + Copy + 'static,
    {
        zero_sized::<F>();
        let _ = f; // the type is the function
        Export {
            name: Str::new(name),
            kind: kind::FUNCTION,
            state: Str::new(""),
            fingerprint: free_fingerprint::<A, R>,
            call: Some(call_function::<A, R, F>),
            new: None,
            drop: None,
        }
    }

    /// The state type `S`, built from an `A` by `f`.
    pub const fn state<S, A, F>(f: F) -> Export
    where
        S: State,
        A: DeserializeOwned,
        F: Fn(A) -> S + Copy + 'static,
    {
        zero_sized::<F>();
        let _ = f;
        Export {
            name: Str::new(S::NAME),
            kind: kind::STATE,
            state: Str::new(""),
            fingerprint: new_fingerprint::<S, A>,
            call: None,
            new: Some(new_state::<S, A, F>),
            drop: Some(drop_state::<S>),
        }
    }

    /// A method `fn(&mut S, A) -> R` under `name`, on states of type `S`.
    pub const fn method<S, A, R, F>(name: &'static str, f: F) -> Export
    where
        S: State,
        A: DeserializeOwned,
        R: Serialize + DeserializeOwned,
        F: Fn(&mut S, A) -> R + Copy + 'static,
    {
        zero_sized::<F>();
        let _ = f;
        Export {
            name: Str::new(name),
            kind: kind::METHOD,
            state: Str::new(S::NAME),
            fingerprint: apply_fingerprint::<S, A, R>,
            call: Some(call_method::<S, A, R, F>),
            new: None,
            drop: None,
        }
    }
}

/// Fails to compile unless `F` captures nothing: the export is the type alone.
const fn zero_sized<F>() {
    const {
        assert!(
            size_of::<F>() == 0,
            "an export must be a function or a closure that captures nothing"
        )
    }
}

/// The value of the zero-sized function type `F`.
fn conjure<F: Copy>() -> F {
    zero_sized::<F>();
    // SAFETY: `F` is zero-sized (checked at compile time), so reading one reads no bytes, and
    // a read of a zero-sized type through a dangling, aligned, non-null pointer is valid. `F`
    // is the type of a function or capture-free closure the package named in an `Export`
    // (which took a value of it), so it is inhabited and has no invariant to break; it is
    // `Copy`, so making another value duplicates nothing.
    unsafe { std::ptr::NonNull::<F>::dangling().read() }
}

extern "C" fn free_fingerprint<A: DeserializeOwned, R: DeserializeOwned>() -> u64 {
    gossamer_schema::free_fingerprint::<A, R>()
}

extern "C" fn apply_fingerprint<S: State, A: DeserializeOwned, R: DeserializeOwned>() -> u64 {
    gossamer_schema::apply_fingerprint::<A, R>(S::NAME)
}

extern "C" fn new_fingerprint<S: State, A: DeserializeOwned>() -> u64 {
    gossamer_schema::new_fingerprint::<A>(S::NAME)
}

thread_local! {
    /// The host of the call running on this thread, for [`rank`] and [`log`].
    static HOST: Cell<*const Host> = const { Cell::new(std::ptr::null()) };
    /// The buffer results are encoded into before they are written to the host, reused from
    /// call to call on this thread.
    static RESULT: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// The largest result buffer a thread keeps between calls.
const KEPT_RESULT_BYTES: usize = 1 << 20;

/// The rank of the node this package runs on; `None` outside a call.
pub fn rank() -> Option<u32> {
    let host = HOST.get();
    // SAFETY: set only for the duration of a call, during which the host keeps it alive.
    (!host.is_null()).then(|| unsafe { (*host).rank })
}

/// Writes `line` to the node's standard error, naming the package; does nothing outside a
/// call.
pub fn log(line: &str) {
    let host = HOST.get();
    if !host.is_null() {
        // SAFETY: as in `rank`; the host reads `line` only during the call.
        unsafe { ((*host).log)(line.as_ptr(), line.len()) }
    }
}

/// Runs `body` as an export: with the host set for [`rank`] and [`log`], panics caught, and
/// the result or message written to `out`; returns the status.
///
/// # Safety
/// `host` must be a live `Host` and `out` the output it gave this call.
unsafe fn export<R: Serialize>(
    host: *const Host,
    out: *mut c_void,
    body: impl FnOnce() -> Result<R, (u32, String)>,
) -> u32 {
    let previous = HOST.replace(host);
    let result = catch_unwind(AssertUnwindSafe(body));
    HOST.set(previous);
    let mut buf = RESULT.take();
    buf.clear();
    let (status, bytes) = match result {
        Ok(Ok(value)) => match postcard::to_extend(&value, buf) {
            Ok(bytes) => (OK, bytes),
            Err(e) => (
                PANICKED,
                format!("the result does not encode: {e}").into_bytes(),
            ),
        },
        Ok(Err((status, why))) => (status, why.into_bytes()),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with a non-string payload".into());
            (PANICKED, message.into_bytes())
        }
    };
    // SAFETY: the caller guarantees `host` is live and `out` is this call's output.
    unsafe { ((*host).write)(out, bytes.as_ptr(), bytes.len()) };
    if bytes.capacity() <= KEPT_RESULT_BYTES {
        RESULT.set(bytes);
    }
    status
}

/// The argument of a call, decoded.
///
/// # Safety
/// `arg..arg + len` must be readable for the call (or `len` 0).
unsafe fn argument<A: DeserializeOwned>(arg: *const u8, len: usize) -> Result<A, (u32, String)> {
    let bytes = if len == 0 {
        &[][..]
    } else {
        // SAFETY: the caller guarantees the range is readable for the call.
        unsafe { std::slice::from_raw_parts(arg, len) }
    };
    postcard::from_bytes(bytes)
        .map_err(|e| (BAD_ARGUMENT, format!("the argument does not decode: {e}")))
}

/// [`CallFn`] of a function.
///
/// # Safety
/// Called by the host with a live `Host`, a readable argument and its output.
unsafe extern "C" fn call_function<A, R, F>(
    host: *const Host,
    _state: *mut c_void,
    arg: *const u8,
    len: usize,
    out: *mut c_void,
) -> u32
where
    A: DeserializeOwned,
    R: Serialize,
    F: Fn(A) -> R + Copy,
{
    // SAFETY: as this function's contract.
    unsafe {
        export(host, out, || {
            let a = argument::<A>(arg, len)?;
            Ok(conjure::<F>()(a))
        })
    }
}

/// [`CallFn`] of a method.
///
/// # Safety
/// As [`call_function`], and `state` must be a state the same package's [`new_state`] built
/// (of `S` or of another state type) and not yet dropped, not in use by another call.
unsafe extern "C" fn call_method<S, A, R, F>(
    host: *const Host,
    state: *mut c_void,
    arg: *const u8,
    len: usize,
    out: *mut c_void,
) -> u32
where
    S: State,
    A: DeserializeOwned,
    R: Serialize,
    F: Fn(&mut S, A) -> R + Copy,
{
    // SAFETY: the host passes a state a `new_state` of this package built, which it owns and
    // lends to one call at a time (its trustee runs them one by one); every such state is a
    // `Boxed`, whose `repr(C)` layout starts with the type id whatever its state type.
    let type_id = unsafe { *state.cast::<TypeId>() };
    if type_id != TypeId::of::<S>() {
        // Another state type of the same `State::NAME`: the host matched them by name.
        let why = format!(
            "a method of state {:?} was called on a state of another type of that name: give \
             each state type its own State::NAME",
            S::NAME
        );
        // SAFETY: as this function's contract.
        return unsafe { export::<()>(host, out, || Err((BAD_ARGUMENT, why))) };
    }
    // SAFETY: the type id says the state is a `Boxed<S>`, lent to this call alone (above).
    let s = unsafe { &mut (*state.cast::<Boxed<S>>()).state };
    // SAFETY: as this function's contract.
    unsafe {
        export(host, out, || {
            let a = argument::<A>(arg, len)?;
            Ok(conjure::<F>()(s, a))
        })
    }
}

/// How a state is kept: its type's id first, so that a method can check that the state it is
/// given is of its own type (two state types may, by mistake, share a `State::NAME`).
#[repr(C)]
struct Boxed<S> {
    type_id: TypeId,
    state: S,
}

/// [`NewFn`] of a state.
///
/// # Safety
/// As [`call_function`]; `state` must be writable.
unsafe extern "C" fn new_state<S, A, F>(
    host: *const Host,
    arg: *const u8,
    len: usize,
    out: *mut c_void,
    state: *mut *mut c_void,
) -> u32
where
    S: State,
    A: DeserializeOwned,
    F: Fn(A) -> S + Copy,
{
    let mut built = std::ptr::null_mut();
    // SAFETY: as this function's contract.
    let status = unsafe {
        export(host, out, || {
            let a = argument::<A>(arg, len)?;
            let state = conjure::<F>()(a);
            let type_id = TypeId::of::<S>();
            built = Box::into_raw(Box::new(Boxed { type_id, state })).cast::<c_void>();
            Ok(())
        })
    };
    // SAFETY: the caller guarantees `state` is writable.
    unsafe { *state = built };
    status
}

/// [`DropFn`] of a state.
///
/// # Safety
/// `state` must be a state [`new_state`] of `S` built, dropped once.
unsafe extern "C" fn drop_state<S: State>(state: *mut c_void) {
    // SAFETY: as this function's contract: a `Box<Boxed<S>>` made by `new_state`.
    let state = unsafe { Box::from_raw(state.cast::<Boxed<S>>()) };
    // A panic in a destructor must not unwind into the host.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(state)));
}

/// Runs a package's `on_load` as an export.
///
/// # Safety
/// As [`call_function`].
#[doc(hidden)]
pub unsafe fn run_on_load(
    host: *const Host,
    out: *mut c_void,
    f: fn() -> Result<(), String>,
) -> u32 {
    // SAFETY: as this function's contract.
    unsafe { export(host, out, || f().map_err(|why| (PANICKED, why))) }
}

/// Declares the package: its name, version, an optional `on_load` (`fn() -> Result<(),
/// String>`, run once when a node loads it) and its exports, at [`DESCRIPTOR_SYMBOL`]. See the
/// crate docs for an example.
#[macro_export]
macro_rules! package {
    (
        name: $name:literal,
        version: $version:literal,
        on_load: $on_load:expr,
        exports: [$($export:expr),* $(,)?] $(,)?
    ) => {
        #[doc(hidden)]
        const __GOSSAMER_EXPORTS: &[$crate::Export] = &[$($export),*];

        #[doc(hidden)]
        unsafe extern "C" fn __gossamer_on_load(
            host: *const $crate::Host,
            out: *mut ::std::ffi::c_void,
        ) -> u32 {
            let f: ::std::option::Option<fn() -> ::std::result::Result<(), ::std::string::String>> =
                $on_load;
            match f {
                // SAFETY: the host calls this with a live host and this call's output.
                ::std::option::Option::Some(f) => unsafe { $crate::run_on_load(host, out, f) },
                ::std::option::Option::None => $crate::OK,
            }
        }

        /// The package's descriptor, read by the host that loads it.
        #[unsafe(no_mangle)]
        pub static GOSSAMER_PACKAGE_V1: $crate::Descriptor = $crate::Descriptor {
            abi: $crate::PACKAGE_ABI,
            name: $crate::Str::new($name),
            version: $crate::Str::new($version),
            exports: __GOSSAMER_EXPORTS.as_ptr(),
            exports_len: __GOSSAMER_EXPORTS.len(),
            on_load: ::std::option::Option::Some(__gossamer_on_load),
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    struct First(u64);
    impl State for First {
        const NAME: &'static str = "Same";
    }
    struct Second(u64);
    impl State for Second {
        const NAME: &'static str = "Same";
    }

    unsafe extern "C" fn write(out: *mut c_void, ptr: *const u8, len: usize) {
        // SAFETY: the tests pass a `Vec<u8>` as `out` and a readable range.
        unsafe { (*out.cast::<Vec<u8>>()).extend_from_slice(std::slice::from_raw_parts(ptr, len)) }
    }

    unsafe extern "C" fn log(_: *const u8, _: usize) {}

    #[test]
    fn a_method_refuses_a_state_of_another_type_of_the_same_name() {
        let host = Host {
            abi: PACKAGE_ABI,
            rank: 0,
            write,
            log,
        };
        let new = Export::state(First).new.unwrap();
        let method = Export::method("get", |s: &mut Second, (): ()| s.0)
            .call
            .unwrap();
        let arg = postcard::to_allocvec(&7u64).unwrap();
        let (mut out, mut state) = (Vec::<u8>::new(), std::ptr::null_mut());
        // SAFETY: a live host, a readable argument, this call's output and a place for the
        // state, as the package ABI says.
        let status = unsafe {
            new(
                &host,
                arg.as_ptr(),
                arg.len(),
                (&raw mut out).cast(),
                &raw mut state,
            )
        };
        assert_eq!(status, OK);
        let unit = postcard::to_allocvec(&()).unwrap();
        let mut out = Vec::<u8>::new();
        // SAFETY: as above, with a state this package's `new_state` built: the host's mistake
        // this test makes is to pair it with a method of another state type of its name.
        let status = unsafe {
            method(
                &host,
                state,
                unit.as_ptr(),
                unit.len(),
                (&raw mut out).cast(),
            )
        };
        let message = String::from_utf8_lossy(&out);
        assert_eq!(status, BAD_ARGUMENT, "the method ran: {out:?}");
        assert!(message.contains("State::NAME"), "{message}");
        // A method of its own type runs on it.
        let own = Export::method("get", |s: &mut First, (): ()| s.0)
            .call
            .unwrap();
        let mut out = Vec::<u8>::new();
        // SAFETY: as above, with a method of the state's own type.
        let status = unsafe {
            own(
                &host,
                state,
                unit.as_ptr(),
                unit.len(),
                (&raw mut out).cast(),
            )
        };
        assert_eq!(status, OK);
        assert_eq!(postcard::from_bytes::<u64>(&out).unwrap(), 7);
        let drop = Export::state(First).drop.unwrap();
        // SAFETY: the state `new` built, dropped once.
        unsafe { drop(state) };
    }
}
