"""The job's GPU limit on a cgroup of ours: a ``BPF_CGROUP_DEVICE`` program (v2), ``devices.deny`` (v1).

The MPS daemon waits for the job's first step in a holding cgroup of the
job's (:func:`slurm_gpu.jobs.jobcgroup.hold_dirs`) when Slurm has not made
the job's cgroup yet (22.05, or no ``PrologFlags=RunInJob``).  The hold has
none of the device limits Slurm gives the job: a job user who ptraces their
daemon there could make it open another job's GPU and keep the descriptor
after the move (hostile review round 3, H4).  On cgroup v2 a device limit is
a BPF program attached to the cgroup, the way Slurm's ``cgroup/v2`` plugin
limits a job (``src/plugins/cgroup/v2/ebpf.c``: the same instructions and
attributes); this one refuses every NVIDIA GPU device node
(``/dev/nvidia<minor>``, character major 195, minors below 255) but the job's
own, and allows everything else, ``/dev/nvidiactl`` (195:255) included.  It
ends with the hold (a removed cgroup drops its programs), and the first
step's move takes the daemon under the job's own limits.

The system call goes through :func:`slurm_gpu.jobs.libc.bpf` (``ctypes``, no
library): the attributes and instruction encoding are the kernel's UAPI
(``include/uapi/linux/bpf.h``).
"""
from __future__ import annotations

import ctypes
import os
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

NVIDIA_MAJOR = 195          # NV_MAJOR_DEVICE_NUMBER: /dev/nvidia<minor>, /dev/nvidiactl
NVIDIACTL_MINOR = 255       # the control device; GPU minors lie below it

_BPF_PROG_LOAD = 5
_BPF_PROG_ATTACH = 8
_BPF_PROG_TYPE_CGROUP_DEVICE = 15
_BPF_CGROUP_DEVICE = 6
_BPF_F_ALLOW_MULTI = 2      # with whatever else limits the cgroup: every program must allow
_BPF_DEVCG_DEV_CHAR = 2

# Instruction classes and operations (include/uapi/linux/bpf_common.h, bpf.h).
_LDX_MEM_W = 0x61           # BPF_LDX | BPF_MEM | BPF_W
_ALU32_AND_K = 0x54         # BPF_ALU | BPF_AND | BPF_K
_JNE_K = 0x55               # BPF_JMP | BPF_JNE | BPF_K
_JEQ_K = 0x15               # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35               # BPF_JMP | BPF_JGE | BPF_K
_MOV64_K = 0xB7             # BPF_ALU64 | BPF_MOV | BPF_K
_EXIT = 0x95                # BPF_JMP | BPF_EXIT


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(allowed_minors: Iterable[int]) -> bytes:
    """The program's instructions: 1 (allow) for every device but an NVIDIA GPU whose
    minor is not in *allowed_minors*, 0 (refuse) for those.

    Its context is ``struct bpf_cgroup_dev_ctx``: ``access_type`` (the device
    type in its low 16 bits), ``major``, ``minor``, each a u32.
    """
    minors = sorted({int(m) for m in allowed_minors if 0 <= int(m) < NVIDIACTL_MINOR})
    # Jumps name their target by index; the offset is counted from the next instruction.
    body: list[tuple[int, int, int, int, str | None]] = [
        (_LDX_MEM_W, 2, 1, 0, None), (_ALU32_AND_K, 2, 0, 0xFFFF, None),
        (_JNE_K, 2, 0, _BPF_DEVCG_DEV_CHAR, "allow"),
        (_LDX_MEM_W, 4, 1, 4, None), (_JNE_K, 4, 0, NVIDIA_MAJOR, "allow"),
        (_LDX_MEM_W, 5, 1, 8, None), (_JGE_K, 5, 0, NVIDIACTL_MINOR, "allow"),
    ]
    body += [(_JEQ_K, 5, 0, m, "allow") for m in minors]
    refuse = len(body)
    allow = refuse + 2
    out = []
    for i, (code, dst, src, val, target) in enumerate(body):
        if code == _LDX_MEM_W:
            out.append(_insn(code, dst, src, off=val))
        elif target is None:
            out.append(_insn(code, dst, src, imm=val))
        else:
            out.append(_insn(code, dst, src, off=allow - (i + 1), imm=val))
    out += [_insn(_MOV64_K, 0, imm=0), _insn(_EXIT), _insn(_MOV64_K, 0, imm=1), _insn(_EXIT)]
    return b"".join(out)


def _buf(data: bytes, size: int) -> ctypes.Array[ctypes.c_char]:
    """*data* zero-padded to *size* bytes, in memory the kernel can read."""
    buf = ctypes.create_string_buffer(size)
    buf.raw = data.ljust(size, b"\0")
    return buf


def limit_gpus(cgroup_dir: str, allowed_minors: Iterable[int]) -> None:
    """Attach :func:`program` to the cgroup v2 directory *cgroup_dir*; OSError when the
    kernel refuses (no ``CONFIG_CGROUP_BPF``, not root, a parent's program that
    allows no other)."""
    code = program(allowed_minors)
    insns = _buf(code, len(code))
    license = _buf(b"GPL", 4)
    # union bpf_attr, BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level,
    # log_size, log_buf, kern_version, prog_flags, prog_name[16]
    attr = _buf(struct.pack(
        "<IIQQIIQII16s", _BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8,
        ctypes.addressof(insns), ctypes.addressof(license), 0, 0, 0, 0, 0, b"slurm_gpu_hold"), 72)
    from .libc import bpf
    prog = bpf(_BPF_PROG_LOAD, attr)
    try:
        fd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # BPF_PROG_ATTACH: target_fd, attach_bpf_fd, attach_type, attach_flags, replace_bpf_fd
            bpf(_BPF_PROG_ATTACH, _buf(struct.pack(
                "<IIIII", fd, prog, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI, 0), 20))
        finally:
            os.close(fd)
    finally:
        os.close(prog)          # the attachment holds the program while the cgroup lives


def limit_gpus_v1(cgroup_dir: str, allowed_minors: Iterable[int]) -> None:
    """The same limit on a cgroup v1 ``devices`` directory: one ``devices.deny`` line
    per other GPU minor.  (A new v1 devices cgroup allows what its parent does; a
    wildcard denial ``c 195:*`` cannot be narrowed again by an allow line, so each
    minor is its own exception: Documentation/admin-guide/cgroup-v1/devices.rst.)"""
    keep = {int(m) for m in allowed_minors}
    with open(os.path.join(cgroup_dir, "devices.deny"), "w") as f:
        for m in range(NVIDIACTL_MINOR):
            if m not in keep:
                f.write(f"c {NVIDIA_MAJOR}:{m} rwm")
                f.flush()           # one rule a write: the kernel parses one per write(2)
