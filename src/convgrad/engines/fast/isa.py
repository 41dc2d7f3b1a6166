"""Kernel families by instruction set: which the host CPU can run, and which the engine uses.

A *family* is a set of JIT micro-kernels compiled for one vector width (:mod:`.microkernel`):

================  ======  ====================================================================
family            width   needs (LLVM feature names of ``llvmlite.binding.get_host_cpu_features``)
================  ======  ====================================================================
``amx_bf16``      16      ``avx512_bf16``'s and amx-tile, amx-bf16 (bf16 on AMX tiles, :mod:`.tiles`)
``avx512_bf16``   16      avx512f, avx512bf16 (bf16 data on the bf16 dot-product kernel, f32 sums)
``avx512``        16      avx512f
``avx2``          8       avx2, fma
``portable``      --      nothing: no JIT kernels, the fast engine's BLAS-based strategies
================  ======  ====================================================================

The best family the host supports is chosen at import. ``CONVGRAD_ISA=<family>`` (read at
import, or :func:`set_family` at run time) forces a lower one, so that every family the machine
can run is testable on it; asking for one the CPU cannot run raises :class:`ConvgradError`
(never an illegal-instruction crash). Vector code of width 16 on an AVX2 host is legalised by
LLVM into pairs of 8-wide operations, so the ``avx512`` family's code path is *correct* there and
can be forced for testing with ``allow_emulated=True`` (its speed means nothing there); so can
``avx512_bf16``, whose bf16 kernel then runs a plain-IR stand-in of the dot-product instruction
(:mod:`.microkernel`), and ``amx_bf16``, whose tiles then run a stand-in too (:mod:`.tiles`).
``amx_bf16`` also needs Linux to grant the process the tile state (:func:`tiles_permitted`).
"""

from __future__ import annotations

import functools
from pathlib import Path

from ...environment import env
from ...errors import ConvgradError

__all__ = ["FAMILIES", "WIDTH", "PAIRS", "host_features", "supported", "family", "set_family", "bf16_host", "bf16_native",
           "bf16_kernel", "pairs", "tiles_permitted", "cache_sizes", "halved_vectors", "ISAError"]

#: Families from the most capable down, and the CPU features each needs.
FAMILIES: dict[str, frozenset[str]] = {
    "amx_bf16": frozenset({"avx512f", "avx512bf16", "amx-tile", "amx-bf16"}),
    "avx512_bf16": frozenset({"avx512f", "avx512bf16"}),
    "avx512": frozenset({"avx512f"}),
    "avx2": frozenset({"avx2", "fma"}),
    "portable": frozenset(),
}
#: f32 lanes per vector register of each JIT family.
WIDTH = {"amx_bf16": 16, "avx512_bf16": 16, "avx512": 16, "avx2": 8}
#: Families whose kernels take bf16 data as bf16 pairs (the dot instruction's or the tiles' layout).
PAIRS = ("amx_bf16", "avx512_bf16")
#: Families whose vector code LLVM can legalise onto a narrower host (correct, not fast).
_EMULABLE = {"amx_bf16": "avx2", "avx512_bf16": "avx2", "avx512": "avx2"}


class ISAError(ConvgradError, ValueError):
    """A kernel family was asked for that is unknown or that this CPU cannot run."""


@functools.cache
def host_features() -> frozenset[str]:
    """The host CPU's enabled features, as LLVM names them (``avx2``, ``fma``, ``avx512f``...)."""
    from llvmlite import binding
    return frozenset(name for name, on in binding.get_host_cpu_features().items() if on)


#: Per-core L1 data, L2 and shared L3 sizes where the host does not say (a Zen 4's).
_CACHE_DEFAULTS = (32 << 10, 1 << 20, 32 << 20)


@functools.cache
def cache_sizes() -> tuple[int, int, int]:
    """Bytes of the L1 data, L2 and L3 caches of CPU 0 (Linux's sysfs; :data:`_CACHE_DEFAULTS`
    for what it does not tell)."""
    found: dict[int, int] = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")) if root.is_dir() else []:
        try:
            level, kind = int((index / "level").read_text()), (index / "type").read_text().strip()
            size = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
        if kind in ("Data", "Unified") and size.rstrip("KM").isdigit():
            found[level] = int(size.rstrip("KM")) * scale
    return tuple(found.get(level, _CACHE_DEFAULTS[level - 1]) for level in (1, 2, 3))  # type: ignore[return-value]


