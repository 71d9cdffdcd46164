"""The `torch.compile` backend "tpu": Dynamo hands over an FX graph, and
AOTAutograd splits it into functional forward and backward graphs of ATen
ops (and inference graphs), each of which `_program` turns into a program
that replays.

A graph that autograd has no part in (grad mode off, plain device tensors:
an optimizer step, inference under no_grad) skips AOTAutograd: its capture
runs Dynamo's graph through the dispatcher, which records the same ATen ops
AOTAutograd's trace would have, in-place writes included. AOTAutograd's
second trace took ~1.3 s of a GPT's first compiled step (its AdamW step)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from rtpu._program import Program, Pair


def _answer_cuda_graph_checks_without_inductor() -> None:
    """Dynamo asks of each gradient of an optimizer it traces whether CUDA
    graphs hold it at a static address, and imports all of Inductor
    (`torch._inductor.cudagraph_trees`) to answer, for any device: 1.2-1.4 s
    of the first compiled optimizer step in every process, measured here.
    For a tensor not on CUDA its answer is always True; this gives that
    answer without the import, and leaves CUDA tensors to PyTorch's check.
    Installed when Dynamo first looks up the "tpu" backend (this module's
    import), before it traces anything for it."""
    from torch._dynamo.variables import optimizer

    check = optimizer._is_static_for_cudagraphs

    def is_static_for_cudagraphs(x: torch.Tensor) -> bool:
        return check(x) if x.is_cuda else True

    optimizer._is_static_for_cudagraphs = is_static_for_cudagraphs


_answer_cuda_graph_checks_without_inductor()


def _compiler(name: str, pair: Pair) -> Callable:
    def compile_graph(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
        from functorch.compile import make_boxed_func

        return make_boxed_func(Program(gm, name, pair))

    return compile_graph


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """The `tpu` backend of `torch.compile`."""
    from torch._dynamo.backends.common import aot_autograd

    attributes = _tensor_attributes(gm)
    if _autograd_has_no_part(gm, example_inputs, attributes):
        return _without_autograd(gm, attributes)
    pair = Pair()
    return aot_autograd(
        fw_compiler=_compiler("forward", pair),
        bw_compiler=_compiler("backward", pair),
        inference_compiler=_compiler("inference", pair),
        # Mutations stay in inference graphs (optimizer steps), where they
        # become in-place writes of the inputs' storages.
        keep_inference_input_mutations=True,
    )(gm, example_inputs, **kwargs)


def _tensor_attributes(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, torch.Tensor]:
    """The tensors Dynamo put in the graph as attributes (an optimizer's
    parameters and state, which it guards by identity), by node."""
    attributes = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        value: Any = gm
        for part in node.target.split("."):
            value = getattr(value, part)
        if isinstance(value, torch.Tensor):
            attributes[node] = value
    return attributes


def _autograd_has_no_part(
    gm: torch.fx.GraphModule, example_inputs: list[Any], attributes: dict[torch.fx.Node, torch.Tensor]
) -> bool:
    """Whether AOTAutograd would only hand back an inference graph whose
    capture records what running `gm` does: grad mode is off and no op in
    the graph turns it on, every input and tensor attribute is a plain
    tensor on tpu (subclasses, CPU tensors and symbolic sizes, which arrive
    as SymInt inputs, are for AOTAutograd and `_program`'s host part and
    buckets), and the graph reads no other attribute and calls no module
    (whose parameters a capture would bake in; AOTAutograd lifts them to
    inputs). Dynamo itself applies in-place changes of an input's shape or
    strides outside its graph, so none reach a replay."""
    if torch.is_grad_enabled():
        return False
    for value in list(example_inputs) + list(attributes.values()):
        if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.device.type != "tpu":
            return False
    for node in gm.graph.nodes:
        if node.op == "call_module" or (node.op == "get_attr" and node not in attributes):
            return False
        if node.target is torch._C._set_grad_enabled and node.args[:1] != (False,):
            return False
    return True


def _without_autograd(gm: torch.fx.GraphModule, attributes: dict[torch.fx.Node, torch.Tensor]) -> Callable:
    """Dynamo's graph as a program, its tensor attributes passed as inputs
    after the graph's own (a capture binds only inputs to its program; an
    attribute would be baked in at its value then)."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in gm.graph.find_nodes(op="placeholder"):
        env[node] = graph.node_copy(node, env.__getitem__)
    for i, node in enumerate(attributes):
        env[node] = graph.placeholder(f"attribute_{i}")
    for node in gm.graph.nodes:
        if node not in env:
            env[node] = graph.node_copy(node, env.__getitem__)
    program = Program(torch.fx.GraphModule(gm, graph), "inference", Pair())
    inputs_after = tuple(attributes.values())

    def run(*args: Any) -> Any:
        return program(*args, *inputs_after)

    # As AOTAutograd's result is: Dynamo must not trace the replay.
    return torch._dynamo.disable(run, reason="rtpu replays the captured graph")
