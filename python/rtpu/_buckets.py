"""Size buckets for compiled graphs with dynamic dims.

A graph traced with a symbolic size ``s`` (``torch._dynamo.mark_dynamic``, or
Dynamo's automatic dynamic shapes after a size changed) compiles once per
bucket, the next power of two >= s (no larger than a static dim the graph
cuts to s, such as a positions table), instead of once per size. The inputs are
padded with zeros along the dims that ``s`` sizes, the graph runs at the
bucket's size, and the outputs are cut back to ``s``.

The padded positions hold garbage, so every op that mixes positions along a
padded dim is masked with the true size, which enters the executable as a
device input:

- sums, means and contractions (``mm``, ``bmm``, layer norm's and
  embedding's weight gradients) see zeros there, softmax sees ``-inf``,
  ``amax``/``amin`` see the lowest/highest value;
- indices (embedding ids, ``nll_loss`` targets) see 0 or ``ignore_index``.

Ops that work position by position (pointwise ops, views, transposes, layer
norm over unpadded dims) need no mask. A graph with any other op on a padded
dim, or that uses ``s`` as a value rather than a size, is not bucketed: it
compiles once per size, and the warning names the op and its line.

A padded dim can be a merge of several dims (``[2, s, 32]`` viewed as
``[2*s, 32]``). Each dim is kept as its factors ("atoms"), outer to inner:
an ``Integer`` for a static factor, a ``Symbol`` for a padded one. The masks
and the cuts use them to find the valid positions.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any, Callable, Optional

import sympy
import torch

aten = torch.ops.aten

# One dim's factors, outer to inner.
Dim = tuple
# A tensor's dims.
Dims = tuple


class NotBucketable(Exception):
    """The graph cannot run padded; the message says which op and why."""


def bucket_size(size: int) -> int:
    """The size a graph with a dynamic dim of `size` is compiled for."""
    return 1 << max(0, size - 1).bit_length()


def _expr(size: Any) -> sympy.Expr:
    if isinstance(size, (torch.SymInt, torch.SymFloat)):
        return size.node.expr
    return sympy.Integer(size)


def _shape(value: torch.Tensor) -> tuple:
    return tuple(_expr(s) for s in value.shape)


def _padded(dim: Dim) -> bool:
    return any(isinstance(atom, sympy.Symbol) for atom in dim)


def _any_padded(dims: Any) -> bool:
    """Whether a value's dims (None for a non-tensor) have a padded one."""
    return isinstance(dims, tuple) and any(_padded(d) for d in dims)


def _size(dim: Dim) -> sympy.Expr:
    return sympy.Mul(*dim)


def _dim_of_size(size: sympy.Expr) -> Optional[Dim]:
    """A dim known only by its size: static, or exactly one symbol."""
    if size.is_Integer or size.is_Symbol:
        return (size,)
    return None


def _merge_static(atoms: list) -> Dim:
    """Adjacent static factors fold into one; an all-static dim is one atom."""
    merged: list = []
    for atom in atoms:
        if merged and atom.is_Integer and merged[-1].is_Integer:
            merged[-1] = merged[-1] * atom
        else:
            merged.append(atom)
    return tuple(merged) or (sympy.Integer(1),)


def _where(node: torch.fx.Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip().startswith("File ")]
    return f" ({lines[-1]})" if lines else ""


def _is_symbolic(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_is_symbolic(v) for v in value)
    return isinstance(value, torch.fx.Node) and isinstance(
        value.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)
    )


def _on_device_as_is(size: sympy.Expr) -> bool:
    """Whether a size expression is built of sizes and numbers by sums,
    products, float conversions and divisions (a variance's gradient scales
    by 2 / (s - 1)), which the device computes from the true sizes."""
    if isinstance(size, (sympy.Symbol, sympy.Number)):
        return True
    if isinstance(size, (sympy.Mul, sympy.Add)) or type(size).__name__ in ("ToFloat", "FloatTrueDiv"):
        return all(_on_device_as_is(a) for a in size.args)
    return False


_SIZE_TYPES = {"SymInt", "SymInt?", "SymInt[]", "SymInt[]?"}
_declared_types: dict[Any, list[str]] = {}


def _argument_types(op: torch._ops.OpOverload) -> list[str]:
    """Each argument's declared type as the schema spells it (`SymInt[2]`
    read as `SymInt[]`): its Python binding says `int` where the schema says
    `SymInt`."""
    types = _declared_types.get(op)
    if types is None:
        text = str(op._schema)
        declared = text[text.index("(") + 1 : text.rindex(") ->")]
        # Split at the commas outside brackets (defaults can be lists).
        arguments, depth, start = [], 0, 0
        for i, char in enumerate(declared + ","):
            if char in "[(":
                depth += 1
            elif char in "])":
                depth -= 1
            elif char == "," and depth == 0:
                arguments.append(declared[start:i].strip())
                start = i + 1
        types = [re.sub(r"\[\d+\]", "[]", arg.split()[0]) for arg in arguments if arg not in ("*", "")]
        _declared_types[op] = types
    return types


