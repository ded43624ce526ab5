"""The protocol's rules live in asgd.core; its transports only drive them (issue 39): the
MPI Server class stays at most 150 lines, and every SimGrid actor at most 40 lines, in
the style of SimGrid's own examples (a short function over put/get/execute)."""

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "asgd"


def lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def definitions(path: pathlib.Path) -> dict[str, ast.AST]:
    """Every function, method and class of a module by name (methods as Class.name)."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef):
                    out[f"{node.name}.{sub.name}"] = sub
    return out


def actor_bodies() -> set[str]:
    """The functions the simulator starts as actors: whatever sim/run.py takes from
    actors.py as an actor's body, and every callable handed to Actor.create."""
    names = set()
    run = ast.parse((SRC / "sim" / "run.py").read_text())
    for node in ast.walk(run):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "actors" \
                and node.attr[0].islower() and node.attr not in ("World",):
            names.add(node.attr)
    for path in (SRC / "sim").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "create" \
                    and len(node.args) >= 3:
                body = node.args[2]
                if isinstance(body, ast.Name):
                    names.add(body.id)
                elif isinstance(body, ast.Attribute) and isinstance(body.value, ast.Name) and body.value.id == "self":
                    names.add(f"World.{body.attr}")
    return names


def test_every_simulator_actor_is_a_short_driver():
    defs = definitions(SRC / "sim" / "actors.py")
    bodies = actor_bodies()
    assert {"worker", "server", "allreduce_rank"} <= bodies, bodies   # the check sees the actors
    long = {n: lines(defs[n]) for n in bodies if n in defs and lines(defs[n]) > 40}
    assert not long, f"simulator actors over 40 lines: {long}"


def test_the_mpi_server_is_a_thin_transport():
    server = definitions(SRC / "protocol" / "server.py")["Server"]
    assert lines(server) <= 150, f"protocol.server.Server is {lines(server)} lines (at most 150)"


def test_no_protocol_rule_is_spelled_outside_core():
    """The policies and the shard's bookkeeping are defined in asgd.core only."""
    for path in list((SRC / "protocol").glob("*.py")) + list((SRC / "sim").glob("*.py")):
        defs = definitions(path)
        for name in ("Async", "SSP", "Sync", "Shard", "ServerStats", "Policy"):
            assert name not in defs, f"{path.relative_to(SRC)} defines {name}: it belongs in asgd.core"
