"""Typed records: atomic Parquet/JSON writes and the manifest of a record set.

A job's output either exists completely or not at all: every writer goes through a temporary
file in the destination directory followed by ``os.replace``, so a crash mid-write never leaves
a file that Snakemake would take as done.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger("floorgap.records")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only on success."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates 0600 files; give the record the permissions of an ordinary file.
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, dest)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a new empty folder beside ``path``; only on success give it (and its files) the
    permissions of an ordinary mkdir/open (mkdtemp makes 0700) and rename it onto ``path``.
    An existing ``path`` is moved aside first (a folder cannot be replaced in one rename) and
    deleted once the new one is in place."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        yield tmp
        umask = _umask()
        tmp.chmod(0o777 & ~umask)
        for child in tmp.iterdir():   # safetensors writes through a private temporary file
            if child.is_file():
                child.chmod(0o666 & ~umask)
        if not dest.exists():
            os.replace(tmp, dest)
            return
        old = dest.with_name(f".{dest.name}.old-{secrets.token_hex(4)}")
        os.replace(dest, old)
        try:
            os.replace(tmp, dest)
        except OSError:
            os.replace(old, dest)
            raise
        shutil.rmtree(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@dataclass
class TableRecord:
    """A record's rows and the metadata written beside them (:func:`write_table`)."""

    table: pa.Table
    metadata: dict[str, Any]


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as sorted, indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if is_dataclass(obj) and not isinstance(obj, type):
        return asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


def write_table(path: str | os.PathLike[str], table: pd.DataFrame | pa.Table,
                metadata: dict[str, Any] | None = None) -> None:
    """Write a Parquet table atomically, deterministically (no timestamps, fixed row groups).

    ``metadata`` is stored as JSON under the schema key ``floorgap`` (provenance, config).
    """
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    if metadata is not None:
        meta = dict(table.schema.metadata or {})
        meta[b"floorgap"] = json.dumps(metadata, sort_keys=True, default=_json_default).encode()
        table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd", write_statistics=False,
                       row_group_size=max(1, table.num_rows))


def read_table(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a Parquet record file into a DataFrame."""
    return pq.read_table(path).to_pandas()


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``floorgap`` JSON metadata stored in a Parquet file's schema (empty if none)."""
    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(b"floorgap")
    return json.loads(raw) if raw else {}


def prompt_format(target: Mapping[str, Any]) -> str:
    """How a target's prompts are formatted, as every record of the target says: ``chat`` (its
    chat template) or ``plain`` (a base model: the prompt text as is)."""
    return "chat" if target["chat_template"] else "plain"


def dataclass_rows(rows: Sequence[Any]) -> pd.DataFrame:
    """A DataFrame from a sequence of record dataclasses (columns in field order)."""
    if not rows:
        raise ValueError("no rows to write")
    cols = [f.name for f in fields(rows[0])]
    return pd.DataFrame([asdict(r) for r in rows], columns=cols)


def best_epoch(epochs: Sequence[Mapping[str, Any]]) -> int | None:
    """The kept epoch of a training log's epoch records: the 1-based epoch with the lowest
    held-out score (the first on ties); None when no epoch was scored."""
    scored = [(float(r["heldout"]["score"]), int(r["epoch"])) for r in epochs if "heldout" in r]
    return min(scored)[1] if scored else None


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest_entry(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Row count (Parquet files) and SHA-256 of one record file."""
    p = Path(path)
    entry: dict[str, Any] = {"path": str(p), "sha256": sha256_file(p), "bytes": p.stat().st_size}
    if p.suffix == ".parquet":
        entry["rows"] = pq.read_metadata(p).num_rows
    return entry


def write_manifest(path: str | os.PathLike[str], files: Sequence[str | os.PathLike[str]]) -> None:
    """Write a manifest (row counts and SHA-256 of every record file) atomically."""
    write_json(path, {"files": [manifest_entry(f) for f in sorted(map(str, files))]})


def fingerprint(spec: Mapping[str, Any]) -> str:
    """A short hash of what determines a job's results (a journal's header)."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


class Journal:
    """Append-only JSON lines of a long job's finished units (``key`` -> JSON payload), headed
    by the run's fingerprint, kept beside the job's outputs but not one of them, so a job that
    is killed or times out keeps what it finished and its rerun does only the rest.

    A journal of another fingerprint (a changed config) is set aside as ``.stale``; a line that
    does not parse (a write cut by a kill) is counted, logged and dropped, and the journal is
    rewritten without it before the run appends again.
    """

    def __init__(self, path: str | os.PathLike[str], fingerprint: str) -> None:
        self.path = Path(path)
        self.fingerprint = fingerprint
        self.corrupt_lines = 0

    def load_entries(self) -> dict[str, Any]:
        done: dict[str, Any] = {}
        if not self.path.exists():
            self._rewrite(done)
            return done
        lines = self.path.read_text().splitlines()
        try:
            header = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            header = {}
        if header.get("fingerprint") != self.fingerprint:
            stale = self.path.with_suffix(self.path.suffix + ".stale")
            os.replace(self.path, stale)
            log.info("journal %s belongs to another run (fingerprint %s, now %s): set aside as %s",
                     self.path, header.get("fingerprint"), self.fingerprint, stale)
            self._rewrite(done)
            return done
        for line in lines[1:]:
            try:
                entry = json.loads(line)
                done[str(entry["key"])] = entry["value"]
            except (json.JSONDecodeError, KeyError, TypeError):
                self.corrupt_lines += 1
        if self.corrupt_lines:
            log.warning("journal %s: %d incomplete line(s) dropped; those units are redone",
                        self.path, self.corrupt_lines)
            self._rewrite(done)
        return done

    def _rewrite(self, done: Mapping[str, Any]) -> None:
        with atomic_path(self.path) as tmp, open(tmp, "w") as fh:
            fh.write(json.dumps({"fingerprint": self.fingerprint}) + "\n")
            for key, value in done.items():
                fh.write(self._line(key, value))
            fh.flush()
            os.fsync(fh.fileno())

    @staticmethod
    def _line(key: str, value: Any) -> str:
        return json.dumps({"key": key, "value": value}, default=_json_default) + "\n"

    def append_entry(self, key: str, value: Any) -> None:
        with open(self.path, "a") as fh:
            fh.write(self._line(key, value))
            fh.flush()
            os.fsync(fh.fileno())