# Ops that make a tensor from sizes alone: symbolic sizes are shapes there.
_FACTORIES = {aten.ones, aten.zeros, aten.full, aten.empty, aten.new_ones, aten.new_zeros, aten.new_empty, aten.new_full}
# Ops whose output is their first input's values, unchanged in place:
# padding never reaches a valid position.
_SAME_DIMS = {aten.clone, aten._to_copy, aten.detach, aten.alias, aten.contiguous, aten.lift_fresh_copy}
_RESHAPES = {aten.view, aten._unsafe_view, aten.reshape}
# Fill values by name, resolved against the masked tensor's dtype.
_ZERO, _LOWEST, _HIGHEST = "zero", "lowest", "highest"


class Plan:
    """What padding a graph needs: each value's dims (atoms), which op
    arguments are masked with what, and which outputs are cut or are sizes.

    `known` maps node names to dims of values computed by another graph:
    a backward graph's saved activations keep their forward node's names.
    The plan adds its own values to it. Inputs named in `arrive_padded` (a
    set its owner may fill later) come padded already: the forward graph
    hands its saved activations to the backward graph as they are."""

    def __init__(self, gm: torch.fx.GraphModule, known: dict[str, Dims], arrive_padded: set[str]) -> None:
        self.arrive_padded = arrive_padded
        self.input_names: list[str] = []
        self.output_names: list[Optional[str]] = []
        self.dims: dict[str, Any] = {}
        self.masks: dict[str, list[tuple[int, Any]]] = {}
        # Ops computed another way on padded inputs, by the Runner method
        # named: means (count only the true positions), batch norm in
        # training (statistics over the true samples).
        self.replaced: dict[str, str] = {}
        # Pointwise ops' scalar operands that are sizes: (argument, size).
        self.size_values: dict[str, list[tuple[int, sympy.Expr]]] = {}
        self.inputs: list[Any] = []  # per placeholder: Dims, a sympy size, or None
        self.outputs: list[Any] = []  # per output: Dims, a sympy size, or None
        self.symbols: set[sympy.Symbol] = set()
        # The largest bucket each size may take, where a static dim is cut to it.
        self.caps: dict[sympy.Symbol, int] = {}
        self._known = known
        for node in gm.graph.nodes:
            try:
                self._visit(node)
            except NotBucketable as e:
                raise NotBucketable(f"{node.target} {e}{_where(node)}") from None
        self.symbols = sorted(self.symbols, key=str)
        unreadable = [s for s in self.symbols if s not in self._readable()]
        if unreadable:
            raise NotBucketable(f"the sizes {unreadable} cannot be read off its inputs")
        known.update({name: dims for name, dims in self.dims.items() if isinstance(dims, tuple)})

    def _readable(self) -> set:
        """Symbols whose true size an input gives: a size input, or a dim
        of a tensor input (other than ones that arrive padded)."""
        readable = set()
        for name, kind in zip(self.input_names, self.inputs):
            if isinstance(kind, sympy.Symbol):
                readable.add(kind)
            elif isinstance(kind, tuple) and name not in self._known:
                # (a forward's value may arrive padded, so its dims do not tell)
                readable |= {dim[0] for dim in kind if len(dim) == 1 and isinstance(dim[0], sympy.Symbol)}
        return readable

    # -- analysis -----------------------------------------------------------

    def _visit(self, node: torch.fx.Node) -> None:
        value = node.meta.get("val")
        if node.op == "placeholder":
            self.input_names.append(node.name)
            if isinstance(value, torch.Tensor):
                dims = self._known.get(node.name)
                if dims is None:
                    dims = tuple(_dim_of_size(s) for s in _shape(value))
                    if None in dims:
                        raise NotBucketable(f"input {node.name} has a dim of size {list(_shape(value))} with an unknown layout")
                self.dims[node.name] = dims
                self.inputs.append(dims)
            elif isinstance(value, torch.SymInt):
                self.inputs.append(_expr(value))
            else:
                self.inputs.append(None)
            for s in (_shape(value) if isinstance(value, torch.Tensor) else [_expr(value)] if isinstance(value, torch.SymInt) else []):
                self.symbols |= s.free_symbols
        elif node.op == "output":
            for out in node.args[0]:
                self.output_names.append(out.name if isinstance(out, torch.fx.Node) else None)
                if isinstance(out, torch.fx.Node) and isinstance(self.dims.get(out.name), tuple):
                    self.outputs.append(self.dims[out.name])
                elif isinstance(out, torch.fx.Node) and isinstance(out.meta.get("val"), torch.SymInt):
                    self.outputs.append(_expr(out.meta["val"]))
                else:
                    self.outputs.append(None)
        elif node.op == "call_function":
            if node.target is operator.getitem and isinstance(self.dims.get(node.args[0].name), list):
                self.dims[node.name] = self.dims[node.args[0].name][node.args[1]]
            elif isinstance(node.target, torch._ops.OpOverload):
                self._check_sizes_used_as_sizes(node)
                self.dims[node.name] = self._op(node)
            elif any(isinstance(self.dims.get(a.name), tuple) for a in node.all_input_nodes):
                raise NotBucketable("is not an ATen op")
        else:
            raise NotBucketable(f"({node.op}) is not an ATen op")

    def _check_sizes_used_as_sizes(self, node: torch.fx.Node) -> None:
        """A symbolic size may shape tensors. As a value it would read the
        bucket's size, not the true one: a pointwise op's scalar operand
        (the division in a mean's gradient) reads the true size from the
        device instead; anywhere else it is refused."""
        packet = node.target.overloadpacket
        types = _argument_types(node.target)
        for i, arg in enumerate(node.target._schema.arguments):
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if not _is_symbolic(value):
                continue
            if packet is aten.arange and arg.name == "end":
                continue  # arange(s): the true positions hold the same values
            if (
                types[i] == "Scalar"
                and i < len(node.args)
                and torch.Tag.pointwise in node.target.tags
                and _on_device_as_is(_expr(value.meta["val"]))
                and _expr(value.meta["val"]).free_symbols <= self.symbols
            ):
                self.size_values.setdefault(node.name, []).append((i, _expr(value.meta["val"])))
                continue
            if types[i] not in _SIZE_TYPES:
                raise NotBucketable(f"uses a dynamic size as its {arg.name} ({types[i]})")

    def _tensor_dims(self, value: Any) -> Optional[Dims]:
        if isinstance(value, torch.fx.Node):
            dims = self.dims.get(value.name)
            return dims if isinstance(dims, tuple) else None
        return None

    def _arg(self, node: torch.fx.Node, i: int, default: Any = None) -> Any:
        return node.args[i] if i < len(node.args) else default

    def _mask(self, node: torch.fx.Node, i: int, fill: Any) -> None:
        if i >= len(node.args) or self._tensor_dims(node.args[i]) is None:
            raise NotBucketable(f"argument {i} is not a tensor passed by position")
        if _any_padded(self._tensor_dims(node.args[i])):
            self.masks.setdefault(node.name, []).append((i, fill))

    def _fresh(self, value: Any) -> Any:
        """Dims of a value made without padded inputs, from its shape."""
        if isinstance(value, (list, tuple)):
            return [self._fresh(v) for v in value]
        if not isinstance(value, torch.Tensor):
            return None
        dims = tuple(_dim_of_size(s) for s in _shape(value))
        if None in dims:
            raise NotBucketable(f"makes a tensor of shape {list(_shape(value))}")
        return dims

    def _op(self, node: torch.fx.Node) -> Any:
        packet = node.target.overloadpacket
        value = node.meta.get("val")
        inputs = [self._tensor_dims(a) for a in node.all_input_nodes]
        padded_inputs = any(_any_padded(d) for d in inputs)
        rule = _RULES.get(packet)
        if rule is not None:
            return rule(self, node, value)
        if torch.Tag.pointwise in node.target.tags:
            return self._broadcast(node, value)
        if packet in _SAME_DIMS:
            return self._tensor_dims(node.args[0])
        if packet in _RESHAPES:
            return self._reshape(self._tensor_dims(node.args[0]), _shape(value))
        if padded_inputs:
            raise NotBucketable("has no rule for padded inputs")
        if any(_is_symbolic(a) for a in node.args) and inputs and packet not in _FACTORIES:
            raise NotBucketable("takes a dynamic size with no rule for it")
        return self._fresh(value)

    def _broadcast(self, node: torch.fx.Node, value: torch.Tensor) -> Dims:
        shape = _shape(value)
        args = [self._tensor_dims(a) for a in node.all_input_nodes]
        out = []
        for i, size in enumerate(shape):
            picked = None
            for dims in args:
                if dims is None or i - (len(shape) - len(dims)) < 0:
                    continue
                dim = dims[i - (len(shape) - len(dims))]
                if _size(dim) != size:
                    continue  # broadcast from 1
                if picked is not None and picked != dim and (_padded(dim) or _padded(picked)):
                    raise NotBucketable(f"combines dims laid out as {picked} and {dim}")
                if picked is None or _padded(dim):
                    picked = dim
            if picked is None:
                picked = _dim_of_size(size)
                if picked is None:
                    raise NotBucketable(f"broadcasts to a dim of size {size}")
            out.append(picked)
        return tuple(out)

    def _reshape(self, dims: Dims, shape: tuple) -> Dims:
        stream = [atom for dim in dims for atom in dim if atom != 1]
        out = []
        for size in shape:
            group: list = []
            product = sympy.Integer(1)
            while product != size:
                rest = sympy.simplify(size / product)
                if not stream or (rest.is_Number and not rest.is_Integer):
                    raise NotBucketable(f"reshapes {dims} to {list(shape)} across a padded dim")
                atom = stream.pop(0)
                if atom.is_Integer and rest.is_Integer and atom != rest and atom % rest == 0:
                    stream.insert(0, atom / rest)
                    atom = rest
                group.append(atom)
                product = product * atom
            out.append(_merge_static(group))
        if stream:
            raise NotBucketable(f"reshapes {dims} to {list(shape)} across a padded dim")
        return tuple(out)

    # -- rules for ops that are not pointwise ---------------------------------

    def _permute(self, node, value):
        dims = self._tensor_dims(node.args[0])
        return tuple(dims[d] for d in node.args[1])

    def _transpose(self, node, value):
        dims = list(self._tensor_dims(node.args[0]))
        a, b = (d % len(dims) for d in node.args[1:3])
        dims[a], dims[b] = dims[b], dims[a]
        return tuple(dims)

    def _t(self, node, value):
        return tuple(reversed(self._tensor_dims(node.args[0])))

    def _expand(self, node, value):
        dims = self._tensor_dims(node.args[0])
        shape = _shape(value)
        offset = len(shape) - len(dims)
        out = []
        for i, size in enumerate(shape):
            if i >= offset and _size(dims[i - offset]) == size:
                out.append(dims[i - offset])
            elif (dim := _dim_of_size(size)) is not None:
                out.append(dim)
            else:
                raise NotBucketable(f"expands to a dim of size {size}")
        return tuple(out)

    def _unsqueeze(self, node, value):
        dims = list(self._tensor_dims(node.args[0]))
        d = node.args[1] % (len(dims) + 1)
        dims.insert(d, (sympy.Integer(1),))
        return tuple(dims)

    def _squeeze(self, node, value):
        dims = self._tensor_dims(node.args[0])
        return self._reshape(dims, _shape(value))

    def _slice(self, node, value):
        dims_before = self._tensor_dims(node.args[0])
        dims = list(dims_before)
        d = self._arg(node, 1, 0) % len(dims)
        start, end, step = self._arg(node, 2), self._arg(node, 3), self._arg(node, 4, 1)
        size = _shape(value)[d]
        if not _padded(dims[d]):
            if _is_symbolic(start) or step != 1:
                raise NotBucketable("slices from a dynamic start")
            # A static dim cut to the dynamic size: valid up to it. The
            # bucket may not outgrow what the dim holds (a positions table
            # of 48 sliced to a length of 40 pads to 48, not 64).
            dims[d] = _dim_of_size(size) or ()
            if not dims[d]:
                raise NotBucketable(f"slices to a size of {size}")
            if isinstance(size, sympy.Symbol):
                room = _size(dims_before[d]) - (start or 0)
                if not room.is_Integer:
                    raise NotBucketable(f"slices a dim of size {_size(dims_before[d])}")
                self.caps[size] = min(int(room), self.caps.get(size, int(room)))
            return tuple(dims)
        if start in (None, 0) and step == 1 and size == _size(dims[d]):
            return tuple(dims)
        raise NotBucketable("slices part of a padded dim")

    def _triangle(self, node, value):
        """tril/triu keep position (i, j) by i and j alone: right where each
        padded dim is one factor, with the padding at its end."""
        dims = self._tensor_dims(node.args[0])
        if any(_padded(d) and len(d) > 1 for d in dims[-2:]):
            raise NotBucketable("keeps a triangle of merged padded dims")
        return dims

    def _select(self, node, value):
        dims = list(self._tensor_dims(node.args[0]))
        d = node.args[1] % len(dims)
        if _padded(dims[d]):
            raise NotBucketable("selects from a padded dim")
        if _is_symbolic(node.args[2]):
            raise NotBucketable("selects at an index computed from a dynamic size")
        del dims[d]
        return tuple(dims)

    def _split(self, node, value):
        dims = self._tensor_dims(node.args[0])
        d = self._arg(node, 2, 0) % len(dims)
        if _padded(dims[d]):
            raise NotBucketable("splits a padded dim")
        if _is_symbolic(node.args[1]):
            raise NotBucketable("splits at sizes computed from a dynamic size")
        return [tuple(dim if i != d else (_shape(v)[d],) for i, dim in enumerate(dims)) for v in value]

    def _cat(self, node, value):
        parts = [self._tensor_dims(t) for t in node.args[0]]
        d = self._arg(node, 1, 0) % len(_shape(value))
        out = list(parts[0])
        for dims in parts[1:]:
            for i, dim in enumerate(dims):
                if i != d and dim != out[i]:
                    raise NotBucketable(f"concatenates dims laid out as {out[i]} and {dim}")
        if _padded(out[d]) or any(_padded(dims[d]) for dims in parts):
            raise NotBucketable("concatenates along a padded dim")
        out[d] = (_shape(value)[d],)
        return tuple(out)

    def _arange(self, node, value):
        return self._fresh(value)

    def _reduced(self, node, value, dims_arg: Any, keepdim: bool, fill: Any) -> Dims:
        dims = self._tensor_dims(node.args[0])
        reduced = range(len(dims)) if dims_arg in (None, []) else [d % len(dims) for d in dims_arg]
        if any(_padded(dims[d]) for d in reduced):
            self._mask(node, 0, fill)
        if keepdim:
            return tuple((sympy.Integer(1),) if i in reduced else dim for i, dim in enumerate(dims))
        return tuple(dim for i, dim in enumerate(dims) if i not in reduced)

    def _sum(self, node, value):
        if node.target is aten.sum.default:
            return self._reduced(node, value, None, False, _ZERO)
        return self._reduced(node, value, self._arg(node, 1), self._arg(node, 2, False), _ZERO)

    def _mean(self, node, value):
        if node.target is aten.mean.default:
            out = self._reduced(node, value, None, False, _ZERO)
        else:
            out = self._reduced(node, value, self._arg(node, 1), self._arg(node, 2, False), _ZERO)
        if node.name in self.masks:
            self.replaced[node.name] = "_mean"
        return out

    def _var(self, node, value):
        """var/std.correction: with a padded dim reduced, the mean and the
        count are over the true positions only."""
        out = self._reduced(node, value, self._arg(node, 1), node.kwargs.get("keepdim", False), _ZERO)
        if node.name in self.masks:
            del self.masks[node.name]  # the replacement masks its own way
            self.replaced[node.name] = "_var"
        return out

    def _amax(self, node, value):
        return self._reduced(node, value, self._arg(node, 1, []), self._arg(node, 2, False), _LOWEST)

    def _amin(self, node, value):
        return self._reduced(node, value, self._arg(node, 1, []), self._arg(node, 2, False), _HIGHEST)

    def _softmax(self, node, value):
        dims = self._tensor_dims(node.args[0])
        if _padded(dims[node.args[1] % len(dims)]):
            self._mask(node, 0, _LOWEST)
        return dims

    def _softmax_backward(self, node, value):
        dims = self._tensor_dims(node.args[0])
        if _padded(dims[node.args[2] % len(dims)]):
            self._mask(node, 0, _ZERO)
            self._mask(node, 1, _ZERO)
        return dims

    def _contract(self, node, a: int, b: int) -> tuple:
        """Operands a [..., M, K] and b [..., K, N]: zeros in a padded K."""
        left, right = self._tensor_dims(node.args[a]), self._tensor_dims(node.args[b])
        if left[-1] != right[-2]:
            raise NotBucketable(f"contracts dims laid out as {left[-1]} and {right[-2]}")
        if _padded(left[-1]):
            self._mask(node, a, _ZERO)
            self._mask(node, b, _ZERO)
        if left[:-2] != right[:-2]:
            raise NotBucketable("batches dims laid out differently")
        return left[:-1] + right[-1:]

    def _mm(self, node, value):
        return self._contract(node, 0, 1)

    def _addmm(self, node, value):
        out = self._contract(node, 1, 2)
        bias = self._tensor_dims(node.args[0])
        if _any_padded(bias) and bias[-len(out):] != out[-len(bias):]:
            raise NotBucketable("adds a bias laid out differently")
        return out

    def _embedding(self, node, value):
        if _any_padded(self._tensor_dims(node.args[0])):
            raise NotBucketable("looks up a padded table")
        self._mask(node, 1, _ZERO)
        return self._tensor_dims(node.args[1]) + ((_shape(value)[-1],),)

    def _embedding_backward(self, node, value):
        if self._arg(node, 4, False):
            raise NotBucketable("scales by index counts, which the padding would change")
        self._mask(node, 0, _ZERO)
        self._mask(node, 1, _ZERO)
        return self._fresh(value)

    def _nll_loss(self, node, value):
        self_dims = self._tensor_dims(node.args[0])
        if len(self_dims) > 1 and _padded(self_dims[1]):
            raise NotBucketable("has padded classes")
        ignore_index = self._arg(node, 4)
        self._mask(node, 1, int(ignore_index))
        reduction = self._arg(node, 3)
        out = self._tensor_dims(node.args[1]) if reduction == 0 else ()
        return [out, ()]

    def _nll_loss_backward(self, node, value):
        self_dims = self._tensor_dims(node.args[1])
        if len(self_dims) > 1 and _padded(self_dims[1]):
            raise NotBucketable("has padded classes")
        self._mask(node, 2, int(self._arg(node, 5)))
        return self_dims

    def _layer_norm(self, node, value):
        dims = self._tensor_dims(node.args[0])
        normalized = len(node.args[1])
        if _any_padded(dims[-normalized:]):
            raise NotBucketable("normalizes over a padded dim")
        stats = dims[:-normalized] + ((sympy.Integer(1),),) * normalized
        return [dims, stats, stats]

    def _layer_norm_backward(self, node, value):
        dims = self._tensor_dims(node.args[1])
        normalized = len(node.args[2])
        if _any_padded(dims[-normalized:]):
            raise NotBucketable("normalizes over a padded dim")
        if _any_padded(dims[:-normalized]):
            # The weight and bias gradients sum over the padded rows.
            for i in (0, 1, 3, 4):
                self._mask(node, i, _ZERO)
        return [dims if isinstance(value[0], torch.Tensor) else None] + self._fresh(list(value[1:]))

    def _per_sample(self, node, value):
        """Ops that work on each index of dim 0 on its own (convolutions,
        pooling, normalisation with fixed statistics): only dim 0 may be
        padded. Their weight gradients sum over dim 0, so those see zeros."""
        tensors = [(i, self._tensor_dims(a)) for i, a in enumerate(node.args) if self._tensor_dims(a) is not None]
        batch = None
        for i, dims in tensors:
            if _any_padded(dims[1:]):
                raise NotBucketable("works on a padded dim other than the batch")
            if dims and _padded(dims[0]):
                if batch is not None and dims[0] != batch:
                    raise NotBucketable(f"combines batches laid out as {batch} and {dims[0]}")
                batch = dims[0]
                if node.target.overloadpacket in _SUMS_OVER_BATCH:
                    self._mask(node, i, _ZERO)

        def dims_of(out: Any) -> Any:
            if not isinstance(out, torch.Tensor):
                return None
            shape = _shape(out)
            if batch is not None and shape and shape[0] == _size(batch):
                return (batch,) + self._fresh(out)[1:]
            return self._fresh(out)

        return [dims_of(v) for v in value] if isinstance(value, (list, tuple)) else dims_of(value)

    def _batch_norm(self, node, value):
        """_native_batch_norm_legit_functional: statistics over dims 0, 2, ...;
        with a padded batch in training they count only the true samples."""
        dims = self._tensor_dims(node.args[0])
        if _any_padded(dims[1:]):
            raise NotBucketable("normalizes a padded dim other than the batch")
        if _padded(dims[0]) and node.args[5]:
            self.replaced[node.name] = "_batch_norm_training"
        return [dims] + self._fresh(list(value[1:]))

    def _batch_norm_backward(self, node, value):
        """native_batch_norm_backward: its weight and bias gradients sum over
        the batch, and in training its input gradient takes means over it."""
        dims = self._tensor_dims(node.args[1])
        if _any_padded(dims[1:]):
            raise NotBucketable("normalizes a padded dim other than the batch")
        if _padded(dims[0]):
            if node.args[7]:
                self.replaced[node.name] = "_batch_norm_training_backward"
            else:
                self._mask(node, 0, _ZERO)
                self._mask(node, 1, _ZERO)
        return [dims if isinstance(value[0], torch.Tensor) else None] + self._fresh(list(value[1:]))

    def _copy_(self, node, value):
        dims = self._tensor_dims(node.args[0])
        if _any_padded(dims) and node.args[0].op == "placeholder":
            raise NotBucketable("writes a padded input")
        return dims


