"""Shared by the kernel generators (generate_*.py): the text of the instantiation units and
headers of the launchers with one params argument, and the removal of leftovers (setup.py
builds every csrc/cuda/*.cu it finds)."""
import re
from pathlib import Path


def remove_stale(directory: Path, pattern: str, keep: set) -> None:
    """Deletes the generated files (names matching `pattern` in full) not in `keep`."""
    regex = re.compile(pattern)
    for path in directory.glob("*.cu"):
        if regex.fullmatch(path.name) and path.name not in keep:
            path.unlink()
            print("removed", path.name)


def instantiation_unit(banner: str, header: str, launcher: str, targs: list,
                       params: str = "FwdParams") -> str:
    """A .cu of explicit instantiations of `launcher<t>(const params&, cudaStream_t)` for t in
    targs."""
    return (
        banner
        + f'#include "{header}"\n\n'
        + "namespace psa_fa2 {\n"
        + "".join(f"template void {launcher}<{t}>(\n    const {params}&, cudaStream_t);\n"
                  for t in targs)
        + "}  // namespace psa_fa2\n"
    )


def instances_header(banner: str, what: str, template: str, launcher: str, targs: list,
                     macro: str, x_doc: str, x_args: list, params: str = "FwdParams",
                     launcher_doc: str = "") -> str:
    """The header declaring `launcher`'s instantiations (extern templates) and the X-macro
    `macro` that lists them for the dispatch: X(<a>) for a in x_args. launcher_doc: comment
    lines above the launcher's declaration."""
    lines = [
        banner,
        f"// Declarations of the {what} instantiations and the list the dispatch walks.\n",
        "#pragma once\n\n",
        "#include <cuda_runtime.h>\n\n",
        '#include "attention_params.h"\n\n',
        "namespace psa_fa2 {\n\n",
        launcher_doc,
        f"template <{template}>\n",
        f"void {launcher}(const {params}& params, cudaStream_t stream);\n\n",
    ]
    lines += [f"extern template void {launcher}<{t}>(\n    const {params}&, cudaStream_t);\n"
              for t in targs]
    lines.append("\n}  // namespace psa_fa2\n\n")
    lines.append(f"// X({x_doc}) for every instantiation above.\n")
    lines.append(f"#define {macro}(X) \\\n")
    lines.append(" \\\n".join(f"  X({a})" for a in x_args) + "\n")
    return "".join(lines)
