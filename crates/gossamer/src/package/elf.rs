//! What a package's library must look like before it is mapped, read as the dynamic loader
//! reads it: a shared object for this machine that needs only the C runtime, asks for no
//! writable code and no executable stack, has no `DT_SONAME` (the loader would take two
//! libraries of one soname for one), exports the descriptor, and was linked against a C
//! library no newer than this one.
//!
//! # What the loader acts on, and how it is read here
//! glibc maps a library by its *program headers* and then reads its dynamic array at the
//! *load address* of `PT_DYNAMIC`, not at its file offset; where a header type repeats, the
//! last one wins. Section headers are for tools and may say anything. So:
//! - **Program headers**: only these types are accepted, and only as often as given:
//!   `PT_LOAD` (at least one; none both writable and executable; in ascending address order,
//!   not overlapping), `PT_DYNAMIC` and `PT_GNU_STACK` (exactly once; the stack not
//!   executable), `PT_PHDR`, `PT_TLS`, `PT_GNU_EH_FRAME`, `PT_GNU_RELRO`, `PT_GNU_PROPERTY`
//!   (at most once), `PT_NOTE` and `PT_NULL` (any number). Anything else is refused, among
//!   them `PT_INTERP`, a second `PT_DYNAMIC` or `PT_GNU_STACK`, and types this check does not
//!   know. Extended numbering (`e_phnum` = `PN_XNUM`) is refused.
//! - **The dynamic array** is read through the `PT_LOAD` segment that maps its address
//!   (`p_vaddr`), within the segment's file bytes, and must be the bytes at its `p_offset`
//!   too: a header whose address and offset name different bytes is refused. Every segment
//!   that maps a page of the array, or of the string table, must map it from the same file
//!   bytes (a later segment's page would replace an earlier one's). The array must end with
//!   `DT_NULL` inside the segment; entries after it are not read, by the loader or here.
//! - **Dynamic tags**: an allow-list ([`ALLOWED_TAGS`]). Each allowed tag describes the
//!   library's own image (symbols, hash tables, relocations of its own writable data, its
//!   initializers, symbol versions), which the signature covers; none makes the loader open
//!   another file or change how it searches. `DT_NEEDED` names must each be one of
//!   [`ALLOWED_NEEDED`] exactly (no path; only this architecture's loader). `DT_FLAGS` may
//!   set only `DF_BIND_NOW`, `DT_FLAGS_1` only `DF_1_NOW`. Every other tag is refused,
//!   among them `DT_RPATH` and `DT_RUNPATH` (the loader would search their directories for
//!   the allowed names too), `DT_AUXILIARY` and `DT_FILTER` (they load another library),
//!   `DT_AUDIT` and `DT_DEPAUDIT`, `DT_SONAME`, `DT_TEXTREL`, `DT_PREINIT_ARRAY` and
//!   `DT_SYMBOLIC`.
//!
//! The file must be a 64-bit ELF shared object (`ET_DYN`) in this machine's byte order, for
//! this machine (`e_machine`). Pages are this system's page size, as the loader's.
//!
//! The symbol versions and the exported descriptor are read from sections, which the loader
//! ignores: a `GLIBC_x.y` need the sections hide makes `dlopen` fail if this C library lacks
//! it, and whatever descriptor `dlsym` then finds is still compared with the signed manifest.
//!
//! # What is not checked
//! Where the loader finds the allowed libraries: this process's `LD_LIBRARY_PATH`, its
//! executable's own `DT_RPATH`, and the system's loader cache decide, as for the program
//! itself. Initializers (`DT_INIT`, `DT_INIT_ARRAY`) run inside `dlopen`: the signature, not
//! this check, vouches for them, as for every other instruction of the package.

use object::Endianness;
use object::elf::{self, FileHeader64, ProgramHeader64};
use object::read::elf::{FileHeader, ProgramHeader, SectionTable, Sym};

use super::PackageError;

/// The section headers of a library being checked.
type Sections<'a> = SectionTable<'a, FileHeader64<Endianness>>;

