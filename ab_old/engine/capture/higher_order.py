"""Higher-order ops: `torch.cond` and the `torch.func` transforms (grad, grad_and_value,
vjp, jvp, jacrev, jacfwd, hessian, vmap, functional_call).

Each call is ONE graph node whose target is a small function of ours (`func_grad`,
`func_vmap`, `cond`, ...) that performs the call on the user's function. The capture runs
it on FakeTensors (so its output shapes are known, and a function that cannot be traced
breaks now, naming it); the eager backend runs the real transform; AOT's make_fx traces
through it into aten ops (torch.cond becomes `torch.ops.higher_order.cond` with its two
branch graphs).

That is only right when the user's function is a pure function of its tensor arguments:
  - a function made in the compiled frame (a lambda, a nested def) may close over tensors
    of the frame: they become extra arguments of the node (lifted), so gradients flow to
    them and the graph reads their current values. Its other cells must hold constants or
    functions that pass the same checks.
  - a function made outside (a global def) may read constants, torch and math, and other
    functions that pass the same checks, each guarded (ID_MATCH, EQUALS_MATCH) so that a
    rebinding recompiles; it may not read a tensor, an nn.Module or any other object from
    its globals or closure (the graph would bake it in: no gradient, stale values).
  - no function may write globals, nonlocals or attributes, nor call print/open/...
Everything else is a graph break naming the transform and the reason, so the call runs
eagerly with the real values: never a wrong result."""

from __future__ import annotations

import builtins
import dis
import inspect
import types

import torch
import torch.func
import torch.utils._pytree as pytree

from .graph_breaks import GraphBreak
from .variables import (CellVariable, ConstantVariable, DictVariable, FunctionVariable, ListVariable,
                        NestedFunctionVariable, ObjectVariable, TensorVariable, TupleVariable)

COND_OP = torch.ops.higher_order.cond

# transforms that return a function: f -> transformed f (options bound now, called later)
WRAPPING = {
    torch.func.grad: "grad",
    torch.func.grad_and_value: "grad_and_value",
    torch.func.jacrev: "jacrev",
    torch.func.jacfwd: "jacfwd",
    torch.func.hessian: "hessian",
    torch.func.vmap: "vmap",
}

_SAFE_MODULES = {"torch", "math", "cmath", "operator", "functools", "itertools", "collections", "typing", "numbers",
                 "einops", "builtins"}
_BANNED_BUILTINS = {"print", "open", "input", "exec", "eval", "compile", "setattr", "delattr", "globals", "locals",
                    "vars", "breakpoint", "id", "hash", "__import__", "exit", "quit", "help"}
_WRITES = {"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_ATTR", "DELETE_ATTR"}
_MAX_DEPTH = 4


class Refused(Exception):
    """Why a user function is not treated as a pure function of its arguments."""


# ---------------------------------------------------------------------- the variable


class TransformVariable(ObjectVariable):
    """`torch.func.grad(f, ...)` before it is called: the transform, the function variable
    and the options (Python constants). `value` is the real transformed function where the
    user's function is a real one (so the generated code can rebuild it when it escapes the
    graph), else None (rebuilding it is a graph break)."""

    def __init__(self, transform, name: str, fn_vt, options: tuple, kw_options: dict, value=None):
        super().__init__(value, cls=types.FunctionType)
        self.transform, self.name, self.fn_vt = transform, name, fn_vt
        self.options, self.kw_options = options, kw_options

    def __repr__(self):
        return f"TransformVariable(torch.func.{self.name})"

    def call(self, tx, args, kwargs):
        """`torch.func.grad(f)(*args, **kwargs)`: one node."""
        what = f"torch.func.{self.name}"
        pure = resolve(tx, self, what)
        return _emit(tx, f"func_{self.name}", pure, lambda fn, a, k: fn(*a, **k), args, kwargs, what)


