//! The thread-safety of every public type, checked at compile time.

fn is_send<T: Send>() {}
fn is_sync<T: Sync>() {}

#[test]
fn public_types_are_send_and_sync_as_documented() {
    is_send::<trust::Runtime>();
    is_sync::<trust::Runtime>();
    is_send::<trust::Handle>();
    is_sync::<trust::Handle>();
    is_send::<trust::Trust<Vec<u8>>>();
    is_sync::<trust::Trust<Vec<u8>>>();
    // A trust to a non-Sync property is still Sync: only the trustee touches the property.
    is_sync::<trust::Trust<std::cell::Cell<u8>>>();
    is_send::<trust::TrusteeRef>();
    is_send::<trust::JoinHandle<u8>>();
    is_send::<trust::ApplyFuture<u8>>();
    is_send::<trust::Latch<u8>>();
    // A reply may be kept in a property, which moves to its trustee's thread.
    is_send::<trust::Reply<String>>();
    is_send::<trust::TimedOut>();
    is_sync::<trust::TimedOut>();
    is_send::<trust::BuildError>();
    is_sync::<trust::BuildError>();
}
