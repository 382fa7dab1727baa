//! The build id: which executable a node runs, so that only nodes of one build talk.
//!
//! Function ids on the wire are offsets inside the binary, so what the handshake needs to know
//! is "same link output". The linker says exactly that in the ELF `NT_GNU_BUILD_ID` note, which
//! `cc` asks for when gcc is built with `--enable-linker-build-id` (as on Debian and Ubuntu), in
//! debug and release builds alike. Reading it takes the ELF header, the program headers and the note
//! segments, a few KB however large the executable is, so a start-up no longer grows with the
//! binary (a debug rack program is tens of MB; hashing it with an unoptimised SHA-256 took
//! seconds per rank).
//!
//! The build id is therefore, in order of preference:
//!
//! 1. the note: `SHA-256(NOTE_LABEL ‖ note's bytes)`, 32 bytes whatever the note's length;
//! 2. without a note (linked with `--build-id=none`, or not ELF): the SHA-256 of the whole file,
//!    remembered in a cache file per executable file (see [`cached_file_hash`]) so that only the
//!    first start of a build pays for it. Each rebuild leaves one more small entry; deleting the
//!    directory is always safe.
//!
//! The two are distinct by construction (the label), and every process of one executable takes
//! the same branch, so two ranks of one build always agree.
//!
//! # What is and is not guaranteed
//!
//! - Two different links give different ids: the linker computes the note as a hash of its
//!   output (SHA-1 by default, 160 bits).
//! - Changes made after the link that keep the note are not seen: `strip` and `objcopy` keep it,
//!   and they do not move code, so the function offsets still agree and linking such ranks is
//!   right. A binary edited by hand, or linked with a fixed `--build-id=0x…`, keeps whatever note
//!   it has: ranks of two such builds would be taken for one. That is the price of not reading
//!   the file; whoever forges notes can also set `GSM_MIXED_BUILDS`, and the handshake's secret,
//!   not the build id, is what keeps strangers out.
//! - The build id is not a content hash of the file: `gsm` names and checks the programs it ships
//!   by the SHA-256 of their bytes (`cluster::file_hash`), which is a separate thing.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use object::read::elf::{FileHeader, ProgramHeader};
use object::{FileKind, ReadRef, elf};
use sha2::{Digest, Sha256};

/// Prefixed to the note's bytes before hashing, so that a note-derived id can never equal the
/// hash of a whole file.
const NOTE_LABEL: &[u8] = b"gossamer build id v1: NT_GNU_BUILD_ID\0";

/// The largest note segment read: real ones are a few hundred bytes.
const MAX_NOTE_SEGMENT: u64 = 64 * 1024;

/// How old a file's last change must be before its hash is cached: file times move in coarse
/// ticks, so a write within the tick of the last one would leave the key as it was (git's
/// "racily clean" files).
const SETTLED: Duration = Duration::from_secs(1);

/// Identifies the executable a node runs (see the module docs for how it is made).
///
/// `Display` shows the first two bytes (`3fa9…`), enough to tell two builds apart in an error
/// message; `Debug` shows all 32.
///
/// ```ignore
/// let mut bytes = [0u8; 32];
/// bytes[..2].copy_from_slice(&[0x3f, 0xa9]);
/// assert_eq!(BuildId(bytes).to_string(), "3fa9…");
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct BuildId(pub(crate) [u8; 32]);

impl fmt::Display for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02x}{:02x}…", self.0[0], self.0[1])
    }
}

impl fmt::Debug for BuildId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BuildId(")?;
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        f.write_str(")")
    }
}

/// The build id of the running executable.
///
/// Computed once per process and kept; an error is not kept, so a later call tries again. On
/// Linux the running image is read through `/proc/self/exe`, which stays right even if the file
/// on disk has been replaced since the process started (as a rebuild does); elsewhere
/// [`std::env::current_exe`].
///
/// # Errors
///
/// The executable cannot be found or read; the error names its path.
pub(crate) fn build_id() -> io::Result<BuildId> {
    static BUILD_ID: OnceLock<BuildId> = OnceLock::new();
    if let Some(id) = BUILD_ID.get() {
        return Ok(*id);
    }
    let id = identify(&running_executable()?, cache_dir().as_deref())?;
    // Two threads may both compute it; they get the same answer, and one of them is kept.
    Ok(*BUILD_ID.get_or_init(|| id))
}

