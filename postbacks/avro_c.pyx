# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Avro binary encoding and decoding of our schemas, in C (Cython).

Every stage decodes and encodes Avro on every record. With this project's earlier codecs,
compiled from each schema to straight-line Python source (as fast as fastavro's own
compiled reader here), that was 15 % of the delivery agent's CPU and 44 % of the sink's
(py-spy): one Delivery ~33 µs to decode on the slower hosts we run on. Here each schema is turned once into a
tree of typed nodes, walked in C: a few µs per record (``bench/avro_codec.py``).

Our schemas use a small subset of Avro -- primitives, records, maps and ``["null", T]``
unions -- and :func:`plan` refuses anything else (:class:`Unsupported`). The output is
byte for byte fastavro's, and so is the datum read back (``tests/unit/test_avro_c.py``
checks both directions against it):

- encoding: a field absent from the datum takes its schema default (or fails, KeyError,
  if it has none); a value of the wrong type fails with TypeError, an int or long beyond
  its range with ValueError;
- decoding: truncated or corrupt input fails with ValueError (UnicodeDecodeError for bad
  UTF-8, itself a ValueError), never a read past the buffer; an int beyond 32 bits or a
  long beyond 64 is corrupt.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_Next, PyDict_SetItem
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.math cimport isfinite, isinf
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

import sys


cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL
    long long PyLong_AsLongLongAndOverflow(object v, int* overflow) except? -1


class Unsupported(ValueError):
    """The schema uses Avro beyond the subset this module implements."""


cdef enum:
    K_NULL, K_BOOLEAN, K_INT, K_LONG, K_FLOAT, K_DOUBLE, K_BYTES, K_STRING, K_RECORD, K_MAP,
    K_OPTIONAL

_PRIMITIVE = {"null": K_NULL, "boolean": K_BOOLEAN, "int": K_INT, "long": K_LONG,
              "float": K_FLOAT, "double": K_DOUBLE, "bytes": K_BYTES, "string": K_STRING}
cdef object _NO_DEFAULT = object()


cdef class Node:
    """One type of a schema: its kind, and for a record its fields, for a map its values,
    for ``["null", T]`` its T."""
    cdef readonly int kind
    cdef readonly str name
    cdef Node child
    cdef tuple names
    cdef tuple nodes
    cdef tuple defaults
    cdef Py_ssize_t n_fields

    def __repr__(self):
        return f"<avro_c.Node {self.name or self.kind}>"

    def encode(self, datum, bytes prefix not None=b""):
        """``prefix`` followed by ``datum``'s Avro binary encoding."""
        cdef Buf b
        b.cap = 256 + PyBytes_GET_SIZE(prefix)
        b.len = 0
        b.data = <char*>PyMem_Malloc(b.cap)
        if b.data == NULL:
            raise MemoryError()
        try:
            _put(&b, PyBytes_AS_STRING(prefix), PyBytes_GET_SIZE(prefix))
            _enc(self, datum, &b)
            return PyBytes_FromStringAndSize(b.data, b.len)
        finally:
            PyMem_Free(b.data)

    def decode(self, data, Py_ssize_t pos=0):
        """(datum, end): the datum encoded in ``data`` from ``pos`` on, and where it ends."""
        cdef bytes raw = data if type(data) is bytes else bytes(data)
        cdef Py_ssize_t p = pos
        if p < 0 or p > PyBytes_GET_SIZE(raw):
            raise ValueError(f"position {pos} outside the record")
        value = _dec(self, <const unsigned char*>PyBytes_AS_STRING(raw),
                     PyBytes_GET_SIZE(raw), &p)
        return value, p


