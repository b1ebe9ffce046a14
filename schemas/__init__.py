"""The Avro schemas of every record on every topic, shipped as package data."""

from importlib.resources import files
from importlib.resources.abc import Traversable


def schema_root() -> Traversable:
    """The folder holding the shipped ``.avsc`` files, wherever the package is installed."""
    return files(__name__)