fn running_executable() -> io::Result<PathBuf> {
    #[cfg(target_os = "linux")]
    if Path::new("/proc/self/exe").exists() {
        return Ok(PathBuf::from("/proc/self/exe"));
    }
    std::env::current_exe().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot find the running executable to identify its build: {e}"),
        )
    })
}

/// The build id of the executable at `path`: from its build-id note, else its hash, cached in
/// `cache` if given.
fn identify(path: &Path, cache: Option<&Path>) -> io::Result<BuildId> {
    let with_path =
        |e: io::Error| io::Error::new(e.kind(), format!("cannot read {}: {e}", path.display()));
    let file = File::open(path).map_err(with_path)?;
    if let Some(note) = build_id_note(&object::ReadCache::new(file)) {
        let mut hasher = Sha256::new();
        hasher.update(NOTE_LABEL);
        hasher.update(&note);
        return Ok(BuildId(hasher.finalize().into()));
    }
    match cache {
        Some(dir) => cached_file_hash(path, dir, SystemTime::now()),
        None => hash_file(path),
    }
    .map(BuildId)
}

/// The descriptor of the `NT_GNU_BUILD_ID` note in an ELF image's note segments; `None` if the
/// data is not ELF, is malformed, or has no such note. Only the headers and the note segments
/// are read.
fn build_id_note<'data, R: ReadRef<'data>>(data: R) -> Option<Vec<u8>> {
    match FileKind::parse(data).ok()? {
        FileKind::Elf32 => note_in::<elf::FileHeader32<object::Endianness>, R>(data),
        FileKind::Elf64 => note_in::<elf::FileHeader64<object::Endianness>, R>(data),
        _ => None,
    }
}

fn note_in<'data, Elf: FileHeader<Endian = object::Endianness>, R: ReadRef<'data>>(
    data: R,
) -> Option<Vec<u8>> {
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    for segment in header.program_headers(endian, data).ok()? {
        let size: u64 = segment.p_filesz(endian).into();
        if segment.p_type(endian) != elf::PT_NOTE || size > MAX_NOTE_SEGMENT {
            continue;
        }
        let Ok(Some(mut notes)) = segment.notes(endian, data) else {
            continue;
        };
        while let Ok(Some(note)) = notes.next() {
            if note.name() == elf::ELF_NOTE_GNU
                && note.n_type(endian) == elf::NT_GNU_BUILD_ID
                && !note.desc().is_empty()
            {
                return Some(note.desc().to_vec());
            }
        }
    }
    None
}

/// SHA-256 of a file, read in chunks so that a large binary does not sit in memory.
pub(crate) fn hash_file(path: &Path) -> io::Result<[u8; 32]> {
    let with_path =
        |e: io::Error| io::Error::new(e.kind(), format!("cannot hash {}: {e}", path.display()));
    let mut file = File::open(path).map_err(with_path)?;
    let mut hasher = Sha256::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => hasher.update(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(with_path(e)),
        }
    }
    Ok(hasher.finalize().into())
}