def make_transform(name: str, transform):
    def handler(tx, args, kwargs):
        what = f"torch.func.{name}"
        if not args:
            raise GraphBreak("GB0012", f"{what} without a function")
        fn_vt, rest = args[0], args[1:]
        options, kw_options = _constants(tx, rest, kwargs, what)
        try:
            inspect.signature(transform).bind(None, *options, **kw_options)
        except TypeError as exc:
            raise GraphBreak("GB0012", f"{what} called with {exc}") from None
        resolve(tx, fn_vt, what)  # a function that is refused breaks here, where the frame can be split
        value = None
        if isinstance(fn_vt, FunctionVariable) and fn_vt.source is not None:
            value = transform(fn_vt.fn, *options, **kw_options)
        elif isinstance(fn_vt, TransformVariable) and fn_vt.value is not None:
            value = transform(fn_vt.value, *options, **kw_options)
        return TransformVariable(transform, name, fn_vt, options, kw_options, value)
    return handler


def _constants(tx, args, kwargs, what):
    try:
        return tuple(tx.as_python(a) for a in args), {k: tx.as_python(v) for k, v in kwargs.items()}
    except GraphBreak:
        raise GraphBreak("GB0012", f"{what} with options that are not Python constants") from None


# ---------------------------------------------------------------------- direct calls


def call_jvp(tx, args, kwargs):
    """jvp(f, primals, tangents, *, strict=False, has_aux=False) -> (out, jvp_out[, aux])."""
    what = "torch.func.jvp"
    if len(args) < 3:
        raise GraphBreak("GB0012", f"{what} without primals and tangents")
    pure = resolve(tx, args[0], what)
    options, kw_options = _constants(tx, args[3:], kwargs, what)

    def run(fn, a, k):
        return torch.func.jvp(fn, a[0], a[1], *options, **kw_options)
    return _emit(tx, "func_jvp", pure, run, [args[1], args[2]], {}, what)


def call_vjp(tx, args, kwargs):
    """`out, vjp_fn = vjp(f, *primals)`: the output is one node (f itself); `vjp_fn(ct)` is
    a second node that runs vjp again on the same primals and applies it to `ct`. f runs
    twice, so a function with random ops is refused."""
    what = "torch.func.vjp"
    if not args:
        raise GraphBreak("GB0012", f"{what} without a function")
    options, kw_options = _constants(tx, [], kwargs, what)
    if set(kw_options) - {"has_aux"}:
        raise GraphBreak("GB0012", f"{what} with options {sorted(kw_options)}")
    has_aux = bool(kw_options.get("has_aux", False))
    fn_vt, primals = args[0], list(args[1:])
    pure = resolve(tx, fn_vt, what)

    def forward(fn, a, k):
        out = torch.func.vjp(fn, *a, has_aux=has_aux)
        return (out[0], out[2]) if has_aux else out[0]
    result = _emit(tx, "func_vjp_out", pure, forward, primals, {}, what, refuse_random=True)
    vjp_fn = VjpFnVariable(fn_vt, primals, has_aux, _versions(primals))
    if has_aux:
        return TupleVariable([result.items[0], vjp_fn, result.items[1]])
    return TupleVariable([result, vjp_fn])


class VjpFnVariable(ObjectVariable):
    """The `vjp_fn` that `torch.func.vjp` returned (no real value: rebuilding it is a break)."""

    def __init__(self, fn_vt, primals, has_aux, versions):
        super().__init__(None, cls=types.FunctionType)
        self.fn_vt, self.primals, self.has_aux, self.versions = fn_vt, primals, has_aux, versions

    def __repr__(self):
        return "VjpFnVariable()"

    def call(self, tx, args, kwargs):
        what = "the vjp_fn of torch.func.vjp"
        if kwargs:
            raise GraphBreak("GB0012", f"{what} with keyword arguments")
        if _versions(self.primals) != self.versions:
            # eager's vjp_fn uses the primals as they were (or raises); the node would recompute
            raise GraphBreak("GB0012", f"{what} after a primal was modified in place")
        pure = resolve(tx, self.fn_vt, "torch.func.vjp")
        n = len(self.primals)
        has_aux = self.has_aux

        def backward(fn, a, k):
            return torch.func.vjp(fn, *a[:n], has_aux=has_aux)[1](*a[n:])
        return _emit(tx, "func_vjp_apply", pure, backward, self.primals + list(args), {}, what)


