"""``memstate data fetch``: download the datasets as their publishers release them, into the layout the configs read.

``DATASETS`` is the one table: per dataset its licence and files, each a pinned HTTP URL or a Hugging Face Hub file
(repo, revision, filename), the sha256 where it is known, and for an archive the members kept (a regex whose first
group is the path written under ``OUT/<name>/``). ``memstate data fetch all --out data/raw`` writes what
``configs/data/default.yaml`` reads (``data/raw/fever``, ``…/scifact``, ``…/personamem``) plus ``…/locomo`` and
``…/memsyco``. docs/data_fetch.md has the sources, pins and licences.

- HTTP: httpx, streamed to ``FILE.part`` with a progress bar; an existing ``.part`` is resumed with
  ``Range: bytes=N-`` (a server that answers 200 instead of 206 restarts it). Hub files: ``hf_hub_download`` (it
  resumes itself; ``HF_ENDPOINT`` is read at each call, not at import). ``MEMSTATE_FETCH_BASE_URL`` replaces the
  scheme and host of every HTTP source (a mirror; the tests' loopback server).
- Checksums: a file whose table sha256 is known is verified; a mismatch deletes it and is an error. Otherwise its
  sha256 is recorded in ``OUT/memstate-data.lock.json`` on first fetch, and later runs check present files against
  it (a different hash is an error). A file present with the right hash is skipped ("up to date").
- Nothing half-written: downloads go to ``.part``, archives unpack into a temporary folder beside the target and
  their members are renamed into place once all are out and checked. A host that does not answer, a refused
  connection, a timeout, a connection cut mid-file or a full disk is one line (``FetchError``); the ``.part`` stays
  for the next run to resume.
- Bounded against a hostile server (``Limits``): bytes per file and per unpacked member and per archive, a wall-clock
  deadline per download, redirects only to the source's own origin or its listed https hosts, no encoded bodies, an
  archive's expected members all present. A body that ends short of its Content-Length stays resumable; a 416 to a
  resume finishes the ``.part`` only when the server's size equals it. Whatever breaks a bound is deleted, never
  recorded in the lock.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fnmatch
import gzip
import hashlib
import json
import logging
import lzma
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
import zipfile
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urljoin, urlsplit, urlunsplit

from memstate.errors import MemstateError

LOCK_NAME = "memstate-data.lock.json"
BASE_URL_ENV = "MEMSTATE_FETCH_BASE_URL"
SIZES = ("32k", "128k", "1M")


class FetchError(MemstateError, RuntimeError):
    """A download that cannot be used: an HTTP error, a checksum that does not match, a disk that is full, an
    archive without the expected members. The message names the URL or file."""

    hint = "docs/data_fetch.md lists every source, its pin and its licence"


class FetchInterrupted(FetchError):
    """A host that does not answer, refuses, times out or cuts the connection mid-file."""

    hint = "rerun the same command to resume: the .part file keeps what was received"


@dataclass(frozen=True)
class Source:
    """One released file. ``file``: its name under ``OUT/<dataset>/`` (an archive's own name; ``{size}`` is
    replaced by ``--size``). Exactly one of ``url`` (HTTP) and ``hub`` (repo id, revision; a dataset repo, the file
    is ``file``). ``members``: for an archive, a regex over member names whose first group is the path to write;
    ``expect``: globs over those paths that must each match one (the archive is refused otherwise). ``size_bytes``:
    the exact size where it is known (it replaces the default cap). ``hosts``: https hosts besides the URL's own
    that a redirect may lead to."""

    file: str
    url: str | None = None
    hub: tuple[str, str] | None = None
    sha256: str | None = None
    members: str | None = None
    expect: tuple[str, ...] = ()
    size_bytes: int | None = None
    hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Dataset:
    licence: str
    sources: tuple[Source, ...]
    non_commercial: bool = False


_FEVER = "https://fever.ai/download/fever"
_MEMSYCO = "https://raw.githubusercontent.com/XMUDeepLIT/MemSyco-Bench/c31e2c85ee8cc3c6f643587b8a6f4b5ad5eb3bf6/data"
# sha256 None: the publisher gives none; the first fetch records it in the lock file (docs/data_fetch.md, "Pins").
DATASETS: dict[str, Dataset] = {
    "fever": Dataset(
        "claims: FEVER 1.0 annotations (fever.ai); wiki-pages: Wikipedia text, CC BY-SA 3.0",
        (
            Source("train.jsonl", f"{_FEVER}/train.jsonl"),
            Source("shared_task_dev.jsonl", f"{_FEVER}/shared_task_dev.jsonl"),
            Source("paper_dev.jsonl", f"{_FEVER}/paper_dev.jsonl"),
            Source(
                "wiki-pages.zip",
                f"{_FEVER}/wiki-pages.zip",
                members=r"(?:.*/)?(wiki-pages/wiki-\d+\.jsonl)",
                expect=("wiki-pages/wiki-*.jsonl",),  # wiki-001 … wiki-109; their count is not pinned
            ),
        ),
    ),
    "scifact": Dataset(
        "claims_*.jsonl: CC BY 4.0; corpus.jsonl: S2ORC abstracts, ODC-By 1.0 (allenai/scifact LICENSE.md)",
        (
            Source(
                "data.tar.gz",
                "https://scifact.s3-us-west-2.amazonaws.com/release/latest/data.tar.gz",
                members=r"(?:.*/)?(claims_(?:train|dev|test)\.jsonl|corpus\.jsonl)",
                expect=("claims_train.jsonl", "claims_dev.jsonl", "claims_test.jsonl", "corpus.jsonl"),
            ),
        ),
    ),
    "personamem": Dataset(
        "MIT (dataset card of bowen-upenn/PersonaMem)",
        (  # revision "main": no commit sha was verifiable; the lock records the commit main resolved to
            Source("questions_{size}.csv", hub=("bowen-upenn/PersonaMem", "main")),
            Source("shared_contexts_{size}.jsonl", hub=("bowen-upenn/PersonaMem", "main")),
        ),
    ),
    "locomo": Dataset(
        "CC BY-NC 4.0 (snap-research/locomo): non-commercial use only, with attribution",
        # Branch "main": the commit that added data/locomo10.json was not verifiable; the lock records its sha256.
        (Source("locomo10.json", "https://raw.githubusercontent.com/snap-research/locomo/main/data/locomo10.json"),),
        non_commercial=True,
    ),
    "memsyco": Dataset(
        "MIT, copyright (c) 2025 XMU-DeepLIT (XMUDeepLIT/MemSyco-Bench LICENSE)",
        (  # the two tasks third_party/data/memsyco ships; sha256 as in data/manifest.json at the pinned commit
            Source(
                "memory_evidence_conflict.jsonl",
                f"{_MEMSYCO}/memory_evidence_conflict.jsonl",
                size_bytes=2679554,
                sha256="adf9a924bae5bf4d554c0f7bf69c8c867037caf13c9839afa93605cb39442823",
            ),
            Source(
                "valid_memory_selection.jsonl",
                f"{_MEMSYCO}/valid_memory_selection.jsonl",
                size_bytes=3952822,
                sha256="7db0f062306a925f7cea9ea9cfb32cb94bbe2bb17999eff3e4a764aeabc4d498",
            ),
            Source(
                "schema.json",
                f"{_MEMSYCO}/schema.json",
                size_bytes=2773,
                sha256="8c54d9a53c9a44478f49dbcb003b6251e09d894fb63b687671f9796c13c11b6c",
            ),
        ),
    ),
}


# ---- bounds -------------------------------------------------------------------------------------------------------

GiB = 1 << 30
MAX_REDIRECTS = 5
MAX_EXPANSION = 100  # most bytes unpacked per archive byte (plus 1 MiB): see _extract
# Flag (argparse dest) -> environment variable; a flag given wins over its variable, either over the default.
LIMIT_ENV = {
    "max_file": "MEMSTATE_FETCH_MAX_FILE_SIZE",
    "max_member": "MEMSTATE_FETCH_MAX_MEMBER_SIZE",
    "max_unpacked": "MEMSTATE_FETCH_MAX_UNPACKED_SIZE",
    "deadline": "MEMSTATE_FETCH_DEADLINE",
}


@dataclass(frozen=True)
class Limits:
    """What a server can make one run write or wait for. The defaults sit well above the real releases: the largest
    download, FEVER's wiki-pages.zip, is 1.71 GB; its biggest member tens of MB; all its members a few GB."""

    max_file: int = 4 * GiB  # one download whose size the table does not give
    max_member: int = 1 * GiB  # one unpacked archive member
    max_unpacked: int = 32 * GiB  # all the members of one archive together
    deadline: float = 3600.0  # seconds for one HTTP download, first request to last byte (a rerun resumes)


