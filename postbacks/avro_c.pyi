"""Type stub of the compiled Avro codec (postbacks/avro_c.pyx)."""

from typing import Any

class Unsupported(ValueError):
    """The schema uses Avro beyond the subset this module implements."""

class Node:
    """One type of a schema, planned for encoding and decoding in C."""

    @property
    def kind(self) -> int: ...
    @property
    def name(self) -> str: ...
    def encode(self, datum: Any, prefix: bytes = b"") -> bytes: ...
    def decode(self, data: bytes | bytearray | memoryview, pos: int = 0) -> tuple[Any, int]: ...

def plan(schema: Any, named: dict[str, Node | None] | None = None) -> Node: ...
