"""Host functions and compiled kernels as XLA custom calls of the typed FFI, for :mod:`convgrad.jax`.

``kernel_target()`` is one target whose handler is compiled (a numba ``cfunc``): it calls the
numba function whose address leads its int32 parameter operand on the addresses of the call's
buffers (:func:`kernel_params`), no Python at run time.

``host_target(host)`` registers a handler (a ctypes callback; XLA's C structs from
``xla/ffi/api/c_api.h``, FFI API 0.1) that views the call's buffers as NumPy arrays, runs
``host(*arrays)``, copies its result into the output buffer, and returns the target's name for
``jax.ffi.ffi_call``. An exception in ``host`` becomes the call's error: JAX raises its own
(``JaxRuntimeError`` or ``ValueError``) with the code (``RESOURCE_EXHAUSTED`` for a
:class:`~convgrad.errors.ResourceError`, else ``INVALID_ARGUMENT``), the exception's class name
and message. A warm call costs about 8 µs more than a plain ``jax.jit`` call besides the host
function (Zen 4), where ``jax.pure_callback`` cost 190 (benchmarks/OVERHEAD.md).
"""

from __future__ import annotations

import ctypes as C
import functools
import itertools
import math
import struct
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from numba import types

from . import addresses
from .dtypes import bfloat16
from .engines.fast import microkernel
from .errors import ResourceError
from .memo import Memo

__all__ = ["host_target", "kernel_target", "kernel_params"]


class _Extension(C.Structure):
    pass


_Extension._fields_ = [("struct_size", C.c_size_t), ("type", C.c_int), ("next", C.POINTER(_Extension))]


class _Version(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("major", C.c_int), ("minor", C.c_int)]


class _Metadata(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("api_version", _Version), ("traits", C.c_uint32)]


class _MetadataExtension(C.Structure):
    _fields_ = [("base", _Extension), ("metadata", C.POINTER(_Metadata))]


class _Buffer(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("dtype", C.c_int),
                ("data", C.c_void_p), ("rank", C.c_int64), ("dims", C.POINTER(C.c_int64))]


class _Buffers(C.Structure):  # XLA_FFI_Args and XLA_FFI_Rets
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("size", C.c_int64),
                ("types", C.c_void_p), ("buffers", C.POINTER(C.POINTER(_Buffer)))]


class _ErrorArgs(C.Structure):
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("message", C.c_char_p),
                ("code", C.c_int)]


class _Api(C.Structure):  # the fields up to XLA_FFI_Error_Create
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.c_void_p), ("api_version", _Version),
                ("internal_api", C.c_void_p), ("error_create", C.CFUNCTYPE(C.c_void_p, C.POINTER(_ErrorArgs)))]


class _CallFrame(C.Structure):  # the fields up to the results
    _fields_ = [("struct_size", C.c_size_t), ("extension_start", C.POINTER(_Extension)), ("api", C.POINTER(_Api)),
                ("ctx", C.c_void_p), ("stage", C.c_int), ("args", _Buffers), ("rets", _Buffers)]


_Handler = C.CFUNCTYPE(C.c_void_p, C.c_void_p)
_METADATA = 1                                  # XLA_FFI_Extension_Metadata
_INVALID_ARGUMENT, _RESOURCE_EXHAUSTED = 3, 8  # XLA_FFI_Error_Code
_DTYPES = {10: np.dtype(np.float16), 11: np.dtype(np.float32), 12: np.dtype(np.float64), 16: np.dtype(bfloat16)}
_handlers: list[Any] = []                      # registered callbacks live as long as the process
_names = itertools.count()
_int64 = C.c_int64.from_address
_pointer = C.c_void_p.from_address
_int = C.c_int.from_address
# Byte offsets (c_api.h on this host): the call frame's extension, argument count, arguments
# and results (arrays of buffer pointers); a buffer's dtype (dtype, data, rank, dims follow).
_EXTENSION = _CallFrame.extension_start.offset
_ARGS_SIZE = _CallFrame.args.offset + _Buffers.size.offset
_ARGS = _CallFrame.args.offset + _Buffers.buffers.offset
_RETS = _CallFrame.rets.offset + _Buffers.buffers.offset
_DTYPE = _Buffer.dtype.offset
_FIELDS = struct.Struct("@iPqP")                  # XLA_FFI_Buffer's dtype, data, rank, dims
_SHAPES = [struct.Struct(f"@{rank}q") for rank in range(9)]
_views: Memo[tuple[int, ...], np.ndarray] = Memo(256)


def _array(buffer: int, writable: bool = False) -> np.ndarray:
    """A NumPy view of the XLA buffer at address ``buffer``, read-only unless ``writable`` (one
    view per memory, shape, dtype and access: a warm call's buffers are where they were)."""
    code, data, rank, dims = _FIELDS.unpack(C.string_at(buffer + _DTYPE, _FIELDS.size))
    key = (data, code, writable, *_SHAPES[rank].unpack(C.string_at(dims, 8 * rank)))
    view = _views.get(key)
    if view is None:
        dtype, shape = _DTYPES[code], key[3:]
        nbytes = dtype.itemsize * math.prod(shape)
        view = np.empty(shape, dtype) if nbytes == 0 else \
            np.frombuffer((C.c_char * nbytes).from_address(data), dtype).reshape(shape)
        view.flags.writeable = writable
        view = _views.put(key, view)
    return view


