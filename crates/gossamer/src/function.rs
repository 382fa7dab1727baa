//! Functions by name: code identity that holds across builds.
//!
//! A closure sent with `apply_with` is named by its descriptor's offset in one executable, so
//! only a node of the same build can run it. A *named function* is registered under a name
//! (`#[gossamer::function("kv.put")]`, or [`Rack::function`](crate::Rack::function)), and a
//! caller names it with the same string, so nodes of different builds can call each other.
//!
//! A name alone could bind to code that reads the bytes differently, so every call also
//! carries the caller's [`Signature`]: the property's stable type name ([`StableType`]) and
//! the serde shapes of the argument and the result, hashed into a fingerprint. The receiver
//! runs the call only when its own function of that name has the same fingerprint, and
//! answers [`NamedError::NoSuchFunction`] or [`NamedError::SignatureMismatch`] otherwise: it
//! never calls code whose types disagree with the bytes.
//!
//! This module holds what both ends share: names and signatures, the per-rack table of the
//! functions a node has ([`Functions`]), and the process-wide numbering of the names this
//! node calls ([`intern`]). On a link a name travels once, in a control message that gives
//! it the link's next index; requests then carry the index (see `wire` and `link`).

use std::any::{Any, type_name};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};

use crate::codec::Wire;
use crate::op::Run;

/// A type with a name that is the same in every build, for the signatures of named functions
/// and for properties looked up by name. Derive it with the attribute:
///
/// ```
/// #[gossamer::stable_type("kv.Table/3")]
/// #[derive(Default)]
/// struct Table {
///     rows: Vec<u64>,
/// }
/// use gossamer::StableType;
/// assert_eq!(Table::STABLE_NAME, "kv.Table/3");
/// ```
///
/// Rust's own type names are not stable (they name modules, and change with refactoring), so
/// the name is the program's promise: keep it while the type means the same, bump its version
/// when it changes. The standard number types, `bool`, `char`, `String` and `()` have their
/// Rust names.
pub trait StableType: 'static {
    /// The type's name in every build: 1 to 255 printable ASCII characters, no spaces.
    const STABLE_NAME: &'static str;
}

macro_rules! stable_as_rust {
    ($($t:ty),*) => {
        $(impl StableType for $t {
            const STABLE_NAME: &'static str = stringify!($t);
        })*
    };
}
stable_as_rust!(
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    bool,
    char,
    String,
    ()
);

/// What a named function takes and returns, as one side of a call sees it.
///
/// Two signatures agree when their fingerprints do: the fingerprint hashes the property's
/// stable name and the serde shapes of argument and result (field names and types, variant
/// names, nesting), which is what decides whether bytes one build writes mean the same to the
/// other. The Rust type names are this build's, for messages only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The property's [`StableType::STABLE_NAME`]; `None` for a function with no property.
    pub property: Option<String>,
    /// The argument's Rust type name in the build that describes it.
    pub argument: String,
    /// The result's Rust type name in the build that describes it.
    pub result: String,
    /// The hash that must agree.
    pub fingerprint: u64,
}

impl Signature {
    /// The signature of `fn(&mut T, A) -> R`.
    pub(crate) fn apply<T: StableType, A: Wire, R: Wire>() -> Signature {
        let fingerprint = gossamer_schema::apply_fingerprint::<A, R>(T::STABLE_NAME);
        Signature::new(
            Some(T::STABLE_NAME),
            type_name::<A>(),
            type_name::<R>(),
            fingerprint,
        )
    }

    /// The signature of `fn(A) -> R`.
    pub(crate) fn free<A: Wire, R: Wire>() -> Signature {
        let fingerprint = gossamer_schema::free_fingerprint::<A, R>();
        Signature::new(None, type_name::<A>(), type_name::<R>(), fingerprint)
    }

    fn new(property: Option<&str>, argument: &str, result: &str, fingerprint: u64) -> Signature {
        Signature {
            property: property.map(str::to_owned),
            argument: argument.to_owned(),
            result: result.to_owned(),
            fingerprint,
        }
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.property {
            Some(p) => write!(f, "fn(&mut {p}, {}) -> {}", self.argument, self.result)?,
            None => write!(f, "fn({}) -> {}", self.argument, self.result)?,
        }
        write!(f, " [fingerprint {:016x}]", self.fingerprint)
    }
}

