"""`memstate data fetch` against a loopback server: the release files are built from tests/fixtures (a zip of the
FEVER wiki pages, a tar.gz of SciFact, PersonaMem behind an emulated Hub resolve endpoint, LoCoMo, MemSyco-Bench from
third_party) and served with Range support; no real host is contacted."""

from __future__ import annotations

import hashlib
import io
import json
import re
import socket
import tarfile
import threading
import zipfile
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from memstate import fetch as fetch_module
from memstate.cli import main
from memstate.fetch import DATASETS, LOCK_NAME, FetchError, Source, fetch

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
MEMSYCO = ROOT / "third_party" / "data" / "memsyco"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
MEMSYCO_PATH = "/XMUDeepLIT/MemSyco-Bench/c31e2c85ee8cc3c6f643587b8a6f4b5ad5eb3bf6/data"  # the table's pin


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Server:
    """Serves ``files`` (URL path → bytes) with Range support; ``hooks[path](handler)`` answers instead (the hostile
    server of the tests below); ``drop[path] = n`` sends n bytes of the body then cuts the connection (once);
    ``no_range`` answers 200 to every Range; Hub paths (``/datasets/…``) carry the headers huggingface_hub reads
    (X-Repo-Commit, ETag). ``log``: (method, path, Range header) of every request."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.hooks: dict[str, Callable[[BaseHTTPRequestHandler], None]] = {}  # a hostile answer instead
        self.drop: dict[str, int] = {}
        self.no_range = False
        self.log: list[tuple[str, str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _serve(self, body: bool):
                path, rng = urlsplit(self.path).path, self.headers.get("Range")
                server.log.append((self.command, path, rng))
                if path in server.hooks:
                    server.hooks[path](self)
                    return
                data = server.files.get(path)
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start, status = 0, 200
                m = re.fullmatch(r"bytes=(\d+)-", rng or "")
                if_range = self.headers.get("If-Range")
                if m and not server.no_range and if_range in (None, f'"{sha(data)[:32]}"'):
                    start, status = int(m.group(1)), 206
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                self.send_response(status)
                self.send_header("Content-Length", str(len(data) - start))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("ETag", f'"{sha(data)[:32]}"')
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                if path.startswith("/datasets/"):
                    self.send_header("X-Repo-Commit", COMMIT)
                self.end_headers()
                if not body:
                    return
                cut = server.drop.pop(path, None) if self.command == "GET" else None
                if cut is not None:
                    self.wfile.write(data[start : start + cut])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data[start:])

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client that hangs up mid-body (the tests' point) is not a server error on stderr

        self.httpd = Quiet(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def gets(self) -> list[tuple[str, str | None]]:
        return [(p, r) for m, p, r in self.log if m == "GET"]


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def _targz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def release_files() -> dict[str, bytes]:
    """URL path → bytes, in each publisher's layout, from the fixtures (what the table's URLs point at)."""
    fever = FIX / "fever"
    wiki = {f"wiki-pages/{p.name}": p.read_bytes() for p in sorted((fever / "wiki-pages").glob("*.jsonl"))}
    wiki["__MACOSX/wiki-pages/._wiki-001.jsonl"] = b"resource fork"  # not a member to keep
    scifact = {f"data/{p.name}": p.read_bytes() for p in sorted((FIX / "scifact").glob("*.jsonl"))}
    hub = "/datasets/bowen-upenn/PersonaMem/resolve/main"
    return {
        "/download/fever/train.jsonl": (fever / "train.jsonl").read_bytes(),
        "/download/fever/shared_task_dev.jsonl": (fever / "shared_task_dev.jsonl").read_bytes(),
        "/download/fever/paper_dev.jsonl": (fever / "shared_task_dev.jsonl").read_bytes()[:200],
        "/download/fever/wiki-pages.zip": _zip(wiki),
        "/release/latest/data.tar.gz": _targz(scifact),
        f"{hub}/questions_32k.csv": (FIX / "personamem" / "questions_32k.csv").read_bytes(),
        f"{hub}/shared_contexts_32k.jsonl": (FIX / "personamem" / "shared_contexts_32k.jsonl").read_bytes(),
        "/snap-research/locomo/main/data/locomo10.json": (FIX / "locomo" / "locomo_sample.json").read_bytes(),
        **{
            f"{MEMSYCO_PATH}/{name}": (MEMSYCO / name).read_bytes()
            for name in ("memory_evidence_conflict.jsonl", "valid_memory_selection.jsonl", "schema.json")
        },
    }


@pytest.fixture
def server(monkeypatch):
    s = Server()
    s.files.update(release_files())
    monkeypatch.setenv("MEMSTATE_FETCH_BASE_URL", s.url)
    monkeypatch.setenv("HF_ENDPOINT", s.url)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- success, idempotence, the build on what was fetched ---------------------------------------------------------


def test_fetch_all_writes_the_layout_and_a_rerun_is_up_to_date(server, tmp_path, capsys):
    out = tmp_path / "raw"
    assert main(["data", "fetch", "all", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for src, dst in [
        (FIX / "fever" / "train.jsonl", out / "fever" / "train.jsonl"),
        (FIX / "fever" / "wiki-pages" / "wiki-001.jsonl", out / "fever" / "wiki-pages" / "wiki-001.jsonl"),
        (FIX / "fever" / "wiki-pages" / "wiki-002.jsonl", out / "fever" / "wiki-pages" / "wiki-002.jsonl"),
        (FIX / "scifact" / "corpus.jsonl", out / "scifact" / "corpus.jsonl"),
        (FIX / "scifact" / "claims_test.jsonl", out / "scifact" / "claims_test.jsonl"),
        (FIX / "personamem" / "questions_32k.csv", out / "personamem" / "questions_32k.csv"),
        (FIX / "personamem" / "shared_contexts_32k.jsonl", out / "personamem" / "shared_contexts_32k.jsonl"),
        (FIX / "locomo" / "locomo_sample.json", out / "locomo" / "locomo10.json"),
        (MEMSYCO / "schema.json", out / "memsyco" / "schema.json"),
    ]:
        assert dst.read_bytes() == src.read_bytes(), dst
    # Archives are unpacked and gone; only the kept members; nothing temporary is left.
    assert sorted(p.name for p in (out / "fever").iterdir()) == [
        "paper_dev.jsonl", "shared_task_dev.jsonl", "train.jsonl", "wiki-pages"]  # fmt: skip
    assert sorted(p.name for p in (out / "fever" / "wiki-pages").iterdir()) == ["wiki-001.jsonl", "wiki-002.jsonl"]
    leftovers = [p for p in out.rglob("*") if p.name.endswith(".part") or p.name.startswith((".unpack-", ".hub"))]
    assert leftovers == []
    lock = json.loads((out / LOCK_NAME).read_text())["files"]
    assert set(lock) == {
        "fever/train.jsonl", "fever/shared_task_dev.jsonl", "fever/paper_dev.jsonl", "fever/wiki-pages.zip",
        "scifact/data.tar.gz", "personamem/questions_32k.csv", "personamem/shared_contexts_32k.jsonl",
        "locomo/locomo10.json", "memsyco/memory_evidence_conflict.jsonl", "memsyco/valid_memory_selection.jsonl",
        "memsyco/schema.json"}  # fmt: skip
    corpus = (out / "scifact" / "corpus.jsonl").read_bytes()
    assert lock["scifact/data.tar.gz"]["members"]["corpus.jsonl"] == sha(corpus)
    assert lock["locomo/locomo10.json"]["sha256"] == sha((FIX / "locomo" / "locomo_sample.json").read_bytes())
    assert lock["locomo/locomo10.json"]["source"] == f"{server.url}/snap-research/locomo/main/data/locomo10.json"
    assert lock["personamem/questions_32k.csv"]["commit"] == COMMIT
    assert "CC BY-NC 4.0" in lock["locomo/locomo10.json"]["licence"]
    assert "locomo: licence: NON-COMMERCIAL: CC BY-NC 4.0" in printed
    assert "fever: licence: NON-COMMERCIAL" not in printed

    # A rerun downloads nothing and says so per file.
    server.log.clear()
    assert main(["data", "fetch", "all", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert server.gets() == []
    assert printed.count("up to date") == len(lock)

    # A file changed after the fetch is an error naming it and both hashes; the file is left as it is.
    (out / "scifact" / "corpus.jsonl").write_bytes(corpus + b"\n")
    assert main(["data", "fetch", "scifact", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(out / "scifact" / "corpus.jsonl") in err and sha(corpus) in err and sha(corpus + b"\n") in err


def test_build_data_reads_what_fetch_wrote(server, tmp_path):
    out = tmp_path / "raw"
    fetch(["fever", "scifact", "personamem"], out, echo=lambda line: None)
    config = yaml.safe_load((ROOT / "configs" / "data" / "tiny.yaml").read_text())
    for name in ("fever", "scifact", "personamem"):
        config[name]["dir"] = str(out / name)
    (tmp_path / "fetched.yaml").write_text(yaml.safe_dump(config))
    built = tmp_path / "built"
    assert main(["build-data", "--config", str(tmp_path / "fetched.yaml"), "--out", str(built)]) == 0
    manifest = json.loads((built / "manifest.json").read_text())
    assert set(manifest["counts"]["source"]) == {"fever", "scifact", "personamem"}
    assert all(n > 0 for n in manifest["counts"]["split"].values())


# ---- resume, checksums, unreachable hosts ------------------------------------------------------------------------


def test_a_download_cut_mid_file_resumes_with_range(server, tmp_path, capsys):
    path = "/snap-research/locomo/main/data/locomo10.json"
    data = server.files[path]
    server.drop[path] = 1000
    out = tmp_path / "raw"
    assert main(["data", "fetch", "locomo", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{server.url}{path}" in err and "keeps 1000 bytes" in err
    part = out / "locomo" / "locomo10.json.part"
    assert part.read_bytes() == data[:1000]
    assert not (out / "locomo" / "locomo10.json").exists()

    server.log.clear()
    assert main(["data", "fetch", "locomo", "--out", str(out)]) == 0
    assert server.gets() == [(path, "bytes=1000-")]
    assert (out / "locomo" / "locomo10.json").read_bytes() == data
    assert sorted(p.name for p in (out / "locomo").iterdir()) == ["locomo10.json"]  # no .part, no .part.meta
    assert json.loads((out / LOCK_NAME).read_text())["files"]["locomo/locomo10.json"]["sha256"] == sha(data)


def test_a_server_without_range_support_restarts_the_file(server, tmp_path):
    path = "/snap-research/locomo/main/data/locomo10.json"
    data = server.files[path]
    part = tmp_path / "locomo" / "locomo10.json.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"stale bytes of another version")
    server.no_range = True
    fetch(["locomo"], tmp_path, echo=lambda line: None)
    assert server.gets() == [(path, "bytes=30-")]
    assert (tmp_path / "locomo" / "locomo10.json").read_bytes() == data


def test_a_file_changed_upstream_between_two_runs_is_fetched_whole(server, tmp_path):
    """The .part's ETag goes with the Range (If-Range): another version comes back whole (200), not appended."""
    path = "/snap-research/locomo/main/data/locomo10.json"
    old = server.files[path]
    new = b" " + old  # differs before byte 1000: appending new[1000:] to the old .part would not give it
    server.drop[path] = 1000
    with pytest.raises(FetchError, match="keeps 1000 bytes"):
        fetch(["locomo"], tmp_path, echo=lambda line: None)
    assert (tmp_path / "locomo" / "locomo10.json.part").read_bytes() == old[:1000]
    server.files[path] = new
    fetch(["locomo"], tmp_path, echo=lambda line: None)
    assert (tmp_path / "locomo" / "locomo10.json").read_bytes() == new != old
    assert sorted(p.name for p in (tmp_path / "locomo").iterdir()) == ["locomo10.json"]


