"""What a job user can do to their MPS directories, told apart from a node fault.

The pipe and log directories are the job user's (mode 0700, theirs), so any
other process of theirs on the node can move, replace or plant entries
there, or mount a filesystem (FUSE) inside.  Nothing found there is taken
on trust:

* :func:`sockets_tampered` tells whether the daemon's two sockets are
  still the files at ``<pipe>/control`` and ``<pipe>/control_privileged``,
  through the kernel's own record of the daemon's listening sockets
  (``sock_diag``, what ``ss -xl`` shows): their bound path and inode.  A
  daemon alive behind moved or replaced sockets is the user's doing;
* :func:`detach_mounts` detaches every mount below the job directory
  before the epilog walks it, so a FUSE server cannot hang the walk and a
  busy mount cannot keep the directory;
* :func:`read_own_file` reads a file there through :mod:`slurm_gpu.ownedfile`:
  never through a symlink, never blocking on a FIFO, and only a regular
  file of the expected owner is read.

Only failure paths and the epilog of a job whose directory holds a mount
load more than ``os``.
"""
from __future__ import annotations

import os
import stat

from ..ownedfile import read_owned

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

SOCKETS = ("control", "control_privileged")


def read_own_file(path: str, uid: int, limit: int = 65536) -> bytes | None:
    """The first *limit* bytes of *path* if it is a regular file owned by *uid*, else None."""
    try:
        return read_owned(path, limit, (uid,))
    except OSError:
        return None


# -- the daemon's sockets -------------------------------------------------

def _socket_inodes(pids: list[int], proc: str = "/proc") -> set[int]:
    """The socket inodes (``socket:[N]``) the processes *pids* hold open."""
    out: set[int] = set()
    for pid in pids:
        d = f"{proc}/{pid}/fd"
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in names:
            try:
                link = os.readlink(f"{d}/{n}")
            except OSError:
                continue
            if link.startswith("socket:[") and link.endswith("]") and link[8:-1].isdigit():
                out.add(int(link[8:-1]))
    return out


def _listening_unix() -> dict[int, tuple[str, int, int] | None]:
    """{socket inode: (bound path, vfs dev, vfs inode)} of every listening AF_UNIX socket.

    One ``SOCK_DIAG_BY_FAMILY`` dump (``<linux/unix_diag.h>``) over netlink;
    the device is the kernel's ``s_dev`` (major << 20 | minor).  Raises
    OSError where the kernel has no ``unix_diag``.
    """
    import socket
    import struct
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 4)  # NETLINK_SOCK_DIAG
    try:
        # nlmsghdr (SOCK_DIAG_BY_FAMILY, REQUEST|DUMP) + unix_diag_req
        # (AF_UNIX, states: LISTEN, show: NAME|VFS, cookie: none)
        body = struct.pack("=BBHIIIII", 1, 0, 0, 1 << 10, 0, 1 | 2, 0xFFFFFFFF, 0xFFFFFFFF)
        nl.sendto(struct.pack("=IHHII", 16 + len(body), 20, 0x301, 1, 0) + body, (0, 0))
        out: dict[int, tuple[str, int, int] | None] = {}
        while True:
            data = nl.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if length < 16:
                    return out
                if kind == 3:                         # NLMSG_DONE
                    return out
                if kind == 2:                         # NLMSG_ERROR
                    err = -struct.unpack_from("=i", data, off + 16)[0]
                    if err:
                        raise OSError(err, os.strerror(err))
                    return out
                ino = struct.unpack_from("=I", data, off + 16 + 4)[0]
                name, vfs = None, None
                a = off + 16 + 16
                end = off + length
                while a + 4 <= end:
                    alen, atype = struct.unpack_from("=HH", data, a)
                    if alen < 4:
                        break
                    payload = data[a + 4:a + alen]
                    if atype == 0:                    # UNIX_DIAG_NAME
                        name = os.fsdecode(payload.rstrip(b"\0"))
                    elif atype == 1 and len(payload) >= 8:   # UNIX_DIAG_VFS: ino, dev
                        vfs = struct.unpack_from("=II", payload)
                    a += (alen + 3) & ~3
                out[ino] = (name, vfs[1], vfs[0]) if name is not None and vfs else None
                off += (length + 3) & ~3
    finally:
        nl.close()


def _kdev(st_dev: int) -> int:
    """A ``stat`` device number as the kernel's ``s_dev`` (what sock_diag reports)."""
    return (os.major(st_dev) << 20) | os.minor(st_dev)