#: LLVM's names of CPUs that run each 512-bit operation as two 256-bit halves (AMD Zen 4).
_HALVED = frozenset({"znver4"})


@functools.cache
def halved_vectors() -> bool:
    """Whether the host runs 512-bit vector operations as two 256-bit halves (LLVM's CPU name in
    :data:`_HALVED`): register blocks measured best there differ from full-width cores'."""
    return _cpu_name() in _HALVED


def supported() -> list[str]:
    """The families this host can run, best first (``portable`` always)."""
    have = host_features()
    return [name for name, needs in FAMILIES.items() if needs <= have and (name != "amx_bf16" or tiles_permitted())]


@functools.cache
def tiles_permitted() -> bool:
    """Whether this process may use AMX tiles: Linux's ``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)`` granted (asked once; a kernel without it, or another OS: False)."""
    if not {"amx-tile", "amx-bf16"} <= host_features():
        return False
    import ctypes
    import ctypes.util
    import platform
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    sys_arch_prctl, req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    return libc.syscall(sys_arch_prctl, req_xcomp_perm, xfeature_xtiledata) == 0


def _check(name: str, allow_emulated: bool) -> str:
    if name not in FAMILIES:
        raise ISAError(None, f"CONVGRAD_ISA={name!r} is not a kernel family: expected one of {', '.join(FAMILIES)}")
    have = supported()
    if name in have or (allow_emulated and _EMULABLE.get(name) in have):
        return name
    missing = sorted(FAMILIES[name] - host_features())
    if not missing:
        raise ISAError(None, f"kernel family {name!r}: the operating system did not grant this process the AMX "
                       f"tile state (arch_prctl ARCH_REQ_XCOMP_PERM): expected one of {', '.join(have)}")
    raise ISAError(None, f"kernel family {name!r} needs CPU features {', '.join(missing)} that this CPU "
                   f"({_cpu_name()}) lacks: expected one of {', '.join(have)}")


def _cpu_name() -> str:
    from llvmlite import binding
    return binding.get_host_cpu_name()


_current: list[str] = []
_standin: list[bool] = [False]


def bf16_host() -> bool:
    """Whether this CPU has the AVX512_BF16 dot-product instruction."""
    return "avx512bf16" in host_features()


def bf16_native() -> bool:
    """Whether the family's bf16 kernels run the instructions themselves (else their bit-exact
    stand-ins: on CPUs without them, or where :func:`set_family` asked for the stand-ins)."""
    return (tiles_permitted() if family() == "amx_bf16" else bf16_host()) and not _standin[0]


def pairs() -> bool:
    """Whether the family's kernels take bf16 data as bf16 pairs (:data:`PAIRS`)."""
    return family() in PAIRS


def bf16_kernel() -> int:
    """The bf16 kernel the family's drivers compile (:func:`.microkernel.run`'s ``native``):
    0/1 the dot instruction's stand-in / the instruction, 2/3 AMX tiles' stand-in / the tiles."""
    return 2 * (family() == "amx_bf16") + bf16_native()


def family() -> str:
    """The family the engine uses now: ``CONVGRAD_ISA`` at first use, else the host's best."""
    if not _current:
        forced = env("CONVGRAD_ISA")
        _current.append(_check(forced, allow_emulated=False) if forced else supported()[0])
    return _current[0]


def set_family(name: str | None, allow_emulated: bool = False, standin: bool = False) -> str:
    """Use family ``name`` from now on (``None``: the host's best); returns the one used before.
    ``allow_emulated``: accept ``avx512``/``avx512_bf16``/``amx_bf16`` on an AVX2 host (LLVM splits their vectors,
    the bf16 dot product runs a stand-in; for tests). ``standin``: the bf16 kernels run the
    stand-in even where the CPU has the instruction (the emulated twins of native tests)."""
    before = family()
    _current[:] = [_check(name, allow_emulated) if name else supported()[0]]
    _standin[0] = standin
    return before