/// The libraries a package may need (`DT_NEEDED`): the C runtime of this architecture and
/// nothing else, by these exact names.
#[cfg(target_arch = "x86_64")]
const ALLOWED_NEEDED: [&str; 4] = [
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
];
#[cfg(target_arch = "aarch64")]
const ALLOWED_NEEDED: [&str; 4] = [
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "ld-linux-aarch64.so.1",
];

/// The machine a library must be for.
#[cfg(target_arch = "x86_64")]
const MACHINE: elf::Machine = elf::EM_X86_64;
#[cfg(target_arch = "aarch64")]
const MACHINE: elf::Machine = elf::EM_AARCH64;

/// The dynamic tags a library may have, with their names for messages. Besides `DT_NULL`,
/// `DT_NEEDED`, `DT_STRTAB`, `DT_STRSZ`, `DT_FLAGS` and `DT_FLAGS_1`, whose values are
/// checked, each describes only the library's own image (see the module docs).
const ALLOWED_TAGS: &[(elf::DynamicTag, &str)] = &[
    (elf::DT_NULL, "DT_NULL"),
    (elf::DT_NEEDED, "DT_NEEDED"),
    (elf::DT_STRTAB, "DT_STRTAB"),
    (elf::DT_STRSZ, "DT_STRSZ"),
    (elf::DT_FLAGS, "DT_FLAGS"),
    (elf::DT_FLAGS_1, "DT_FLAGS_1"),
    (elf::DT_SYMTAB, "DT_SYMTAB"),
    (elf::DT_SYMENT, "DT_SYMENT"),
    (elf::DT_HASH, "DT_HASH"),
    (elf::DT_GNU_HASH, "DT_GNU_HASH"),
    (elf::DT_RELA, "DT_RELA"),
    (elf::DT_RELASZ, "DT_RELASZ"),
    (elf::DT_RELAENT, "DT_RELAENT"),
    (elf::DT_RELACOUNT, "DT_RELACOUNT"),
    (elf::DT_RELR, "DT_RELR"),
    (elf::DT_RELRSZ, "DT_RELRSZ"),
    (elf::DT_RELRENT, "DT_RELRENT"),
    (elf::DT_JMPREL, "DT_JMPREL"),
    (elf::DT_PLTREL, "DT_PLTREL"),
    (elf::DT_PLTRELSZ, "DT_PLTRELSZ"),
    (elf::DT_PLTGOT, "DT_PLTGOT"),
    (elf::DT_BIND_NOW, "DT_BIND_NOW"),
    (elf::DT_INIT, "DT_INIT"),
    (elf::DT_FINI, "DT_FINI"),
    (elf::DT_INIT_ARRAY, "DT_INIT_ARRAY"),
    (elf::DT_INIT_ARRAYSZ, "DT_INIT_ARRAYSZ"),
    (elf::DT_FINI_ARRAY, "DT_FINI_ARRAY"),
    (elf::DT_FINI_ARRAYSZ, "DT_FINI_ARRAYSZ"),
    (elf::DT_VERSYM, "DT_VERSYM"),
    (elf::DT_VERNEED, "DT_VERNEED"),
    (elf::DT_VERNEEDNUM, "DT_VERNEEDNUM"),
    (elf::DT_VERDEF, "DT_VERDEF"),
    (elf::DT_VERDEFNUM, "DT_VERDEFNUM"),
];

/// Names of refused tags a message should spell out (others are shown as numbers).
const REFUSED_TAG_NAMES: &[(elf::DynamicTag, &str)] = &[
    (elf::DT_RPATH, "DT_RPATH (a library search path)"),
    (elf::DT_RUNPATH, "DT_RUNPATH (a library search path)"),
    (elf::DT_AUXILIARY, "DT_AUXILIARY (loads another library)"),
    (elf::DT_FILTER, "DT_FILTER (loads another library)"),
    (elf::DT_AUDIT, "DT_AUDIT (loads an auditing library)"),
    (elf::DT_DEPAUDIT, "DT_DEPAUDIT (loads an auditing library)"),
    (
        elf::DT_SONAME,
        "DT_SONAME (the loader would take two versions for one library)",
    ),
    (elf::DT_TEXTREL, "DT_TEXTREL (text relocations)"),
    (elf::DT_PREINIT_ARRAY, "DT_PREINIT_ARRAY"),
    (elf::DT_SYMBOLIC, "DT_SYMBOLIC"),
    (elf::DT_DEBUG, "DT_DEBUG"),
];

