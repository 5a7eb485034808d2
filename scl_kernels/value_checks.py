"""When the fused op reports NaN / inf in its input on an accelerator.

The check runs on the device and its verdict is read without making the host wait (a wait would
drain the device's queue every step): at the end of the call when the device has already run
it, otherwise at the start of the first later call of the op, forward or backward, that finds it
done. The call that received the values returns a non-finite loss meanwhile. On the CPU the
error always comes from that call. ``SCL_VALUE_CHECKS=end_of_call`` makes the host wait at the
end of each forward instead (the error from the call itself, at the cost of one wait a step);
``SCL_VALUE_CHECKS=next_call`` always reports at the next call (the late case, on any device).
"""
import torch

from ._extension import require_library


def raise_deferred_value_errors() -> None:
    """Waits for the fused op's NaN / inf checks that earlier calls left running on a device and
    raises the first failure as the ``ValueError`` the call would have raised (naming the
    argument); returns None when every input was finite or nothing is pending. Call it where
    the host waits anyway (after ``loss.item()``, before saving a checkpoint) to learn of bad
    input no later than there.
    """
    require_library()
    torch.ops.scl.raise_deferred_value_errors()