def parse_size(text: str, what: str) -> int:
    """Bytes from ``text``: a number, optionally with K, M, G or T (powers of 1024).

    >>> parse_size("4G", "--max-file-size"), parse_size("1.5k", "x"), parse_size("512", "x")
    (4294967296, 1536, 512)
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise FetchError(f"{what} {text!r}: a size above 0 in bytes, or with K, M, G or T (e.g. 4G)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " "))


def resolve_limits(**flags: str | None) -> Limits:
    """``Limits`` from the flags given (``max_file="8G"``, ``deadline="7200"``), else ``LIMIT_ENV``, else defaults."""
    values: dict = {}
    for field, env in LIMIT_ENV.items():
        text, what = flags.get(field), "--" + field.replace("_", "-") + ("-size" if field != "deadline" else "")
        if not text and os.environ.get(env):
            text, what = os.environ[env], env
        if not text:
            continue
        if field != "deadline":
            values[field] = parse_size(text, what)
            continue
        try:
            values[field] = float(text)
        except ValueError:
            values[field] = 0.0
        if not 0 < values[field] < float("inf"):
            raise FetchError(f"{what} {text!r}: seconds above 0 (e.g. 7200)")
    return Limits(**values)


# ---- helpers ------------------------------------------------------------------------------------------------------


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_url(src: Source) -> str:
    """Where ``src`` is downloaded from: its URL (scheme and host replaced by ``MEMSTATE_FETCH_BASE_URL``), or the
    Hub's resolve URL under ``HF_ENDPOINT``."""
    if src.hub is not None:
        endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
        return f"{endpoint}/datasets/{src.hub[0]}/resolve/{src.hub[1]}/{src.file}"
    base = os.environ.get(BASE_URL_ENV)
    if not base:
        return src.url
    b, u = urlsplit(base), urlsplit(src.url)
    return urlunsplit((b.scheme, b.netloc, b.path.rstrip("/") + u.path, u.query, ""))


