"""A training step captured in a CUDA graph, as PyTorch's docs capture a whole network."""
import torch


def capture(step, warmups=3):
    """(graph, what step() returned while captured): step runs ``warmups`` times on a side
    stream first (the allocator's and Triton's autotuning's first calls stay out of the
    capture), then once under capture. Replaying the graph reruns it on the captured tensors."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = step()
    return graph, result
