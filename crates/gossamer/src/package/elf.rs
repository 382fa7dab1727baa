//! What a package's library must look like before it is mapped: a shared object for this
//! machine that needs only the C runtime, asks for no writable code and no executable stack,
//! has no `DT_SONAME` (the loader would take two libraries of one soname for one), exports
//! the descriptor, and was linked against a C library no newer than this one.
//!
//! The checks read the *program headers* and the `PT_DYNAMIC` segment, which are what the
//! dynamic loader acts on (section headers are for tools and may say anything). The symbol
//! versions and the exported symbol are read from sections: a lie there only makes `dlopen`
//! or `dlsym` fail, which the loader reports.

use object::Endianness;
use object::elf::{self, FileHeader64};
use object::read::elf::{Dyn, FileHeader, ProgramHeader, SectionTable, Sym};

/// The section headers of a library being checked.
type Sections<'a> = SectionTable<'a, FileHeader64<Endianness>>;

use super::PackageError;

/// The libraries a package may need (`DT_NEEDED`): the C runtime and nothing else.
const ALLOWED_NEEDED: [&str; 5] = [
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
];

/// The machine a library must be for.
#[cfg(target_arch = "x86_64")]
const MACHINE: elf::Machine = elf::EM_X86_64;
#[cfg(target_arch = "aarch64")]
const MACHINE: elf::Machine = elf::EM_AARCH64;

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

/// Checks `library` and returns what a manifest says of it.
pub(crate) fn inspect(library: &[u8]) -> Result<Inspected, PackageError> {
    let bad = |why: String| PackageError::Elf(why);
    let header = FileHeader64::<Endianness>::parse(library)
        .map_err(|e| bad(format!("not a 64-bit ELF file: {e}")))?;
    let endian = header
        .endian()
        .map_err(|e| bad(format!("unknown byte order: {e}")))?;
    if header.e_type(endian) != elf::ET_DYN {
        return Err(bad("not a shared object (ET_DYN)".into()));
    }
    if header.e_machine(endian) != MACHINE {
        return Err(bad(format!(
            "built for machine {}, this is {}",
            header.e_machine(endian).0,
            MACHINE.0
        )));
    }
    let segments = header
        .program_headers(endian, library)
        .map_err(|e| bad(format!("program headers: {e}")))?;
    let stack = segments
        .iter()
        .find(|p| p.p_type(endian) == elf::PT_GNU_STACK);
    match stack {
        Some(p) if p.p_flags(endian).0 & elf::PF_X.0 == 0 => {}
        Some(_) => return Err(bad("asks for an executable stack".into())),
        None => return Err(bad("no PT_GNU_STACK: the stack would be executable".into())),
    }
    let dynamic = segments
        .iter()
        .find_map(|p| p.dynamic(endian, library).transpose())
        .ok_or_else(|| bad("no dynamic segment".into()))?
        .map_err(|e| bad(format!("dynamic segment: {e}")))?;
    let mut needed_at = Vec::new();
    let (mut strtab, mut strsz) = (None, None);
    for entry in dynamic {
        let tag = entry.d_tag(endian);
        let value: u64 = entry.d_val(endian);
        match tag {
            elf::DT_NULL => break,
            elf::DT_NEEDED => needed_at.push(value),
            elf::DT_TEXTREL => return Err(bad("has text relocations (DT_TEXTREL)".into())),
            elf::DT_FLAGS if value & elf::DF_TEXTREL.0 != 0 => {
                return Err(bad("has text relocations (DF_TEXTREL)".into()));
            }
            elf::DT_SONAME => {
                return Err(bad(
                    "has a DT_SONAME: the loader would take two versions for one library".into(),
                ));
            }
            elf::DT_STRTAB => strtab = Some(value),
            elf::DT_STRSZ => strsz = Some(value),
            _ => {}
        }
    }
    let strings = match (strtab, strsz) {
        (Some(address), Some(size)) => file_range(segments, endian, address, size, library)
            .ok_or_else(|| bad("the dynamic string table lies outside the file".into()))?,
        _ => &[][..],
    };
    let mut needed = Vec::new();
    for at in needed_at {
        let name = strings
            .get(at as usize..)
            .and_then(|s| s.split(|&b| b == 0).next())
            .and_then(|s| std::str::from_utf8(s).ok())
            .ok_or_else(|| bad("a DT_NEEDED name outside the string table".into()))?;
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

/// The file bytes that the loaded image holds at `address..address + size`, found through
/// the `PT_LOAD` segment that maps them.
fn file_range<'a>(
    segments: &[elf::ProgramHeader64<Endianness>],
    endian: Endianness,
    address: u64,
    size: u64,
    data: &'a [u8],
) -> Option<&'a [u8]> {
    let end = address.checked_add(size)?;
    let p = segments.iter().find(|p| {
        p.p_type(endian) == elf::PT_LOAD
            && p.p_vaddr(endian) <= address
            && p.p_vaddr(endian)
                .checked_add(p.p_filesz(endian))
                .is_some_and(|limit| end <= limit)
    })?;
    let start = address - p.p_vaddr(endian) + p.p_offset(endian);
    data.get(usize::try_from(start).ok()?..usize::try_from(start.checked_add(size)?).ok()?)
}

/// The newest `GLIBC_x.y` the library asks for must be one this process's C library has.
fn check_glibc_versions(
    sections: &Sections<'_>,
    endian: Endianness,
    data: &[u8],
) -> Result<(), PackageError> {
    let bad = |why: String| PackageError::Elf(why);
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
    let bad = |why: String| PackageError::Elf(why);
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