def _versions(vts) -> list:
    out = []
    for v in vts:
        if isinstance(v, TensorVariable):
            out.append(v.fake._version)
        elif isinstance(v, (TupleVariable, ListVariable)):
            out.append(_versions(v.items))
        elif isinstance(v, DictVariable):
            out.append(_versions(list(v.items.values())))
    return out


def call_functional_call(tx, args, kwargs):
    """functional_call(module, parameter_and_buffer_dicts, args=None, kwargs=None, *,
    tie_weights=True, strict=False)."""
    what = "torch.func.functional_call"
    names = ["module", "parameter_and_buffer_dicts", "args", "kwargs", "tie_weights", "strict"]
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise GraphBreak("GB0012", f"{what} with argument {k!r}")
        bound[k] = v
    if "module" not in bound or "parameter_and_buffer_dicts" not in bound:
        raise GraphBreak("GB0012", f"{what} without a module and a dict")
    mod_vt, dicts = bound["module"], bound["parameter_and_buffer_dicts"]
    options = _constants(tx, [], {k: bound[k] for k in ("tie_weights", "strict") if k in bound}, what)[1]
    module = mod_vt.value if isinstance(mod_vt, ObjectVariable) else None
    if not isinstance(module, torch.nn.Module) or mod_vt.source is None:
        raise GraphBreak("GB0012", f"{what} of something that is not an nn.Module reached from the frame's inputs")
    if not isinstance(dicts, DictVariable) or not all(isinstance(k, str) for k in dicts.items):
        raise GraphBreak("GB0012", f"{what} with parameters that are not one dict with string keys")
    fargs = bound.get("args", ConstantVariable(None))
    fkwargs = bound.get("kwargs", ConstantVariable(None))
    if isinstance(fargs, ConstantVariable) and fargs.value is None:
        fargs = TupleVariable([])
    if not isinstance(fargs, (TupleVariable, ListVariable)):
        fargs = TupleVariable([fargs])  # a single tensor, as functional_call accepts
    if isinstance(fkwargs, ConstantVariable) and fkwargs.value is None:
        fkwargs = DictVariable({})
    if not isinstance(fkwargs, DictVariable):
        raise GraphBreak("GB0012", f"{what} with kwargs that are not a dict")
    try:
        _check_module(tx, module, mod_vt.source, what)
    except Refused as exc:
        raise GraphBreak("GB0012", f"{what} of {type(module).__name__}: {exc}") from None
    # the module's own tensors that the dict leaves out are read by functional_call from the
    # module: passed explicitly (graph inputs with their sources) so that the graph does not
    # bake them in; tied ones (the same tensor as a key that is given) follow the given key
    given = {id(t) for k, t in _named_tensors(module) if k in dicts.items}
    keys = list(dicts.items)
    values = list(dicts.items.values())
    for name, t in _named_tensors(module):
        if name in dicts.items or (id(t) in given and options.get("tie_weights", True)):
            continue
        vt = tx.out.builder.wrap_sourceless(t)
        if not isinstance(vt, TensorVariable) or vt.source is None:
            raise GraphBreak("GB0012", f"{what}: the module's tensor {name} has no source")
        keys.append(name)
        values.append(vt)
    n = len(keys)
    nargs = len(fargs.items)
    kwnames = list(fkwargs.items)

    def run(fn, a, k):
        params = dict(zip(keys, a[:n]))
        return torch.func.functional_call(module, params, tuple(a[n:n + nargs]),
                                          dict(zip(kwnames, a[n + nargs:])), **options)
    pure = Pure(lambda lifted: None, [], type(module).__name__)
    return _emit(tx, "func_functional_call", pure, run, values + list(fargs.items) + list(fkwargs.items.values()),
                 {}, what)


