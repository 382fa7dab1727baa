//! Closures that capture nothing, and how the receiving node gets one without any bytes.
//!
//! A closure sent to another node cannot carry pointers, so it must capture nothing: its type
//! is then zero-sized, and the type alone (named by its operation descriptor, see `op`) is all
//! the receiver needs. [`check`] rejects a capturing closure at compile time with a message
//! that says what to do instead; [`conjure`] makes the receiver's value of the type.

/// Fails to compile unless `F` is zero-sized, i.e. captures nothing.
#[inline(always)]
pub(crate) const fn check<F>() {
    const {
        assert!(
            size_of::<F>() == 0,
            "a closure sent to another node must capture nothing: pass the data it needs as \
             the argument of apply_with / apply_then_with / spawn_on, or use `t.local()` for a \
             property on this node"
        )
    }
}

/// A value of the zero-sized closure type `F`.
///
/// The sender gave up its own value of `F` (it forgets it when it sends), so the closure moves
/// to the receiver rather than being duplicated.
pub(crate) fn conjure<F>() -> F {
    check::<F>();
    // SAFETY: `F` is zero-sized (checked at compile time above), so reading one reads no bytes,
    // and a read of a zero-sized type through a dangling, aligned, non-null pointer is valid.
    // The value is valid too: the type is inhabited (the caller held a value of it and gave it
    // up to send it here), and a closure type has no invariant beyond its captures, which are
    // none.
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