/// The `DT_FLAGS` and `DT_FLAGS_1` bits a library may set: bind every symbol at load.
const ALLOWED_FLAGS: u64 = elf::DF_BIND_NOW.0;
const ALLOWED_FLAGS_1: u64 = elf::DF_1_NOW.0;

/// Checks `library` as the module docs say; `needed` is what the manifest claims it needs,
/// which must be what it does need.
pub(crate) fn check(library: &[u8], needed: &[String]) -> Result<(), PackageError> {
    let found = inspect(library)?;
    if found.needed != needed {
        return Err(PackageError::Elf(format!(
            "the library needs {:?}, the manifest says {needed:?}",
            found.needed
        )));
    }
    Ok(())
}

/// What [`inspect`] found in a library that passed every check.
#[derive(Debug)]
pub(crate) struct Inspected {
    /// Its `DT_NEEDED` libraries, in order.
    pub(crate) needed: Vec<String>,
}

fn bad(why: impl Into<String>) -> PackageError {
    PackageError::Elf(why.into())
}

/// Checks `library` and returns what a manifest says of it.
pub(crate) fn inspect(library: &[u8]) -> Result<Inspected, PackageError> {
    let header = FileHeader64::<Endianness>::parse(library)
        .map_err(|e| bad(format!("not a 64-bit ELF file: {e}")))?;
    let endian = header
        .endian()
        .map_err(|e| bad(format!("unknown byte order: {e}")))?;
    if endian != Endianness::default() {
        return Err(bad("not in this machine's byte order"));
    }
    if header.e_type(endian) != elf::ET_DYN {
        return Err(bad("not a shared object (ET_DYN)"));
    }
    if header.e_machine(endian) != MACHINE {
        return Err(bad(format!(
            "built for machine {}, this is {}",
            header.e_machine(endian).0,
            MACHINE.0
        )));
    }
    if header.e_phnum(endian) == elf::PN_XNUM {
        return Err(bad("extended program header numbering (PN_XNUM)"));
    }
    let segments = header
        .program_headers(endian, library)
        .map_err(|e| bad(format!("program headers: {e}")))?;
    let image = Image::new(segments, endian, library)?;
    let dynamic = image.dynamic()?;
    let mut needed_at = Vec::new();
    let (mut strtab, mut strsz) = (None, None);
    for (tag, value) in dynamic {
        match tag {
            elf::DT_NEEDED => needed_at.push(value),
            elf::DT_STRTAB => strtab = Some(value),
            elf::DT_STRSZ => strsz = Some(value),
            elf::DT_FLAGS if value & elf::DF_TEXTREL.0 != 0 => {
                return Err(bad("has text relocations (DF_TEXTREL)"));
            }
            elf::DT_FLAGS if value & !ALLOWED_FLAGS != 0 => {
                return Err(bad(format!(
                    "DT_FLAGS {value:#x} sets flags other than DF_BIND_NOW"
                )));
            }
            elf::DT_FLAGS_1 if value & !ALLOWED_FLAGS_1 != 0 => {
                return Err(bad(format!(
                    "DT_FLAGS_1 {value:#x} sets flags other than DF_1_NOW"
                )));
            }
            _ if ALLOWED_TAGS.iter().any(|(t, _)| *t == tag) => {}
            _ => return Err(bad(format!("has dynamic tag {}", tag_name(tag)))),
        }
    }
    let strings = match (strtab, strsz) {
        (Some(address), Some(size)) => image.mapped(address, size, "the dynamic string table")?,
        (None, None) if needed_at.is_empty() => &[][..],
        _ => return Err(bad("DT_NEEDED without both DT_STRTAB and DT_STRSZ")),
    };
    let mut needed = Vec::new();
    for at in needed_at {
        let name = usize::try_from(at)
            .ok()
            .and_then(|at| strings.get(at..))
            .and_then(|s| s.iter().position(|&b| b == 0).map(|end| &s[..end]))
            .and_then(|s| std::str::from_utf8(s).ok())
            .ok_or_else(|| bad("a DT_NEEDED name outside the string table"))?;
        if !ALLOWED_NEEDED.contains(&name) {
            return Err(bad(format!(
                "needs {name}, which is not one of {ALLOWED_NEEDED:?}"
            )));
        }
        needed.push(name.to_owned());
    }
    let sections = header
        .sections(endian, library)
        .map_err(|e| bad(format!("section headers: {e}")))?;
    check_glibc_versions(&sections, endian, library)?;
    check_descriptor_exported(&sections, endian, library)?;
    Ok(Inspected { needed })
}