def _named_tensors(module):
    for name, t in module.named_parameters(remove_duplicate=False):
        yield name, t
    for name, t in module.named_buffers(remove_duplicate=False):
        yield name, t


def _check_module(tx, module, source, what):
    from .source import AttrSource
    if module._forward_hooks or module._forward_pre_hooks or _global_hooks():
        raise Refused("it has forward hooks")
    stack = [(module, source)]
    while stack:
        mod, src = stack.pop()
        if mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks or \
                getattr(mod, "_backward_pre_hooks", None):
            raise Refused(f"its submodule {type(mod).__name__} has hooks")
        for k, v in vars(mod).items():
            if k in _MODULE_INTERNALS and k != "training":
                continue
            if isinstance(v, torch.Tensor):
                raise Refused(f"it holds the tensor attribute {k} (neither parameter nor buffer)")
            if _plain(v):   # read by forward: the graph bakes it in, so a change recompiles
                tx.out.add_guard("EQUALS_MATCH", AttrSource(src, k), v)
            elif _is_torch_op(v) or (isinstance(v, types.FunctionType) and _is_torch_fn(v)):
                tx.out.add_guard("ID_MATCH", AttrSource(src, k), v)
            else:
                raise Refused(f"its submodule {type(mod).__name__} holds the attribute {k} "
                              f"(a {type(v).__name__} object)")
        forward = getattr(type(mod).forward, "__func__", type(mod).forward)
        if isinstance(forward, types.FunctionType) and not _is_torch_fn(forward):
            Checker(tx).function(forward, None, 1, f"{type(mod).__name__}.forward")
        for name, child in mod._modules.items():
            if child is not None:
                stack.append((child, AttrSource(src, name)))


_MODULE_INTERNALS = set(vars(torch.nn.Module()))


def _global_hooks():
    import torch.nn.modules.module as m
    return any(getattr(m, n, None) for n in ("_global_forward_hooks", "_global_forward_pre_hooks"))


# ---------------------------------------------------------------------- torch.cond


def call_cond(tx, args, kwargs):
    """torch.cond(pred, true_fn, false_fn, operands): a Python predicate picks the branch now
    (traced inline, as torch.cond itself calls it); a tensor predicate is one node calling
    torch.ops.higher_order.cond, whose branches make_fx traces into two subgraphs."""
    names = ["pred", "true_fn", "false_fn", "operands"]
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise GraphBreak("GB0012", f"torch.cond with argument {k!r}")
        bound[k] = v
    if len(bound) < 3:
        raise GraphBreak("GB0012", "torch.cond without a predicate and two branches")
    pred, true_fn, false_fn = bound["pred"], bound["true_fn"], bound["false_fn"]
    operands = bound.get("operands", TupleVariable([]))
    if not isinstance(operands, (TupleVariable, ListVariable)):
        raise GraphBreak("GB0012", "torch.cond with operands that are not a tuple or list")
    if not isinstance(pred, TensorVariable):
        value = pred.value if isinstance(pred, ConstantVariable) else None
        if not isinstance(value, (bool, int, float, torch.SymBool, torch.SymInt)):
            raise GraphBreak("GB0012", f"torch.cond with a predicate of type {pred.python_type().__name__}")
        return tx.call(true_fn if tx.truth(pred) else false_fn, list(operands.items), {})
    if not all(isinstance(o, TensorVariable) for o in operands.items):
        raise GraphBreak("GB0012", "torch.cond with operands that are not all tensors")
    true_pure = resolve(tx, true_fn, "torch.cond (true_fn)")
    false_pure = resolve(tx, false_fn, "torch.cond (false_fn)")
    n_ops, n_true = len(operands.items), len(true_pure.lifted)
    # cond's branches may not close over tensors: the lifted ones are extra operands, and each
    # branch is rebuilt from the operands it is given (make_fx traces each with its own
    # proxies). An operand is passed once (cond refuses aliased operands): `where` maps the
    # branches' operands, then their lifted tensors, to positions in the deduplicated list.
    unique: list = []
    where: list = []
    for v in list(operands.items) + true_pure.lifted + false_pure.lifted:
        i = next((j for j, u in enumerate(unique) if u.proxy.node is v.proxy.node), None)
        if i is None:
            i = len(unique)
            unique.append(v)
        where.append(i)
    # Branches return a flat tuple of tensors (as cond's autograd wants); the structure is put
    # back around the result. The first run (the capture's, on FakeTensors, both branches)
    # refuses a branch that returns an operand or a view of one, as cond does under AOT.
    spec: list = [None]
    checked = set()

    def branch(pure, offset, name):
        def run_branch(*a):
            full = [a[i] for i in where]
            out = pure.build(full[offset:offset + len(pure.lifted)])(*full[:n_ops])
            leaves, tree = pytree.tree_flatten(out)
            if name not in checked:
                _check_branch_outputs(leaves, a, name)
                checked.add(name)
            spec[0] = tree
            return tuple(leaves)
        run_branch.__name__ = name
        return run_branch
    true_branch = branch(true_pure, n_ops, "true_fn")
    false_branch = branch(false_pure, n_ops + n_true, "false_fn")
    _cond_under_capture_modes()

    def run(_, a, k):
        out = COND_OP(a[0], true_branch, false_branch, tuple(a[1:]))
        return pytree.tree_unflatten(list(out), spec[0])
    pure = Pure(lambda lifted: None, [], "cond")
    return _emit(tx, "cond", pure, run, [pred] + unique, {}, "torch.cond")


