"""Memory: the peak a call adds above what was allocated before it (scl_kernels.profiling's
PeakMemory, re-exported so benchmarks import it from the harness) and the memory still free."""
import torch

from scl_kernels.profiling import PeakMemory

__all__ = ["PeakMemory", "available_bytes"]


def available_bytes(device):
    """Memory a new allocation can still get on ``device``."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil
    return psutil.virtual_memory().available
