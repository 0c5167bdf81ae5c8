"""The ctypes mirrors in flashspan._lib match flashspan.h field by field (offsets and sizes from a C compiler)."""

import ctypes
import os
import shutil
import subprocess

import flashspan._lib as L
import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_HEADER_DIR = os.path.join(_REPO, "include")

STRUCTS = {
    "fs_device_t": L.FsDevice,
    "fs_dtype_t": L.FsDType,
    "fs_tensor_t": L.FsTensor,
    "fs_mask_plan_args_t": L.FsMaskPlanArgs,
    "fs_mask_plan_info_t": L.FsMaskPlanInfo,
    "fs_flex_fwd_args_t": L.FsFlexFwdArgs,
    "fs_flex_bwd_args_t": L.FsFlexBwdArgs,
}


def test_struct_layouts_match_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to read the header's layout")
    if not os.path.exists(os.path.join(_HEADER_DIR, "flashspan", "flashspan.h")):
        pytest.skip("flashspan.h not found (installed package without sources)")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "flashspan/flashspan.h"', "int main(void) {"]
    for cname, cls in STRUCTS.items():
        lines.append(f'  printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for field, _ in cls._fields_:
            where = f"offsetof({cname}, {field}), sizeof((({cname}*)0)->{field})"
            lines.append(f'  printf("{cname} {field} %zu %zu\\n", {where});')
    lines += ["  return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", _HEADER_DIR, str(src), "-o", str(exe)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        cls = STRUCTS[parts[0]]
        if parts[1] == "sizeof":
            assert ctypes.sizeof(cls) == int(parts[2]), f"sizeof({parts[0]})"
        else:
            f = getattr(cls, parts[1])
            assert (f.offset, f.size) == (int(parts[2]), int(parts[3])), f"{parts[0]}.{parts[1]} offset/size"


def test_every_header_function_is_declared():
    with open(os.path.join(_HEADER_DIR, "flashspan", "flashspan.h")) as f:
        text = f.read()
    import re

    declared = set(re.findall(r"FS_API\s+[\w\s\*]+?\b(fs_\w+)\s*\(", text))
    assert declared, "no FS_API function found in the header"
    import flashspan._sdpa_lib as S

    bound = set(L._SIGNATURES) | set(S.SIGNATURES)
    assert not set(L._SIGNATURES) & set(S.SIGNATURES), "a function is declared in both _lib and _sdpa_lib"
    assert declared == bound, f"header vs _lib + _sdpa_lib: {sorted(declared ^ bound)}"


def test_abi_version_matches_header():
    with open(os.path.join(_HEADER_DIR, "flashspan", "flashspan.h")) as f:
        text = f.read()
    import re

    assert int(re.search(r"#define FLASHSPAN_ABI_VERSION (\d+)", text).group(1)) == L.ABI_VERSION
