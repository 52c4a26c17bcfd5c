"""Real data locations for blocks: ``blocks add`` refuses a location that does not exist, so
a test that only needs *some* location gives each block an empty file of its own."""

from __future__ import annotations

from pathlib import Path


def data_folder(folder: Path) -> Path:
    """``folder/data``, created."""
    path = Path(folder) / "data"
    path.mkdir(parents=True, exist_ok=True)
    return path


def block_file(folder: Path, name: str) -> str:
    """The absolute path of an empty file ``folder/data/<name>``, created."""
    path = data_folder(folder) / name
    path.touch()
    return str(path.resolve())


def block_files(folder: Path, keys: list[str], suffix: str = "") -> list[tuple[str, str]]:
    """``(key, location)`` pairs, one empty file ``folder/data/<key><suffix>`` per key."""
    return [(key, block_file(folder, key + suffix)) for key in keys]
