"""Stream a trace's JSON: inflate it piecewise and cut its `traceEvents` array into batches of
whole events, so that only a few MB of JSON exist at once, whatever the trace's size.

Where a batch ends is found without a scan of every byte: a candidate cut is the last `}`
followed by `,` in the buffer, and the caller's decoder says whether the cut is a real event
boundary (a JSON parser fed `[` + the text up to a cut + `]` only succeeds when the cut falls
between two top-level events; a cut inside a string or a nested object ends the input early).
The JSON is not copied to make that array: the buffer (a bytearray) starts with `[`, the byte
after the cut's `}` is overwritten with `]` while the decoder reads a view of the buffer, and
after a batch the `,` before the next event becomes the new `[`.
Anything this reader does not expect raises `NotStreamable`, and the caller reads the file whole
(the path that gives the precise error messages).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import IO, Generic, TypeVar

from trainprof.trace.source import open_binary

CHUNK_BYTES = 512 << 10  # inflated JSON read at a time (batches are about this size)
MAX_BUFFER = 256 << 20  # one event (or a header) larger than this: read the file whole instead
TRIES = 8  # candidate cuts tried per batch before reading more

_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
_END = re.compile(rb"\}\s*,")  # the end of an event, when followed by the next one
_WS = b" \t\r\n"
_OPEN, _CLOSE = ord("["), ord("]")

T = TypeVar("T")


class NotStreamable(Exception):
    """The trace is not laid out as the streaming reader expects (or is damaged)."""


def inflated(raw: IO[bytes], chunk_bytes: int) -> Iterator[bytes]:
    """The file's bytes, gunzipped piecewise when it is gzip (ISA-L, several members allowed)."""
    head = raw.read(2)
    rest: IO[bytes] = raw
    if head == b"\x1f\x8b":
        from isal import igzip

        raw.seek(0)
        rest = igzip.IGzipFile(fileobj=raw, mode="rb")
    elif head:
        yield head
    try:
        while block := rest.read(chunk_bytes):
            yield block
    except Exception as err:  # noqa: BLE001 (corrupt or truncated gzip: IsalError, EOFError...)
        raise NotStreamable(str(err)) from None


class Batches(Generic[T]):
    """Iterate over decoded batches of events; afterwards `tail` holds the JSON the batches did
    not cover (for an object: the text before the events, then the last events, the closing `]`
    and any keys after it, itself a complete JSON document) and `is_object` its form.

    `decode(view)` gets a memoryview of a JSON array (`[` + events + `]`) and returns its result,
    or None when the array does not parse because the cut was not an event boundary. The view is
    only valid during the call: the result must not keep references into it (a `msgspec.Raw`
    decoded from it does), or the buffer cannot grow afterwards (BufferError)."""

    def __init__(
        self,
        chunks: Iterator[bytes],
        decode: Callable[[memoryview], T | None],
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self._chunks = chunks
        self._decode = decode
        self._want = chunk_bytes
        self.is_object = True
        self.tail = b""

    def _start(self) -> tuple[bytes, bytes]:
        """(text up to and including the events' `[`, what follows it)."""
        acc = b""
        for chunk in self._chunks:
            acc += chunk
            lead = acc.lstrip(_WS)
            if not lead:
                continue
            if lead[:1] == b"[":
                self.is_object = False
                return b"[", lead[1:]
            if lead[:1] != b"{":
                raise NotStreamable("not a JSON object or array")
            m = _EVENTS.search(acc)
            if m:
                return acc[: m.end()], acc[m.end() :]
            if len(acc) > MAX_BUFFER:
                raise NotStreamable("no traceEvents array near the start")
        raise NotStreamable("no traceEvents array")

    def _try(self, buf: bytearray, end: int) -> T | None:
        """Decode `buf[:end + 1]` (it starts with `[`; `buf[end]` is a `}`) closed by a `]`."""
        saved = buf[end + 1]  # whitespace or the `,` before the next event
        buf[end + 1] = _CLOSE
        view = memoryview(buf)
        try:
            return self._decode(view[: end + 2])
        finally:
            buf[end + 1] = saved
            view.release()

    def _cut(self, buf: bytearray) -> tuple[T, int] | None:
        """The decoded events up to the last cut that is an event boundary, and where it is."""
        start = max(1, len(buf) - (1 << 16))
        while True:
            ends = [m.start() for m in _END.finditer(buf, start)]
            for end in ends[::-1][:TRIES]:
                got = self._try(buf, end)
                if got is not None:
                    return got, end + 1
            if start == 1 or len(ends) >= TRIES:
                return None
            start = 1  # one huge event near the end: look further back

    def __iter__(self) -> Iterator[T]:
        prefix, rest = self._start()
        buf = bytearray(b"[")
        buf += rest
        for chunk in self._chunks:
            buf = _grown(buf, chunk)
            if len(buf) < self._want:
                continue
            got = self._cut(buf)
            if got is None:
                if len(buf) > MAX_BUFFER:
                    raise NotStreamable("an event larger than the buffer")
                continue
            events, end = got
            yield events
            # _END matched `}` + whitespace + `,`: that comma becomes the next batch's `[`.
            buf = _from(buf, buf.index(b",", end))
            buf[0] = _OPEN
        self.tail = prefix + bytes(memoryview(buf)[1:])


# A bytearray cannot be resized while a view of it exists. The decoder's views are gone when it
# returns, unless something keeps the frames that held them (a debugger, a Python-level
# sampling profiler, a saved traceback): then the reader goes on in a copy.


def _grown(buf: bytearray, chunk: bytes) -> bytearray:
    try:
        buf += chunk
        return buf
    except BufferError:
        return buf + chunk


def _from(buf: bytearray, k: int) -> bytearray:
    """`buf` without its first k bytes (deleting from the front of a bytearray moves its start:
    no copy)."""
    try:
        del buf[:k]
        return buf
    except BufferError:
        return buf[k:]


def open_batches(
    path: str, decode: Callable[[memoryview], T | None], chunk_bytes: int = CHUNK_BYTES,
    on_read: Callable[[int], None] | None = None,
) -> tuple[Batches[T], Callable[[], None]]:
    """Batches over the trace at `path` (a local path or an fsspec URL), and a function that
    closes the file. `on_read(n)` is told the file's bytes read so far (for a progress bar)."""
    raw = open_binary(path)

    def chunks() -> Iterator[bytes]:
        for block in inflated(raw, chunk_bytes):
            if on_read is not None:
                on_read(raw.tell())
            yield block

    return Batches(chunks(), decode, chunk_bytes), raw.close