def test_a_complete_part_is_not_downloaded_again(server, tmp_path):
    """A run stopped after the last byte but before the rename: the server answers 416 to the range past the end."""
    path = "/snap-research/locomo/main/data/locomo10.json"
    part = tmp_path / "locomo" / "locomo10.json.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(server.files[path])
    fetch(["locomo"], tmp_path, echo=lambda line: None)
    assert (tmp_path / "locomo" / "locomo10.json").read_bytes() == server.files[path] and not part.exists()


def test_a_checksum_mismatch_deletes_the_download(server, tmp_path, capsys):
    path = f"{MEMSYCO_PATH}/schema.json"
    tampered = b'{"tampered": true}'.ljust(len(server.files[path]))  # the table's size: the sha256 must catch it
    server.files[path] = tampered
    assert main(["data", "fetch", "memsyco", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{server.url}{path}" in err and sha(tampered) in err
    assert "8c54d9a53c9a44478f49dbcb003b6251e09d894fb63b687671f9796c13c11b6c" in err
    assert not (tmp_path / "memsyco" / "schema.json").exists()
    assert not (tmp_path / "memsyco" / "schema.json.part").exists()
    lock = json.loads((tmp_path / LOCK_NAME).read_text())["files"]
    assert "memsyco/schema.json" not in lock and "memsyco/valid_memory_selection.jsonl" in lock  # earlier files kept


def test_an_archive_with_a_wrong_checksum_unpacks_nothing(server, tmp_path, monkeypatch):
    tarball = next(s for s in DATASETS["scifact"].sources if s.file == "data.tar.gz")
    monkeypatch.setitem(
        DATASETS, "scifact", DATASETS["scifact"].__class__(
            DATASETS["scifact"].licence, (Source(tarball.file, tarball.url, sha256="0" * 64, members=tarball.members),)
        ),
    )  # fmt: skip
    with pytest.raises(FetchError, match="sha256 .* but the table says 0{64}"):
        fetch(["scifact"], tmp_path, echo=lambda line: None)
    assert list((tmp_path / "scifact").iterdir()) == []


def test_the_table_sha256_is_checked_against_the_served_fixture(server, tmp_path, monkeypatch):
    """With the table's sha256 set to the fixture's, the same download passes (the check is not vacuous)."""
    path = "/snap-research/locomo/main/data/locomo10.json"
    src = DATASETS["locomo"].sources[0]
    good = Source(src.file, src.url, sha256=sha(server.files[path]))
    monkeypatch.setitem(DATASETS, "locomo", DATASETS["locomo"].__class__(DATASETS["locomo"].licence, (good,), True))
    fetch(["locomo"], tmp_path, echo=lambda line: None)
    assert (tmp_path / "locomo" / "locomo10.json").read_bytes() == server.files[path]


@pytest.mark.parametrize("name", ["locomo", "personamem"])
def test_an_unreachable_host_is_one_line_naming_the_url(name, tmp_path, monkeypatch, capsys):
    dead = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("MEMSTATE_FETCH_BASE_URL", dead)
    monkeypatch.setenv("HF_ENDPOINT", dead)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    if name == "personamem":  # huggingface_hub retries a refused connection with backoff (~23 s): not slept here
        import huggingface_hub.utils._http as hf_http

        monkeypatch.setattr(hf_http.time, "sleep", lambda seconds: None)
    assert main(["data", "fetch", name, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    print(err)
    assert len(err.splitlines()) == 1, err
    assert err.startswith("memstate data fetch: error: ") and dead in err
    for src in DATASETS[name].sources:  # nothing in the final place
        assert not (tmp_path / name / src.file.format(size="32k")).exists()
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_full_disk_is_one_line(server, tmp_path, monkeypatch, capsys):
    real_open = open

    def full_open(file, mode="r", *args, **kwargs):
        if str(file).endswith(".part") and "b" in mode and ("a" in mode or "w" in mode):
            raise OSError(28, "No space left on device")
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(fetch_module, "open", full_open, raising=False)
    assert main(["data", "fetch", "locomo", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "disk full writing" in err and "locomo10.json.part" in err


# ---- a hostile server: every attack is one line, nothing it sent is trusted, an honest rerun succeeds -------------

LOCOMO = "/snap-research/locomo/main/data/locomo10.json"
WIKI_ZIP = "/download/fever/wiki-pages.zip"
SCIFACT_TGZ = "/release/latest/data.tar.gz"


def answer(h: BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes = b"") -> None:
    h.send_response(status)
    for name, value in headers.items():
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(body)


def one_line_error(capsys, *argv: str) -> str:
    """Run ``memstate data fetch ARGV``: it must exit 2 with one line on stderr and no traceback; the line."""
    assert main(["data", "fetch", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("memstate data fetch: error: "), err
    return err


def lock_files(out: Path) -> dict:
    return json.loads((out / LOCK_NAME).read_text())["files"] if (out / LOCK_NAME).exists() else {}


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.rglob("*") if p.name.endswith((".part", ".meta")) or ".unpack-" in p.name)


def honest_rerun(server: Server, out: Path, name: str, key: str, capsys) -> dict:
    """The hooks gone, the same command succeeds; the lock entry of ``key``."""
    server.hooks.clear()
    assert main(["data", "fetch", name, "--out", str(out)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    return lock_files(out)[key]


def _cut_locomo(server: Server, out: Path, capsys) -> bytes:
    """The first run is cut after 1000 bytes: the .part keeps them."""
    server.drop[LOCOMO] = 1000
    one_line_error(capsys, "locomo", "--out", str(out))
    assert (out / "locomo" / "locomo10.json.part").stat().st_size == 1000
    return server.files[LOCOMO]


def test_a_416_whose_size_is_not_the_parts_restarts_from_zero(server, tmp_path, capsys):
    """Issue 56: cut at 1000 bytes, then `416 bytes */N` (N the real size): the .part is not complete. It used to be
    renamed into place and trusted; now the file is fetched again from byte 0 and only the whole file is recorded."""
    data = _cut_locomo(server, tmp_path, capsys)

    def refuse_ranges(h):
        if h.headers.get("Range"):
            answer(h, 416, {"Content-Range": f"bytes */{len(data)}", "Content-Length": "0"})
        else:
            answer(h, 200, {"Content-Length": str(len(data))}, data)

    server.hooks[LOCOMO] = refuse_ranges
    server.log.clear()
    assert main(["data", "fetch", "locomo", "--out", str(tmp_path)]) == 0
    assert server.gets() == [(LOCOMO, "bytes=1000-"), (LOCOMO, None)]
    assert (tmp_path / "locomo" / "locomo10.json").read_bytes() == data
    assert lock_files(tmp_path)["locomo/locomo10.json"]["sha256"] == sha(data)
    assert leftovers(tmp_path) == []


def test_a_416_without_a_size_is_one_line_saying_delete_the_part(server, tmp_path, capsys):
    data = _cut_locomo(server, tmp_path, capsys)
    server.hooks[LOCOMO] = lambda h: answer(h, 416, {"Content-Length": "0"})
    err = one_line_error(capsys, "locomo", "--out", str(tmp_path))
    part = tmp_path / "locomo" / "locomo10.json.part"
    assert "HTTP 416" in err and f"delete {part} to restart" in err
    assert part.read_bytes() == data[:1000]  # kept for the operator to decide; never renamed into place
    assert not (tmp_path / "locomo" / "locomo10.json").exists() and lock_files(tmp_path) == {}
    server.log.clear()
    assert honest_rerun(server, tmp_path, "locomo", "locomo/locomo10.json", capsys)["sha256"] == sha(data)
    assert server.gets() == [(LOCOMO, "bytes=1000-")]


def test_a_body_that_ends_before_its_content_range_says_is_resumable(server, tmp_path, capsys):
    """A 206 with `Content-Range: bytes 1000-…/N` whose (chunked) body ends cleanly early: not complete."""
    data = _cut_locomo(server, tmp_path, capsys)

    def short(h):
        h.send_response(206)
        assert len(data) > 2000
        h.send_header("Content-Range", f"bytes 1000-{len(data) - 1}/{len(data)}")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        h.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (1000, data[1000:2000]))

    server.hooks[LOCOMO] = short
    err = one_line_error(capsys, "locomo", "--out", str(tmp_path))
    assert f"ended after 2000 of {len(data)} bytes" in err and "rerun the same command to resume" in err
    assert (tmp_path / "locomo" / "locomo10.json.part").read_bytes() == data[:2000]
    assert lock_files(tmp_path) == {}
    server.log.clear()
    assert honest_rerun(server, tmp_path, "locomo", "locomo/locomo10.json", capsys)["sha256"] == sha(data)
    assert server.gets() == [(LOCOMO, "bytes=2000-")]


def test_a_resume_announcing_another_size_restarts_instead_of_splicing(server, tmp_path, capsys):
    """The first reply said N bytes; a 206 with the right start but total N+7 (and the same ETag) is the tail of
    another file: appending it would place a splice of two files. The .part is dropped and the file fetched whole."""
    data = _cut_locomo(server, tmp_path, capsys)
    other = b"Y" * 1000 + data[1000:] + b"XXXXXXX"

    def other_tail(h):
        if h.headers.get("Range"):
            rng = f"bytes 1000-{len(other) - 1}/{len(other)}"
            answer(h, 206, {"Content-Range": rng, "Content-Length": str(len(other) - 1000)}, other[1000:])
        else:
            answer(h, 200, {"Content-Length": str(len(other))}, other)

    server.hooks[LOCOMO] = other_tail
    server.log.clear()
    assert main(["data", "fetch", "locomo", "--out", str(tmp_path)]) == 0, capsys.readouterr().err
    assert server.gets() == [(LOCOMO, "bytes=1000-"), (LOCOMO, None)]
    assert (tmp_path / "locomo" / "locomo10.json").read_bytes() == other  # one whole file, not data[:1000] + tail
    assert lock_files(tmp_path)["locomo/locomo10.json"]["sha256"] == sha(other)
    assert leftovers(tmp_path) == []


def test_an_out_that_is_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "out").write_text("mine")
    err = one_line_error(capsys, "locomo", "--out", str(tmp_path / "out"))
    assert "exists and is not a directory" in err and (tmp_path / "out").read_text() == "mine"


def _deflated_zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


@pytest.mark.parametrize(
    "members, flag, said",
    [
        ({"wiki-pages/wiki-001.jsonl": bytes(3 << 20)}, "--max-member-size", "member wiki-pages/wiki-001.jsonl"),
        ({f"wiki-pages/wiki-00{i}.jsonl": bytes(700 << 10) for i in range(1, 4)}, "--max-unpacked-size", "members"),
    ],
    ids=["one-member", "all-members"],
)
def test_a_zip_bomb_stops_at_the_cap_and_nothing_is_unpacked(server, tmp_path, capsys, members, flag, said):
    bomb = _deflated_zip(members)
    assert len(bomb) < 20_000  # a few KB that would expand to MBs (the issue's: 1 MB to 1 GB)
    honest = server.files[WIKI_ZIP]
    server.files[WIKI_ZIP] = bomb
    err = one_line_error(capsys, "fever", "--out", str(tmp_path), flag, "1M")
    assert f"{said} unpack" in err and "more than 1048576 bytes" in err and flag in err and "deleted" in err
    assert not (tmp_path / "fever" / "wiki-pages").exists() and leftovers(tmp_path) == []
    assert "fever/wiki-pages.zip" not in lock_files(tmp_path)
    server.files[WIKI_ZIP] = honest
    assert honest_rerun(server, tmp_path, "fever", "fever/wiki-pages.zip", capsys)["sha256"] == sha(honest)
    assert sorted(p.name for p in (tmp_path / "fever" / "wiki-pages").iterdir()) == ["wiki-001.jsonl", "wiki-002.jsonl"]


def test_a_zip_bomb_under_the_caps_is_refused_by_its_expansion(server, tmp_path, capsys):
    """The default caps (GiBs) would let 8 MiB out of 8 KB; no text compresses 1000x, so the ratio stops it first."""
    bomb = _deflated_zip({"wiki-pages/wiki-001.jsonl": bytes(8 << 20)})
    assert len(bomb) < 20_000
    server.files[WIKI_ZIP] = bomb
    err = one_line_error(capsys, "fever", "--out", str(tmp_path))
    assert "100x its size" in err and "deleted" in err
    assert not (tmp_path / "fever" / "wiki-pages").exists() and leftovers(tmp_path) == []
    assert "fever/wiki-pages.zip" not in lock_files(tmp_path)


def _endless(h):
    """Headers without a length, then bytes until the client hangs up."""
    h.close_connection = True
    h.send_response(200)
    h.end_headers()
    try:
        while True:
            h.wfile.write(b"x" * 65536)
    except OSError:
        pass


@pytest.mark.parametrize(
    "name, path, env, said",
    [
        ("locomo", LOCOMO, {"MEMSTATE_FETCH_MAX_FILE_SIZE": "1M"}, "more than 1048576 bytes (--max-file-size"),
        ("memsyco", f"{MEMSYCO_PATH}/schema.json", {}, "more than 2773 bytes (the size the table gives)"),
    ],
    ids=["default-cap", "pinned-size"],
)
def test_an_endless_body_stops_at_the_cap_and_is_deleted(server, tmp_path, capsys, monkeypatch, name, path, env, said):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    server.hooks[path] = _endless
    err = one_line_error(capsys, name, "--out", str(tmp_path))
    assert said in err and "the download was deleted" in err
    assert leftovers(tmp_path) == []
    assert not (tmp_path / name / Path(path).name).exists()
    assert f"{name}/{Path(path).name}" not in lock_files(tmp_path)
    assert honest_rerun(server, tmp_path, name, f"{name}/{Path(path).name}", capsys)["sha256"] == sha(
        server.files[path]
    )


def test_an_announced_length_over_the_cap_is_refused_before_writing(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEMSTATE_FETCH_MAX_FILE_SIZE", "1K")
    err = one_line_error(capsys, "locomo", "--out", str(tmp_path))
    assert f"announces {len(server.files[LOCOMO])} bytes, more than 1024" in err and leftovers(tmp_path) == []
    monkeypatch.delenv("MEMSTATE_FETCH_MAX_FILE_SIZE")
    honest_rerun(server, tmp_path, "locomo", "locomo/locomo10.json", capsys)


def test_a_dripping_server_is_stopped_by_the_deadline_and_the_rerun_resumes(server, tmp_path, capsys):
    """A byte every 0.3 s: each read is quick, so only a wall-clock deadline (here 1.5 s) ends it."""
    data = server.files[LOCOMO]

    def drip(h):
        h.send_response(200)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        try:
            for byte in data:
                h.wfile.write(bytes([byte]))
                h.wfile.flush()
                threading.Event().wait(0.3)
        except OSError:
            pass

    server.hooks[LOCOMO] = drip
    err = one_line_error(capsys, "locomo", "--out", str(tmp_path), "--deadline", "1.5")
    assert "not done within the 1.5 s deadline" in err and "rerun the same command to resume" in err
    kept = (tmp_path / "locomo" / "locomo10.json.part").read_bytes()
    assert 0 < len(kept) < len(data) and data.startswith(kept)
    assert not (tmp_path / "locomo" / "locomo10.json").exists() and lock_files(tmp_path) == {}
    server.log.clear()
    assert honest_rerun(server, tmp_path, "locomo", "locomo/locomo10.json", capsys)["sha256"] == sha(data)
    assert server.gets() == [(LOCOMO, f"bytes={len(kept)}-")]


@pytest.mark.parametrize("target", ["http://localhost:{port}{path}", "https://elsewhere.example{path}"])
def test_a_redirect_to_another_host_is_refused(server, tmp_path, capsys, target):
    port = urlsplit(server.url).port
    server.hooks[LOCOMO] = lambda h: answer(h, 302, {"Location": target.format(port=port, path=LOCOMO),
                                                    "Content-Length": "0"})  # fmt: skip
    err = one_line_error(capsys, "locomo", "--out", str(tmp_path))
    assert f"redirected to {target.format(port=port, path=LOCOMO)}" in err and "nothing was written" in err
    assert server.gets() == [(LOCOMO, None)]  # the other host was not asked
    assert leftovers(tmp_path) == [] and lock_files(tmp_path) == {}
    honest_rerun(server, tmp_path, "locomo", "locomo/locomo10.json", capsys)


def test_a_redirect_inside_the_allow_list_is_followed_and_the_final_url_recorded(server, tmp_path, capsys):
    server.files["/mirror/locomo10.json"] = server.files[LOCOMO]
    server.hooks[LOCOMO] = lambda h: answer(h, 301, {"Location": "/mirror/locomo10.json", "Content-Length": "0"})
    assert main(["data", "fetch", "locomo", "--out", str(tmp_path)]) == 0
    entry = lock_files(tmp_path)["locomo/locomo10.json"]
    assert entry["source"] == f"{server.url}/mirror/locomo10.json"
    assert entry["sha256"] == sha(server.files[LOCOMO])


def test_the_allow_list_is_the_urls_origin_and_the_sources_https_hosts(monkeypatch):
    monkeypatch.delenv("MEMSTATE_FETCH_BASE_URL", raising=False)
    src = Source("f", "https://a.example/f", hosts=("CDN.example",))
    assert fetch_module.allowed_origins(src, src.url) == {("https", "a.example", 443), ("https", "cdn.example", 443)}
    monkeypatch.setenv("MEMSTATE_FETCH_BASE_URL", "http://127.0.0.1:8080")  # a mirror stands for every host
    url = fetch_module.source_url(src)
    assert fetch_module.allowed_origins(src, url) == {("http", "127.0.0.1", 8080)}


def test_a_redirect_loop_is_one_line(server, tmp_path, capsys):
    server.hooks[LOCOMO] = lambda h: answer(h, 302, {"Location": LOCOMO, "Content-Length": "0"})
    err = one_line_error(capsys, "locomo", "--out", str(tmp_path))
    assert "more than 5 redirects" in err and len(server.gets()) == 6
    assert leftovers(tmp_path) == [] and lock_files(tmp_path) == {}
    honest_rerun(server, tmp_path, "locomo", "locomo/locomo10.json", capsys)


@pytest.mark.parametrize("encoding", ["deflate", "gzip"])
def test_an_encoded_body_is_refused_not_stored(server, tmp_path, capsys, encoding):
    import gzip
    import zlib

    data = server.files[LOCOMO]
    body = zlib.compress(data) if encoding == "deflate" else gzip.compress(data)
    server.hooks[LOCOMO] = lambda h: answer(h, 200, {"Content-Encoding": encoding,
                                                    "Content-Length": str(len(body))}, body)  # fmt: skip
    err = one_line_error(capsys, "locomo", "--out", str(tmp_path))
    assert f"Content-Encoding {encoding}" in err and "refused" in err
    assert leftovers(tmp_path) == [] and lock_files(tmp_path) == {}
    assert not (tmp_path / "locomo" / "locomo10.json").exists()
    assert honest_rerun(server, tmp_path, "locomo", "locomo/locomo10.json", capsys)["sha256"] == sha(data)


def test_an_archive_missing_expected_members_is_refused(server, tmp_path, capsys):
    honest = server.files[SCIFACT_TGZ]
    half = {f"data/{n}": (FIX / "scifact" / n).read_bytes() for n in ("claims_train.jsonl", "corpus.jsonl")}
    server.files[SCIFACT_TGZ] = _targz(half)
    err = one_line_error(capsys, "scifact", "--out", str(tmp_path))
    assert "holds no claims_dev.jsonl, claims_test.jsonl" in err and "deleted, nothing unpacked" in err
    assert list((tmp_path / "scifact").iterdir()) == [] and lock_files(tmp_path) == {}
    server.files[SCIFACT_TGZ] = honest
    assert len(honest_rerun(server, tmp_path, "scifact", "scifact/data.tar.gz", capsys)["members"]) == 4


def _corrupt_zip() -> bytes:
    """The wiki zip, deflated, with garbage in the middle of the first member's compressed bytes."""
    pages = {f"wiki-pages/{p.name}": p.read_bytes() * 20 for p in sorted((FIX / "fever" / "wiki-pages").glob("*"))}
    data = bytearray(_deflated_zip(pages))
    data[100:140] = b"\xff" * 40
    return bytes(data)


@pytest.mark.parametrize(
    "path, name, key, bad",
    [
        (SCIFACT_TGZ, "scifact", "scifact/data.tar.gz", lambda honest: honest[: len(honest) // 2]),  # EOFError
        (WIKI_ZIP, "fever", "fever/wiki-pages.zip", lambda honest: _corrupt_zip()),  # zlib.error
    ],
    ids=["truncated-tar-gz", "corrupt-zip"],
)
def test_an_unreadable_archive_is_one_line_deleted_and_never_trusted(server, tmp_path, capsys, path, name, key, bad):
    honest = server.files[path]
    server.files[path] = bad(honest)
    err = one_line_error(capsys, name, "--out", str(tmp_path))
    archive = tmp_path / name / f"{Path(path).name}.part"
    assert f"{archive}: not a readable archive" in err and "it was deleted, rerun to fetch it again" in err
    assert not archive.exists() and leftovers(tmp_path) == [] and key not in lock_files(tmp_path)
    server.files[path] = honest
    assert honest_rerun(server, tmp_path, name, key, capsys)["sha256"] == sha(honest)


def test_a_rerun_after_a_kill_removes_what_the_killed_run_left(server, tmp_path, capsys):
    """A kill during unpacking leaves a `.unpack-*` folder; a .part of a file the table no longer names is an
    orphan. Both go at the start of the dataset's fetch; a .part the table still names (another --size) stays."""
    stale = tmp_path / "scifact" / ".unpack-k1ll3d"
    stale.mkdir(parents=True)
    (stale / "corpus.jsonl").write_bytes(b'{"doc_id": 1, "abs')  # half a member
    persona = tmp_path / "personamem"
    persona.mkdir()
    (persona / "questions_128k.csv.part").write_bytes(b"resumable")
    (persona / "questions_old.csv.part").write_bytes(b"orphan")
    (persona / "questions_old.csv.part.meta").write_text('"x"')
    assert main(["data", "fetch", "scifact", "personamem", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "scifact: removed .unpack-k1ll3d" in printed and "personamem: removed questions_old.csv.part" in printed
    assert not stale.exists()
    assert sorted(p.name for p in (tmp_path / "scifact").iterdir()) == [
        "claims_dev.jsonl", "claims_test.jsonl", "claims_train.jsonl", "corpus.jsonl"]  # fmt: skip
    assert (tmp_path / "scifact" / "corpus.jsonl").read_bytes() == (FIX / "scifact" / "corpus.jsonl").read_bytes()
    assert sorted(p.name for p in persona.iterdir()) == [
        "questions_128k.csv.part", "questions_32k.csv", "shared_contexts_32k.jsonl"]  # fmt: skip
    assert (persona / "questions_128k.csv.part").read_bytes() == b"resumable"


@pytest.mark.parametrize(
    "text",
    [
        "[]",
        '"files"',
        '{"files": []}',
        '{"files": {"locomo/locomo10.json": 1}}',
        '{"files": {"locomo/locomo10.json": {"sha256": 5}}}',
        '{"files": {"scifact/data.tar.gz": {"members": ["corpus.jsonl"]}}}',
        "{not json",
    ],
)
def test_a_malformed_lock_file_is_one_line(server, tmp_path, capsys, text):
    (tmp_path / LOCK_NAME).write_text(text)
    err = one_line_error(capsys, "locomo", "scifact", "--out", str(tmp_path))
    assert f"{tmp_path / LOCK_NAME}: not a memstate lock file" in err and "move it away" in err
    assert (tmp_path / LOCK_NAME).read_text() == text and not (tmp_path / "locomo").exists()
    (tmp_path / LOCK_NAME).unlink()
    assert main(["data", "fetch", "locomo", "--out", str(tmp_path)]) == 0


@pytest.mark.parametrize("argv", [["--max-file-size", "lots"], ["--deadline", "-3"], ["--max-member-size", "0"]])
def test_a_bad_bound_is_one_line(tmp_path, capsys, argv):
    err = one_line_error(capsys, "locomo", "--out", str(tmp_path), *argv)
    assert f"{argv[0]} {argv[1]!r}" in err


def test_a_bound_comes_from_its_flag_else_its_variable_else_the_default(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("MEMSTATE_FETCH_MAX_MEMBER_SIZE", "1M")
    monkeypatch.delenv("MEMSTATE_FETCH_DEADLINE", raising=False)
    limits = fetch_module.resolve_limits(max_member=None, deadline="90")
    assert (limits.max_member, limits.deadline, limits.max_file) == (1 << 20, 90.0, fetch_module.Limits().max_file)
    assert fetch_module.resolve_limits(max_member="2M").max_member == 2 << 20
    monkeypatch.setenv("MEMSTATE_FETCH_DEADLINE", "soon")
    err = one_line_error(capsys, "locomo", "--out", str(tmp_path))
    assert "MEMSTATE_FETCH_DEADLINE 'soon'" in err


KILLED_CHILD = """
import os, sys, time
from pathlib import Path
from memstate import fetch

real_replace = os.replace

def replace(src, dst):  # the first member renamed into place, then the process waits to be killed
    real_replace(src, dst)
    if ".unpack-" in str(src):
        Path(sys.argv[2]).write_text("unpacking")
        time.sleep(600)

os.replace = replace
fetch.fetch(["scifact"], sys.argv[1], echo=lambda line: None)
"""


def test_a_process_killed_while_unpacking_is_finished_by_the_rerun(server, tmp_path, capsys):
    """A real SIGKILL between two members' renames: the .unpack-* folder, one member and the archive's .part are
    left. The rerun removes the folder, finds the .part complete (416 with its size), checks the member already in
    place and finishes; the lock knows the archive only then."""
    import subprocess
    import sys
    import time

    out, marker = tmp_path / "raw", tmp_path / "marker"
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(out), str(marker)])
    try:
        for _ in range(600):  # up to a minute for the child to reach the rename (an import takes ~1 s)
            if marker.exists() or child.poll() is not None:
                break
            time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    assert marker.exists(), "the child did not reach the unpack"
    left = sorted(p.name for p in (out / "scifact").iterdir())
    assert len([n for n in left if n.startswith(".unpack-")]) == 1 and "data.tar.gz.part" in left
    assert len([n for n in left if n.endswith(".jsonl")]) == 1 and lock_files(out) == {}

    server.log.clear()
    assert main(["data", "fetch", "scifact", "--out", str(out)]) == 0
    assert "scifact: removed .unpack-" in capsys.readouterr().out
    assert server.gets() == [(SCIFACT_TGZ, f"bytes={len(server.files[SCIFACT_TGZ])}-")]  # answered 416: complete
    assert sorted(p.name for p in (out / "scifact").iterdir()) == [
        "claims_dev.jsonl", "claims_test.jsonl", "claims_train.jsonl", "corpus.jsonl"]  # fmt: skip
    for name in ("claims_dev.jsonl", "corpus.jsonl"):
        assert (out / "scifact" / name).read_bytes() == (FIX / "scifact" / name).read_bytes()
    assert lock_files(out)["scifact/data.tar.gz"]["sha256"] == sha(server.files[SCIFACT_TGZ])