def plan(schema, dict named=None):
    """The :class:`Node` tree of a parsed (or plain) schema; :class:`Unsupported` for Avro
    beyond our subset (arrays, enums, fixed, unions other than ``["null", T]``)."""
    if named is None:
        named = {}
    cdef Node n = Node.__new__(Node)
    n.name = ""
    if isinstance(schema, str):
        if schema in _PRIMITIVE:
            n.kind = _PRIMITIVE[schema]
            return n
        if schema in named:
            if named[schema] is None:  # its own fields refer to it: C recursion, no bound
                raise Unsupported(f"recursive type {schema!r}")
            return named[schema]
        raise Unsupported(f"unknown named type {schema!r}")
    if isinstance(schema, list):
        if len(schema) != 2 or schema[0] != "null" or schema[1] == "null":
            raise Unsupported(f"union {schema!r} (only [\"null\", T])")
        n.kind = K_OPTIONAL
        n.child = plan(schema[1], named)
        return n
    if not isinstance(schema, dict):
        raise Unsupported(f"type {schema!r}")
    kind = schema.get("type")
    if kind == "record":
        n.kind = K_RECORD
        n.name = schema["name"]
        fields = schema["fields"]
        n.names = tuple(sys.intern(f["name"]) for f in fields)
        n.defaults = tuple(f.get("default", _NO_DEFAULT) for f in fields)
        n.n_fields = len(fields)
        keys = [schema["name"]]
        if "namespace" in schema:
            keys.append(f"{schema['namespace']}.{schema['name']}")
        for key in keys:
            named[key] = None  # being built: a reference from its own fields is refused
        n.nodes = tuple(plan(f["type"], named) for f in fields)
        for key in keys:
            named[key] = n
        return n
    if kind == "map":
        n.kind = K_MAP
        n.child = plan(schema["values"], named)
        return n
    if kind in _PRIMITIVE and len(schema) == 1:
        return plan(kind, named)
    raise Unsupported(f"type {schema!r}")


# ---------------------------------------------------------------------------- encode

cdef struct Buf:
    char* data
    Py_ssize_t len
    Py_ssize_t cap


cdef int _reserve(Buf* b, Py_ssize_t need) except -1:
    cdef Py_ssize_t cap
    cdef char* grown
    if b.len + need <= b.cap:
        return 0
    cap = b.cap * 2
    if cap < b.len + need:
        cap = b.len + need
    grown = <char*>PyMem_Realloc(b.data, cap)
    if grown == NULL:
        raise MemoryError()
    b.data, b.cap = grown, cap
    return 0


cdef inline int _put(Buf* b, const char* src, Py_ssize_t n) except -1:
    _reserve(b, n)
    memcpy(b.data + b.len, src, n)
    b.len += n
    return 0


cdef inline int _put_byte(Buf* b, unsigned char c) except -1:
    _reserve(b, 1)
    b.data[b.len] = <char>c
    b.len += 1
    return 0


cdef int _put_long(Buf* b, int64_t v) except -1:
    cdef uint64_t z = ((<uint64_t>v) << 1) ^ <uint64_t>(v >> 63)
    _reserve(b, 10)
    while z > 127:
        b.data[b.len] = <char>((z & 0x7F) | 0x80)
        b.len += 1
        z >>= 7
    b.data[b.len] = <char>z
    b.len += 1
    return 0


cdef int64_t _as_long(object v, int kind) except? -1:
    cdef int overflow = 0
    cdef long long x
    if type(v) is not int:
        v = v.__index__()  # bool, or an int-like; anything else: AttributeError/TypeError
    x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow or (kind == K_INT and not -2147483648 <= x <= 2147483647):
        raise ValueError(f"{v} does not fit an Avro {'int' if kind == K_INT else 'long'}")
    return x