def _check_branch_outputs(leaves, operands, name):
    storages = set()
    for t in operands:
        if isinstance(t, torch.Tensor):
            try:
                storages.add(t.untyped_storage()._cdata)
            except Exception:
                pass
    for t in leaves:
        if not isinstance(t, torch.Tensor):
            raise RuntimeError(f"torch.cond's {name} returns a {type(t).__name__}, not a tensor")
        try:
            same = t.untyped_storage()._cdata in storages
        except Exception:
            same = False
        if same:
            raise RuntimeError(f"torch.cond's {name} returns one of its operands or a view of one "
                               f"(return a copy: .clone())")


_REGISTERED: set = set()


def _cond_under_capture_modes():
    """The capture runs each call under a dispatch mode of its own that records writes
    (output_graph._WriteRecorder); a HigherOrderOperator needs a rule for every mode it
    meets: cond runs on below it (its branches may not write their operands anyway)."""
    from .output_graph import _WriteRecorder
    if _WriteRecorder in _REGISTERED:
        return
    COND_OP.py_impl(_WriteRecorder)(lambda mode, *args, **kwargs: COND_OP(*args, **kwargs))
    _REGISTERED.add(_WriteRecorder)


# ---------------------------------------------------------------------- the node


class Pure:
    """A user function as a pure function: `build(lifted_values)` makes the real callable
    (the lifted tensors, real, fake or traced, in the place of the captured ones)."""

    def __init__(self, build, lifted: list, name: str):
        self.build, self.lifted, self.name = build, lifted, name


def _emit(tx, name, pure: Pure, run, args, kwargs, what, refuse_random=False):
    from .tensor_ops import convertible
    args = list(args)
    if not convertible(args, kwargs):
        raise GraphBreak("GB0012", f"{what} with arguments that are not tensors or constants")
    n = len(pure.lifted)
    build = pure.build

    def target(*all_args, **kw):
        lifted, rest = all_args[:n], all_args[n:]
        return run(build(list(lifted)), rest, kw)
    target.__name__ = target.__qualname__ = name
    target.__module__ = __name__
    if refuse_random:
        target = _RandomCheck(target)
    result = tx.tensor_call("call_function", target, list(pure.lifted) + args, kwargs)
    if refuse_random and target.saw_random:
        raise GraphBreak("GB0012", f"{what} of {pure.name}, which calls random ops (it would run twice)")
    return result


