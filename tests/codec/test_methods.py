"""The method ids of ojs_codec._methods are pamqp's ``Method.index`` for the same method,
and every id the protocol's state tables dispatch on is one of them."""

from __future__ import annotations

import inspect

from pamqp import commands

import ojs_codec
from ojs_codec import _methods, _protocol


def _pamqp_ids() -> dict[str, int]:
    ids: dict[str, int] = {}
    for class_name in ("Connection", "Channel", "Exchange", "Queue", "Basic", "Confirm", "Tx"):
        for name, method in inspect.getmembers(getattr(commands, class_name), inspect.isclass):
            if hasattr(method, "index") and name != "Properties":
                ids[f"{class_name}.{name}"] = method.index
    return ids


def _constant(pamqp_name: str) -> str:
    """``Basic.GetOk`` -> ``BASIC_GET_OK``."""
    class_name, method = pamqp_name.split(".")
    words = "".join("_" + c if c.isupper() else c for c in method).lstrip("_")
    return f"{class_name}_{words}".upper()


def test_every_method_id_is_pamqps_index() -> None:
    ids = _pamqp_ids()
    names = [n for n in _methods.__all__ if n.isupper()]
    # Connection.UpdateSecret is RabbitMQ's extension, which neither side uses.
    ids = {n: i for n, i in ids.items() if not n.startswith("Connection.UpdateSecret")}
    assert sorted(names) == sorted(_constant(n) for n in ids)
    for pamqp_name, index in ids.items():
        assert getattr(_methods, _constant(pamqp_name)) == index, pamqp_name
        assert getattr(ojs_codec, _constant(pamqp_name)) == index  # exported by the package


def test_state_tables_hold_handlers_of_known_methods() -> None:
    known = {getattr(_methods, n) for n in _methods.__all__ if n.isupper()}
    for table in (_protocol._CONNECTION_TRANSITIONS, _protocol._CHANNEL_TRANSITIONS):
        for (_state, method_id), handler in table.items():
            assert method_id in known
            assert callable(handler)
            assert getattr(_protocol.AMQPConnection, handler.__name__) is handler


def test_method_name() -> None:
    assert _methods.method_name(_methods.BASIC_PUBLISH) == "60.40"