cdef int _enc(Node n, object v, Buf* b) except -1:
    cdef int kind = n.kind
    cdef Py_ssize_t size, i, pos
    cdef const char* s
    cdef double d
    cdef float f
    cdef uint64_t u64
    cdef uint32_t u32
    cdef PyObject* k
    cdef PyObject* x
    if kind == K_STRING:
        if not isinstance(v, str):
            raise TypeError(f"{v!r:.40} is not a string")
        s = PyUnicode_AsUTF8AndSize(v, &size)
        _put_long(b, size)
        _put(b, s, size)
    elif kind == K_LONG or kind == K_INT:
        _put_long(b, _as_long(v, kind))
    elif kind == K_OPTIONAL:
        if v is None:
            _put_byte(b, 0)
        else:
            _put_byte(b, 2)
            _enc(n.child, v, b)
    elif kind == K_RECORD:
        if type(v) is dict:
            for i in range(n.n_fields):
                x = PyDict_GetItemWithError(v, n.names[i])
                if x != NULL:
                    item = <object>x  # a strong reference: encoding may run Python code
                    _enc(n.nodes[i], item, b)
                elif n.defaults[i] is not _NO_DEFAULT:
                    _enc(n.nodes[i], n.defaults[i], b)
                else:
                    raise KeyError(n.names[i])
        else:
            for i in range(n.n_fields):
                if n.defaults[i] is _NO_DEFAULT:
                    item = v.get(n.names[i], _NO_DEFAULT)  # .get: no __missing__
                    if item is _NO_DEFAULT:
                        raise KeyError(n.names[i])
                    _enc(n.nodes[i], item, b)
                else:
                    _enc(n.nodes[i], v.get(n.names[i], n.defaults[i]), b)
    elif kind == K_DOUBLE:
        d = v  # float or int (TypeError otherwise), as struct.pack("<d") takes
        memcpy(&u64, &d, 8)
        _put_le(b, u64, 8)
    elif kind == K_FLOAT:
        d = v
        f = <float>d
        if isinf(f) and isfinite(d):
            raise ValueError(f"{v!r:.40} does not fit an Avro float")
        memcpy(&u32, &f, 4)
        _put_le(b, u32, 4)
    elif kind == K_BYTES:
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise TypeError(f"{v!r:.40} is not bytes")
        if type(v) is bytes:
            _put_long(b, PyBytes_GET_SIZE(v))
            _put(b, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))
        else:
            raw = bytes(v)
            _put_long(b, PyBytes_GET_SIZE(raw))
            _put(b, PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw))
    elif kind == K_MAP:
        size = len(v)  # TypeError for None, 0, ... as fastavro
        if size:
            _put_long(b, size)
            i = 0
            if type(v) is dict:
                pos = 0
                while PyDict_Next(v, &pos, &k, &x):
                    key = <object>k    # strong references: a value's __index__/__float__
                    value = <object>x  # may mutate this dict
                    _enc_key(key, b)
                    _enc(n.child, value, b)
                    i += 1
            else:
                for key, value in v.items():
                    _enc_key(key, b)
                    _enc(n.child, value, b)
                    i += 1
            if i != size:
                raise ValueError(f"map of {size} entries yielded {i}")
        _put_byte(b, 0)
    elif kind == K_BOOLEAN:
        if type(v) is not bool:
            raise TypeError(f"{v!r:.40} is not a boolean")
        _put_byte(b, 1 if v else 0)
    elif kind == K_NULL:
        if v is not None:
            raise TypeError(f"{v!r:.40} is not null")
    return 0


cdef int _enc_key(object k, Buf* b) except -1:
    cdef Py_ssize_t size
    cdef const char* s
    if not isinstance(k, str):
        raise TypeError(f"map key {k!r:.40} is not a string")
    s = PyUnicode_AsUTF8AndSize(k, &size)
    _put_long(b, size)
    _put(b, s, size)
    return 0


cdef int _put_le(Buf* b, uint64_t u, int width) except -1:
    cdef int i
    _reserve(b, width)
    for i in range(width):  # little-endian on any host
        b.data[b.len + i] = <char>((u >> (8 * i)) & 0xFF)
    b.len += width
    return 0


# ---------------------------------------------------------------------------- decode

