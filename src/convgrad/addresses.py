"""Memory at raw addresses in compiled code: what a C caller (an XLA custom call's frame) hands over.

``load64(address)`` / ``load32(address)`` read an int64 / int32 at a byte address,
``store64`` / ``store32`` write one, ``f32_at(address)`` / ``i32_at(address)`` are float32 /
int32 pointers for ``numba.carray``, ``void_at(address)`` a ``void*``, ``call_c(f, a)`` calls
the C function ``void* f(void*)`` at address ``f``. Addresses are int64; nothing checks them (the
caller's structures say where things are).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["load64", "load32", "store64", "store32", "f32_at", "i32_at", "void_at", "call_c"]

_I64, _I32 = ir.IntType(64), ir.IntType(32)


def _load(width: ir.IntType, result: types.Integer):
    def typer(typingctx, address):
        def codegen(context, builder, signature, argv):
            return builder.sext(builder.load(builder.inttoptr(argv[0], width.as_pointer()), align=1), _I64) \
                if width != _I64 else builder.load(builder.inttoptr(argv[0], width.as_pointer()), align=1)
        return result(types.int64), codegen
    return intrinsic(typer)


def _store(width: ir.IntType):
    def typer(typingctx, address, value):
        def codegen(context, builder, signature, argv):
            builder.store(builder.trunc(argv[1], width) if width != _I64 else argv[1],
                          builder.inttoptr(argv[0], width.as_pointer()), align=1)
            return context.get_dummy_value()
        return types.void(types.int64, types.int64), codegen
    return intrinsic(typer)


load64, load32 = _load(_I64, types.int64), _load(_I32, types.int64)
store64, store32 = _store(_I64), _store(_I32)


def _pointer(element: ir.Type, result: types.Type):
    def typer(typingctx, address):
        def codegen(context, builder, signature, argv):
            return builder.inttoptr(argv[0], element.as_pointer())
        return types.CPointer(result)(types.int64), codegen
    return intrinsic(typer)


f32_at, i32_at = _pointer(ir.FloatType(), types.float32), _pointer(_I32, types.int32)


@intrinsic
def void_at(typingctx, address):
    """``address`` as a ``void*`` (0: NULL, a C function's "no error")."""
    def codegen(context, builder, signature, argv):
        return builder.inttoptr(argv[0], ir.IntType(8).as_pointer())
    return types.voidptr(types.int64), codegen


@intrinsic
def call_c(typingctx, function, argument):
    """The C function ``void* f(void*)`` at address ``function`` called on address
    ``argument``: its result as an address."""
    def codegen(context, builder, signature, argv):
        pointer = ir.IntType(8).as_pointer()
        called = builder.inttoptr(argv[0], ir.FunctionType(pointer, [pointer]).as_pointer())
        return builder.ptrtoint(builder.call(called, [builder.inttoptr(argv[1], pointer)]), _I64)
    return types.int64(types.int64, types.int64), codegen
