"""One argument list read by several callables: a function that takes another's parameters
(explain takes supcon_loss's), and a call's arguments bound by name to a signature (the fused
ops' fake kernels bind theirs to the op's schema, the reference backend its own), so that no
callable restates the list."""
import inspect
from typing import Any, Callable, Dict, Mapping, ParamSpec, Tuple, TypeVar

_Parameters = ParamSpec("_Parameters")
_Result = TypeVar("_Result")


def same_parameters(source: Callable[_Parameters, Any]
                    ) -> Callable[[Callable[..., _Result]], Callable[_Parameters, _Result]]:
    """Decorator for a function written ``def f(*args: Any, **kwargs: Any) -> R``: it takes
    ``source``'s parameters. Type checkers read them from the ParamSpec; ``inspect.signature``,
    ``help`` and ``typing.get_type_hints`` from the signature and annotations copied here, the
    function keeping its own return annotation. The function reads its arguments with
    :func:`bind_arguments`."""
    signature = inspect.signature(source)
    annotations = {name: annotation for name, annotation
                   in inspect.get_annotations(source, eval_str=True).items() if name != "return"}

    def decorate(function: Callable[..., _Result]) -> Callable[_Parameters, _Result]:
        returns = inspect.signature(function).return_annotation
        # setattr: mypy declares neither attribute on a Callable.
        setattr(function, "__signature__", signature.replace(return_annotation=returns))
        setattr(function, "__annotations__", {**annotations, "return": returns})
        return function
    return decorate


def bind_arguments(signature: inspect.Signature, args: Tuple[Any, ...],
                   kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """A call's arguments by their names in ``signature``, the defaults filled in; the
    TypeError of a Python call for arguments that it does not take."""
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments
