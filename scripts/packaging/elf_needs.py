"""Fail when an ELF file inside a wheel needs a library outside the manylinux allowlist.

auditwheel's repair would copy such a library into the wheel; our wheels must need none: Gloo
and the C++ runtime are linked in, CUDA's runtime is static. Prints each ELF file with the
libraries it needs and the newest glibc symbol version it uses.
Usage: python scripts/packaging/elf_needs.py WHEEL
"""

import io
import re
import sys
import zipfile

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

ALLOWED = {"libc.so.6", "libm.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "libpthread.so.0",
           "libdl.so.2", "librt.so.1"}


def _glibc(version):
    return tuple(int(part) for part in version.split("_", 1)[1].split("."))


def main(path):
    problems, seen = [], 0
    with zipfile.ZipFile(path) as wheel:
        for name in wheel.namelist():
            data = wheel.read(name)
            if not data.startswith(b"\x7fELF"):
                continue
            seen += 1
            elf = ELFFile(io.BytesIO(data))
            needed = [tag.needed for section in elf.iter_sections() if isinstance(section, DynamicSection)
                      for tag in section.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]
            versions = [aux.name for section in elf.iter_sections() if isinstance(section, GNUVerNeedSection)
                        for _, auxes in section.iter_versions() for aux in auxes
                        if re.fullmatch(r"GLIBC_[0-9.]+", aux.name)]
            newest = max(versions, key=_glibc, default="none")
            print(f"{name}: needs {', '.join(needed) or 'nothing'}; newest glibc symbol {newest}")
            problems += [f"{name} needs {lib}, outside the manylinux allowlist" for lib in needed
                         if lib not in ALLOWED]
    if seen == 0:
        problems.append(f"{path}: no ELF file (a wheel without the engine?)")
    for problem in problems:
        print("error:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