/// A tag's name for a message: ours, or its number.
fn tag_name(tag: elf::DynamicTag) -> String {
    REFUSED_TAG_NAMES
        .iter()
        .chain(ALLOWED_TAGS)
        .find(|(t, _)| *t == tag)
        .map_or_else(
            || format!("{:#x}, which this check does not allow", tag.0),
            |(_, name)| (*name).to_owned(),
        )
}

/// The library as the loader maps it: its `PT_LOAD` segments and its one `PT_DYNAMIC`,
/// checked as the module docs say.
struct Image<'a> {
    loads: Vec<&'a ProgramHeader64<Endianness>>,
    dynamic: &'a ProgramHeader64<Endianness>,
    endian: Endianness,
    data: &'a [u8],
    page: u64,
}

impl<'a> Image<'a> {
    fn new(
        segments: &'a [ProgramHeader64<Endianness>],
        endian: Endianness,
        data: &'a [u8],
    ) -> Result<Image<'a>, PackageError> {
        let mut loads: Vec<&ProgramHeader64<Endianness>> = Vec::new();
        let (mut dynamic, mut stack) = (None, None);
        let mut seen_once = Vec::new();
        for p in segments {
            let kind = p.p_type(endian);
            let once = match kind {
                elf::PT_NULL | elf::PT_NOTE => continue,
                elf::PT_LOAD => {
                    loads.push(p);
                    continue;
                }
                elf::PT_DYNAMIC => {
                    dynamic = Some(p);
                    "PT_DYNAMIC"
                }
                elf::PT_GNU_STACK => {
                    stack = Some(p);
                    "PT_GNU_STACK"
                }
                elf::PT_PHDR => "PT_PHDR",
                elf::PT_TLS => "PT_TLS",
                elf::PT_GNU_EH_FRAME => "PT_GNU_EH_FRAME",
                elf::PT_GNU_RELRO => "PT_GNU_RELRO",
                elf::PT_GNU_PROPERTY => "PT_GNU_PROPERTY",
                elf::PT_INTERP => return Err(bad("has a program interpreter (PT_INTERP)")),
                other => {
                    return Err(bad(format!(
                        "has program header type {:#x}, which this check does not allow",
                        other.0
                    )));
                }
            };
            if seen_once.contains(&once) {
                return Err(bad(format!(
                    "has two {once} headers: the loader would act on the last"
                )));
            }
            seen_once.push(once);
        }
        match stack {
            Some(p) if p.p_flags(endian).0 & elf::PF_X.0 == 0 => {}
            Some(_) => return Err(bad("asks for an executable stack")),
            None => return Err(bad("no PT_GNU_STACK: the stack would be executable")),
        }
        let dynamic = dynamic.ok_or_else(|| bad("no dynamic segment (PT_DYNAMIC)"))?;
        if loads.is_empty() {
            return Err(bad("no PT_LOAD segment"));
        }
        let writable_code = elf::PF_W.0 | elf::PF_X.0;
        let mut end_of_last = 0;
        for p in &loads {
            if p.p_flags(endian).0 & writable_code == writable_code {
                return Err(bad("a PT_LOAD segment is both writable and executable"));
            }
            let (start, memsz) = (p.p_vaddr(endian), p.p_memsz(endian));
            let end = start
                .checked_add(memsz)
                .ok_or_else(|| bad("a PT_LOAD segment wraps around"))?;
            if p.p_filesz(endian) > memsz {
                return Err(bad("a PT_LOAD segment has more file bytes than memory"));
            }
            if start < end_of_last {
                return Err(bad(
                    "PT_LOAD segments overlap or are not in ascending address order",
                ));
            }
            end_of_last = end;
        }
        Ok(Image {
            loads,
            dynamic,
            endian,
            data,
            page: page_size(),
        })
    }

    /// The file bytes the loaded image holds at `address..address + size`, refused unless
    /// one segment maps them from its file bytes and every segment that maps a page of them
    /// maps it from the same file offset.
    fn mapped(&self, address: u64, size: u64, what: &str) -> Result<&'a [u8], PackageError> {
        let e = self.endian;
        let outside = || {
            bad(format!(
                "{what} lies outside the library's loaded file bytes"
            ))
        };
        let end = address.checked_add(size).ok_or_else(outside)?;
        let home = self
            .loads
            .iter()
            .find(|p| {
                p.p_vaddr(e) <= address
                    && p.p_vaddr(e)
                        .checked_add(p.p_filesz(e))
                        .is_some_and(|limit| end <= limit)
            })
            .ok_or_else(outside)?;
        let shift =
            |p: &ProgramHeader64<Endianness>| i128::from(p.p_offset(e)) - i128::from(p.p_vaddr(e));
        let (first_page, last_page) = (address / self.page, end.div_ceil(self.page));
        for p in &self.loads {
            let from = p.p_vaddr(e) / self.page;
            let to = p
                .p_vaddr(e)
                .saturating_add(p.p_memsz(e))
                .div_ceil(self.page);
            if from < last_page && first_page < to && shift(p) != shift(home) {
                return Err(bad(format!(
                    "two PT_LOAD segments map the pages of {what} from different file bytes"
                )));
            }
        }
        let start = u64::try_from(i128::from(address) + shift(home)).map_err(|_| outside())?;
        let range = usize::try_from(start).ok().zip(usize::try_from(size).ok());
        range
            .and_then(|(start, size)| self.data.get(start..start.checked_add(size)?))
            .ok_or_else(outside)
    }

    /// The dynamic array's entries up to `DT_NULL`, read at its address as the loader does,
    /// refused unless its file offset names the same bytes.
    fn dynamic(&self) -> Result<Vec<(elf::DynamicTag, u64)>, PackageError> {
        let (e, p) = (self.endian, self.dynamic);
        let bytes = self.mapped(p.p_vaddr(e), p.p_filesz(e), "the dynamic array")?;
        let at_offset = usize::try_from(p.p_offset(e))
            .ok()
            .and_then(|start| self.data.get(start..)?.get(..bytes.len()));
        if at_offset.map(<[u8]>::as_ptr) != Some(bytes.as_ptr()) {
            return Err(bad(
                "PT_DYNAMIC's address and file offset name different bytes",
            ));
        }
        let mut entries = Vec::new();
        for entry in bytes.chunks_exact(16) {
            let word = |at: usize| {
                let raw: [u8; 8] = entry[at..at + 8].try_into().expect("8 bytes");
                u64::from_ne_bytes(raw)
            };
            let tag = elf::DynamicTag(word(0) as i64);
            if tag == elf::DT_NULL {
                return Ok(entries);
            }
            entries.push((tag, word(8)));
        }
        Err(bad("the dynamic array has no DT_NULL within PT_DYNAMIC"))
    }
}

