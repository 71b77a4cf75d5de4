"""Methods of lists, tuples, dicts, sets and iterators, over variables. Mutations of a
container that existed before the frame are recorded for replay after the graph."""

from __future__ import annotations

from .builder import wrap_constant
from .graph_breaks import GraphBreak
from .variables import (ConstantVariable, DictVariable, DictViewVariable, IteratorVariable, ListVariable, ObjectVariable, SetVariable,
                        TupleVariable)


def container_method(tx, obj, name, args, kwargs):
    if isinstance(obj, ListVariable):
        return list_method(tx, obj, name, args, kwargs)
    if isinstance(obj, TupleVariable):
        if obj.is_namedtuple() and name == "_replace":
            from .calls import namedtuple_replace
            return namedtuple_replace(tx, [obj], kwargs)
        if obj.is_namedtuple() and name == "_asdict":
            from .calls import namedtuple_asdict
            return namedtuple_asdict(tx, [obj], kwargs)
        if name == "index":
            return _index(tx, obj, args)
        if name == "count":
            return ConstantVariable(sum(1 for x in obj.items if tx.truth(tx.binary(__import__("operator").eq, x, args[0]))))
        if name == "__len__":
            return ConstantVariable(len(obj.items))
        if name == "__getitem__":
            return tx.getitem(obj, args[0])
    if isinstance(obj, DictVariable):
        return dict_method(tx, obj, name, args, kwargs)
    if isinstance(obj, SetVariable):
        return set_method(tx, obj, name, args, kwargs)
    if isinstance(obj, IteratorVariable) and name == "__next__":
        v = obj.next()
        if v is None:
            raise tx.exception(StopIteration, "")
        return v
    raise GraphBreak("GB0011", f"method {name} of {type(obj).__name__}"
                               f"{' ' + type(obj.value).__name__ if isinstance(obj, ObjectVariable) else ''}")


def _index(tx, obj, args):
    import operator
    for i, x in enumerate(obj.items):
        if tx.is_same(x, args[0]) or tx.truth(tx.binary(operator.eq, x, args[0])):
            return ConstantVariable(i)
    raise tx.exception(ValueError, "x not in list")


def list_method(tx, lst: ListVariable, name, args, kwargs):
    out = tx.out
    if isinstance(lst, DictViewVariable) and name not in ("__len__", "__contains__", "__iter__", "isdisjoint"):
        raise GraphBreak("GB0011", f"dict view method {name}")
    if name == "append":
        lst.items.append(args[0])
    elif name == "extend":
        lst.items.extend(tx.unpack(args[0]))
    elif name == "insert":
        lst.items.insert(tx.as_python(args[0]), args[1])
    elif name == "pop":
        if not lst.items:
            raise tx.exception(IndexError, "pop from empty list")
        i = tx.as_python(args[0]) if args else -1
        v = lst.items.pop(i)
        out.note_mutation(lst)
        return v
    elif name == "remove":
        i = _index(tx, lst, args).value
        del lst.items[i]
    elif name == "clear":
        lst.items.clear()
    elif name == "reverse":
        lst.items.reverse()
    elif name == "sort":
        from .calls import bi_sorted
        lst.items[:] = bi_sorted(tx, [lst], kwargs).items
    elif name == "copy":
        return ListVariable(list(lst.items))
    elif name == "index":
        return _index(tx, lst, args)
    elif name == "count":
        import operator
        return ConstantVariable(sum(1 for x in lst.items if tx.is_same(x, args[0]) or
                                    tx.truth(tx.binary(operator.eq, x, args[0]))))
    elif name == "__len__":
        return ConstantVariable(len(lst.items))
    elif name == "__getitem__":
        return tx.getitem(lst, args[0])
    elif name == "__setitem__":
        tx.setitem(lst, args[0], args[1])
    else:
        raise GraphBreak("GB0011", f"list.{name}")
    out.note_mutation(lst)
    return ConstantVariable(None)


def dict_update(tx, d: DictVariable, args, kwargs) -> None:
    """`d.update(*args, **kwargs)` on a traced dict (also what `dict(...)` builds)."""
    if args:
        src = args[0]
        if isinstance(src, DictVariable):
            d.items.update(src.items)
        else:
            for pair in tx.unpack(src):
                k, v = tx.unpack(pair)
                d.items[tx.dict_key(k)] = v
    d.items.update(kwargs)


def dict_method(tx, d: DictVariable, name, args, kwargs):
    out = tx.out
    if name == "keys":
        return _KeysView(tx, d)
    if name == "values":
        return DictViewVariable(list(d.items.values()), d, "values")
    if name == "items":
        return DictViewVariable([TupleVariable([tx.key_to_vt(k), v]) for k, v in d.items.items()], d, "items")
    if name == "get":
        k = tx.dict_key(args[0])
        if d.has(k):
            return d.item(k)
        return args[1] if len(args) > 1 else ConstantVariable(None)
    if name == "__getitem__":
        return tx.getitem(d, args[0])
    if name == "__contains__":
        return ConstantVariable(d.has(tx.dict_key(args[0])))
    if name == "copy":
        return DictVariable(dict(d.items))
    if name == "__len__":
        return ConstantVariable(len(d.items))
    if name == "update":
        dict_update(tx, d, args, kwargs)
    elif name == "setdefault":
        k = tx.dict_key(args[0])
        if k in d.items:
            return d.items[k]
        d.items[k] = args[1] if len(args) > 1 else ConstantVariable(None)
        out.note_mutation(d)
        return d.items[k]
    elif name == "pop":
        k = tx.dict_key(args[0])
        if k in d.items:
            v = d.items.pop(k)
            out.note_mutation(d)
            return v
        if len(args) > 1:
            return args[1]
        raise tx.exception(KeyError, repr(k))
    elif name == "popitem":
        if not d.items:
            raise tx.exception(KeyError, "popitem(): dictionary is empty")
        k = list(d.items)[-1]
        v = d.items.pop(k)
        out.note_mutation(d)
        return TupleVariable([tx.key_to_vt(k), v])
    elif name == "clear":
        d.items.clear()
    elif name == "__setitem__":
        tx.setitem(d, args[0], args[1])
    else:
        raise GraphBreak("GB0011", f"dict.{name}")
    out.note_mutation(d)
    return ConstantVariable(None)


def _KeysView(tx, d):
    # keys() is iterated or tested with `in`: a list of the keys is enough for both
    return DictViewVariable([tx.key_to_vt(k) for k in d.items], d, "keys")


def set_method(tx, s: SetVariable, name, args, kwargs):
    out = tx.out
    if name == "add":
        tx.set_add(s, args[0])
    elif name == "update":
        for a in args:
            for x in tx.unpack(a):
                tx.set_add(s, x)
    elif name == "discard":
        k = tx.dict_key(args[0])
        if k in s.items:
            s.items.remove(k)
    elif name == "remove":
        k = tx.dict_key(args[0])
        if k not in s.items:
            raise tx.exception(KeyError, repr(k))
        s.items.remove(k)
    elif name == "clear":
        s.items.clear()
    elif name in ("union", "intersection", "difference", "symmetric_difference", "issubset", "issuperset",
                  "isdisjoint", "copy", "__contains__", "__len__"):
        other = [set(tx.as_python(a)) for a in args]
        r = getattr(set(s.items), name)(*other)
        if isinstance(r, set):
            return SetVariable(list(r))
        return wrap_constant(r)
    else:
        raise GraphBreak("GB0011", f"set.{name}")
    if s.source is not None:
        raise GraphBreak("GB0017", "mutation of a set passed in")
    return ConstantVariable(None)