class _RandomCheck:
    """Wraps a target for its capture-time run: records whether a random op ran."""

    def __init__(self, target):
        self.target, self.saw_random, self.watched = target, False, False
        self.__name__ = self.__qualname__ = target.__name__
        self.__module__ = __name__

    def __call__(self, *args, **kwargs):
        from torch.utils._python_dispatch import TorchDispatchMode
        if self.watched:   # only the capture's run is watched
            return self.target(*args, **kwargs)
        self.watched = True
        check = self

        class Watch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
                if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
                    check.saw_random = True
                return func(*args, **(kwargs or {}))
        with Watch():
            return self.target(*args, **kwargs)


# ---------------------------------------------------------------------- resolving user functions


def resolve(tx, fn_vt, what: str) -> Pure:
    try:
        return Checker(tx).pure(fn_vt, 0)
    except Refused as exc:
        raise GraphBreak("GB0012", f"{what} of a function that {exc}") from None


def _is_torch_fn(fn) -> bool:
    mod = getattr(fn, "__module__", None) or ""
    return mod == "torch" or mod.startswith("torch.")


def _is_torch_op(v) -> bool:
    from .tensor_ops import is_torch_op
    try:
        return v is not None and is_torch_op(v)
    except Exception:
        return False


def _make_cell(value):
    return (lambda: value).__closure__[0]


