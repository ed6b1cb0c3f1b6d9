"""The binding planner (spank/sg_bind.c, through slurm_gpu.binding): which GPUs a task
gets and where it is bound."""
from __future__ import annotations

import pytest

from slurm_gpu import binding
from slurm_gpu.binding import BindingError, locality, plan_task, task_gpus
from slurm_gpu.hw.model import Core, Gpu, Node, NumaNode, Package

pytestmark = pytest.mark.usefixtures("planner")


def make_node(numa: int = 2, cores_per_numa: int = 2, gpus_per_numa: int = 1,
              smt: int = 1, minors: list[int] | None = None) -> Node:
    """A node with NUMA nodes of equal size; PU OS ids like Linux on Intel (SMT siblings +N)."""
    ncores = numa * cores_per_numa
    cores = tuple(Core(c, c, c // (ncores // 2 or 1) if numa > 1 else 0, c // cores_per_numa,
                       tuple(c + k * ncores for k in range(smt))) for c in range(ncores))
    nodes = tuple(NumaNode(n, n, 1 << 30, tuple(range(n * cores_per_numa, (n + 1) * cores_per_numa)),
                           tuple(sorted(p for c in cores[n * cores_per_numa:(n + 1) * cores_per_numa]
                                        for p in c.pus)))
                  for n in range(numa))
    gpus = []
    for i in range(numa * gpus_per_numa):
        n = i // gpus_per_numa
        gpus.append(Gpu(index=i, minor=(minors[i] if minors else i), uuid=f"GPU-{i:04d}",
                        pci_bus_id=f"0000:{0x10 + i:02x}:00.0", pci_device_id=0x2330,
                        name="NVIDIA H100 80GB HBM3", memory_bytes=80 << 30,
                        numa_nodes=(n,), cores=nodes[n].cores))
    return Node("t", (Package(0, 0, tuple(range(ncores))),), nodes, cores, tuple(gpus), numa << 30)


MINI = make_node()            # like mini-2numa: NUMA0 = cores 0,1; NUMA1 = cores 2,3
LOC = locality(MINI)


def ids(gpus):
    return [g["index"] for g in gpus]


