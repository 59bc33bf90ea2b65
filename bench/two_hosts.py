#!/usr/bin/env python3
"""Two hosts against one: the default config's model and data on 2 ranks, first both on this host
(fasttrain launch), then one on each of two hosts made of network namespaces joined by a veth pair
(root only; the tests' DistRun.*TwoHosts* make the same). Prints, per dist.zero, samples/s and step
time on one host and on two, the bytes each rank sent per step, and the time from a SIGKILL of rank 1
to rank 0's exit.

    sudo python3 bench/two_hosts.py --cli build/bin/fasttrain --steps 300

The veth pair is a kernel link between namespaces, not a wire: the figures are the cost of leaving
loopback for a real interface and a second network stack, not of a network.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HOSTS = ("ftbencha", "ftbenchb")
ADDRESSES = ("10.214.0.1", "10.214.0.2")


def sh(command, check=True):
    return subprocess.run(command, shell=True, check=check, capture_output=True, text=True)


def make_hosts():
    a, b = HOSTS
    sh(f"ip netns add {a}; ip netns add {b}; ip link add {a} type veth peer name {b}")
    for host, address in zip(HOSTS, ADDRESSES):
        sh(f"ip link set {host} netns {host}; ip -n {host} link set lo up; ip -n {host} link set {host} up;"
           f" ip -n {host} addr add {address}/24 dev {host}")


def remove_hosts():
    for host in HOSTS:
        sh(f"for p in $(ip netns pids {host} 2>/dev/null); do kill -9 $p; done; ip netns del {host}", check=False)


def rank_on_host(cli, rank, port, args):
    host = HOSTS[rank]
    return (f"ip netns exec {host} env GLOO_SOCKET_IFNAME={host} RANK={rank} WORLD_SIZE=2 LOCAL_RANK=0 "
            f"LOCAL_WORLD_SIZE=1 MASTER_ADDR={ADDRESSES[0]} MASTER_PORT={port} {cli} train {args}")


def summary(run_dir):
    with open(os.path.join(run_dir, "summary.json")) as f:
        data = json.load(f)
    return data["train_samples_per_s"], data["dist"]["bytes_sent_per_step"]


def two_host_run(cli, args, run_dir, port):
    ranks = [subprocess.Popen(rank_on_host(cli, r, port, args + f" --run-dir {run_dir}"), shell=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    for rank in ranks:
        _, err = rank.communicate()
        if rank.returncode != 0:
            sys.exit(f"a two-host rank failed:\n{err}")


def time_to_exit_after_kill(cli, args, run_dir, port):
    ranks = [subprocess.Popen(rank_on_host(cli, r, port, args + f" --run-dir {run_dir}"), shell=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
             for r in (0, 1)]
    metrics = os.path.join(run_dir, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline:
        if os.path.exists(metrics) and '"step":50}' in open(metrics).read():
            break
        time.sleep(0.01)
    pids = sh(f"ip netns pids {HOSTS[1]}").stdout.split()
    for pid in pids:
        os.kill(int(pid), signal.SIGKILL)
    killed = time.perf_counter()
    ranks[0].wait()
    waited = time.perf_counter() - killed
    ranks[1].wait()
    return waited, ranks[0].returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cli", default="build/bin/fasttrain")
    parser.add_argument("--config", default="configs/default.toml")
    parser.add_argument("--steps", type=int, default=300)
    options = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("two_hosts.py makes network namespaces: run it as root")
    cli = os.path.abspath(options.cli)
    common = (f"{options.config} --set train.max_steps={options.steps} --set train.stop_at_target=false "
              "--set train.eval_every_steps=0 --set data.batch_size=64 --set train.threads=1 "
              "--set log.progress=none")
    work = tempfile.mkdtemp(prefix="two_hosts.")
    remove_hosts()
    make_hosts()
    try:
        print("| dist.zero | one host samples/s | two hosts samples/s | ratio | bytes sent per step |")
        print("|---|---|---|---|---|")
        for zero, extra in ((0, ""), (3, " --set optim.name=adamw")):
            args = f"{common} --set dist.zero={zero}{extra}"
            local = os.path.join(work, f"local{zero}")
            sh(f"{cli} launch --nproc 2 -- {cli} train {args} --run-dir {local}")
            remote = os.path.join(work, f"hosts{zero}")
            two_host_run(cli, args, remote, 29700 + zero)
            (one, bytes_one), (two, bytes_two) = summary(local), summary(remote)
            print(f"| {zero} | {one:,.0f} | {two:,.0f} | {two / one:.2f}x | {bytes_two:,} |")
        args = f"{common} --set train.max_steps=1000000 --set dist.timeout_s=30"
        waited, code = time_to_exit_after_kill(cli, args, os.path.join(work, "killed"), 29710)
        print(f"\nrank 1 SIGKILLed at step 50: rank 0 exited {waited:.2f} s later with code {code}")
    finally:
        remove_hosts()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