/// Why a named call did not run. The receiver checks before it calls: a call that gets one of
/// these never ran anywhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum NamedError {
    /// The node has no function of that name; `similar` lists names it does have that look
    /// alike (a typo, a renamed version), nearest first.
    NoSuchFunction {
        /// The name called.
        name: String,
        /// The rank that was asked.
        node: u32,
        /// Its names like it.
        similar: Vec<String>,
    },
    /// The node's function of that name takes or returns something else.
    SignatureMismatch {
        /// The name called.
        name: String,
        /// The rank that was asked.
        node: u32,
        /// The caller's view.
        ours: Box<Signature>,
        /// The node's function.
        theirs: Box<Signature>,
    },
    /// The node has exported no property under that name (`gossamer::export`); `similar`
    /// lists names it has that look alike.
    NoSuchProperty {
        /// The name looked up.
        name: String,
        /// The rank that was asked.
        node: u32,
        /// Its names like it.
        similar: Vec<String>,
    },
    /// The property exported under that name has another stable type.
    PropertyType {
        /// The name looked up.
        name: String,
        /// The rank that was asked.
        node: u32,
        /// The stable type name the caller expects.
        ours: String,
        /// The property's.
        theirs: String,
    },
    /// This node already exports a property under that name.
    NameTaken {
        /// The name.
        name: String,
    },
    /// Only a property on this node can be exported by name here; export it on its own node.
    NotOnThisNode {
        /// The name.
        name: String,
        /// The property's node.
        node: u32,
    },
    /// The name cannot name a function or property: 1 to 255 printable ASCII characters, no
    /// spaces.
    BadName {
        /// The string given.
        name: String,
    },
}

impl fmt::Display for NamedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NamedError::NoSuchFunction {
                name,
                node,
                similar,
            } => {
                write!(f, "rank {node} has no function named \"{name}\"")?;
                if !similar.is_empty() {
                    write!(f, " (it has {})", similar.join(", "))?;
                }
                Ok(())
            }
            NamedError::SignatureMismatch {
                name,
                node,
                ours,
                theirs,
            } => write!(
                f,
                "rank {node} has \"{name}\" as {theirs}, but the caller expects {ours}"
            ),
            NamedError::NoSuchProperty {
                name,
                node,
                similar,
            } => {
                write!(f, "rank {node} exports no property named \"{name}\"")?;
                if !similar.is_empty() {
                    write!(f, " (it has {})", similar.join(", "))?;
                }
                Ok(())
            }
            NamedError::PropertyType {
                name,
                node,
                ours,
                theirs,
            } => write!(
                f,
                "rank {node} exports \"{name}\" as a {theirs}, but the caller expects a {ours}"
            ),
            NamedError::NameTaken { name } => {
                write!(f, "this node already exports a property named \"{name}\"")
            }
            NamedError::NotOnThisNode { name, node } => write!(
                f,
                "cannot export \"{name}\" here: the property lives on rank {node}; export it \
                 there"
            ),
            NamedError::BadName { name } => write!(
                f,
                "{name:?} is not a name: 1 to 255 printable ASCII characters, without spaces"
            ),
        }
    }
}

impl std::error::Error for NamedError {}

/// Whether `name` may name a function (the attribute checks the same at compile time).
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && name.bytes().all(|b| b.is_ascii_graphic())
}

/// A function registered under a name: made by `#[gossamer::function]`, or by
/// [`Function::apply`] and [`Function::free`] for [`Rack::function`](crate::Rack::function).
#[derive(Clone, Copy)]
pub struct Function {
    pub(crate) name: &'static str,
    /// The Rust function's type name, for the message about two functions of one name.
    pub(crate) code: fn() -> &'static str,
    pub(crate) signature: fn() -> Signature,
    /// The trampoline a remote call runs.
    pub(crate) run: Run,
    /// How a call on this node runs it, without encoding.
    pub(crate) local: Local,
}

/// A named function run on this node, its values passed as `dyn Any`.
#[derive(Clone, Copy)]
pub(crate) enum Local {
    /// Applies the function to the property (a `&mut T`), taking the argument from and leaving
    /// the result in an `(Option<A>, Option<R>)`; `false` if the types are not those.
    Apply(fn(&mut dyn Any, &mut dyn Any) -> bool),
    /// Runs the function on the argument in an `(Option<A>, Option<R>)`, as above.
    Free(fn(&mut dyn Any) -> bool),
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .field("code", &(self.code)())
            .finish_non_exhaustive()
    }
}

impl Function {
    /// The function's name.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// A function registered at link time by `#[gossamer::function]`.
#[doc(hidden)]
#[derive(Debug)]
pub struct Linked(pub Function);

inventory::collect!(Linked);

/// The functions one node of a rack has, by name: those linked in and those its
/// [`Rack`](crate::Rack) was given.
#[derive(Debug, Default)]
pub(crate) struct Functions {
    by_name: HashMap<&'static str, Known>,
}

#[derive(Debug)]
struct Known {
    function: Function,
    /// Traced on first use: tracing every function at start would cost each node for
    /// functions it may never be called with.
    signature: OnceLock<Signature>,
}

impl Functions {
    /// The linked functions and `added`; an error names both functions of a name used twice,
    /// or a name that cannot be one.
    pub(crate) fn new(added: &[Function]) -> Result<Functions, String> {
        let mut by_name = HashMap::new();
        let linked = inventory::iter::<Linked>.into_iter().map(|l| &l.0);
        for function in linked.chain(added) {
            if !valid_name(function.name) {
                return Err(format!(
                    "the function {} is named {:?}: a name is 1 to 255 printable ASCII \
                     characters, without spaces",
                    (function.code)(),
                    function.name
                ));
            }
            let known = Known {
                function: *function,
                signature: OnceLock::new(),
            };
            if let Some(other) = by_name.insert(function.name, known) {
                return Err(format!(
                    "two functions are named \"{}\": {} and {}; a name must be unique in a \
                     program",
                    function.name,
                    (other.function.code)(),
                    (function.code)()
                ));
            }
        }
        Ok(Functions { by_name })
    }

