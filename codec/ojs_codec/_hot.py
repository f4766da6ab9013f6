"""The hot-path functions in use: those of the C extension :mod:`ojs_codec._speedups` when
it is loaded (:data:`ojs_codec.SPEEDUPS`), else the pure-Python ones.  Both give the same
bytes, values and exceptions; ``tests/codec`` checks that.
"""

from __future__ import annotations

from ._accel import SPEEDUPS

if SPEEDUPS:
    from ._speedups import (
        decode_ack,
        decode_array,
        decode_content_header,
        decode_content_header_lenient,
        decode_deliver,
        decode_get_ok,
        decode_nack,
        decode_properties,
        decode_reject,
        decode_return,
        decode_table,
        encode_array,
        encode_properties,
        encode_publish,
        encode_table,
    )
else:
    from ._fast import (
        decode_ack,
        decode_content_header,
        decode_content_header_lenient,
        decode_deliver,
        decode_get_ok,
        decode_nack,
        decode_reject,
        decode_return,
        encode_publish,
    )
    from ._properties import decode_properties, encode_properties
    from ._table import decode_array, decode_table, encode_array, encode_table

__all__ = [
    "decode_ack",
    "decode_array",
    "decode_content_header",
    "decode_content_header_lenient",
    "decode_deliver",
    "decode_get_ok",
    "decode_nack",
    "decode_properties",
    "decode_reject",
    "decode_return",
    "decode_table",
    "encode_array",
    "encode_properties",
    "encode_publish",
    "encode_table",
]
