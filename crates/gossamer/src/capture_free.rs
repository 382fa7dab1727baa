//! Closures that capture nothing, and how the receiving node gets one without any bytes.
//!
//! A closure sent to another node cannot carry pointers, so it must capture nothing: its type
//! is then zero-sized, and the type alone (named by its operation descriptor, see `op`) is all
//! the receiver needs. [`check!`] rejects a capturing closure at compile time with a message
//! that says what to do instead; [`conjure`] makes the receiver's value of the type.
//!
//! What the compiler can and cannot say: the check is a `const` assertion on the closure's
//! size, which only exists once the generic function is instantiated with the user's closure,
//! so it fails in `cargo build` (and `cargo test`, `cargo run`, `cargo doc` doctests), never
//! in `cargo check` or an editor's check, which stop before that; stable Rust has no bound
//! that says "captures nothing". The error's first line is the message below and its span
//! points into `core` (where `assert!` panics); the notes that follow name the closure by where
//! it is defined (`{closure@src/main.rs:5:26: 5:38}`) and, because [`check!`] is expanded in
//! the public function itself rather than in a helper, the call of the user's program at
//! fault ("the above error was encountered while instantiating `fn Trust::apply_with::<…>`"
//! then `--> src/main.rs:5:9`). A function of the crate that passes the closure on to another
//! checked function (`apply` wraps it for `apply_with`) may add a second error whose note
//! points into the crate; the first one points at the user's call.

/// Fails to compile unless the closure type `$f` is zero-sized, i.e. captures nothing.
///
/// A macro rather than a function, expanded in each public function that takes a closure to
/// send: the compiler's "while instantiating" note then points at the caller's line.
macro_rules! check {
    ($f:ty) => {
        const {
            assert!(
                size_of::<$f>() == 0,
                "a closure sent to another node must capture nothing (the notes below name the \
                 closure and the call): pass the data it needs as the argument of apply_with / \
                 apply_then_with / spawn_on, or use `t.local()` for a property on this node"
            )
        }
    };
}
pub(crate) use check;

/// A value of the zero-sized closure type `F`.
///
/// The sender gave up its own value of `F` (it forgets it when it sends), so the closure moves
/// to the receiver rather than being duplicated. Every public function that sends a closure
/// rejects a capturing one at compile time ([`check!`]); the assertion here keeps a mistake in
/// the crate from reading bytes that are not there.
pub(crate) fn conjure<F>() -> F {
    assert!(
        size_of::<F>() == 0,
        "gossamer: a capturing closure reached conjure"
    );
    // SAFETY: `F` is zero-sized (asserted above), so reading one reads no bytes, and a read
    // of a zero-sized type through a dangling, aligned, non-null pointer is valid. The value
    // is valid too: the type is inhabited (the caller held a value of it and gave it up to
    // send it here), and a closure type has no invariant beyond its captures, which are none.
    unsafe { std::ptr::NonNull::<F>::dangling().read() }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_conjured_closure_runs_the_same_code() {
        fn remote_half<F: FnOnce(u32) -> u32>(_: &F) -> u32 {
            super::conjure::<F>()(20)
        }
        let f = |x: u32| x + 22;
        assert_eq!(remote_half(&f), 42);
    }
}