def _handler(host: Callable[..., np.ndarray]) -> Callable[[int], int | None]:
    def handle(frame: int) -> int | None:
        extension = _pointer(frame + _EXTENSION).value
        if extension and _int(extension + _Extension.type.offset).value == _METADATA:  # XLA asks for the version
            metadata = C.cast(extension, C.POINTER(_MetadataExtension)).contents.metadata.contents
            metadata.api_version = _Version(C.sizeof(_Version), None, 0, 1)
            metadata.traits = 0
            return None
        try:
            args = _pointer(frame + _ARGS).value
            result = host(*[_array(_pointer(args + 8 * i).value) for i in range(_int64(frame + _ARGS_SIZE).value)])
            np.copyto(_array(_pointer(_pointer(frame + _RETS).value).value, True), result, casting="no")
            return None
        except BaseException as exc:  # noqa: BLE001 - every error goes back to XLA, none crosses into C
            code = _RESOURCE_EXHAUSTED if isinstance(exc, ResourceError) else _INVALID_ARGUMENT
            message = f"{type(exc).__name__}: {exc}".encode(errors="replace")
            args = _ErrorArgs(C.sizeof(_ErrorArgs), None, message, code)
            return C.cast(frame, C.POINTER(_CallFrame)).contents.api.contents.error_create(C.byref(args))
    return handle


_EXT_TYPE, _META = _Extension.type.offset, _MetadataExtension.metadata.offset
_MAJOR = _Metadata.api_version.offset + _Version.major.offset
_MINOR = _Metadata.api_version.offset + _Version.minor.offset
_VERSION, _VERSION_SIZE, _TRAITS = _Metadata.api_version.offset, C.sizeof(_Version), _Metadata.traits.offset
_DATA = _Buffer.data.offset
_API, _ERROR_CREATE = _CallFrame.api.offset, _Api.error_create.offset
#: The error of a :func:`kernel_target` call whose kernel raised (numba raises only MemoryError
#: there: the loops' frames), made once; its address travels in the parameters.
_FAILED = _ErrorArgs(C.sizeof(_ErrorArgs), None, b"ResourceError: convgrad's compiled loops could not allocate "
                     b"their frames (out of memory)", _RESOURCE_EXHAUSTED)


def _kernel_handler(frame):  # pragma: no cover - compiled (kernel_target)
    """XLA_FFI_Error* handler(XLA_FFI_CallFrame* frame) of :func:`kernel_target` (a pointer is
    an int64): the version where XLA asks for it, else the kernel named by the parameters' first
    two int32 values called on the addresses of the call's buffers; where it raised, the error
    whose arguments the next two name."""
    ext = addresses.load64(frame + _EXTENSION)
    if ext != 0 and addresses.load32(ext + _EXT_TYPE) == _METADATA:
        meta = addresses.load64(ext + _META)
        addresses.store64(meta + _VERSION, _VERSION_SIZE)
        addresses.store64(meta + _VERSION + 8, 0)
        addresses.store32(meta + _MAJOR, 0)
        addresses.store32(meta + _MINOR, 1)
        addresses.store32(meta + _TRAITS, 0)
        return addresses.void_at(0)
    args, rets = addresses.load64(frame + _ARGS), addresses.load64(frame + _RETS)
    params = addresses.load64(addresses.load64(args + 16) + _DATA)
    kernel = (addresses.load32(params) & 0xFFFFFFFF) | (addresses.load32(params + 4) << 32)
    failed = microkernel.call_at(kernel, addresses.load64(addresses.load64(args) + _DATA),
                                 addresses.load64(addresses.load64(args + 8) + _DATA),
                                 addresses.load64(addresses.load64(rets) + _DATA), params + 16)
    if failed:
        error = (addresses.load32(params + 8) & 0xFFFFFFFF) | (addresses.load32(params + 12) << 32)
        return addresses.void_at(addresses.call_c(addresses.load64(addresses.load64(frame + _API) + _ERROR_CREATE),
                                                  error))
    return addresses.void_at(0)


@functools.cache
def kernel_target() -> str:
    """The name of the XLA CPU target whose handler is compiled code (a numba ``cfunc``, cached
    on disk: no Python at run time). Called as ``jax.ffi.ffi_call(name, result,
    vmap_method="sequential")(a, b, kernel_params(kernel, params))``, it runs the numba function
    ``kernel(a, b, out, params)`` on the addresses of the two inputs' data, the result's and
    ``params``' (int32). Nothing is checked at run time (whatever could fail is checked when the
    call is traced) but the kernel's status: an exception in it (an allocation) is the call's
    ``RESOURCE_EXHAUSTED`` error."""
    handler = microkernel.cached_cfunc(types.voidptr(types.int64))(_kernel_handler)
    _handlers.append(handler)
    jax.ffi.register_ffi_target("convgrad_kernel", jax.ffi.pycapsule(handler.address), platform="cpu")
    return "convgrad_kernel"


def kernel_params(kernel: Any, params: np.ndarray) -> np.ndarray:
    """The parameter operand of :func:`kernel_target` for numba function ``kernel`` (compiled for
    four int64 addresses) and its int32 ``params``: the kernel's address and its error's
    (:data:`_FAILED`) as two int32 values each, then ``params``."""
    pointers = [microkernel.address_of(kernel, (types.int64,) * 4), C.addressof(_FAILED)]
    return np.concatenate([np.array(pointers, np.int64).view(np.int32), params.astype(np.int32)])


def host_target(host: Callable[..., np.ndarray], label: str = "host") -> str:
    """The name of a new XLA CPU target that runs ``host`` on its inputs' buffers (read-only
    NumPy views) and copies its result into the output buffer; call it with
    ``jax.ffi.ffi_call(name, result_shape_dtype, vmap_method="sequential")``."""
    callback = _Handler(_handler(host))
    name = f"convgrad_{label}_{next(_names)}"
    _handlers.append(callback)
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(C.cast(callback, C.c_void_p).value), platform="cpu")
    return name