/// The page size the loader maps with.
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// The newest `GLIBC_x.y` the library asks for must be one this process's C library has.
fn check_glibc_versions(
    sections: &Sections<'_>,
    endian: Endianness,
    data: &[u8],
) -> Result<(), PackageError> {
    let Some((mut needs, link)) = sections
        .gnu_verneed(endian, data)
        .map_err(|e| bad(format!("symbol versions: {e}")))?
    else {
        return Ok(());
    };
    let strings = sections
        .strings(endian, data, link)
        .map_err(|e| bad(format!("symbol version names: {e}")))?;
    let ours = glibc_version();
    while let Some((_, mut versions)) = needs
        .next()
        .map_err(|e| bad(format!("symbol versions: {e}")))?
    {
        while let Some(version) = versions
            .next()
            .map_err(|e| bad(format!("symbol versions: {e}")))?
        {
            let name = version
                .name(endian, strings)
                .map_err(|e| bad(format!("a symbol version's name: {e}")))?;
            let Some(wanted) = std::str::from_utf8(name)
                .ok()
                .and_then(|n| n.strip_prefix("GLIBC_"))
                .and_then(parse_dotted)
            else {
                continue; // GLIBC_PRIVATE and other libraries' versions
            };
            if let Some(ours) = ours
                && wanted > ours
            {
                return Err(bad(format!(
                    "needs GLIBC_{}.{}, this system's C library is {}.{}",
                    wanted.0, wanted.1, ours.0, ours.1
                )));
            }
        }
    }
    Ok(())
}

