"""A walk of the run's configuration: from `runtime.run.train_on_rank`, follow the whole
`TrainConfig` wherever it is handed on, and count the steps that climb back up the book:
a function of an earlier chapter's file that receives the whole run configuration (so that
a reader of that earlier file must already know the run's flags).

Static (nothing is imported or run): a value is "the run's configuration" when it is the
parameter that received it, or an attribute named `cfg` of anything (`self.cfg`,
`trainer.cfg`). A step is a call that passes it as an argument, or a method called on it;
the callee is found through the module's imports. `python tests/config_walk.py` prints the
walk; tests/test_layers.py bounds its climbs.
"""
from __future__ import annotations

import ast

import test_layers as layers

START = ("minipar.runtime.run", "train_on_rank", "cfg")
CONFIG_CLASS = ("minipar.plan.config", "TrainConfig")


def _functions(tree) -> dict[str, ast.FunctionDef]:
    """'f' and 'Class.method' of a module."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            out.update({f"{node.name}.{f.name}": f for f in node.body if isinstance(f, ast.FunctionDef)})
    return out


class Package:
    def __init__(self):
        self.mods = layers.modules()
        self.trees = {n: ast.parse(p.read_text()) for n, p in self.mods.items()}
        self.funcs = {n: _functions(t) for n, t in self.trees.items()}

    def imported(self, module: str) -> dict[str, tuple[str, str | None]]:
        """name -> (module, attribute or None for a module) for the in-package imports."""
        out, pkg = {}, module.split(".")
        if self.mods[module].name != "__init__.py":
            pkg = pkg[:-1]
        for node in self.trees[module].body:
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    out[a.asname or a.name] = (full, None) if full in self.mods else (base, a.name)
        return out

    def resolve(self, module: str, call: ast.Call, cls: str | None):
        """(module, function key) of an in-package callee, or None."""
        f, names = call.func, self.imported(module)
        if isinstance(f, ast.Name):
            if f.id in self.funcs[module] or f"{f.id}.__init__" in self.funcs[module]:
                return module, f.id if f.id in self.funcs[module] else f"{f.id}.__init__"
            if f.id in names and names[f.id][1]:
                mod, attr = names[f.id]
                if mod in self.funcs:
                    key = attr if attr in self.funcs[mod] else f"{attr}.__init__"
                    return (mod, key) if key in self.funcs[mod] else None
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            base = f.value.id
            if base in names and names[base][1] is None:
                mod = names[base][0]
                key = f.attr if f.attr in self.funcs.get(mod, {}) else f"{f.attr}.__init__"
                return (mod, key) if key in self.funcs.get(mod, {}) else None
            if base == "self" and cls and f"{cls}.{f.attr}" in self.funcs[module]:
                return module, f"{cls}.{f.attr}"
        return None


def _is_config(expr, names: set[str]) -> bool:
    return (isinstance(expr, ast.Name) and expr.id in names) or \
        (isinstance(expr, ast.Attribute) and expr.attr == "cfg")


def _pairs(node):
    """(target name, value) of an assignment, element by element for `a, b = x, y`."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for t in targets:
        if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):
            yield from ((e.id, v) for e, v in zip(t.elts, node.value.elts) if isinstance(e, ast.Name))
        elif isinstance(t, ast.Name):
            yield t.id, node.value


def _tracked(fn, param: str) -> tuple[set[str], set[str]]:
    """(names bound to the configuration, names of objects built from it: `run = Trainer(cfg)`)."""
    names, holders = {param}, set()
    for _ in range(3):                                   # a few rounds reach the fixpoint
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
                continue
            for name, value in _pairs(node):
                if _is_config(value, names):
                    names.add(name)
                elif isinstance(value, ast.Call) and any(
                        _is_config(a, names) or (isinstance(a, ast.Name) and a.id in holders)
                        for a in value.args):
                    holders.add(name)
    return names, holders


def walk(pkg: Package | None = None):
    """Every step of the walk: (caller module, caller, callee module, callee)."""
    pkg = pkg or Package()
    steps, seen, todo = [], set(), [START]
    while todo:
        module, key, param = todo.pop()
        if (module, key, param) in seen:
            continue
        seen.add((module, key, param))
        fn, cls = pkg.funcs[module][key], key.split(".")[0] if "." in key else None
        names, holders = _tracked(fn, param)
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Attribute) and _is_config(f.value, names):    # cfg.method()
                mod, meth = CONFIG_CLASS[0], f"{CONFIG_CLASS[1]}.{f.attr}"
                if meth in pkg.funcs[mod]:
                    steps.append((module, key, mod, meth))
                    todo.append((mod, meth, "self"))
                continue
            args = list(node.args) + [k.value for k in node.keywords]
            hits = [i for i, a in enumerate(args) if _is_config(a, names)
                    or (isinstance(a, ast.Name) and a.id in holders)]
            callee = pkg.resolve(module, node, cls) if hits else None
            if callee is None:
                continue
            steps.append((module, key, *callee))
            target = pkg.funcs[callee[0]][callee[1]]
            params = [a.arg for a in target.args.args]
            offset = 1 if params and params[0] == "self" else 0
            for i in hits:
                if i < len(node.args) and i + offset < len(params):
                    todo.append((callee[0], callee[1], params[i + offset]))
                elif i >= len(node.args):
                    todo.append((callee[0], callee[1], node.keywords[i - len(node.args)].arg))
        if key.endswith(".__init__"):        # the object holds the configuration: its methods
            todo += [(module, k, "self") for k in pkg.funcs[module] if k.startswith(cls + ".")]
    return steps


def climbs(steps=None) -> list[tuple]:
    """The steps into a function of an earlier chapter's file than the caller's."""
    mods, titles = layers.modules(), layers.chapter_titles()
    chapter = lambda m: layers.chapter_of(m, mods, titles)  # noqa: E731
    steps = walk() if steps is None else steps
    return sorted({s for s in steps if s[0] != s[2] and chapter(s[2]) < chapter(s[0])})


if __name__ == "__main__":
    all_steps = walk()
    up = climbs(all_steps)
    for s in sorted(set(all_steps)):
        print(("UP  " if s in up else "    ") + f"{s[0]}.{s[1]} -> {s[2]}.{s[3]}")
    print(f"{len(set(all_steps))} steps, {len(up)} climb back up the book")
