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
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

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
    is ``file``). ``members``: for an archive, a regex over member names whose first group is the path to write."""

    file: str
    url: str | None = None
    hub: tuple[str, str] | None = None
    sha256: str | None = None
    members: str | None = None


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
            Source("wiki-pages.zip", f"{_FEVER}/wiki-pages.zip", members=r"(?:.*/)?(wiki-pages/wiki-\d+\.jsonl)"),
        ),
    ),
    "scifact": Dataset(
        "claims_*.jsonl: CC BY 4.0; corpus.jsonl: S2ORC abstracts, ODC-By 1.0 (allenai/scifact LICENSE.md)",
        (
            Source(
                "data.tar.gz",
                "https://scifact.s3-us-west-2.amazonaws.com/release/latest/data.tar.gz",
                members=r"(?:.*/)?(claims_(?:train|dev|test)\.jsonl|corpus\.jsonl)",
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
                sha256="adf9a924bae5bf4d554c0f7bf69c8c867037caf13c9839afa93605cb39442823",
            ),
            Source(
                "valid_memory_selection.jsonl",
                f"{_MEMSYCO}/valid_memory_selection.jsonl",
                sha256="7db0f062306a925f7cea9ea9cfb32cb94bbe2bb17999eff3e4a764aeabc4d498",
            ),
            Source(
                "schema.json",
                f"{_MEMSYCO}/schema.json",
                sha256="8c54d9a53c9a44478f49dbcb003b6251e09d894fb63b687671f9796c13c11b6c",
            ),
        ),
    ),
}


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
                self.entries = json.loads(self.path.read_text())["files"]
            except (ValueError, KeyError, TypeError) as e:
                raise FetchError(f"{self.path}: not a memstate lock file ({e}); move it away to start over") from e

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def put(self, key: str, entry: dict) -> None:
        self.entries[key] = entry
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps({"version": 1, "files": self.entries}, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)


# ---- downloads ----------------------------------------------------------------------------------------------------


def download_http(url: str, part: Path, *, timeout: float = 60.0) -> None:
    """Stream ``url`` into ``part``, resuming it (``Range``) when it exists; the bytes received stay on failure."""
    import httpx
    from tqdm import tqdm

    have = part.stat().st_size if part.exists() else 0
    tag = part.with_name(part.name + ".etag")  # the version the .part holds: a changed file restarts (If-Range)
    headers = {"Accept-Encoding": "identity"}  # the bytes as stored: a Range counts them
    if have:
        headers["Range"] = f"bytes={have}-"
        if tag.exists():
            headers["If-Range"] = tag.read_text()
    try:
        with (
            httpx.Client(follow_redirects=True, timeout=httpx.Timeout(timeout)) as client,
            client.stream("GET", url, headers=headers) as reply,
        ):
            if reply.status_code == 416 and have:  # nothing past the end: the .part is complete
                tag.unlink(missing_ok=True)
                return
            if reply.status_code == 200:
                have, mode = 0, "wb"  # no range support, or another version: start over
                tag.unlink(missing_ok=True)
                if reply.headers.get("ETag", "").startswith('"'):  # a strong validator only
                    tag.write_text(reply.headers["ETag"])
            elif reply.status_code == 206 and reply.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
                mode = "ab"
            else:
                raise FetchError(f"{url}: HTTP {reply.status_code} {reply.reason_phrase}")
            length = reply.headers.get("Content-Length")
            total = have + int(length) if length and length.isdigit() else None
            with (
                open(part, mode) as f,
                tqdm(total=total, initial=have, unit="B", unit_scale=True, desc=part.name[:-5], disable=None) as bar,
            ):
                for chunk in reply.iter_raw():  # written as received, so a cut connection keeps them
                    f.write(chunk)
                    bar.update(len(chunk))
    except httpx.TimeoutException as e:
        raise FetchInterrupted(f"{url}: timed out after {timeout:g} s ({type(e).__name__}); {_kept(part)}") from e
    except httpx.TransportError as e:  # refused, unreachable, name not resolved, connection cut mid-file
        raise FetchInterrupted(f"{url}: {type(e).__name__}: {e or 'connection failed'}; {_kept(part)}") from e
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _disk_full(e, part) from e
        raise
    tag.unlink(missing_ok=True)


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


def _extract(archive: Path, pattern: str, into: Path) -> dict[str, Path]:
    """The members matching ``pattern``, written under ``into`` at their first group; {relative path: file}."""
    rx, out = re.compile(pattern), {}

    def target(name: str) -> Path | None:
        m = rx.fullmatch(name)
        if not m or ".." in Path(m.group(1)).parts or m.group(1).startswith("/"):
            return None
        return into / m.group(1)

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                if not info.is_dir() and (dest := target(info.filename)) is not None:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(info) as src, open(dest, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                    out[dest.relative_to(into).as_posix()] = dest
    else:
        with tarfile.open(archive) as t:
            for member in t:
                if member.isfile() and (dest := target(member.name)) is not None:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with t.extractfile(member) as src, open(dest, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                    out[dest.relative_to(into).as_posix()] = dest
    if not out:
        raise FetchError(f"{archive}: no member matches {pattern}; not the release this table expects")
    return out


def fetch_file(name: str, dataset: Dataset, src: Source, out: Path, lock: Lock, size: str) -> str:
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
    else:
        download_http(url, part)
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
        record["members"] = _unpack(part, src.members, target_dir)
        part.unlink()
        line = f"{key}: fetched and unpacked {len(record['members'])} files ({record['size']} bytes, sha256 {got})"
    if src.hub is not None:
        shutil.rmtree(target_dir / ".hub", ignore_errors=True)
    lock.put(key, record)
    return line


def _unpack(archive: Path, pattern: str, target_dir: Path) -> dict[str, str]:
    """Unpack the matching members beside the target, check the ones already there, then rename into place."""
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target_dir))
    try:
        try:
            members = _extract(archive, pattern, tmp)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise _disk_full(e, tmp / "x") from e
            raise
        except (zipfile.BadZipFile, tarfile.TarError) as e:
            raise FetchError(f"{archive}: not a readable archive ({e})") from e
        digests = {rel: sha256_of(path) for rel, path in sorted(members.items())}
        for rel, digest in digests.items():  # all checked before anything moves
            _check_present(target_dir / rel, digest, f"the archive just fetched ({archive.name[:-5]})")
        for rel in digests:
            (target_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(members[rel], target_dir / rel)
        return digests
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch(names: list[str], out: str | Path, size: str = "32k", echo=print) -> Path:
    """Fetch every dataset of ``names`` ("all": every one) into ``out``; returns the lock file."""
    if size not in SIZES:
        raise FetchError(f"--size {size}: one of {', '.join(SIZES)}")
    wanted = list(DATASETS) if "all" in names else list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in DATASETS]
    if unknown:
        raise FetchError(f"unknown dataset(s) {', '.join(unknown)}; known: {', '.join(DATASETS)}, all")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lock = Lock(out)
    for name in wanted:
        dataset = DATASETS[name]
        flag = "NON-COMMERCIAL: " if dataset.non_commercial else ""
        echo(f"{name}: licence: {flag}{dataset.licence}")
        for src in dataset.sources:
            echo(fetch_file(name, dataset, src, out, lock, size))
    return lock.path


# ---- CLI ----------------------------------------------------------------------------------------------------------


def make_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Download datasets as released into OUT/<name>/ (the layout configs/data/default.yaml reads "
        "under data/raw), verify or record their sha256 in OUT/memstate-data.lock.json, resume interrupted "
        "downloads. Reruns skip files that are up to date.",
        epilog=f"environment: {BASE_URL_ENV} replaces the scheme and host of every HTTP source (a mirror); "
        "HF_ENDPOINT the Hugging Face Hub's (PersonaMem). Sources, pins and licences: docs/data_fetch.md.",
    )
    p.add_argument("names", nargs="+", choices=[*DATASETS, "all"], metavar="NAME",
                   help=f"Datasets: {', '.join(DATASETS)}, or all.")  # fmt: skip
    p.add_argument("--out", required=True, help="Folder to write OUT/<name>/… and the lock file into.")
    p.add_argument("--size", default="32k", choices=SIZES, help="PersonaMem's context length variant.")
    return p


def run(args: argparse.Namespace) -> int:
    try:
        lock = fetch(args.names, args.out, args.size)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: a .part file keeps what was received; rerun the same command to resume\n")
        return 130
    print(f"lock: {lock}")
    return 0
