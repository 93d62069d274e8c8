"""Source to wasm bytes: WAT text, a `.wasm` binary as is, or C via clang against wasi-libc.

The result carries the compiler's identity (tool, version, flags, and a hash of the libraries
linked in) so that the stored module can be traced to exactly what produced it. Sizes are
checked before anything is parsed or compiled: an oversized input is refused, not attempted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import blake3

from ledger.capabilities.runtime import wasmtime_version
from ledger.errors import BadInput, Refused

MAX_SOURCE_BYTES = 32 << 20   # WAT / C text
MAX_MODULE_BYTES = 8 << 20    # the .wasm a capability may be; C with wasi-libc is ~100 KiB
WASM_MAGIC = b"\0asm\x01\x00\x00\x00"
C_TARGET = "wasm32-wasi"      # clang 14 (Debian 12) knows wasm32-wasi, not wasm32-wasip1
C_FLAGS = ("-O2", "-mexec-model=reactor", "-Wl,--strip-debug")
C_PACKAGES = "clang lld wasi-libc libclang-rt-dev-wasm32"
C_TIMEOUT_S = 120


@dataclass(frozen=True)
class Compiled:
    language: str        # "wat" | "wasm" | "c"
    source: bytes
    wasm: bytes
    compiler: dict       # identity: stored as its own object at admission


def language_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix in (".wat", ".wast"):
        return "wat"
    if suffix == ".wasm":
        return "wasm"
    if suffix == ".c":
        return "c"
    raise BadInput(f"{path}: unknown source kind {suffix or '(no suffix)'}", "give a .wat, .wasm or .c file")


def read_source(path: Path, limit: int) -> bytes:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise BadInput(f"source {path} does not exist") from None
    if not path.is_file():
        raise BadInput(f"source {path} is not a regular file")
    if size > limit:
        raise Refused(
            f"{path} is {size} bytes; the limit is {limit} bytes",
            "capabilities are small functions; split or shrink it",
            size=size,
            limit=limit,
        )
    return path.read_bytes()


def check_module_size(size: int, limit: int = MAX_MODULE_BYTES) -> None:
    if size > limit:
        raise Refused(f"the wasm module is {size} bytes; the limit is {limit} bytes",
                      "capabilities are small functions; strip it or split it", size=size, limit=limit)


def compile_source(path: str | Path, *, max_module_bytes: int = MAX_MODULE_BYTES,
                   max_source_bytes: int = MAX_SOURCE_BYTES) -> Compiled:
    path = Path(path)
    lang = language_of(path)
    if lang == "wasm":
        data = read_source(path, max_module_bytes)
        if not data.startswith(WASM_MAGIC):
            raise BadInput(f"{path} is not a core wasm module (bad magic or version)",
                           "components and other layers are not capabilities; give a wasm32-wasi core module")
        return Compiled("wasm", data, data, {"kind": "wasm-compiler", "language": "wasm", "tool": "none"})
    src = read_source(path, max_source_bytes)
    if lang == "wat":
        wasm, ident = _wat(src, path)
    else:
        wasm, ident = _c(src, path)
    check_module_size(len(wasm), max_module_bytes)
    return Compiled(lang, src, wasm, ident)


def _wat(src: bytes, path: Path) -> tuple[bytes, dict]:
    import wasmtime


    try:
        text = src.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path} is not UTF-8 text") from None
    try:
        wasm = bytes(wasmtime.wat2wasm(text))
    except wasmtime.WasmtimeError as e:
        lines = str(e).splitlines()
        where = next((x.strip().removeprefix("--> <anon>:") for x in lines if x.strip().startswith("-->")), "")
        raise BadInput(f"{path}{':' + where if where else ''}: invalid WAT: {lines[0] if lines else e}",
                       "fix the WAT text at the line:column named") from None
    return wasm, {"kind": "wasm-compiler", "language": "wat", "tool": "wasmtime.wat2wasm", "version": wasmtime_version()}


# --- C ---------------------------------------------------------------------------------------
def _missing(what: str) -> BadInput:
    return BadInput(f"cannot compile C to wasm: {what}",
                    f"install the toolchain (Debian/Ubuntu: apt-get install {C_PACKAGES}), or give .wat/.wasm")


def _run(cmd: list[str], what: str) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=C_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise _missing(f"{cmd[0]} is not installed") from None
    except subprocess.TimeoutExpired:
        raise Refused(f"{what} took more than {C_TIMEOUT_S} s", "simplify the source") from None
    if p.returncode != 0:
        said = (p.stderr or p.stdout).strip()
        raise BadInput(f"{what} failed: {said.splitlines()[-1] if said else p.returncode}",
                       "fix the C source (the compiler's message is above)", stderr=p.stderr[-4000:])
    return p.stdout


def _file_b3(p: Path) -> str:

    h = blake3.blake3()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()   # bare hex on purpose: a `b3:` id here would read as a store reference


def c_toolchain() -> dict:
    """clang + wasi-libc + the wasm32 builtins, or a BadInput naming the Debian packages."""
    clang = shutil.which("clang")
    if clang is None:
        raise _missing("clang is not installed")
    version = _run([clang, "--version"], "clang --version").splitlines()[0].strip()
    libc = Path(_run([clang, f"--target={C_TARGET}", "-print-file-name=libc.a"], "clang -print-file-name").strip())
    if not libc.is_absolute() or not libc.is_file():
        raise _missing("wasi-libc (libc.a for wasm32-wasi) is not installed")
    builtins = Path(_run([clang, f"--target={C_TARGET}", "--rtlib=compiler-rt", "-print-libgcc-file-name"],
                         "clang -print-libgcc-file-name").strip())
    if not builtins.is_file():
        raise _missing(f"the wasm32 compiler-rt builtins ({builtins.name}) are not installed")
    # clang looks for wasm-ld beside its own binary first, then on PATH.
    if not (Path(os.path.realpath(clang)).parent / "wasm-ld").exists() and shutil.which("wasm-ld") is None:
        raise _missing("the wasm linker wasm-ld (lld) is not installed")
    return {"clang": clang, "version": version, "libc": libc, "builtins": builtins}


def _c(src: bytes, path: Path) -> tuple[bytes, dict]:
    tc = c_toolchain()
    with tempfile.TemporaryDirectory(prefix="ledger-cc-") as d:
        # Compile a copy under a fixed name in a fixed-shape folder so that the output does not
        # depend on where the user keeps the file.
        srcp = Path(d) / "capability.c"
        srcp.write_bytes(src)
        out = Path(d) / "capability.wasm"
        flags = [f"--target={C_TARGET}", *C_FLAGS]
        _run([tc["clang"], *flags, "-o", str(out), str(srcp)], f"clang {path.name}")
        check_module_size(out.stat().st_size)   # before reading it in
        wasm = out.read_bytes()
    ident = {"kind": "wasm-compiler", "language": "c", "tool": "clang", "version": tc["version"], "target": C_TARGET,
             "flags": list(C_FLAGS), "libc_blake3": _file_b3(tc["libc"]), "builtins_blake3": _file_b3(tc["builtins"])}
    return wasm, ident
