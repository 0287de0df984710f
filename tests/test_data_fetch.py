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
    """Serves ``files`` (URL path → bytes) with Range support; ``drop[path] = n`` sends n bytes of the body then cuts
    the connection (once); ``no_range`` answers 200 to every Range; Hub paths (``/datasets/…``) carry the headers
    huggingface_hub reads (X-Repo-Commit, ETag). ``log``: (method, path, Range header) of every request."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
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
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

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
    assert sorted(p.name for p in (out / "locomo").iterdir()) == ["locomo10.json"]  # no .part, no .part.etag
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
    server.files[path] = b'{"tampered": true}'
    assert main(["data", "fetch", "memsyco", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{server.url}{path}" in err and sha(b'{"tampered": true}') in err
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