    /// The function `name`, if its signature agrees with the caller's (`ours`); otherwise
    /// the error the caller gets. `node` is this node's rank, for the error.
    pub(crate) fn resolve(
        &self,
        name: &str,
        ours: &Signature,
        node: u32,
    ) -> Result<Function, NamedError> {
        let Some(known) = self.by_name.get(name) else {
            return Err(NamedError::NoSuchFunction {
                name: name.to_owned(),
                node,
                similar: self.similar(name),
            });
        };
        let theirs = known.signature.get_or_init(known.function.signature);
        if theirs.fingerprint != ours.fingerprint {
            return Err(NamedError::SignatureMismatch {
                name: name.to_owned(),
                node,
                ours: Box::new(ours.clone()),
                theirs: Box::new(theirs.clone()),
            });
        }
        Ok(known.function)
    }

    fn similar(&self, name: &str) -> Vec<String> {
        similar(name, self.by_name.keys().copied())
    }
}

/// Up to three of `names` near `name` (a typo, another version), nearest first.
pub(crate) fn similar<'a>(name: &str, names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let limit = (name.len() / 3).max(2);
    let mut near: Vec<(usize, &str)> = names
        .map(|k| (distance(name, k), k))
        .filter(|&(d, k)| d <= limit || k.starts_with(name) || name.starts_with(k))
        .collect();
    near.sort();
    near.into_iter()
        .take(3)
        .map(|(_, k)| k.to_owned())
        .collect()
}

/// Edit distance (insertions, deletions, substitutions) between two names, by byte.
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &y) in b.iter().enumerate() {
            let next = (diagonal + usize::from(x != y))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// A name this node calls, with the signature it calls it with.
#[derive(Debug)]
pub(crate) struct Interned {
    /// Its number in this process, the same for every link (see [`intern`]).
    pub(crate) id: u32,
    pub(crate) name: Arc<str>,
    pub(crate) ours: Signature,
}

/// The process-wide number of (name, signature): each link tells its peer about a number
/// once, and keeps the index it gave it there in a vector by number.
pub(crate) fn intern(name: &str, ours: Signature) -> Arc<Interned> {
    static TABLE: Mutex<Vec<Arc<Interned>>> = Mutex::new(Vec::new());
    let mut table = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(known) = table
        .iter()
        .find(|i| &*i.name == name && i.ours.fingerprint == ours.fingerprint)
    {
        return known.clone();
    }
    let interned = Arc::new(Interned {
        id: table.len() as u32,
        name: name.into(),
        ours,
    });
    table.push(interned.clone());
    interned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_counts_edits() {
        assert_eq!(distance("kv.put", "kv.put"), 0);
        assert_eq!(distance("kv.put", "kv.puts"), 1);
        assert_eq!(distance("kv.put", "kv.get"), 2);
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("sum", "kv.indirect_put"), 14);
    }

    #[test]
    fn names_are_printable_and_short() {
        assert!(valid_name("kv.indirect_put/2"));
        assert!(!valid_name(""));
        assert!(!valid_name("kv put"));
        assert!(!valid_name("kv.p\u{e9}t"));
        assert!(!valid_name(&"x".repeat(256)));
        assert!(valid_name(&"x".repeat(255)));
    }

    #[test]
    fn signatures_differ_by_shape_and_property_name() {
        #[derive(Serialize, Deserialize)]
        struct Put {
            key: u64,
        }
        #[derive(Serialize, Deserialize)]
        struct PutV2 {
            key: u64,
            ttl: u32,
        }
        struct Table;
        impl StableType for Table {
            const STABLE_NAME: &'static str = "t.Table/1";
        }
        let put = Signature::apply::<Table, Put, u64>();
        assert_eq!(put, Signature::apply::<Table, Put, u64>());
        assert_ne!(
            put.fingerprint,
            Signature::apply::<Table, PutV2, u64>().fingerprint
        );
        assert_ne!(
            put.fingerprint,
            Signature::apply::<u64, Put, u64>().fingerprint
        );
        assert_ne!(put.fingerprint, Signature::free::<Put, u64>().fingerprint);
        assert_ne!(
            put.fingerprint,
            Signature::apply::<Table, Put, u32>().fingerprint
        );
        assert!(put.to_string().starts_with("fn(&mut t.Table/1, "), "{put}");
    }
}
