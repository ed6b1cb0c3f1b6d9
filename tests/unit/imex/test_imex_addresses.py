"""Peer addresses for nodes_config.cfg from slurm.conf / the resolver, never scontrol."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_gpu.errors import InputError
from slurm_gpu.imex.addresses import addresses, slurm_conf_addresses


def test_node_addr_ranges_hostnames_and_defaults(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=c\nInclude /nowhere\nNodeName=DEFAULT CPUs=4\n"
                    "NodeName=gb[01-04] NodeAddr=10.0.0.[1-4] CPUs=144 \\\n  Gres=gpu:4  # rack 1\n"
                    "NodeName=gb05 NodeHostname=localhost\n"
                    "nodename=gb06 nodeaddr=127.0.0.6\n"
                    "# NodeName=gb07 NodeAddr=1.2.3.4\n"
                    "PartitionName=p Nodes=ALL\n")
    assert slurm_conf_addresses(str(conf), ["gb02", "gb04", "gb05", "gb06", "gb07"]) == {
        "gb02": "10.0.0.2", "gb04": "10.0.0.4", "gb05": "localhost", "gb06": "127.0.0.6"}
    assert addresses("slurm.conf", ["gb04", "gb02", "gb05"], str(conf)) == ["10.0.0.4", "10.0.0.2", "127.0.0.1"]


def test_unresolvable_or_duplicate_addresses_are_one_line(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("NodeName=a NodeAddr=10.0.0.1\nNodeName=b NodeAddr=10.0.0.1\n"
                    "NodeName=c NodeAddr=no-such-host.invalid\n")
    with pytest.raises(InputError, match="two nodes of the domain resolve to 10.0.0.1"):
        addresses("slurm.conf", ["a", "b"], str(conf))
    with pytest.raises(InputError, match="cannot resolve node address 'no-such-host.invalid'"):
        addresses("slurm.conf", ["a", "c"], str(conf))
    with pytest.raises(InputError, match="no SLURM_CONF"):
        addresses("slurm.conf", ["a"], None)
    assert addresses("dns", ["localhost"], None) == ["127.0.0.1"]