_RULES: dict[Any, Callable] = {
    aten.permute: Plan._permute,
    aten.transpose: Plan._transpose,
    aten.t: Plan._t,
    aten.expand: Plan._expand,
    aten.unsqueeze: Plan._unsqueeze,
    aten.squeeze: Plan._squeeze,
    aten.slice: Plan._slice,
    aten.select: Plan._select,
    aten.tril: Plan._triangle,
    aten.triu: Plan._triangle,
    aten.split: Plan._split,
    aten.split_with_sizes: Plan._split,
    aten.cat: Plan._cat,
    aten.arange: Plan._arange,
    aten.sum: Plan._sum,
    aten.mean: Plan._mean,
    aten.var: Plan._var,
    aten.std: Plan._var,
    aten.amax: Plan._amax,
    aten.amin: Plan._amin,
    aten._softmax: Plan._softmax,
    aten._safe_softmax: Plan._softmax,
    aten._log_softmax: Plan._softmax,
    aten._softmax_backward_data: Plan._softmax_backward,
    aten._log_softmax_backward_data: Plan._softmax_backward,
    aten.mm: Plan._mm,
    aten.bmm: Plan._mm,
    aten.addmm: Plan._addmm,
    aten.embedding: Plan._embedding,
    aten.embedding_dense_backward: Plan._embedding_backward,
    aten.nll_loss_forward: Plan._nll_loss,
    aten.nll_loss_backward: Plan._nll_loss_backward,
    aten.native_layer_norm: Plan._layer_norm,
    aten.native_layer_norm_backward: Plan._layer_norm_backward,
    aten.copy_: Plan._copy_,
    aten._native_batch_norm_legit_functional: Plan._batch_norm,
    aten.native_batch_norm_backward: Plan._batch_norm_backward,
}
_PER_SAMPLE = {
    aten.convolution, aten.convolution_backward, aten.max_pool2d_with_indices,
    aten.max_pool2d_with_indices_backward, aten.avg_pool2d, aten.avg_pool2d_backward,
    aten._adaptive_avg_pool2d, aten._adaptive_avg_pool2d_backward,
    aten._native_batch_norm_legit_no_training,
}
# Of those, the ones whose outputs include a sum over the batch.
_SUMS_OVER_BATCH = {aten.convolution_backward}
_RULES.update({packet: Plan._per_sample for packet in _PER_SAMPLE})