class Checker:
    def __init__(self, tx):
        self.tx = tx
        self.seen: set = set()

    # ---- variables (what the frame holds)

    def pure(self, fn_vt, depth) -> Pure:
        if depth > _MAX_DEPTH:
            raise Refused("nests functions too deeply")
        if isinstance(fn_vt, TransformVariable):
            inner = self.pure(fn_vt.fn_vt, depth + 1)
            transform, options, kw_options = fn_vt.transform, fn_vt.options, fn_vt.kw_options
            return Pure(lambda lifted: transform(inner.build(lifted), *options, **kw_options), inner.lifted,
                        f"torch.func.{fn_vt.name}({inner.name})")
        if isinstance(fn_vt, FunctionVariable):
            fn = fn_vt.fn
            if fn_vt.source is None:
                raise Refused(f"is {fn.__qualname__}, reached by no guarded path")
            self.function(fn, fn_vt.source, depth, fn.__qualname__)
            return Pure(lambda lifted: fn, [], fn.__qualname__)
        if isinstance(fn_vt, NestedFunctionVariable):
            return self.nested(fn_vt, depth)
        if isinstance(fn_vt, ObjectVariable) and _is_torch_op(fn_vt.value):
            op = fn_vt.value
            return Pure(lambda lifted: op, [], getattr(op, "__name__", repr(op)))
        if isinstance(fn_vt, ObjectVariable) and isinstance(fn_vt.value, torch.nn.Module):
            raise Refused(f"is the module {type(fn_vt.value).__name__}, which holds its parameters "
                          f"(pass them explicitly with torch.func.functional_call)")
        raise Refused(f"is a {fn_vt.python_type().__name__} (only Python functions are supported)")

    def nested(self, fn_vt: NestedFunctionVariable, depth) -> Pure:
        code, name = fn_vt.code, fn_vt.qualname
        self.code(code, name)
        self.globals_of(code, fn_vt.f_globals, fn_vt.globals_source, depth, name)
        if fn_vt.kwdefaults is not None and fn_vt.kwdefaults.items:
            raise Refused(f"is {name}, with keyword-only defaults")
        defaults = None
        if fn_vt.defaults is not None:
            if not all(isinstance(d, ConstantVariable) and _plain(d.value) for d in fn_vt.defaults.items):
                raise Refused(f"is {name}, with defaults that are not constants")
            defaults = tuple(d.value for d in fn_vt.defaults.items)
        lifted: list = []
        cells: list = []  # ("const", value) | ("lift", index) | ("fn", Pure, offset)
        for cname, cell in zip(code.co_freevars, fn_vt.closure or ()):
            v = cell.value if isinstance(cell, CellVariable) else None
            if v is None:
                raise Refused(f"closes over {cname}, an empty or unknown cell")
            if isinstance(v, TensorVariable):
                cells.append(("lift", len(lifted)))
                lifted.append(v)
            elif isinstance(v, ConstantVariable):
                if not _plain(v.value):
                    raise Refused(f"closes over {cname}, a symbolic or non-constant value")
                cells.append(("const", v.value))
            elif isinstance(v, (FunctionVariable, NestedFunctionVariable, TransformVariable)):
                inner = self.pure(v, depth + 1)
                cells.append(("fn", inner, len(lifted)))
                lifted.extend(inner.lifted)
            elif isinstance(v, ObjectVariable) and _is_torch_op(v.value):
                cells.append(("const", v.value))
            elif isinstance(v, ObjectVariable) and isinstance(v.value, types.ModuleType):
                self.value(v.value, None, depth, f"closes over the module {cname}", code)
                cells.append(("const", v.value))
            elif isinstance(v, (TupleVariable, ListVariable)) and all(isinstance(x, TensorVariable) for x in v.items) \
                    and isinstance(v, TupleVariable) and v.cls is tuple:
                cells.append(("tuple", len(lifted), len(v.items)))
                lifted.extend(v.items)
            else:
                kind = "tensor" if isinstance(v, TensorVariable) else v.python_type().__name__
                raise Refused(f"closes over {cname} (a {kind})")
        f_globals = fn_vt.f_globals
        co_name = code.co_name

        def build(values):
            closure = []
            for c in cells:
                if c[0] == "const":
                    closure.append(_make_cell(c[1]))
                elif c[0] == "lift":
                    closure.append(_make_cell(values[c[1]]))
                elif c[0] == "tuple":
                    closure.append(_make_cell(tuple(values[c[1]:c[1] + c[2]])))
                else:
                    inner, off = c[1], c[2]
                    closure.append(_make_cell(inner.build(values[off:off + len(inner.lifted)])))
            return types.FunctionType(code, f_globals, co_name, defaults, tuple(closure) if closure else None)
        return Pure(build, lifted, name)

    def code(self, code, label):
        if code not in _CODE_OK:
            _CODE_OK[code] = _check_code(code, label)
        if _CODE_OK[code] is not None:
            raise Refused(_CODE_OK[code])

    # ---- real functions and the values they read

    def function(self, fn, source, depth, label):
        """A real function made outside the frame: its code, the globals it reads and its
        closure cells, guarded through `source` (its cells) and its module (its globals)."""
        from .calls import _globals_source_for
        from .source import AttrSource, GetItemSource
        if _is_torch_fn(fn) or fn in self.seen:
            return
        self.seen.add(fn)
        if depth > _MAX_DEPTH:
            raise Refused(f"calls functions too deeply nested ({label})")
        if getattr(fn, "_engine_orig", None) is not None or getattr(fn, "_engine_disabled", False):
            raise Refused(f"calls {label}, an engine.compile'd or disabled function")
        if fn.__kwdefaults__:
            raise Refused(f"calls {label}, with keyword-only defaults")
        for d in fn.__defaults__ or ():
            if not _plain(d):
                raise Refused(f"calls {label}, whose defaults are not constants")
        self.code(fn.__code__, label)
        self.globals_of(fn.__code__, fn.__globals__, _globals_source_for(fn, source), depth, label)
        for i, (cname, cell) in enumerate(zip(fn.__code__.co_freevars, fn.__closure__ or ())):
            try:
                content = cell.cell_contents
            except ValueError:
                raise Refused(f"calls {label}, which closes over the empty cell {cname}") from None
            csrc = None
            if source is not None:
                csrc = AttrSource(GetItemSource(AttrSource(source, "__closure__"), i), "cell_contents")
            self.value(content, csrc, depth, f"closes over {cname}" + ("" if depth == 0 else f" (in {label})"),
                       fn.__code__)

    def globals_of(self, code, f_globals, globals_source, depth, label):
        for name in sorted(_names(code)):
            if name in f_globals:
                src = globals_source(name) if callable(globals_source) else None
                self.value(f_globals[name], src, depth, f"reads the global {name}" +
                           ("" if depth == 0 else f" (in {label})"), code)
            elif name in _BANNED_BUILTINS and name in vars(builtins):
                raise Refused(f"calls the builtin {name}" + ("" if depth == 0 else f" (in {label})"))

    def value(self, v, source, depth, what, code):
        """One value a function reads from outside; guarded through `source`."""
        builder = self.tx.out.builder
        if isinstance(v, torch.Tensor):
            raise Refused(what.replace(" the global ", " the global tensor ").replace("closes over ", "closes over the tensor "))
        if isinstance(v, torch.nn.Module):
            raise Refused(f"{what}, an nn.Module (its parameters would be baked into the graph)")
        if isinstance(v, types.ModuleType):
            top = v.__name__.split(".")[0]
            if top not in _SAFE_MODULES:
                raise Refused(f"{what}, the module {v.__name__} (what it reads from there is not checked)")
            return
        if _plain(v):
            if source is None:
                raise Refused(f"{what}, a value that cannot be guarded")
            vt = builder.wrap(v, source)
            if isinstance(vt, ConstantVariable) and not _plain(vt.value):
                raise Refused(f"{what}, a value made dynamic")
            return
        if isinstance(v, types.FunctionType):
            if source is None and not _is_torch_fn(v):
                raise Refused(f"{what}, a function that cannot be guarded")
            if source is not None:
                builder.wrap(v, source)
            self.function(v, source, depth + 1, v.__qualname__)
            return
        if isinstance(v, (types.BuiltinFunctionType, torch._ops.OpOverloadPacket, torch._ops.OpOverload)) or \
                (isinstance(v, type) and (v.__module__ in ("builtins", "torch") or v.__module__.startswith("torch."))):
            if getattr(v, "__name__", None) in _BANNED_BUILTINS and getattr(v, "__module__", "") == "builtins":
                raise Refused(f"{what}, the builtin {v.__name__}")
            if source is not None:
                builder.wrap(v, source)
            return
        raise Refused(f"{what}, a {type(v).__name__} object")


