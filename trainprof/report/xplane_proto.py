"""XPlane's protobuf schema (XProf's profile format, `tsl/profiler/protobuf/xplane.proto`), built
in code: no protoc at build time, no generated file, and no dependency on XProf to write one.

Only the fields trainprof writes are declared, with the field numbers and types of the original
(as XProf 2.24 ships it in its descriptor); a reader ignores the fields it does not know, so the
bytes are the same as the original's for what we set. The messages live in a pool of their own,
so that the official `xplane_pb2` (TensorFlow's, under the package `tensorflow.profiler`) can be
loaded in the same process.
"""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "trainprof.xplane"

_F = descriptor_pb2.FieldDescriptorProto
_INT64, _UINT64, _DOUBLE = _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_DOUBLE
_STRING, _BYTES, _MESSAGE = _F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_MESSAGE
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# message -> [(field, number, type, label, message type or None, oneof index or None)]
_SCHEMA: dict[str, list[tuple]] = {
    "XSpace": [
        ("planes", 1, _MESSAGE, _MANY, "XPlane", None),
        ("errors", 2, _STRING, _MANY, None, None),
        ("warnings", 3, _STRING, _MANY, None, None),
        ("hostnames", 4, _STRING, _MANY, None, None),
    ],
    "XPlane": [
        ("id", 1, _INT64, _ONE, None, None),
        ("name", 2, _STRING, _ONE, None, None),
        ("lines", 3, _MESSAGE, _MANY, "XLine", None),
        ("event_metadata", 4, _MESSAGE, _MANY, "XPlane.EventMetadataEntry", None),
        ("stat_metadata", 5, _MESSAGE, _MANY, "XPlane.StatMetadataEntry", None),
        ("stats", 6, _MESSAGE, _MANY, "XStat", None),
    ],
    "XLine": [
        ("id", 1, _INT64, _ONE, None, None),
        ("display_id", 10, _INT64, _ONE, None, None),
        ("name", 2, _STRING, _ONE, None, None),
        ("display_name", 11, _STRING, _ONE, None, None),
        ("timestamp_ns", 3, _INT64, _ONE, None, None),
        ("duration_ps", 9, _INT64, _ONE, None, None),
        ("events", 4, _MESSAGE, _MANY, "XEvent", None),
    ],
    "XEvent": [  # oneof data { offset_ps, num_occurrences }
        ("metadata_id", 1, _INT64, _ONE, None, None),
        ("offset_ps", 2, _INT64, _ONE, None, 0),
        ("num_occurrences", 5, _INT64, _ONE, None, 0),
        ("duration_ps", 3, _INT64, _ONE, None, None),
        ("stats", 4, _MESSAGE, _MANY, "XStat", None),
    ],
    "XStat": [  # oneof value { ... }
        ("metadata_id", 1, _INT64, _ONE, None, None),
        ("double_value", 2, _DOUBLE, _ONE, None, 0),
        ("uint64_value", 3, _UINT64, _ONE, None, 0),
        ("int64_value", 4, _INT64, _ONE, None, 0),
        ("str_value", 5, _STRING, _ONE, None, 0),
        ("bytes_value", 6, _BYTES, _ONE, None, 0),
        ("ref_value", 7, _UINT64, _ONE, None, 0),
    ],
    "XEventMetadata": [
        ("id", 1, _INT64, _ONE, None, None),
        ("name", 2, _STRING, _ONE, None, None),
        ("display_name", 4, _STRING, _ONE, None, None),
        ("metadata", 3, _BYTES, _ONE, None, None),
        ("stats", 5, _MESSAGE, _MANY, "XStat", None),
        ("child_id", 6, _INT64, _MANY, None, None),
    ],
    "XStatMetadata": [
        ("id", 1, _INT64, _ONE, None, None),
        ("name", 2, _STRING, _ONE, None, None),
        ("description", 3, _STRING, _ONE, None, None),
    ],
}
_ONEOFS = {"XEvent": "data", "XStat": "value"}
# The map fields of XPlane (map<int64, XEventMetadata>, map<int64, XStatMetadata>).
_MAP_ENTRIES = {"EventMetadataEntry": "XEventMetadata", "StatMetadataEntry": "XStatMetadata"}


def _add_fields(msg: descriptor_pb2.DescriptorProto, fields: list[tuple]) -> None:
    for name, number, type_, label, type_name, oneof in fields:
        f = msg.field.add(name=name, number=number, type=type_, label=label)
        if type_name:
            f.type_name = f".{PACKAGE}.{type_name}"
        if oneof is not None:
            f.oneof_index = oneof


def file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """Our xplane.proto as a FileDescriptorProto."""
    fd = descriptor_pb2.FileDescriptorProto(
        name="trainprof/xplane.proto", package=PACKAGE, syntax="proto3"
    )
    for name, fields in _SCHEMA.items():
        msg = fd.message_type.add(name=name)
        _add_fields(msg, fields)
        if name in _ONEOFS:
            msg.oneof_decl.add(name=_ONEOFS[name])
        if name == "XPlane":
            for entry, value in _MAP_ENTRIES.items():
                sub = msg.nested_type.add(name=entry)
                sub.options.map_entry = True
                _add_fields(sub, [("key", 1, _INT64, _ONE, None, None),
                                  ("value", 2, _MESSAGE, _ONE, value, None)])
    return fd


@cache
def messages() -> SimpleNamespace:
    """The message classes: `messages().XSpace`, `.XPlane`, `.XLine`, `.XEvent`, `.XStat`,
    `.XEventMetadata`, `.XStatMetadata`."""
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file_descriptor())
    return SimpleNamespace(**{
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in _SCHEMA
    })