class Sizes:
    """One call's sizes: each symbol's true size, its bucket's, and the true
    size as a device tensor (an input of the bucket's executable)."""

    def __init__(self, plan: "Plan", true: dict, size_tensor: Callable[[int], torch.Tensor]) -> None:
        self.true = true
        self.bucket = {s: min(bucket_size(v), plan.caps.get(s, bucket_size(v))) for s, v in true.items()}
        self.tensors = {s: size_tensor(v) for s, v in sorted(true.items(), key=lambda item: str(item[0]))}
        # Whether any size is short of its bucket: if not, nothing is padded or cut.
        self.padding = self.true != self.bucket

    def extent(self, atom: sympy.Expr, padded: bool = True) -> int:
        if isinstance(atom, sympy.Symbol):
            return self.bucket[atom] if padded else self.true[atom]
        return int(atom)

    def evaluate(self, size: sympy.Expr, padded: bool) -> int:
        return int(size.subs(self.bucket if padded else self.true))


def true_sizes(plan: Plan, args: tuple) -> dict:
    """Each symbol's size in this call, read off the inputs."""
    true: dict = {}
    for name, kind, arg in zip(plan.input_names, plan.inputs, args):
        if name in plan.arrive_padded:
            continue
        if isinstance(kind, sympy.Symbol):
            true[kind] = int(arg)
        elif isinstance(kind, tuple):
            for dim, size in zip(kind, arg.shape):
                if len(dim) == 1 and isinstance(dim[0], sympy.Symbol):
                    true[dim[0]] = int(size)
    return true


