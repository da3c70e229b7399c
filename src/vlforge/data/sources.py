"""Dataset files read as streams of raw records with a resumable read position.

``jsonl``, ``parquet`` and ``arrow`` are read incrementally (memory does not grow with the file);
``json`` (one JSON array) is parsed whole. Each record comes back as a :class:`RawRecord` naming its
file and line/row; a line that does not parse comes back with ``error`` set instead of raising, so the
caller can apply ``on_error``.

Example:
    >>> import json, tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()); f = d / "a.jsonl"
    >>> _ = f.write_text(json.dumps({"messages": []}) + "\\n" + "{oops\\n")
    >>> src = open_source(f)
    >>> [(r.location, r.error.reason if r.error else None) for r in iter(src.next_record, None)]
    [('line 1', None), ('line 2', 'malformed_json')]
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlforge.data.config import DATA_TYPES, infer_data_type
from vlforge.data.errors import SampleError
from vlforge.errors import DataError


@dataclass
class RawRecord:
    """One record as read from a file: the decoded dict, or the error that prevented decoding it."""

    source: str  # dataset file path as given
    location: str  # "line 12" / "row 5" / "item 3"
    record: dict[str, Any] | None
    error: SampleError | None = None


class Source:
    """A resumable reader; ``next_record()`` returns ``None`` at the end of the file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"{self.path}: dataset file not found")
        self.name = str(path)

    def next_record(self) -> RawRecord | None:  # pragma: no cover - abstract
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def reset(self) -> None:
        self.load_state_dict(self._initial_state())

    def _initial_state(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:
        """Release file handles (reopened lazily on the next read)."""

    def head(self, n: int) -> Iterator[RawRecord]:
        """The first ``n`` records of the file (blank ``jsonl`` lines skipped), read from its start; the read
        position is left where it was. For a layout's detection: reads no more of the file than it needs."""
        state = self.state_dict()
        self.reset()
        try:
            for _ in range(n):
                raw = self.next_record()
                if raw is None:
                    return
                yield raw
        finally:
            self.load_state_dict(state)

    # -- random access by position (shuffled reading, cheap record counts) -------------------------------
    def extent(self) -> int:  # pragma: no cover - abstract
        """Positions in the file: lines (``jsonl``, blank ones included), rows, or array items."""
        raise NotImplementedError

    def records(self) -> int:
        """Records the file holds (blank ``jsonl`` lines excluded), from metadata or a byte scan: no parsing."""
        return self.extent()

    def block_groups(self, block: int) -> list[list[tuple[int, int]]]:
        """Position ranges ``[start, stop)`` of ``block`` positions, grouped by what is cheap to read together.

        Shuffled reading permutes the groups, then the blocks inside each group. By default every block
        is its own group (random access is cheap); parquet groups the blocks of one row group.
        """
        n = self.extent()
        return [[(start, min(start + block, n))] for start in range(0, n, block)]

    def read_range(self, start: int, stop: int) -> Iterator[tuple[int, RawRecord | None]]:  # pragma: no cover
        """``(position, record)`` for positions ``start..stop-1``; ``record`` is None for a blank ``jsonl`` line."""
        raise NotImplementedError

    def _decoded(self, location: str, value: Any) -> RawRecord:
        if isinstance(value, dict):
            return RawRecord(self.name, location, value)
        err = SampleError("schema", self.name, location, f"expected a JSON object, got {type(value).__name__}")
        return RawRecord(self.name, location, None, err)


class JsonlSource(Source):
    """One JSON object per line; state is the byte offset and line number of the next line."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self._fh = None
        self._offset = 0
        self._line = 0

    def _initial_state(self) -> dict[str, Any]:
        return {"offset": 0, "line": 0}

    def next_record(self) -> RawRecord | None:
        if self._fh is None:
            self._fh = open(self.path, "rb")  # noqa: SIM115 - kept open across calls, closed in close()
            self._fh.seek(self._offset)
        while True:
            raw = self._fh.readline()
            if not raw:
                return None
            self._offset += len(raw)
            self._line += 1
            text = raw.strip()
            if text:
                return self._parse(text, self._line)

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self._offset, "line": self._line}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self._offset, self._line = int(state["offset"]), int(state["line"])
        if not self._offset:
            return
        with open(self.path, "rb") as handle:  # a position past the end or inside a line: the file changed
            size = handle.seek(0, 2)
            handle.seek(min(self._offset, size) - 1)
            inside = self._offset < size and handle.read(1) != b"\n"
        if self._offset > size or inside:
            where = "past its end" if self._offset > size else "not at the start of a line"
            raise DataError(f"{self.path}: the resume position (byte {self._offset:,}, after line {self._line}) is "
                            f"{where}: the file changed since the checkpoint; restore it, or set "
                            "checkpointing.ignore_data_skip: true to read the data from its start")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _index(self) -> LineIndex:
        if getattr(self, "_line_index", None) is None:
            self._line_index = LineIndex.scan(self.path)
        return self._line_index

    def extent(self) -> int:
        return self._index().lines

    def records(self) -> int:
        return self._index().nonblank

    def read_range(self, start: int, stop: int) -> Iterator[tuple[int, RawRecord | None]]:
        index = self._index()
        with open(self.path, "rb") as fh:
            line = start - start % index.stride
            fh.seek(int(index.starts[line // index.stride]))
            for _ in range(start - line):
                fh.readline()
            for line in range(start, stop):
                raw = fh.readline()
                text = raw.strip()
                yield line, (self._parse(text, line + 1) if text else None)

    def _parse(self, text: bytes, line: int) -> RawRecord:
        location = f"line {line}"
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return RawRecord(self.name, location, None, SampleError("malformed_json", self.name, location,
                                                                    f"invalid JSON: {exc}"))
        return self._decoded(location, value)


@dataclass
class LineIndex:
    """Byte offsets of every ``stride``-th line start of a text file, its line count and non-blank lines.

    Built by one pass over the bytes (no JSON parsing): about a second per GB.
    """

    starts: np.ndarray
    lines: int
    nonblank: int
    stride: int = 64

    @classmethod
    def scan(cls, path: Path, stride: int = 64, chunk: int = 1 << 22) -> LineIndex:
        starts, newline_count, blank, offset, tail = [0], 0, 0, 0, 0
        content_before = 0  # non-whitespace bytes since the last newline (carried across chunks)
        with open(path, "rb") as fh:
            while data := fh.read(chunk):
                raw = np.frombuffer(data, dtype=np.uint8)
                newlines = np.flatnonzero(raw == 10)
                if len(newlines):
                    # a line is blank when it holds only whitespace (the reader strips it and skips it)
                    content = np.cumsum(~np.isin(raw, _WHITESPACE), dtype=np.int64)[newlines]
                    per_line = np.diff(content, prepend=0)
                    per_line[0] += content_before
                    blank += int(np.count_nonzero(per_line == 0))
                    content_before = int(np.count_nonzero(~np.isin(raw[newlines[-1] + 1:], _WHITESPACE)))
                    # newline number g ends line g; line g + 1 starts after it: keep starts of lines k * stride
                    picks = np.arange((stride - 1 - newline_count) % stride, len(newlines), stride)
                    starts.extend((newlines[picks] + offset + 1).tolist())
                    newline_count += len(newlines)
                    tail = len(data) - newlines[-1] - 1
                else:
                    content_before += int(np.count_nonzero(~np.isin(raw, _WHITESPACE)))
                    tail += len(data)
                offset += len(data)
        lines = newline_count + (1 if tail > 0 else 0)  # a last line without a newline
        if tail > 0 and content_before == 0:
            blank += 1
        kept = starts[: max(1, -(-lines // stride))]
        return cls(np.asarray(kept, dtype=np.int64), lines, lines - blank, stride)


_WHITESPACE = np.frombuffer(b" \t\n\r\x0b\x0c", dtype=np.uint8)
"""Bytes ``bytes.strip()`` removes."""


class JsonSource(Source):
    """A JSON array of objects (parsed whole, on first read); state is the next item index."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self._items: list[Any] | None = None
        self._index = 0

    def _initial_state(self) -> dict[str, Any]:
        return {"index": 0}

    def _load(self) -> list[Any]:
        if self._items is None:
            try:
                items = json.loads(self.path.read_text(encoding="utf-8-sig"))  # a BOM, as Windows editors write
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DataError(f"{self.path}: invalid JSON file: {exc}") from exc
            if isinstance(items, dict) and isinstance(items.get("data"), list):
                items = items["data"]
            if not isinstance(items, list):
                raise DataError(f"{self.path}: a json dataset must be a JSON array of samples")
            self._items = items
        return self._items

    def head(self, n: int) -> Iterator[RawRecord]:
        """The first ``n`` items, decoded from the start of the file only (a JSON array is otherwise parsed whole)."""
        if self._items is not None:
            yield from (self._decoded(f"item {i + 1}", item) for i, item in enumerate(self._items[:n]))
            return
        items = _array_prefix(self.path, n)
        if items is None:  # not a plain array (``{"data": [...]}``) or invalid: the whole-file parse decides
            items = self._load()[:n]
        yield from (self._decoded(f"item {i + 1}", item) for i, item in enumerate(items))

    def next_record(self) -> RawRecord | None:
        items = self._load()
        if self._index >= len(items):
            return None
        self._index += 1
        return self._decoded(f"item {self._index}", items[self._index - 1])

    def state_dict(self) -> dict[str, Any]:
        return {"index": self._index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._index = int(state["index"])

    def extent(self) -> int:
        return len(self._load())

    def read_range(self, start: int, stop: int) -> Iterator[tuple[int, RawRecord | None]]:
        items = self._load()
        for i in range(start, stop):
            yield i, self._decoded(f"item {i + 1}", items[i])


def _array_prefix(path: Path, n: int, chunk: int = 1 << 20) -> list[Any] | None:
    """The first ``n`` items of the JSON array in ``path``, decoded from as few leading bytes as they need;
    None when the file does not start with an array or its start does not decode."""
    decoder = json.JSONDecoder()
    with open(path, "rb") as fh:
        data = b""
        while True:
            more = fh.read(chunk)
            data += more
            text = data.decode("utf-8", errors="ignore")  # a character cut at the end decodes once read whole
            start = len(text) - len(text.removeprefix("\ufeff").lstrip())
            if text[start:start + 1] not in ("[", ""):
                return None
            items, pos = [], start + 1
            while len(items) < n:
                while pos < len(text) and text[pos] in " \t\r\n,":
                    pos += 1
                if pos >= len(text) or text[pos] == "]":
                    break
                try:
                    item, end = decoder.raw_decode(text, pos)
                except json.JSONDecodeError:
                    break
                if end >= len(text) and more:  # a number cut at the end of what was read decodes too
                    break
                items.append(item)
                pos = end
            ended = pos < len(text) and text[pos] == "]"
            if len(items) >= n or ended:
                return items
            if not more:
                return None
            chunk *= 4


class _TableSource(Source):
    """Shared row-cursor logic for columnar files; state is the next row index (0-based)."""

    batch_rows = 64

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self._row = 0
        self._buffer: list[dict[str, Any]] = []
        self._buffer_start = 0

    def _initial_state(self) -> dict[str, Any]:
        return {"row": 0}

    def _batches_from(self, row: int):  # pragma: no cover - abstract
        """Yield (first_row_index, pyarrow.RecordBatch) starting at the batch containing ``row``."""
        raise NotImplementedError

    def next_record(self) -> RawRecord | None:
        offset = self._row - self._buffer_start
        if not (0 <= offset < len(self._buffer)):
            if getattr(self, "_iter", None) is None:
                self._iter = self._batches_from(self._row)
            self._buffer = []
            for first, batch in self._iter:
                if first + batch.num_rows > self._row:
                    self._buffer, self._buffer_start = batch.to_pylist(), first
                    break
            offset = self._row - self._buffer_start
            if not self._buffer or offset < 0:
                return None
        value = self._buffer[offset]
        self._row += 1
        return self._decoded(f"row {self._row}", value)

    def state_dict(self) -> dict[str, Any]:
        return {"row": self._row}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close()
        self._row = int(state["row"])

    def close(self) -> None:
        self._iter = None
        self._buffer, self._buffer_start = [], 0
        self._table = None

    def _table_at(self, row: int) -> tuple[int, pa.Table]:  # pragma: no cover - abstract
        """``(first_row, table)``: a table of consecutive rows holding ``row`` (kept until the next call)."""
        raise NotImplementedError

    def read_range(self, start: int, stop: int) -> Iterator[tuple[int, RawRecord | None]]:
        row = start
        while row < stop:
            first, table = self._table_at(row)
            piece = table.slice(row - first, min(stop, first + table.num_rows) - row)
            for value in piece.to_pylist():
                row += 1
                yield row - 1, self._decoded(f"row {row}", value)


class ParquetSource(_TableSource):
    """Parquet read in small batches, starting at the row group that holds the resume row.

    Column chunks are read through a buffer of :attr:`read_buffer` bytes, page by page (pyarrow otherwise reads
    a whole column chunk, e.g. every image of a row group, before the first batch): memory follows the batch
    and the file's page size, not its row groups.
    """

    read_buffer = 1 << 20

    def _batches_from(self, row: int):
        try:
            pf = pq.ParquetFile(self.path, buffer_size=self.read_buffer, pre_buffer=False)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{self.path}: cannot read parquet file: {exc}") from exc
        meta = pf.metadata
        start = 0
        for group in range(meta.num_row_groups):
            n = meta.row_group(group).num_rows
            if start + n > row:
                first = start
                for batch in pf.iter_batches(batch_size=self.batch_rows, row_groups=list(range(group, meta.num_row_groups))):
                    yield first, batch
                    first += batch.num_rows
                return
            start += n

    def _metadata(self):
        if getattr(self, "_meta", None) is None:
            try:
                self._meta = pq.ParquetFile(self.path).metadata
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{self.path}: cannot read parquet file: {exc}") from exc
        return self._meta

    def _group_rows(self) -> list[tuple[int, int]]:
        meta, first, out = self._metadata(), 0, []
        for group in range(meta.num_row_groups):
            out.append((first, first + meta.row_group(group).num_rows))
            first = out[-1][1]
        return out

    def extent(self) -> int:
        return self._metadata().num_rows

    def block_groups(self, block: int) -> list[list[tuple[int, int]]]:
        return [[(s, min(s + block, stop)) for s in range(start, stop, block)] for start, stop in self._group_rows()
                if stop > start]

    def _table_at(self, row: int) -> tuple[int, pa.Table]:
        cached = getattr(self, "_table", None)
        if cached is not None and cached[0] <= row < cached[0] + cached[1].num_rows:
            return cached
        for group, (start, stop) in enumerate(self._group_rows()):
            if start <= row < stop:
                try:
                    self._table = (start, pq.ParquetFile(self.path).read_row_group(group))
                except (pa.ArrowException, OSError) as exc:
                    raise DataError(f"{self.path}: cannot read parquet file: {exc}") from exc
                return self._table
        raise DataError(f"{self.path}: row {row + 1} is past the end of the file")


class ArrowSource(_TableSource):
    """Arrow IPC file (memory-mapped, random access) or IPC stream (as written by HF ``datasets``)."""

    def _batches_from(self, row: int):
        self._table = None  # a whole-file table maps the file being released
        self._release()
        try:
            source = self._mmap = pa.memory_map(str(self.path), "r")
            try:
                reader = pa.ipc.open_file(source)
                batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            except pa.ArrowInvalid:
                source.seek(0)
                batches = iter(pa.ipc.open_stream(source))
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{self.path}: cannot read arrow file: {exc}") from exc
        first = 0
        for batch in batches:
            if first + batch.num_rows > row:
                for offset in range(0, batch.num_rows, self.batch_rows):
                    piece = batch.slice(offset, self.batch_rows)
                    if first + offset + piece.num_rows > row:
                        yield first + offset, piece
            first += batch.num_rows

    def _whole(self) -> pa.Table:
        """The file as one table (memory-mapped: no copy, rows are materialised only when sliced)."""
        if getattr(self, "_table", None) is None:
            self._release()
            try:
                source = self._mmap = pa.memory_map(str(self.path), "r")
                try:
                    table = pa.ipc.open_file(source).read_all()
                except pa.ArrowInvalid:
                    source.seek(0)
                    table = pa.ipc.open_stream(source).read_all()
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{self.path}: cannot read arrow file: {exc}") from exc
            self._table = (0, table)
        return self._table[1]

    def extent(self) -> int:
        return self._whole().num_rows

    def _table_at(self, row: int) -> tuple[int, pa.Table]:
        self._whole()
        return self._table

    def _release(self) -> None:
        if getattr(self, "_mmap", None) is not None:
            self._mmap.close()
            self._mmap = None

    def close(self) -> None:
        super().close()
        self._release()


_CLASSES = {"json": JsonSource, "jsonl": JsonlSource, "parquet": ParquetSource, "arrow": ArrowSource}


def open_source(path: str | Path, data_type: str | None = None) -> Source:
    """Open a dataset file as a :class:`Source` (``data_type`` inferred from the extension if omitted)."""
    kind = data_type or infer_data_type(path)
    if kind not in _CLASSES:
        raise DataError(f"{path}: unknown data_type {kind!r}; expected one of {DATA_TYPES}")
    return _CLASSES[kind](path)
