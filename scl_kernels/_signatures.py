"""One argument list read by several callables: a call's arguments bound by name to a signature
(the fused ops' fake kernels bind theirs to the op's schema, the reference backend its own), so
that no callable restates the list."""
import inspect
from typing import Any, Dict, Mapping, Tuple


def bind_arguments(signature: inspect.Signature, args: Tuple[Any, ...],
                   kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """A call's arguments by their names in ``signature``, the defaults filled in; the
    TypeError of a Python call for arguments that it does not take."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments
