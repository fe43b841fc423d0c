"""One field of one table row, read or written in one step.

``field(chunks, h, "size")`` is ``chunks[h]["size"]`` and
``set_field(chunks, h, "size", n)`` is ``chunks[h]["size"] = n``, for a row
in range: ``0 <= row < len(table)``. From Python they are exactly those
expressions:

>>> import numpy as np
>>> from numba_bfc.kernels.fields import field, set_field
>>> table = np.zeros(3, dtype=[("ptr", np.int64), ("bin", np.int32)])
>>> set_field(table, 2, "bin", 7)
>>> int(field(table, 2, "bin"))
7

In a kernel the row must be in range. A negative row does not count from the
end, as NumPy's does: a handle is never negative, and that adjustment sat on
every step of every tree walk. As with Numba's own indexing, a row out of
range is not checked, unless ``NUMBA_BOUNDSCHECK=1``: then it raises
``IndexError``, a negative row included (``kernels.jit`` keys the kernels'
cache on that flag, so a cache filled without it serves no unchecked code).

Two reasons, measured in ``docs/performance.md``. The cold start: Numba
types ``chunks[h]`` through each of its ``getitem`` typings, again when
lowering it, and lowers it to a record view that LLVM then has to take
apart; these are typed by one template each and lowered to an address and
one load or store, as Numba addresses a record's field, and a first
allocation compiles about 0.3 s sooner. And the kernels' speed: without the
negative-row adjustment, replays run 7-18% faster. They are registered with
Numba's extension API (a typing template and a lowering) rather than written
as ``@intrinsic``, whose every typing, cached or not, refreshes the target's
registries (656 refreshes in a first allocation: type inference asks each
call site several times).

They take a one-dimensional array of a structured dtype whose fields are
numbers, an integer row, and the field's name as a string constant.
"""

from __future__ import annotations

from typing import Any

from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.core.imputils import lower_builtin
from numba.core.typing.templates import AbstractTemplate, infer_global, signature


def field(table: Any, row: int, name: str) -> Any:
    """``table[row][name]``: field ``name`` of row ``row``."""
    return table[row][name]


def set_field(table: Any, row: int, name: str, value: Any) -> None:
    """``table[row][name] = value``, converted to the field's type as that
    assignment converts it."""
    table[row][name] = value


def _field_type(args: tuple, kws: dict, arity: int) -> Any:
    """The Numba type of the field that ``args`` (``table, row, name, ...``)
    name, or ``None`` where they are not ``arity`` positional arguments
    starting with a 1-d structured array and an integer row (Numba then
    reports no match). A field name must be a string constant: Numba tries its
    literal type first, and a string that is not one is a ``TypingError``."""
    if kws or len(args) != arity:
        return None
    table, row, name = args[:3]
    if not (isinstance(table, types.Array) and table.ndim == 1
            and isinstance(table.dtype, types.Record) and isinstance(row, types.Integer)):
        return None
    if not isinstance(name, types.StringLiteral):
        if isinstance(name, types.UnicodeType):  # tried after the literal, if there was one
            raise TypingError("a field name must be a string constant")
        return None
    record = table.dtype
    if name.literal_value not in record.fields:
        raise TypingError(f"{record} has no field {name.literal_value!r}")
    field_type = record.typeof(name.literal_value)
    if not isinstance(field_type, (types.Number, types.Boolean)):
        raise TypingError(f"field {name.literal_value!r} is {field_type}, not a number")
    return field_type


@infer_global(field)
class _FieldTyping(AbstractTemplate):
    prefer_literal = True

    def generic(self, args: tuple, kws: dict) -> Any:
        field_type = _field_type(args, kws, 3)
        if field_type is None:
            return None
        table, row, name = args
        return signature(field_type, table, types.unliteral(row), name)


@infer_global(set_field)
class _SetFieldTyping(AbstractTemplate):
    prefer_literal = True

    def generic(self, args: tuple, kws: dict) -> Any:
        field_type = _field_type(args, kws, 4)
        if field_type is None:
            return None
        table, row, name, value = args
        if self.context.can_convert(value, field_type) is None:
            raise TypingError(
                f"cannot store {value} in field {name.literal_value!r} ({field_type})")
        return signature(types.none, table, types.unliteral(row), name, types.unliteral(value))


def _field_pointer(context, builder, signature, args):
    """Pointer to the field, typed as the field, and the alignment to access it with."""
    table_type, row_type, name_type = signature.args[:3]
    record = table_type.dtype
    # The array's members straight from its struct value: a struct proxy
    # (``make_array``) would store it in a stack slot first, which costs more
    # to compile than the rest of this.
    model = context.data_model_manager[table_type]
    row = context.cast(builder, args[1], row_type, types.intp)
    if context.enable_boundscheck:
        length = builder.extract_value(args[0], [model.get_field_position("shape"), 0])
        cgutils.do_boundscheck(context, builder, row, length, 0)
    data = builder.extract_value(args[0], model.get_field_position("data"))
    # Addressed as Numba addresses ``table[row]`` and its fields (in-bounds
    # GEPs on the row type), which LLVM optimises best.
    if table_type.layout == "C":
        row_pointer = builder.gep(data, [row], inbounds=True)
    else:
        stride = builder.extract_value(args[0], [model.get_field_position("strides"), 0])
        row_pointer = cgutils.pointer_add(builder, data, builder.mul(row, stride))
    name = name_type.literal_value
    field_type = record.typeof(name)
    pointer = cgutils.get_record_member(builder, row_pointer, record.offset(name),
                                        context.get_data_type(field_type))
    return pointer, field_type, (None if record.aligned else 1)


@lower_builtin(field, types.Array, types.Integer, types.StringLiteral)
def _lower_field(context, builder, signature, args):
    pointer, field_type, align = _field_pointer(context, builder, signature, args)
    return context.unpack_value(builder, field_type, pointer, align=align)


@lower_builtin(set_field, types.Array, types.Integer, types.StringLiteral, types.Any)
def _lower_set_field(context, builder, signature, args):
    pointer, field_type, align = _field_pointer(context, builder, signature, args)
    stored = context.cast(builder, args[3], signature.args[3], field_type)
    context.pack_value(builder, field_type, stored, pointer, align=align)
    return context.get_dummy_value()
