"""The Avro schemas of every record on the topics, one file per record and version.

``schemas/avro/<record>.v<N>.avsc``: the current version of a record and every prior
version a reader may still meet on a topic. The files are the single source: the codec
(:mod:`postbacks.codec`), the contract tests and the producer docs all read them.
"""

from importlib import resources
from importlib.abc import Traversable

__all__ = ["avro_folder"]


def avro_folder() -> Traversable:
    """The folder of ``.avsc`` files, inside the installed package or the checkout."""
    return resources.files(__name__) / "avro"
