"""The node's MIG baseline: a declarative config, checked first, applied only on drift.

The config uses mig-parted's format (NVIDIA/mig-parted ``config.yaml``), so
sites can reuse what they have::

    version: v1
    mig-configs:
      all-balanced:
        - devices: all               # or a list of GPU indices
          device-filter: ["0x233010DE"]   # optional: PCI device ids
          mig-enabled: true
          mig-devices:
            "1g.10gb": 2
            "2g.20gb": 1
            "3g.40gb": 1

:func:`diff` compares the wanted layout with NVML's answers (pure apart from
reads); :func:`apply` changes only GPUs that drifted, so running it twice
changes nothing the second time.  Both plan and change a GPU through
:mod:`.layout`, as a job's ``--gpu-mig`` does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError, SlurmGpuError, UsageError
from ..hw.gpus import Gpus
from . import instances, layout
from .instances import MigError
from .planner import plan_gpu
from .profiles import identify, unknown_model


@dataclass(frozen=True)
class Want:
    """What one GPU should look like."""

    index: int
    mig_enabled: bool
    devices: tuple[str, ...]          # profile names, sorted


@dataclass
class GpuDiff:
    index: int
    name: str
    want: Want
    mode: int | None
    have: tuple[str, ...]
    actions: list[str] = field(default_factory=list)
    model: Any = None                  # profiles.GpuModel of a MIG-capable GPU

    @property
    def drift(self) -> bool:
        return bool(self.actions)


def load_config(path: str, select: str | None) -> list[dict[str, Any]]:
    """The selected entry list of a mig-parted style config file."""
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise InputError("MIG config not found", path) from None
    except (OSError, yaml.YAMLError, RecursionError, ValueError) as e:   # ValueError: a bad UTF-8 byte
        raise InputError(f"cannot read MIG config: {e}".splitlines()[0][:200], path) from None
    if not isinstance(data, dict) or not isinstance(data.get("mig-configs"), dict):
        raise InputError("MIG config needs a 'mig-configs' mapping", path)
    # YAML 1.1 reads an unquoted name like `off` or `yes` as a boolean.
    configs = {("on" if k is True else "off" if k is False else str(k)): v
               for k, v in data["mig-configs"].items()}
    if select is None:
        if len(configs) != 1:
            raise UsageError(f"MIG config has {len(configs)} configs; choose one with --select "
                             f"({', '.join(sorted(configs))})", path)
        select = next(iter(configs))
    if select not in configs:
        raise UsageError(f"no MIG config named {select!r} (have: {', '.join(sorted(configs))})",
                         path)
    entries = configs[select]
    if not isinstance(entries, list):
        raise InputError(f"mig-configs.{select} must be a list", path)
    return entries


def wanted(entries: list[dict[str, Any]], gpus: list[tuple[int, int | None]],
            where: str) -> dict[int, Want]:
    """Per GPU index what the config's *entries* ask for (later entries win).

    *gpus* is each GPU's (index, PCI device id or None); an entry that is
    not a mig-parted entry raises :class:`InputError` naming *where*.
    """
    out: dict[int, Want] = {}
    for k, e in enumerate(entries):
        if not isinstance(e, dict) or "devices" not in e or "mig-enabled" not in e:
            raise InputError(f"entry {k} needs 'devices' and 'mig-enabled'", where)
        devs = e["devices"]
        if devs != "all" and not (isinstance(devs, list) and all(isinstance(d, int) and not isinstance(d, bool)
                                                                  for d in devs)):
            raise InputError(f"entry {k}: devices must be 'all' or a list of GPU indices", where)
        filt = e.get("device-filter")
        if isinstance(filt, (str, int)) and not isinstance(filt, bool):
            filt = [filt]
        if filt is not None and not isinstance(filt, list):
            raise InputError(f"entry {k}: device-filter must be a PCI device id or a list of them", where)
        filt_ids = {_pci_id(f, k, where) for f in filt} if filt else None
        mig_devs = e.get("mig-devices") or {}
        if not isinstance(mig_devs, dict):
            raise InputError(f"entry {k}: mig-devices must be a mapping", where)
        names: list[str] = []
        for name, count in mig_devs.items():
            # A GPU holds at most 7 GPU instances (more with compute instances):
            # a bigger count is a typo, never a list of a billion names.
            if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_PER_GPU:
                raise InputError(f"entry {k}: count of {name} must be a whole number from 0 to {MAX_PER_GPU}",
                                 where)
            names += [str(name)] * count
            if len(names) > MAX_PER_GPU:
                raise InputError(f"entry {k}: more than {MAX_PER_GPU} MIG devices for one GPU", where)
        for idx, pci in gpus:
            if devs != "all" and (not isinstance(devs, list) or idx not in devs):
                continue
            if filt_ids is not None and pci not in filt_ids:
                continue
            out[idx] = Want(idx, bool(e["mig-enabled"]), tuple(sorted(names)))
    return out


MAX_PER_GPU = 64


def _pci_id(value: Any, k: int, where: str) -> int:
    """A device-filter entry ("0x233010DE", or the number YAML read) as an int."""
    text = str(value).strip()
    try:
        if isinstance(value, bool) or len(text) > 18:
            raise ValueError(text)
        return value if isinstance(value, int) else int(text, 16)
    except ValueError:
        raise InputError(f"entry {k}: device-filter {text[:20]!r} is not a PCI device id like 0x233010DE",
                         where) from None


def _name_of(model: Any, e: instances.Existing) -> str:
    p = model.profile_by_id(e.profile_id)
    if p is None:
        return f"profile-{e.profile_id}"
    if len(e.cis) == 1:
        from .profiles import CIP_BY_SLICES
        sizes = {v: k for k, v in CIP_BY_SLICES.items()}
        ci = sizes.get(e.cis[0][1], p.slices)
        return p.name if ci == p.slices else f"{ci}c.{p.name}"
    return p.name


def diff(gpus: Gpus, entries: list[dict[str, Any]], where: str) -> list[GpuDiff]:
    """Compare the config with the GPUs; each GpuDiff lists the actions needed."""
    n = gpus.count()
    devs = [instances.device(gpus, i) for i in range(n)]
    pcis: list[tuple[int, int | None]] = []
    for i, d in enumerate(devs):
        try:
            pcis.append((i, gpus.pci_device_id(d)))
        except Exception:  # noqa: BLE001 - no PCI info: filters cannot match it
            pcis.append((i, None))
    wants = wanted(entries, pcis, where)
    out = []
    for i, want in sorted(wants.items()):
        d = devs[i]
        name = gpus.name(d)
        mode = instances.mig_mode(gpus, d)
        model = identify(pcis[i][1], name)
        if mode is None:
            if want.mig_enabled:
                raise UsageError(f"GPU {i} ({name}) does not support MIG", where)
            continue
        if model is None:
            # MIG-capable, but we have no table for it: never guess one.
            pci = pcis[i][1]
            raise unknown_model(f"{name}" + (f", PCI 0x{pci:08X}" if pci else ""),
                                f"GPU {i}")
        have = tuple(sorted(_name_of(model, e) for e in instances.list_instances(gpus, d))) \
            if mode == 1 else ()
        g = GpuDiff(i, name, want, mode, have, model=model)
        if want.mig_enabled != bool(mode):
            g.actions.append(f"set MIG mode {'on' if want.mig_enabled else 'off'}")
        if want.mig_enabled:
            # Check the layout fits before anything changes.
            plan_gpu(layout.requests(want.devices), model, where=where)
            if have != want.devices:
                if have:
                    g.actions.append(f"destroy {', '.join(have)}")
                if want.devices:
                    g.actions.append(f"create {', '.join(want.devices)}")
        elif have:
            g.actions.append(f"destroy {', '.join(have)}")
        out.append(g)
    return out


def apply(gpus: Gpus, diffs: list[GpuDiff], busy: dict[int, str], where: str) -> list[str]:
    """Make every drifted GPU match; *busy* maps GPU index -> job using it."""
    done = []
    for g in diffs:
        if not g.drift:
            continue
        if g.index in busy:
            raise SlurmGpuError(f"GPU {g.index} is in use by job {busy[g.index]}; drain the node "
                                "before changing its MIG baseline", where)
        d = instances.device(gpus, g.index)
        facts = layout.GpuFacts(d, g.name, g.model, g.mode)
        wanted = layout.requests(g.want.devices) if g.want.mig_enabled else []
        try:
            change = layout.plan_change(
                gpus, facts, wanted, where=where,
                mig_mode=g.want.mig_enabled if g.want.mig_enabled != bool(g.mode) else None)
        except MigError as e:
            raise layout.explained(e) from None
        change.where = f"GPU {g.index}"
        layout.apply(gpus, change)
        done.append(f"GPU {g.index}: {'; '.join(g.actions)}")
    return done