def _origin(url: str) -> tuple[str, str, int | None]:
    u = urlsplit(url)
    try:
        port = u.port or {"http": 80, "https": 443}.get(u.scheme)
    except ValueError:  # a port that is not a number: matches nothing
        port = -1
    return u.scheme.lower(), (u.hostname or "").lower(), port


def allowed_origins(src: Source, url: str) -> set[tuple[str, str, int | None]]:
    """Where a redirect from ``url`` may lead: its own scheme, host and port, and (without a mirror) https on the
    source's listed hosts. A mirror (``MEMSTATE_FETCH_BASE_URL``) stands for all of them: only its own origin."""
    extra = () if os.environ.get(BASE_URL_ENV) else src.hosts
    return {_origin(url), *(("https", h.lower(), 443) for h in extra)}


def _disk_full(e: OSError, path: Path) -> FetchError:
    free = shutil.disk_usage(path.parent).free if path.parent.exists() else 0
    return FetchError(f"disk full writing {path} ({free} bytes free): {e.strerror}")


class Lock:
    """``OUT/memstate-data.lock.json``: per fetched file (``dataset/file``) its source, size, sha256, licence and
    when it was fetched; an archive's entry lists its members' sha256 too. Written whole after every file."""

    def __init__(self, out: Path):
        self.path = out / LOCK_NAME
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            try:
                self.entries = self._valid(json.loads(self.path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise FetchError(f"{self.path}: not a memstate lock file ({e}); move it away to start over") from e

    @staticmethod
    def _valid(doc: object) -> dict[str, dict]:
        """The ``files`` of a lock document, every field this module reads checked for its type (a hand-edited or
        foreign file is an error here, not an AttributeError later)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
            raise TypeError('not a JSON object with a "files" object')
        for key, entry in doc["files"].items():
            if not isinstance(entry, dict):
                raise TypeError(f"{key!r} is not an object")
            if not isinstance(entry.get("sha256", ""), str):
                raise TypeError(f"{key!r}: sha256 is not a string")
            members = entry.get("members", {})
            if not isinstance(members, dict) or not all(isinstance(v, str) for v in members.values()):
                raise TypeError(f"{key!r}: members is not an object of sha256 strings")
        return doc["files"]

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def put(self, key: str, entry: dict) -> None:
        self.entries[key] = entry
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"version": 1, "files": self.entries}, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)


# ---- downloads ----------------------------------------------------------------------------------------------------


def _get(client, url: str, headers: dict[str, str], allowed: set) -> tuple[object, str]:
    """The streamed reply to GET ``url`` and the URL that gave it, following redirects inside ``allowed`` only."""
    for _ in range(MAX_REDIRECTS + 1):
        reply = client.send(client.build_request("GET", url, headers=headers), stream=True)
        if not reply.is_redirect:
            return reply, url
        reply.close()
        try:
            target = urljoin(url, reply.headers["Location"])
            origin = _origin(target)
        except ValueError as e:
            raise FetchError(f"{url}: redirected to an invalid URL ({e}); nothing was written") from e
        if origin not in allowed:
            hosts = ", ".join(sorted(f"{s}://{h}:{p}" for s, h, p in allowed))
            raise FetchError(f"{url}: redirected to {target}, outside the allowed {hosts}; nothing was written")
        url = target
    raise FetchError(f"{url}: more than {MAX_REDIRECTS} redirects (a loop); nothing was written")


def _content_range(reply) -> tuple[int | None, int | None]:
    """(first byte, total size) of a ``Content-Range: bytes A-B/N`` or ``bytes */N``; None where absent."""
    m = re.fullmatch(r"bytes (?:(\d+)-\d+|\*)/(\d+|\*)", reply.headers.get("Content-Range", "").strip())
    if not m:
        return None, None
    return (int(m.group(1)) if m.group(1) else None), (int(m.group(2)) if m.group(2) != "*" else None)


def download_http(
    url: str,
    part: Path,
    *,
    allowed: set | None = None,
    size: int | None = None,
    limits: Limits = Limits(),
    timeout: float = 60.0,
) -> str:
    """Stream ``url`` into ``part``, resuming it (``Range``) when it exists; the bytes received stay on an interrupted
    transfer. ``size``: the exact size if known, else ``limits.max_file`` caps it. Returns the URL that answered."""
    import httpx

    allowed = allowed if allowed is not None else {_origin(url)}
    deadline = time.monotonic() + limits.deadline
    try:
        # A read timeout no longer than the deadline: the deadline is checked between reads.
        with httpx.Client(follow_redirects=False, timeout=httpx.Timeout(min(timeout, limits.deadline))) as client:
            for _attempt in range(2):  # the second: a restart from byte 0 after a 416 that disowns the .part
                final = _download_once(client, url, part, allowed, size, limits, deadline)
                if final is not None:
                    return final
            raise FetchError(f"{url}: the server refused a download from byte 0; delete {part} and rerun")
    except httpx.TimeoutException as e:
        raise FetchInterrupted(f"{url}: timed out ({type(e).__name__}); {_kept(part)}") from e
    except httpx.TransportError as e:  # refused, unreachable, name not resolved, connection cut mid-file
        raise FetchInterrupted(f"{url}: {type(e).__name__}: {e or 'connection failed'}; {_kept(part)}") from e
    except (httpx.HTTPError, httpx.InvalidURL) as e:  # a malformed reply or Location
        raise FetchError(f"{url}: {type(e).__name__}: {e}; {_kept(part)}") from e
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _disk_full(e, part) from e
        raise


def _download_once(client, url: str, part: Path, allowed: set, size: int | None, limits: Limits, deadline: float):
    """One GET of ``url`` into ``part``: the final URL, or None when the ``.part`` was dropped and a retry from
    byte 0 is due."""
    from tqdm import tqdm

    have = part.stat().st_size if part.exists() else 0
    # What the .part was begun from: its strong ETag (If-Range: a file changed upstream restarts) and its size (a
    # resume announcing another size is another file's tail, not the rest of this one).
    tag = part.with_name(part.name + ".meta")
    began = _read_part_meta(tag) if have else {}
    headers = {"Accept-Encoding": "identity"}  # the bytes as stored: a Range counts them
    if have:
        headers["Range"] = f"bytes={have}-"
        if began.get("etag"):
            headers["If-Range"] = began["etag"]
    cap = size if size is not None else limits.max_file
    capped_by = "the size the table gives" if size is not None else "--max-file-size (MEMSTATE_FETCH_MAX_FILE_SIZE)"
    reply, final = _get(client, url, headers, allowed)
    with contextlib.closing(reply):
        if reply.status_code == 416 and have:
            total = _content_range(reply)[1]
            if total == have and began.get("total") in (None, have):  # the server's size is the .part's: complete
                tag.unlink(missing_ok=True)
                return final
            if total is None:
                raise FetchError(f"{final}: HTTP 416 to a resume from byte {have}, without the file's size; "
                                 f"delete {part} to restart")  # fmt: skip
            part.unlink()  # the server's file is not the one the .part began: not a prefix to finish
            tag.unlink(missing_ok=True)
            return None
        encoding = reply.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):  # stored encoded it would be another file than the one published
            raise FetchError(f"{final}: the server sent Content-Encoding {encoding} although identity was asked; "
                             f"refused, nothing written ({_kept(part)})")  # fmt: skip
        length = reply.headers.get("Content-Length", "")
        if reply.status_code == 200:
            total = int(length) if length.isdigit() else None
            have, mode = 0, "wb"  # no range support, or another version: start over
        elif reply.status_code == 206 and _content_range(reply)[0] == have:
            total, mode = _content_range(reply)[1], "ab"
            if None not in (total, began.get("total")) and total != began["total"]:
                part.unlink()  # the rest of a file of another size: splicing it on would make neither file
                tag.unlink(missing_ok=True)
                return None
        else:
            fix = f"; delete {part} to restart" if reply.status_code == 206 else ""
            raise FetchError(f"{final}: HTTP {reply.status_code} {reply.reason_phrase}{fix}")
        if total is not None and total > cap:
            raise FetchError(f"{final}: the server announces {total} bytes, more than {cap} ({capped_by})")
        if total is not None and size is not None and total != size:
            raise FetchError(f"{final}: the server announces {total} bytes, the table {size}; nothing written")
        if reply.status_code == 200:
            etag = reply.headers.get("ETag", "")
            meta = {"etag": etag if etag.startswith('"') else None, "total": total}  # a strong validator only
            tag.write_text(json.dumps(meta))
        with (
            open(part, mode) as f,
            tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=part.name[:-5], disable=None) as bar,
        ):
            for chunk in reply.iter_raw():  # written as received, so a cut connection keeps them
                if have + len(chunk) > cap:
                    f.close()
                    part.unlink()
                    tag.unlink(missing_ok=True)
                    raise FetchError(f"{final}: more than {cap} bytes ({capped_by}); the download was deleted")
                f.write(chunk)
                have += len(chunk)
                bar.update(len(chunk))
                if time.monotonic() > deadline:
                    f.close()
                    raise FetchInterrupted(f"{final}: not done within the {limits.deadline:g} s deadline (--deadline, "
                                           f"MEMSTATE_FETCH_DEADLINE); {_kept(part)}")  # fmt: skip
    if have < (total if total is not None else size or 0):  # the body ended early: what came is a resumable prefix
        raise FetchInterrupted(f"{final}: the body ended after {have} of {total or size} bytes; {_kept(part)}")
    tag.unlink(missing_ok=True)
    return final


def _read_part_meta(path: Path) -> dict:
    """``{"etag": …, "total": …}`` of a ``.part.meta``, or {} when it is missing or not ours (then a resume checks
    only what the server says)."""
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(meta, dict):
        return {}
    etag, total = meta.get("etag"), meta.get("total")
    return {"etag": etag if isinstance(etag, str) else None, "total": total if isinstance(total, int) else None}


def _causes(e: BaseException) -> str:
    """``Error: message`` of ``e`` and of the errors it was raised from (the first cause says what went wrong)."""
    chain = []
    while e is not None and len(chain) < 4:
        chain.append(f"{type(e).__name__}: {' '.join(str(e).split())[:200]}")
        e = e.__cause__ or e.__context__
    return " <- ".join(chain)


def _kept(part: Path) -> str:
    size = part.stat().st_size if part.exists() else 0
    return f"{part} keeps {size} bytes to resume from" if size else "nothing was written"


def download_hub(src: Source, file: str, staging: Path) -> tuple[Path, str | None]:
    """``hf_hub_download`` into ``staging`` (its own resumable ``.incomplete`` lives there); the file and the commit
    the revision resolved to (None if unknown)."""
    from huggingface_hub import hf_hub_download

    repo, revision = src.hub
    url = source_url(Source(file, hub=src.hub))
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)  # its per-retry warnings: a failure is reported once, below, in one line
    try:
        path = hf_hub_download(
            repo,
            file,
            revision=revision,
            repo_type="dataset",
            local_dir=staging,
            endpoint=os.environ.get("HF_ENDPOINT") or None,
        )
    except KeyboardInterrupt:
        raise
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _disk_full(e, staging / file) from e
        raise FetchInterrupted(f"{url}: {_causes(e)}") from e
    except Exception as e:  # huggingface_hub's and its HTTP client's errors have no common base besides this
        raise FetchInterrupted(f"{url}: {_causes(e)}") from e
    finally:
        hub_log.setLevel(level)
    meta = staging / ".cache" / "huggingface" / "download" / f"{file}.metadata"
    commit = meta.read_text().split("\n", 1)[0].strip() if meta.exists() else None
    return Path(path), commit or None


# ---- one file -----------------------------------------------------------------------------------------------------


def _check_present(path: Path, want: str | None, where: str) -> bool:
    """True when ``path`` exists with sha256 ``want``; an error when it exists with another."""
    if not path.exists() or want is None:
        return False
    got = sha256_of(path)
    if got != want:
        raise FetchError(f"{path}: sha256 {got}, but {where} says {want}; move it away to fetch it again")
    return True


class _Refused(Exception):
    """An archive that must not be used (unreadable, over a bound, members missing); the message says why."""


def _extract(archive: Path, pattern: str, into: Path, limits: Limits) -> dict[str, Path]:
    """The members matching ``pattern``, written under ``into`` at their first group; {relative path: file}. The
    bytes are counted as written: the sizes an archive declares can lie."""
    rx, out, total = re.compile(pattern), {}, 0
    # A bomb's signature, whatever the caps: text compresses ~3-10x (FEVER's wiki-pages ~3x); DEFLATE allows ~1000x.
    most = MAX_EXPANSION * archive.stat().st_size + (1 << 20)

    def target(name: str) -> Path | None:
        m = rx.fullmatch(name)
        if not m or ".." in Path(m.group(1)).parts or m.group(1).startswith("/"):
            return None
        return into / m.group(1)

    def write(src, dest: Path, name: str) -> None:
        nonlocal total
        dest.parent.mkdir(parents=True, exist_ok=True)
        written = 0
        with open(dest, "wb") as dst:
            while block := src.read(1 << 20):
                written, total = written + len(block), total + len(block)
                if written > limits.max_member:
                    raise _Refused(f"member {name} unpacks to more than {limits.max_member} bytes "
                                   "(--max-member-size, MEMSTATE_FETCH_MAX_MEMBER_SIZE)")  # fmt: skip
                if total > limits.max_unpacked:
                    raise _Refused(f"its members unpack to more than {limits.max_unpacked} bytes "
                                   "(--max-unpacked-size, MEMSTATE_FETCH_MAX_UNPACKED_SIZE)")  # fmt: skip
                if total > most:
                    raise _Refused(f"its members unpack to more than {MAX_EXPANSION}x its size, a zip bomb's "
                                   "signature (text compresses ~3-10x)")  # fmt: skip
                dst.write(block)
        out[dest.relative_to(into).as_posix()] = dest

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                if not info.is_dir() and (dest := target(info.filename)) is not None:
                    with z.open(info) as src:
                        write(src, dest, info.filename)
    else:
        with tarfile.open(archive) as t:
            for member in t:
                if member.isfile() and (dest := target(member.name)) is not None:
                    with t.extractfile(member) as src:
                        write(src, dest, member.name)
    if not out:
        raise _Refused(f"no member matches {pattern}; not the release this table expects")
    return out


def fetch_file(
    name: str, dataset: Dataset, src: Source, out: Path, lock: Lock, size: str, limits: Limits = Limits()
) -> str:
    """Fetch one source of ``name`` into ``out/name``; returns the line to print."""
    file = src.file.format(size=size)
    key, target_dir, url = f"{name}/{file}", out / name, source_url(Source(file, src.url, src.hub))
    entry = lock.get(key)
    want = src.sha256 or (entry or {}).get("sha256")
    where = "the table" if src.sha256 else f"the lock ({lock.path.name})"
    if src.members is None:
        if _check_present(target_dir / file, want, where):
            return f"{key}: up to date"
    elif entry and entry.get("members") and all((target_dir / m).exists() for m in entry["members"]):
        for rel, digest in entry["members"].items():
            _check_present(target_dir / rel, digest, f"the lock ({lock.path.name})")
        return f"{key}: up to date ({len(entry['members'])} files)"
    target_dir.mkdir(parents=True, exist_ok=True)
    part, commit = target_dir / f"{file}.part", None
    if src.hub is not None:
        staging = target_dir / ".hub"
        got_path, commit = download_hub(src, file, staging)
        os.replace(got_path, part)
        if part.stat().st_size > limits.max_file:  # checked after the fact: huggingface_hub writes it
            part.unlink()
            raise FetchError(f"{url}: more than {limits.max_file} bytes (--max-file-size, "
                             "MEMSTATE_FETCH_MAX_FILE_SIZE); the download was deleted")  # fmt: skip
    else:
        url = download_http(url, part, allowed=allowed_origins(src, url), size=src.size_bytes, limits=limits)
    got = sha256_of(part)
    if want is not None and got != want:
        part.unlink()
        raise FetchError(f"{url}: sha256 {got}, but {where} says {want}; the download was deleted")
    record = {
        "dataset": name,
        "file": file,
        "source": url if src.hub is None else f"hf://datasets/{src.hub[0]}@{src.hub[1]}/{file}",
        "size": part.stat().st_size,
        "sha256": got,
        "licence": dataset.licence,
        "fetched_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if commit:
        record["commit"] = commit
    if src.members is None:
        os.replace(part, target_dir / file)
        line = f"{key}: fetched ({record['size']} bytes, sha256 {got})"
    else:
        record["members"] = _unpack(part, src, target_dir, limits)
        part.unlink()
        line = f"{key}: fetched and unpacked {len(record['members'])} files ({record['size']} bytes, sha256 {got})"
    if src.hub is not None:
        shutil.rmtree(target_dir / ".hub", ignore_errors=True)
    lock.put(key, record)
    return line


def _unpack(archive: Path, src: Source, target_dir: Path, limits: Limits) -> dict[str, str]:
    """Unpack the matching members beside the target, check the ones already there, then rename into place. An
    archive that cannot be used is deleted (a rerun downloads it again): kept, it would only fail the same way."""
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target_dir))
    try:
        try:
            members = _extract(archive, src.members, tmp, limits)
            missing = [g for g in src.expect if not any(fnmatch.fnmatchcase(rel, g) for rel in members)]
            if missing:
                raise _Refused(f"holds no {', '.join(missing)}; not the whole release")
        except OSError as e:
            if e.errno == errno.ENOSPC:  # the archive is fine: kept for the rerun once there is room
                raise _disk_full(e, tmp / "x") from e
            if e.errno is not None and not isinstance(e, gzip.BadGzipFile):  # the disk's, not the archive's
                raise FetchError(f"unpacking {archive}: {e.strerror} ({e.filename}); the archive is kept, rerun "
                                 "once that is fixed") from e  # fmt: skip
            archive.unlink()  # a decompressor's error (no errno): the archive's bytes are bad
            raise FetchError(f"{archive}: not a readable archive ({_causes(e)}); it was deleted, rerun to fetch it "
                             "again") from e  # fmt: skip
        # Truncated or corrupt, an encrypted zip member (RuntimeError), an unknown compression (NotImplementedError)
        except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, RuntimeError,
                NotImplementedError) as e:  # fmt: skip
            archive.unlink()
            raise FetchError(f"{archive}: not a readable archive ({_causes(e)}); it was deleted, rerun to fetch it "
                             "again") from e  # fmt: skip
        except _Refused as e:
            archive.unlink()
            raise FetchError(f"{archive}: {e}; it was deleted, nothing unpacked") from e
        digests = {rel: sha256_of(path) for rel, path in sorted(members.items())}
        for rel, digest in digests.items():  # all checked before anything moves
            _check_present(target_dir / rel, digest, f"the archive just fetched ({archive.name[:-5]})")
        for rel in digests:
            (target_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(members[rel], target_dir / rel)
        return digests
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def clean_stale(name: str, dataset: Dataset, target_dir: Path) -> list[Path]:
    """Remove what an interrupted run of ``name`` left and no run can use: every ``.unpack-*`` folder (an unpack is
    redone from its archive), and a ``.part`` (or ``.part.meta``) of a file the table no longer names for any
    ``--size``. A ``.part`` the table names is kept: it is resumable. Returns what was removed."""
    if not target_dir.is_dir():
        return []
    named = {src.file.format(size=s) for src in dataset.sources for s in SIZES}
    removed = []
    for path in sorted(target_dir.iterdir()):
        if path.name.startswith(".unpack-") and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.is_file() and path.name.endswith((".part", ".part.meta")):
            if path.name.removesuffix(".meta").removesuffix(".part") in named:
                continue
            path.unlink()
        else:
            continue
        removed.append(path)
    return removed


def fetch(names: list[str], out: str | Path, size: str = "32k", echo=print, limits: Limits | None = None) -> Path:
    """Fetch every dataset of ``names`` ("all": every one) into ``out``; returns the lock file. ``limits``: the
    bounds, by default from the environment (``resolve_limits``)."""
    if size not in SIZES:
        raise FetchError(f"--size {size}: one of {', '.join(SIZES)}")
    wanted = list(DATASETS) if "all" in names else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in DATASETS]
    if unknown:
        raise FetchError(f"unknown dataset(s) {', '.join(unknown)}; known: {', '.join(DATASETS)}, all")
    limits = limits or resolve_limits()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FetchError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FetchError(f"--out {out}: cannot create it: {e.strerror}") from e
    lock = Lock(out)
    for name in wanted:
        dataset = DATASETS[name]
        flag = "NON-COMMERCIAL: " if dataset.non_commercial else ""
        echo(f"{name}: licence: {flag}{dataset.licence}")
        for path in clean_stale(name, dataset, out / name):
            echo(f"{name}: removed {path.name} (left by an interrupted run)")
        for src in dataset.sources:
            echo(fetch_file(name, dataset, src, out, lock, size, limits))
    return lock.path


# ---- CLI ----------------------------------------------------------------------------------------------------------


def make_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Download datasets as released into OUT/<name>/ (the layout configs/data/default.yaml reads "
        "under data/raw), verify or record their sha256 in OUT/memstate-data.lock.json, resume interrupted "
        "downloads. Reruns skip files that are up to date.",
        epilog=f"environment: {BASE_URL_ENV} replaces the scheme and host of every HTTP source (a mirror); "
        "HF_ENDPOINT the Hugging Face Hub's (PersonaMem); the bounds' variables are named in their flags' help. "
        "Sources, pins, licences and bounds: docs/data_fetch.md.",
    )
    p.add_argument("names", nargs="+", choices=[*DATASETS, "all"], metavar="NAME",
                   help=f"Datasets: {', '.join(DATASETS)}, or all.")  # fmt: skip
    p.add_argument("--out", required=True, help="Folder to write OUT/<name>/… and the lock file into.")
    p.add_argument("--size", default="32k", choices=SIZES, help="PersonaMem's context length variant.")
    d = Limits()  # default SUPPRESS: unset flags fall back to their variable, and the help shows the real default
    p.add_argument("--max-file-size", dest="max_file", default=argparse.SUPPRESS, metavar="SIZE",
                   help=f"Most bytes one download may have when the table gives no size (default {d.max_file // GiB}G; "
                   f"or {LIMIT_ENV['max_file']}).")  # fmt: skip
    p.add_argument("--max-member-size", dest="max_member", default=argparse.SUPPRESS, metavar="SIZE",
                   help=f"Most bytes one archive member may unpack to (default {d.max_member // GiB}G; "
                   f"or {LIMIT_ENV['max_member']}).")  # fmt: skip
    p.add_argument("--max-unpacked-size", dest="max_unpacked", default=argparse.SUPPRESS, metavar="SIZE",
                   help=f"Most bytes all members of one archive may unpack to (default {d.max_unpacked // GiB}G; "
                   f"or {LIMIT_ENV['max_unpacked']}).")  # fmt: skip
    p.add_argument("--deadline", default=argparse.SUPPRESS, metavar="SECONDS",
                   help=f"Wall-clock seconds one HTTP download may take; a rerun resumes it (default "
                   f"{d.deadline:g}; or {LIMIT_ENV['deadline']}).")  # fmt: skip
    return p


def run(args: argparse.Namespace) -> int:
    try:
        limits = resolve_limits(**{field: getattr(args, field, None) for field in LIMIT_ENV})
        lock = fetch(args.names, args.out, args.size, limits=limits)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: a .part file keeps what was received; rerun the same command to resume\n")
        return 130
    print(f"lock: {lock}")
    return 0
