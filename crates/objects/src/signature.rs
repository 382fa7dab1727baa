//! [`Signature`]: what the members of an object must agree on.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What every member of an object must agree on, checked when they join.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The object's Rust type.
    pub type_name: String,
    /// Its parameters, as `Debug` shows them (for messages).
    pub params: String,
    /// A hash of its parameters' encoding.
    pub params_hash: u64,
    /// Its members' ranks, in order.
    pub members: Vec<u32>,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} with parameters {} (hash {:016x}), members {:?}",
            self.type_name, self.params, self.params_hash, self.members
        )
    }
}