def pad_inputs(plan: Plan, args: tuple, sizes: Sizes) -> list:
    """Inputs padded to the bucket, but for those that arrive padded."""
    return _resized(plan.input_names, plan.inputs, args, plan.arrive_padded, sizes, padded=True)


def _resized(
    names: list, kinds: list, values: Any, keep: set[str], sizes: Sizes, padded: bool
) -> list:
    """Each value with a padded dim padded to the bucket (`padded`) or cut
    back to its true size, and each size evaluated likewise; values named in
    `keep` stay as they are."""
    resize = _pad if padded else _cut
    out = []
    for name, kind, value in zip(names, kinds, values):
        if name in keep:
            out.append(value)
        elif isinstance(value, torch.Tensor) and _any_padded(kind) and sizes.padding:
            out.append(resize(value, kind, sizes))
        elif isinstance(kind, sympy.Expr):
            out.append(sizes.evaluate(kind, padded=padded))
        else:
            out.append(value)
    return out


def _atom_shapes(dims: Dims, sizes: Sizes, padded: bool) -> list[int]:
    return [sizes.extent(atom, padded) for dim in dims for atom in dim]


def _pad(tensor: torch.Tensor, dims: Dims, sizes: Sizes) -> torch.Tensor:
    atoms = [atom for dim in dims for atom in dim]
    pads: list[int] = []
    for atom in reversed(atoms):
        pads += [0, sizes.extent(atom) - sizes.extent(atom, padded=False)]
    spread = tensor.reshape(_atom_shapes(dims, sizes, padded=False))
    out = torch.nn.functional.pad(spread, pads)
    return out.reshape([math.prod(sizes.extent(a) for a in dim) for dim in dims])