cdef int64_t _read_long(const unsigned char* buf, Py_ssize_t ln, Py_ssize_t* pos,
                        int kind) except? -1:
    cdef Py_ssize_t p = pos[0]
    cdef uint64_t z = 0, c
    cdef int shift = 0
    cdef int64_t v
    while True:
        if p >= ln:
            raise ValueError("the record ends inside a number")
        c = buf[p]
        p += 1
        if shift == 63:  # the 10th byte: one bit left of 64
            if c & 0x80:
                raise ValueError("varint longer than 10 bytes")
            if c > 1:
                raise ValueError(f"a varint beyond 64 bits does not fit an Avro long")
        z |= (c & 0x7F) << shift
        if not c & 0x80:
            break
        shift += 7
    pos[0] = p
    v = <int64_t>(z >> 1) ^ -<int64_t>(z & 1)
    if kind == K_INT and not -2147483648 <= v <= 2147483647:
        raise ValueError(f"{v} does not fit an Avro int")
    return v


cdef Py_ssize_t _read_size(const unsigned char* buf, Py_ssize_t ln,
                           Py_ssize_t* pos) except -1:
    cdef int64_t n = _read_long(buf, ln, pos, K_LONG)
    if n < 0 or n > ln - pos[0]:
        raise ValueError(f"length {n} runs past the record")
    return <Py_ssize_t>n


cdef uint64_t _read_le(const unsigned char* buf, Py_ssize_t ln, Py_ssize_t* pos,
                       int width) except? 0xFFFFFFFFFFFFFFFF:
    cdef uint64_t u = 0
    cdef int i
    if ln - pos[0] < width:
        raise ValueError("the record ends inside a number")
    for i in range(width):
        u |= (<uint64_t>buf[pos[0] + i]) << (8 * i)
    pos[0] += width
    return u


cdef object _dec(Node n, const unsigned char* buf, Py_ssize_t ln, Py_ssize_t* pos):
    cdef int kind = n.kind
    cdef Py_ssize_t size, i
    cdef int64_t count
    cdef unsigned char c
    cdef uint64_t u64
    cdef uint32_t u32
    cdef double d
    cdef float f
    cdef dict out
    if kind == K_STRING:
        size = _read_size(buf, ln, pos)
        value = PyUnicode_DecodeUTF8(<char*>buf + pos[0], size, NULL)
        pos[0] += size
        return value
    if kind == K_LONG or kind == K_INT:
        return _read_long(buf, ln, pos, kind)
    if kind == K_OPTIONAL:
        if pos[0] >= ln:
            raise ValueError("the record ends inside a union")
        c = buf[pos[0]]
        pos[0] += 1
        if c == 0:
            return None
        if c == 2:
            return _dec(n.child, buf, ln, pos)
        raise ValueError(f"union branch {c} out of range")
    if kind == K_RECORD:
        out = {}
        for i in range(n.n_fields):
            PyDict_SetItem(out, n.names[i], _dec(n.nodes[i], buf, ln, pos))
        return out
    if kind == K_DOUBLE:
        u64 = _read_le(buf, ln, pos, 8)
        memcpy(&d, &u64, 8)
        return d
    if kind == K_FLOAT:
        u32 = <uint32_t>_read_le(buf, ln, pos, 4)
        memcpy(&f, &u32, 4)
        return <double>f
    if kind == K_BYTES:
        size = _read_size(buf, ln, pos)
        value = PyBytes_FromStringAndSize(<const char*>buf + pos[0], size)
        pos[0] += size
        return value
    if kind == K_MAP:
        out = {}
        while True:
            count = _read_long(buf, ln, pos, K_LONG)
            if count == 0:
                return out
            if count < 0:
                if count < -ln:  # each entry takes a byte at least
                    raise ValueError(f"map block of {count} entries runs past the record")
                count = -count
                _read_long(buf, ln, pos, K_LONG)  # the block's size in bytes
            for i in range(count):
                size = _read_size(buf, ln, pos)
                key = PyUnicode_DecodeUTF8(<char*>buf + pos[0], size, NULL)
                pos[0] += size
                out[key] = _dec(n.child, buf, ln, pos)
    if kind == K_BOOLEAN:
        if pos[0] >= ln:
            raise ValueError("the record ends inside a boolean")
        c = buf[pos[0]]
        pos[0] += 1
        if c > 1:
            raise ValueError(f"boolean byte {c}")
        return c == 1
    if kind == K_NULL:
        return None
    raise AssertionError(kind)