def test_cpulist_round_trip():
    assert binding.cpulist([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert binding.parse_cpulist("0-2,5,7-8") == (0, 1, 2, 5, 7, 8)
    assert binding.cpulist([]) == ""


def test_slurm_split_gpus_are_taken_as_given():
    # --gpus-per-task=1 with Slurm binding: each task sees its own GPU
    env = {"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "1"}
    assert ids(task_gpus(LOC, env, 0, 2)) == [1]


def test_shared_gpus_are_split_per_task():
    env = {"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert ids(task_gpus(LOC, env, 0, 2)) == [0]
    assert ids(task_gpus(LOC, env, 1, 2)) == [1]
    # more tasks than GPUs wrap around like per_task:1
    assert ids(task_gpus(LOC, env, 2, 4)) == [0]
    assert ids(task_gpus(LOC, env, 3, 4)) == [1]


def test_gpus_per_task_env_sets_n():
    node = make_node(numa=2, gpus_per_numa=2)
    env = {"SLURM_STEP_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
           "SLURM_GPUS_PER_TASK": "2"}
    assert ids(task_gpus(locality(node), env, 1, 2)) == [2, 3]


def test_typed_gpus_per_task_and_ranges():
    node = make_node(numa=2, gpus_per_numa=2)
    env = {"SLURM_STEP_GPUS": "0-3", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
           "SLURM_GPUS_PER_TASK": "h100:1"}
    assert ids(task_gpus(locality(node), env, 1, 2)) == [1]    # not GPUs/tasks = 2
    assert ids(task_gpus(locality(node), {"SLURM_STEP_GPUS": "1-2,0"}, 0, 1)) == [1, 2, 0]
    assert task_gpus(locality(node), {"SLURM_STEP_GPUS": "x-1"}, 0, 1) == []


def test_single_task_keeps_all_gpus():
    env = {"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert ids(task_gpus(LOC, env, 0, 1)) == [0, 1]


def test_device_cgroup_local_indices_map_through_step_gpus():
    node = make_node(numa=2, gpus_per_numa=2)
    # step holds GPUs 2,3; ConstrainDevices renumbers them 0,1 for the task
    env = {"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "1"}
    assert ids(task_gpus(locality(node), env, 0, 1)) == [3]


def test_gres_index_follows_gres_conf_order():
    # NVML index order differs from /dev/nvidiaN order.  Slurm's index is the
    # position in slurmd's device list: a gres.conf listing File=/dev/nvidia0
    # first makes index 0 the GPU with minor 0 (NVML index 1); with AutoDetect
    # (no order given) it is NVML's order.
    node = make_node(minors=[1, 0])
    env = {"SLURM_STEP_GPUS": "0"}
    assert ids(task_gpus(locality(node, [0, 1]), env, 0, 1)) == [1]
    assert ids(task_gpus(locality(node, [1, 0]), env, 0, 1)) == [0]
    assert ids(task_gpus(locality(node), env, 0, 1)) == [0]


def test_batch_step_uses_job_gpus_and_uuid_lists_work():
    assert ids(task_gpus(LOC, {"SLURM_JOB_GPUS": "1"}, 0, 1)) == [1]
    assert ids(task_gpus(LOC, {"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "GPU-0001"},
                         0, 1)) == [1]
    assert task_gpus(LOC, {}, 0, 1) == []


def test_user_exported_cuda_visible_devices_binds_nothing():
    # a step without GPUs: CUDA_VISIBLE_DEVICES came from the user's shell
    assert task_gpus(LOC, {"CUDA_VISIBLE_DEVICES": "1"}, 0, 1) == []
    assert task_gpus(LOC, {"CUDA_VISIBLE_DEVICES": "GPU-0001"}, 0, 1) == []
    assert not plan_task(LOC, {"CUDA_VISIBLE_DEVICES": "1"}, mode="strict", local_task=0,
                         ntasks=1, allowed=range(4)).applied


def test_strict_binds_to_gpu_local_cpus_within_allowed():
    env = {"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "1"}
    b = plan_task(LOC, env, mode="strict", local_task=0, ntasks=2, allowed=range(4))
    assert (b.cpus, b.mems, b.gpus) == ((2, 3), (1,), (1,))
    assert b.env_value() == "strict;gpus=1;cpus=2-3;mems=1"


def test_never_widens_slurm_binding():
    env = {"SLURM_STEP_GPUS": "0"}
    b = plan_task(LOC, env, mode="prefer", local_task=0, ntasks=1, allowed=[1, 2, 3])
    assert b.cpus == (1,)


def test_smt_siblings_come_along():
    node = make_node(numa=2, cores_per_numa=2, smt=2)   # core c has PUs c and c+4
    b = plan_task(locality(node), {"SLURM_STEP_GPUS": "1"}, mode="strict", local_task=0, ntasks=1,
                  allowed=range(8))
    assert b.cpus == (2, 3, 6, 7)


def test_no_local_cpu_strict_fails_prefer_warns():
    env = {"SLURM_STEP_GPUS": "1"}
    with pytest.raises(BindingError) as e:
        plan_task(LOC, env, mode="strict", local_task=0, ntasks=1, allowed=[0])
    assert e.value.line().startswith("slurm-gpu: gpu-numa-bind=strict impossible: GPU 1")
    assert "may only use CPUs 0" in e.value.line()
    b = plan_task(LOC, env, mode="prefer", local_task=0, ntasks=1, allowed=[0])
    assert not b.applied and b.cpus == () and b.mems == ()
    assert "prefer not applied" in b.warning
    assert b.env_value() == "prefer;gpus=1;none"


def test_off_and_no_gpus_do_nothing():
    env = {"SLURM_STEP_GPUS": "0"}
    assert not plan_task(LOC, env, mode="off", local_task=0, ntasks=1, allowed=[0]).applied
    assert not plan_task(LOC, {}, mode="strict", local_task=0, ntasks=1, allowed=[0]).applied


def test_gpu_without_locality():
    node = make_node()
    g = node.gpus[0]
    from dataclasses import replace
    node = replace(node, gpus=(replace(g, numa_nodes=(), cores=()), node.gpus[1]))
    with pytest.raises(BindingError, match="no known NUMA node"):
        plan_task(locality(node), {"SLURM_STEP_GPUS": "0"}, mode="strict", local_task=0, ntasks=1,
                  allowed=range(4))


def test_multi_gpu_task_spans_numa_nodes():
    b = plan_task(LOC, {"SLURM_STEP_GPUS": "0,1"}, mode="strict", local_task=0, ntasks=1,
                  allowed=range(4))
    assert b.cpus == (0, 1, 2, 3) and b.mems == (0, 1)


def test_verbose_line():
    b = plan_task(LOC, {"SLURM_STEP_GPUS": "1"}, mode="strict", local_task=0, ntasks=1,
                  allowed=range(4))
    line = binding.verbose_line(b, hostname="n1", pid=42)
    assert line == ("slurm-gpu: gpu-numa-bind=strict - n1, task  0 [42]: gpus 1 cpus 2-3 "
                    "mems 1 (MPOL_BIND)")


def test_every_recorded_gpu_machine_binds_each_gpu_locally(gpu_machine_name):
    from machinedata import load_machine
    node = load_machine(gpu_machine_name)
    allowed = [p for c in node.cores for p in c.pus]
    loc = locality(node)
    assert sorted(g["index"] for g in loc) == sorted(g.index for g in node.gpus)
    by_index = {g.index: g for g in node.gpus}
    for pos, entry in enumerate(loc):
        gpu = by_index[entry["index"]]
        env = {"SLURM_STEP_GPUS": str(pos)}
        if not gpu.numa_nodes:
            continue
        b = plan_task(loc, env, mode="strict", local_task=0, ntasks=1, allowed=allowed)
        assert b.gpus == (gpu.index,)
        local = set(node.pus_of_cores(gpu.cores)) if gpu.cores else set(
            p for n in node.numa_nodes if n.index in gpu.numa_nodes for p in n.pus)
        assert b.cpus and set(b.cpus) == local
        numa_os = {n.os_index for n in node.numa_nodes if n.index in gpu.numa_nodes}
        assert set(b.mems) == numa_os


@pytest.mark.parametrize("cvd", ["\u00b2", "0-\u00b9", "\u0661"])
def test_non_ascii_digits_are_not_gpu_indices(cvd):
    # str.isdigit() accepts '²' and Arabic-Indic digits, int() refuses the first:
    # a task's odd CUDA_VISIBLE_DEVICES must not become an internal error
    env = {"SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": cvd, "SLURM_GPUS_PER_TASK": "\u00b2"}
    assert ids(task_gpus(LOC, env, 0, 1)) == [1]


def test_gpu_ranges_are_bounded():
    # a range list is expanded into a list: a silly one must not eat the task's memory
    loc = locality(make_node(numa=2, gpus_per_numa=4))
    assert ids(task_gpus(loc, {"SLURM_STEP_GPUS": "0-3,7"}, 0, 1)) == [0, 1, 2, 3, 7]
    assert task_gpus(loc, {"SLURM_STEP_GPUS": "0-100000"}, 0, 1) == []
    assert ids(task_gpus(loc, {"SLURM_STEP_GPUS": "1,0-4094"}, 0, 1))[:3] == [1, 0, 1]
    assert task_gpus(loc, {"SLURM_STEP_GPUS": "1,0-4094,2"}, 0, 1) == []     # 4097 entries


def test_list_entries_are_stripped_of_unicode_white_space():
    """Entries may carry white space around them, Unicode's as str.strip() knows it
    (what the rules were first written with), not inside a range."""
    loc = locality(make_node(numa=2, gpus_per_numa=2))
    for blank in (" ", "\t", "\x1c", "\x85", "\xa0", "\u1680", "\u2000", "\u200a", "\u2028",
                  "\u202f", "\u205f", "\u3000"):
        env = {"SLURM_STEP_GPUS": f"{blank}1{blank},{blank}2-3{blank}{blank}"}
        assert ids(task_gpus(loc, env, 0, 1)) == [1, 2, 3], repr(blank)
    for not_blank in ("\u200b", "\ufffd", "\u2000\u0301"):
        assert task_gpus(loc, {"SLURM_STEP_GPUS": f"1{not_blank}"}, 0, 1) == [], repr(not_blank)
    assert task_gpus(loc, {"SLURM_STEP_GPUS": "1 - 2"}, 0, 1) == []
    env = {"SLURM_STEP_GPUS": "0-3", "SLURM_GPUS_PER_TASK": "h100:\u30002\xa0"}
    assert ids(task_gpus(loc, env, 1, 2)) == [2, 3]


def test_numbers_of_any_size_are_exact():
    """Leading zeros count for nothing; a number of 19 digits or more names no GPU,
    and a range between two such numbers is as long as it is."""
    loc = locality(make_node(numa=2, gpus_per_numa=2))
    assert ids(task_gpus(loc, {"SLURM_STEP_GPUS": "0000000000000000000000001"}, 0, 1)) == [1]
    huge = "18446744073709551616"
    assert task_gpus(loc, {"SLURM_STEP_GPUS": huge}, 0, 1) == []
    # one huge GPU in the step: CUDA_VISIBLE_DEVICES 0,1 is not all of the step's GPUs
    env = {"SLURM_STEP_GPUS": f"0,1,{huge}", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert ids(task_gpus(loc, env, 1, 2)) == [0, 1]
    # 4093 entries and then 4 of 20 digits: a range may make the list 4096 long, not more
    big = "99999999999999999990"
    assert task_gpus(loc, {"SLURM_STEP_GPUS": f"0-4092,{big}-99999999999999999993"}, 0, 1) == []
    assert ids(task_gpus(loc, {"SLURM_STEP_GPUS": f"0-4091,{big}-99999999999999999993"},
                         0, 1))[:2] == [0, 1]
    assert ids(task_gpus(loc, {"SLURM_STEP_GPUS": f"1,{big}-9"}, 0, 1)) == [1]   # backwards: none
    # the task's share from a per-task count of any size: N mod GPUs
    env = {"SLURM_STEP_GPUS": "0-3", "SLURM_GPUS_PER_TASK": "99999999999999999999999"}
    assert ids(task_gpus(loc, env, 1, 2)) == [3, 0, 1, 2]


def test_uuid_lists_up_to_4096_entries_name_gpus():
    loc = locality(MINI)
    env = {"SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": ",".join(["GPU-0001"] * 4096)}
    assert ids(task_gpus(loc, env, 0, 1)) == [1] * 4096
    b = plan_task(loc, env, mode="prefer", local_task=0, ntasks=1, allowed=range(4))
    assert b.env_value() == "prefer;gpus=" + ",".join(["1"] * 4096) + ";cpus=2-3;mems=1"
    # more is no GPU list (as for numbers): the step's GPUs, as without the variable
    env["CUDA_VISIBLE_DEVICES"] += ",GPU-0001"
    assert ids(task_gpus(loc, env, 0, 1)) == [0, 1]


def test_a_uuid_outside_the_step_is_unknown():
    """As a number outside the step is: the task is never bound to another GPU's
    CPUs and memory (the planner once took GPU 1 for a step of GPU 0)."""
    loc = locality(MINI)
    env = {"SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": ",".join(["GPU-0001"] * 5000)}
    assert ids(task_gpus(loc, env, 0, 1)) == [0]
    env["CUDA_VISIBLE_DEVICES"] = "GPU-0001"
    b = plan_task(loc, env, mode="prefer", local_task=0, ntasks=1, allowed=range(4))
    assert b.env_value() == "prefer;gpus=0;cpus=0-1;mems=0"


def test_memory_nodes_slurm_bound_are_only_narrowed():
    node = make_node(numa=2, gpus_per_numa=2)            # GPUs 0,1 on NUMA 0; 2,3 on NUMA 1
    loc = locality(node)
    env = {"SLURM_STEP_GPUS": "1,2"}                     # one GPU on each NUMA node
    plan = plan_task(loc, env, mode="strict", local_task=0, ntasks=1, allowed=range(8),
                     bound_nodes=(1,))
    assert plan.mems == (1,) and plan.cpus == (0, 1, 2, 3)
    assert plan_task(loc, env, mode="strict", local_task=0, ntasks=1, allowed=range(8)).mems == (0, 1)
    with pytest.raises(BindingError, match="local to NUMA 0 but Slurm bound the memory of task 0 to NUMA 1 "):
        plan_task(loc, {"SLURM_STEP_GPUS": "0,1"}, mode="strict", local_task=0, ntasks=1,
                  allowed=range(8), bound_nodes=(1,))
    # a bound node no GPU is local to counts for none
    p = plan_task(loc, env, mode="prefer", local_task=0, ntasks=1, allowed=range(8), bound_nodes=(3,))
    assert not p.applied and "to NUMA none" in p.warning
    p = plan_task(loc, env, mode="prefer", local_task=0, ntasks=1, allowed=range(8), bound_nodes=())
    assert not p.applied and "to NUMA none" in p.warning


def test_numa_node_map_names_the_host_nodes_of_the_policy():
    """[spank] numa_node_map: the plan's mems stay the model's (SLURM_GPU_BINDING), the
    policy gets the host's, and a bound policy is read in host nodes."""
    loc = locality(MINI)
    b = plan_task(loc, {"SLURM_STEP_GPUS": "0,1"}, mode="strict", local_task=0, ntasks=1,
                  allowed=range(4), numa_map={1: 5})
    assert (b.mems, b.host_mems) == ((0, 1), (0, 5)) and b.env_value().endswith("mems=0-1")
    b = plan_task(loc, {"SLURM_STEP_GPUS": "0,1"}, mode="strict", local_task=0, ntasks=1,
                  allowed=range(4), numa_map={1: 5}, bound_nodes=(5,))
    assert (b.mems, b.host_mems) == ((1,), (5,))


def test_gres_conf_device_nvml_lacks_never_shifts_the_binding_to_another_gpu():
    """gres.conf lists /dev/nvidia7 first, NVML has only minors 0 and 1 (a GPU fell off the
    bus after slurmd started).  Slurm's GPU 0 is /dev/nvidia7: binding it to minor 1's NUMA
    node would bind to another GPU; Slurm's GPU 1 is still minor 0."""
    loc = locality(MINI, [7, 0, 1])
    allowed = range(4)
    with pytest.raises(BindingError, match="Slurm GPU 0 is not a GPU of this node"):
        plan_task(loc, {"SLURM_STEP_GPUS": "0"}, mode="strict", local_task=0, ntasks=1,
                  allowed=allowed)
    b = plan_task(loc, {"SLURM_STEP_GPUS": "0"}, mode="prefer", local_task=0, ntasks=1,
                  allowed=allowed)
    assert not b.applied and "not a GPU of this node" in b.warning
    b = plan_task(loc, {"SLURM_STEP_GPUS": "1"}, mode="strict", local_task=0, ntasks=1,
                  allowed=allowed)
    assert b.gpus == (0,) and b.cpus == (0, 1) and b.mems == (0,)
    b = plan_task(loc, {"SLURM_STEP_GPUS": "2"}, mode="strict", local_task=0, ntasks=1,
                  allowed=allowed)
    assert b.gpus == (1,) and b.cpus == (2, 3) and b.mems == (1,)
