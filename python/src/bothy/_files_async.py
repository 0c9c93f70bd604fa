"""``sandbox.files`` (async): the sandbox's filesystem through the files API. Paths are resolved
inside the sandbox (relative ones from /workspace). Reads and writes stream both ways, so large
files never need to fit in memory: ``read_stream`` yields chunks as they arrive, ``write`` takes
an async iterator of bytes (sent as the server reads it)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, AsyncIterator, Dict, List, Optional, Union

from ._http import AsyncHttp
from .errors import ConflictError, NotFoundError
from .types import EntryInfo, WriteInfo

#: What ``write`` takes: text, bytes, or an async iterator of bytes (streamed).
WriteData = Union[str, bytes, AsyncIterator[bytes]]


def _entry(raw: Dict[str, Any], name: str, path: str) -> EntryInfo:
    return EntryInfo(
        name=name,
        path=path,
        type=raw["type"],
        size=int(raw["size"]),
        mode=int(raw["mode"]),
        mtime=datetime.fromtimestamp(raw["mtime_ms"] / 1000, tz=timezone.utc),
        sha256=raw.get("sha256"),
    )


class AsyncFiles:
    """Reads, writes and lists files in one sandbox; ``sandbox.files``."""

    def __init__(self, http: AsyncHttp, sandbox_id: str) -> None:
        self._http = http
        self._base = f"/sandboxes/{sandbox_id}/files"

    async def read(self, path: str, *, format: str = "text") -> Union[str, bytes]:
        """Reads a whole file as text (default, UTF-8) or, with ``format="bytes"``, as bytes."""
        res = await self._http.send("GET", self._base, query={"path": path}, timeout=False)
        return res.content if format == "bytes" else res.content.decode("utf-8", "replace")

    async def read_bytes(self, path: str) -> bytes:
        """Reads a whole file as bytes."""
        res = await self._http.send("GET", self._base, query={"path": path}, timeout=False)
        return res.content

    async def read_stream(self, path: str, chunk_size: int = 64 * 1024) -> AsyncIterator[bytes]:
        """Yields the file's bytes as they arrive; the download is paced by how fast you iterate."""
        res = await self._http.send("GET", self._base, query={"path": path}, stream=True, timeout=False)
        try:
            async for chunk in res.aiter_bytes(chunk_size):
                yield chunk
        finally:
            await res.aclose()

    async def write(
        self, path: str, data: WriteData, *, mode: Union[int, str, None] = None, if_match: Optional[str] = None
    ) -> WriteInfo:
        """Replaces the file atomically with ``data`` (parent directories must exist). ``mode``: e.g.
        0o755; ``if_match``: write only if the file's sha256 is still this, else ConflictError."""
        content: Any = data.encode("utf-8") if isinstance(data, str) else data
        headers = {"content-type": "application/octet-stream"}
        if if_match is not None:
            headers["if-match"] = f'"{if_match}"'
        m = format(mode, "o") if isinstance(mode, int) else mode
        answer = await self._http.json(
            "PUT", self._base, query={"path": path, "mode": m}, content=content, headers=headers, timeout=False
        )
        return WriteInfo(path=answer["path"], size=int(answer["size"]), sha256=answer["sha256"])

    async def stat(self, path: str, *, sha256: bool = False) -> EntryInfo:
        """What is at ``path`` (NotFoundError when nothing is)."""
        raw = await self._http.json("GET", f"{self._base}/stat", query={"path": path, "sha256": sha256 or None})
        return _entry(raw, raw["path"].rstrip("/").split("/")[-1], raw["path"])

    async def exists(self, path: str) -> bool:
        """Whether anything exists at ``path``."""
        try:
            await self.stat(path)
            return True
        except NotFoundError:
            return False

    async def list(self, path: str) -> List[EntryInfo]:
        """The directory's entries (at most 5000)."""
        listing = await self._http.json("GET", f"{self._base}/list", query={"path": path})
        base = listing["path"]
        sep = "" if base.endswith("/") else "/"
        return [_entry(e, e["name"], f"{base}{sep}{e['name']}") for e in listing["entries"]]

    async def make_dir(self, path: str, *, parents: bool = True) -> bool:
        """Makes a directory (and its parents unless ``parents=False``); False when it existed."""
        try:
            await self._http.json("POST", f"{self._base}/mkdir", json_body={"path": path, "parents": False})
            return True
        except ConflictError as err:
            if err.code == "file_exists":
                return False
            raise
        except NotFoundError:
            if not parents:
                raise
        await self._http.json("POST", f"{self._base}/mkdir", json_body={"path": path, "parents": True})
        return True

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        """Removes a file, or a directory (a non-empty one needs ``recursive=True``)."""
        await self._http.json("DELETE", self._base, query={"path": path, "recursive": recursive or None})

    async def rename(self, old_path: str, new_path: str) -> EntryInfo:
        """Moves ``old_path`` to ``new_path`` and describes it there."""
        await self._http.json("POST", f"{self._base}/rename", json_body={"from": old_path, "to": new_path})
        return await self.stat(new_path)
