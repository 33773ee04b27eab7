#!/usr/bin/env python3
"""An independent reader of TensorBoard event files, for lockstep's tests:
python3-protobuf with a minimal copy of TensorBoard's Event and Summary
field numbers (tensorboard/compat/proto/event.proto, summary.proto) and
python3-crc32c for the checksums. Reads as TensorBoard does: records until
the end, and a record cut short at the end (a file still being written) is
left for later, not an error; a checksum that does not match is.

  tb_reader.py FILE   prints JSON: {"file_version": ..., "records": N,
                      "incomplete_tail_bytes": N, "scalars": {tag: [[step, value], ...]}}
"""
import json
import struct
import sys

import crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def message_classes():
    f = descriptor_pb2.FileDescriptorProto(name="minimal_event.proto", package="minimal", syntax="proto3")
    T = descriptor_pb2.FieldDescriptorProto
    value = f.message_type.add(name="Value")
    value.field.add(name="tag", number=1, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    value.field.add(name="simple_value", number=2, type=T.TYPE_FLOAT, label=T.LABEL_OPTIONAL)
    summary = f.message_type.add(name="Summary")
    summary.field.add(name="value", number=1, type=T.TYPE_MESSAGE, type_name=".minimal.Value",
                      label=T.LABEL_REPEATED)
    event = f.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=T.TYPE_DOUBLE, label=T.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=T.TYPE_INT64, label=T.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=T.TYPE_STRING, label=T.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=T.TYPE_MESSAGE, type_name=".minimal.Summary",
                    label=T.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.MessageFactory(pool).GetPrototype(pool.FindMessageTypeByName("minimal.Event"))


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read(path):
    Event = message_classes()
    data = open(path, "rb").read()
    at, records, version, scalars = 0, 0, None, {}
    while at < len(data):
        if len(data) - at < 12:
            break  # the length and its checksum are not all there yet
        (length,) = struct.unpack_from("<Q", data, at)
        (length_crc,) = struct.unpack_from("<I", data, at + 8)
        if masked(crc32c.crc32c(data[at:at + 8])) != length_crc:
            sys.exit(f"{path}: record at byte {at}: the length's checksum does not match")
        if len(data) - at < 12 + length + 4:
            break  # the record is not all there yet
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack_from("<I", data, at + 12 + length)
        if masked(crc32c.crc32c(body)) != body_crc:
            sys.exit(f"{path}: record at byte {at}: the data's checksum does not match")
        event = Event()
        event.ParseFromString(body)
        if event.file_version:
            version = event.file_version
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append([event.step, value.simple_value])
        records += 1
        at += 12 + length + 4
    return {"file_version": version, "records": records, "incomplete_tail_bytes": len(data) - at,
            "scalars": scalars}


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1])))