def sockets_tampered(pipe: str, pids: list[int], proc: str = "/proc") -> str | None:
    """How the daemon's sockets were taken from it ("moved", "replaced"), or None.

    None also when nothing can be proven: the daemon (*pids*, the processes
    the prolog started) listens on no socket under *pipe* yet, or the
    kernel keeps no record of it (the prolog then fails the job on its silence alone).
    """
    mine = _socket_inodes(pids, proc)
    if not mine:
        return None
    try:
        listening = _listening_unix()
    except OSError:
        return None
    bound = {rec[0]: rec[1:] for ino, rec in listening.items() if ino in mine and rec}
    what: list[str] = []
    for name in SOCKETS:
        path = os.path.join(pipe, name)
        vfs = bound.get(path)
        if vfs is None:
            continue                    # never bound (yet): nothing to compare
        try:
            st = os.lstat(path)
        except OSError:
            what.append(f"{name} moved away")
            continue
        if not stat.S_ISSOCK(st.st_mode) or (_kdev(st.st_dev), st.st_ino) != vfs:
            what.append(f"{name} replaced")
    return ", ".join(what) or None


# What NVIDIA's daemon makes in its pipe directory before any client
# connects (535: two sockets, a lock file, a FIFO), by file type.
DAEMON_ENTRIES = {"control": stat.S_IFSOCK, "control_privileged": stat.S_IFSOCK,
                  "control_lock": stat.S_IFREG, "log": stat.S_IFIFO}


def planted(pipe: str) -> str | None:
    """What is in the pipe directory that the daemon did not make, or None.

    The prolog makes the directory empty just before it starts the daemon,
    so a name the daemon never uses, or one of its names of another type
    (a directory where its socket goes), was put there by another process
    of the job user's: NVIDIA's daemon then exits 1 without a word.
    """
    try:
        names = sorted(os.listdir(pipe))
    except OSError:
        return None
    found = []
    for n in names:
        try:
            kind = stat.S_IFMT(os.lstat(os.path.join(pipe, n)).st_mode)
        except OSError:
            continue
        if DAEMON_ENTRIES.get(n) != kind:
            found.append(repr(n))
    return f"found {', '.join(found[:3])}{' ...' if len(found) > 3 else ''}" if found else None


# -- mounts below the job directory ---------------------------------------