/// Where hashes of executables without a note are kept: `$XDG_CACHE_HOME/gossamer/exe-hash`,
/// else `$HOME/.cache/gossamer/exe-hash`; `None` (no caching) if neither is set.
fn cache_dir() -> Option<PathBuf> {
    let non_empty = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    let base = non_empty("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| non_empty("HOME").map(|home| Path::new(&home).join(".cache")))?;
    Some(base.join("gossamer").join("exe-hash"))
}

/// What a cached hash is valid for: the file's identity and every stamp a rewrite changes.
#[derive(Debug, PartialEq, Eq)]
struct FileKey {
    device: u64,
    inode: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileKey {
    fn of(meta: &fs::Metadata) -> FileKey {
        use std::os::unix::fs::MetadataExt;
        let ns = |secs: i64, nanos: i64| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        FileKey {
            device: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The cache entry's text: the key, then the hash in hex.
    fn entry(&self, hash: &[u8; 32]) -> String {
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "gossamer exe-hash v1 {} {} {} {} {} {hex}\n",
            self.device, self.inode, self.size, self.mtime_ns, self.ctime_ns
        )
    }

    /// The hash an entry's text holds, if the text is well formed and names exactly this key.
    fn read_entry(&self, text: &str) -> Option<[u8; 32]> {
        let hex = text
            .strip_suffix('\n')?
            .strip_prefix(self.entry(&[0; 32]).rsplit_once(' ')?.0)?
            .strip_prefix(' ')?;
        if hex.len() != 64 {
            return None;
        }
        let mut hash = [0u8; 32];
        for (byte, pair) in hash.iter_mut().zip(hex.as_bytes().chunks(2)) {
            *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
        }
        Some(hash)
    }
}

/// The SHA-256 of the file at `path`, taken from `cache` when an entry there was made for the
/// same device, inode, size, modification and change times; else hashed and, if the file is
/// settled, remembered.
///
/// An entry is one file per executable, `<cache>/<device>-<inode>`, replaced whole by a rename,
/// so a reader sees an old entry or a new one, never half of one. It is trusted only when every
/// field of the key matches and it parses exactly; anything else (garbage, another file's key,
/// a truncated write) is ignored and overwritten. A file changed less than [`SETTLED`] before
/// `now` is hashed but not remembered, since a second write within the same clock tick could
/// leave its key unchanged. Failing to write the cache only costs the next start a hash.
///
/// The cache trusts whoever can write to it (the user's own cache directory): someone who can
/// write there can also replace the executable.
fn cached_file_hash(path: &Path, cache: &Path, now: SystemTime) -> io::Result<[u8; 32]> {
    let stat = |p: &Path| {
        fs::metadata(p)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot read {}: {e}", p.display())))
    };
    let key = FileKey::of(&stat(path)?);
    let entry = cache.join(format!("{}-{}", key.device, key.inode));
    if let Some(hash) = fs::read_to_string(&entry)
        .ok()
        .and_then(|text| key.read_entry(&text))
    {
        return Ok(hash);
    }
    let hash = hash_file(path)?;
    let now_ns = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX));
    let settled = now_ns - key.mtime_ns.max(key.ctime_ns) >= SETTLED.as_nanos() as i128;
    if settled && stat(path).is_ok_and(|after| FileKey::of(&after) == key) {
        let _ = write_entry(cache, &entry, &key.entry(&hash));
    }
    Ok(hash)
}

/// Writes `text` to a new temporary file beside `entry`, then renames it over `entry`.
///
/// The temporary file is created exclusively, so two writers never share one; a clash just
/// leaves this hash uncached.
fn write_entry(cache: &Path, entry: &Path, text: &str) -> io::Result<()> {
    fs::create_dir_all(cache)?;
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let temporary = cache.join(format!(".tmp-{}-{nanos}", std::process::id()));
    let mut file = File::options()
        .write(true)
        .create_new(true)
        .open(&temporary)?;
    let renamed = file
        .write_all(text.as_bytes())
        .and_then(|()| fs::rename(&temporary, entry));
    if renamed.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    renamed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_is_stable_and_comes_from_the_note() {
        let first = build_id().expect("identify the test binary");
        let second = build_id().expect("identify the test binary again");
        assert_eq!(first, second);
        let exe = std::env::current_exe().expect("the test binary's path");
        // The same answer from the file on disk (the same build), through the note.
        let file_id = identify(&exe, None).expect("identify the test binary's file");
        assert_eq!(file_id, first);
        let note = build_id_note(&fs::read(&exe).expect("read the test binary")[..])
            .expect("the default linker gives the test binary a build-id note");
        assert!(note.len() >= 8, "a build-id note of {} bytes", note.len());
        let expected: [u8; 32] = Sha256::new()
            .chain_update(NOTE_LABEL)
            .chain_update(&note)
            .finalize()
            .into();
        assert_eq!(first.0, expected);
        assert_ne!(first.0, hash_file(&exe).expect("hash the test binary"));
        let shown = first.to_string();
        assert_eq!(shown.chars().count(), 5, "{shown}");
        assert!(shown.ends_with('…'), "{shown}");
        assert_eq!(format!("{first:?}").len(), "BuildId()".len() + 64);
    }

    const PT_LOAD: u32 = 1;
    const PT_NOTE: u32 = 4;

    /// A little-endian ELF64 image: header, one program header, then the segment's bytes.
    fn elf_with_segment(p_type: u32, segment: &[u8]) -> Vec<u8> {
        let mut image = vec![0u8; 64 + 56];
        image[..4].copy_from_slice(b"\x7fELF");
        image[4] = 2; // 64-bit
        image[5] = 1; // little-endian
        image[6] = 1; // version
        image[16..18].copy_from_slice(&2u16.to_le_bytes()); // executable
        image[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86-64
        image[20..24].copy_from_slice(&1u32.to_le_bytes());
        image[32..40].copy_from_slice(&64u64.to_le_bytes()); // program headers at 64
        image[52..54].copy_from_slice(&64u16.to_le_bytes());
        image[54..56].copy_from_slice(&56u16.to_le_bytes());
        image[56..58].copy_from_slice(&1u16.to_le_bytes());
        let ph = &mut image[64..120];
        ph[..4].copy_from_slice(&p_type.to_le_bytes());
        ph[8..16].copy_from_slice(&120u64.to_le_bytes()); // offset
        ph[32..40].copy_from_slice(&(segment.len() as u64).to_le_bytes()); // file size
        ph[40..48].copy_from_slice(&(segment.len() as u64).to_le_bytes()); // memory size
        ph[48..56].copy_from_slice(&4u64.to_le_bytes()); // alignment
        image.extend_from_slice(segment);
        image
    }

    fn note(name: &[u8], n_type: u32, desc: &[u8]) -> Vec<u8> {
        let mut note = Vec::new();
        note.extend_from_slice(&(name.len() as u32 + 1).to_le_bytes());
        note.extend_from_slice(&(desc.len() as u32).to_le_bytes());
        note.extend_from_slice(&n_type.to_le_bytes());
        note.extend_from_slice(name);
        note.push(0);
        note.resize(note.len().next_multiple_of(4), 0);
        note.extend_from_slice(desc);
        note.resize(note.len().next_multiple_of(4), 0);
        note
    }

    #[test]
    fn note_reader_finds_the_build_id_among_other_notes() {
        let mut notes = note(b"GNU", 1, &[0, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
        notes.extend(note(b"GNU", 3, &[0xab; 20]));
        let image = elf_with_segment(PT_NOTE, &notes);
        assert_eq!(build_id_note(&image[..]), Some(vec![0xab; 20]));
    }

    #[test]
    fn note_reader_gives_none_without_a_build_id_note() {
        // A note segment with only an ABI tag, another vendor's type 3, and a non-note segment.
        let mut notes = note(b"GNU", 1, &[0; 16]);
        notes.extend(note(b"Go", 3, &[0xcd; 20]));
        assert_eq!(build_id_note(&elf_with_segment(PT_NOTE, &notes)[..]), None);
        let load = elf_with_segment(PT_LOAD, &note(b"GNU", 3, &[0xab; 20]));
        assert_eq!(build_id_note(&load[..]), None);
        // Not ELF, or cut short: no note, no panic.
        assert_eq!(build_id_note(&b"#!/bin/sh\necho hi\n"[..]), None);
        let image = elf_with_segment(PT_NOTE, &note(b"GNU", 3, &[0xab; 20]));
        for len in [0, 10, 64, 100, 130] {
            assert_eq!(build_id_note(&image[..len]), None, "cut at {len}");
        }
    }

    #[test]
    fn identify_uses_the_note_else_the_whole_file_hash() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cache = dir.path().join("cache");
        let with_note = dir.path().join("with-note");
        fs::write(
            &with_note,
            elf_with_segment(PT_NOTE, &note(b"GNU", 3, &[0xab; 20])),
        )
        .unwrap();
        let expected: [u8; 32] = Sha256::new()
            .chain_update(NOTE_LABEL)
            .chain_update([0xab; 20])
            .finalize()
            .into();
        assert_eq!(identify(&with_note, Some(&cache)).unwrap().0, expected);
        assert!(
            !cache.exists(),
            "a file with a note was hashed into the cache"
        );
        let script = dir.path().join("script");
        fs::write(&script, b"#!/bin/sh\necho no note\n").unwrap();
        let real = hash_file(&script).unwrap();
        assert_eq!(identify(&script, Some(&cache)).unwrap().0, real);
        assert_eq!(identify(&script, None).unwrap().0, real);
        let missing = dir.path().join("missing");
        let error = identify(&missing, Some(&cache)).unwrap_err().to_string();
        assert!(error.contains("missing"), "{error}");
    }

    /// A file whose last change is long enough ago (as `now` is given) to be cached.
    fn program(dir: &Path, content: &[u8]) -> (PathBuf, SystemTime) {
        let path = dir.join("program");
        fs::write(&path, content).expect("write the program");
        (path, SystemTime::now() + 2 * SETTLED)
    }

    fn entry_of(path: &Path, cache: &Path) -> PathBuf {
        let key = FileKey::of(&fs::metadata(path).expect("stat the program"));
        cache.join(format!("{}-{}", key.device, key.inode))
    }

    #[test]
    fn cache_remembers_a_settled_file_and_is_used_on_a_hit() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cache = dir.path().join("cache");
        let (path, later) = program(dir.path(), b"one build");
        let real = hash_file(&path).expect("hash the program");
        assert_eq!(cached_file_hash(&path, &cache, later).unwrap(), real);
        let entry = entry_of(&path, &cache);
        let text = fs::read_to_string(&entry).expect("the hash was cached");
        // Plant another hash under the same key: a hit returns it, proving the file was not read.
        let planted = text.replace(&text[text.len() - 65..text.len() - 1], &"7".repeat(64));
        fs::write(&entry, planted).unwrap();
        assert_eq!(cached_file_hash(&path, &cache, later).unwrap(), [0x77; 32]);
    }

    #[test]
    fn cache_is_not_trusted_after_a_change_or_for_another_inode() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cache = dir.path().join("cache");
        let (path, later) = program(dir.path(), b"one build");
        cached_file_hash(&path, &cache, later).unwrap();
        let entry = entry_of(&path, &cache);
        let poisoned = |entry: &Path| {
            let text = fs::read_to_string(entry).expect("the hash was cached");
            let text = text.replace(&text[text.len() - 65..text.len() - 1], &"7".repeat(64));
            fs::write(entry, text).unwrap();
        };
        poisoned(&entry);
        // Touched: same bytes, new times.
        let file = File::options().write(true).open(&path).unwrap();
        file.set_modified(SystemTime::now() + Duration::from_secs(5))
            .unwrap();
        let real = hash_file(&path).unwrap();
        assert_eq!(cached_file_hash(&path, &cache, later).unwrap(), real);
        // Replaced by a copy: another inode, even with the old entry copied to its name.
        poisoned(&entry);
        let copy = dir.path().join("copy");
        fs::copy(&path, &copy).unwrap();
        fs::rename(&copy, &path).unwrap();
        let new_entry = entry_of(&path, &cache);
        assert_ne!(new_entry, entry);
        fs::copy(&entry, &new_entry).unwrap();
        assert_eq!(cached_file_hash(&path, &cache, later).unwrap(), real);
    }

    #[test]
    fn cache_refuses_a_file_changed_within_the_last_second() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cache = dir.path().join("cache");
        let (path, _) = program(dir.path(), b"just written");
        let real = hash_file(&path).unwrap();
        assert_eq!(
            cached_file_hash(&path, &cache, SystemTime::now()).unwrap(),
            real
        );
        assert!(
            !entry_of(&path, &cache).exists(),
            "a racily-clean file was cached"
        );
    }

    #[test]
    fn corrupted_cache_entries_are_ignored() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cache = dir.path().join("cache");
        let (path, later) = program(dir.path(), b"one build");
        let real = hash_file(&path).unwrap();
        cached_file_hash(&path, &cache, later).unwrap();
        let entry = entry_of(&path, &cache);
        let good = fs::read_to_string(&entry).unwrap();
        let corruptions = [
            String::new(),
            "garbage".into(),
            good[..good.len() - 10].into(),
            good.trim_end().into(),
            good.replace("v1", "v2"),
            format!("{}zz\n", &good[..good.len() - 3]),
            format!("{}00\n", good.trim_end()),
        ];
        for bad in corruptions {
            // A plausible wrong hash where the hash belongs, if the line is long enough.
            let bad = bad.replace(
                &real.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                &"7".repeat(64),
            );
            fs::write(&entry, &bad).unwrap();
            assert_eq!(
                cached_file_hash(&path, &cache, later).unwrap(),
                real,
                "{bad:?}"
            );
            assert_eq!(
                fs::read_to_string(&entry).unwrap(),
                good,
                "rewritten after {bad:?}"
            );
        }
    }
}
