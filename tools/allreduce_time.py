"""NCCL all-reduce latency on this host's GPUs, for the tensor-parallel figures.

Runs one process a GPU (torch.distributed, NCCL) and times float32 all-reduces of the sizes a
split decode step makes: hidden_size values a row for `rows` rows. Prints the median time of
one all-reduce in microseconds, eager and replayed inside a CUDA graph (as pagoda's steps run
them), as JSON on rank 0.

    python3 tools/allreduce_time.py --gpus 4 --hidden 8192 --rows 1
"""
import argparse
import json
import os
import statistics
import sys


def worker(rank, args):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=args.gpus)
    x = torch.ones(args.rows * args.hidden, dtype=torch.float32, device="cuda")
    for _ in range(50):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    reps = args.reps
    eager = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        for _ in range(reps):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        eager.append(start.elapsed_time(end) * 1e3 / reps)
    graph_us = []
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            dist.all_reduce(x)
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        g.replay()
        end.record()
        torch.cuda.synchronize()
        graph_us.append(start.elapsed_time(end) * 1e3 / reps)
    if rank == 0:
        print(json.dumps({"gpus": args.gpus, "values": args.rows * args.hidden,
                          "eager_us": round(statistics.median(eager), 2),
                          "graph_us": round(statistics.median(graph_us), 2)}))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--reps", type=int, default=160)
    args = p.parse_args()
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(args,), nprocs=args.gpus, join=True)


if __name__ == "__main__":
    sys.exit(main())
