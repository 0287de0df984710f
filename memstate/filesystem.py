"""Which filesystem a path lives on, read from the mount table (``/proc/self/mounts``).

SQLite's WAL mode keeps its index in a memory-mapped ``-shm`` file next to the database and relies on POSIX locks: all
processes must be on one host and the filesystem must be local. On a network or cluster filesystem (NFS, Lustre,
GPFS, CIFS, ...) several hosts see the same file without sharing that memory, and SQLite fails or corrupts. The reward's
baseline cache asks here before it opens a file read-write.

The mount table is injectable (``mount_table``: a function returning its text, or ``None`` where there is none, as on
macOS), so tests can put a path under an ``nfs4`` mount.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import NamedTuple

# Filesystems whose files several hosts see: network, parallel and shared-disk cluster filesystems, and host-shared
# folders of virtual machines (9p, virtiofs: the host's processes are another host to SQLite).
NETWORK_FSTYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ncpfs", "beegfs", "ceph", "glusterfs", "9p", "virtiofs",
    "afs", "coda", "ocfs2", "gfs2", "panfs", "wekafs", "pvfs2", "orangefs", "cvfs", "dvs", "quobyte", "lizardfs",
})  # fmt: skip
# FUSE filesystems (fstype ``fuse.<name>``) that are network filesystems; a local FUSE one (fuse.squashfuse, an
# encrypted home...) is not listed.
NETWORK_FUSE = frozenset({
    "sshfs", "glusterfs", "ceph", "ceph-fuse", "cephfs", "s3fs", "gcsfuse", "rclone", "juicefs", "goofys",
    "mountpoint-s3", "beegfs", "lustre", "mfs", "moosefs", "lizardfs", "seaweedfs", "quobyte", "weka", "alluxio-fuse",
    "cvmfs2", "davfs", "blobfuse", "blobfuse2", "xrootdfs", "geesefs", "smbnetfs", "curlftpfs", "gvfsd-fuse",
})  # fmt: skip


class Mount(NamedTuple):
    device: str
    point: str
    fstype: str


def read_mount_table(path: str = "/proc/self/mounts") -> str | None:
    """The text of this process's mount table, or ``None`` where there is none (not Linux, no /proc)."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _unescape(field: str) -> str:
    r"""The kernel writes space, tab, newline and backslash in mount fields as octal escapes.

    >>> _unescape(r"/mnt/my\040data")
    '/mnt/my data'
    """
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[Mount]:
    """``/proc/self/mounts`` lines (device, mount point, fstype, options, 0, 0) in order.

    >>> parse_mounts("server:/export /mnt/shared nfs4 rw,relatime 0 0\\n")
    [Mount(device='server:/export', point='/mnt/shared', fstype='nfs4')]
    """
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            mounts.append(Mount(_unescape(fields[0]), _unescape(fields[1]), fields[2]))
    return mounts


def mount_of(path: str | os.PathLike, mounts: list[Mount]) -> Mount | None:
    """The mount that holds ``path`` (absolute, symlinks resolved): the longest mount point that is ``path`` or one
    of its parents; of equal ones the last (a later mount hides an earlier one on the same point).

    >>> table = [Mount("/dev/sda1", "/", "ext4"), Mount("srv:/x", "/mnt/a", "nfs4")]
    >>> mount_of("/mnt/a/cache.sqlite", table).fstype, mount_of("/mnt/ab/cache.sqlite", table).fstype
    ('nfs4', 'ext4')
    """
    target = PurePosixPath(path)
    best: Mount | None = None
    for mount in mounts:
        point = PurePosixPath(mount.point)
        if target.is_relative_to(point) and (best is None or len(point.parts) >= len(PurePosixPath(best.point).parts)):
            best = mount
    return best


def is_network_fstype(fstype: str) -> bool:
    """Whether several hosts may see a filesystem of this type (see ``NETWORK_FSTYPES``, ``NETWORK_FUSE``).

    >>> [is_network_fstype(t) for t in ("nfs4", "lustre", "fuse.sshfs", "ext4", "xfs", "tmpfs", "fuse.squashfuse")]
    [True, True, True, False, False, False, False]
    """
    if fstype in NETWORK_FSTYPES or fstype.startswith("nfs"):
        return True
    return fstype.startswith("fuse.") and fstype.removeprefix("fuse.") in NETWORK_FUSE


def filesystem_of(path: str | os.PathLike, mount_table: Callable[[], str | None] = read_mount_table) -> Mount | None:
    """The mount holding ``path`` (which need not exist yet: its folder decides), or ``None`` without a mount
    table."""
    text = mount_table()
    if text is None:
        return None
    return mount_of(Path(path).expanduser().resolve(), parse_mounts(text))


def network_mount(path: str | os.PathLike, mount_table: Callable[[], str | None] = read_mount_table) -> Mount | None:
    """The network-filesystem mount holding ``path``, or ``None`` when it is local (or unknown: no mount table)."""
    mount = filesystem_of(path, mount_table)
    return mount if mount is not None and is_network_fstype(mount.fstype) else None