def _plain(v) -> bool:
    from .builder import is_constant_value
    return is_constant_value(v) and not isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) and \
        not _has_symbolic(v)


def _has_symbolic(v) -> bool:
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(v, (tuple, list, torch.Size)):
        return any(_has_symbolic(x) for x in v)
    return False


def _codes(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _names(code) -> set:
    names = set()
    for c in _codes(code):
        names.update(c.co_names)
    return names


_CODE_OK: dict = {}


def _check_code(code, label):
    outer_free = set(code.co_freevars)
    for c in _codes(code):
        for inst in dis.get_instructions(c):
            if inst.opname in _WRITES:
                what = "writes the global" if "GLOBAL" in inst.opname else "writes the attribute"
                return f"{what} {inst.argval} ({label})"
            if inst.opname in ("STORE_DEREF", "DELETE_DEREF") and inst.argval in outer_free:
                return f"writes the nonlocal {inst.argval} ({label})"
            if inst.opname in ("YIELD_VALUE", "RETURN_GENERATOR"):
                return f"is a generator ({label})"
    return None




# ---------------------------------------------------------------------- registration


def special_functions() -> dict:
    table = {t: make_transform(name, t) for t, name in WRAPPING.items()}
    table[torch.func.jvp] = call_jvp
    table[torch.func.vjp] = call_vjp
    table[torch.func.functional_call] = call_functional_call
    table[torch.cond] = call_cond
    return table


def is_call_variable(fn) -> bool:
    return isinstance(fn, (TransformVariable, VjpFnVariable))
