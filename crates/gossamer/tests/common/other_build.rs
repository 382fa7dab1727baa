//! Another build of a test executable, for the tests of what happens between builds (only
//! gossamer's own tests: it reads ELF with `object`, a dependency of gossamer).

/// Writes to `path` a copy of this executable that is another build to the rack: the same
/// code with its ELF build-id note changed (the note is what a rank's build identity comes
/// from), executable.
pub(crate) fn write_other_build(path: &std::path::Path) {
    use object::read::elf::{FileHeader, ProgramHeader};
    let mut image = std::fs::read(std::env::current_exe().expect("this executable's path"))
        .expect("read this executable");
    let note = {
        let header = object::elf::FileHeader64::<object::Endianness>::parse(&*image)
            .expect("this executable is a 64-bit ELF file");
        let endian = header.endian().expect("its byte order");
        let mut found = None;
        for segment in header
            .program_headers(endian, &*image)
            .expect("its program headers")
        {
            let Some(mut notes) = segment.notes(endian, &*image).expect("its notes") else {
                continue;
            };
            while let Some(note) = notes.next().expect("a note") {
                if note.name() == object::elf::ELF_NOTE_GNU
                    && note.n_type(endian) == object::elf::NT_GNU_BUILD_ID
                {
                    let desc = note.desc();
                    let at = desc.as_ptr() as usize - image.as_ptr() as usize;
                    found = Some(at..at + desc.len());
                }
            }
        }
        found.expect("this executable has a build-id note (linked with --build-id)")
    };
    image[note].iter_mut().for_each(|b| *b = !*b);
    std::fs::write(path, image).expect("write the other build");
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("make the other build executable");
}