def real_path(d: str) -> str:
    """*d* with every symlink resolved, as mountinfo names it: the kernel's name of an
    ``O_PATH`` descriptor (three system calls; ``os.path.realpath`` makes one per
    component), else ``os.path.realpath`` (*d* is not there)."""
    try:
        fd = os.open(d, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(d)
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(d)
    finally:
        os.close(fd)


def _unescape(field: str) -> str:
    r"""A mountinfo path: the kernel writes space, tab, newline and ``\`` as ``\ooo``."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        c = field[i]
        if c == "\\" and i + 4 <= len(field) and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(c)
            i += 1
    return "".join(out)


def mounts_below(d: str, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points strictly below *d*, the outermost only (detaching one detaches what is inside).

    Compared with *d*'s real path: mountinfo names real paths, and *d* may
    be reached through a symlink above it (``/var/run -> /run``; its parents
    are root's, :mod:`.trust`).
    """
    prefix = real_path(d).rstrip("/") + "/"
    try:
        with open(mountinfo, "rb") as f:
            raw = f.read()
    except OSError:
        return []
    if prefix.encode() not in raw and b"\\" not in raw:
        return []                       # the common case: one substring search
    found = []
    # Lines end at "\n" only: str.splitlines() would also end one at a form feed
    # or \x1c-\x1e, which the kernel leaves unescaped in a name the user chose.
    for line in raw.decode(errors="surrogateescape").split("\n"):
        fields = line.split(" ")
        if len(fields) > 4:
            p = _unescape(fields[4])
            if p.startswith(prefix):
                found.append(p)
    found.sort()
    top: list[str] = []
    for p in found:
        if not any(p.startswith(t.rstrip("/") + "/") or p == t for t in top):
            top.append(p)
    return top


def _open_below(d: str, path: str) -> int:
    """An O_PATH descriptor of *path*, reached from *d* one component at a time, never
    through a symlink: the user cannot redirect it elsewhere by swapping a component.

    The last one may be a regular file (fusermount3 mounts on a file the
    user owns), so it is opened without ``O_DIRECTORY``; a symlink there is
    refused as before (``O_PATH|O_NOFOLLOW`` opens the link itself).
    """
    rel = path[len(d.rstrip("/")) + 1:]
    parts = rel.split("/")
    if not rel or any(p in ("", ".", "..") for p in parts):
        raise OSError(22, "not a path below the job directory", path)
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
    fd = os.open(d, flags)
    try:
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            nxt = os.open(p, flags & ~os.O_DIRECTORY if last else flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
            if last and stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(20, os.strerror(20), path)     # ENOTDIR, as O_DIRECTORY says
    except BaseException:
        os.close(fd)
        raise
    return fd


def detach_mounts(d: str, mountinfo: str = "/proc/self/mountinfo") -> tuple[list[str], list[str]]:
    """Detach every mount below *d* (``umount2(MNT_DETACH)``): (detached, left with why)."""
    done: list[str] = []
    left: list[str] = []
    d = real_path(d)                    # as mountinfo names it (see mounts_below)
    for _ in range(3):                  # again for a mount made while we detached
        todo = mounts_below(d, mountinfo)
        if not todo:
            return done, []
        left = []
        for m in todo:
            try:
                fd = _open_below(d, m)
            except OSError as e:
                left.append(f"{m}: {e.strerror}")
                continue
            try:
                from .libc import detach_mount
                detach_mount(f"/proc/self/fd/{fd}")
                done.append(m)
            except OSError as e:
                left.append(f"{m}: {e.strerror}")
            finally:
                os.close(fd)
    return done, left


# -- what makes the daemon fail without a node fault ----------------------

FUSECTL = "/sys/fs/fuse/connections"


# ioctl_ns(2): _IO(0xb7, 1) and _IO(0xb7, 4) (include/uapi/linux/nsfs.h)
NS_GET_USERNS = 0xB701
NS_GET_OWNER_UID = 0xB704


def user_fuse_mounts(uid: int, pids: Iterable[int] = (), proc: str = "/proc") -> list[tuple[str, int]]:
    """(mount point, connection number) of each FUSE mount of *uid*'s, root's never:
    in this process's mount namespace and in each of *pids*'.

    Where the namespace is the node's (or one a site's plugin made, owned by
    the initial user namespace: job_container/tmpfs), a mount is *uid*'s when
    made for them (``user_id=<uid>``: fusermount3 mounts for its caller).
    Where a user namespace owns it (``unshare -Urm``, rootless apptainer and
    podman), a FUSE mount made there is that namespace's owner's: ``user_id=``
    is printed as that namespace maps it, and its root may write any value.
    A connection the node's namespace shows as well is judged there alone:
    such a namespace starts as a copy of the node's mounts, a site's FUSE
    (root's: CVMFS) and other users' among them, and those stay theirs.
    """
    if uid == 0:
        return []
    out: dict[int, str] = {}
    node = _fuse_mounts(f"{proc}/self/mountinfo")
    for mp, conn, opts in node:
        if f"user_id={uid}" in opts:
            out.setdefault(conn, mp)
    seen = {conn for _mp, conn, _opts in node}
    for view in _namespaces(pids, proc):
        owner = userns_owner(view, proc)
        mounts = _fuse_mounts(f"{proc}/{view}/mountinfo")
        for mp, conn, opts in mounts:
            if conn in seen:
                continue
            if owner == uid or (owner is None and f"user_id={uid}" in opts):
                out.setdefault(conn, mp)
        if owner == uid and mounts.truncated:
            # Their own table, too large to read whole: what holds their process may
            # lie past the cap, and is theirs either way; no connection to abort (-1).
            out.setdefault(-1, f"{proc}/{view}/mountinfo (over {MOUNTINFO_CAP} bytes, not read whole)")
    return [(mp, conn) for conn, mp in out.items()]


def _namespaces(pids: Iterable[int], proc: str) -> list[str]:
    """One ``/proc`` entry (``PID`` or ``PID/task/TID``) per mount namespace the threads
    of *pids* are in, each read once however many processes share it.

    Every thread: one whose main thread has exited (``Z``) shows no namespace
    of its own (``ns/mnt``: ENOENT) while its other threads wait on, and
    threads of one process may even sit in different mount namespaces.
    """
    views: dict[tuple[int, int], str] = {}
    for pid in pids:
        try:
            tids = sorted(os.listdir(f"{proc}/{pid}/task"))
        except OSError:
            continue
        for t in [str(pid)] + [f"{pid}/task/{tid}" for tid in tids]:
            try:
                st = os.stat(f"{proc}/{t}/ns/mnt")
            except OSError:
                continue
            views.setdefault((st.st_dev, st.st_ino), t)
    return list(views.values())


def userns_owner(view: str, proc: str) -> int | None:
    """The uid that owns the user namespace owning the mount namespace of *view*
    (``PID`` or ``PID/task/TID``); None for this process's own user namespace (or
    when it cannot be told)."""
    import fcntl
    import struct
    try:
        fd = os.open(f"{proc}/{view}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        userns = fcntl.ioctl(fd, NS_GET_USERNS)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        if os.fstat(userns).st_ino == os.stat(f"{proc}/self/ns/user").st_ino:
            return None
        return int(struct.unpack("=I", fcntl.ioctl(userns, NS_GET_OWNER_UID, bytes(4)))[0])
    except OSError:
        return None
    finally:
        os.close(userns)


# The most of a mount table read: a user's own namespace can hold up to
# fs.mount-max (100,000) mounts with paths of 4 KiB, hundreds of MiB that
# take seconds to generate; past this, the rest is not looked at.
MOUNTINFO_CAP = 16 << 20


class _Mounts(list[tuple[str, int, list[str]]]):
    truncated = False           # the table went on past MOUNTINFO_CAP


def _fuse_mounts(path: str) -> _Mounts:
    """(mount point, connection number, superblock options) of each FUSE mount in the
    ``mountinfo`` file *path*, its first :data:`MOUNTINFO_CAP` bytes (empty: it does
    not read)."""
    out = _Mounts()
    try:
        with open(path, "rb") as f:
            data = f.read(MOUNTINFO_CAP)
            out.truncated = bool(data) and len(data) == MOUNTINFO_CAP and bool(f.read(1))
    except OSError:
        return out
    raw = data.decode(errors="surrogateescape")
    for line in raw.split("\n"):
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(" "), tail.split(" ")
        if not sep or len(fields) < 5 or len(rest) < 3:
            continue
        if rest[0] not in ("fuse", "fuseblk") and not rest[0].startswith("fuse."):
            continue
        major, _, minor = fields[2].partition(":")
        if major.isdigit() and minor.isdigit():
            # fusectl names a connection by its device number (fs/fuse/control.c)
            out.append((_unescape(fields[4]), (int(major) << 20) | int(minor), rest[2].split(",")))
    return out


def abort_fuse(conns: list[int], fusectl: str = FUSECTL) -> list[int]:
    """Abort each FUSE connection of *conns* that has requests waiting (fusectl's
    ``waiting``, ``abort``: every request then fails, whoever waits on it); the
    ones aborted.  Nothing where fusectl is not mounted (systemd mounts it)."""
    done = []
    for c in conns:
        if c < 0:
            continue                # no connection known (user_fuse_mounts' -1)
        d = f"{fusectl}/{int(c)}"
        try:
            with open(f"{d}/waiting", "rb") as f:
                if int(f.read(32) or b"0") <= 0:
                    continue
            with open(f"{d}/abort", "wb") as f:
                f.write(b"1")
        except (OSError, ValueError):
            continue
        done.append(c)
    return done


def mounted_over(jd: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """What the job's user mounted in the job directory *jd* ("pipe", "log", ...), or None.

    Root mounts nothing there: any mount is the user's (FUSE).  Read from
    mountinfo first (nothing of the user's is touched); then a ``pipe`` or
    ``log`` on another device than *jd*, or one root may not even ``lstat``
    (a FUSE mount without ``allow_other`` refuses every other user, root
    included, with EACCES).
    """
    real = real_path(jd)
    found = [m[len(real) + 1:] for m in mounts_below(real, mountinfo)]
    if not found:
        try:
            dev = os.lstat(real).st_dev
        except OSError:
            return None
        for name in ("pipe", "log"):
            try:
                if os.lstat(os.path.join(real, name)).st_dev != dev:
                    found.append(name)
            except PermissionError:
                found.append(name)
            except OSError:
                pass
    if not found:
        return None
    # A name the user chose is shown quoted when it is not plain text.
    shown = [f if f.isprintable() else repr(f) for f in found[:3]]
    return ", ".join(shown) + (" ..." if len(found) > 3 else "")


def full_filesystem(d: str) -> str | None:
    """The mount point of *d*'s filesystem when it has no block or no inode left for
    users (``statvfs``: ``f_bavail``/``f_favail``), else None.

    The job user can fill it through their own directories (``/run`` is a
    small tmpfs); a daemon that then cannot make its sockets is no node fault.
    """
    try:
        st = os.statvfs(d)
    except OSError:
        return None
    if st.f_bavail > 0 and (st.f_favail > 0 or st.f_files == 0):   # f_files 0: no inode limit
        return None
    return mount_point(d)


def mount_point(d: str) -> str:
    """The mount point of the filesystem *d* is on (its parents are root's)."""
    p = os.path.realpath(d)
    while p != "/" and not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


def same_filesystem(a: str, b: str) -> bool:
    """*a* and *b* (or, where they do not exist yet, their nearest parents) are on
    one filesystem (``st_dev``: a bind mount of it counts too)."""
    def dev(p: str) -> int | None:
        p = os.path.abspath(p)
        while True:
            try:
                return os.stat(p).st_dev
            except OSError:
                if p == os.path.dirname(p):
                    return None
                p = os.path.dirname(p)
    da = dev(a)
    return da is not None and da == dev(b)