def padded_outputs(plan: Plan, first: int) -> set[str]:
    """The names of the padded tensors among outputs `first` onwards."""
    return {
        name
        for name, kind in zip(plan.output_names[first:], plan.outputs[first:])
        if _any_padded(kind)
    }


def cut_outputs(plan: Plan, outputs: list, sizes: Sizes, keep_padded: set[str]) -> list:
    """Outputs cut back to the true sizes, but for those named in keep_padded."""
    return _resized(plan.output_names, plan.outputs, outputs, keep_padded, sizes, padded=False)


def _cut(tensor: torch.Tensor, dims: Dims, sizes: Sizes) -> torch.Tensor:
    if all(len(dim) == 1 for dim in dims):
        for d, (atom,) in enumerate(dims):
            if isinstance(atom, sympy.Symbol):
                tensor = tensor.narrow(d, 0, sizes.true[atom])
        return tensor
    spread = tensor.reshape(_atom_shapes(dims, sizes, padded=True))
    for i, atom in enumerate(atom for dim in dims for atom in dim):
        if isinstance(atom, sympy.Symbol):
            spread = spread.narrow(i, 0, sizes.true[atom])
    return spread.reshape([math.prod(sizes.extent(a, padded=False) for a in dim) for dim in dims])


class Runner(torch.fx.Interpreter):
    """Runs a graph on padded inputs, masking the arguments the plan names.
    Under a capture, the masks become part of the one executable; the true
    sizes are its inputs, so every size in the bucket shares it."""

    def __init__(self, gm: torch.fx.GraphModule, plan: Plan, sizes: Sizes) -> None:
        super().__init__(gm)
        self.plan = plan
        self.sizes = sizes
        self.valid_cache: dict[Dims, torch.Tensor] = {}

    def run_node(self, node: torch.fx.Node) -> Any:
        masks = self.plan.masks.get(node.name, [])
        size_values = self.plan.size_values.get(node.name)
        replaced = self.plan.replaced.get(node.name)
        if node.op != "call_function" or not (masks or size_values or replaced):
            return super().run_node(node)
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        args = list(args)
        if size_values is not None:
            for i, size in size_values:
                args[i] = self._true_size(size)
            # The Tensor overload of the same op takes the device value.
            return node.target.overloadpacket(*args, **kwargs)
        for i, fill in masks:
            args[i] = self._masked(args[i], self.plan.dims[node.args[i].name], fill)
        if replaced is not None:
            return getattr(self, replaced)(node, args, kwargs)
        return node.target(*args, **kwargs)

    def _true_size(self, size: sympy.Expr) -> Any:
        """A size expression's true value, computed on the device from the
        true sizes (executable inputs); numbers stay Python numbers."""
        if isinstance(size, sympy.Symbol):
            return self.sizes.tensors[size]
        if size.is_Integer:
            return int(size)
        if size.is_Number:
            return float(size)
        terms = [self._true_size(arg) for arg in size.args]
        kind = type(size).__name__
        if kind == "ToFloat":
            return terms[0].to(torch.float32) if isinstance(terms[0], torch.Tensor) else float(terms[0])
        if kind == "FloatTrueDiv":
            return terms[0] / terms[1]
        combine = operator.mul if isinstance(size, sympy.Mul) else operator.add
        result = terms[0]
        for term in terms[1:]:
            result = combine(result, term)
        return result

    def _valid(self, dims: Dims) -> torch.Tensor:
        """True at the positions within the true sizes, broadcastable to a
        tensor with these dims."""
        valid = self.valid_cache.get(dims)
        if valid is not None:
            return valid
        for d, dim in enumerate(dims):
            if not _padded(dim):
                continue
            extents = [self.sizes.extent(atom) for atom in dim]
            in_dim = None
            for i, atom in enumerate(dim):
                if isinstance(atom, sympy.Symbol):
                    shape = [1] * len(dim)
                    shape[i] = extents[i]
                    limit = self.sizes.tensors[atom]
                    ok = (torch.arange(extents[i], device=limit.device) < limit).reshape(shape)
                    in_dim = ok if in_dim is None else in_dim & ok
            in_dim = in_dim.expand(extents).reshape([1] * d + [math.prod(extents)] + [1] * (len(dims) - d - 1))
            valid = in_dim if valid is None else valid & in_dim
        self.valid_cache[dims] = valid
        return valid

    def _masked(self, tensor: torch.Tensor, dims: Dims, fill: Any) -> torch.Tensor:
        if fill == _ZERO:
            value: Any = False if tensor.dtype == torch.bool else 0
        elif fill in (_LOWEST, _HIGHEST):
            info = torch.finfo(tensor.dtype) if tensor.dtype.is_floating_point else torch.iinfo(tensor.dtype)
            if tensor.dtype.is_floating_point:
                value = -math.inf if fill == _LOWEST else math.inf
            else:
                value = info.min if fill == _LOWEST else info.max
        else:
            value = fill
        return tensor.masked_fill(~self._valid(dims), value)

    def _batch_statistics(self, input_node: torch.fx.Node, x: torch.Tensor) -> tuple:
        """Where x's samples are true, the dims statistics reduce over, the
        per-channel shape to broadcast with, and the true count per channel."""
        valid = self._valid(self.plan.dims[input_node.name])
        reduced = [0] + list(range(2, x.dim()))
        channel = [1, x.shape[1]] + [1] * (x.dim() - 2)
        count = valid.expand(x.shape).sum(reduced).to(torch.float32)
        return valid, reduced, channel, count

    def _batch_norm_training(self, node: torch.fx.Node, args: list, kwargs: dict) -> tuple:
        x, weight, bias, running_mean, running_var, _, momentum, eps = args[:8]
        valid, reduced, channel, count = self._batch_statistics(node.args[0], x)
        xf = x.to(torch.float32)
        mean = xf.masked_fill(~valid, 0).sum(reduced) / count
        centered = (xf - mean.reshape(channel)).masked_fill(~valid, 0)
        var = (centered * centered).sum(reduced) / count
        invstd = torch.rsqrt(var + eps)
        out = (xf - mean.reshape(channel)) * invstd.reshape(channel)
        if weight is not None:
            out = out * weight.reshape(channel)
        if bias is not None:
            out = out + bias.reshape(channel)
        # The running variance is unbiased, as PyTorch's.
        unbiased = var * count / (count - 1)
        new_mean = running_mean * (1 - momentum) + mean.to(running_mean.dtype) * momentum
        new_var = running_var * (1 - momentum) + unbiased.to(running_var.dtype) * momentum
        return out.to(x.dtype), mean, invstd, new_mean, new_var

    def _batch_norm_training_backward(self, node: torch.fx.Node, args: list, kwargs: dict) -> tuple:
        grad, x, weight, _, _, save_mean, save_invstd, _, _, output_mask = args[:10]
        valid, reduced, channel, count = self._batch_statistics(node.args[1], x)
        g = grad.to(torch.float32).masked_fill(~valid, 0)
        xhat = ((x.to(torch.float32) - save_mean.reshape(channel)) * save_invstd.reshape(channel)).masked_fill(~valid, 0)
        sum_g = g.sum(reduced)
        sum_g_xhat = (g * xhat).sum(reduced)
        grad_input = grad_weight = grad_bias = None
        if output_mask[0]:
            scale = save_invstd if weight is None else save_invstd * weight.to(torch.float32)
            grad_input = scale.reshape(channel) * (
                g - (sum_g / count).reshape(channel) - xhat * (sum_g_xhat / count).reshape(channel)
            )
            grad_input = grad_input.to(x.dtype)
        if output_mask[1]:
            grad_weight = sum_g_xhat.to(weight.dtype)
        if output_mask[2]:
            grad_bias = sum_g.to(weight.dtype if weight is not None else x.dtype)
        return grad_input, grad_weight, grad_bias

    def _var(self, node: torch.fx.Node, args: list, kwargs: dict) -> torch.Tensor:
        x = args[0]
        reduced = args[1] if len(args) > 1 and args[1] not in (None, []) else list(range(x.dim()))
        keepdim = kwargs.get("keepdim", False)
        correction = kwargs.get("correction")
        correction = 1 if correction is None else correction
        valid = self._valid(self.plan.dims[node.args[0].name])
        count = valid.expand(x.shape).sum(reduced, keepdim=True).to(x.dtype)
        mean = x.masked_fill(~valid, 0).sum(reduced, keepdim=True) / count
        deviation = (x - mean).masked_fill(~valid, 0)
        var = (deviation * deviation).sum(reduced, keepdim=True) / (count - correction)
        if not keepdim:
            var = var.squeeze(reduced)
        return var.sqrt() if node.target.overloadpacket is aten.std else var

    def _mean(self, node: torch.fx.Node, args: list, kwargs: dict) -> torch.Tensor:
        x = args[0]
        reduced = None if node.target is aten.mean.default else args[1]
        keepdim = False if node.target is aten.mean.default else (args[2] if len(args) > 2 else kwargs.get("keepdim", False))
        dtype = kwargs.get("dtype")
        count = self._valid(self.plan.dims[node.args[0].name]).expand(x.shape)
        if reduced in (None, []):
            total, count = x.sum(dtype=dtype), count.sum()
        else:
            total, count = x.sum(reduced, keepdim, dtype=dtype), count.sum(reduced, keepdim)
        return total / count.to(total.dtype)
