// Bindings of lmr::files: the atomic, durable file write every artifact and report uses.
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/string.h>

#include <filesystem>

#include "bindings.h"
#include "lmr/common/files.h"

namespace nb = nanobind;

namespace lmr::python {

void registerFiles(nb::module_& m) {
  m.def(
      "write_text_atomic",
      [](const std::filesystem::path& path, const std::string& text) {
        nb::gil_scoped_release release;  // fsync blocks
        files::replaceFile(path.string(), text);
      },
      nb::arg("path"), nb::arg("text"),
      "Replaces `path` by `text` (UTF-8) atomically: a temporary file beside it, fsync, rename, fsync of the "
      "directory. Readers see the old or the new file, never a partial one. Raises LmrIOError naming the path.");
}

}  // namespace lmr::python