/// `2.34` as (2, 34).
fn parse_dotted(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// The running C library's version, when it is glibc.
fn glibc_version() -> Option<(u32, u32)> {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: gnu_get_libc_version returns a pointer to a static, NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
        text.to_str().ok().and_then(parse_dotted)
    }
    #[cfg(not(target_env = "gnu"))]
    None
}

/// The descriptor must be a defined symbol of the dynamic symbol table.
fn check_descriptor_exported(
    sections: &Sections<'_>,
    endian: Endianness,
    data: &[u8],
) -> Result<(), PackageError> {
    let symbols = sections
        .symbols(endian, data, elf::SHT_DYNSYM)
        .map_err(|e| bad(format!("dynamic symbols: {e}")))?;
    let wanted = gossamer_package::DESCRIPTOR_SYMBOL.as_bytes();
    let exported = symbols.iter().any(|s| {
        s.st_shndx(endian) != elf::SHN_UNDEF
            && symbols.symbol_name(endian, s).is_ok_and(|n| n == wanted)
    });
    if exported {
        Ok(())
    } else {
        Err(bad(format!(
            "does not export {}: build it with gossamer_package::package!",
            gossamer_package::DESCRIPTOR_SYMBOL
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::package::{Package, Policy, SecretKey};

    include!("../../tests/common/demo_package.rs");

    /// A program header of an ELF64 library: where it is in the file, and its fields.
    struct Header {
        at: usize,
        kind: u32,
    }

    fn u64_at(lib: &[u8], at: usize) -> u64 {
        u64::from_ne_bytes(lib[at..at + 8].try_into().unwrap())
    }

    fn put_u64(lib: &mut [u8], at: usize, value: u64) {
        lib[at..at + 8].copy_from_slice(&value.to_ne_bytes());
    }

    fn headers(lib: &[u8]) -> Vec<Header> {
        let phoff = u64_at(lib, 32) as usize;
        let phnum = u16::from_ne_bytes(lib[56..58].try_into().unwrap()) as usize;
        (0..phnum)
            .map(|i| {
                let at = phoff + i * 56;
                let kind = u32::from_ne_bytes(lib[at..at + 4].try_into().unwrap());
                Header { at, kind }
            })
            .collect()
    }

    fn header(lib: &[u8], kind: elf::ProgramType) -> usize {
        headers(lib)
            .iter()
            .find(|h| h.kind == kind.0)
            .map(|h| h.at)
            .expect("the demo library has the header")
    }

    /// The last program header, which must be one the loader can do without (so that
    /// turning it into another kind changes nothing else), and after `PT_GNU_STACK`.
    fn spare_last_header(lib: &[u8]) -> usize {
        let all = headers(lib);
        let last = all.last().unwrap();
        let spare = [elf::PT_NOTE, elf::PT_GNU_EH_FRAME, elf::PT_GNU_PROPERTY];
        assert!(
            spare.iter().any(|k| k.0 == last.kind),
            "the demo library's last program header is {:#x}",
            last.kind
        );
        last.at
    }

    /// The file offset of the dynamic array's entry with `tag`.
    fn dynamic_entry(lib: &[u8], tag: elf::DynamicTag) -> usize {
        let dynamic = header(lib, elf::PT_DYNAMIC);
        let (offset, size) = (u64_at(lib, dynamic + 8), u64_at(lib, dynamic + 32));
        (offset as usize..(offset + size) as usize)
            .step_by(16)
            .find(|&at| u64_at(lib, at) as i64 == tag.0)
            .expect("the demo library has the dynamic tag")
    }

    /// The demo library's package, signed by a key of its own, and a policy that trusts it:
    /// so that a changed library signed the same way meets only the ELF checks.
    struct Signed {
        library: Vec<u8>,
        good: Package,
        key: SecretKey,
        policy: Policy,
    }

    fn signed() -> Signed {
        let key = SecretKey::generate().unwrap();
        let library = demo_library(false);
        let good = crate::package::build(library.clone(), &key).unwrap();
        let policy = Policy {
            trusted: vec![key.public()],
            max_package: 64 << 20,
            min_versions: Vec::new(),
        };
        good.verify(&policy).expect("the demo package verifies");
        Signed {
            library,
            good,
            key,
            policy,
        }
    }

    impl Signed {
        /// The ELF refusal of the demo library changed by `change`, signed by the trusted key
        /// with the manifest's needed libraries set to `needed` (or left).
        fn refusal(&self, needed: Option<&[&str]>, change: impl FnOnce(&mut Vec<u8>)) -> String {
            let mut library = self.library.clone();
            change(&mut library);
            let mut manifest = self.good.manifest().clone();
            if let Some(needed) = needed {
                manifest.needed = needed.iter().map(|n| n.to_string()).collect();
            }
            let package = Package::signed(manifest, library, &self.key);
            match package.verify(&self.policy) {
                Err(PackageError::Elf(why)) => why,
                other => panic!("the changed library was not refused by its ELF: {other:?}"),
            }
        }
    }

    #[test]
    fn a_second_stack_header_asking_for_an_executable_stack_is_refused() {
        let s = signed();
        let why = s.refusal(None, |lib| {
            let spare = spare_last_header(lib);
            lib[spare..spare + 4].copy_from_slice(&elf::PT_GNU_STACK.0.to_ne_bytes());
            lib[spare + 4..spare + 8].copy_from_slice(&7u32.to_ne_bytes()); // RWX
        });
        assert!(why.contains("two PT_GNU_STACK"), "{why}");
    }

    #[test]
    fn a_second_dynamic_header_is_refused() {
        let s = signed();
        let why = s.refusal(None, |lib| {
            let dynamic = header(lib, elf::PT_DYNAMIC);
            let spare = spare_last_header(lib);
            let copy = lib[dynamic..dynamic + 56].to_vec();
            lib[spare..spare + 56].copy_from_slice(&copy);
        });
        assert!(why.contains("two PT_DYNAMIC"), "{why}");
    }

    #[test]
    fn a_dynamic_array_whose_offset_names_a_clean_copy_is_refused() {
        let s = signed();
        let why = s.refusal(None, |lib| {
            // A clean copy at the end of the file for the offset; the array at the address
            // (the one the loader reads) then gets a DT_SONAME instead of its DT_FLAGS_1.
            let dynamic = header(lib, elf::PT_DYNAMIC);
            let (offset, size) = (u64_at(lib, dynamic + 8), u64_at(lib, dynamic + 32));
            let clean = lib[offset as usize..(offset + size) as usize].to_vec();
            let copy_at = lib.len() as u64;
            lib.extend_from_slice(&clean);
            put_u64(lib, dynamic + 8, copy_at);
            let flags = dynamic_entry_in(lib, offset, size, elf::DT_FLAGS_1);
            put_u64(lib, flags, elf::DT_SONAME.0 as u64);
            put_u64(lib, flags + 8, 1);
        });
        assert!(why.contains("address and file offset"), "{why}");
    }

    fn dynamic_entry_in(lib: &[u8], offset: u64, size: u64, tag: elf::DynamicTag) -> usize {
        (offset as usize..(offset + size) as usize)
            .step_by(16)
            .find(|&at| u64_at(lib, at) as i64 == tag.0)
            .expect("the demo library has the dynamic tag")
    }

    #[test]
    fn search_paths_filters_and_other_unlisted_tags_are_refused() {
        let s = signed();
        for (tag, expected) in [
            (elf::DT_RUNPATH, "DT_RUNPATH"),
            (elf::DT_RPATH, "DT_RPATH"),
            (elf::DT_AUXILIARY, "DT_AUXILIARY"),
            (elf::DT_FILTER, "DT_FILTER"),
            (elf::DT_AUDIT, "DT_AUDIT"),
            (elf::DynamicTag(0x6fff_fdf0), "0x6ffffdf0"),
        ] {
            // In place of DT_FLAGS_1, naming the string "libc.so.6" (as a directory or a
            // library, whichever the tag takes).
            let why = s.refusal(None, |lib| {
                let libc = lib.windows(10).position(|w| w == b"libc.so.6\0").unwrap();
                let strtab = u64_at(lib, dynamic_entry(lib, elf::DT_STRTAB) + 8) as usize;
                let entry = dynamic_entry(lib, elf::DT_FLAGS_1);
                put_u64(lib, entry, tag.0 as u64);
                put_u64(lib, entry + 8, (libc - strtab) as u64);
            });
            assert!(why.contains(expected), "{expected}: {why}");
        }
    }

    #[test]
    fn the_other_architectures_loader_is_refused() {
        let s = signed();
        let (ours, theirs) = if cfg!(target_arch = "x86_64") {
            ("ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1")
        } else {
            ("ld-linux-aarch64.so.1", "ld-linux-x86-64.so.2")
        };
        let needed = ["libgcc_s.so.1", "libc.so.6", theirs];
        let why = s.refusal(Some(&needed), |lib| {
            let at = lib
                .windows(ours.len())
                .position(|w| w == ours.as_bytes())
                .unwrap();
            lib[at..at + theirs.len()].copy_from_slice(theirs.as_bytes());
            lib[at + theirs.len()] = 0;
            // The loader's name is the table's last string: the table grows by the byte.
            let size = dynamic_entry(lib, elf::DT_STRSZ) + 8;
            let grown = u64_at(lib, size) + 1;
            put_u64(lib, size, grown);
        });
        assert!(why.contains(theirs), "{why}");
    }

    #[test]
    fn changed_headers_and_dynamic_arrays_are_judged_without_panics() {
        let library = demo_library(false);
        inspect(&library).expect("the demo library passes");
        let phoff = u64_at(&library, 32) as usize;
        let headers_end = phoff + headers(&library).len() * 56;
        let dynamic = header(&library, elf::PT_DYNAMIC);
        let (offset, size) = (
            u64_at(&library, dynamic + 8),
            u64_at(&library, dynamic + 32),
        );
        let places = (0..headers_end).chain(offset as usize..(offset + size) as usize);
        let mut changed = library.clone();
        for at in places {
            for flip in [0x01, 0x80, 0xff] {
                changed[at] ^= flip;
                let _ = inspect(&changed);
                changed[at] ^= flip;
            }
        }
        for len in [0, 16, 63, 64, phoff + 56, headers_end, offset as usize + 8] {
            assert!(inspect(&library[..len]).is_err(), "cut at {len}");
        }
    }

    #[test]
    fn writable_code_is_refused() {
        let s = signed();
        let why = s.refusal(None, |lib| {
            let text = headers(lib)
                .iter()
                .find(|h| {
                    h.kind == elf::PT_LOAD.0
                        && u32::from_ne_bytes(lib[h.at + 4..h.at + 8].try_into().unwrap()) & 1 != 0
                })
                .unwrap()
                .at;
            lib[text + 4..text + 8].copy_from_slice(&7u32.to_ne_bytes()); // RWX
        });
        assert!(why.contains("writable and executable"), "{why}");
    }

    #[test]
    fn versions_compare_by_number() {
        assert_eq!(parse_dotted("2.34"), Some((2, 34)));
        assert_eq!(parse_dotted("2"), Some((2, 0)));
        assert!(parse_dotted("2.3") < parse_dotted("2.34"));
        assert!(glibc_version().is_some_and(|v| v >= (2, 17)));
    }

    #[test]
    fn this_test_binary_is_no_package() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        // An executable (ET_DYN for PIE, but without the descriptor), or refused earlier.
        let err = inspect(&exe).unwrap_err().to_string();
        assert!(!err.is_empty());
        assert!(inspect(b"not an elf file at all").is_err());
    }
}
