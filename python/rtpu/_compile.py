"""The `torch.compile` backend "tpu": Dynamo hands over an FX graph, and
AOTAutograd splits it into functional forward and backward graphs of ATen
ops (and inference graphs), each of which `_program` turns into a program
that replays."""

from __future__ import annotations

from typing import Any, Callable

import torch

from rtpu._program import Program, Pair


def _compiler(name: str, pair: Pair) -> Callable:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        from functorch.compile import make_boxed_func

        return make_boxed_func(Program(gm, name, pair))

    return compile_graph


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """The `tpu` backend of `torch.compile`."""
    from torch._dynamo.backends.common import aot_autograd

    pair = Pair()
    return aot_autograd(
        fw_compiler=_compiler("forward", pair),
        bw_compiler=_compiler("backward", pair),
        inference_compiler=_compiler("inference", pair),
        # Mutations stay in inference graphs (optimizer steps), where they
        # become in-place writes of the inputs' storages.
        keep_inference_input_mutations=True,
    )(gm, example_inputs, **kwargs)
